"""Statistics carried from the feeders (PostgreSQL 18) against the ANALYZE after the swap: the superhub's cost.

Two feeders of `--rows` CFEngine-like rows each (the six dataset tables, analyzed on the feeder cluster), synced
into a superhub cluster of its own, once with `carry_statistics = false` (the run ANALYZEs the new partitions) and
once with `true` (the feeders' statistics restored in the load's transaction), alternating, `--repeat` times. The
superhub's server CPU is its postmaster tree's (exited backends included); the wall time is the whole sync's.
`--mode binary`: the feeders in binary mode (statistics from pg_dump --statistics-only in the agent's snapshot).

    uv run --group bench python bench/bench_statistics.py --rows 150000 [--mode binary]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from common import (
    DATASET_TABLES,
    SCHEMA_SQL,
    Workspace,
    dataset_sql,
    machine_line,
    pick_install,
    postmaster_pid,
    print_table,
    tree_cpu_seconds,
)

from fedload.config import Config, parse_config
from fedload.localpg import LocalCluster
from fedload.results import Outcome
from fedload.service.sync import sync_feeders


def _config(feeders: LocalCluster, hub: LocalCluster, hub_db: str, schema: str, *, carry: bool, mode: str) -> Config:
    tables = [f"public.{t}" for t in DATASET_TABLES]
    return parse_config(
        {
            "superhub": {"dsn": hub.dsn(hub_db), "tables": tables, "schema_file": schema, "worker_processes": 0},
            "feeders": {
                f"hub{i}": {
                    "key": i,
                    "transport": "local",
                    "database": feeders.conninfo(f"feeder{i}"),
                    "pg_dump": feeders.install.tool("pg_dump"),
                    "carry_statistics": carry,
                    "dump_mode": mode,
                }
                for i in (1, 2)
            },
        }
    )


def _measure(config: Config, hub: LocalCluster) -> tuple[float, float]:
    """(wall seconds, superhub server CPU seconds) of one sync of both feeders."""
    pid = postmaster_pid(hub)
    cpu, started = tree_cpu_seconds(pid), time.monotonic()
    runs = asyncio.run(sync_feeders(config, list(config.feeders)))
    if any(r.outcome is not Outcome.SUCCESS for r in runs):
        raise SystemExit(f"a sync failed: {[r.error for r in runs]}")
    return time.monotonic() - started, tree_cpu_seconds(pid) - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=150_000, help="rows per feeder (default 150000)")
    parser.add_argument("--repeat", type=int, default=3, help="syncs of each way (default 3)")
    parser.add_argument("--mode", choices=("copy", "inserts", "binary"), default="copy", help="the feeders' dump_mode")
    args = parser.parse_args()
    print(machine_line())
    with Workspace(pick_install(18)) as work:
        feeders, hub = work.cluster("feeders"), work.cluster("superhub")
        for i in (1, 2):
            feeders.psql(f"CREATE DATABASE feeder{i}")
            feeders.psql(SCHEMA_SQL + dataset_sql(args.rows, hub=i)[0] + "ANALYZE;", dbname=f"feeder{i}")
        hub.psql("CREATE DATABASE superhub")
        schema = work.dir / "schema.sql"
        schema.write_text(SCHEMA_SQL)
        results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.repeat):
            for carry in (False, True):
                config = _config(feeders, hub, "superhub", str(schema), carry=carry, mode=args.mode)
                results[carry].append(_measure(config, hub))
        rows = [
            [
                "carried" if carry else "ANALYZE",
                f"{min(w for w, _ in measured):.2f}",
                f"{min(c for _, c in measured):.2f}",
            ]
            for carry, measured in results.items()
        ]
        print_table(
            f"2 feeders x {args.rows:,} rows, PostgreSQL 18, {args.mode} mode, best of {args.repeat}",
            ["way", "sync s", "superhub CPU s"],
            rows,
        )


if __name__ == "__main__":
    main()
