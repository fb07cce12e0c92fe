"""Where a changed-rows run's server time goes: each side's statements, by their total duration per run.

    uv run python bench/run_statements.py [--rows 300000] [--runs 3] [--top 20]

changed_rows_cost.py's feeder and superhub (one feeder of bench/common.py's six tables, freshness.py's writer
committing three times between runs, `fedload sync` in binary mode with `send_changed_rows` on): after its warm
runs (no digest, then no delta state), both servers log every statement's duration (`log_min_duration_statement =
0`) for --runs runs. Printed per side: the milliseconds per run of each statement, numbers in its text folded (so
the same statement of every run adds up), the largest first. The feeder's side holds the writer's statements too
(UPDATE, INSERT), and a COPY FROM STDIN on the superhub lasts as long as the stream it reads: its time includes
waiting for the feeder. A statement's time, not its CPU: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import collections
import re

import changed_rows_cost
import common

from fedload.localpg import LocalCluster
from transforms.cli import positive_int

_LOGGED = re.compile(r"duration: ([0-9.]+) ms\s+(?:statement|execute [^:]*|bind [^:]*|parse [^:]*):\s*(.{0,100})")
_LOG_ALL = "ALTER SYSTEM SET log_min_duration_statement = 0; SELECT pg_reload_conf()"


def statement_ms(cluster: LocalCluster, runs: int) -> dict[str, float]:
    """The milliseconds per run of each statement the cluster's log holds, numbers folded to N; the largest first."""
    totals: collections.defaultdict[str, float] = collections.defaultdict(float)
    for ms, statement in _LOGGED.findall((cluster.dir / "server.log").read_text(errors="replace")):
        totals[re.sub(r"[0-9]+", "N", statement)[:100]] += float(ms) / runs
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=positive_int, default=300_000, help="rows of the feeder (default 300000)")
    parser.add_argument("--runs", type=positive_int, default=3, help="runs logged (default 3)")
    parser.add_argument("--top", type=positive_int, default=20, help="statements printed per side (default 20)")
    common.add_common_arguments(parser)
    args = parser.parse_args()
    print(common.machine_line())
    work = common.Workspace(common.pick_install(args.pg_major), keep=args.keep)
    try:
        feeders, superhub = changed_rows_cost.populated(work, args.rows)
        superhub.psql("CREATE DATABASE hub")
        path = changed_rows_cost.config(work.dir, feeders, superhub, changed_rows=True)
        for i in range(changed_rows_cost.WARM_RUNS + args.runs):
            if i == changed_rows_cost.WARM_RUNS:
                superhub.psql(_LOG_ALL)
                feeders.psql(_LOG_ALL)
            changed_rows_cost.change_between_runs(feeders, i)
            changed_rows_cost.one_run(path, feeders, superhub)
        for side, cluster in (("superhub", superhub), ("feeder", feeders)):
            totals = statement_ms(cluster, args.runs)
            rows = [[f"{ms:.1f}", statement] for statement, ms in list(totals.items())[: args.top]]
            title = f"{side}: {sum(totals.values()):.0f} ms of statements per run"
            common.print_table(title, ["ms", "statement"], rows)
    finally:
        work.close()


if __name__ == "__main__":
    main()
