"""One entity, one feeder (`superhub.entity_key`, `superhub.entity_newest`; docs/entities.md): inside a feeder's swap,
each entity is left in the partitions of the one feeder whose newest value is the greatest; the other copies wait in
`fedload_displaced` until their feeder wins again.

The registry is `fedload.entity_homes` (one row per entity, the row every decision about it locks) and
`fedload.entity_copies`. A swap reads the feeder's entities before its parents' locks (`stage_entities`) and, after
them, locks the home rows in entity order, decides, and moves the rows (`settle_entities`; docs/entities.md, "In
the swap" and "Locks: no new waiting, no deadlock"). A feeder's claims are bounded (`forged_sql`,
`displacement_held`; "What a feeder can claim"). Without the configuration none of this runs and no query is sent.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from fedload.errors import ConfigError, DumpError, SuperhubError
from fedload.log import get_logger
from fedload.names import TableName
from fedload.superhub.bookkeeping.locks import LOCK_CLASS
from fedload.superhub.schema import Column, ParentTable, ident, qualified, text_literal

if TYPE_CHECKING:
    from fedload.config import SuperhubConfig

__all__ = [
    "DISPLACED_SCHEMA",
    "EntityRule",
    "EntityTable",
    "StagedEntities",
    "check_entity_rule",
    "copies_written_sql",
    "displaced_counts",
    "displaced_pairs",
    "displaced_table",
    "displacement_held",
    "forged_sql",
    "forget_displaced",
    "settle_entities",
    "stage_entities",
    "staged_keys",
    "staged_newest",
]

log = get_logger()
DISPLACED_SCHEMA = "fedload_displaced"
_FEEDER_COLUMN = "fedload_feeder"
_SINCE_COLUMN = "fedload_since"
_MAX_IDENTIFIER_BYTES = 63


@dataclass(frozen=True, slots=True)
class EntityRule:
    """The configured entity: its key column, and the table and column whose newest value decides its feeder; and
    what a feeder's claims may do (`superhub.entity_clock_skew_s`, `entity_max_displaced_share`,
    `entity_max_displaced`)."""

    key_column: str
    newest_table: TableName
    newest_column: str
    feeder_key: str  # the parents' feeder key column (`superhub.feeder_key`)
    clock_skew_s: float = 300.0  # a newest date or timestamp past the superhub's now() by more is not believed
    max_displaced_share: float = 0.5  # a run taking more of another feeder's shown entities than this share...
    max_displaced: int = 10  # ... and than this many is held back

    @classmethod
    def from_config(
        cls,
        key_column: str | None,
        newest: str | None,
        feeder_key: str,
        *,
        clock_skew_s: float = 300.0,
        max_displaced_share: float = 0.5,
        max_displaced: int = 10,
    ) -> EntityRule | None:
        """The rule of `superhub.entity_key` and `superhub.entity_newest` (checked by the configuration), with its
        limits; None without them."""
        if key_column is None or newest is None:
            return None
        schema, table, column = newest.split(".")
        return cls(
            key_column, TableName(schema, table), column, feeder_key, clock_skew_s, max_displaced_share, max_displaced
        )

    @classmethod
    def of_superhub(cls, superhub: SuperhubConfig) -> EntityRule | None:
        """The rule `[superhub]` configures (`entity_*`); None without it."""
        return cls.from_config(
            superhub.entity_key,
            superhub.entity_newest,
            superhub.feeder_key,
            clock_skew_s=superhub.entity_clock_skew_s,
            max_displaced_share=superhub.entity_max_displaced_share,
            max_displaced=superhub.entity_max_displaced,
        )


@dataclass(frozen=True, slots=True)
class EntityTable:
    """A parent the rule applies to (it has the key column), and the swapping feeder's staging table of it (SQL
    name; None for a removal)."""

    parent: ParentTable
    stage_sql: str | None = None


def displaced_table(table: TableName) -> str:
    """The SQL name of the table that keeps `table`'s displaced rows: `fedload_displaced."<schema>.<table>"`,
    hashed past 63 bytes."""
    name = f"{table.schema}.{table.name}"
    if len(name.encode()) > _MAX_IDENTIFIER_BYTES:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name.encode()[:50].decode(errors='ignore')}_{digest}"
    return qualified(DISPLACED_SCHEMA, name)


@dataclass(frozen=True, slots=True)
class StagedEntities:
    """A swap's own entities, read before its parents' locks (they need none): the keys in its staging tables, in
    byte order, their newest values as text (None where the newest table lacks the entity), and the newest
    column's type."""

    newest_type: str
    entities: list[str]
    newest: list[str | None]


async def stage_entities(conn: asyncpg.Connection, rule: EntityRule, tables: Sequence[EntityTable]) -> StagedEntities:
    """Ensure the registry and read the feeder's entities and newest values from its staging tables (none for a
    removal): the part of the step that needs no lock of the parents, so the swap runs it before taking them and
    its lock window holds only the decision and the moves."""
    applied = _applied(rule, tables)
    newest_type = await _ensure_registry(conn, rule, [t.parent for t in applied])
    return await _read_staged(conn, rule, applied, newest_type)


async def staged_newest(conn: asyncpg.Connection, rule: EntityRule, tables: Sequence[EntityTable]) -> StagedEntities:
    """The feeder's entities and newest values in its staging tables (none for a removal), read on a shard for the
    coordinator (`fedload.superhub.coordinated_entities`): no registry there."""
    applied = _applied(rule, tables)
    newest_type, _ = await check_entity_rule(conn, rule)
    return await _read_staged(conn, rule, applied, newest_type)


async def _read_staged(
    conn: asyncpg.Connection, rule: EntityRule, applied: Sequence[EntityTable], newest_type: str
) -> StagedEntities:
    """The entities and newest values in the staging tables of `applied`."""
    query = _staged_sql(rule, applied, newest_type)
    if query is None:
        return StagedEntities(newest_type, [], [])
    row = await conn.fetchrow(query)
    assert row is not None  # an aggregate: one row
    return StagedEntities(newest_type, list(row[0]), list(row[1]))


async def staged_keys(conn: asyncpg.Connection, rule: EntityRule, tables: Sequence[EntityTable]) -> list[str]:
    """The distinct keys of the staging tables with the key column (none for a removal): the feeder's entities in
    its new data, for the coordinator (`fedload.superhub.coordinated_entities`); no registry on the shard."""
    key = ident(rule.key_column)
    staged = [t.stage_sql for t in _applied(rule, tables) if t.stage_sql is not None]
    if not staged:
        return []
    keys = " UNION ".join(f"SELECT {key}::text FROM {stage} WHERE {key} IS NOT NULL" for stage in staged)  # noqa: S608
    return list(await conn.fetchval(f"SELECT coalesce(array_agg(entity), '{{}}') FROM ({keys}) AS k (entity)"))  # noqa: S608


async def settle_entities(
    conn: asyncpg.Connection,
    rule: EntityRule,
    tables: Sequence[EntityTable],
    feeder: str,
    key: int | str | None,
    *,
    staged: StagedEntities | None = None,
) -> bool:
    """Decide the homes of feeder `feeder`'s entities and move the rows accordingly (see the module docstring), in
    the caller's transaction, after its parents' locks and before its tables are swapped. `tables`: the parents of
    the swap (or removal), those without the key column ignored; each with its staging table in a swap, without in
    a removal (the feeder then has no entity left). `staged`: `stage_entities` of the same tables, read before the
    locks (read here without). Whether any row moved (taken, kept aside or given back): the caller must then change
    the feeder's own rows of these tables by DELETE and INSERT too, never by a partition change (docs/entities.md,
    "What a reader can rely on")."""
    started = time.monotonic()
    applied = _applied(rule, tables)
    if staged is None:
        staged = await stage_entities(conn, rule, applied)
    key_text = "" if key is None else str(key)
    await conn.execute(_LOCK_HOMES, staged.entities, feeder)
    row = await conn.fetchrow(_decide_sql(rule, staged.newest_type), feeder, key_text, staged.entities, staged.newest)
    assert row is not None  # an aggregate: one row
    decision = _Decision(*row)
    if decision.future:
        log.warning("entities.future_newest", feeder=feeder, entities=decision.future, skew_s=rule.clock_skew_s)
    if decision.taken:
        await _held_back(conn, rule, feeder, decision)
    for table in applied:
        for statement, args in _moves(rule, table, feeder, decision):
            await conn.execute(statement, *args)
    log.debug(
        "swap.entities",
        feeder=feeder,
        entities=decision.count,
        displaced=len(decision.lost),
        taken=len(decision.taken),
        back=len(decision.back),
        ms=round((time.monotonic() - started) * 1000, 1),
    )
    return bool(decision.taken or decision.back or set(decision.lost).intersection(staged.entities))


async def _held_back(conn: asyncpg.Connection, rule: EntityRule, feeder: str, decision: _Decision) -> None:
    """DumpError if the decision takes too many of another feeder's entities (`displacement_held`); its copies
    were just stamped, so the entities it showed before are those it shows now, plus those taken, less those it
    got back."""
    taken = Counter(decision.taken_homes)
    if not any(n > rule.max_displaced for n in taken.values()):
        return
    rows = await conn.fetch(_SHOWN, sorted(taken))
    back = Counter(decision.back_homes)
    shown = {row[0]: row[1] + taken[row[0]] - back[row[0]] for row in rows}
    if (held := displacement_held(rule, feeder, taken, shown)) is not None:
        raise DumpError(held)


_SHOWN = """
SELECT f.feeder, (SELECT count(*) FROM fedload.entity_copies c WHERE c.feeder = f.feeder AND c.displaced_since IS NULL)
FROM unnest($1::text[]) AS f (feeder)
"""


def displacement_held(rule: EntityRule, feeder: str, taken: Mapping[str, int], shown: Mapping[str, int]) -> str | None:
    """Why feeder `feeder`'s run is held back, in one line, if it takes (`taken`: per other feeder, how many of
    its entities) more than `max_displaced` and more than `max_displaced_share` of the entities that feeder
    showed before the run (`shown`); None when it may go on. The same rule on one superhub and across shards."""
    for other, count in sorted(taken.items()):
        total = max(shown.get(other, count), count, 1)
        if other != feeder and count > rule.max_displaced and count > rule.max_displaced_share * total:
            return (
                f"feeder {feeder} would take {count} of the {total} entities feeder {other} shows "
                f"({count / total:.0%}), more than superhub.entity_max_displaced_share = {rule.max_displaced_share:g} "
                f"and entity_max_displaced = {rule.max_displaced} allow: held back, the old data kept "
                "(if these entities really moved, sync once with entity_max_displaced_share = 1.0)"
            )
    return None


_TEMPORAL = re.compile(r"date|timestamp(\(\d\))? with(out)? time zone")


def forged_sql(rule: EntityRule, newest_type: str, value: str) -> str:
    """SQL, true where the newest value `value` (an expression of type `newest_type`) is a date or timestamp later
    than the superhub's now() plus `clock_skew_s` ('infinity' included): a claim not believed, ranked below every
    other copy, NULLs too. Never for the other types, which no clock bounds (a cast: ORDER BY reads a bare
    constant as a column's position)."""
    if not _TEMPORAL.fullmatch(newest_type):
        return "false::boolean"
    bound = f"CAST(now() + make_interval(secs => {float(rule.clock_skew_s)!r}) AS {newest_type})"
    return f"({value} > {bound}) IS TRUE"


def _applied(rule: EntityRule, tables: Sequence[EntityTable]) -> list[EntityTable]:
    """The tables with the key column, in name order."""
    return [t for t in sorted(tables, key=lambda t: t.parent.table) if t.parent.column(rule.key_column)]


async def forget_displaced(
    conn: asyncpg.Connection, rule: EntityRule, parents: Iterable[ParentTable], feeder: str
) -> None:
    """Drop feeder `feeder`'s displaced rows of `parents` (its partitions of them are being dropped: no home for
    them to come back to); the registry keeps its entities, which its other tables still have."""
    for parent in sorted(parents, key=lambda p: p.table):
        name = displaced_table(parent.table)
        if parent.column(rule.key_column) and await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name):
            await conn.execute(f"DELETE FROM {name} WHERE {_FEEDER_COLUMN} = $1", feeder)  # noqa: S608


async def displaced_pairs(conn: asyncpg.Connection) -> dict[str, dict[str, int]]:
    """Who displaced whom: per feeder, how many of its entities each other feeder shows (its copy at home), on one
    superhub or on the coordinator; empty without the registry."""
    if not await conn.fetchval("SELECT to_regclass('fedload.entity_copies') IS NOT NULL"):
        return {}
    rows = await conn.fetch(
        "SELECT c.feeder, s.feeder, count(*) FROM fedload.entity_copies c JOIN fedload.entity_copies s "
        "ON s.entity = c.entity AND s.displaced_since IS NULL AND s.feeder <> c.feeder "
        'WHERE c.displaced_since IS NOT NULL GROUP BY 1, 2 ORDER BY c.feeder COLLATE "C", s.feeder COLLATE "C"'
    )
    pairs: dict[str, dict[str, int]] = {}
    for displaced, shown_by, count in rows:
        pairs.setdefault(displaced, {})[shown_by] = count
    return pairs


async def displaced_counts(conn: asyncpg.Connection) -> dict[str, int]:
    """How many of each feeder's entities are displaced (shown by another feeder); empty without the registry."""
    if not await conn.fetchval("SELECT to_regclass('fedload.entity_copies') IS NOT NULL"):
        return {}
    rows = await conn.fetch(
        "SELECT feeder, count(*) FROM fedload.entity_copies WHERE displaced_since IS NOT NULL GROUP BY feeder"
    )
    return {row[0]: row[1] for row in rows}


# The newest column's type, whether it has a btree order, whether its table has the key column ($3), the
# registry's type (NULL before it exists), and the isolation level; no row when the table or the column is missing.
_NEWEST_TYPE = """
SELECT format_type(a.atttypid, a.atttypmod),
       EXISTS (SELECT 1 FROM pg_opclass o JOIN pg_am m ON m.oid = o.opcmethod
               WHERE m.amname = 'btree' AND o.opcdefault AND o.opcintype IN (
                     t.oid, t.typbasetype, CASE WHEN t.typelem <> 0 THEN 'anyarray'::regtype END,
                     CASE WHEN t.typtype = 'e' THEN 'anyenum'::regtype END)),
       EXISTS (SELECT 1 FROM pg_attribute k WHERE k.attrelid = a.attrelid AND k.attname = $3 AND NOT k.attisdropped),
       (SELECT format_type(r.atttypid, r.atttypmod) FROM pg_attribute r
        WHERE r.attrelid = to_regclass('fedload.entity_homes') AND r.attname = 'newest' AND NOT r.attisdropped),
       current_setting('transaction_isolation')
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped
"""
# Creations in turn, under the bootstrap's advisory lock; then a relation lock new to the transaction, which makes
# the backend read the catalog changes committed meanwhile (an advisory lock does not): without it, CREATE ... IF
# NOT EXISTS behind a swap that just created the same objects fails on a duplicate name.
_CREATING = f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, 0); LOCK TABLE fedload.runs IN ACCESS SHARE MODE"
_DISPLACED_COLUMNS = """
SELECT n, coalesce((SELECT array_agg(attname::text) FROM pg_attribute
                    WHERE attrelid = to_regclass(n) AND attnum > 0 AND NOT attisdropped), '{}')
FROM unnest($1::text[]) AS n
"""


async def check_entity_rule(conn: asyncpg.Connection, rule: EntityRule) -> tuple[str, str | None]:
    """The newest column's type and the registry's (None before the first swap with the rule); ConfigError, one
    line, for a newest table or column the superhub lacks, a newest table without the key column, a type without
    order, or a registry made for another type; SuperhubError for sessions not in read committed."""
    newest = f"superhub.entity_newest = {rule.newest_table}.{rule.newest_column}"
    row = await conn.fetchrow(_NEWEST_TYPE, rule.newest_table.sql, rule.newest_column, rule.key_column)
    if row is None:
        raise ConfigError(f"{newest}: the superhub has no table {rule.newest_table} with that column")
    newest_type, ordered, keyed, registered, isolation = row
    if isolation != "read committed":  # each statement must see the swaps committed while it waited for its locks
        raise SuperhubError(
            f"{newest}: needs transactions in read committed, but the superhub's sessions start in {isolation} "
            "(default_transaction_isolation)"
        )
    if not keyed:
        raise ConfigError(f"{newest}: table {rule.newest_table} has no entity_key column {rule.key_column}")
    if not ordered:
        raise ConfigError(f"{newest}: its type {newest_type} has no order (no default btree operator class)")
    if registered is not None and registered != newest_type:
        raise ConfigError(
            f"{newest}: its type is {newest_type} but fedload.entity_homes was made for {registered}; "
            "drop fedload.entity_homes and fedload.entity_copies to start the registry again"
        )
    return str(newest_type), None if registered is None else str(registered)


async def _ensure_registry(conn: asyncpg.Connection, rule: EntityRule, parents: Iterable[ParentTable]) -> str:
    """The registry and the displaced tables, created or given the parents' new columns where needed; the newest
    column's type. ConfigError, one line, for a newest column that is missing, has no order, or changed type."""
    newest_type, registered = await check_entity_rule(conn, rule)
    parents = list(parents)
    names = [displaced_table(p.table) for p in parents]
    present: dict[str, list[str]] = {row[0]: row[1] for row in await conn.fetch(_DISPLACED_COLUMNS, names)}
    missing = [
        (parent, name, [c for c in parent.columns if c.name not in present[name]])
        for parent, name in zip(parents, names, strict=True)
    ]
    if registered is None or any(columns for _, _, columns in missing):
        await conn.execute(_CREATING)
        await conn.execute(_registry_sql(rule, newest_type, missing, present))
    return str(newest_type)


def _registry_sql(
    rule: EntityRule,
    newest_type: str,
    missing: list[tuple[ParentTable, str, list[Column]]],
    present: dict[str, list[str]],
) -> str:
    """The registry's and the displaced tables' creation (each displaced table indexed by feeder and entity, as its
    rows are dropped and brought back), or the columns the displaced tables lack, added."""
    statements = [
        f"CREATE SCHEMA IF NOT EXISTS {ident(DISPLACED_SCHEMA)}",
        f"CREATE TABLE IF NOT EXISTS fedload.entity_homes (entity text PRIMARY KEY, feeder text, feeder_key text, "
        f"newest {newest_type})",
        f"CREATE TABLE IF NOT EXISTS fedload.entity_copies (feeder text NOT NULL, entity text NOT NULL, "
        f"feeder_key text NOT NULL, newest {newest_type}, displaced_since timestamptz, PRIMARY KEY (feeder, entity))",
        "CREATE INDEX IF NOT EXISTS entity_copies_entity ON fedload.entity_copies (entity)",
    ]
    for parent, name, columns in missing:
        if not present[name]:
            statements.append(
                f"CREATE TABLE IF NOT EXISTS {name} ({_FEEDER_COLUMN} text NOT NULL, {_SINCE_COLUMN} timestamptz "
                f"NOT NULL, {', '.join(f'{ident(c.name)} {c.type_sql}' for c in parent.columns)})"
            )
            index = "displaced_" + hashlib.sha256(name.encode()).hexdigest()[:16]
            key = ident(rule.key_column)
            statements.append(f"CREATE INDEX IF NOT EXISTS {ident(index)} ON {name} ({_FEEDER_COLUMN}, {key})")
        elif columns:
            added = ", ".join(f"ADD COLUMN IF NOT EXISTS {ident(c.name)} {c.type_sql}" for c in columns)
            statements.append(f"ALTER TABLE {name} {added}")
    return ";\n".join(statements)


def _staged_sql(rule: EntityRule, tables: Sequence[EntityTable], newest_type: str) -> str | None:
    """The query of the feeder's entities (distinct keys of its staging tables, in byte order) and their newest
    values as text, as two arrays; None without staging tables (a removal)."""
    key = ident(rule.key_column)
    staged = [t for t in tables if t.stage_sql is not None]
    if not staged:
        return None
    keys = " UNION ".join(
        f"SELECT {key}::text FROM {t.stage_sql} WHERE {key} IS NOT NULL"  # noqa: S608 - our names
        for t in staged
    )
    newest_stage = next((t.stage_sql for t in staged if t.parent.table == rule.newest_table), None)
    newest = (
        f"SELECT {key}::text, max({ident(rule.newest_column)}) FROM {newest_stage} GROUP BY 1"  # noqa: S608
        if newest_stage is not None
        else f"SELECT NULL::text, NULL::{newest_type}"
    )
    return (
        "SELECT coalesce(array_agg(entity ORDER BY entity COLLATE \"C\"), '{}'), "  # noqa: S608 - our names
        "coalesce(array_agg(newest::text ORDER BY entity COLLATE \"C\"), '{}') "
        f"FROM ({keys}) AS k (entity) LEFT JOIN ({newest}) AS n (entity, newest) USING (entity)"
    )


# $1 the staged entities (byte order), $2 the feeder. Locks the home rows of the entities the swap touches (its
# staged ones and those its copies had) in entity order, in one statement: an upsert (new entities get theirs;
# `WHERE false` updates nothing but locks the existing ones, INSERT's documented behaviour). Two swaps wait for
# each other in that one order, never in a cycle.
_LOCK_HOMES = """
INSERT INTO fedload.entity_homes AS h (entity)
SELECT entity FROM (SELECT unnest($1::text[]) UNION SELECT entity FROM fedload.entity_copies WHERE feeder = $2::text)
  AS t (entity)
ORDER BY entity COLLATE "C"
ON CONFLICT (entity) DO UPDATE SET entity = excluded.entity WHERE false
"""


def _decide_sql(rule: EntityRule, newest_type: str) -> str:
    """One statement, after `_LOCK_HOMES` (so its snapshot sees every copy committed before the locks): decides
    each touched entity's home (newest value first, NULLs last, then the feeder name in byte order) from the
    others' copies and the feeder's staged ones; rewrites the feeder's copies where they changed (newest value,
    key, displaced or not), stamps the others' copies displaced since now or home again, records the homes; and
    returns what the tables' moves need: the touched count, the entities the feeder does not win, those it takes
    (with their old homes and keys), those that go back to a new home (with it); and how many of the feeder's
    values are not believed (`forged_sql`: they rank below every other copy). $1 the feeder, $2 its key as text,
    $3 and $4 `StagedEntities.entities` and `.newest`."""
    forged = forged_sql(rule, newest_type, "k.newest")
    return f"""
WITH mine AS (
  SELECT m.entity, m.newest::{newest_type} AS newest FROM unnest($3::text[], $4::text[]) AS m (entity, newest)
), touched AS (
  SELECT entity FROM mine UNION SELECT entity FROM fedload.entity_copies WHERE feeder = $1::text
), winner AS (
  SELECT DISTINCT ON (k.entity) k.entity, k.feeder, k.feeder_key, k.newest FROM (
    SELECT c.entity, c.feeder, c.feeder_key, c.newest FROM fedload.entity_copies c JOIN touched t USING (entity)
    WHERE c.feeder <> $1::text
    UNION ALL SELECT entity, $1::text, $2::text, newest FROM mine) AS k
  ORDER BY k.entity, {forged}, k.newest DESC NULLS LAST, k.feeder COLLATE "C"
), decided AS (
  SELECT t.entity, h.feeder AS old_home, h.feeder_key AS old_key, w.feeder AS new_home, w.feeder_key AS new_key,
         w.newest
  FROM touched t JOIN fedload.entity_homes h USING (entity) LEFT JOIN winner w USING (entity)
), forgotten AS (
  DELETE FROM fedload.entity_copies c WHERE c.feeder = $1::text
    AND NOT EXISTS (SELECT FROM mine m WHERE m.entity = c.entity)
), {copies_written_sql("mine", "decided", "new_home")}), homeless AS (
  DELETE FROM fedload.entity_homes h USING decided d WHERE h.entity = d.entity AND d.new_home IS NULL
), homed AS (
  UPDATE fedload.entity_homes h SET feeder = d.new_home, feeder_key = d.new_key, newest = d.newest
  FROM decided d
  WHERE h.entity = d.entity AND d.new_home IS NOT NULL
    AND (h.feeder, h.feeder_key, h.newest) IS DISTINCT FROM (d.new_home, d.new_key, d.newest)
)
SELECT count(*),
  coalesce(array_agg(entity) FILTER (WHERE new_home <> $1::text), '{{}}'),
  coalesce(array_agg(entity) FILTER (WHERE new_home = $1::text AND old_home <> $1::text), '{{}}'),
  coalesce(array_agg(old_key) FILTER (WHERE new_home = $1::text AND old_home <> $1::text), '{{}}'),
  coalesce(array_agg(old_home) FILTER (WHERE new_home = $1::text AND old_home <> $1::text), '{{}}'),
  coalesce(array_agg(entity) FILTER (WHERE new_home <> $1::text AND old_home IS DISTINCT FROM new_home), '{{}}'),
  coalesce(array_agg(new_home) FILTER (WHERE new_home <> $1::text AND old_home IS DISTINCT FROM new_home), '{{}}'),
  (SELECT count(*) FROM mine k WHERE {forged})
FROM decided
"""  # noqa: S608 - a type name from the catalog


def copies_written_sql(rows: str, decided: str, home: str) -> str:
    """Two CTEs of a decision statement (the single superhub's and the coordinator's): `copied` writes feeder $1's
    (key $2) copies from `rows` (entity, newest) joined to `decided` (entity, and the home feeder in column `home`),
    each displaced since when it first was, rewritten only where it changed; `others` stamps the other feeders'
    copies of those entities displaced since now, or home again. The caller closes the last CTE."""
    return f"""copied AS (
  INSERT INTO fedload.entity_copies AS c (feeder, entity, feeder_key, newest, displaced_since)
  SELECT $1::text, m.entity, $2::text, m.newest, CASE WHEN d.{home} = $1::text THEN NULL ELSE now() END
  FROM {rows} m JOIN {decided} d USING (entity)
  ON CONFLICT (feeder, entity) DO UPDATE SET newest = excluded.newest, feeder_key = excluded.feeder_key,
    displaced_since = CASE WHEN excluded.displaced_since IS NOT NULL
                           THEN coalesce(c.displaced_since, excluded.displaced_since) END
  WHERE (c.newest, c.feeder_key, c.displaced_since IS NULL)
        IS DISTINCT FROM (excluded.newest, excluded.feeder_key, excluded.displaced_since IS NULL)
), others AS (
  UPDATE fedload.entity_copies c
  SET displaced_since = CASE WHEN c.feeder = d.{home} THEN NULL ELSE coalesce(c.displaced_since, now()) END
  FROM {decided} d
  WHERE c.entity = d.entity AND c.feeder <> $1::text AND (c.feeder = d.{home}) = (c.displaced_since IS NOT NULL)
"""  # noqa: S608 - our own names; the caller closes the last CTE


@dataclass(frozen=True, slots=True)
class _Decision:
    """What the decision asks of the tables (`_decide_sql`'s row): how many entities it touched, those the feeder
    does not win (its staged rows of them are displaced), those it takes from their old homes (with the homes'
    keys and names), those whose rows come back to a new home (with it)."""

    count: int
    lost: list[str]
    taken: list[str]
    taken_keys: list[str]
    taken_homes: list[str]
    back: list[str]
    back_homes: list[str]
    future: int  # the feeder's newest values not believed (past the superhub's clock)


def _moves(rule: EntityRule, table: EntityTable, feeder: str, decision: _Decision) -> list[tuple[str, list[object]]]:
    """The statements (with their arguments) that move one table's rows as the decision says: the feeder's old
    displaced rows dropped, its staged rows of entities it does not win displaced, the rows of entities it now
    wins taken from their old home (that home's partition only, pruned by its key as a constant), the displaced
    rows of entities it lost or left brought back to their new home. Only those with something to move."""
    parent = table.parent
    column = parent.column(rule.key_column)
    assert column is not None
    key, key_type = ident(column.name), column.type_sql
    feeder_key = ident(rule.feeder_key)
    displaced = displaced_table(parent.table)
    columns = [c.name for c in parent.columns if c.generated_sql is None]
    listed = ", ".join(map(ident, columns))
    gone = ", ".join(f"g.{ident(c)}" for c in columns)
    into = f"INSERT INTO {displaced} ({_FEEDER_COLUMN}, {_SINCE_COLUMN}, {listed})"
    moves: list[tuple[str, list[object]]] = [(f"DELETE FROM {displaced} WHERE {_FEEDER_COLUMN} = $1", [feeder])]  # noqa: S608
    if table.stage_sql is not None and decision.lost:
        moves.append(
            (
                f"WITH g AS (DELETE FROM {table.stage_sql} s WHERE s.{key} = ANY($2::text[]::{key_type}[]) "  # noqa: S608
                f"RETURNING s.*) {into} SELECT $1::text, coalesce(c.displaced_since, now()), {gone} FROM g "
                f"LEFT JOIN fedload.entity_copies c ON c.feeder = $1::text AND c.entity = g.{key}::text",
                [feeder, decision.lost],
            )
        )
    if decision.taken:
        feeder_type = (parent.column(rule.feeder_key) or column).type_sql
        old = ", ".join(f"CAST({text_literal(k)} AS {feeder_type})" for k in sorted(set(decision.taken_keys)))
        moves.append(
            (
                f"WITH g AS (DELETE FROM {parent.sql_name} p "  # noqa: S608
                "USING unnest($1::text[], $2::text[], $3::text[]) AS d (entity, old_key, old_home) "
                f"WHERE p.{feeder_key} IN ({old}) AND p.{key} = d.entity::{key_type} "
                f"AND p.{feeder_key}::text = d.old_key RETURNING p.*, d.old_home AS fedload_old_home) "
                f"{into} SELECT g.fedload_old_home, now(), {gone} FROM g",
                [decision.taken, decision.taken_keys, decision.taken_homes],
            )
        )
    if decision.back:
        moves.append(
            (
                f"WITH g AS (DELETE FROM {displaced} x USING unnest($1::text[], $2::text[]) AS d (entity, new_home) "  # noqa: S608
                f"WHERE x.{key} = d.entity::{key_type} AND x.{_FEEDER_COLUMN} = d.new_home RETURNING x.*) "
                f"INSERT INTO {parent.sql_name} ({listed}) OVERRIDING SYSTEM VALUE SELECT {gone} FROM g",
                [decision.back, decision.back_homes],
            )
        )
    return moves
