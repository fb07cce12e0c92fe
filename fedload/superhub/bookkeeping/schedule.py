"""The daemon's schedule (`fedload.schedule`): each feeder's next run, for `fedload status`."""

from __future__ import annotations

import asyncpg

__all__ = ["store_next_run"]

_STORE = (
    "INSERT INTO fedload.schedule (feeder, next_run_at, failures) "
    "VALUES ($1, now() + make_interval(secs => $2), $3) ON CONFLICT (feeder) DO UPDATE "
    "SET next_run_at = excluded.next_run_at, failures = excluded.failures, updated_at = now()"
)


async def store_next_run(conn: asyncpg.Connection, feeder: str, *, next_in_s: float, failures: int) -> None:
    """Record that the feeder runs next in `next_in_s` seconds, after `failures` failed runs in a row."""
    await conn.execute(_STORE, feeder, next_in_s, failures)
