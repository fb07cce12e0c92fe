"""Swap a feeder's staging tables in as its partitions, all tables at once, inside the load's transaction.

Per table, method "partition": DETACH and DROP the old partition, ATTACH the staging table (its CHECK constraint
and prebuilt indexes make ATTACH cheap), move it to `fedload_parts` under the partition's stable name. DETACH takes
ACCESS EXCLUSIVE on the parent until COMMIT, so the swap runs last, under a short `lock_timeout` inside a
savepoint, and is retried: a long report holding the parent delays the swap, never the other way round for long;
after `swap_max_wait_s` the swap fails or cancels the blocking queries (`swap_on_timeout`,
fedload/superhub/blockers.py).
Method "mvcc": DELETE the partition's rows and INSERT the staging table's (the first sync still ATTACHes).
With the entity rule, a swap whose entity step moved rows replaces the feeder's rows of the tables with the key column
by DELETE and INSERT whatever the method (into a new, empty partition on a first sync), so that a reader's snapshot
from before the commit reads the old rows of every feeder and one from after it the new rows of every feeder
(docs/entities.md, "What a reader can rely on").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import asyncpg

from fedload.config import SuperhubConfig, SwapMethod, SwapOnTimeout
from fedload.errors import DumpError, SuperhubError, SwapLockError
from fedload.log import get_logger
from fedload.names import TableName
from fedload.superhub.blockers import BlockerWatch, CancelRules, watch_blockers
from fedload.superhub.delta import apply_delta
from fedload.superhub.entities import EntityRule, EntityTable, settle_entities, stage_entities
from fedload.superhub.schema import PARTS_SCHEMA, ParentTable, ident, key_literal, qualified
from fedload.superhub.staged import StagedTable

__all__ = [
    "LocksNotTaken",
    "SwapPolicy",
    "SwapStats",
    "analyze_partitions",
    "describe_swap",
    "drop_partitions",
    "feeder_partition",
    "local_lock_timeout",
    "lock_parents",
    "partition_name",
    "pause_before_retry",
    "swap_in",
    "tried_politely",
]

_MAX_IDENTIFIER_BYTES = 63
_WATCHER_STOP_S = 5.0
_MAY_ALTER = "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = $1::regclass"
log = get_logger()


def partition_name(table: TableName, feeder: str) -> str:
    """The stable name of a feeder's partition of `table`: `<schema>.<table>__<feeder>`, hashed if long."""
    return _shortened(f"{table.schema}.{table.name}", feeder)


def _legacy_partition_name(table: str, feeder: str) -> str:
    """The name fedload 0.1 gave partitions (without the schema): still found, and renamed at the next swap."""
    return _shortened(table, feeder, keep=40, feeder_keep=12)


def _shortened(head: str, feeder: str, *, keep: int = 44, feeder_keep: int = 8) -> str:
    """`<head>__<feeder>`, or, past PostgreSQL's 63 bytes, its beginning and a hash of the whole."""
    name = f"{head}__{feeder}"
    if len(name.encode()) <= _MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{head.encode()[:keep].decode(errors='ignore')}__{feeder[:feeder_keep]}_{digest}"


# The bound is printed without a relation (`pg_get_expr(..., 0)`: a LIST bound holds constants only): given the
# partition's oid, pg_get_expr opens it, so the look-up would lock every partition of the parent (other feeders'
# too), wait behind a swap's lock, and get NULL for a partition dropped meanwhile.
_FEEDER_PARTITION_OID = """
SELECT c.oid::regclass
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass
  AND (pg_get_expr(c.relpartbound, 0) = ANY($2::text[]) OR c.oid = ANY(
       SELECT to_regclass(n) FROM unnest($3::text[]) AS n))
ORDER BY pg_get_expr(c.relpartbound, 0) = ANY($2::text[]) DESC
LIMIT 1
"""
_FEEDER_PARTITION = f"SELECT ({_FEEDER_PARTITION_OID})::text"


# The swap's one look-up per table: the feeder's partition, and whether the partition's stable name ($4) will be
# free once that partition is dropped (nobody holds it, or that partition itself does).
_SWAP_LOOKUP = f"""
SELECT part::text, coalesce(to_regclass($4) IS NULL OR to_regclass($4) = part, false)
FROM (SELECT ({_FEEDER_PARTITION_OID})) AS found (part)
"""  # noqa: S608 - our own query


async def feeder_partition(
    conn: asyncpg.Connection, parent: TableName, feeder: str, key: int | str | None
) -> str | None:
    """The feeder's current partition of `parent` (SQL name), found by its bound (the feeder's key) or by the
    names fedload gives partitions; None if it has none."""
    found: str | None = await conn.fetchval(_FEEDER_PARTITION, parent.sql, *_partition_ids(parent, feeder, key))
    return found


def _partition_ids(parent: TableName, feeder: str, key: int | str | None) -> tuple[list[str], list[str]]:
    """How the feeder's partition of `parent` is recognised: its bounds as PostgreSQL prints them, its names."""
    bounds = [f"FOR VALUES IN ({literal})" for literal in _key_literals(key)]
    names = [
        qualified(PARTS_SCHEMA, partition_name(parent, feeder)),
        qualified(PARTS_SCHEMA, _legacy_partition_name(parent.name, feeder)),
    ]
    return bounds, names


def _key_literals(key: int | str | None) -> set[str]:
    """The key as PostgreSQL prints it in a partition bound: 1 for an integer column, '1' for a text one."""
    if key is None:
        return set()
    literals = {key_literal(str(key))}
    if isinstance(key, int) or key.lstrip("-").isdigit():
        literals.add(str(int(key)))
    return literals


@dataclass(frozen=True, slots=True)
class SwapPolicy:
    """How a swap replaces the data (per table), waits for its locks, and what it does when they do not come."""

    method: SwapMethod = SwapMethod.PARTITION
    method_tables: Mapping[str, SwapMethod] = field(default_factory=dict)  # "schema.table" -> method
    lock_timeout_s: float = 0.5
    max_wait_s: float = 300.0
    on_timeout: SwapOnTimeout = SwapOnTimeout.FAIL
    cancel_wait_s: float = 30.0
    never_cancel: CancelRules = field(default_factory=CancelRules)
    entities: EntityRule | None = None  # one entity, one feeder (fedload/superhub/entities.py); None: off

    @classmethod
    def from_config(cls, superhub: SuperhubConfig) -> SwapPolicy:
        """The policy the configuration's `swap_*` keys describe."""
        return cls(
            method=superhub.swap_method,
            method_tables=dict(superhub.swap_method_tables),
            lock_timeout_s=superhub.swap_lock_timeout_s,
            max_wait_s=superhub.swap_max_wait_s,
            on_timeout=superhub.swap_on_timeout,
            cancel_wait_s=superhub.swap_cancel_wait_s,
            never_cancel=CancelRules(
                frozenset(superhub.swap_never_cancel_roles), frozenset(superhub.swap_never_cancel_applications)
            ),
            entities=EntityRule.of_superhub(superhub),
        )

    def method_for(self, parent: ParentTable) -> SwapMethod:
        """The swap method of one parent table."""
        return self.method_tables.get(parent.qualified_name, self.method)


@dataclass(slots=True)
class SwapStats:
    """How a swap went, filled in as it goes (so a failed swap reports too)."""

    attempts: int = 0
    waited_ms: float = 0.0  # from the start until the successful attempt held its locks (or until it gave up)
    cancelled: int = 0  # queries cancelled by the escalation
    lock_failed: bool = False  # gave up for want of locks
    partitions: dict[TableName, str] = field(default_factory=dict)  # the feeder's partition of each parent (SQL)
    in_place: set[TableName] = field(default_factory=set)  # parents whose rows were replaced by DELETE and INSERT


Connect = Callable[[], Awaitable[asyncpg.Connection]]
BeforeLocks = Callable[[asyncpg.Connection, list[EntityTable]], Awaitable[None]]


async def swap_in(
    conn: asyncpg.Connection,
    staged: Iterable[StagedTable],
    *,
    feeder: str,
    key: int | str,
    policy: SwapPolicy | None = None,
    stats: SwapStats | None = None,
    connect: Connect | None = None,
    before_locks: BeforeLocks | None = None,
) -> SwapStats:
    """Replace the feeder's data by the staging tables (caller commits); SwapLockError if locks never come.
    `before_locks`: called once with the staged tables, before the first try takes a lock (the coordinator's
    entity step, fedload.superhub.coordinated_entities).

    Polite tries first: all "partition" parents are locked in one statement and one order, under `lock_timeout_s`
    (below the server's deadlock_timeout, 1 s by default, so the swap and not a reader gives up), in a savepoint
    that a timeout rolls back before the next try. After `max_wait_s`, `on_timeout` says: fail, or "cancel": one
    more try that waits up to `cancel_wait_s` while a watcher on a second connection (`connect`) cancels the
    queries that block it. "mvcc" tables take no lock that readers wait for (see docs/swap.md).
    """
    policy = policy or SwapPolicy()
    stats = stats if stats is not None else SwapStats()
    plan = _SwapPlan(sorted(staged, key=lambda s: s.parent.qualified_name), feeder, key, policy, time.monotonic())
    if before_locks is not None:
        await before_locks(conn, [EntityTable(t.parent, t.stage_sql) for t in plan.tables])
    if await _polite(conn, plan, stats):
        return stats
    if policy.on_timeout is SwapOnTimeout.CANCEL and connect is not None:
        await _escalated(conn, plan, stats, connect)
        return stats
    stats.lock_failed = True
    raise SwapLockError(
        f"could not lock the parent tables of feeder {feeder} for the swap within {policy.max_wait_s:g} s "
        f"({stats.attempts} attempts; swap_on_timeout = {policy.on_timeout.value})"
    )


async def lock_parents(conn: asyncpg.Connection, parents: Iterable[TableName]) -> None:
    """ACCESS EXCLUSIVE on the parents themselves (`ONLY`: not their partitions), in one statement and fedload's one
    order (by `schema.name`). A swap and a removal (`fedload feeder remove`, a move's drop) take their locks so: the
    feeder's run lock first, then this, and only then their own feeder's partitions (DETACH locks the old one), so
    neither waits for the other while holding what the other waits for. Without `ONLY`, LOCK TABLE would recurse
    into every feeder's partitions and wait for whatever holds one of them: another feeder's ANALYZE after its swap,
    an autovacuum (which such a wait cancels), a report reading one partition. A statement of its own:
    pg_stat_activity shows the wait as "LOCK TABLE ..."."""
    if names := [f"ONLY {table.sql}" for table in sorted(parents, key=str)]:
        await conn.execute(f"LOCK TABLE {', '.join(names)} IN ACCESS EXCLUSIVE MODE")


async def pause_before_retry(attempt: int) -> None:
    """The jittered pause between two polite tries for locks (swap, removal, the coordinator's lists): 50 ms at
    first, growing with the tries to at most a second, so sessions retrying together spread out."""
    await asyncio.sleep(random.uniform(0.05, min(0.05 * attempt, 1.0)))  # noqa: S311 - jitter only


_T = TypeVar("_T")


class LocksNotTaken(Exception):  # noqa: N818 - a give-up the caller turns into its own error, not a failure
    """`tried_politely` gave up: every try met a lock timeout or a deadlock until the deadline."""

    def __init__(self, attempts: int) -> None:
        super().__init__(f"locks not taken in {attempts} tries")
        self.attempts = attempts


def _quiet(attempt: int, exc: asyncpg.PostgresError) -> None:
    """A busy try that needs no word."""


async def tried_politely(
    attempt: Callable[[int], Awaitable[_T]],
    *,
    deadline: float,
    on_busy: Callable[[int, asyncpg.PostgresError], None] = _quiet,
) -> _T:
    """`attempt(1)`, `attempt(2)`, ... until one returns: a try that met a lock timeout or a deadlock (its
    transaction rolled back) is told to `on_busy` and, before `deadline` (time.monotonic()), tried again after the
    jittered pause; LocksNotTaken after it. The polite tries of a swap, a removal and the coordinator's lists."""
    for tries in itertools.count(1):
        try:
            return await attempt(tries)
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError) as exc:
            on_busy(tries, exc)
            if time.monotonic() > deadline:
                raise LocksNotTaken(tries) from None
            await pause_before_retry(tries)
    raise AssertionError("unreachable")  # pragma: no cover


async def local_lock_timeout(conn: asyncpg.Connection, seconds: float) -> None:
    """lock_timeout for the rest of the transaction: `seconds`, at least a millisecond (0 would mean none)."""
    await conn.execute(f"SET LOCAL lock_timeout = '{max(1, int(seconds * 1000))}ms'")


@dataclass(frozen=True, slots=True)
class _SwapPlan:
    tables: list[StagedTable]
    feeder: str
    key: int | str
    policy: SwapPolicy
    started: float


async def _polite(conn: asyncpg.Connection, plan: _SwapPlan, stats: SwapStats) -> bool:
    """Short tries with jittered pauses until `max_wait_s`; True once one succeeded."""

    async def attempt(tries: int) -> None:
        stats.attempts = tries
        await _attempt(conn, plan, stats, plan.policy.lock_timeout_s)

    def busy(tries: int, exc: asyncpg.PostgresError) -> None:
        log.info("swap.lock_busy", feeder=plan.feeder, attempt=tries)
        stats.waited_ms = _ms_since(plan.started)

    try:
        await tried_politely(attempt, deadline=plan.started + plan.policy.max_wait_s, on_busy=busy)
    except LocksNotTaken:
        return False
    return True


async def _attempt(conn: asyncpg.Connection, plan: _SwapPlan, stats: SwapStats, lock_timeout_s: float) -> None:
    """One try, in a savepoint: a lock timeout undoes the swap, not the load."""
    exclusive = [  # a table changed in place by its changed rows takes row locks only, as "mvcc" does
        t.parent.table
        for t in plan.tables
        if plan.policy.method_for(t.parent) is SwapMethod.PARTITION and t.changes_only is None
    ]
    in_place: set[TableName] = set()
    async with conn.transaction():
        await local_lock_timeout(conn, lock_timeout_s)
        if (rule := plan.policy.entities) is not None:  # what needs no lock, outside the lock window
            entity_tables = [EntityTable(t.parent, t.stage_sql) for t in plan.tables]
            staged = await stage_entities(conn, rule, entity_tables)
            exclusive += await _first_attaches(conn, plan, rule)
        await lock_parents(conn, exclusive)
        stats.waited_ms = _ms_since(plan.started)
        if rule is not None and await settle_entities(conn, rule, entity_tables, plan.feeder, plan.key, staged=staged):
            in_place = {t.parent.table for t in plan.tables if t.parent.column(rule.key_column)}
        for table in plan.tables:
            method = plan.policy.method_for(table.parent)
            moved = table.parent.table in in_place
            stats.partitions[table.parent.table] = await _swap_table(conn, table, plan, method, in_place=moved)
    stats.in_place = in_place


async def _first_attaches(conn: asyncpg.Connection, plan: _SwapPlan, rule: EntityRule) -> list[TableName]:
    """The "mvcc" parents with the entity key where the feeder has no partition yet: its first swap ATTACHes one,
    which readers do not wait for (SHARE UPDATE EXCLUSIVE). With the rule their parents are locked like the
    "partition" ones: a read committed statement planned before the commit (without the new partition) and run
    after it (without the rows the swap took from other feeders) would miss the entities taken."""
    return [
        t.parent.table
        for t in plan.tables
        if plan.policy.method_for(t.parent) is SwapMethod.MVCC
        and t.parent.column(rule.key_column)
        and await feeder_partition(conn, t.parent.table, plan.feeder, plan.key) is None
    ]


async def _escalated(conn: asyncpg.Connection, plan: _SwapPlan, stats: SwapStats, connect: Connect) -> None:
    """The last try: wait up to `cancel_wait_s` for the locks while a watcher cancels the queries holding them."""
    policy = plan.policy
    log.warning("swap.escalating", feeder=plan.feeder, waited_s=round(stats.waited_ms / 1000, 1))
    watch = BlockerWatch()
    watcher = await connect()
    task = asyncio.create_task(watch_blockers(watcher, conn.get_server_pid(), policy.never_cancel, watch))
    stats.attempts += 1
    try:
        await _attempt(conn, plan, stats, policy.cancel_wait_s)
    except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError, asyncpg.QueryCanceledError) as exc:
        if isinstance(exc, asyncpg.QueryCanceledError) and watch.spared is None:
            raise  # cancelled by someone else: not a lock failure
        stats.lock_failed, stats.waited_ms = True, _ms_since(plan.started)
        raise SwapLockError(_escalation_failure(plan, watch)) from None
    finally:
        stats.cancelled = watch.cancelled
        task.cancel()
        await asyncio.shield(_stopped(task, watcher))


def _escalation_failure(plan: _SwapPlan, watch: BlockerWatch) -> str:
    policy, spared = plan.policy, watch.spared
    if spared is not None:
        return (
            f"the swap of feeder {plan.feeder} was blocked by session {spared.pid} (role {spared.user}, "
            f"application {spared.application or '-'}), which the swap_never_cancel_* settings protect"
        )
    return (
        f"could not lock the parent tables of feeder {plan.feeder} for the swap within {policy.max_wait_s:g} s of "
        f"polite tries and {policy.cancel_wait_s:g} s of cancelling blockers ({watch.cancelled} queries cancelled)"
    )


async def _stopped(task: asyncio.Task[None], watcher: asyncpg.Connection) -> None:
    """Wait for the cancelled watcher task (bounded; a failure of its own is logged, never raised over the swap's
    outcome), then close its connection whatever happened (bounded)."""
    try:
        await asyncio.wait({task}, timeout=_WATCHER_STOP_S)
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            log.error("swap.watcher_crashed", exc_info=exc)
    finally:
        try:
            await watcher.close(timeout=_WATCHER_STOP_S)
        except Exception:  # noqa: BLE001 - whatever the close fails with, the connection is dropped
            watcher.terminate()


def _ms_since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


async def _swap_table(
    conn: asyncpg.Connection, table: StagedTable, plan: _SwapPlan, method: SwapMethod, *, in_place: bool
) -> str:
    """Swap one table in; the feeder's partition of its parent afterwards (SQL name). `in_place`: by DELETE and
    INSERT whatever the method, into a new, empty partition if the feeder has none."""
    started = time.monotonic()
    parent, feeder, key = table.parent, plan.feeder, plan.key
    if (changes := table.changes_only) is not None:
        old = await feeder_partition(conn, parent.table, feeder, key)
        if old is None:
            raise DumpError(f"table {parent.qualified_name}: the feeder sent its changed rows, but it has no partition")
        await apply_delta(conn, changes, old)
        log.debug("swap.table", table=parent.qualified_name, method="changed rows", ms=_ms_since(started))
        return old
    rows = in_place or method is SwapMethod.MVCC
    if rows and (old := await feeder_partition(conn, parent.table, feeder, key)) is not None:
        await _replace_rows(conn, table, old)
        partition = old
    elif in_place:
        partition = await _attach_empty(conn, table, feeder, key)
        await _replace_rows(conn, table, partition)
    else:
        partition = await _replace_partition(conn, table, feeder, key)
    shown = "rows" if in_place else method.value
    log.debug("swap.table", table=parent.qualified_name, method=shown, ms=_ms_since(started))
    return partition


async def _attach_empty(conn: asyncpg.Connection, table: StagedTable, feeder: str, key: int | str) -> str:
    """A new, empty partition of the feeder, made like its staging table (columns, constraints, indexes) and
    attached under the partition's stable name (SQL name). Not the staging table itself: its rows were written by
    COPY FREEZE, which makes them visible to every snapshot, also those taken before the swap commits."""
    parent = table.parent
    name = partition_name(parent.table, feeder)
    free = await conn.fetchval("SELECT to_regclass($1) IS NULL", qualified(PARTS_SCHEMA, name))
    partition = qualified(PARTS_SCHEMA, name if free else _taken_name_alternative(parent.table, feeder))
    await conn.execute(
        f"CREATE TABLE {partition} (LIKE {table.stage_sql} INCLUDING ALL);\n"
        f"ALTER TABLE {parent.sql_name} ATTACH PARTITION {partition} FOR VALUES IN ({key_literal(key)})"
    )
    return partition


async def _replace_partition(conn: asyncpg.Connection, table: StagedTable, feeder: str, key: int | str) -> str:
    """DETACH and DROP the feeder's partition (if any), ATTACH the staging table in its place and give it the
    partition's stable name: one look-up, then the statements in one round trip. The partition (SQL name)."""
    parent = table.parent
    name = partition_name(parent.table, feeder)
    bounds, names = _partition_ids(parent.table, feeder, key)
    row = await conn.fetchrow(_SWAP_LOOKUP, parent.table.sql, bounds, names, qualified(PARTS_SCHEMA, name))
    old, name_free = (row[0], row[1]) if row is not None else (None, False)
    final = name if name_free else _taken_name_alternative(parent.table, feeder)
    statements = [f"ALTER TABLE {parent.sql_name} DETACH PARTITION {old}", f"DROP TABLE {old}"] if old else []
    statements += [
        f"ALTER TABLE {parent.sql_name} ATTACH PARTITION {table.stage_sql} FOR VALUES IN ({key_literal(key)})",
        f"ALTER TABLE {table.stage_sql} SET SCHEMA {ident(PARTS_SCHEMA)}",
        f"ALTER TABLE {qualified(PARTS_SCHEMA, table.stage_name)} RENAME TO {ident(final)}",
    ]
    await conn.execute(";\n".join(statements))
    return qualified(PARTS_SCHEMA, final)


async def _replace_rows(conn: asyncpg.Connection, table: StagedTable, partition: str) -> None:
    """The MVCC swap: delete the partition's rows and insert the staging table's, then drop the staging table.

    Row locks only (ROW EXCLUSIVE on the partition): readers see the old rows until COMMIT, then the new ones.
    Not TRUNCATE: it takes ACCESS EXCLUSIVE on the partition, which every reader of the parent waits for."""
    columns = ", ".join(ident(c.name) for c in table.parent.columns if c.generated_sql is None)
    await conn.execute(f"DELETE FROM {partition}")  # noqa: S608 - catalog name
    await conn.execute(f"INSERT INTO {partition} ({columns}) SELECT {columns} FROM {table.stage_sql}")  # noqa: S608
    await conn.execute(f"DROP TABLE {table.stage_sql}")


def _taken_name_alternative(parent: TableName, feeder: str) -> str:
    """The partition's name when another table has taken its stable name: that name with a hash of the parent."""
    digest = hashlib.sha256(f"{parent.schema}\0{parent.name}".encode()).hexdigest()[:8]
    return _shortened(f"{parent.schema}.{parent.name}_{digest}", feeder)


async def analyze_partitions(
    conn: asyncpg.Connection,
    parents: Iterable[ParentTable],
    feeder: str,
    key: int | str,
    policy: SwapPolicy,
    *,
    partitions: Mapping[TableName, str] | None = None,
    carried: Mapping[TableName, tuple[str, ...]] | None = None,
    in_place: Collection[TableName] = (),
) -> None:
    """ANALYZE the feeder's partitions of the parent tables, after their swap committed: readers are not
    blocked by it, and a failure only costs planner statistics until autovacuum runs. A partition swapped by
    DELETE and INSERT (mvcc) is vacuumed in the same pass: its old rows are dead now, and nobody else frees them
    before autovacuum comes by. `partitions`: the ones the swap named (`SwapStats.partitions`), not looked up
    again; the plain ANALYZEs go in one statement. `carried`: the tables that got the feeder's statistics
    (fedload.superhub.statistics), each with the only columns left to ANALYZE. `in_place`: the tables whose rows
    the swap replaced by DELETE and INSERT whatever the method (`SwapStats.in_place`): vacuumed as mvcc ones."""
    known, carried = partitions or {}, carried or {}
    plain: list[tuple[ParentTable, str]] = []
    for parent in sorted(parents, key=lambda p: p.table):
        try:
            table = known.get(parent.table) or await feeder_partition(conn, parent.table, feeder, key)
            columns = carried.get(parent.table)
            if table is not None and (policy.method_for(parent) is SwapMethod.MVCC or parent.table in in_place):
                await conn.execute(f"VACUUM (ANALYZE) {table}")
            elif table is not None and columns is not None:
                plain += [(parent, f"{table} ({', '.join(map(ident, columns))})")] if columns else []
            elif table is not None:
                plain.append((parent, table))
        except asyncpg.PostgresError as exc:
            log.warning("swap.analyze_failed", feeder=feeder, table=str(parent.table), error=str(exc))
    await _analyze(conn, plain, feeder)


async def _analyze(conn: asyncpg.Connection, tables: list[tuple[ParentTable, str]], feeder: str) -> None:
    """ANALYZE the tables in one statement; if it fails, one by one, so each failure is told and the rest done."""
    if not tables:
        return
    with contextlib.suppress(asyncpg.PostgresError):
        await conn.execute(f"ANALYZE {', '.join(table for _, table in tables)}")
        return
    for parent, table in tables:
        try:
            await conn.execute(f"ANALYZE {table}")
        except asyncpg.PostgresError as exc:
            log.warning("swap.analyze_failed", feeder=feeder, table=str(parent.table), error=str(exc))


async def describe_swap(
    conn: asyncpg.Connection, staged: Iterable[StagedTable], *, feeder: str, key: int | str
) -> list[str]:
    """What `swap_in` would do, one line per table, after checking it may; SuperhubError if it may not."""
    lines = []
    for table in sorted(staged, key=lambda s: s.parent.qualified_name):
        parent = table.parent
        if not await conn.fetchval(_MAY_ALTER, parent.sql_name):
            raise SuperhubError(f"the superhub user does not own {parent.qualified_name}, so it cannot swap partitions")
        old = await feeder_partition(conn, parent.table, feeder, key)
        if old is None:
            line = f"{parent.qualified_name}: attach a new partition of {table.rows:,} rows"
        else:
            current = await conn.fetchval(f"SELECT count(*) FROM {old}")  # noqa: S608 - quoted name
            line = f"{parent.qualified_name}: replace {current:,} rows by {table.rows:,}"
        if table.dropped_columns:
            line += f" (feeder columns dropped: {', '.join(table.dropped_columns)})"
        lines.append(line)
    return lines


async def drop_partitions(
    conn: asyncpg.Connection, parents: Iterable[TableName], feeder: str, key: int | str | None
) -> dict[TableName, int]:
    """Detach and drop the feeder's partitions of the parents; the ones dropped, with the rows they held. The caller
    has locked the parents (`lock_parents`): the rows counted here lock a partition, DETACH its parent."""
    dropped = {}
    async with conn.transaction():
        for parent in sorted(parents, key=str):
            old = await feeder_partition(conn, parent, feeder, key)
            if old is not None:
                dropped[parent] = await conn.fetchval(f"SELECT count(*) FROM {old}")  # noqa: S608 - catalog name
                await conn.execute(f"ALTER TABLE {parent.sql} DETACH PARTITION {old}")
                await conn.execute(f"DROP TABLE {old}")
    return dropped
