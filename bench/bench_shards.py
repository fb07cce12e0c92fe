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
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import asyncpg
import common

from fedload.config import Config, parse_config
from fedload.log import configure_logging
from fedload.names import TableName
from fedload.superhub.coordinator import FDW_SCHEMA, build_coordinator, foreign_partition_name

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
    shards, feeders, key = {}, {}, 0
    for i in range(1, options.shards + 1):
        cluster = workspace.cluster(f"shard{i}")
        cluster.psql(SHARD_SQL)
        keys = []
        for _ in range(options.feeders):
            key += 1
            cluster.psql(FEEDER_SQL.format(key=key, rows=options.rows))
            keys.append(key)
        shards[f"s{i}"], feeders[f"s{i}"] = cluster.dsn(), keys
    coordinator = workspace.cluster("coordinator").dsn()
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


def main() -> None:
    """Start the clusters, run the benchmark, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=2, help="shards, each a cluster (default 2)")
    parser.add_argument("--feeders", type=int, default=2, help="feeders per shard (default 2)")
    parser.add_argument("--rows", type=int, default=250_000, help="rows per feeder (default 250000)")
    parser.add_argument("--explain", action="store_true", help="print the GROUP BY plans")
    common.add_common_arguments(parser)
    options = parser.parse_args()
    configure_logging(level="warning")
    print(common.machine_line(), file=sys.stderr)
    with common.Workspace(common.pick_install(options.pg_major), keep=options.keep) as workspace:
        print(f"PostgreSQL {workspace.install.major}")
        asyncio.run(run(workspace, options))


if __name__ == "__main__":
    main()
