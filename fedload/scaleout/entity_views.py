"""The coordinator's side of one entity, one feeder across shards (docs/entities.md, "Across shards"; the decisions
are `fedload.superhub.coordinated_entities`): in a coordinator build with `superhub.entity_key`, per parent with the
key column, the partitioned parent under `fedload_all`, the reader's view in its place and the displaced view; the
registry; the feeders settled when the views are new, or noted pending when the build changes which shard or
relation a feeder is read from (settled after the build commits).

Turning the rule on moves an existing parent (with its foreign partitions) under `fedload_all`; turning it off
drops the views and moves it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg

from fedload.config import Config
from fedload.log import get_logger
from fedload.superhub.coordinated_entities import (
    ALL_ROWS_SCHEMA,
    all_rows_parent,
    entity_parents,
    prepare_feeders,
    registry_sql,
    settle_feeder,
    views_sql,
    wait_for_older,
)
from fedload.superhub.entities import DISPLACED_SCHEMA, EntityRule
from fedload.superhub.job import coordinated_entities, coordinator_target, superhub_target
from fedload.superhub.schema import ParentTable, ident, qualified
from fedload.superhub.session import superhub_session

__all__ = ["entity_rule", "entity_views", "local_parent", "placed_parent", "switch_prepared"]

log = get_logger()
_KIND = "SELECT c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1)"


def entity_rule(config: Config) -> EntityRule | None:
    """The entity rule when the coordinator keeps it (shards, a coordinator, `entity_key`); None otherwise."""
    entities = coordinated_entities(config)
    return None if entities is None else entities.rule


def local_parent(parent: ParentTable, rule: EntityRule | None) -> str:
    """Where the coordinator's partitioned parent of `parent` lives (SQL name): under `fedload_all` when the rule
    applies to it, else in its own place."""
    return all_rows_parent(parent.table) if rule is not None and parent.column(rule.key_column) else parent.sql_name


async def placed_parent(conn: asyncpg.Connection, parent: ParentTable, rule: EntityRule | None) -> bool:
    """Whether the coordinator's partitioned parent of `parent` exists where `local_parent` says, after moving it
    there from the other place (the rule turned on or off since the last build)."""
    rows, own = all_rows_parent(parent.table), parent.sql_name
    wanted, other = (rows, own) if local_parent(parent, rule) == rows else (own, rows)
    if await conn.fetchval(_KIND, wanted) == "p":
        return True
    if await conn.fetchval(_KIND, other) != "p":
        return False
    await conn.execute(";\n".join(_moved(parent, to_rows=wanted == rows)))
    log.info("coordinator.parent_moved", table=str(parent.table), to=wanted)
    return True


def _moved(parent: ParentTable, *, to_rows: bool) -> list[str]:
    """The statements that move the partitioned parent under `fedload_all` (`to_rows`) or back, views dropped."""
    schema, name, rows_name = parent.table.schema, parent.table.name, f"{parent.table.schema}.{parent.table.name}"
    if to_rows:
        return [
            f"CREATE SCHEMA IF NOT EXISTS {ident(ALL_ROWS_SCHEMA)}",
            f"ALTER TABLE {parent.sql_name} RENAME TO {ident(rows_name)}",
            f"ALTER TABLE {qualified(schema, rows_name)} SET SCHEMA {ident(ALL_ROWS_SCHEMA)}",
        ]
    return [
        f"DROP VIEW IF EXISTS {qualified(DISPLACED_SCHEMA, rows_name)}",
        f"DROP VIEW IF EXISTS {parent.sql_name}",
        f"ALTER TABLE {all_rows_parent(parent.table)} SET SCHEMA {ident(schema)}",
        f"ALTER TABLE {qualified(schema, rows_name)} RENAME TO {ident(name)}",
    ]


async def entity_views(
    conn: asyncpg.Connection, rule: EntityRule, parents: Sequence[ParentTable], config: Config
) -> None:
    """In the build's transaction, under the entity lock: the registry, and the views of the parents with the key
    column where missing. New views: every feeder settled here (no reader has seen them yet)."""
    keyed = entity_parents(rule, parents)
    newest = next((p.column(rule.newest_column) for p in keyed if p.table == rule.newest_table), None)
    await conn.execute(";\n".join(registry_sql("text" if newest is None else newest.type_sql)))
    created = False
    for parent in keyed:
        if await conn.fetchval(_KIND, parent.sql_name) != "v":
            await conn.execute(";\n".join(views_sql(rule, parent)))
            created = True
    if not created:
        return
    registered = await conn.fetch("SELECT DISTINCT feeder, feeder_key FROM fedload.entity_copies")
    feeders = {row[0]: row[1] for row in registered} | {name: str(f.key) for name, f in config.feeders.items()}
    for name, key in sorted(feeders.items()):
        await settle_feeder(conn, rule, keyed, name, key)
    log.info("coordinator.entities_settled", feeders=len(feeders))


async def switch_prepared(
    build: asyncpg.Connection,
    config: Config,
    rule: EntityRule,
    parents: Sequence[ParentTable],
    switched: Mapping[str, str | None],
) -> None:
    """Before a build takes its locks to switch where feeders are read from (`switched`: the feeder's key as text,
    to its new shard, None for none): with the coordinator's views already read, P for each, from the keys it
    will read there (that shard's parents, pruned to its key), committed by a session of its own, then W1 for
    every transaction but the build's. The build's commit is the change; the settling after it (W2, R) is the
    pending feeders' (`heal_pending`). Nothing when the views are new (the build settles every feeder)."""
    keyed = entity_parents(rule, parents)
    if not switched or not keyed or await build.fetchval(_KIND, keyed[0].sql_name) != "v":
        return
    registered = await build.fetch("SELECT DISTINCT feeder_key, feeder FROM fedload.entity_copies")
    names = {row[0]: row[1] for row in registered} | {str(f.key): name for name, f in config.feeders.items()}
    changes = [
        (names[key], key, [] if shard is None else await _keys_on(config, rule, keyed, shard, key))
        for key, shard in sorted(switched.items())
        if key in names
    ]
    async with superhub_session(coordinator_target(config), "coordinator switch") as conn:
        await prepare_feeders(conn, rule, changes)
        why, wait_s = "the build's switch was prepared", config.superhub.swap_max_wait_s
        await wait_for_older(conn, wait_s, why, but=build.get_server_pid())
    log.info("coordinator.entities_prepared", feeders=[feeder for feeder, _, _ in changes])


async def _keys_on(config: Config, rule: EntityRule, parents: Sequence[ParentTable], shard: str, key: str) -> list[str]:
    """The entities of the feeder with `key` (text) on `shard`: its keys in the shard's parents."""
    column, feeder_key = ident(rule.key_column), ident(rule.feeder_key)
    keys = " UNION ".join(
        f"SELECT {column}::text FROM {p.sql_name} WHERE {feeder_key}::text = $1 AND {column} IS NOT NULL"  # noqa: S608
        for p in parents
    )
    query = f"SELECT coalesce(array_agg(k), '{{}}') FROM ({keys}) AS u (k)"  # noqa: S608 - our names
    async with superhub_session(superhub_target(config, shard), "coordinator switch") as conn:
        return list(await conn.fetchval(query, key))
