"""A `fedload sync`'s timeline: when each step of each run happened, from the command's start.

    uv run --group bench python bench/run_timeline.py [--feeders 4] [--rows 300000] [--mode binary] [--parallel 2]

bench_e2e.py's feeders (one feeder cluster, the loopback sshd, the agents on the "feeder"), one `python -m fedload
sync --log-format json` at `log_level = "debug"` into a fresh superhub database, shared arrangement. From its
structlog events (each with its timestamp) it prints, per run, the seconds from the command's start to: its
connect phase, its superhub session, the SSH connection, the agent's start, the load phase, each table loaded, the
statistics and swap phases, and the run's end; then the command's own steps before the first run (workers forked,
the parents created). Where a run's fixed time goes, without a profiler's overhead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import bench_e2e
import common

from transforms.cli import positive_int

# The events printed, and how each is labelled; the others are left out.
EVENTS = {
    "worker.forked": "workers forked",
    "superhub.parents_created": "parents ready",
    "sync.phase": "phase",
    "superhub.session_started": "session",
    "superhub.session_reused": "session (kept)",
    "transport.connected": "ssh connected",
    "transport.started": "agent started",
    "import.table_loaded": "loaded",
    "statistics.set_aside": "statistics read",
    "sync.feeder_done": "done",
}


def run_sync(bench: bench_e2e.Bench, mode: str) -> tuple[float, Path]:
    """One debug-level sync of every feeder into a fresh database; its start (epoch seconds) and its JSON log."""
    name = f"timeline_{mode}"
    bench.superhub.psql(f"CREATE DATABASE {name}")
    config = bench.work.dir / f"{name}.toml"
    text = bench.config_toml(mode, "f", name, bench.work.dir / f"agent-rss-{name}")
    config.write_text(text.replace('log_level = "warning"', 'log_level = "debug"'))
    log = bench.work.dir / f"{name}.jsonl"
    argv = [sys.executable, "-m", "fedload", "sync", "--json", "--log-format", "json", "--config", str(config)]
    bench.settle()
    started = time.time()
    with log.open("wb") as stderr:
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=stderr, check=True, timeout=600)
    print(f"wall {time.time() - started:.2f} s")
    return started, log


def timeline(started: float, log: Path) -> list[tuple[float, str, str]]:
    """(seconds from the start, run or "", label) of the events printed, in the log's order."""
    lines = []
    for raw in log.read_text().splitlines():
        try:
            event = json.loads(raw)
        except ValueError:
            continue
        label = EVENTS.get(event.get("event", ""))
        if label is None:
            continue
        at = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp() - started
        if event["event"] == "sync.phase":
            label = f"phase {event['phase']}"
        if "table" in event:
            label += f" {event['table']}"
        lines.append((at, str(event.get("feeder", "")), label))
    return lines


def main() -> int:
    """Set up the feeders, run one sync, print its timeline."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--feeders", type=positive_int, default=4)
    parser.add_argument("--rows", type=positive_int, default=300_000, help="rows per feeder (default 300000)")
    parser.add_argument("--mode", choices=["copy", "inserts", "binary"], default="binary")
    parser.add_argument("--parallel", type=positive_int, default=os.cpu_count() or 1)
    common.add_common_arguments(parser)
    args = parser.parse_args()
    print(common.machine_line())
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        feeders, superhub = work.cluster("feeders"), work.cluster("superhub")
        bench = bench_e2e.Bench(work, feeders, superhub, work.sshd(), args.feeders, args.parallel)
        bench.quiet_superhub()
        print(f"PostgreSQL {work.install.major}; generating {args.feeders} feeders x ~{args.rows} rows ...", flush=True)
        bench.populate("f", args.rows)
        started, log = run_sync(bench, args.mode)
        common.print_table(
            f"{args.mode} mode: seconds from the command's start (the feeder: transport events name the ssh host)",
            ["s", "run", "event"],
            [[f"{at:.3f}", run, label] for at, run, label in timeline(started, log)],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
