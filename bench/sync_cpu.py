"""The `fedload sync` process's CPU, this checkout against another tree, interleaved, on the same feeders.

    uv run --group bench python bench/sync_cpu.py --against /tmp/base [--rows 300000] [--small-rows 2000] [--reps 3]
        [--mode copy|binary] [--pin]

Sets up `git worktree add --detach /tmp/base REV` and its environment (`cd /tmp/base && uv sync --frozen --no-dev
--compile-bytecode`) yourself; each side runs its own `.venv/bin/python -m fedload` in its own tree, the sync and
the agents (so each side reads the stream its own agent writes). bench_e2e.py's feeders: one cluster, --feeders
databases of the six CFEngine-like tables, over the loopback sshd, --mode (default copy), `max_parallel_feeders = 2`.
Each side's fedload and transforms are compiled to bytecode first (as an installed package is: an environment
with PYTHONDONTWRITEBYTECODE would compile them from source at every run). Each repetition loads every feeder
into a fresh superhub database, side by side (new then old, then old then new).

The CPU is the sync process's and its worker processes' (wait4's rusage: the sync and the children it waited for;
the workers are forked by the sync), not the PostgreSQL servers' (the postmasters are not its children) nor the
agents' (children of sshd on the "feeder"). Run once with --rows and once with --small-rows: the difference is
the CPU per byte of dump, the small run the fixed cost (start-up, connections, the superhub's set-up).

Also printed: each sync's wall time, with its ratio new/old. `--pin` puts the feeder side (the feeder cluster,
sshd and the agents it starts) on CPU 0 and the superhub side (its cluster, the sync and its workers) on CPU 1, as
deployed (bench_e2e.py's pinned arrangement): there the sync's CPU competes with the loading backends, so its wall
ratio is what a change of the sync's CPU costs a load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import bench_e2e
import common

from transforms.cli import positive_int

HERE = Path(__file__).resolve().parent


def config_text(bench: bench_e2e.Bench, prefix: str, db: str, python: Path, mode: str) -> str:
    """bench_e2e's config of the feeders `<prefix><i>` in dump mode `mode`, with the side's `python -m fedload` as
    the agent."""
    record = bench.work.dir / f"agent-{db}"
    text = bench.config_toml(mode, prefix, db, record)
    wrapped = json.dumps(common.rss_wrapped(record, [sys.executable, "-m", "fedload"]))
    return text.replace(wrapped, json.dumps([str(python), "-m", "fedload"]))


def one_sync(bench: bench_e2e.Bench, tree: Path, prefix: str, db: str, expected: int, *, mode: str) -> common.Measured:
    """One `fedload sync` of every feeder, run by `tree`'s Python in `tree`, into a new database, measured."""
    bench.superhub.psql(f"CREATE DATABASE {db}")
    python = tree / ".venv" / "bin" / "python"
    config = bench.work.dir / f"{db}.toml"
    config.write_text(config_text(bench, prefix, db, python, mode))
    bench.settle()
    argv = [str(python), "-m", "fedload", "sync", "--json", "--config", str(config)]
    if bench.pinned:
        argv = ["taskset", "-c", bench_e2e.SUPERHUB_CPU, *argv]  # taskset execs: wait4 still measures fedload
    measured = common.run_measured(argv, stderr=bench.work.dir / f"{db}.log", cwd=tree)
    loaded = sum(sum(r["rows"].values()) for r in json.loads(measured.stdout or b"[]"))
    if measured.status != 0 or loaded != expected:
        sys.exit(f"{tree}: fedload sync failed or loaded {loaded} rows, not {expected}: {measured.stdout[-2000:]!r}")
    bench.superhub.psql(f"DROP DATABASE {db}")
    return measured


Sides = dict[str, list[common.Measured]]


def compare(bench: bench_e2e.Bench, sides: dict[str, Path], rows: int, reps: int, mode: str) -> Sides:
    """Every side's syncs, one per repetition, on feeders of about `rows` rows, interleaved."""
    prefix = f"f{rows}_"
    expected = bench.populate(prefix, rows) * bench.count
    runs: Sides = {name: [] for name in sides}
    for rep in range(reps):
        for name in list(sides) if rep % 2 == 0 else list(sides)[::-1]:
            run = one_sync(bench, sides[name], prefix, f"cpu_{name}_{rows}_{rep}", expected, mode=mode)
            runs[name].append(run)
            load = os.getloadavg()[0]
            print(
                f"  {rows} rows, repetition {rep + 1}, {name}: {run.cpu_s:.2f} CPU s, {run.seconds:.2f} s wall "
                f"(load {load:.1f})",
                flush=True,
            )
    return runs


def _cell(values: list[float]) -> str:
    """The median and range of one side's CPU seconds."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def report(results: dict[int, Sides], per_byte: tuple[int, int] | None) -> None:
    """Medians and ranges per size and side, the ratio new/old of the medians, and the CPU per byte; then the
    wall times alike."""
    cpu_of = {rows: {n: [m.cpu_s for m in runs] for n, runs in sides.items()} for rows, sides in results.items()}
    wall_of = {rows: {n: [m.seconds for m in runs] for n, runs in sides.items()} for rows, sides in results.items()}
    _report_of("fedload sync CPU s (the sync and its workers), median (range)", cpu_of, per_byte)
    _report_of("fedload sync wall s, median (range)", wall_of, None)


def _report_of(title: str, results: dict[int, dict[str, list[float]]], per_byte: tuple[int, int] | None) -> None:
    lines = []
    for rows, cpu in results.items():
        new, old = (statistics.median(cpu[name]) for name in ("new", "old"))
        lines.append([f"{rows:,} rows", _cell(cpu["new"]), _cell(cpu["old"]), f"{new / old:.2f}x"])
    if per_byte is not None:
        big, small = per_byte
        new, old = (statistics.median(results[big][n]) - statistics.median(results[small][n]) for n in ("new", "old"))
        lines.append(["difference: per byte", f"{new:.2f}", f"{old:.2f}", f"{new / old:.2f}x"])
    common.print_table(title, ["feeders of", "new", "old", "new/old"], lines)


def main() -> int:
    """Set up the clusters, compare both sides at each size, report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, required=True, help="the other tree, with its .venv")
    parser.add_argument("--feeders", type=positive_int, default=4)
    parser.add_argument("--rows", type=positive_int, default=300_000, help="rows per feeder (default 300000)")
    parser.add_argument("--small-rows", type=int, default=2_000, help="the fixed cost's size; 0: not measured")
    parser.add_argument("--reps", type=positive_int, default=3)
    parser.add_argument("--mode", choices=("copy", "binary"), default="copy", help="the feeders' dump_mode")
    parser.add_argument("--pin", action="store_true", help="feeder side on CPU 0, superhub side on CPU 1")
    common.add_common_arguments(parser)
    args = parser.parse_args()
    sides = {"new": HERE.parent, "old": args.against.resolve()}
    for tree in sides.values():
        python = tree / ".venv" / "bin" / "python"
        subprocess.run([str(python), "-m", "compileall", "-q", "fedload", "transforms"], cwd=tree, check=True)
    print(common.machine_line())
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        bench = bench_e2e.Bench(work, work.cluster("feeders"), work.cluster("superhub"), work.sshd(), args.feeders, 2)
        bench.quiet_superhub()
        bench.arrange("pinned" if args.pin else "shared")
        sizes = [args.rows, *([args.small_rows] if args.small_rows else [])]
        results = {rows: compare(bench, sides, rows, args.reps, args.mode) for rows in sizes}
    print(f"dump_mode {args.mode}, {'pinned' if args.pin else 'shared'}")
    report(results, (args.rows, args.small_rows) if args.small_rows else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
