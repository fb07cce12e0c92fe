"""The superhub's schema: partitioned parent tables, read from the catalog or created from a schema file.

Every identifier fedload writes into SQL goes through `ident()` (always quoted). Column types, defaults
and index definitions come from the superhub's own catalog or the operator's schema file, never from a feeder.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from fedload.errors import SuperhubError
from fedload.feeder.table_patterns import exact_name
from fedload.names import TableName, TablePattern, quote_ident

__all__ = [
    "Column",
    "ParentIndex",
    "ParentTable",
    "ParentsSpec",
    "existing_tables",
    "ident",
    "key_literal",
    "qualified",
    "read_parents",
    "text_literal",
    "unmatched_patterns",
]

STAGE_SCHEMA = "fedload_stage"
PARTS_SCHEMA = "fedload_parts"


def ident(name: str) -> str:
    """`name` as an always-quoted PostgreSQL identifier."""
    return quote_ident(name)


def qualified(schema: str, name: str) -> str:
    """`schema.name`, both quoted."""
    return f"{ident(schema)}.{ident(name)}"


def text_literal(text: str) -> str:
    """`text` as an SQL string literal (fedload's sessions have standard_conforming_strings on)."""
    return "'" + text.replace("'", "''") + "'"


def key_literal(key: int | str) -> str:
    """A feeder key as an SQL literal."""
    return str(int(key)) if isinstance(key, int) else text_literal(key)


@dataclass(frozen=True, slots=True)
class ParentsSpec:
    """The parents as the configuration describes them: the patterns that name them, their feeder key column and
    that column's type, and the schema file that creates the missing ones (None: they must exist)."""

    tables: tuple[TablePattern, ...]
    feeder_key: str
    key_type: str  # the feeder key column's type in a parent made from the schema file: "integer" or "text"
    schema_file: Path | None

    def wanted(self, schema: str, name: str) -> bool:
        """Whether a table of the schema file is one of the parents (a pattern matches it)."""
        return any(p.matches(TableName(schema, name)) for p in self.tables)

    def named_tables(self) -> list[TableName] | None:
        """The tables the patterns name where each names exactly one table (no wildcard, no class): the schema file
        can then add no other parent; None where a pattern could match more."""
        try:
            return [TableName(*exact_name(p.text)) for p in self.tables]
        except ValueError:  # a pattern
            return None


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a parent table, as the catalog describes it."""

    name: str
    type_sql: str
    not_null: bool
    default_sql: str | None
    generated_sql: str | None
    base_type_sql: str  # the type without modifiers (varchar, not varchar(10)): casts to it never truncate
    collation_sql: str | None = None  # a collation other than the type's default, qualified and quoted
    generated_kind: str = "s"  # attgenerated of a generated column: "s" stored, "v" virtual (PostgreSQL 18)
    binary_type_oid: int = 0  # its type's OID where binary COPY may load it (built in, with binary input), else 0
    statistics_target: int | None = None  # ALTER COLUMN ... SET STATISTICS on the parent; None: the default

    def definition(self, default_sql: str | None = None) -> str:
        """The column's definition for a CREATE TABLE, optionally with another default."""
        parts = [ident(self.name), self.type_sql]
        if self.collation_sql is not None:
            parts.append(f"COLLATE {self.collation_sql}")
        if self.generated_sql is not None:
            kind = "VIRTUAL" if self.generated_kind == "v" else "STORED"
            parts.append(f"GENERATED ALWAYS AS ({self.generated_sql}) {kind}")
        elif (default := default_sql or self.default_sql) is not None:
            parts.append(f"DEFAULT {default}")
        if self.not_null:
            parts.append("NOT NULL")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class ParentIndex:
    """One index of a partitioned parent: its definition after `ON ONLY parent`, and the constraint it backs."""

    unique: bool
    body: str  # "USING btree (a, lower(b)) WHERE ..."
    constraint_sql: str | None  # "PRIMARY KEY (a, b)", "UNIQUE NULLS NOT DISTINCT (a)": ATTACH wants a constraint


@dataclass(frozen=True, slots=True)
class ParentTable:
    """A partitioned parent table on the superhub."""

    table: TableName
    columns: tuple[Column, ...]
    indexes: tuple[ParentIndex, ...]
    checks: tuple[tuple[str, str], ...] = ()  # (name, "CHECK (...)"): ATTACH wants each, under its name
    constraint_names: frozenset[str] = frozenset()

    @property
    def qualified_name(self) -> str:
        """`schema.name` unquoted, for messages and run history."""
        return str(self.table)

    @property
    def sql_name(self) -> str:
        """The quoted name for SQL."""
        return self.table.sql

    def column(self, name: str) -> Column | None:
        """The column called `name`, if any."""
        return next((c for c in self.columns if c.name == name), None)


_PARENTS = """
SELECT n.nspname, c.relname, c.oid
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'p' AND NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema')
"""
_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       CASE WHEN a.attgenerated = '' THEN pg_get_expr(d.adbin, d.adrelid) END,
       CASE WHEN a.attgenerated <> '' THEN pg_get_expr(d.adbin, d.adrelid) END,
       format_type(a.atttypid, NULL),
       CASE WHEN a.attcollation <> t.typcollation THEN
            quote_ident(cn.nspname) || '.' || quote_ident(co.collname) END,
       CASE WHEN a.attgenerated <> '' THEN a.attgenerated::text ELSE 's' END,
       CASE WHEN t.oid < 16384 AND t.typreceive::oid <> 0 THEN t.oid::int8 ELSE 0 END,
       nullif(a.attstattarget, -1)::int4
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_collation co ON co.oid = a.attcollation
LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_INDEXES = """
SELECT i.indisunique, pg_get_indexdef(i.indexrelid),
       'INDEX ' || quote_ident(ic.relname) || ' ON ONLY ' || quote_ident(n.nspname) || '.' || quote_ident(c.relname),
       (SELECT pg_get_constraintdef(k.oid) FROM pg_constraint k
        WHERE k.conindid = i.indexrelid AND k.conrelid = i.indrelid AND k.contype IN ('p', 'u', 'x'))
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.indrelid = $1
ORDER BY ic.relname
"""
_CONSTRAINTS = "SELECT conname, contype::text, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1"


_EXISTING = """
SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND (n.nspname, c.relname) IN (SELECT * FROM unnest($1::text[], $2::text[]))
"""


async def existing_tables(conn: asyncpg.Connection, tables: Iterable[TableName]) -> set[TableName]:
    """Those of `tables` that exist as tables, partitioned or not (a parent cannot be created under their names),
    in one catalog query."""
    wanted = set(tables)
    rows = await conn.fetch(_EXISTING, [t.schema for t in wanted], [t.name for t in wanted])
    return {TableName(schema, name) for schema, name in rows}


async def read_parents(
    conn: asyncpg.Connection, patterns: Sequence[TablePattern], feeder_key: str
) -> dict[TableName, ParentTable]:
    """The partitioned tables matching the configured patterns; each has the key column.

    The catalog is read with an empty search_path, so that the catalog functions qualify every name they print;
    the session's search_path is the same afterwards (set locally in a transaction, or a savepoint of the
    caller's, and restored before it ends)."""
    async with conn.transaction():
        previous = await conn.fetchval("SELECT current_setting('search_path')")
        await conn.execute("SELECT set_config('search_path', '', true)")
        parents = await _matching_parents(conn, patterns, feeder_key)
        await conn.execute("SELECT set_config('search_path', $1, true)", previous)
    return parents


async def _matching_parents(
    conn: asyncpg.Connection, patterns: Sequence[TablePattern], feeder_key: str
) -> dict[TableName, ParentTable]:
    parents: dict[TableName, ParentTable] = {}
    for schema, name, oid in await conn.fetch(_PARENTS):
        table = TableName(schema, name)
        if any(p.matches(table) for p in patterns):
            parent = await _read_parent(conn, table, oid)
            if parent.column(feeder_key) is None:
                raise SuperhubError(f"table {table} has no feeder key column {feeder_key!r}")
            parents[table] = parent
    return parents


def unmatched_patterns(patterns: Iterable[TablePattern], tables: Iterable[TableName]) -> list[TablePattern]:
    """The patterns that match none of `tables`."""
    tables = list(tables)
    return [p for p in patterns if not any(p.matches(t) for t in tables)]


async def _read_parent(conn: asyncpg.Connection, table: TableName, oid: int) -> ParentTable:
    columns = tuple(Column(*row) for row in await conn.fetch(_COLUMNS, oid))
    indexes = []
    for unique, definition, head, constraint_sql in await conn.fetch(_INDEXES, oid):
        marker = f"{head} "
        if marker not in definition:
            raise SuperhubError(f"cannot read the definition of an index on {table}: {definition}")
        indexes.append(ParentIndex(bool(unique), definition.split(marker, 1)[1], constraint_sql))
    constraints = await conn.fetch(_CONSTRAINTS, oid)
    checks = tuple((name, sql) for name, kind, sql in constraints if kind == "c")
    return ParentTable(table, columns, tuple(indexes), checks, frozenset(row[0] for row in constraints))
