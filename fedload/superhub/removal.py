"""A feeder removed from a superhub (`fedload feeder remove`, and the old shard's step of `fedload feeder move`): its
partitions dropped and, for the whole feeder, its history forgotten, under its run lock, in one transaction."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from fedload.errors import FeederError, UsageError
from fedload.names import TableName, TablePattern
from fedload.superhub.bookkeeping import forget_feeder, note_moved
from fedload.superhub.schema import ParentsSpec, read_parents
from fedload.superhub.session import SuperhubTarget, feeder_lock, superhub_session
from fedload.superhub.swap import drop_partitions, feeder_partition

__all__ = ["FeederBusyError", "drop_feeder", "partition_rows"]


class FeederBusyError(FeederError):
    """The feeder's run lock is held: a run of it is under way."""


async def _removable_tables(
    conn: asyncpg.Connection, spec: ParentsSpec, only: Sequence[TablePattern]
) -> list[TableName]:
    """The tables whose partitions of a feeder a removal drops: every parent, or those `only` matches (UsageError
    for a pattern that matches none)."""
    parents = await read_parents(conn, spec.tables, spec.feeder_key)
    if unmatched := [p for p in only if not any(p.matches(t) for t in parents)]:
        names = ", ".join(map(str, unmatched))
        raise UsageError(f"--table {names} matches none of the superhub's tables (superhub.tables)")
    return sorted(t for t in parents if not only or any(p.matches(t) for p in only))


async def partition_rows(
    conn: asyncpg.Connection, parents: ParentsSpec, name: str, key: int | str | None, only: Sequence[TablePattern]
) -> dict[TableName, int]:
    """The partitions of feeder `name` (its `key`, None for one no longer configured) a removal would drop (of the
    `only` tables), with their rows."""
    partitions = {}
    for table in await _removable_tables(conn, parents, only):
        if (partition := await feeder_partition(conn, table, name, key)) is not None:
            partitions[table] = await conn.fetchval(f"SELECT count(*) FROM {partition}")  # noqa: S608
    return partitions


async def drop_feeder(
    superhub: SuperhubTarget,
    parents: ParentsSpec,
    name: str,
    key: int | str | None,
    only: Sequence[TablePattern] = (),
    *,
    moved_to: str | None = None,
) -> tuple[dict[TableName, int], int]:
    """On `superhub`, under the feeder's run lock, drop the partitions of feeder `name` (its `key`, None for one no
    longer configured; of the `only` tables) and, for the whole feeder, forget its history; `moved_to`: note there
    that it moved to that shard (`fedload feeder move`). All in one transaction: a crash or an error leaves the
    feeder as it was, never its partitions gone and its history kept. The partitions dropped with their rows, and
    the runs forgotten. FeederBusyError while a run of it holds the lock."""
    async with superhub_session(superhub) as conn, feeder_lock(conn, name) as locked:
        if not locked:
            raise FeederBusyError(f"feeder {name} is being synced right now; try again when the run has finished")
        tables = await _removable_tables(conn, parents, only)
        async with conn.transaction():
            dropped = await drop_partitions(conn, tables, name, key)
            if only:
                return dropped, 0
            forgotten = await forget_feeder(conn, name)  # the rejected rows too
            if moved_to is not None:
                await note_moved(conn, name, moved_to)
        return dropped, forgotten
