"""A feeder removed from a superhub (`fedload feeder remove`, and the old shard's step of `fedload feeder move`): its
partitions dropped and, for the whole feeder, its history forgotten (for some tables, their digests), under its run
lock, in one transaction.

The removal takes its locks in the order a run of a feeder takes them, so that it never deadlocks with the runs of
a daemon on the same superhub: the feeder's run lock first (waited for while a run of the feeder holds it), then the
parents themselves, in one statement and one order, as the swap does (`lock_parents`), and only then its own
partitions (other feeders' partitions are not locked: an ANALYZE or a report holding one does not hold it up). Like
the swap it tries under a short `lock_timeout` (`swap_lock_timeout_s`, below the server's deadlock_timeout), rolls
back and tries again after a jittered pause, until `swap_max_wait_s`: a report holding a parent delays the removal,
never makes readers queue behind it for long, and a deadlock with a session that locks in another order (which
PostgreSQL ends by failing one of the two) is retried too.

With the entity rule, a removal that gives entities back to other feeders takes two transactions: the first hands
them back and deletes the feeder's own rows of the tables with the key column (DELETE and INSERT only, which every
snapshot sees all or none of); then every snapshot taken before that commit is waited for; the second drops the
partitions, empty for every snapshot left. A repeatable read statement whose snapshot predates a partition's DROP
reads the parent's new partition list with its old snapshot: in one transaction, it would find the feeder's rows
gone and the others' not yet back (docs/entities.md, "What a reader can rely on").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import asyncpg

from fedload.english import counted
from fedload.errors import FeederError, SuperhubError, UsageError
from fedload.log import get_logger
from fedload.names import TableName, TablePattern
from fedload.superhub.bookkeeping import forget_feeder, note_moved
from fedload.superhub.bookkeeping.digests import forget_digests
from fedload.superhub.coordinated_entities import CoordinatedEntities, coordinated_change
from fedload.superhub.entities import EntityRule, EntityTable, forget_displaced, settle_entities
from fedload.superhub.schema import ParentsSpec, ParentTable, read_parents
from fedload.superhub.session import SuperhubTarget, feeder_lock, superhub_session
from fedload.superhub.swap import (
    LocksNotTaken,
    SwapPolicy,
    drop_partitions,
    feeder_partition,
    local_lock_timeout,
    lock_parents,
    tried_politely,
)

__all__ = ["BUSY_WAIT_S", "FeederBusyError", "RemovalLockError", "drop_feeder", "partition_rows"]

log = get_logger()
BUSY_WAIT_S = 60.0  # how long a removal waits for a run of the feeder (its run lock) to end
_BUSY_POLL_S = 0.2


class FeederBusyError(FeederError):
    """The feeder's run lock stayed held: a run of it was under way all along."""


class RemovalLockError(SuperhubError):
    """The parents' locks did not come within `swap_max_wait_s`: nothing was removed."""


async def _removable_tables(
    conn: asyncpg.Connection, spec: ParentsSpec, only: Sequence[TablePattern]
) -> list[TableName]:
    """The tables whose partitions of a feeder a removal drops: every parent, or those `only` matches (UsageError
    for a pattern that matches none)."""
    parents = await read_parents(conn, spec.tables, spec.feeder_key)
    if unmatched := [p for p in only if not any(p.matches(t) for t in parents)]:
        names = ", ".join(map(str, unmatched))
        raise UsageError(f"--table {names} matches none of the superhub's tables (superhub.tables)")
    return sorted((t for t in parents if not only or any(p.matches(t) for p in only)), key=str)


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
    policy: SwapPolicy | None = None,
    busy_wait_s: float | None = None,
    coordinated: CoordinatedEntities | None = None,
) -> tuple[dict[TableName, int], int]:
    """On `superhub`, under the feeder's run lock, drop the partitions of feeder `name` (its `key`, None for one no
    longer configured; of the `only` tables) and, for the whole feeder, forget its history; `moved_to`: note there
    that it moved to that shard (`fedload feeder move`). All in one transaction (with the entity rule, two when it
    gives entities back: the module docstring): a crash or an error leaves the feeder as it was, never its
    partitions gone and its history kept (between the two, its entities are given back and its partitions empty).
    The partitions dropped with their rows, and the runs forgotten. Waits up to `busy_wait_s` (BUSY_WAIT_S) for a
    run of the feeder to end (FeederBusyError after), and for the parents' locks by the swap's short tries
    (`policy`: `lock_timeout_s` each, up to `max_wait_s`; RemovalLockError after). `coordinated`: the entity rule
    kept on the coordinator (with shards): the removal is a change of the feeder's data there
    (fedload.superhub.coordinated_entities)."""
    policy = policy or SwapPolicy()
    async with superhub_session(superhub) as conn:
        tables = await _removable_tables(conn, parents, only)
        entities = await _entity_parents(conn, parents, policy.entities, tables)
        everything = (
            [] if coordinated is None else list((await read_parents(conn, parents.tables, parents.feeder_key)).values())
        )
        async with (
            _run_lock(conn, name, BUSY_WAIT_S if busy_wait_s is None else busy_wait_s),
            coordinated_change(coordinated, name, key, everything) as change,
        ):
            if change is not None:  # the entities it keeps: those of its partitions not removed
                kept = [EntityTable(p, await feeder_partition(conn, p.table, name, key)) for p in everything]
                await change.prepare(conn, [t for t in kept if t.parent.table not in tables and t.stage_sql])
            return await _polite(conn, _Removal(name, key, tables, not only, moved_to, entities), policy)


async def _entity_parents(
    conn: asyncpg.Connection, spec: ParentsSpec, rule: EntityRule | None, tables: list[TableName]
) -> tuple[EntityRule, list[ParentTable]] | None:
    """With the entity rule (superhub.entity_key), the rule and the removed tables' parents; None without it."""
    if rule is None:
        return None
    parents = await read_parents(conn, spec.tables, spec.feeder_key)
    return rule, [parents[t] for t in tables if t in parents]


@contextlib.asynccontextmanager
async def _run_lock(conn: asyncpg.Connection, name: str, wait_s: float) -> AsyncIterator[None]:
    """The feeder's run lock for the block, tried again while a run of it holds the lock, up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        async with feeder_lock(conn, name) as locked:
            if locked:
                yield
                return
        if time.monotonic() > deadline:
            raise FeederBusyError(f"a run of feeder {name} held its run lock for {wait_s:g} s")
        await asyncio.sleep(_BUSY_POLL_S)


@dataclass(frozen=True, slots=True)
class _Removal:
    """What one removal drops: the feeder, its key, the parents (in lock order) and whether its history goes too
    (then `moved_to` is noted, if given)."""

    name: str
    key: int | str | None
    tables: list[TableName]
    whole: bool
    moved_to: str | None
    entities: tuple[EntityRule, list[ParentTable]] | None = None  # the entity rule and the removed parents

    async def attempt(self, conn: asyncpg.Connection, policy: SwapPolicy) -> tuple[dict[TableName, int], int]:
        """One try, in one transaction; in two when entities go back to other feeders (the module docstring): the
        first hands them back and empties the feeder's partitions of them, the second, after every snapshot older
        than the first's commit, drops. A lock timeout or a deadlock rolls back the transaction it is in; a try
        after a first transaction that committed finds no entity to hand back and drops in one."""
        async with conn.transaction():
            await local_lock_timeout(conn, policy.lock_timeout_s)
            await lock_parents(conn, self.tables)
            handed = await self._handed_back(conn)
            if handed is None:
                return await self._dropped(conn)
        await _snapshots_gone(conn, handed, policy.max_wait_s, self.name)
        async with conn.transaction():
            await local_lock_timeout(conn, policy.lock_timeout_s)
            await lock_parents(conn, self.tables)
            return await self._dropped(conn)

    async def _dropped(self, conn: asyncpg.Connection) -> tuple[dict[TableName, int], int]:
        """In the caller's transaction, under the parents' locks: the partitions dropped and, for the whole feeder,
        its history forgotten."""
        dropped = await drop_partitions(conn, self.tables, self.name, self.key)
        if not self.whole:  # their digests describe the partitions dropped: the next run sends these tables
            await forget_digests(conn, self.name, self.tables)
            return dropped, 0
        forgotten = await forget_feeder(conn, self.name)  # the rejected rows too
        if self.moved_to is not None:
            await note_moved(conn, self.name, self.moved_to)
        return dropped, forgotten

    async def _handed_back(self, conn: asyncpg.Connection) -> int | None:
        """With the entity rule: a whole feeder's entities go home to the feeders newest without it, its displaced
        rows with it; some tables only (`--table`): its displaced rows of those tables, which no partition of it
        could take back. If rows went back to other feeders, the feeder's rows of the tables with the key column are
        deleted too (its partitions dropped later), and the transaction's id is returned; None otherwise."""
        if self.entities is None:
            return None
        rule, parents = self.entities
        if not self.whole:
            await forget_displaced(conn, rule, parents, self.name)
            return None
        if not await settle_entities(conn, rule, [EntityTable(p) for p in parents], self.name, self.key):
            return None
        for parent in (p for p in parents if p.column(rule.key_column)):
            if (part := await feeder_partition(conn, parent.table, self.name, self.key)) is not None:
                await conn.execute(f"DELETE FROM {part}")  # noqa: S608 - catalog name
        xid: int = await conn.fetchval("SELECT txid_current()")
        return xid


# The sessions of this database, but this one, whose snapshot may predate transaction $1 (txid_current()'s value):
# its xmin is not after that transaction's id (xid comparison modulo 2^32, by age).
_OLDER_SNAPSHOTS = """
SELECT count(*) FROM pg_stat_activity
WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND pid <> pg_backend_pid()
  AND backend_xmin IS NOT NULL AND age(backend_xmin) >= age(($1::bigint % 4294967296)::text::xid)
"""
_SNAPSHOTS_POLL_S = 0.02


async def _snapshots_gone(conn: asyncpg.Connection, xid: int, wait_s: float, name: str) -> None:
    """Wait until no session holds a snapshot that may predate transaction `xid`'s commit (a repeatable read
    statement reading the parents with it after the partitions' DROP would miss the rows handed back);
    RemovalLockError after `wait_s`: the entities are handed back, the feeder's partitions left empty."""
    started = time.monotonic()
    while await conn.fetchval(_OLDER_SNAPSHOTS, xid):
        if time.monotonic() - started > wait_s:
            raise RemovalLockError(
                f"feeder {name}'s entities were handed back to the other feeders, but sessions holding older "
                f"snapshots ran past swap_max_wait_s = {wait_s:g} s: its partitions are left empty; run the removal "
                "again to drop them"
            )
        await asyncio.sleep(_SNAPSHOTS_POLL_S)
    log.debug("removal.snapshots_waited", feeder=name, ms=round((time.monotonic() - started) * 1000, 1))


async def _polite(conn: asyncpg.Connection, removal: _Removal, policy: SwapPolicy) -> tuple[dict[TableName, int], int]:
    """Short tries with jittered pauses, as the swap's, until `max_wait_s`; RemovalLockError then."""

    def busy(attempt: int, exc: asyncpg.PostgresError) -> None:
        said = log.info if attempt == 1 else log.debug  # on a terminal once, not at every try
        said("removal.lock_busy", feeder=removal.name, attempt=attempt, error=type(exc).__name__)

    try:
        return await tried_politely(
            lambda _: removal.attempt(conn, policy),
            deadline=time.monotonic() + policy.max_wait_s,
            on_busy=busy,
        )
    except LocksNotTaken as gave_up:
        tables = ", ".join(map(str, removal.tables))
        raise RemovalLockError(
            f"other sessions held {tables} for swap_max_wait_s = {policy.max_wait_s:g} s "
            f"({counted(gave_up.attempts, 'try', 'tries')})"
        ) from None
