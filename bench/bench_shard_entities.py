"""What one entity, one feeder across shards costs a report (docs/entities.md, "Across shards"): the coordinator's
view, which hides the copies not at home by an anti-join with its registry, against its all-rows parent (what the
same report reads without the rule).

    uv run python bench/bench_shard_entities.py [--shards 2] [--feeders 2] [--rows 250000] [--hidden-percent 5]

Each shard is a cluster with `public.t (hub_id, hostkey, payload)` partitioned by hub_id, one partition per feeder
of `--rows` rows, each row its own host; the coordinator (a third cluster) is built by `build_coordinator` with the
rule (timed: it settles every feeder), then its registry is given every host of every feeder with
`--hidden-percent` of them hidden. Measured, best
of 3: `GROUP BY hub_id` and `count(*)` through the view and through `fedload_all."public.t"`.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg
import common

from fedload.config import Config, parse_config
from fedload.log import configure_logging
from fedload.scaleout.coordinator import build_coordinator

SHARD_SQL = """
CREATE SCHEMA fedload_parts;
CREATE TABLE public.t (hub_id integer NOT NULL, hostkey text, seen timestamptz, payload text)
PARTITION BY LIST (hub_id);
"""
FEEDER_SQL = """
CREATE TABLE fedload_parts."public.t__f{key}" PARTITION OF public.t FOR VALUES IN ({key});
INSERT INTO fedload_parts."public.t__f{key}"
SELECT {key}, 'SHA=' || g, now(), md5(g::text) FROM generate_series(1, {rows}) g;
ANALYZE fedload_parts."public.t__f{key}";
"""
REGISTRY = """
TRUNCATE fedload.entity_copies;
INSERT INTO fedload.entity_copies (feeder, entity, feeder_key, newest, displaced_since)
SELECT 'f' || k, 'SHA=' || g, k::text, now(), CASE WHEN g % 100 < {percent} THEN now() END
FROM generate_series(1, {feeders}) k, generate_series(1, {rows}) g;
ANALYZE fedload.entity_copies;
"""
QUERIES = {
    "GROUP BY hub_id": "SELECT hub_id, count(*) FROM {t} GROUP BY hub_id",
    "count(*)": "SELECT count(*) FROM {t}",
}


def config(shards: dict[str, str], coordinator: str, feeders: dict[str, list[int]]) -> Config:
    """Shards, coordinator, feeders (keys per shard), the entity rule on t.hostkey by t.seen."""
    return parse_config(
        {
            "superhub": {"tables": ["public.t"], "entity_key": "hostkey", "entity_newest": "public.t.seen"},
            "shards": {name: {"dsn": dsn} for name, dsn in shards.items()},
            "coordinator": {"dsn": coordinator},
            "feeders": {
                f"f{key}": {"key": key, "shard": shard, "transport": "local"}
                for shard, keys in feeders.items()
                for key in keys
            },
        }
    )


async def best_of(conn: asyncpg.Connection, sql: str, tries: int = 3) -> float:
    """The fastest of `tries` runs of `sql`, in ms."""
    times = []
    for _ in range(tries):
        started = time.perf_counter()
        await conn.fetch(sql)
        times.append((time.perf_counter() - started) * 1000)
    return min(times)


async def run(workspace: common.Workspace, options: argparse.Namespace) -> None:
    """Set up the shards, build the coordinator, fill its registry, measure."""
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
    coordinator = workspace.cluster("coordinator")
    started = time.perf_counter()
    await build_coordinator(config(shards, coordinator.dsn(), feeders))
    built_ms = (time.perf_counter() - started) * 1000
    coordinator.psql(REGISTRY.format(percent=options.hidden_percent, feeders=key, rows=options.rows))
    conn = await asyncpg.connect(coordinator.dsn())
    rows = []
    try:
        for name, sql in QUERIES.items():
            view = await best_of(conn, sql.format(t="public.t"))
            parent = await best_of(conn, sql.format(t='fedload_all."public.t"'))
            rows.append((name, f"{parent:.0f}", f"{view:.0f}", f"{view / parent:.2f}x"))
            if options.explain:
                plan = await conn.fetch(f"EXPLAIN (ANALYZE, VERBOSE) {sql.format(t='public.t')}")
                print("\n".join(r[0] for r in plan))
    finally:
        await conn.close()
    title = (
        f"Reports through the coordinator, {key} feeders x {options.rows:,} hosts on {options.shards} shards, "
        f"{options.hidden_percent}% hidden (best of 3)"
    )
    common.print_table(title, ["query", "all-rows parent ms", "view ms", "ratio"], rows)
    print(f"\nthe first build, which settles every feeder's {options.rows:,} hosts: {built_ms:,.0f} ms")


def main() -> None:
    """Parse the options and run in a workspace of throwaway clusters."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--feeders", type=int, default=2, help="feeders per shard")
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--hidden-percent", type=int, default=5)
    parser.add_argument("--major", type=int, default=None)
    parser.add_argument("--explain", action="store_true", help="print the plans through the view")
    options = parser.parse_args()
    configure_logging(level="warning")
    with common.Workspace(common.pick_install(options.major)) as workspace:
        asyncio.run(run(workspace, options))


if __name__ == "__main__":
    main()
