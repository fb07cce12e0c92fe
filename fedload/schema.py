"""The superhub's schema: partitioned parent tables, read from the catalog or created from a schema file.

Every identifier fedload writes into SQL goes through `ident()` (sqlglot, always quoted). Column types, defaults
and index definitions come from the superhub's own catalog or the operator's schema file, never from a feeder.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg
from sqlglot import exp

from fedload.errors import SuperhubError

__all__ = [
    "Column",
    "ParentTable",
    "ident",
    "key_literal",
    "qualified",
    "read_parents",
]

STAGE_SCHEMA = "fedload_stage"
PARTS_SCHEMA = "fedload_parts"


def ident(name: str) -> str:
    """`name` as an always-quoted PostgreSQL identifier."""
    return exp.to_identifier(name, quoted=True).sql("postgres")


def qualified(schema: str, name: str) -> str:
    """`schema.name`, both quoted."""
    return f"{ident(schema)}.{ident(name)}"


def key_literal(key: int | str) -> str:
    """A feeder key as an SQL literal."""
    return str(int(key)) if isinstance(key, int) else exp.Literal.string(key).sql("postgres")


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a parent table, as the catalog describes it."""

    name: str
    type_sql: str
    not_null: bool
    default_sql: str | None
    generated_sql: str | None
    base_type_sql: str  # the type without modifiers (varchar, not varchar(10)): casts to it never truncate

    def definition(self, default_sql: str | None = None) -> str:
        """The column's definition for a CREATE TABLE, optionally with another default."""
        parts = [ident(self.name), self.type_sql]
        if self.generated_sql is not None:
            parts.append(f"GENERATED ALWAYS AS ({self.generated_sql}) STORED")
        elif (default := default_sql or self.default_sql) is not None:
            parts.append(f"DEFAULT {default}")
        if self.not_null:
            parts.append("NOT NULL")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class ParentTable:
    """A partitioned parent table on the superhub."""

    schema: str
    name: str
    columns: tuple[Column, ...]
    index_bodies: tuple[tuple[bool, str], ...]  # (unique, "USING btree (a, b) WHERE ...") per partitioned index

    @property
    def qualified_name(self) -> str:
        """`schema.name` unquoted, as dumps name tables after unquoting."""
        return f"{self.schema}.{self.name}"

    @property
    def sql_name(self) -> str:
        """The quoted name for SQL."""
        return qualified(self.schema, self.name)

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
       format_type(a.atttypid, NULL)
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_INDEXES = """
SELECT i.indisunique, pg_get_indexdef(i.indexrelid),
       'INDEX ' || quote_ident(ic.relname) || ' ON ONLY ' || quote_ident(n.nspname) || '.' || quote_ident(c.relname)
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.indrelid = $1
ORDER BY ic.relname
"""


async def read_parents(conn: asyncpg.Connection, patterns: Iterable[str], feeder_key: str) -> dict[str, ParentTable]:
    """The partitioned tables matching the configured patterns, keyed by `schema.name`; each has the key column."""
    await conn.execute("SET search_path = ''")  # catalog functions then qualify every name they print
    parents: dict[str, ParentTable] = {}
    patterns = list(patterns)
    for schema, name, oid in await conn.fetch(_PARENTS):
        if any(fnmatch.fnmatchcase(f"{schema}.{name}", p) for p in patterns):
            parent = await _read_parent(conn, schema, name, oid)
            if parent.column(feeder_key) is None:
                raise SuperhubError(f"table {parent.qualified_name} has no feeder key column {feeder_key!r}")
            parents[parent.qualified_name] = parent
    return parents


async def _read_parent(conn: asyncpg.Connection, schema: str, name: str, oid: int) -> ParentTable:
    columns = tuple(Column(*row) for row in await conn.fetch(_COLUMNS, oid))
    bodies = []
    for unique, definition, head in await conn.fetch(_INDEXES, oid):
        marker = f"{head} "
        if marker not in definition:
            raise SuperhubError(f"cannot read the definition of an index on {schema}.{name}: {definition}")
        bodies.append((bool(unique), definition.split(marker, 1)[1]))
    return ParentTable(schema, name, columns, tuple(bodies))
