"""Administrative commands on the superhub: `fedload feeder remove`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fedload.config import Config
from fedload.errors import FeederError
from fedload.log import get_logger
from fedload.names import TableName, TablePattern
from fedload.pipeline import close_superhub, connect_superhub, superhub_errors
from fedload.runs import ensure_superhub, forget_rejects, try_feeder_lock, unlock_feeder
from fedload.schema import read_parents
from fedload.swap import drop_partitions

__all__ = ["remove_feeder"]

log = get_logger()


async def _remove(config: Config, name: str, only: Sequence[TablePattern]) -> dict[TableName, int]:
    with superhub_errors(config):
        conn = await connect_superhub(config)
        try:
            await ensure_superhub(conn)
            if not await try_feeder_lock(conn, name):
                raise FeederError(f"feeder {name} is being synced right now; try again when the run has finished")
            try:
                parents = await read_parents(conn, config.superhub.tables, config.superhub.feeder_key)
                chosen = [t for t in parents if not only or any(p.matches(t) for p in only)]
                feeder = config.feeders.get(name)
                dropped = await drop_partitions(conn, chosen, name, feeder.key if feeder else None)
                if not only:
                    await forget_rejects(conn, name)
                return dropped
            finally:
                await unlock_feeder(conn, name)
        finally:
            await close_superhub(conn)


def remove_feeder(config: Config, name: str, only: Sequence[TablePattern] = ()) -> int:
    """Detach and drop every partition of feeder `name` (or those of the `only` tables); works whether or not
    the feeder is still configured."""
    dropped = asyncio.run(_remove(config, name, only))
    log.info("feeder.removed", feeder=name, tables=[str(t) for t in dropped])
    tables = ", ".join(f"{t} ({rows:,} rows)" for t, rows in dropped.items())
    print(f"feeder {name}: dropped its partitions of {len(dropped)} table(s){': ' + tables if tables else ''}")
    feeder = config.feeders.get(name)
    if feeder is None:
        return 0
    if not only:
        print(f"feeder {name} is still configured: remove [feeders.{name}], or the next sync brings its data back")
    elif back := [t for t in dropped if not any(x.matches(t) for x in feeder.exclude_tables)]:
        names = ", ".join(map(str, back))
        print(f"{names} not in feeders.{name}.exclude_tables: the next sync of {name} brings their data back")
    return 0
