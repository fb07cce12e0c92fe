"""The rejected rows' table (`fedload.rejects`)."""

from __future__ import annotations

import asyncpg

__all__ = ["forget_rejects"]


async def forget_rejects(conn: asyncpg.Connection, feeder: str, *, except_run: int | None = None) -> None:
    """Delete the rejected rows recorded for the feeder's earlier data (all, or all but `except_run`'s)."""
    await conn.execute(
        "DELETE FROM fedload.rejects WHERE feeder = $1 AND run_id IS DISTINCT FROM $2", feeder, except_run
    )
