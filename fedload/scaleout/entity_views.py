"""The coordinator's side of one entity, one feeder across shards (docs/entities.md, "Across shards"; the decisions
are `fedload.superhub.coordinated_entities`): in a coordinator build with `superhub.entity_key`, per parent with the
key column, the partitioned parent under `fedload_all`, the reader's view in its place and the displaced view; the
registry; the feeders settled when the views are new, or noted pending when the build changes which shard or
relation a feeder is read from (settled after the build commits).

Turning the rule on moves an existing parent (with its foreign partitions) under `fedload_all`; turning it off
drops the views and moves it back.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from fedload.config import Config
from fedload.log import get_logger
from fedload.superhub.coordinated_entities import (
    ALL_ROWS_SCHEMA,
    all_rows_parent,
    entity_parents,
    mark_pending,
    registry_sql,
    settle_feeder,
    views_sql,
)
from fedload.superhub.entities import DISPLACED_SCHEMA, EntityRule
from fedload.superhub.job import coordinated_entities
from fedload.superhub.schema import ParentTable, ident, qualified

__all__ = ["entity_rule", "entity_views", "local_parent", "placed_parent"]

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
    conn: asyncpg.Connection, rule: EntityRule, parents: Sequence[ParentTable], config: Config, *, changed: bool
) -> None:
    """In the build's transaction, under the entity lock: the registry, and the views of the parents with the key
    column where missing. New views: every feeder settled here (no reader has seen them yet). `changed` (the
    build re-partitioned the coordinator): every feeder noted pending, settled once the build has committed."""
    keyed = entity_parents(rule, parents)
    newest = next((p.column(rule.newest_column) for p in keyed if p.table == rule.newest_table), None)
    await conn.execute(";\n".join(registry_sql("text" if newest is None else newest.type_sql)))
    created = False
    for parent in keyed:
        if await conn.fetchval(_KIND, parent.sql_name) != "v":
            await conn.execute(";\n".join(views_sql(rule, parent)))
            created = True
    if not (created or changed):
        return
    feeders = {name: str(feeder.key) for name, feeder in config.feeders.items()}
    feeders |= {
        row[0]: row[1] for row in await conn.fetch("SELECT DISTINCT feeder, feeder_key FROM fedload.entity_copies")
    }
    if created:
        for name, key in sorted(feeders.items()):
            await settle_feeder(conn, rule, keyed, name, key)
        log.info("coordinator.entities_settled", feeders=len(feeders))
    else:
        await mark_pending(conn, feeders)
