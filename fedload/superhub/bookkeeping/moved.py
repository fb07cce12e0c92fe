"""The feeders moved away from this superhub (`fedload.moved`, `fedload feeder move`)."""

from __future__ import annotations

import asyncpg

from fedload.errors import ConfigError

__all__ = ["forget_move", "moved_away", "note_moved"]


async def note_moved(conn: asyncpg.Connection, feeder: str, to_shard: str) -> None:
    """Record that the feeder moved away from this superhub to `to_shard` (`fedload feeder move`), so that a run of
    it here, by a daemon whose configuration still names this shard, is refused."""
    await conn.execute(
        "INSERT INTO fedload.moved (feeder, to_shard) VALUES ($1, $2) "
        "ON CONFLICT (feeder) DO UPDATE SET to_shard = excluded.to_shard, moved_at = now()",
        feeder,
        to_shard,
    )


async def forget_move(conn: asyncpg.Connection, feeder: str) -> None:
    """Forget that the feeder moved away from this superhub: it may run here again (a move back)."""
    await conn.execute("DELETE FROM fedload.moved WHERE feeder = $1", feeder)


async def moved_away(conn: asyncpg.Connection, feeder: str) -> ConfigError | None:
    """The error a run of the feeder here gets if it moved away to another shard, else None."""
    moved = await conn.fetchrow("SELECT to_shard, moved_at FROM fedload.moved WHERE feeder = $1", feeder)
    if moved is None:
        return None
    return ConfigError(
        f"feeder {feeder} moved to shard {moved['to_shard']} at {moved['moved_at']:%Y-%m-%d %H:%M:%S %Z} "
        f"(fedload feeder move), but this configuration still names this shard: reload it"
    )
