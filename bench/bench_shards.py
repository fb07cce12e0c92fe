"""The coordinator over shards (docs/scale-out.md): what fedload's build costs, what reports through it cost, and
which locks a change of a shard's feeder list takes.

    uv run python bench/bench_shards.py [--shards 2] [--feeders 2] [--rows 250000]

Each shard is a cluster of its own with a parent `public.t (hub_id, id, payload)` partitioned by hub_id and one
partition per feeder in fedload_parts (as fedload's swap leaves them), filled with generated rows; the coordinator
is a third cluster, built by `build_coordinator`. Measured: the build (first, again unchanged, after a feeder was
added to the last shard), `SELECT hub_id, count(*) ... GROUP BY hub_id` with and without partitionwise aggregation
(best of 3), a count pruned to one feeder, both queries while feeder f1 is moving from s1 to the last shard (which
the coordinator then reads through a filter view), and the lock modes DETACH and ATTACH of a foreign partition hold
on the coordinator's parent (read from pg_locks inside the statement's transaction, then rolled back).

Then a reader during a move (`--move-rows`, 0 to skip): real fedload shards (a database on each shard cluster, the
same number of feeders of `--move-rows` rows each, loaded by `sync_feeders` from a feeder cluster), a reader on the
coordinator running the GROUP BY back to back while `fedload feeder move f1 --to s2` (the command, in its own
process) runs. Reported as ratios against the same GROUP BY run directly on one shard in the same run (interleaved
with the coordinator's, before the move): the coordinator's latency idle and during the move (median, p95, max),
whether every read saw each feeder once with all its rows, and the move's time, also against a plain
`fedload sync f1` of the same feeder afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import asyncpg
import common

from fedload.config import Config, load_config, parse_config
from fedload.localpg import LocalCluster
from fedload.log import configure_logging
from fedload.names import TableName
from fedload.scaleout.coordinator import FDW_SCHEMA, build_coordinator, foreign_partition_name
from fedload.service.sync import sync_feeders

SHARD_SQL = """
CREATE SCHEMA fedload_parts;
CREATE TABLE public.t (hub_id integer NOT NULL, id integer NOT NULL, payload text) PARTITION BY LIST (hub_id);
"""
FEEDER_SQL = """
CREATE TABLE fedload_parts."public.t__f{key}" PARTITION OF public.t FOR VALUES IN ({key});
INSERT INTO fedload_parts."public.t__f{key}" SELECT {key}, g, md5(g::text) FROM generate_series(1, {rows}) g;
ANALYZE fedload_parts."public.t__f{key}";
"""
GROUP = "SELECT hub_id, count(*) FROM t GROUP BY hub_id"
COUNT = "SELECT count(*) FROM t"
LOCKS = (
    "SELECT string_agg(mode, ', ' ORDER BY mode) FROM pg_locks "
    "WHERE relation = 'public.t'::regclass AND pid = pg_backend_pid()"
)


def config(shards: dict[str, str], coordinator: str, feeders: dict[str, list[int]]) -> Config:
    """A configuration with these shards and feeders (never run: only the coordinator is built)."""
    document = {
        "superhub": {"tables": ["public.t"], "swap_max_wait_s": 5},
        "shards": {name: {"dsn": dsn} for name, dsn in shards.items()},
        "coordinator": {"dsn": coordinator},
        "feeders": {
            f"f{key}": {"key": key, "transport": "local", "shard": shard}
            for shard, keys in feeders.items()
            for key in keys
        },
    }
    return parse_config(document)


async def best_of(conn: asyncpg.Connection, sql: str, tries: int = 3) -> float:
    """The fastest of `tries` runs, in ms."""
    best = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        await conn.fetch(sql)
        best = min(best, (time.perf_counter() - started) * 1000)
    return best


async def timed_build(cfg: Config) -> tuple[float, str]:
    """The build's wall time in ms, and what it changed."""
    started = time.perf_counter()
    report = await build_coordinator(cfg)
    changed = f"created {len(report.created)}, detached {len(report.detached)}, attached {len(report.attached)}"
    return (time.perf_counter() - started) * 1000, changed


async def lock_modes(conn: asyncpg.Connection, shard: str) -> tuple[str, str]:
    """The modes on the coordinator's parent held by DETACH, and by ATTACH, of `shard`'s foreign partition."""
    name = f'{FDW_SCHEMA}."{foreign_partition_name(TableName("public", "t"), shard)}"'
    bound = await conn.fetchval("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE oid = $1::regclass", name)
    async with conn.transaction():
        await conn.execute(f"ALTER TABLE public.t DETACH PARTITION {name}")
        detach = await conn.fetchval(LOCKS)
    async with conn.transaction():  # the partition is back, by the statement whose locks are read
        await conn.execute(f"ALTER TABLE public.t ATTACH PARTITION {name} {bound}")
        attach = await conn.fetchval(LOCKS)
    return detach, attach


async def run(workspace: common.Workspace, options: argparse.Namespace) -> None:
    """Set up the shards, build the coordinator, measure."""
    shards, feeders, key, clusters = {}, {}, 0, []
    for i in range(1, options.shards + 1):
        cluster = workspace.cluster(f"shard{i}")
        clusters.append(cluster)
        cluster.psql(SHARD_SQL)
        keys = []
        for _ in range(options.feeders):
            key += 1
            cluster.psql(FEEDER_SQL.format(key=key, rows=options.rows))
            keys.append(key)
        shards[f"s{i}"], feeders[f"s{i}"] = cluster.dsn(), keys
    coordinator_cluster = workspace.cluster("coordinator")
    coordinator = coordinator_cluster.dsn()
    builds = [("first", *await timed_build(config(shards, coordinator, feeders)))]
    builds.append(("again, unchanged", *await timed_build(config(shards, coordinator, feeders))))
    last = f"s{options.shards}"
    more = {**feeders, last: [*feeders[last], key + 1]}
    builds.append((f"a feeder added to {last}", *await timed_build(config(shards, coordinator, more))))
    common.print_table("Coordinator build", ["build", "ms", "changes"], [(n, f"{ms:.0f}", c) for n, ms, c in builds])

    conn = await asyncpg.connect(coordinator)
    try:
        on = await best_of(conn, GROUP)
        if options.explain:
            print("\n".join(r[0] for r in await conn.fetch(f"EXPLAIN (ANALYZE, VERBOSE) {GROUP}")))
        await conn.execute("SET enable_partitionwise_aggregate = off")
        off = await best_of(conn, f"{GROUP} -- off")  # another text: asyncpg's cached plan ignores the SET
        if options.explain:
            print("\n".join(r[0] for r in await conn.fetch(f"EXPLAIN (ANALYZE, VERBOSE) {GROUP}")))
        await conn.execute("RESET enable_partitionwise_aggregate")
        pruned = await best_of(conn, "SELECT count(*) FROM t WHERE hub_id = 1")
        everything = await best_of(conn, COUNT)
        moving = {**more, "s1": more["s1"][1:], last: [*more[last], more["s1"][0]]}
        filtered = (await build_coordinator(config(shards, coordinator, moving))).filtered
        during = await best_of(conn, f"{GROUP} -- moving"), await best_of(conn, f"{COUNT} -- moving")
        await build_coordinator(config(shards, coordinator, more))
        total = options.shards * options.feeders * options.rows
        common.print_table(
            f"Reports through the coordinator ({total:,} rows on {options.shards} shards, best of 3)",
            ["query", "ms"],
            [
                ("GROUP BY hub_id, partitionwise aggregate on (fedload sets it)", f"{on:.0f}"),
                ("GROUP BY hub_id, partitionwise aggregate off", f"{off:.0f}"),
                ("count(*) WHERE hub_id = 1 (one shard)", f"{pruned:.0f}"),
                ("count(*)", f"{everything:.0f}"),
                (
                    f"GROUP BY hub_id, f1 moving to {last} ({', '.join(filtered)} read through a filter)",
                    f"{during[0]:.0f}",
                ),
                (f"count(*), f1 moving to {last} (the same)", f"{during[1]:.0f}"),
            ],
        )
        detach, attach = await lock_modes(conn, "s1")
        rows = [("DETACH PARTITION", detach), ("ATTACH PARTITION", attach)]
        common.print_table("Locks on the coordinator's parent", ["statement", "modes held"], rows)
    finally:
        await conn.close()
    if options.move_rows:
        await reader_during_move(workspace, clusters, coordinator_cluster, options)


MOVE_DB = "moving"  # the database of the move part, on every cluster
FEEDER_TABLE = "CREATE TABLE public.t (id integer NOT NULL, payload text);"
FEEDER_ROWS = "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, {rows}) g; ANALYZE t;"


def move_config_toml(
    feeders: LocalCluster, shards: dict[str, str], placement: list[str], coordinator: str, schema: Path
) -> str:
    """The move part's configuration file: feeder f<N> on shard placement[N - 1], read locally from `feeders`."""
    lines = ["[superhub]", 'tables = ["public.t"]', f"schema_file = {json.dumps(str(schema))}", "swap_max_wait_s = 30"]
    for name, dsn in shards.items():
        lines += [f"[shards.{name}]", f"dsn = {json.dumps(dsn)}"]
    lines += ["[coordinator]", f"dsn = {json.dumps(coordinator)}"]
    for key, shard in enumerate(placement, start=1):
        lines += [
            f"[feeders.f{key}]",
            f"key = {key}",
            'transport = "local"',
            f"shard = {json.dumps(shard)}",
            f"database = {json.dumps(feeders.conninfo(f'f{key}'))}",
            f"pg_dump = {json.dumps(feeders.install.tool('pg_dump'))}",
        ]
    return "\n".join(lines) + "\n"


async def fedload_command(*args: str) -> float:
    """Run the fedload command line in its own process; its wall time in ms (SystemExit if it fails)."""
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fedload", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), 600)
    if process.returncode != 0:
        raise SystemExit(f"fedload {' '.join(args)} failed:\n{output.decode()[-3000:]}")
    return (time.perf_counter() - started) * 1000


async def timed_fetch(conn: asyncpg.Connection, sql: str) -> tuple[float, list[tuple[int, int]]]:
    """One query's wall time in ms and its rows."""
    started = time.perf_counter()
    rows = await conn.fetch(sql)
    return (time.perf_counter() - started) * 1000, sorted((r[0], r[1]) for r in rows)


async def read_while(conn: asyncpg.Connection, work: asyncio.Task[float]) -> list[tuple[float, list[tuple[int, int]]]]:
    """The coordinator's GROUP BY back to back until `work` is done: each read's time and rows."""
    reads = []
    while not work.done():
        reads.append(await timed_fetch(conn, f"{GROUP} -- during"))
    return reads


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def reader_during_move(
    workspace: common.Workspace,
    shard_clusters: list[LocalCluster],
    coordinator_cluster: LocalCluster,
    options: argparse.Namespace,
) -> None:
    """The move part (module docstring)."""
    feeders = workspace.cluster("feeders")
    shards = {}
    for i, cluster in enumerate(shard_clusters, start=1):
        cluster.psql(f"CREATE DATABASE {MOVE_DB}")
        shards[f"s{i}"] = cluster.dsn(MOVE_DB)
    coordinator_cluster.psql(f"CREATE DATABASE {MOVE_DB}")
    placement = [shard for shard in shards for _ in range(options.feeders)]
    for key in range(1, len(placement) + 1):
        feeders.psql(f"CREATE DATABASE f{key}")
        feeders.psql(FEEDER_TABLE + FEEDER_ROWS.format(rows=options.move_rows), dbname=f"f{key}")
    schema = workspace.dir / "schema.sql"
    schema.write_text(FEEDER_TABLE)
    path = workspace.dir / "move.toml"
    path.write_text(move_config_toml(feeders, shards, placement, coordinator_cluster.dsn(MOVE_DB), schema))
    names = [f"f{key}" for key in range(1, len(placement) + 1)]
    runs = await sync_feeders(load_config(path), names)
    assert all(run.succeeded for run in runs), [run.error for run in runs]
    expected = [(key, options.move_rows) for key in range(1, len(names) + 1)]
    one_shard = await asyncpg.connect(shards["s1"])
    coordinator = await asyncpg.connect(coordinator_cluster.dsn(MOVE_DB))
    try:
        shard_ms, idle_ms = [], []
        for _ in range(options.reads):  # interleaved: the one-shard query, then the coordinator's
            shard_ms.append((await timed_fetch(one_shard, GROUP))[0])
            idle_ms.append((await timed_fetch(coordinator, GROUP))[0])
        move = asyncio.create_task(fedload_command("feeder", "move", "f1", "--to", "s2", "--config", str(path)))
        reads = await read_while(coordinator, move)
        move_ms = await move
        sync_ms = await fedload_command("sync", "f1", "--config", str(path))
    finally:
        await one_shard.close()
        await coordinator.close()
    during_ms = [ms for ms, _ in reads]
    exact = sum(rows == expected for _, rows in reads)
    base = statistics.median(shard_ms)

    def row(what: str, ms: float) -> tuple[str, str, str]:
        return what, f"{ms:.1f}", common.fmt_ratio(ms / base)

    common.print_table(
        f"A reader during `fedload feeder move f1 --to s2` ({options.move_rows:,} rows per feeder, "
        f"{len(names)} feeders on {len(shards)} shards; ratios against the GROUP BY on one shard)",
        ["what", "ms", "ratio"],
        [
            row(f"GROUP BY hub_id on shard s1 directly, median of {len(shard_ms)}", base),
            row("the coordinator's GROUP BY, no move, median", statistics.median(idle_ms)),
            row("the coordinator's GROUP BY, no move, p95", p95(idle_ms)),
            row(f"the coordinator's GROUP BY during the move, median of {len(reads)}", statistics.median(during_ms)),
            row("the coordinator's GROUP BY during the move, p95", p95(during_ms)),
            row("the coordinator's GROUP BY during the move, max", max(during_ms)),
            row("the move (the command, start to exit)", move_ms),
            row("a plain `fedload sync f1` afterwards (the command)", sync_ms),
        ],
    )
    print(f"reads during the move that saw each feeder once with all its rows: {exact} of {len(reads)}")
    print(f"the move took {common.fmt_ratio(move_ms / sync_ms)} a plain sync of the same feeder")


def main() -> None:
    """Start the clusters, run the benchmark, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=2, help="shards, each a cluster (default 2)")
    parser.add_argument("--feeders", type=int, default=2, help="feeders per shard (default 2)")
    parser.add_argument("--rows", type=int, default=250_000, help="rows per feeder (default 250000)")
    parser.add_argument("--explain", action="store_true", help="print the GROUP BY plans")
    parser.add_argument(
        "--move-rows", type=int, default=100_000, help="rows per feeder of the reader-during-move part (0: skip it)"
    )
    parser.add_argument("--reads", type=int, default=20, help="queries of each kind before the move (default 20)")
    common.add_common_arguments(parser)
    options = parser.parse_args()
    configure_logging(level="warning")
    print(common.machine_line(), file=sys.stderr)
    with common.Workspace(common.pick_install(options.pg_major), keep=options.keep) as workspace:
        print(f"PostgreSQL {workspace.install.major}")
        asyncio.run(run(workspace, options))


if __name__ == "__main__":
    main()
