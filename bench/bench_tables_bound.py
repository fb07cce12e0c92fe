"""How much could loading one feeder's tables on two streams gain here? An upper bound for max_parallel_tables = 2.

    uv run --group bench python bench/bench_tables_bound.py [--rows 750000] [--arrangement shared]

One feeder database of the six CFEngine-like tables, split into two halves of about the same rows. Each pair of
ways loads the same rows once as one stream and once as two streams at the same time:

  limit:   pg_dump (COPY) | psql --single-transaction, no network, no compression; then one such pipeline per
           half, both at once
  fedload: `fedload sync` of one feeder in copy mode over the loopback sshd (max_parallel_feeders = 1); then two
           feeders on the same database, each excluding the other's half (exclude_tables), max_parallel_feeders = 2

Two fedload feeders at once are what max_parallel_tables = 2 would run for one feeder (two pg_dumps, two agents,
two SSH channels, two superhub connections and worker processes) minus its one extra cost, the shared snapshot,
so their speed-up bounds the feature's from above on this machine. Prints the wall times and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor

import common
from bench_e2e import ARRANGEMENTS, TABLES, Bench

from transforms.cli import positive_int

HALVES = (
    ["public.__contexts", "public.__software", "public.__hosts"],  # 51 rows per host
    ["public.__variables", "public.__promiselog", "public.__lastseenhosts"],  # 49 rows per host
)


class BoundBench(Bench):
    """bench_e2e's clusters and sshd, one feeder database `t1`."""

    def limit_streams(self, groups: list[list[str]]) -> float:
        """Wall seconds of one `pg_dump | psql` per group of tables, all at once, into a fresh database."""
        target = f"{self.arrangement}_limit{len(groups)}"
        self.superhub.psql(f"CREATE DATABASE {target}")
        self.superhub.psql(common.SCHEMA_SQL, target)
        record = self.work.dir / f"cpu-{target}"
        feeder_record = record.with_name(record.name + ".feeder")
        scripts = [
            f"{self.feeder_side(shlex.join(common.pg_dump_argv(self.feeders, 't1', g, inserts=False)), feeder_record)}"
            f" | {self.superhub_side(self.psql(target), record)}"
            for g in groups
        ]
        self.settle()
        with common.timed() as elapsed, ThreadPoolExecutor(len(scripts)) as pool:
            list(pool.map(common.run_shell, scripts))
        return elapsed()

    def fedload_streams(self, groups: list[list[str]], rows: int) -> float:
        """Wall seconds of one `fedload sync` with one feeder per group of tables (the others excluded)."""
        name = f"{self.arrangement}_fedload{len(groups)}"
        self.superhub.psql(f"CREATE DATABASE {name}")
        config = self.work.dir / f"{name}.toml"
        config.write_text(self.groups_toml(name, groups))
        self.settle()
        argv = [sys.executable, "-m", "fedload", "sync", "--json", "--config", str(config)]
        if self.pinned:
            argv = ["taskset", "-c", "1", *argv]
        measured = common.run_measured(argv, stderr=self.work.dir / f"{name}.log")
        runs = json.loads(measured.stdout or b"[]")
        loaded = sum(sum(r["rows"].values()) for r in runs)
        if measured.status != 0 or loaded != rows:
            sys.exit(f"fedload sync failed (status {measured.status}, {loaded} of {rows} rows): {measured.stdout!r}")
        return measured.seconds

    def groups_toml(self, superhub_db: str, groups: list[list[str]]) -> str:
        """fedload.toml: one feeder per group of tables, all on database t1, copy mode over the loopback sshd."""
        schema = self.work.dir / "schema.sql"
        schema.write_text(common.SCHEMA_SQL)
        ssh = self.sshd.ssh_config()
        lines = [
            'log_level = "warning"',
            "[superhub]",
            f"dsn = {json.dumps(self.superhub.dsn(superhub_db))}",
            f"tables = {json.dumps(TABLES)}",
            f"schema_file = {json.dumps(str(schema))}",
            f"max_parallel_feeders = {len(groups)}",
            f'analyze = "{self.analyze}"',
        ]
        for i, group in enumerate(groups, start=1):
            excluded = [t for t in TABLES if t not in group]
            lines += [
                f"[feeders.part{i}]",
                f"key = {i}",
                'dump_mode = "copy"',
                'transport = "ssh"',
                f"database = {json.dumps(self.feeders.conninfo('t1'))}",
                f"pg_dump = {json.dumps(self.feeders.install.tool('pg_dump'))}",
                f"agent_command = {json.dumps([sys.executable, '-m', 'fedload'])}",
                f"exclude_tables = {json.dumps(excluded)}",
                *common.ssh_feeder_lines(f"part{i}", ssh),
            ]
        return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=positive_int, default=750_000, help="rows of the feeder (default 750000)")
    parser.add_argument("--arrangement", choices=[*ARRANGEMENTS, "both"], default="shared", help="(shared)")
    parser.add_argument("--analyze", choices=["after_swap", "autovacuum"], default="autovacuum", help="(autovacuum)")
    common.add_common_arguments(parser)
    return parser.parse_args()


def main() -> int:
    """Set up, run the four ways per arrangement, print the ratios."""
    args = parse_args()
    arrangements = list(ARRANGEMENTS) if args.arrangement == "both" else [args.arrangement]
    print(common.machine_line())
    lines = []
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        feeders, superhub = work.cluster("feeders"), work.cluster("superhub")
        bench = BoundBench(work, feeders, superhub, work.sshd(), 1, 1, args.analyze)
        bench.quiet_superhub()
        print(f"generating one feeder of ~{args.rows} rows ...", flush=True)
        rows = bench.populate("t", args.rows)
        for arrangement in arrangements:
            bench.arrange(arrangement)
            print(f"loading, {arrangement} (load {os.getloadavg()[0]:.2f}) ...", flush=True)
            limit1, limit2 = bench.limit_streams([TABLES]), bench.limit_streams(list(HALVES))
            fed1, fed2 = bench.fedload_streams([TABLES], rows), bench.fedload_streams(list(HALVES), rows)
            lines += [
                f"| {arrangement} | limit | {limit1:.2f} | {limit2:.2f} | {limit1 / limit2:.2f}x |",
                f"| {arrangement} | fedload copy mode | {fed1:.2f} | {fed2:.2f} | {fed1 / fed2:.2f}x |",
            ]
    print(f"\none feeder, {rows:,} rows, analyze = {args.analyze}\n")
    print("| arrangement | way | one stream s | two streams s | speed-up |\n|---|---|---:|---:|---:|")
    print("\n".join(lines))
    print(f"\n{common.BUSY_NOTE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
