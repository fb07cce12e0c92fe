"""One entity, one feeder across shards (docs/entities.md, "Across shards"): with `[shards]`, `[coordinator]` and
`superhub.entity_key`, the registry (`fedload.entity_copies`, `fedload.entity_pending`) lives on the coordinator,
whose views hide the copies that are not at home; the shards move no rows.

A change of a feeder's data on its shard runs under the coordinator's entity lock in the order P, W1, C, W2, R
(docs/entities.md, "The order of a change"): the hidden set made right for the old data and the new (P), older
coordinator transactions waited for (W1), the shard's commit (C, the caller's), those after it waited for (W2), the
feeder settled from what the coordinator reads (R). Claims are ranked before P (`check_claims`, `forged_sql`).
Nothing here runs without the configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import asyncpg

from fedload.errors import DumpError, SuperhubError
from fedload.log import get_logger
from fedload.names import TableName
from fedload.superhub.bookkeeping.locks import LOCK_CLASS
from fedload.superhub.entities import (
    DISPLACED_SCHEMA,
    EntityRule,
    EntityTable,
    StagedEntities,
    copies_written_sql,
    displacement_held,
    forged_sql,
    staged_newest,
)
from fedload.superhub.schema import ParentTable, ident, qualified, text_literal
from fedload.superhub.session import SuperhubTarget, superhub_session

__all__ = [
    "ALL_ROWS_SCHEMA",
    "CoordinatedChange",
    "CoordinatedEntities",
    "all_rows_parent",
    "check_claims",
    "coordinated_change",
    "entity_lock",
    "entity_parents",
    "heal_pending",
    "prepare_feeders",
    "registry_sql",
    "settle_feeder",
    "views_sql",
    "wait_for_older",
]

log = get_logger()
ALL_ROWS_SCHEMA = "fedload_all"  # the coordinator's partitioned parents of the tables with the key column
_ENTITY_LOCK = f"{LOCK_CLASS}, 3"  # "fedl" class, object 3 (1: the builders, 2: a feeder move)
_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class CoordinatedEntities:
    """The entity rule kept on the coordinator: the rule, the coordinator, and how long a change waits for the
    entity lock and for the coordinator's older transactions (`swap_max_wait_s`)."""

    rule: EntityRule
    coordinator: SuperhubTarget
    max_wait_s: float


def all_rows_parent(table: TableName) -> str:
    """The coordinator's partitioned parent of `table` (SQL name) when the rule applies to it: every feeder's
    rows, hidden copies too."""
    return qualified(ALL_ROWS_SCHEMA, f"{table.schema}.{table.name}")


def entity_parents(rule: EntityRule, parents: Sequence[ParentTable]) -> list[ParentTable]:
    """The parents with the key column, in name order."""
    return sorted((p for p in parents if p.column(rule.key_column)), key=lambda p: p.table)


def _hidden_copy(rule: EntityRule) -> str:
    """The join condition of a row `t` with its hidden copy `c`."""
    key, feeder_key = ident(rule.key_column), ident(rule.feeder_key)
    return f"c.displaced_since IS NOT NULL AND c.entity = t.{key}::text AND c.feeder_key = t.{feeder_key}::text"


def views_sql(rule: EntityRule, parent: ParentTable) -> list[str]:
    """The reader's view of `parent` (rows whose copy is not hidden) and its displaced view (the hidden ones, with
    their feeder and since when), both over the all-rows parent."""
    rows, match = all_rows_parent(parent.table), _hidden_copy(rule)
    displaced = qualified(DISPLACED_SCHEMA, f"{parent.table.schema}.{parent.table.name}")
    return [
        f"CREATE VIEW {parent.sql_name} AS SELECT t.* FROM {rows} t "  # noqa: S608 - our names
        f"WHERE NOT EXISTS (SELECT FROM fedload.entity_copies c WHERE {match})",
        f"CREATE SCHEMA IF NOT EXISTS {ident(DISPLACED_SCHEMA)}",
        f"CREATE VIEW {displaced} AS SELECT c.feeder AS fedload_feeder, c.displaced_since AS fedload_since, t.* "  # noqa: S608
        f"FROM {rows} t JOIN fedload.entity_copies c ON {match}",
    ]


def registry_sql(newest_type: str) -> list[str]:
    """The coordinator's registry: every copy (hidden ones with `displaced_since`), and the pending changes."""
    return [
        "CREATE SCHEMA IF NOT EXISTS fedload",
        f"CREATE TABLE IF NOT EXISTS fedload.entity_copies (feeder text NOT NULL, entity text NOT NULL, "
        f"feeder_key text NOT NULL, newest {newest_type}, displaced_since timestamptz, PRIMARY KEY (feeder, entity))",
        "CREATE INDEX IF NOT EXISTS entity_copies_entity ON fedload.entity_copies (entity)",
        "CREATE INDEX IF NOT EXISTS entity_copies_hidden ON fedload.entity_copies (entity, feeder_key) "
        "WHERE displaced_since IS NOT NULL",
        "CREATE TABLE IF NOT EXISTS fedload.entity_pending (feeder text PRIMARY KEY, feeder_key text NOT NULL, "
        "since timestamptz NOT NULL DEFAULT now())",
    ]


@contextlib.asynccontextmanager
async def entity_lock(conn: asyncpg.Connection, wait_s: float) -> AsyncIterator[None]:
    """The coordinator's entity lock (a session's advisory lock) for the block, tried every 20 ms for up to
    `wait_s`: a waiter holds no transaction open meanwhile, so no change ever waits (W1, W2) for a waiter.
    SuperhubError when it did not come."""
    deadline = time.monotonic() + wait_s
    while not await conn.fetchval(f"SELECT pg_try_advisory_lock({_ENTITY_LOCK})"):
        if time.monotonic() > deadline:
            raise SuperhubError(f"another change of the entities held the coordinator's entity lock for {wait_s:g} s")
        await asyncio.sleep(_POLL_S)
    try:
        yield
    finally:
        await asyncio.shield(_unlocked(conn))


async def _unlocked(conn: asyncpg.Connection) -> None:
    """Release the entity lock; a connection gone meanwhile has released it."""
    with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        await conn.execute(f"SELECT pg_advisory_unlock({_ENTITY_LOCK})")


# The transactions of the coordinator's database other than this session's: their virtual transaction ids (every
# transaction holds a lock on its own, visible in pg_locks to every role, unlike pg_stat_activity's xact_start).
_OLDER = """
SELECT coalesce(array_agg(l.virtualxid), '{}')
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'virtualxid' AND l.granted AND l.mode = 'ExclusiveLock' AND l.pid <> pg_backend_pid()
  AND l.pid IS DISTINCT FROM $1::int
  AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
_STILL = "SELECT count(*) FROM pg_locks WHERE locktype = 'virtualxid' AND granted AND virtualxid = ANY($1::text[])"


async def wait_for_older(conn: asyncpg.Connection, wait_s: float, why: str, *, but: int | None = None) -> None:
    """Wait until every transaction of the coordinator's database that was running at the call has ended (W1,
    W2), but backend `but`'s (a build waiting for its own switch); SuperhubError after `wait_s`, naming `why`."""
    started = time.monotonic()
    older = await conn.fetchval(_OLDER, but)
    while older and await conn.fetchval(_STILL, older):
        if time.monotonic() - started > wait_s:
            raise SuperhubError(
                f"coordinator transactions that started before {why} ran past swap_max_wait_s = {wait_s:g} s"
            )
        await asyncio.sleep(_POLL_S)
    log.debug("entities.waited", why=why, transactions=len(older), ms=round((time.monotonic() - started) * 1000, 1))


# P: $1 the feeder, $2 its key as text, $3 its entities in its new data. F's copies of entities it gains are
# hidden where another feeder has one (none shown in its old data, so none twice in its new); an entity F shows
# but will no longer have is shown by its best other copy, F's hidden (one shown with either data); F is pending.
_PREPARE = """
WITH new AS (
  SELECT DISTINCT unnest($3::text[]) AS entity
), mine AS (
  SELECT entity, displaced_since FROM fedload.entity_copies WHERE feeder = $1::text
), gained AS (
  INSERT INTO fedload.entity_copies (feeder, entity, feeder_key, newest, displaced_since)
  SELECT $1::text, n.entity, $2::text, NULL,
         CASE WHEN EXISTS (SELECT FROM fedload.entity_copies o WHERE o.entity = n.entity) THEN now() END
  FROM new n WHERE NOT EXISTS (SELECT FROM mine m WHERE m.entity = n.entity)
), heir AS (
  SELECT DISTINCT ON (c.entity) c.entity, c.feeder
  FROM fedload.entity_copies c JOIN mine m USING (entity)
  WHERE m.displaced_since IS NULL AND c.feeder <> $1::text AND NOT EXISTS (SELECT FROM new n WHERE n.entity = m.entity)
  ORDER BY c.entity, {forged}, c.newest DESC NULLS LAST, c.feeder COLLATE "C"
), swapped AS (
  UPDATE fedload.entity_copies c SET displaced_since = CASE WHEN c.feeder = $1::text THEN now() END
  FROM heir h WHERE c.entity = h.entity AND c.feeder IN ($1::text, h.feeder)
)
INSERT INTO fedload.entity_pending (feeder, feeder_key) VALUES ($1::text, $2::text)
ON CONFLICT (feeder) DO UPDATE SET feeder_key = excluded.feeder_key, since = now()
"""


def _read_sql(rule: EntityRule, parents: Sequence[ParentTable], key: str) -> str:
    """F's entities and newest values as the coordinator reads them (its all-rows parents, pruned to F's key)."""
    column = ident(rule.key_column)
    where = []
    for parent in parents:
        feeder_key = parent.column(rule.feeder_key)
        cast = f"CAST({text_literal(key)} AS {feeder_key.type_sql})" if feeder_key is not None else text_literal(key)
        where.append(f"{ident(rule.feeder_key)} = {cast} AND {column} IS NOT NULL")
    keys = " UNION ".join(
        f"SELECT {column}::text FROM {all_rows_parent(p.table)} WHERE {w}"  # noqa: S608 - our names
        for p, w in zip(parents, where, strict=True)
    )
    newest = next(
        (
            f"SELECT {column}::text, max({ident(rule.newest_column)}) FROM {all_rows_parent(p.table)} "  # noqa: S608
            f"WHERE {w} GROUP BY 1"
            for p, w in zip(parents, where, strict=True)
            if p.table == rule.newest_table
        ),
        None,
    )
    if newest is None:  # the feeder excludes the newest table: no values, ranked below every value
        newest = "SELECT NULL::text, c.newest FROM fedload.entity_copies c WHERE false"
    return (
        f"SELECT k.entity, n.newest FROM ({keys}) AS k (entity) "  # noqa: S608 - our names
        f"LEFT JOIN ({newest}) AS n (entity, newest) USING (entity)"
    )


# R: $1 the feeder, $2 its key as text; `read` its entities now. F's copies replaced by those it has, each touched
# entity's home decided (newest first, NULLs last, then the name in byte order), every other copy hidden (since
# when it first was), F no longer pending. Returns how many entities it touched and how many of F's are hidden.
_COPIES = copies_written_sql("read", "winner", "feeder")
_SETTLE = """
WITH read AS ({read}), touched AS (
  SELECT entity FROM read UNION SELECT entity FROM fedload.entity_copies WHERE feeder = $1::text
), forgotten AS (
  DELETE FROM fedload.entity_copies c
  WHERE c.feeder = $1::text AND NOT EXISTS (SELECT FROM read r WHERE r.entity = c.entity)
), winner AS (
  SELECT DISTINCT ON (k.entity) k.entity, k.feeder FROM (
    SELECT c.entity, c.feeder, c.newest FROM fedload.entity_copies c JOIN touched USING (entity)
    WHERE c.feeder <> $1::text
    UNION ALL SELECT entity, $1::text, newest FROM read) AS k
  ORDER BY k.entity, {forged}, k.newest DESC NULLS LAST, k.feeder COLLATE "C"
), {copies}), settled AS (
  DELETE FROM fedload.entity_pending WHERE feeder = $1::text
)
SELECT (SELECT count(*) FROM touched),
       (SELECT count(*) FROM read r JOIN winner w USING (entity) WHERE w.feeder <> $1::text)
"""


async def settle_feeder(
    conn: asyncpg.Connection, rule: EntityRule, parents: Sequence[ParentTable], feeder: str, key: str
) -> None:
    """R: settle feeder `feeder` (its key as text) from what the coordinator reads of it now, in one statement
    (its own transaction, or the caller's)."""
    started = time.monotonic()
    read = _read_sql(rule, entity_parents(rule, parents), key)
    forged = forged_sql(rule, await _registry_type(conn), "k.newest")
    row = await conn.fetchrow(_SETTLE.format(read=read, copies=_COPIES, forged=forged), feeder, key)
    assert row is not None  # scalar subqueries: one row
    log.debug(
        "entities.settled",
        feeder=feeder,
        entities=row[0],
        hidden=row[1],
        ms=round((time.monotonic() - started) * 1000, 1),
    )


async def _registry_type(conn: asyncpg.Connection) -> str:
    """The type of the registry's newest values (the newest column's, when the build made it)."""
    return str(
        await conn.fetchval(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'fedload.entity_copies'::regclass AND attname = 'newest'"
        )
    )


async def _prepare_sql(conn: asyncpg.Connection, rule: EntityRule) -> str:
    """P, its ranking with the clock rule (`forged_sql`) of the registry's type."""
    return _PREPARE.replace("{forged}", forged_sql(rule, await _registry_type(conn), "c.newest"))


async def prepare_feeders(
    conn: asyncpg.Connection, rule: EntityRule, changes: Sequence[tuple[str, str, list[str]]]
) -> None:
    """P for each (feeder, key as text, its entities in its new data), in one transaction: a coordinator build
    about to switch the shard or relation they are read from (their new data: what it will read)."""
    async with conn.transaction():
        prepare = await _prepare_sql(conn, rule)
        for feeder, key, entities in changes:
            await conn.execute(prepare, feeder, key, entities)


# Before P: what R would take from the other feeders if feeder $1's new data has entities $2 with newest values
# $3 (text): per feeder whose shown copy it would outrank, how many, and how many it shows now.
_TAKEN = """
WITH mine AS (
  SELECT m.entity, m.newest::{newest_type} AS newest FROM unnest($2::text[], $3::text[]) AS m (entity, newest)
), ranked AS (
  SELECT DISTINCT ON (k.entity) k.entity, k.feeder FROM (
    SELECT c.entity, c.feeder, c.newest FROM fedload.entity_copies c JOIN mine USING (entity) WHERE c.feeder <> $1::text
    UNION ALL SELECT entity, $1::text, newest FROM mine) AS k
  ORDER BY k.entity, {forged}, k.newest DESC NULLS LAST, k.feeder COLLATE "C"
), taken AS (
  SELECT s.feeder, count(*) AS n FROM ranked r
  JOIN fedload.entity_copies s ON s.entity = r.entity AND s.displaced_since IS NULL AND s.feeder <> $1::text
  WHERE r.feeder = $1::text GROUP BY 1
)
SELECT t.feeder, t.n,
       (SELECT count(*) FROM fedload.entity_copies c WHERE c.feeder = t.feeder AND c.displaced_since IS NULL),
       (SELECT count(*) FROM mine k WHERE {forged})
FROM taken t
UNION ALL SELECT NULL, 0, 0, (SELECT count(*) FROM mine k WHERE {forged})
"""


async def check_claims(conn: asyncpg.Connection, rule: EntityRule, feeder: str, staged: StagedEntities) -> None:
    """Before P, under the entity lock: the feeder's newest values past the coordinator's clock are logged (R
    ranks them last, `forged_sql`), and DumpError, before its shard commits anything, if R would take too many
    of another feeder's entities (`displacement_held`, the single superhub's rule)."""
    newest_type = await _registry_type(conn)
    query = _TAKEN.format(newest_type=newest_type, forged=forged_sql(rule, newest_type, "k.newest"))
    rows = await conn.fetch(query, feeder, staged.entities, staged.newest)
    if future := next(row[3] for row in rows if row[0] is None):
        log.warning("entities.future_newest", feeder=feeder, entities=future, skew_s=rule.clock_skew_s)
    others = [row for row in rows if row[0] is not None]
    held = displacement_held(rule, feeder, {row[0]: row[1] for row in others}, {row[0]: row[2] for row in others})
    if held is not None:
        raise DumpError(held)


async def heal_pending(
    conn: asyncpg.Connection, rule: EntityRule, parents: Sequence[ParentTable], wait_s: float
) -> list[str]:
    """Under the entity lock: settle every pending feeder (a change that failed or crashed after P, a build that
    switched shards), after waiting for the transactions that may have read their old data (as W2). The feeders
    settled."""
    pending = await conn.fetch('SELECT feeder, feeder_key FROM fedload.entity_pending ORDER BY feeder COLLATE "C"')
    if not pending:
        return []
    await wait_for_older(conn, wait_s, "a pending change")
    for feeder, key in pending:
        await settle_feeder(conn, rule, parents, feeder, key)
    log.info("entities.healed", feeders=[row[0] for row in pending])
    return [row[0] for row in pending]


@dataclass(slots=True)
class CoordinatedChange:
    """One change of a feeder's data on its shard, kept right on the coordinator (see the module): `prepare` (the
    entity lock, P, W1) before the shard's transaction takes its locks; the context's exit, after that transaction
    committed, W2 and R, then the lock's release."""

    setup: CoordinatedEntities
    feeder: str
    key: str
    parents: Sequence[ParentTable]
    _stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    _conn: asyncpg.Connection | None = None

    async def prepare(self, shard: asyncpg.Connection, tables: Sequence[EntityTable]) -> None:
        """P and W1 for the feeder's staged tables (read on `shard`, in its transaction; none: a removal). Skipped
        while the coordinator has no registry yet (its first build settles every feeder)."""
        staged = await staged_newest(shard, self.setup.rule, tables)
        conn = await self._stack.enter_async_context(
            superhub_session(self.setup.coordinator, f"{self.feeder} entities")
        )
        await self._stack.enter_async_context(entity_lock(conn, self.setup.max_wait_s))
        if not await conn.fetchval("SELECT to_regclass('fedload.entity_pending') IS NOT NULL"):
            log.info(
                "entities.no_registry", feeder=self.feeder, reason="the coordinator is not built with the rule yet"
            )
            return
        await heal_pending(conn, self.setup.rule, self.parents, self.setup.max_wait_s)
        await check_claims(conn, self.setup.rule, self.feeder, staged)
        self._conn = conn  # from P on, a failure leaves the feeder pending
        await conn.execute(await _prepare_sql(conn, self.setup.rule), self.feeder, self.key, staged.entities)
        await wait_for_older(conn, self.setup.max_wait_s, f"feeder {self.feeder}'s change was prepared")

    async def settle(self) -> None:
        """W2 and R, after the shard's transaction committed."""
        if self._conn is not None:
            await wait_for_older(self._conn, self.setup.max_wait_s, f"feeder {self.feeder}'s data committed")
            await settle_feeder(self._conn, self.setup.rule, self.parents, self.feeder, self.key)

    async def close(self) -> None:
        """Release the entity lock and the coordinator session."""
        await self._stack.aclose()


@contextlib.asynccontextmanager
async def coordinated_change(
    setup: CoordinatedEntities | None, feeder: str, key: int | str | None, parents: Sequence[ParentTable]
) -> AsyncIterator[CoordinatedChange | None]:
    """The block's change of feeder `feeder`'s data (its shard's transaction, committed inside the block), kept
    right on the coordinator: the block calls `prepare` before that transaction's locks; after a block that ends
    well, W2 and R. A block that fails leaves the feeder pending (P's hidden set holds for its old data and its new
    alike) for the next change to settle. None without the coordinated rule."""
    if setup is None:
        yield None
        return
    change = CoordinatedChange(setup, feeder, "" if key is None else str(key), parents)
    try:
        yield change
        await change.settle()
    except BaseException:
        if change._conn is not None:
            log.warning("entities.left_pending", feeder=feeder, reason="the change failed after it was prepared")
        raise
    finally:
        await asyncio.shield(change.close())
