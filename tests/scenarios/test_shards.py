"""Shards behind postgres_fdw (docs/scale-out.md): the configuration, a run per feeder on its own shard, the
coordinator's foreign partitions, and what a coordinator reader sees during swaps."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from rich.console import Console
from structlog.testing import capture_logs

import fedload.commands.status as status_module
import fedload.service.coordinator_keeper as keeper_module
from fedload.commands.admin import remove_feeder
from fedload.commands.status import read_status
from fedload.config import Config, ConfigLocation, CoordinatorConfig, parse_config
from fedload.errors import ConfigError, SuperhubError
from fedload.localpg import LocalCluster
from fedload.names import TableName
from fedload.results import Outcome
from fedload.scaleout.coordinator import (
    CoordinatorReport,
    bound_keys,
    bound_sql,
    build_coordinator,
    foreign_partition_name,
    server_options,
    user_mapping_options,
)
from fedload.service.daemon_metrics import DaemonMetricsService
from fedload.service.sync import sync_feeders
from fedload.superhub.bookkeeping import FeederStatus
from fedload.superhub.bookkeeping.connection import ShardHistories
from fedload.superhub.job import feeder_job, feeder_jobs, parents_spec, superhub_target, superhub_targets
from fedload.superhub.session import SuperhubTarget
from tests.support.federation import HOST_COLS, DaemonProcess, Federation, fedload, sync
from tests.support.shards import (
    COUNTS,
    coord_int,
    coord_sql,
    require_postgres_fdw,
    shard_bool,
    shard_int,
    shard_sql,
    sharded,
    sharded_toml,
    synced,
    with_coordinator,
)


def _document(**extra: Any) -> dict[str, Any]:
    feeders = {
        "a": {"key": 1, "transport": "local", "shard": "s1"},
        "b": {"key": 2, "transport": "local", "shard": "s2"},
    }
    document: dict[str, Any] = {
        "superhub": {"tables": ["public.*"]},
        "shards": {"s1": {"dsn": "postgresql:///s1"}, "s2": {"dsn": "postgresql:///s2"}},
        "feeders": feeders,
    }
    document.update(extra)
    return document


def _problems(document: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(document, source="f.toml")
    return caught.value.problems


def test_each_feeder_runs_against_its_shard() -> None:
    """A feeder's job has its shard's dsn as its superhub's, named by the shard; everything else is shared. There
    is no one superhub to ask for."""
    config = parse_config(_document())
    jobs = feeder_jobs(config)
    assert (jobs["a"].superhub.dsn, jobs["a"].superhub.shard) == ("postgresql:///s1", "s1")
    assert (jobs["b"].superhub.dsn, jobs["b"].superhub.shard) == ("postgresql:///s2", "s2")
    assert jobs["a"].parents == jobs["b"].parents == parents_spec(config)
    assert jobs["b"].parents.tables == tuple(config.superhub.tables)
    assert config.by_shard() == {"s1": ["a"], "s2": ["b"]}
    with pytest.raises(KeyError):
        superhub_target(config)


def test_without_shards_nothing_changes() -> None:
    """No [shards]: one superhub, every feeder in one group and on that superhub."""
    config = parse_config(
        {
            "superhub": {"dsn": "postgresql:///x", "tables": ["public.*"], "statement_timeout_s": 60},
            "feeders": {"a": {"key": 1, "transport": "local"}},
        }
    )
    assert superhub_targets(config) == {None: SuperhubTarget("postgresql:///x", 15.0, 60.0)}
    assert feeder_job(config, "a").superhub == superhub_target(config)
    assert config.by_shard() == {None: ["a"]}
    assert _problems({"superhub": {"tables": ["public.*"]}}) == ["f.toml: superhub.dsn: Field required"]


def test_shard_problems_one_line_each() -> None:
    """A feeder without a shard, an unknown shard, an unused shard, two shards on one dsn: a line each."""
    document = _document()
    document["feeders"]["c"] = {"key": 3, "transport": "local"}
    document["feeders"]["d"] = {"key": 4, "transport": "local", "shard": "s9"}
    document["shards"]["s3"] = {"dsn": "postgresql:///s1"}
    document["superhub"]["dsn"] = "postgresql:///old"
    assert _problems(document) == [
        "f.toml: superhub.dsn: with [shards], each shard's dsn says where its feeders load: remove it",
        "f.toml: feeders.c.shard: missing: with [shards], name one of s1, s2, s3",
        "f.toml: feeders.d.shard: 's9' is not a shard; shards: s1, s2, s3",
        "f.toml: shards.s3: no feeder names this shard",
        "f.toml: shards.s3.dsn: the same as shard s1's dsn: each shard is a database of its own",
    ]


def test_coordinator_needs_shards_and_a_dsn_of_its_own() -> None:
    """A coordinator without shards, or on a shard's database, is refused."""
    alone = {"superhub": {"dsn": "postgresql:///x", "tables": ["public.*"]}, "coordinator": {"dsn": "postgresql:///c"}}
    assert _problems(alone) == ["f.toml: coordinator: a coordinator needs [shards.NAME] sections to read from"]
    assert _problems(_document(coordinator={"dsn": "postgresql:///s2"})) == [
        "f.toml: coordinator.dsn: the same as shard s2's dsn: the coordinator needs its own"
    ]


async def test_sync_loads_each_feeder_into_its_shard(federation: Federation) -> None:
    """Each feeder's rows, run history and staging live on its shard only; the other shard never sees them."""
    config = sharded(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    runs = await sync(config)
    assert [run.outcome for run in runs] == [Outcome.SUCCESS] * 3, [run.error for run in runs]
    count = COUNTS.format(table="hosts")
    assert shard_sql(federation, "s1", count) == "1:300,2:200"
    assert shard_sql(federation, "s2", count) == "3:100"
    history = "SELECT string_agg(feeder || ':' || outcome, ',' ORDER BY feeder) FROM fedload.runs"
    assert shard_sql(federation, "s1", history) == "hub1:success,hub2:success"
    assert shard_sql(federation, "s2", history) == "hub3:success"
    for shard in ("s1", "s2"):
        assert shard_int(federation, shard, "SELECT count(*) FROM pg_tables WHERE schemaname = 'fedload_stage'") == 0
    assert federation.superhub_bool("SELECT to_regclass('fedload.runs') IS NULL")  # the old superhub: unused
    statuses = await read_status(config)
    assert [(s.feeder, s.shard, s.configured, s.rows) for s in statuses] == [
        ("hub1", "s1", True, 3300),
        ("hub2", "s1", True, 2200),
        ("hub3", "s2", True, 1100),
    ]


def test_daemon_per_shard(federation: Federation) -> None:
    """`daemon --shard s2` runs only s2's feeders, on s2; a plain daemon runs every feeder on its own shard."""
    path = sharded_toml(federation, sharded(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]}))
    one = DaemonProcess(path, federation.tmp / "s2.log", None, "--shard", "s2")
    try:
        one.wait_for(
            "hub3 synced on s2",
            lambda: synced(federation, "s2") == 1,
        )
        assert shard_bool(federation, "s1", "SELECT to_regclass('fedload.runs') IS NULL")  # s1 untouched
        assert one.stop() == 0
    finally:
        one.stop()
        one.close_log()
    every = DaemonProcess(path, federation.tmp / "all.log")
    try:
        every.wait_for(
            "hub1 and hub2 synced on s1",
            lambda: synced(federation, "s1") == 2,
        )
        assert shard_int(federation, "s1", "SELECT count(*) FROM fedload.schedule") == 2
        assert shard_sql(federation, "s2", COUNTS.format(table="hosts")) == "3:100"
        assert every.stop() == 0
        status = fedload("status", "--json", "--config", str(path))
        shown = {s["feeder"]: (s["shard"], s["next_run"] is not None) for s in json.loads(status.stdout)}
        assert (status.returncode, shown) == (0, {"hub1": ("s1", True), "hub2": ("s1", True), "hub3": ("s2", True)})
    finally:
        every.stop()
        every.close_log()


def test_daemon_refuses_an_unknown_shard(federation: Federation) -> None:
    """`daemon --shard NAME` for a shard the configuration lacks: exit 2, one line naming the shards."""
    path = sharded_toml(federation, sharded(federation, {"s1": ["hub1", "hub2", "hub3"]}))
    result = fedload("daemon", "--config", str(path), "--shard", "s9")
    assert (result.returncode, result.stderr) == (2, "fedload: unknown shard s9; shards: s1\n")


async def test_coordinator_reads_every_shard(federation: Federation) -> None:
    """The coordinator's parents hold every feeder's rows exactly once, read from the shards at once (async
    append), aggregates grouped by the key run on the shards; a second build changes nothing."""
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    with capture_logs() as logs:
        assert all(run.succeeded for run in await sync(config))  # which builds the coordinator first
    built = [e for e in logs if e["event"] == "coordinator.built"]
    assert [sorted(built[0]["created"]), sorted(built[0]["attached"])] == [
        ["public.contexts", "public.hosts"],
        sorted(f"public.{t}@{s}" for t in ("contexts", "hosts") for s in ("s1", "s2")),
    ]
    assert coord_sql(federation, COUNTS.format(table="hosts")) == "1:300,2:200,3:100"
    assert coord_sql(federation, COUNTS.format(table="contexts")) == "1:3000,2:2000,3:1000"
    for i, db in enumerate(federation.feeders.values(), start=1):
        where = f"WHERE hub_id = {i}"
        assert federation.digest(f"{federation.superhub}_coord", "hosts", HOST_COLS, where) == federation.digest(
            db, "hosts", HOST_COLS
        )
    plan = coord_sql(federation, "EXPLAIN (VERBOSE) SELECT hub_id, count(*) FROM hosts GROUP BY hub_id")
    assert plan.count("Async Foreign Scan") == 2, plan
    assert "Aggregate on" in plan, plan  # partitionwise: the shards count
    assert (await build_coordinator(config)) == CoordinatorReport()
    options = coord_sql(
        federation, "SELECT array_to_string(srvoptions, ',') FROM pg_foreign_server WHERE srvname = 'fedload_s2'"
    )
    cluster = federation.cluster
    assert (
        options
        == f"host={cluster.dir},port={cluster.port},dbname={federation.superhub}_s2,async_capable=true,fetch_size=10000"
    )


async def test_a_changed_feeder_list_repartitions_atomically(federation: Federation) -> None:
    """A feeder added to a shard: the shard's foreign partitions are replaced in one transaction while readers
    of the coordinator keep seeing every feeder exactly once."""
    layout = {"s1": ["hub1"], "s2": ["hub2", "hub3"]}
    config = with_coordinator(federation, layout)
    assert all(run.succeeded for run in await sync(config))
    document = config.model_dump(mode="json", exclude_none=True)
    document["feeders"]["hub4"] = {**document["feeders"]["hub3"], "key": 4}  # never synced: no rows
    more = parse_config(document)
    expected = "1:300,2:200,3:100"

    async def read(stop: asyncio.Event) -> list[str]:
        conn = await asyncpg.connect(config.coordinator.dsn if config.coordinator else "")
        seen = []
        try:
            while not stop.is_set():
                seen.append(await conn.fetchval(COUNTS.format(table="hosts")))
                seen.append(str(await conn.fetchval("SELECT count(*) FROM hosts WHERE hub_id = 2")))
        finally:
            await conn.close()
        return seen

    stop = asyncio.Event()
    reader = asyncio.create_task(read(stop))
    changes = []
    for round_ in range(6):
        await asyncio.sleep(0.05)
        report = await build_coordinator(more if round_ % 2 == 0 else config)
        changes.append(",".join(sorted(report.detached)) + "|" + ",".join(sorted(report.attached)))
    stop.set()
    seen = await reader
    odd = [value for value in seen if value not in (expected, "200")]
    both = "public.contexts@s2,public.hosts@s2"
    assert changes == [f"{both}|{both}"] * 6  # each build replaced s2's partitions
    assert (odd, len(seen) > 10) == ([], True)  # and the readers never saw a feeder missing or twice
    assert (
        coord_sql(federation, "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'public.hosts@s2'")
        == "FOR VALUES IN (2, 3)"
    )


GROW_CONTEXTS = "INSERT INTO contexts SELECT 'x', 'new', NULL, g FROM generate_series(1, 10) AS g"
PER_FEEDER = """
SELECT string_agg(hub_id || ':' || h || '/' || c, ',' ORDER BY hub_id)
FROM (SELECT hub_id, count(*) AS h FROM hosts GROUP BY 1) AS a
FULL JOIN (SELECT hub_id, count(*) AS c FROM contexts GROUP BY 1) AS b USING (hub_id)
"""


@pytest.mark.parametrize("method", ["partition", "mvcc"])
async def test_coordinator_readers_see_old_or_new_rows_during_swaps(federation: Federation, method: str) -> None:
    """While feeders on both shards are swapped again and again, each coordinator query sees every feeder once,
    with its old or its new rows in every table together (one remote REPEATABLE READ transaction per shard)."""
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    document = config.model_dump(mode="json", exclude_none=True)
    document["superhub"] |= {"swap_method": method, "worker_processes": 0}
    config = parse_config(document)
    assert all(run.succeeded for run in await sync(config))
    rounds, sizes = 3, {1: 300, 2: 200, 3: 100}

    async def read(stop: asyncio.Event) -> list[str]:
        assert config.coordinator is not None
        conn = await asyncpg.connect(config.coordinator.dsn)
        seen = []
        try:
            while not stop.is_set():
                seen.append(await conn.fetchval(PER_FEEDER))
        finally:
            await conn.close()
        return seen

    stop = asyncio.Event()
    reader = asyncio.create_task(read(stop))
    for k in range(1, rounds + 1):
        for db in federation.feeders.values():
            grow = f"INSERT INTO hosts (hostkey) VALUES ('new{k}'); {GROW_CONTEXTS}"
            await asyncio.to_thread(federation.cluster.psql, grow, dbname=db)
        runs = await sync_feeders(config, list(config.feeders))
        assert all(run.succeeded for run in runs), [run.error for run in runs]
    stop.set()
    seen = await reader
    valid = [{f"{i}:{n + k}/{10 * (n + k)}" for k in range(rounds + 1)} for i, n in sizes.items()]
    odd = [s for s in seen if len(parts := s.split(",")) != 3 or any(p not in v for p, v in zip(parts, valid))]  # noqa: B905
    assert (odd, len(seen) > 20, len(set(seen)) > rounds) == ([], True, True), (odd[:5], len(seen), set(seen))
    assert seen[-1] == ",".join(f"{i}:{n + rounds}/{10 * (n + rounds)}" for i, n in sizes.items())


@pytest.mark.pg_major(18)
async def test_a_shard_on_another_cluster_and_major(federation: Federation, major_cluster: LocalCluster) -> None:
    """Shard s2 on a PostgreSQL 18 cluster, s1 and the coordinator on the feeders' cluster: its feeder loads
    there, and the coordinator reads both shards, the far one through its own socket."""
    require_postgres_fdw(federation.cluster)
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    major_cluster.psql("CREATE DATABASE far")
    document = config.model_dump(mode="json", exclude_none=True)
    document["shards"]["s2"]["dsn"] = major_cluster.dsn("far")
    config = parse_config(document)
    runs = await sync(config)
    assert all(run.succeeded for run in runs), [run.error for run in runs]
    assert major_cluster.psql(COUNTS.format(table="hosts"), dbname="far").strip() == "3:100"
    assert coord_sql(federation, COUNTS.format(table="contexts")) == "1:3000,2:2000,3:1000"
    plan = coord_sql(federation, "EXPLAIN (VERBOSE) SELECT hub_id, count(*) FROM contexts GROUP BY hub_id")
    assert plan.count("Async Foreign Scan") == 2, plan


async def test_a_feeder_given_another_shard_by_hand_is_never_counted_twice(federation: Federation) -> None:
    """hub2's shard changed from s1 to s2 in the configuration: the sync reads it from s1 while s2 loads it (s2
    through a filter), then from s2 (s1 through a filter, warned of as a stray); `status` lists hub2 once, from s2,
    naming s1 as holding history too; `feeder remove hub2 --shard s1` removes it there, and the next build reads s1
    directly again."""
    before = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    assert all(run.succeeded for run in await sync(before))
    document = before.model_dump(mode="json", exclude_none=True)
    document["feeders"]["hub2"]["shard"] = "s2"
    after = parse_config(document)
    with capture_logs() as logs:
        assert all(run.succeeded for run in await sync(after))
    pending = [(e["feeder"], e["shard"], e["served_from"]) for e in logs if e["event"] == "coordinator.feeder_pending"]
    assert pending == [("hub2", "s2", "s1")]  # the first build, before the load on s2
    strays = [(e["shard"], e["feeders"]) for e in logs if e["event"] == "coordinator.stray_partitions"]
    assert strays == [("s1", ["hub2"])]  # the second, after it
    assert coord_sql(federation, COUNTS.format(table="hosts")) == "1:300,2:200,3:100"
    assert "fedload_export" in coord_sql(federation, "SELECT ftoptions FROM pg_foreign_table")  # s1 is filtered
    shown = [(s.feeder, s.shard, s.also_on) for s in await read_status(after)]  # history on both: listed once
    assert shown == [("hub1", "s1", ()), ("hub2", "s2", ("s1",)), ("hub3", "s2", ())]
    assert await asyncio.to_thread(remove_feeder, after, "hub2", yes=True, shard="s1") == 0
    assert [(s.feeder, s.shard, s.also_on) for s in await read_status(after)][1] == ("hub2", "s2", ())
    assert coord_sql(federation, COUNTS.format(table="hosts")) == "1:300,2:200,3:100"
    assert (await build_coordinator(after)).filtered == []
    assert coord_int(federation, "SELECT count(*) FROM pg_foreign_table WHERE ftoptions::text LIKE '%export%'") == 0
    assert shard_int(federation, "s1", "SELECT count(*) FROM pg_views WHERE schemaname = 'fedload_export'") == 0
    assert shard_int(federation, "s1", "SELECT count(*) FROM fedload.runs WHERE feeder = 'hub2'") == 0
    assert shard_int(federation, "s2", "SELECT count(*) FROM fedload.runs WHERE feeder = 'hub2'") == 1


async def test_repartitioning_yields_to_reports(federation: Federation) -> None:
    """A report holding a coordinator parent: the re-partition tries politely for swap_max_wait_s, fails saying
    so and changes nothing; once the report ends it goes through."""
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    assert all(run.succeeded for run in await sync(config))
    document = config.model_dump(mode="json", exclude_none=True)
    document["superhub"]["swap_max_wait_s"] = 1.0
    document["feeders"]["hub4"] = {**document["feeders"]["hub3"], "key": 4}
    more = parse_config(document)

    assert config.coordinator is not None
    report = await asyncpg.connect(config.coordinator.dsn)
    try:
        async with report.transaction():
            await report.fetchval("SELECT count(*) FROM hosts")  # holds ACCESS SHARE until it ends
            with pytest.raises(SuperhubError) as refused:
                await build_coordinator(more)
        async with report.transaction():  # a report reading s2's foreign partition itself, not the parent
            await report.fetchval('SELECT count(*) FROM fedload_shards."public.hosts@s2"')
            started = time.monotonic()
            with pytest.raises(SuperhubError):  # the parent's lock covers its partitions: no DETACH waits
                await build_coordinator(more)
            waited = time.monotonic() - started
        built = await build_coordinator(more)
    finally:
        await report.close()
    assert waited < 5.0, waited  # swap_max_wait_s = 1, never DETACH's 10 s lock_timeout
    held = "the coordinator's reports held public.contexts, public.hosts for swap_max_wait_s = 1"
    assert str(refused.value).startswith(held), refused.value
    assert sorted(built.attached) == ["public.contexts@s2", "public.hosts@s2"]


def test_server_options_from_a_dsn_never_carry_its_password() -> None:
    """A shard's server: every connection setting of its dsn postgres_fdw takes (TLS, timeouts, keepalives ...),
    async and fetch size, the passfile; the password in the dsn goes nowhere, the user mapping names fdw_user or
    the dsn's user."""
    coordinator = CoordinatorConfig(dsn="postgresql:///c", fdw_passfile=Path("/etc/fedload/pgpass"))
    tls = "sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem&sslcrl=/etc/ssl/crl.pem&channel_binding=require"
    more = "connect_timeout=5&keepalives_idle=30&target_session_attrs=read-write&gssencmode=disable"
    dsn = f"postgresql://loader:secret@db1.example.com:5433/hub?{tls}&{more}&passfile=/home/me/.pgpass"
    assert server_options(dsn, coordinator) == {
        "host": "db1.example.com",
        "port": "5433",
        "dbname": "hub",
        "sslmode": "verify-full",
        "sslrootcert": "/etc/ssl/ca.pem",
        "sslcrl": "/etc/ssl/crl.pem",
        "channel_binding": "require",
        "connect_timeout": "5",
        "keepalives_idle": "30",
        "target_session_attrs": "read-write",
        "gssencmode": "disable",
        "async_capable": "true",
        "fetch_size": "10000",
        "passfile": "/etc/fedload/pgpass",
    }
    assert user_mapping_options(dsn, coordinator) == {"user": "loader"}
    assert user_mapping_options(dsn, coordinator.model_copy(update={"fdw_user": "reports"})) == {"user": "reports"}
    socket = "postgresql://postgres@/hub_1?host=/run/postgresql&port=5432"
    assert server_options(socket, CoordinatorConfig(dsn="postgresql:///c"))["host"] == "/run/postgresql"
    with pytest.raises(ConfigError, match="must be a postgresql:// URI"):
        server_options("host=x dbname=y", coordinator)


def test_check_config_refuses_a_shard_dsn_the_coordinator_cannot_carry() -> None:
    """With a coordinator, a shard dsn setting postgres_fdw cannot take is refused, one line each."""
    document = _document(coordinator={"dsn": "postgresql:///c"})
    document["shards"]["s1"]["dsn"] = "postgresql:///s1?sslpassword=x&search_path=app&sslmode=require"
    assert _problems(document) == [
        "f.toml: shards.s1.dsn: search_path is not a libpq connection option, so the coordinator's postgres_fdw "
        "cannot use it",
        "f.toml: shards.s1.dsn: sslpassword cannot be carried to the coordinator's foreign server: a secret fedload "
        "never writes into the coordinator",
    ]
    del document["coordinator"]  # without a coordinator the dsn is fedload's alone
    assert parse_config(document).shards["s1"].dsn.endswith("sslmode=require")


async def test_a_shard_dsns_settings_reach_the_coordinators_connections(federation: Federation) -> None:
    """application_name in s2's dsn: the coordinator's postgres_fdw connects to s2 under that name (it used to
    carry only host, port and dbname, so TLS settings such as sslmode were silently dropped)."""
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    document = config.model_dump(mode="json", exclude_none=True)
    document["shards"]["s2"]["dsn"] += "&application_name=fedload_fdw_s2"
    config = parse_config(document)
    assert (await build_coordinator(config)).attached
    names = f"""
    SELECT string_agg(DISTINCT application_name, ',') FROM pg_stat_activity
    WHERE datname = '{federation.superhub}_s2' AND pid <> pg_backend_pid()
    """

    assert config.coordinator is not None
    conn = await asyncpg.connect(config.coordinator.dsn)
    try:
        await conn.fetchval("SELECT count(*) FROM hosts")  # its postgres_fdw connections stay open
        assert await conn.fetchval(names) == "fedload_fdw_s2"
    finally:
        await conn.close()


def test_check_config_connects_to_every_shard_and_the_coordinator(federation: Federation) -> None:
    """check-config counts the shards; --connect tries each shard and the coordinator, one line each."""
    path = sharded_toml(federation, with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]}))
    result = fedload("check-config", "--connect", "--config", str(path), timeout_s=120)
    lines = result.stdout.splitlines()
    assert (result.returncode, lines[0]) == (
        0,
        f"configuration {path} (given by --config): OK (3 feeders, 1 table pattern, 2 shards)",
    ), result
    version = federation.cluster.psql("SHOW server_version").strip()
    assert lines[1:6] == [
        f"shard s1: OK (PostgreSQL {version})",
        "shard s1 tables: OK (0 partitioned tables match superhub.tables; the first sync creates public.* from the "
        "schema file)",
        f"shard s2: OK (PostgreSQL {version})",
        "shard s2 tables: OK (0 partitioned tables match superhub.tables; the first sync creates public.* from the "
        "schema file)",
        f"coordinator: OK (PostgreSQL {version}, postgres_fdw available)",
    ]


def test_names_and_bounds_of_foreign_partitions() -> None:
    """Names fit PostgreSQL's 63 bytes and stay apart; bounds are sorted and typed as pg_get_expr prints them."""
    long_a, long_b = TableName("public", "a" * 60 + "x"), TableName("public", "a" * 60 + "y")
    names = {foreign_partition_name(t, "s" * 40, new=new) for t in (long_a, long_b) for new in (False, True)}
    assert len(names) == 4
    assert all(len(n.encode()) <= 63 for n in names)
    assert foreign_partition_name(TableName("public", "hosts"), "s1", new=True) == "public.hosts@s1~"
    assert bound_sql([3, 1, 2]) == "FOR VALUES IN (1, 2, 3)"
    assert bound_sql([2, "b", "a"], text=True) == "FOR VALUES IN ('2', 'a', 'b')"
    with pytest.raises(ConfigError, match="feeder key 'b' is not an integer"):
        bound_sql([1, "b"])
    assert bound_keys("FOR VALUES IN (2)") == bound_keys("FOR VALUES IN ('2')") == frozenset({"2"})
    assert bound_keys("FOR VALUES IN ('-2', 5000000000)") == frozenset({"-2", "5000000000"})
    assert bound_keys("FOR VALUES IN ('a''b', '1, 2', NULL)", text=True) == frozenset({"a'b", "1, 2"})
    assert bound_keys("FOR VALUES IN ('x'::character varying)", text=True) == frozenset({"x"})
    assert bound_keys("DEFAULT") is bound_keys("FOR VALUES IN ('x')") is None


def test_daemon_reload_rebuilds_the_coordinator(federation: Federation) -> None:
    """A feeder added to a shard's list and SIGHUP: the daemon rebuilds the coordinator's partitions of that shard."""
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    path = sharded_toml(federation, config)
    daemon = DaemonProcess(path, federation.tmp / "reload.log")
    bound = "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'public.hosts@s2'"
    try:
        daemon.wait_for("the coordinator", lambda: coord_int(federation, f"SELECT count(*) FROM ({bound}) b") == 1)
        assert coord_sql(federation, bound) == "FOR VALUES IN (3)"
        text = path.read_text()
        hub3 = text[text.index("[feeders.hub3]") : text.index("[shards.")]
        path.write_text(text + hub3.replace("[feeders.hub3]", "[feeders.hub4]").replace("key = 3", "key = 4"))
        daemon.process.send_signal(signal.SIGHUP)
        daemon.wait_for("the rebuild", lambda: coord_sql(federation, bound) == "FOR VALUES IN (3, 4)")
        assert daemon.stop() == 0
    finally:
        daemon.stop()
        daemon.close_log()


async def test_daemon_switches_a_feeder_once_its_new_shard_has_loaded_it(federation: Federation) -> None:
    """hub2 given s2 by hand, then a daemon: its first build still reads hub2 from s1 (s2 has nothing of it yet),
    and once hub2's run on s2 succeeds the daemon builds again and reads it from s2, never twice."""
    before = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    assert all(run.succeeded for run in await sync(before))
    federation.cluster.psql("INSERT INTO hosts (hostkey) VALUES ('moved')", dbname=federation.feeders["hub2"])
    document = before.model_dump(mode="json", exclude_none=True)
    document["feeders"]["hub2"]["shard"] = "s2"
    path = sharded_toml(federation, parse_config(document))
    daemon = DaemonProcess(path, federation.tmp / "pending.log")
    seen = set()

    def switched() -> bool:
        seen.add(coord_sql(federation, COUNTS.format(table="hosts")))
        return "1:300,2:201,3:100" in seen

    try:
        daemon.wait_for("hub2 read from s2", switched)
        assert seen <= {"1:300,2:200,3:100", "1:300,2:201,3:100"}, seen
        assert any(e["event"] == "coordinator.feeder_pending" for e in daemon.events())
        assert daemon.stop() == 0
    finally:
        daemon.stop()
        daemon.close_log()


async def test_the_coordinator_sets_up_shards_nobody_synced_yet(federation: Federation) -> None:
    """Only s2's feeder synced: the coordinator build sets up s1 too (its parents from the schema file), so reports
    run at once and count s1's feeders as empty, not as an error."""
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    assert [run.outcome for run in await sync(config, "hub3")] == [Outcome.SUCCESS]
    assert coord_sql(federation, COUNTS.format(table="hosts")) == "3:100"
    assert shard_int(federation, "s1", "SELECT count(*) FROM hosts") == 0


def _history(feeder: str, shard: str, *, configured: bool, success_hour: int | None) -> FeederStatus:
    """A feeder's status as one shard's history gives it, its last success at that hour (None: never)."""
    success = None if success_hour is None else datetime(2026, 11, 27, success_hour, tzinfo=UTC)
    return FeederStatus(
        feeder=feeder,
        last_success=success,
        data_age_s=None,
        rows=None,
        duration_s=None,
        last_outcome=None,
        last_error=None,
        last_error_kind=None,
        next_run=None,
        failures=0,
        configured=configured,
        running=False,
        stale=False,
        shard=shard,
    )


def test_status_shows_a_feeder_once_whichever_shards_hold_its_history() -> None:
    """Several shards' history of one feeder: `status` shows the row of the shard the configuration names (else the
    one with the newest success), naming the others, in the table too."""
    rows = [
        _history("hub2", "s1", configured=False, success_hour=12),  # left by a move that stopped, say
        _history("hub2", "s2", configured=True, success_hour=None),
        _history("old", "s1", configured=False, success_hour=9),  # no longer configured
        _history("old", "s2", configured=False, success_hour=10),
    ]
    shown = status_module._one_per_feeder(rows)
    assert [(s.feeder, s.shard, s.also_on) for s in shown] == [("hub2", "s2", ("s1",)), ("old", "s2", ("s1",))]
    console = Console(width=300, record=True)
    console.print(status_module._table(shown, ConfigLocation(Path("fedload.toml"), "--config")))
    assert "s2 (history also on s1)" in console.export_text()


def _with_shard_down(config: Config, shard: str) -> Config:
    """`config` with `shard`'s dsn pointing where nothing listens, and a short connect timeout."""
    document = config.model_dump(mode="json", exclude_none=True)
    document["shards"][shard]["dsn"] = "postgresql://127.0.0.1:1/nowhere"  # nothing listens there
    document["superhub"]["connect_timeout_s"] = 2.0
    return parse_config(document)


async def test_status_shows_the_other_shards_when_one_cannot_be_reached(federation: Federation) -> None:
    """A shard that is down: `status` still shows the feeders of the others, and says of the down shard's feeders
    which shard cannot be reached (stale, a superhub error), so the exit status flags them."""
    config = sharded(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    assert [run.outcome for run in await sync(config)] == [Outcome.SUCCESS] * 3
    down = _with_shard_down(config, "s2")
    statuses = {s.feeder: s for s in await read_status(down)}
    assert [(s.feeder, s.shard, s.stale) for s in statuses.values()] == [
        ("hub1", "s1", False),
        ("hub2", "s1", False),
        ("hub3", "s2", True),
    ]
    assert (statuses["hub3"].last_error or "").startswith("shard s2 cannot be reached: ")
    assert statuses["hub3"].last_error_kind == "superhub"
    assert statuses["hub1"].rows == 3300


async def test_metrics_name_each_feeders_shard_and_each_shards_health(federation: Federation) -> None:
    """The daemon's metrics with shards: each feeder's shard as a series to join on, each shard's own up gauge,
    the superhub up only when every shard answered, and the reachable shards' freshness still read."""
    config = sharded(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    assert [run.outcome for run in await sync(config)] == [Outcome.SUCCESS] * 3
    down = _with_shard_down(config, "s2")

    history = ShardHistories()
    service = DaemonMetricsService(None, history, None, lambda: down)
    try:
        await service._refresh()  # what the daemon's refresh loop does every 15 s
    finally:
        await history.close()
    value = service.metrics.registry.get_sample_value
    assert value("fedload_feeder_info", {"feeder": "hub3", "shard": "s2"}) == 1
    assert value("fedload_feeder_info", {"feeder": "hub1", "shard": "s1"}) == 1
    assert value("fedload_shard_up", {"shard": "s1"}) == 1
    assert value("fedload_shard_up", {"shard": "s2"}) == 0
    assert value("fedload_superhub_up") == 0
    assert value("fedload_feeder_last_success_timestamp_seconds", {"feeder": "hub1"}) is not None
    assert value("fedload_feeder_last_success_timestamp_seconds", {"feeder": "hub3"}) is None


async def test_a_bug_in_the_coordinators_build_is_logged_and_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator keeper (sync, daemon): an exception fedload does not expect in a build is logged as
    coordinator.build_failed with kind internal and retried, never raised into the sync or the daemon."""
    config = parse_config(_document(coordinator={"dsn": "postgresql:///c"}))

    async def broken(_: Config, *, moving: bool = False, current: object = None) -> CoordinatorReport:
        raise RuntimeError("a bug")

    async def unreachable(_: Config, shard: str) -> None:
        raise SuperhubError(f"shard {shard} cannot be reached")  # never the machine's own PostgreSQL

    monkeypatch.setattr(keeper_module, "build_coordinator", broken)
    monkeypatch.setattr(keeper_module, "read_shard", unreachable)

    with capture_logs() as logs:
        keeper = keeper_module.CoordinatorKeeper(config, retry_max_s=0.05)
        keeper.start()
        try:
            await asyncio.sleep(0.5)
            assert await keeper.settled(0.1) is False
        finally:
            await keeper.close()
    failed = [(e["error"], e["error_kind"]) for e in logs if e["event"] == "coordinator.build_failed"]
    assert len(failed) >= 2, failed
    assert set(failed) == {("internal error: RuntimeError: a bug", "internal")}


async def test_a_user_mapping_without_options_is_kept_build_after_build(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fdw_user and shard dsns without a user: the PUBLIC user mapping has no options, and every build after
    the first finds it (it used to take it for a missing one and fail on "user mapping ... already exists")."""
    monkeypatch.setenv("PGUSER", "postgres")  # fedload's own sessions, as libpq's environment would say
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    document = config.model_dump(mode="json", exclude_none=True)
    for shard in document["shards"].values():
        shard["dsn"] = shard["dsn"].replace("postgresql://postgres@/", "postgresql:///")
    anonymous = parse_config(document)
    assert user_mapping_options(anonymous.shards["s1"].dsn, CoordinatorConfig(dsn="postgresql:///c")) == {}
    assert (await build_coordinator(anonymous)).attached
    assert (await build_coordinator(anonymous)) == CoordinatorReport()
    mappings = "SELECT count(*) FROM pg_user_mappings WHERE usename = 'public' AND umoptions IS NULL"
    assert coord_int(federation, mappings) == 2
