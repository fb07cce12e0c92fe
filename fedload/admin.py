"""Administrative commands on the superhub: `fedload feeder remove`."""

from __future__ import annotations

import asyncio

from fedload.config import Config
from fedload.errors import FeederError
from fedload.log import get_logger
from fedload.pipeline import close_superhub, connect_superhub, superhub_errors
from fedload.runs import ensure_superhub, forget_rejects, try_feeder_lock, unlock_feeder
from fedload.schema import read_parents
from fedload.swap import drop_partitions

__all__ = ["remove_feeder"]

log = get_logger()


async def _remove(config: Config, name: str) -> list[str]:
    with superhub_errors(config):
        conn = await connect_superhub(config)
        try:
            await ensure_superhub(conn)
            if not await try_feeder_lock(conn, name):
                raise FeederError(f"feeder {name} is being synced right now; try again when the run has finished")
            try:
                parents = await read_parents(conn, config.superhub.tables, config.superhub.feeder_key)
                dropped = await drop_partitions(conn, parents, name)
                await forget_rejects(conn, name)
                return dropped
            finally:
                await unlock_feeder(conn, name)
        finally:
            await close_superhub(conn)


def remove_feeder(config: Config, name: str) -> int:
    """Detach and drop every partition of feeder `name`; works whether or not it is still configured."""
    dropped = asyncio.run(_remove(config, name))
    log.info("feeder.removed", feeder=name, tables=dropped)
    tables = f": {', '.join(dropped)}" if dropped else ""
    print(f"feeder {name}: dropped its partitions of {len(dropped)} table(s){tables}")
    if name in config.feeders:
        print(f"feeder {name} is still configured: remove [feeders.{name}], or the next sync brings its data back")
    return 0
