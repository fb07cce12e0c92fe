"""The per-feeder run lock: a session advisory lock in fedload's own namespace."""

from __future__ import annotations

import asyncpg

__all__ = ["LOCK_CLASS", "try_feeder_lock", "unlock_feeder"]

LOCK_CLASS = 0x6665646C  # "fedl": the advisory-lock namespace of fedload; the object id is hashtext(feeder)


async def try_feeder_lock(conn: asyncpg.Connection, feeder: str) -> bool:
    """Take the feeder's session advisory lock, held by whoever syncs it (daemon or sync, any host)."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock($1, hashtext($2))", LOCK_CLASS, feeder))


async def unlock_feeder(conn: asyncpg.Connection, feeder: str) -> None:
    """Release the feeder's advisory lock."""
    await conn.execute("SELECT pg_advisory_unlock($1, hashtext($2))", LOCK_CLASS, feeder)
