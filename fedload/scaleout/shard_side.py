"""The coordinator's business on each shard: what the shard holds (its parents, and which feeders it has partitions
of), and the filter views the coordinator reads a shard through while it holds feeders not read from it
(`placement`, docs/scale-out.md).

A filter view is `fedload_export."<schema>.<table>@<digest>"`: the shard's parent, its columns, only the rows of
the given keys. Its name is derived from the keys and the columns, so a view never changes once a foreign partition
reads it: another list of keys is another view, switched to on the coordinator in one transaction, and the old one
is dropped once nothing reads it.

    state = await read_shard(config, "s1")
    names = await create_filter_views(config, "s1", parents, ["hub1"])
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass

import asyncpg

from fedload.config import Config
from fedload.errors import ConfigError
from fedload.names import TableName
from fedload.superhub.job import parents_spec, superhub_target
from fedload.superhub.schema import ParentTable, ident, key_literal, qualified, read_parents
from fedload.superhub.session import SuperhubTarget, setup_superhub, superhub_session

__all__ = [
    "EXPORT_SCHEMA",
    "ShardState",
    "bound_keys",
    "bound_sql",
    "create_filter_views",
    "drop_filter_views",
    "filter_view_name",
    "fitted_name",
    "key_list",
    "normal_key",
    "read_shard",
    "text_key",
]

EXPORT_SCHEMA = "fedload_export"  # on a shard: the filter views the coordinator reads it through
_MAX_IDENTIFIER_BYTES = 63
# `pg_get_expr(..., 0)`: the bound printed from the catalog alone; given the partition's oid, pg_get_expr opens and
# locks each partition, waiting behind a swap (and out of the swaps' lock order), and gives NULL for one dropped
# since the query's snapshot.
_PARTITIONS = """
SELECT c.oid::regclass::text, pg_get_expr(c.relpartbound, 0)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass
"""
_VIEWS = "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1"


@dataclass(frozen=True, slots=True)
class ShardState:
    """A shard as the coordinator's build finds it: its parents, the configured feeders it holds partitions of,
    and its partitions of keys no configured feeder has."""

    parents: dict[TableName, ParentTable]
    held: frozenset[str]
    unknown: tuple[str, ...]
    views: frozenset[str] = frozenset()  # its filter views, read by the coordinator or left to drop


def fitted_name(head: str, tail: str) -> str:
    """`head + tail` as an identifier; past PostgreSQL's 63 bytes the head is cut and hashed."""
    if len((head + tail).encode()) <= _MAX_IDENTIFIER_BYTES:
        return head + tail
    digest = hashlib.sha256(head.encode()).hexdigest()[:8]
    keep = _MAX_IDENTIFIER_BYTES - len(tail.encode()) - len(digest) - 1
    return f"{head.encode()[:keep].decode(errors='ignore')}_{digest}{tail}"


def key_list(keys: Iterable[int | str], *, text: bool = False) -> str:
    """Feeder keys as sorted SQL literals, `1, 2` (or `'1', '2'` for a `text` key column)."""
    if not text:
        return ", ".join(key_literal(k) for k in sorted(map(_integer, keys)))
    return ", ".join(key_literal(k) for k in sorted(str(k) for k in keys))


def bound_sql(keys: Iterable[int | str], *, text: bool = False) -> str:
    """A LIST partition bound for `keys`, as pg_get_expr prints it (see `key_list`)."""
    return f"FOR VALUES IN ({key_list(keys, text=text)})"


def normal_key(key: int | str, *, text: bool = False) -> str:
    """A feeder key as a partition bound holds it, for comparing: `-2`, `2` (integer column), `'02'` stays `02` for
    a text one."""
    return str(key) if text else str(_integer(key))


def bound_keys(bound: str, *, text: bool = False) -> frozenset[str] | None:
    """The keys of a LIST partition bound as `pg_get_expr` prints it, each as `normal_key` gives it: it quotes
    some values and not others (`IN (2)` for integer, `IN ('2')` for bigint and smallint, `IN ('-2')` for a negative
    integer, `IN ('a''b')` for text), so the text is read by its grammar, never compared as a string. None for a
    DEFAULT partition or anything else that is not a list of keys."""
    head, tail = "FOR VALUES IN (", ")"
    if not (bound.startswith(head) and bound.endswith(tail)):
        return None
    values, rest = [], bound[len(head) : -len(tail)]
    while rest:
        value, rest = _bound_value(rest.lstrip(" ,"))
        if value is None:
            return None
        values.append(value)
        rest = rest.lstrip(" ")
    try:
        return frozenset(normal_key(v, text=text) for v in values if v != "NULL")
    except ConfigError:  # not an integer in an integer bound: not a bound this reader understands
        return None


def _bound_value(text: str) -> tuple[str | None, str]:
    """The first value of a bound's list (unquoted) and what follows it (a `::type` cast is skipped)."""
    if text.startswith("'"):
        end, chars = 1, []
        while end < len(text):
            if text[end] == "'" and text[end + 1 : end + 2] == "'":
                chars.append("'")
                end += 2
            elif text[end] == "'":
                break
            else:
                chars.append(text[end])
                end += 1
        else:
            return None, ""
        value, rest = "".join(chars), text[end + 1 :]
    else:
        cut = min((i for i in (text.find(","), text.find("::")) if i >= 0), default=len(text))
        value, rest = text[:cut].strip(), text[cut:]
        if not value:
            return None, ""
    if rest.startswith("::"):  # a cast PostgreSQL may print after a literal: up to the next top-level comma
        rest = rest[rest.find(",") :] if "," in rest else ""
    return value, rest


def _integer(key: int | str) -> int:
    try:
        return int(key)
    except ValueError:
        raise ConfigError(f"feeder key {key!r} is not an integer, but the tables' key column is") from None


def text_key(parent: ParentTable, feeder_key: str) -> bool:
    """Whether the parent's feeder key column holds strings rather than integers."""
    column = parent.column(feeder_key)
    return column is None or column.base_type_sql not in ("smallint", "integer", "bigint")


async def read_shard(config: Config, shard: str) -> ShardState:
    """The shard, set up first as a sync would (its schemas, and its parents from the schema file)."""
    async with superhub_session(superhub_target(config, shard), "coordinator") as conn:
        await setup_superhub(conn, parents_spec(config))
        parents = await read_parents(conn, config.superhub.tables, config.superhub.feeder_key)
        held: set[str] = set()
        unknown: list[str] = []
        for parent in parents.values():
            text = text_key(parent, config.superhub.feeder_key)
            owners = {frozenset([normal_key(f.key, text=text)]): name for name, f in config.feeders.items()}
            for partition, bound in await conn.fetch(_PARTITIONS, parent.sql_name):
                if (owner := owners.get(bound_keys(bound or "", text=text) or frozenset())) is not None:
                    held.add(owner)
                else:
                    unknown.append(partition)
        views = frozenset(name for (name,) in await conn.fetch(_VIEWS, EXPORT_SCHEMA))
    return ShardState(parents, frozenset(held), tuple(unknown), views)


def filter_view_name(parent: ParentTable, keys: str) -> str:
    """The view of `parent` keeping the rows of `keys` (a `key_list`)."""
    columns = ",".join(f"{c.name} {c.type_sql}" for c in parent.columns)
    digest = hashlib.sha256(f"{parent.table}|{keys}|{columns}".encode()).hexdigest()[:12]
    return fitted_name(f"{parent.table.schema}.{parent.table.name}", f"@{digest}")


async def create_filter_views(
    config: Config, shard: str, parents: Iterable[ParentTable], feeders: Sequence[str]
) -> dict[TableName, str]:
    """On the shard, per parent, the filter view of the feeders' keys (created if missing; readable by the
    coordinator's `fdw_user`); the view names."""
    feeder_key, reader = config.superhub.feeder_key, config.coordinator and config.coordinator.fdw_user
    names = {}
    async with superhub_session(superhub_target(config, shard), "coordinator") as conn, conn.transaction():
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(EXPORT_SCHEMA)}")
        if reader:
            await conn.execute(f"GRANT USAGE ON SCHEMA {ident(EXPORT_SCHEMA)} TO {ident(reader)}")
        for parent in sorted(parents, key=lambda p: str(p.table)):  # the parents locked in the swaps' order
            keys = key_list((config.feeders[name].key for name in feeders), text=text_key(parent, feeder_key))
            names[parent.table] = name = filter_view_name(parent, keys)
            view = qualified(EXPORT_SCHEMA, name)
            if await conn.fetchval("SELECT to_regclass($1)", view) is None:
                columns = ", ".join(ident(c.name) for c in parent.columns)
                await conn.execute(
                    f"CREATE VIEW {view} AS SELECT {columns} FROM {parent.sql_name} "  # noqa: S608 - identifiers
                    f"WHERE {ident(feeder_key)} IN ({keys})"
                )
                if reader:
                    await conn.execute(f"GRANT SELECT ON {view} TO {ident(reader)}")
    return names


async def drop_filter_views(shard: SuperhubTarget, keep: Set[str]) -> tuple[list[str], list[str]]:
    """Drop the shard's filter views but those in `keep` (which foreign partitions read); the ones dropped, and
    those left because a session still used them past a short lock timeout (a later build drops them)."""
    dropped, busy = [], []
    async with superhub_session(shard, "coordinator") as conn:
        for (name,) in await conn.fetch(_VIEWS, EXPORT_SCHEMA):
            if name in keep:
                continue
            try:
                async with conn.transaction():
                    await conn.execute("SET LOCAL lock_timeout = '2s'")
                    await conn.execute(f"DROP VIEW IF EXISTS {qualified(EXPORT_SCHEMA, name)}")
            except asyncpg.LockNotAvailableError:
                busy.append(name)
            else:
                dropped.append(name)
    return dropped, busy
