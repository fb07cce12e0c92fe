"""The coordinator (docs/scale-out.md): one database where reports read every shard through PostgreSQL's own
scale-out path, declarative partitioning with postgres_fdw foreign partitions.

On the coordinator, per configured table, a parent partitioned BY LIST (feeder key) with the shards' columns, and
per shard one foreign partition `FOR VALUES IN (<keys of that shard's feeders>)` reading the shard's own parent.
fedload builds it (idempotent) at the start of `sync` and `daemon` when `[coordinator]` is configured:

- `CREATE EXTENSION IF NOT EXISTS postgres_fdw`; per shard a server `fedload_<shard>` with the host, port and
  dbname of the shard's dsn, `async_capable` (the shards are read at once) and `fetch_size`, plus `passfile` if
  configured; a user mapping FOR PUBLIC with `fdw_user` (or the dsn's user), never a password;
- the parents, with the columns read from the shards' catalogs (which must agree);
- the foreign partitions; a shard whose feeder list changed gets a new foreign partition, and every old one is
  detached and every new one attached in one transaction, so a reader sees each feeder exactly once;
- `ALTER DATABASE ... SET enable_partitionwise_aggregate = on`: aggregates grouped by the key run on the shards.

    report = await build_coordinator(config)
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

from fedload.config import Config, CoordinatorConfig
from fedload.errors import ConfigError, FedloadError, SuperhubError
from fedload.log import get_logger
from fedload.names import TableName
from fedload.superhub.schema import Column, ParentTable, ident, key_literal, qualified, read_parents
from fedload.superhub.session import setup_superhub, superhub_session

__all__ = [
    "FDW_SCHEMA",
    "CoordinatorReport",
    "bound_sql",
    "build_coordinator",
    "foreign_partition_name",
    "refresh_coordinator",
    "server_name",
    "server_options",
    "user_mapping_options",
]

log = get_logger()

FDW_SCHEMA = "fedload_shards"  # the coordinator's foreign partitions
_MAX_IDENTIFIER_BYTES = 63
_LOCK = "SELECT pg_advisory_xact_lock(1717920876, 1)"  # "fedl" class, object 1: one builder at a time
_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '10s'"  # DETACH waits for running reports: not forever
_MANAGED_SERVER_OPTIONS = ("host", "port", "dbname", "passfile", "async_capable", "fetch_size")
_EXISTING = """
SELECT c.relname, s.srvname, pg_get_expr(c.relpartbound, c.oid) AS bound
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_foreign_table f ON f.ftrelid = c.oid
JOIN pg_foreign_server s ON s.oid = f.ftserver
WHERE i.inhparent = $1::regclass AND n.nspname = $2
"""


@dataclass(slots=True)
class CoordinatorReport:
    """What a build changed: tables created, foreign partitions attached and detached (`schema.table@shard`)."""

    created: list[str] = field(default_factory=list)
    attached: list[str] = field(default_factory=list)
    detached: list[str] = field(default_factory=list)


def server_name(shard: str) -> str:
    """The coordinator's foreign server for `shard`."""
    return f"fedload_{shard}"


def foreign_partition_name(table: TableName, shard: str, *, new: bool = False) -> str:
    """The name of shard `shard`'s foreign partition of `table` in FDW_SCHEMA, `<schema>.<table>@<shard>` (`new`:
    with a `~`, while it replaces the old one); past PostgreSQL's 63 bytes the table part is cut and hashed."""
    head, tail = f"{table.schema}.{table.name}", f"@{shard}{'~' if new else ''}"
    if len((head + tail).encode()) <= _MAX_IDENTIFIER_BYTES:
        return head + tail
    digest = hashlib.sha256(head.encode()).hexdigest()[:8]
    keep = _MAX_IDENTIFIER_BYTES - len(tail.encode()) - len(digest) - 1
    return f"{head.encode()[:keep].decode(errors='ignore')}_{digest}{tail}"


def _dsn_parts(dsn: str) -> dict[str, str]:
    """host, port, dbname and user of an asyncpg/libpq URI (`postgresql://user@host:port/db?host=...`)."""
    url = urlsplit(dsn)
    if url.scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"a shard's dsn must be a postgresql:// URI for the coordinator, not {url.scheme}://...")
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    netloc = url.netloc.rpartition("@")[2]
    host, _, port = netloc.rpartition(":") if ":" in netloc and not netloc.endswith("]") else (netloc, "", "")
    parts = {
        "host": query.get("host") or unquote(host).removeprefix("[").removesuffix("]"),
        "port": query.get("port") or port,
        "dbname": query.get("dbname") or unquote(url.path.lstrip("/")),
        "user": query.get("user") or unquote(url.username or ""),
    }
    return {k: v for k, v in parts.items() if v}


def server_options(dsn: str, coordinator: CoordinatorConfig) -> dict[str, str]:
    """The foreign server's options for a shard: where it is (from its dsn, never its password), async scans,
    fetch size, and the passfile the coordinator's server reads a password from."""
    options = {k: v for k, v in _dsn_parts(dsn).items() if k in ("host", "port", "dbname")}
    options |= {"async_capable": "true", "fetch_size": str(coordinator.fetch_size)}
    if coordinator.fdw_passfile is not None:
        options["passfile"] = str(coordinator.fdw_passfile)
    return options


def user_mapping_options(dsn: str, coordinator: CoordinatorConfig) -> dict[str, str]:
    """The user mapping FOR PUBLIC: the role the coordinator logs in as on the shard."""
    user = coordinator.fdw_user or _dsn_parts(dsn).get("user")
    return {"user": user} if user else {}


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _options_change(current: Mapping[str, str], wanted: Mapping[str, str], managed: Sequence[str]) -> str:
    """`OPTIONS (ADD/SET/DROP ...)` turning `current` into `wanted` for the `managed` keys; "" if equal."""
    steps = [f"SET {k} {_literal(v)}" for k, v in wanted.items() if k in current and current[k] != v]
    steps += [f"ADD {k} {_literal(v)}" for k, v in wanted.items() if k not in current]
    steps += [f"DROP {k}" for k in current if k in managed and k not in wanted]
    return f"OPTIONS ({', '.join(steps)})" if steps else ""


def _options(options: Mapping[str, str]) -> str:
    return f"OPTIONS ({', '.join(f'{k} {_literal(v)}' for k, v in options.items())})"


def bound_sql(keys: Sequence[int | str], *, text: bool = False) -> str:
    """A LIST partition bound for `keys`, sorted, as pg_get_expr prints it: integers, or strings for a `text` key
    column (fedload creates one when some key is a string)."""
    if not text:
        return f"FOR VALUES IN ({', '.join(key_literal(k) for k in sorted(map(_integer, keys)))})"
    return f"FOR VALUES IN ({', '.join(key_literal(str(k)) for k in sorted(str(k) for k in keys))})"


def _integer(key: int | str) -> int:
    try:
        return int(key)
    except ValueError:
        raise ConfigError(f"feeder key {key!r} is not an integer, but the tables' key column is") from None


def _text_key(parent: ParentTable, feeder_key: str) -> bool:
    """Whether the parent's feeder key column holds strings rather than integers."""
    column = parent.column(feeder_key)
    return column is None or column.base_type_sql not in ("smallint", "integer", "bigint")


async def build_coordinator(config: Config) -> CoordinatorReport:
    """Create or bring up to date the coordinator's servers, parents and foreign partitions (see the module)."""
    coordinator = config.coordinator
    if coordinator is None:
        raise ConfigError("there is no [coordinator] section")
    parents = await _shard_parents(config)
    superhub = config.superhub.model_copy(update={"dsn": coordinator.dsn})
    report = CoordinatorReport()
    session = superhub_session(config.model_copy(update={"superhub": superhub}), "coordinator")
    async with session as conn, conn.transaction():
        await _build(conn, config, coordinator, parents.values(), report)
    if report.created or report.attached or report.detached:
        log.info("coordinator.built", created=report.created, attached=report.attached, detached=report.detached)
    return report


async def refresh_coordinator(config: Config) -> bool:
    """Build the coordinator if one is configured, as `sync` and `daemon` do before their runs: a failure is
    logged (`coordinator.build_failed`) and the loads go on, the shards do not depend on it. False if it failed."""
    if config.coordinator is None:
        return True
    try:
        await build_coordinator(config)
    except FedloadError as exc:
        log.error("coordinator.build_failed", error=str(exc), error_kind=exc.kind)
        return False
    return True


async def _build(
    conn: asyncpg.Connection,
    config: Config,
    coordinator: CoordinatorConfig,
    parents: Iterable[ParentTable],
    report: CoordinatorReport,
) -> None:
    """The build's steps, in the caller's transaction, one builder at a time."""
    await conn.execute(_LOCK)
    await conn.execute(_LOCK_TIMEOUT)
    await _extension(conn)
    for shard, settings in config.shards.items():
        await _server(conn, shard, settings.dsn, coordinator)
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(FDW_SCHEMA)}")
    parents = list(parents)
    for parent in parents:
        await _parent(conn, parent, config, report)
    await _partitions(conn, parents, config, report)
    database = await conn.fetchval("SELECT current_database()")
    await conn.execute(f"ALTER DATABASE {ident(database)} SET enable_partitionwise_aggregate = on")


async def _shard_parents(config: Config) -> dict[TableName, ParentTable]:
    """The configured parents as the shards have them, each shard set up first (as a sync would: its schemas, and
    its parents from the schema file), whichever daemon loads it; SuperhubError if the shards disagree on which
    parents there are or on their columns."""
    found: dict[TableName, tuple[str, ParentTable]] = {}
    on_shard: dict[str, set[TableName]] = {}
    for shard in config.shards:
        async with superhub_session(config.for_shard(shard), "coordinator") as conn:
            await setup_superhub(conn, config.for_shard(shard))
            parents = await read_parents(conn, config.superhub.tables, config.superhub.feeder_key)
            if strays := await _strays(conn, parents.values(), config, shard):
                log.warning("coordinator.stray_partitions", shard=shard, partitions=strays)
        on_shard[shard] = set(parents)
        for table, parent in parents.items():
            first = found.setdefault(table, (shard, parent))
            if _columns(first[1].columns) != _columns(parent.columns):
                raise SuperhubError(
                    f"table {table} has other columns on shard {shard} than on shard {first[0]}: "
                    f"{', '.join(_columns(parent.columns))} against {', '.join(_columns(first[1].columns))}"
                )
    for shard, tables in on_shard.items():
        if missing := sorted(map(str, set(found) - tables)):
            raise SuperhubError(f"shard {shard} lacks {', '.join(missing)}, which other shards have")
    return {table: parent for table, (_, parent) in found.items()}


_PARTITIONS = """
SELECT c.oid::regclass::text, pg_get_expr(c.relpartbound, c.oid)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass
"""


async def _strays(conn: asyncpg.Connection, parents: Iterable[ParentTable], config: Config, shard: str) -> list[str]:
    """The shard's partitions of keys not assigned to it (a feeder moved away and not yet removed there): the
    coordinator reads them through the shard's foreign partition, under a bound that does not hold them."""
    keys = [config.feeders[n].key for n in config.by_shard().get(shard, [])]
    strays = []
    for parent in parents:
        text = _text_key(parent, config.superhub.feeder_key)
        bounds = {bound_sql([key], text=text) for key in keys}
        strays += [name for name, bound in await conn.fetch(_PARTITIONS, parent.sql_name) if bound not in bounds]
    return strays


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
    current = await conn.fetchval(
        "SELECT umoptions FROM pg_user_mappings WHERE srvname = $1 AND usename = 'public'", server_name(shard)
    )
    if current is None:
        await conn.execute(f"CREATE USER MAPPING FOR PUBLIC SERVER {name} {_options(mapping) if mapping else ''}")
    elif change := _options_change(_parsed(current), mapping, ("user",)):
        await conn.execute(f"ALTER USER MAPPING FOR PUBLIC SERVER {name} {change}")


def _parsed(options: Sequence[str] | None) -> dict[str, str]:
    return dict(option.split("=", 1) for option in options or ())


async def _parent(conn: asyncpg.Connection, parent: ParentTable, config: Config, report: CoordinatorReport) -> None:
    """The coordinator's partitioned parent of `parent`, with its columns, if missing."""
    if await conn.fetchval("SELECT to_regclass($1)", parent.sql_name) is not None:
        return
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ident(parent.table.schema)}")
    key = ident(config.superhub.feeder_key)
    await conn.execute(f"CREATE TABLE {parent.sql_name} ({_column_list(parent)}) PARTITION BY LIST ({key})")
    report.created.append(str(parent.table))


@dataclass(frozen=True, slots=True)
class _Change:
    parent: ParentTable
    shard: str
    old: str | None  # the partition to detach and drop, if any
    bound: str | None  # the new bound to attach under the stable name, None when the shard is gone


async def _partitions(
    conn: asyncpg.Connection, parents: Iterable[ParentTable], config: Config, report: CoordinatorReport
) -> None:
    """Per parent and shard, a foreign partition with the shard's keys: new ones built first, then every old one
    detached and every new one attached in this one transaction, so no reader sees a feeder missing or twice."""
    changes: list[_Change] = []
    keys = {shard: [config.feeders[n].key for n in names] for shard, names in _by_shard(config).items()}
    for parent in parents:
        rows = await conn.fetch(_EXISTING, parent.sql_name, FDW_SCHEMA)
        existing = {server: (name, bound) for name, server, bound in rows}
        text = _text_key(parent, config.superhub.feeder_key)
        for shard, bound in ((shard, bound_sql(shard_keys, text=text)) for shard, shard_keys in keys.items()):
            old = existing.pop(server_name(shard), None)
            if old is None or old[1] != bound:
                await _create_foreign(conn, parent, shard)
                changes.append(_Change(parent, shard, None if old is None else old[0], bound))
        gone = existing.items()  # servers of shards no longer configured
        changes += [_Change(parent, server.removeprefix("fedload_"), name, None) for server, (name, _) in gone]
    if changes:
        await _locked(
            conn, sorted({c.parent.table: c.parent for c in changes}.values(), key=lambda p: str(p.table)), config
        )
    for change in changes:
        if change.old is not None:
            detached = qualified(FDW_SCHEMA, change.old)
            await conn.execute(f"ALTER TABLE {change.parent.sql_name} DETACH PARTITION {detached}")
            await conn.execute(f"DROP FOREIGN TABLE {detached}")
            report.detached.append(f"{change.parent.table}@{change.shard}")
    for change in changes:
        if change.bound is not None:
            new = qualified(FDW_SCHEMA, foreign_partition_name(change.parent.table, change.shard, new=True))
            await conn.execute(f"ALTER TABLE {change.parent.sql_name} ATTACH PARTITION {new} {change.bound}")
            stable = foreign_partition_name(change.parent.table, change.shard)
            await conn.execute(f"ALTER FOREIGN TABLE {new} RENAME TO {ident(stable)}")
            report.attached.append(f"{change.parent.table}@{change.shard}")


async def _locked(conn: asyncpg.Connection, parents: Sequence[ParentTable], config: Config) -> None:
    """ACCESS EXCLUSIVE on the parents whose partitions change (DETACH takes it), by short polite tries as a swap
    does (`swap_lock_timeout_s`, for up to `swap_max_wait_s`): a try never makes reports queue behind it for long.
    SuperhubError when the locks did not come."""
    superhub = config.superhub
    deadline = time.monotonic() + superhub.swap_max_wait_s
    for attempt in itertools.count(1):
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = '{max(1, int(superhub.swap_lock_timeout_s * 1000))}ms'")
                await conn.execute(f"LOCK TABLE {', '.join(p.sql_name for p in parents)} IN ACCESS EXCLUSIVE MODE")
                await conn.execute(_LOCK_TIMEOUT)
                return
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError):
            if time.monotonic() > deadline:
                raise SuperhubError(
                    f"the coordinator's reports held {', '.join(str(p.table) for p in parents)} for swap_max_wait_s = "
                    f"{superhub.swap_max_wait_s:g}: the feeder lists of the shards were not changed"
                ) from None
            await asyncio.sleep(random.uniform(0.05, min(0.05 * attempt, 1.0)))  # noqa: S311 - jitter only
    raise AssertionError("unreachable")  # pragma: no cover


def _by_shard(config: Config) -> dict[str, list[str]]:
    return {shard: names for shard, names in config.by_shard().items() if shard is not None}


async def _create_foreign(conn: asyncpg.Connection, parent: ParentTable, shard: str) -> None:
    """A standalone foreign table for the shard's parent, to be attached: the coordinator parent's columns."""
    new = qualified(FDW_SCHEMA, foreign_partition_name(parent.table, shard, new=True))
    await conn.execute(f"DROP FOREIGN TABLE IF EXISTS {new}")
    await conn.execute(
        f"CREATE FOREIGN TABLE {new} ({_column_list(parent)}) SERVER {ident(server_name(shard))} "
        f"{_options({'schema_name': parent.table.schema, 'table_name': parent.table.name})}"
    )
