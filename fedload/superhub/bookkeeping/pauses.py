"""The paused feeders (`fedload.paused`, `fedload feeder pause` and `resume`): a row per paused feeder, on the
superhub that loads it (with shards, its own shard), read before each scheduled run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

__all__ = ["Pause", "pause_feeder", "read_pause", "resume_feeder", "write_pause"]

_READ = "SELECT feeder, reason, paused_at, paused_by FROM fedload.paused WHERE feeder = $1"
_PAUSE = """
INSERT INTO fedload.paused AS p (feeder, reason, paused_by) VALUES ($1, $2, $3)
ON CONFLICT (feeder) DO UPDATE SET reason = coalesce(excluded.reason, p.reason), paused_by = excluded.paused_by
RETURNING feeder, reason, paused_at, paused_by
"""
_RESUME = "DELETE FROM fedload.paused WHERE feeder = $1 RETURNING feeder, reason, paused_at, paused_by"


@dataclass(frozen=True, slots=True)
class Pause:
    """A feeder's pause: why (None if no reason was given), since when, and who paused it (user@host)."""

    feeder: str
    reason: str | None
    since: datetime
    by: str | None

    def describe(self) -> str:
        """The pause for a person, in one line: "paused since 2026-11-27 12:00:00 UTC by ops@hub: the reason"."""
        by = f" by {self.by}" if self.by else ""
        reason = f": {self.reason}" if self.reason else ""
        return f"paused since {self.since:%Y-%m-%d %H:%M:%S %Z}{by}{reason}"


def _pause(record: asyncpg.Record) -> Pause:
    return Pause(record["feeder"], record["reason"], record["paused_at"], record["paused_by"])


async def read_pause(conn: asyncpg.Connection, feeder: str) -> Pause | None:
    """The feeder's pause, None if it is not paused (or fedload has not set this superhub up yet: a dry run's)."""
    try:
        record = await conn.fetchrow(_READ, feeder)
    except asyncpg.UndefinedTableError:
        return None
    return None if record is None else _pause(record)


async def pause_feeder(
    conn: asyncpg.Connection, feeder: str, reason: str | None, by: str
) -> tuple[Pause, Pause | None]:
    """Pause the feeder; paused already, it keeps its start and gets `reason` (its old one when None). The pause
    now, and the one before (None if it was not paused)."""
    async with conn.transaction():
        before = await conn.fetchrow(f"{_READ} FOR UPDATE", feeder)
        now = await conn.fetchrow(_PAUSE, feeder, reason, by)
    if now is None:  # pragma: no cover - an upsert returns its row
        raise AssertionError("INSERT ... ON CONFLICT DO UPDATE returned no row")
    return _pause(now), None if before is None else _pause(before)


async def write_pause(conn: asyncpg.Connection, pause: Pause) -> None:
    """Record `pause` as it is (its start too): a moved feeder's pause, on its new shard."""
    await conn.execute(
        "INSERT INTO fedload.paused (feeder, reason, paused_at, paused_by) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (feeder) DO UPDATE SET reason = excluded.reason, paused_at = excluded.paused_at, "
        "paused_by = excluded.paused_by",
        pause.feeder,
        pause.reason,
        pause.since,
        pause.by,
    )


async def resume_feeder(conn: asyncpg.Connection, feeder: str) -> Pause | None:
    """End the feeder's pause; the pause it had, None if it was not paused."""
    record = await conn.fetchrow(_RESUME, feeder)
    return None if record is None else _pause(record)
