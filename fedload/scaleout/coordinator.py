"""The coordinator (docs/scale-out.md): one database where reports read every shard through PostgreSQL's own
scale-out path, declarative partitioning with postgres_fdw foreign partitions.

On the coordinator, per configured table, a parent partitioned BY LIST (feeder key) with the shards' columns, and
per shard one foreign partition `FOR VALUES IN (<keys of that shard's feeders>)` reading the shard's own parent.
fedload builds it (idempotent) beside the runs of `sync` and `daemon` when `[coordinator]` is configured
(`fedload.service.coordinator_keeper`: retries, and the loads that wait for a build):

- `CREATE EXTENSION IF NOT EXISTS postgres_fdw`; per shard a server `fedload_<shard>` with the connection settings
  of the shard's dsn (`fdw_dsn`), `async_capable` (the shards are read at once) and `fetch_size`, plus `passfile`
  if configured; a user mapping FOR PUBLIC with `fdw_user` (or the dsn's user), never a password;
- the parents, with the columns read from the shards' catalogs (which must agree);
- the foreign partitions, one per shard, bound to the keys of the feeders read from it (`placement`): the shard's
  parent itself, or a filter view on the shard while it holds feeders not read from it (`shard_side`); a shard
  whose bound or relation changed gets a new foreign partition, and every old one is detached and every new one
  attached in one transaction, so a reader sees each feeder exactly once;
- with `superhub.entity_key` (`entity_views`): the parents with the key column under `fedload_all`, views hiding
  the copies not at home in their place, the registry; the build holds the entity lock, and a switch of the
  shard a feeder is read from is a change of its data (docs/entities.md, "Across shards");
- `ALTER DATABASE ... SET enable_partitionwise_aggregate = on` (if not set yet, and the role owns the database):
  aggregates grouped by the key run on the shards.

    report = await build_coordinator(config)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import asyncpg

from fedload.config import Config, CoordinatorConfig
from fedload.errors import ConfigError, FedloadError, SuperhubError
from fedload.fdw_dsn import SERVER_OPTIONS, dsn_problems, fdw_options
from fedload.log import get_logger
from fedload.names import TableName
from fedload.scaleout.entity_views import entity_rule, entity_views, local_parent, placed_parent, switch_prepared
from fedload.scaleout.placement import Placement, place
from fedload.scaleout.shard_side import (
    EXPORT_SCHEMA,
    ShardState,
    bound_keys,
    bound_sql,
    create_filter_views,
    drop_filter_views,
    fitted_name,
    normal_key,
    read_shard,
    text_key,
)
from fedload.superhub.coordinated_entities import ALL_ROWS_SCHEMA, CoordinatedEntities, entity_lock, heal_pending
from fedload.superhub.entities import EntityRule
from fedload.superhub.job import coordinated_entities, coordinator_target, superhub_targets
from fedload.superhub.schema import Column, ParentTable, ident, qualified, text_literal
from fedload.superhub.session import SuperhubTarget, superhub_session
from fedload.superhub.swap import LocksNotTaken, SwapPolicy, local_lock_timeout, tried_politely

__all__ = [
    "FDW_SCHEMA",
    "CoordinatorReport",
    "bound_keys",
    "bound_sql",
    "build_coordinator",
    "foreign_partition_name",
    "moving_feeders",
    "server_name",
    "server_options",
    "user_mapping_options",
]

log = get_logger()

FDW_SCHEMA = "fedload_shards"  # the coordinator's foreign partitions
_BUILDERS_LOCK = "1717920876, 1"  # "fedl" class, object 1: one builder at a time
_LOCK = f"SELECT pg_advisory_xact_lock({_BUILDERS_LOCK})"
_TRY_LOCK = f"SELECT pg_try_advisory_xact_lock({_BUILDERS_LOCK})"
_BUILDERS_WAIT_S = 30.0  # the longest wait for another build to end; then this one fails, to be retried
_MOVE_LOCK = "1717920876, 2"  # object 2: held by a feeder move, which defers the other builds
_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"  # DETACH waits for running reports: not forever
_MANAGED_SERVER_OPTIONS = (*sorted(SERVER_OPTIONS), "passfile", "async_capable", "fetch_size")
_EXISTING = """
SELECT c.relname, s.srvname, pg_get_expr(c.relpartbound, c.oid) AS bound, f.ftoptions
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_foreign_table f ON f.ftrelid = c.oid
JOIN pg_foreign_server s ON s.oid = f.ftserver
WHERE i.inhparent = $1::regclass AND n.nspname = $2
"""
_READ_VIEWS = """
SELECT s.srvname, f.ftoptions
FROM pg_foreign_table f
JOIN pg_foreign_server s ON s.oid = f.ftserver
JOIN pg_class c ON c.oid = f.ftrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1
"""


@dataclass(slots=True)
class CoordinatorReport:
    """What a build changed: tables created, foreign partitions attached and detached (`schema.table@shard`); and
    what it found: the shards read through a filter view, the feeders read from another shard than their own (which
    has not loaded them yet) with the shard they are read from."""

    created: list[str] = field(default_factory=list)
    attached: list[str] = field(default_factory=list)
    detached: list[str] = field(default_factory=list)
    filtered: list[str] = field(default_factory=list)
    pending: dict[str, str] = field(default_factory=dict)
    deferred: bool = False  # a feeder move held the coordinator: nothing was built
    superseded: bool = False  # its configuration was no longer the newest before it committed: nothing was built


def server_name(shard: str) -> str:
    """The coordinator's foreign server for `shard`."""
    return f"fedload_{shard}"


def foreign_partition_name(table: TableName, shard: str, *, new: bool = False) -> str:
    """The name of shard `shard`'s foreign partition of `table` in FDW_SCHEMA, `<schema>.<table>@<shard>` (`new`:
    with a `~`, while it replaces the old one); past PostgreSQL's 63 bytes the table part is cut and hashed."""
    return fitted_name(f"{table.schema}.{table.name}", f"@{shard}{'~' if new else ''}")


def server_options(dsn: str, coordinator: CoordinatorConfig) -> dict[str, str]:
    """The foreign server's options for a shard: every connection setting of its dsn postgres_fdw takes on a
    server (`fdw_dsn`: where it is, TLS, timeouts ...; never its password), async scans, fetch size, and the
    passfile the coordinator's server reads a password from. ConfigError for a dsn that cannot be carried."""
    if problems := dsn_problems(dsn):
        raise ConfigError(f"a shard's dsn: {'; '.join(problems)}")
    options = fdw_options(dsn)[0] | {"async_capable": "true", "fetch_size": str(coordinator.fetch_size)}
    if coordinator.fdw_passfile is not None:
        options["passfile"] = str(coordinator.fdw_passfile)
    return options


def user_mapping_options(dsn: str, coordinator: CoordinatorConfig) -> dict[str, str]:
    """The user mapping FOR PUBLIC: the role the coordinator logs in as on the shard."""
    user = coordinator.fdw_user or fdw_options(dsn)[1]
    return {"user": user} if user else {}


def _options_change(current: Mapping[str, str], wanted: Mapping[str, str], managed: Sequence[str]) -> str:
    """`OPTIONS (ADD/SET/DROP ...)` turning `current` into `wanted` for the `managed` keys; "" if equal."""
    steps = [f"SET {k} {text_literal(v)}" for k, v in wanted.items() if k in current and current[k] != v]
    steps += [f"ADD {k} {text_literal(v)}" for k, v in wanted.items() if k not in current]
    steps += [f"DROP {k}" for k in current if k in managed and k not in wanted]
    return f"OPTIONS ({', '.join(steps)})" if steps else ""


def _options(options: Mapping[str, str]) -> str:
    return f"OPTIONS ({', '.join(f'{k} {text_literal(v)}' for k, v in options.items())})"


@contextlib.asynccontextmanager
async def moving_feeders(config: Config, *, wait_s: float = 30.0) -> AsyncIterator[None]:
    """For `fedload feeder move`: hold the coordinator's move lock for the block. Other builds are deferred
    meanwhile (they would build from a configuration that does not know of the move), and one move runs at a time.
    SuperhubError if another move or a build held it for `wait_s`."""
    async with superhub_session(coordinator_target(config), "coordinator") as conn:
        deadline = time.monotonic() + wait_s
        while not await conn.fetchval(f"SELECT pg_try_advisory_lock({_MOVE_LOCK})"):
            if time.monotonic() > deadline:
                raise SuperhubError(f"another feeder move or a coordinator build held the coordinator for {wait_s:g} s")
            await asyncio.sleep(0.2)
        yield  # the session's end releases the lock


async def build_coordinator(
    config: Config, *, moving: bool = False, current: Callable[[], bool] | None = None
) -> CoordinatorReport:
    """Create or bring up to date the coordinator's servers, parents and foreign partitions (see the module).
    While a feeder move holds the coordinator (`moving_feeders`) the build is deferred (`report.deferred`), but
    for the move's own builds (`moving`). `current`: asked just before the build commits; False (a newer
    configuration was loaded meanwhile) rolls it back (`report.superseded`), so an old layout never commits last."""
    coordinator = config.coordinator
    if coordinator is None:
        raise ConfigError("there is no [coordinator] section")
    report = CoordinatorReport()
    entities = coordinated_entities(config)
    async with (
        superhub_session(coordinator_target(config), "coordinator") as conn,
        _entity_lock(conn, entities),
    ):
        transaction = conn.transaction()
        await transaction.start()
        try:
            await _builders_lock(conn)
            if not moving and not await conn.fetchval(f"SELECT pg_try_advisory_xact_lock_shared({_MOVE_LOCK})"):
                log.info("coordinator.build_deferred", reason="a feeder move holds the coordinator")
                report.deferred = True
            else:
                unread, parents = await _build(conn, config, coordinator, report, moving=moving)
                report.superseded = current is not None and not current()
        except BaseException:
            await asyncio.shield(_rolled_back(transaction))
            raise
        if report.deferred or report.superseded:
            await transaction.rollback()
            if report.superseded:
                log.info("coordinator.build_superseded", reason="a newer configuration was loaded meanwhile")
            return CoordinatorReport(deferred=report.deferred, superseded=report.superseded)
        await transaction.commit()
        if entities is not None:
            await heal_pending(conn, entities.rule, parents, entities.max_wait_s)
        await _drop_unread_views(conn, superhub_targets(config), unread)
    if report.created or report.attached or report.detached:
        log.info("coordinator.built", created=report.created, attached=report.attached, detached=report.detached)
    return report


@contextlib.asynccontextmanager
async def _entity_lock(conn: asyncpg.Connection, entities: CoordinatedEntities | None) -> AsyncIterator[None]:
    """With the entity rule kept here: the entity lock for the build (which may change what the coordinator reads
    of the feeders, and settles them), waited for as the builders' lock is; nothing without the rule."""
    if entities is None:
        yield
        return
    async with entity_lock(conn, _BUILDERS_WAIT_S):
        yield


async def _rolled_back(transaction: asyncpg.transaction.Transaction) -> None:
    """Roll back after a failure; a connection gone meanwhile has rolled back already."""
    with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        await transaction.rollback()


async def _build(
    conn: asyncpg.Connection,
    config: Config,
    coordinator: CoordinatorConfig,
    report: CoordinatorReport,
    *,
    moving: bool = False,
) -> tuple[set[str], list[ParentTable]]:
    """The build's steps, in the caller's transaction under the builders' lock; the shards with filter views,
    some perhaps no longer read (to be dropped once this transaction has committed), and the parents.
    `_builders_lock` has set the transaction's lock_timeout."""
    parents, shards = await _read_shards(config)
    held = {shard: state.held for shard, state in shards.items()}
    placement = place(config, held, {shard: state.unknown for shard, state in shards.items()})
    _note_placement(config, placement, shards, report, moving=moving)
    views = {
        shard: await create_filter_views(config, shard, parents.values(), reads.feeders)
        for shard, reads in placement.reads.items()
        if reads.filtered and reads.feeders
    }
    await _extension(conn)
    for shard, settings in config.shards.items():
        await _server(conn, shard, settings.dsn, coordinator)
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(FDW_SCHEMA)}")
    rule = entity_rule(config)
    for parent in parents.values():
        await _parent(conn, parent, config.superhub.feeder_key, report, rule)
    unread = await _partitions(conn, list(parents.values()), config, _Wanted(placement, views), report)
    await _drop_removed_servers(conn, config.shards)
    await _partitionwise(conn)
    if rule is not None:
        await entity_views(conn, rule, list(parents.values()), config)
    return unread | {shard for shard, state in shards.items() if state.views}, list(parents.values())


async def _read_shards(config: Config) -> tuple[dict[TableName, ParentTable], dict[str, ShardState]]:
    """The configured parents as the shards have them, and what each shard holds (`read_shard`); SuperhubError if
    the shards disagree on which parents there are or on their columns."""
    shards = {shard: await read_shard(config, shard) for shard in config.shards}
    found: dict[TableName, tuple[str, ParentTable]] = {}
    for shard, state in shards.items():
        for table, parent in state.parents.items():
            first = found.setdefault(table, (shard, parent))
            if _columns(first[1].columns) != _columns(parent.columns):
                raise SuperhubError(
                    f"table {table} has other columns on shard {shard} than on shard {first[0]}: "
                    f"{', '.join(_columns(parent.columns))} against {', '.join(_columns(first[1].columns))}"
                )
    for shard, state in shards.items():
        if missing := sorted(map(str, set(found) - set(state.parents))):
            raise SuperhubError(f"shard {shard} lacks {', '.join(missing)}, which other shards have")
    return {table: parent for table, (_, parent) in found.items()}, shards


def _note_placement(
    config: Config, placement: Placement, shards: Mapping[str, ShardState], report: CoordinatorReport, *, moving: bool
) -> None:
    """Log the feeders read from another shard than their own and the shards holding feeders not read from them:
    a warning (partitions to remove by hand), but in a feeder move's builds, whose old shard drops them next."""
    report.pending = placement.pending(config.feeders)
    report.filtered = sorted(shard for shard, reads in placement.reads.items() if reads.filtered)
    for name, served_from in report.pending.items():
        log.info("coordinator.feeder_pending", feeder=name, shard=config.feeders[name].shard, served_from=served_from)
    for shard, state in shards.items():
        others = sorted(state.held - set(placement.reads[shard].feeders))
        if moving and others and not state.unknown:
            log.info("coordinator.feeders_leaving", shard=shard, feeders=others)
        elif others or state.unknown:
            found = {"feeders": others} if others else {}
            found |= {"partitions": list(state.unknown)} if state.unknown else {}
            log.warning("coordinator.stray_partitions", shard=shard, **found)


_PARTITIONWISE = """
SELECT d.datname, coalesce('enable_partitionwise_aggregate=on' = ANY(s.setconfig), false),
       pg_has_role(d.datdba, 'USAGE') OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
FROM pg_database d LEFT JOIN pg_db_role_setting s ON s.setdatabase = d.oid AND s.setrole = 0
WHERE d.datname = current_database()
"""


async def _partitionwise(conn: asyncpg.Connection) -> None:
    """`enable_partitionwise_aggregate = on` for the coordinator's database, if it is not set yet: it needs the
    database's owner, so a coordinator role without ownership gets a warning instead of a failed build."""
    database, already, owner = await conn.fetchrow(_PARTITIONWISE) or ("", True, False)
    if already:
        return
    if not owner:
        log.warning(
            "coordinator.partitionwise_not_set",
            database=database,
            hint=f"as its owner: ALTER DATABASE {ident(database)} SET enable_partitionwise_aggregate = on",
        )
        return
    await conn.execute(f"ALTER DATABASE {ident(database)} SET enable_partitionwise_aggregate = on")


def _column_list(parent: ParentTable) -> str:
    """The parent's columns for the coordinator: names, types and collations (the data stays on the shards)."""
    return ", ".join(
        " ".join([ident(c.name), c.type_sql, *([f"COLLATE {c.collation_sql}"] if c.collation_sql else [])])
        for c in parent.columns
    )


def _columns(columns: Sequence[Column]) -> list[str]:
    return [f"{c.name} {c.type_sql}" for c in columns]


async def _extension(conn: asyncpg.Connection) -> None:
    available = await conn.fetchval("SELECT count(*) FROM pg_available_extensions WHERE name = 'postgres_fdw'")
    if not available:
        raise SuperhubError("the coordinator's PostgreSQL lacks postgres_fdw (Debian: it is in postgresql-NN)")
    await conn.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")


async def _server(conn: asyncpg.Connection, shard: str, dsn: str, coordinator: CoordinatorConfig) -> None:
    """The shard's foreign server and user mapping, created or altered to the configuration."""
    name, wanted = ident(server_name(shard)), server_options(dsn, coordinator)
    current = await conn.fetchval("SELECT srvoptions FROM pg_foreign_server WHERE srvname = $1", server_name(shard))
    if current is None:
        await conn.execute(f"CREATE SERVER {name} FOREIGN DATA WRAPPER postgres_fdw {_options(wanted)}")
    elif change := _options_change(_parsed(current), wanted, _MANAGED_SERVER_OPTIONS):
        await conn.execute(f"ALTER SERVER {name} {change}")
    mapping = user_mapping_options(dsn, coordinator)
    found = await conn.fetchrow(  # a row whose umoptions is NULL: a mapping without options, not a missing one
        "SELECT umoptions FROM pg_user_mappings WHERE srvname = $1 AND usename = 'public'", server_name(shard)
    )
    if found is None:
        await conn.execute(f"CREATE USER MAPPING FOR PUBLIC SERVER {name} {_options(mapping) if mapping else ''}")
    elif change := _options_change(_parsed(found["umoptions"]), mapping, ("user",)):
        await conn.execute(f"ALTER USER MAPPING FOR PUBLIC SERVER {name} {change}")


def _parsed(options: Sequence[str] | None) -> dict[str, str]:
    return dict(option.split("=", 1) for option in options or ())


async def _parent(
    conn: asyncpg.Connection, parent: ParentTable, feeder_key: str, report: CoordinatorReport, rule: EntityRule | None
) -> None:
    """The coordinator's partitioned parent of `parent` (by `feeder_key`), with its columns, if missing; with the
    entity rule, under `fedload_all` where `parent` has the key column (`fedload.scaleout.entity_views` moves it
    there or back when the rule is turned on or off)."""
    if await placed_parent(conn, parent, rule):
        return
    local = local_parent(parent, rule)
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(parent.table.schema)}")
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(ALL_ROWS_SCHEMA)}")
    key = ident(feeder_key)
    await conn.execute(f"CREATE TABLE {local} ({_column_list(parent)}) PARTITION BY LIST ({key})")
    report.created.append(str(parent.table))


@dataclass(frozen=True, slots=True)
class _Wanted:
    """What the foreign partitions should read: the placement, and the filter views created for it (per shard)."""

    placement: Placement
    views: Mapping[str, Mapping[TableName, str]]

    def relation(self, parent: ParentTable, shard: str) -> tuple[str, str]:
        """The shard's relation a foreign partition of `parent` reads: the parent itself, or its filter view."""
        if self.placement.reads[shard].filtered:
            return EXPORT_SCHEMA, self.views[shard][parent.table]
        return parent.table.schema, parent.table.name


@dataclass(frozen=True, slots=True)
class _Change:
    parent: ParentTable
    local: str  # the coordinator's partitioned parent (SQL name)
    shard: str
    old: str | None  # the partition to detach and drop, if any
    bound: str | None  # the new bound to attach under the stable name, None when nothing is read from the shard


async def _partitions(
    conn: asyncpg.Connection, parents: Sequence[ParentTable], config: Config, wanted: _Wanted, report: CoordinatorReport
) -> set[str]:
    """Per parent and shard, a foreign partition with the keys read from the shard, reading the wanted relation:
    new ones built first, then every old one detached and every new one attached in this one transaction, so no
    reader sees a feeder missing or twice. The shards whose filter views a detached partition read."""
    changes: list[_Change] = []
    unread: set[str] = set()
    read_before: dict[str, str] = {}  # feeder key (normal) -> the shard it is read from before the build
    text = False
    for parent in parents:
        local = local_parent(parent, entity_rule(config))
        existing = {
            server: (name, bound, _relation(options))
            for name, server, bound, options in await conn.fetch(_EXISTING, local, FDW_SCHEMA)
        }
        text = text_key(parent, config.superhub.feeder_key)
        for server, (_, bound, _) in existing.items():
            read_before |= dict.fromkeys(bound_keys(bound, text=text) or (), server.removeprefix("fedload_"))
        for shard, reads in wanted.placement.reads.items():
            old = existing.pop(server_name(shard), None)
            keys = [config.feeders[n].key for n in reads.feeders]
            bound = bound_sql(keys, text=text) if reads.feeders else None
            relation = wanted.relation(parent, shard) if reads.feeders else None
            wanted_keys = frozenset(normal_key(k, text=text) for k in keys)
            if old is not None and bound_keys(old[1], text=text) == wanted_keys and old[2] == relation:
                continue
            if old is None and bound is None:
                continue
            if relation is not None:
                await _create_foreign(conn, parent, shard, relation)
            changes.append(_Change(parent, local, shard, None if old is None else old[0], bound))
            if old is not None and old[2][0] == EXPORT_SCHEMA:
                unread.add(shard)
        gone = existing.items()  # servers of shards no longer configured
        changes += [
            _Change(parent, local, server.removeprefix("fedload_"), name, None) for server, (name, _, _) in gone
        ]
    if changes:
        if (rule := entity_rule(config)) is not None:
            switched = _switched(config, wanted.placement, read_before, text=text)
            await switch_prepared(conn, config, rule, parents, switched)
        changed = sorted({c.parent.table: c for c in changes}.values(), key=lambda c: str(c.parent.table))
        await _locked(conn, [(c.parent, c.local) for c in changed], SwapPolicy.from_config(config.superhub))
    await _apply(conn, changes, report)
    return unread


def _switched(config: Config, placement: Placement, before: Mapping[str, str], *, text: bool) -> dict[str, str | None]:
    """The feeders (keys as text) read from another shard after the build than before (None: from none);
    `before`: the shard each key (`normal_key`) was read from."""
    key = {name: normal_key(f.key, text=text) for name, f in config.feeders.items()}
    after = {key[name]: shard for shard, reads in placement.reads.items() for name in reads.feeders}
    written = {key[name]: str(f.key) for name, f in config.feeders.items()}
    return {written.get(k, k): after.get(k) for k in set(before) | set(after) if before.get(k) != after.get(k)}


def _relation(options: Sequence[str] | None) -> tuple[str, str]:
    parsed = _parsed(options)
    return parsed.get("schema_name", ""), parsed.get("table_name", "")


async def _apply(conn: asyncpg.Connection, changes: Sequence[_Change], report: CoordinatorReport) -> None:
    """Detach and drop every old partition, then attach every new one under its stable name."""
    for change in changes:
        if change.old is not None:
            detached = qualified(FDW_SCHEMA, change.old)
            await conn.execute(f"ALTER TABLE {change.local} DETACH PARTITION {detached}")
            await conn.execute(f"DROP FOREIGN TABLE {detached}")
            report.detached.append(f"{change.parent.table}@{change.shard}")
    for change in changes:
        if change.bound is not None:
            new = qualified(FDW_SCHEMA, foreign_partition_name(change.parent.table, change.shard, new=True))
            await conn.execute(f"ALTER TABLE {change.local} ATTACH PARTITION {new} {change.bound}")
            stable = foreign_partition_name(change.parent.table, change.shard)
            await conn.execute(f"ALTER FOREIGN TABLE {new} RENAME TO {ident(stable)}")
            report.attached.append(f"{change.parent.table}@{change.shard}")


_REMOVED_SERVERS = """
SELECT s.srvname, EXISTS (SELECT FROM pg_foreign_table t WHERE t.ftserver = s.oid)
FROM pg_foreign_server s JOIN pg_foreign_data_wrapper w ON w.oid = s.srvfdw
WHERE w.fdwname = 'postgres_fdw' AND s.srvname LIKE 'fedload\\_%' AND s.srvname <> ALL($1::text[])
"""


async def _drop_removed_servers(conn: asyncpg.Connection, shards: Iterable[str]) -> None:
    """The foreign servers and user mappings of shards no longer configured (not in `shards`), once no foreign
    table uses them (their partitions were detached above). Their filter views stay on their databases: fedload no
    longer knows how to reach them."""
    for server, used in await conn.fetch(_REMOVED_SERVERS, [server_name(shard) for shard in shards]):
        if used:
            log.warning("coordinator.server_kept", server=server, reason="foreign tables still use it")
            continue
        await conn.execute(f"DROP USER MAPPING IF EXISTS FOR PUBLIC SERVER {ident(server)}")
        await conn.execute(f"DROP SERVER {ident(server)}")
        log.info("coordinator.server_dropped", server=server)


async def _builders_lock(conn: asyncpg.Connection) -> None:
    """The builders' lock, for the caller's transaction, waited for `_BUILDERS_WAIT_S` at most (a build under way
    ends well before unless it waits for reports itself); SuperhubError then."""
    await conn.execute(f"SET LOCAL lock_timeout = '{int(_BUILDERS_WAIT_S * 1000)}ms'")
    try:
        await conn.execute(_LOCK)
    except asyncpg.LockNotAvailableError:
        raise SuperhubError(f"another coordinator build held the builders' lock for {_BUILDERS_WAIT_S:g} s") from None
    await conn.execute(_LOCK_TIMEOUT)


async def _drop_unread_views(
    conn: asyncpg.Connection, targets: Mapping[str | None, SuperhubTarget], shards: Iterable[str]
) -> None:
    """After a build has committed: drop the filter views of `shards` (those still configured, in `targets`) that
    no foreign partition reads any more. Under the builders' lock (tried, not waited for), so never a view another
    build is about to attach. Whatever fails here only leaves views behind for a later build: a warning, never the
    build's failure."""
    if not (shards := sorted(set(shards) & set(targets))):
        return
    try:
        async with conn.transaction():
            if not await conn.fetchval(_TRY_LOCK):
                log.info("coordinator.views_not_dropped", shards=shards, reason="another build holds the lock")
                return
            read: dict[str, set[str]] = {}
            for server, options in await conn.fetch(_READ_VIEWS, FDW_SCHEMA):
                schema, table = _relation(options)
                if schema == EXPORT_SCHEMA:
                    read.setdefault(server, set()).add(table)
            for shard in shards:
                dropped, busy = await drop_filter_views(targets[shard], read.get(server_name(shard), set()))
                if dropped:
                    log.info("coordinator.views_dropped", shard=shard, views=dropped)
                if busy:
                    log.warning("coordinator.views_not_dropped", shard=shard, views=busy, reason="in use")
    except (FedloadError, asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as exc:
        log.warning("coordinator.views_not_dropped", shards=shards, error=str(exc))


async def _locked(conn: asyncpg.Connection, parents: Sequence[tuple[ParentTable, str]], swap: SwapPolicy) -> None:
    """ACCESS EXCLUSIVE on the parents whose partitions change (DETACH takes it), by short polite tries as a swap
    does (`swap_lock_timeout_s`, for up to `swap_max_wait_s`): a try never makes reports queue behind it for long.
    SuperhubError when the locks did not come."""

    async def attempt(_: int) -> None:
        async with conn.transaction():
            await local_lock_timeout(conn, swap.lock_timeout_s)
            await conn.execute(f"LOCK TABLE {', '.join(local for _, local in parents)} IN ACCESS EXCLUSIVE MODE")
            await conn.execute(_LOCK_TIMEOUT)

    try:
        await tried_politely(attempt, deadline=time.monotonic() + swap.max_wait_s)
    except LocksNotTaken:
        raise SuperhubError(
            f"the coordinator's reports held {', '.join(str(p.table) for p, _ in parents)} for swap_max_wait_s = "
            f"{swap.max_wait_s:g}: the feeder lists of the shards were not changed"
        ) from None


async def _create_foreign(conn: asyncpg.Connection, parent: ParentTable, shard: str, relation: tuple[str, str]) -> None:
    """A standalone foreign table reading the shard's `relation`, to be attached: the coordinator parent's columns."""
    new = qualified(FDW_SCHEMA, foreign_partition_name(parent.table, shard, new=True))
    await conn.execute(f"DROP FOREIGN TABLE IF EXISTS {new}")
    await conn.execute(
        f"CREATE FOREIGN TABLE {new} ({_column_list(parent)}) SERVER {ident(server_name(shard))} "
        f"{_options({'schema_name': relation[0], 'table_name': relation[1]})}"
    )
