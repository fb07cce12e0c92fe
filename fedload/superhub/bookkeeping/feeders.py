"""A feeder's whole bookkeeping: its run history, schedule, pause and rejected rows."""

from __future__ import annotations

import asyncpg

from fedload.superhub.bookkeeping.digests import forget_digests
from fedload.superhub.bookkeeping.rejects import forget_rejects

__all__ = ["forget_feeder", "known_feeders"]

_KNOWN = (
    "SELECT feeder FROM fedload.runs UNION SELECT feeder FROM fedload.schedule "
    "UNION SELECT feeder FROM fedload.paused ORDER BY 1"
)


async def forget_feeder(conn: asyncpg.Connection, feeder: str) -> int:
    """Delete the feeder's run history, schedule, pause, rejected rows and digests (after its removal); the runs
    deleted."""
    async with conn.transaction():
        await forget_rejects(conn, feeder)
        await conn.execute("DELETE FROM fedload.schedule WHERE feeder = $1", feeder)
        await conn.execute("DELETE FROM fedload.paused WHERE feeder = $1", feeder)
        await forget_digests(conn, feeder)
        deleted: str = await conn.execute("DELETE FROM fedload.runs WHERE feeder = $1", feeder)
    return int(deleted.rsplit(maxsplit=1)[-1])


async def known_feeders(conn: asyncpg.Connection) -> list[str]:
    """The feeders the bookkeeping knows of (a run, a scheduled run or a pause), by name."""
    return [record["feeder"] for record in await conn.fetch(_KNOWN)]
