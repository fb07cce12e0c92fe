"""What a run costs each side when a table goes as its changed buckets (#55, docs/unchanged.md, "Changed rows
only") against sending it whole: one feeder of bench/common.py's six tables, the changes of freshness.py's writer
between runs (three of its commits: a tenth of the hosts report in each), `fedload sync` in binary mode with
`send_changed_rows` on and off. Per run, CPU-seconds of the feeder's server, of the superhub's server (each
postmaster's own, its reaped children's and its live children's times) and of fedload (`fedload sync`, the agent,
psql), the run's seconds and the bytes of dump text.

    uv run python bench/changed_rows_cost.py [--rows 300000] [--runs 5] [--tree PATH [--rounds 3]]

The first runs of each way (a new superhub: no digest, then no delta state) are not counted; prints the mean over
--runs and the ratio of changed rows only to whole tables. With `--tree PATH` (another checkout, e.g. `git worktree
add --detach /tmp/base REV`): changed rows only with this checkout's fedload against the tree's (its sync and its
local agents: PYTHONPATH and the working directory), in turn, --rounds times.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common
import freshness

from fedload.localpg import LocalCluster

WARM_RUNS = 3  # no digest asked, digests stored, delta states stored: the next run sends changed rows
_TICK = os.sysconf("SC_CLK_TCK")
MEASURES = ("feeder server CPU s", "superhub server CPU s", "fedload CPU s", "run s", "dump MB")


def cluster_cpu(cluster: LocalCluster) -> float:
    """CPU-seconds of a cluster: its postmaster's own and reaped children's, and its live children's."""
    pid = common.postmaster_pid(cluster)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15]) / _TICK
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            own = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(own[11]) + int(own[12])) / _TICK
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def config(work: Path, feeders: LocalCluster, superhub: LocalCluster, *, changed_rows: bool) -> Path:
    schema = work / "schema.sql"
    schema.write_text(common.SCHEMA_SQL)
    path = work / f"changed_rows_{changed_rows}.toml"
    path.write_text(
        f"""log_level = "warning"
[superhub]
dsn = {json.dumps(superhub.dsn("hub"))}
tables = {json.dumps([f"public.{t}" for t in common.DATASET_TABLES])}
schema_file = {json.dumps(str(schema))}
[feeders.f]
key = 1
transport = "local"
database = {json.dumps(feeders.conninfo("f1"))}
pg_dump = {json.dumps(feeders.install.tool("pg_dump"))}
dump_mode = "binary"
send_changed_rows = {json.dumps(changed_rows)}
"""
    )
    return path


def one_run(path: Path, feeders: LocalCluster, superhub: LocalCluster, tree: Path | None = None) -> tuple[float, ...]:
    """One `fedload sync` (of `tree`'s fedload, with its local agents, where given) and what it cost; SystemExit if
    it failed."""
    feeders.psql("CHECKPOINT")
    time.sleep(0.3)  # the checkpoint's and the last run's backends reaped
    env = common.tree_environment(tree)  # a local agent is this interpreter's `-m fedload`, in the sync's environment
    before = (cluster_cpu(feeders), cluster_cpu(superhub), children_cpu())
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "fedload", "sync", "--config", str(path), "--json"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
    )
    time.sleep(0.3)
    after = (cluster_cpu(feeders), cluster_cpu(superhub), children_cpu())
    run = json.loads(done.stdout)[0] if done.returncode == 0 else None
    if run is None or run["outcome"] != "success":
        sys.exit(f"the run failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    wall = time.monotonic() - started
    return (*(b - a for a, b in zip(before, after, strict=True)), min(wall, run["seconds"]), run["dump_bytes"] / 1e6)


def change_between_runs(feeders: LocalCluster, run: int) -> None:
    """freshness.py's writer, three commits on the feeder before run number `run` (a tenth of its hosts each)."""
    for commit in range(3):
        feeders.psql(freshness._WRITER_SQL.replace("$1", str((3 * run + commit) % 10)), "f1")


def populated(work: common.Workspace, rows: int) -> tuple[LocalCluster, LocalCluster]:
    """The feeder cluster (database f1: bench/common.py's six tables of about `rows` rows, frozen and analyzed)
    and the superhub cluster, started in `work`."""
    feeders, superhub = work.cluster("feeders"), work.cluster("superhub")
    feeders.psql("CREATE DATABASE f1")
    sql, _ = common.dataset_sql(rows, hub=1)
    feeders.psql(common.SCHEMA_SQL + sql, "f1")
    feeders.psql("VACUUM (FREEZE, ANALYZE)", "f1")
    return feeders, superhub


def way(
    args: argparse.Namespace,
    work: Path,
    clusters: tuple[LocalCluster, LocalCluster],
    *,
    on: bool,
    tree: Path | None = None,
) -> list[float]:
    """The mean costs of --runs runs after the warm ones, with `send_changed_rows = on` (of `tree`'s fedload)."""
    feeders, superhub = clusters
    superhub.psql("DROP DATABASE IF EXISTS hub")
    superhub.psql("CREATE DATABASE hub")
    path = config(work, feeders, superhub, changed_rows=on)
    measured = []
    for i in range(WARM_RUNS + args.runs):
        change_between_runs(feeders, i)
        cost = one_run(path, feeders, superhub, tree)
        if i >= WARM_RUNS:
            measured.append(cost)
    return [sum(m[k] for m in measured) / len(measured) for k in range(len(MEASURES))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000, help="rows of the feeder (default 300000)")
    parser.add_argument("--runs", type=int, default=5, help="runs measured per way (default 5)")
    parser.add_argument("--tree", type=Path, help="changed rows only against this checkout's fedload, in turn")
    parser.add_argument("--rounds", type=int, default=3, help="with --tree: rounds of both sides (default 3)")
    common.add_common_arguments(parser)
    args = parser.parse_args()
    print(common.machine_line())
    work = common.Workspace(common.pick_install(args.pg_major), keep=args.keep)
    try:
        feeders, superhub = populated(work, args.rows)
        if args.tree is not None:
            against_tree(args, work.dir, (feeders, superhub))
            return
        changed = way(args, work.dir, (feeders, superhub), on=True)
        whole = way(args, work.dir, (feeders, superhub), on=False)
    finally:
        work.close()
    rows = [
        [name, f"{c:.3f}", f"{w:.3f}", f"{c / w:.2f}x" if w else "-"]
        for name, c, w in zip(MEASURES, changed, whole, strict=True)
    ]
    title = f"Per run, mean of {args.runs}, {args.rows} rows, three writer commits between runs (binary mode)"
    common.print_table(title, ["", "changed rows only", "whole tables", "ratio"], rows)


def against_tree(args: argparse.Namespace, work: Path, clusters: tuple[LocalCluster, LocalCluster]) -> None:
    """Changed rows only, this checkout's fedload against --tree's, --rounds times in turn (the order reversed
    every other round); the medians over the rounds and the ratio."""
    assert args.tree is not None
    tree = args.tree.resolve()
    sides: dict[str, list[list[float]]] = {"this": [], tree.name: []}
    for i in range(args.rounds):
        order = [("this", None), (tree.name, tree)]
        for name, side in order if i % 2 == 0 else order[::-1]:
            sides[name].append(way(args, work, clusters, on=True, tree=side))
    this, other = ([statistics.median(m[k] for m in sides[name]) for k in range(len(MEASURES))] for name in sides)
    rows = [
        [name, f"{a:.3f}", f"{b:.3f}", f"{a / b:.2f}x" if b else "-"]
        for name, a, b in zip(MEASURES, this, other, strict=True)
    ]
    title = (
        f"Per run with changed rows only, median of {args.rounds} rounds of {args.runs} runs' means, "
        f"{args.rows} rows (binary mode)"
    )
    common.print_table(title, ["", "this checkout", tree.name, "ratio"], rows)


if __name__ == "__main__":
    main()
