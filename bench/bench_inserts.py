"""Inserts mode against copy mode on the same feeders, this checkout against REV, in one run, interleaved.

    uv run --group bench python bench/bench_inserts.py --against REV [--feeders 4] [--rows 100000] [--reps 3]
        [--arrangement pinned|shared]

bench_e2e.py's feeders (CFEngine-like tables, one feeder cluster, feeders over the loopback sshd) and superhub
cluster (autovacuum off, CHECKPOINT before each run). Per repetition, both sides (this checkout, REV built by
compare.py's `built_side`: its own worktree and environment; the order reversed every other repetition) run
`fedload sync` of every feeder in inserts mode, then in copy mode, each into a fresh superhub database; each side's
interpreter runs in its own tree, for the sync and for the agents. Pinned (the default): the feeder side on CPU 0,
the superhub side on CPU 1, as if the feeders had machines of their own.

Printed per side and mode, medians over the repetitions: wall seconds, rows per second, the CPU seconds of the
`fedload sync` process with its workers (wait4), of the superhub cluster and of the agents with their pg_dump
client (the feeder side, recorded by bench_e2e's wrapper); then inserts/copy throughput per
side (the issue's aim: >= 0.8x) and new/old per mode, with the range of the paired ratios. Exit 1 if a run fails
or loads another number of rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import bench_e2e
import common
import compare

from transforms.cli import positive_int

MODES = ("inserts", "copy")


@dataclass(frozen=True, slots=True)
class Run:
    """One `fedload sync` of every feeder."""

    side: str
    mode: str
    wall_s: float
    rows: int
    sync_cpu_s: float
    server_cpu_s: float
    agents_cpu_s: float  # the feeder side: the agents with their pg_dump (the wrapper's record)


def sync_once(bench: bench_e2e.Bench, side: compare.Side, mode: str, rep: int, rows: int) -> Run:
    """`fedload sync` of every feeder `f<i>` into a fresh superhub database, with the side's interpreter."""
    name = f"{bench.arrangement}_{side.name}_{mode}_{rep}"
    bench.superhub.psql(f"CREATE DATABASE {name}")
    config = bench.work.dir / f"{name}.toml"
    agents = bench.work.dir / f"agent-rss-{name}"
    text = bench.config_toml(mode, "f", name, agents)
    config.write_text(text.replace(sys.executable, str(side.python)))  # the side's own agents
    bench.settle()
    argv = [str(side.python), "-m", "fedload", "sync", "--json", "--config", str(config)]
    if bench.pinned:
        argv = ["taskset", "-c", bench_e2e.SUPERHUB_CPU, *argv]
    server_before = bench.superhub_cpu()
    measured = common.run_measured(argv, stderr=bench.work.dir / f"{name}.log", cwd=side.tree)
    server_cpu = bench.superhub_cpu() - server_before
    runs = json.loads(measured.stdout or b"[]")
    loaded = sum(sum(r["rows"].values()) for r in runs)
    if measured.status != 0 or any(r["outcome"] != "success" for r in runs) or loaded != rows * bench.count:
        sys.exit(f"{side.name} {mode}: status {measured.status}, {loaded} rows: {measured.stdout[-2000:]!r}")
    bench.superhub.psql(f"DROP DATABASE {name}")
    run = Run(side.name, mode, measured.seconds, loaded, measured.cpu_s, server_cpu, common.recorded_usage(agents)[1])
    print(
        f"  {side.name:>3} {mode:<7} wall {run.wall_s:6.2f} s, sync CPU {run.sync_cpu_s:5.2f} s, "
        f"server CPU {run.server_cpu_s:5.2f} s, agents CPU {run.agents_cpu_s:5.2f} s",
        flush=True,
    )
    return run


def median(runs: Sequence[Run], side: str, mode: str, measure: str) -> float:
    """The median of one measure over the repetitions."""
    return float(statistics.median(getattr(r, measure) for r in runs if r.side == side and r.mode == mode))


def paired(runs: Sequence[Run], top_cell: tuple[str, str], bottom_cell: tuple[str, str], measure: str) -> str:
    """The range of the per-repetition ratios of `measure` between two (side, mode) cells."""
    top = [getattr(r, measure) for r in runs if (r.side, r.mode) == top_cell]
    bottom = [getattr(r, measure) for r in runs if (r.side, r.mode) == bottom_cell]
    return compare.spread([t / b for t, b in zip(top, bottom, strict=True)])


def report(runs: Sequence[Run], labels: dict[str, str]) -> None:
    """Medians per side and mode; inserts/copy per side, new/old per mode."""
    print("\nmedians")
    print(
        f"{'side':<44} {'mode':<8} {'wall s':>7} {'rows/s':>9} {'sync CPU s':>10} {'server CPU s':>12} "
        f"{'agents CPU s':>12}"
    )
    for side, label in labels.items():
        for mode in MODES:
            wall = median(runs, side, mode, "wall_s")
            rows = next(r.rows for r in runs if r.side == side)
            print(
                f"{label:<44} {mode:<8} {wall:7.2f} {rows / wall:9,.0f} "
                f"{median(runs, side, mode, 'sync_cpu_s'):10.2f} {median(runs, side, mode, 'server_cpu_s'):12.2f} "
                f"{median(runs, side, mode, 'agents_cpu_s'):12.2f}"
            )
    print("\ninserts mode / copy mode, per side (throughput: copy wall / inserts wall; aim >= 0.8x)")
    for side, label in labels.items():
        ratio = median(runs, side, "copy", "wall_s") / median(runs, side, "inserts", "wall_s")
        cpu = median(runs, side, "inserts", "sync_cpu_s") / median(runs, side, "copy", "sync_cpu_s")
        spread = paired(runs, (side, "copy"), (side, "inserts"), "wall_s")
        print(f"  {label:<44} throughput {ratio:.2f}x (paired {spread}), sync CPU {cpu:.2f}x")
    if len(labels) == 2:
        print("\nnew / old, per mode")
        for mode in MODES:
            for measure in ("wall_s", "sync_cpu_s", "server_cpu_s", "agents_cpu_s"):
                ratio = median(runs, "new", mode, measure) / median(runs, "old", mode, measure)
                spread = paired(runs, ("new", mode), ("old", mode), measure)
                print(f"  {mode:<8} {measure:<13} {ratio:.2f}x (paired {spread})")


@contextmanager
def sides(against: str | None, keep: bool) -> Iterator[list[compare.Side]]:
    """This checkout, and REV built apart if given."""
    with compare.new_side(None, keep) as new:
        if against is None:
            yield [new]
            return
        with compare.built_side("old", against, keep) as old:
            yield [new, old]


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", metavar="REV", help="compare with REV (its own worktree and environment)")
    parser.add_argument("--feeders", type=positive_int, default=4)
    parser.add_argument("--rows", type=positive_int, default=100_000, help="rows per feeder (default 100000)")
    parser.add_argument("--reps", type=positive_int, default=3, help="repetitions per side and mode (default 3)")
    parser.add_argument("--parallel", type=positive_int, default=2, help="feeders at a time (default 2)")
    parser.add_argument("--arrangement", choices=bench_e2e.ARRANGEMENTS, default="pinned")
    parser.add_argument("--keep-build", action="store_true", help="keep REV's worktree")
    common.add_common_arguments(parser)
    return parser.parse_args()


def main() -> int:
    """Set up once, run both sides and modes interleaved, report."""
    args = parse_args()
    print(common.machine_line())
    with sides(args.against, args.keep_build) as both:
        for side in both:
            compare.prepare(side)
        labels = {side.name: side.label for side in both}
        with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
            feeders, superhub = work.cluster("feeders"), work.cluster("superhub")
            bench = bench_e2e.Bench(work, feeders, superhub, work.sshd(), args.feeders, args.parallel)
            bench.quiet_superhub()
            print(f"generating {args.feeders} feeders x ~{args.rows} rows ...", flush=True)
            rows = bench.populate("f", args.rows)
            bench.arrange(args.arrangement)
            runs = [
                sync_once(bench, side, mode, rep, rows)
                for rep, side in compare.interleaved(both, args.reps)
                for mode in MODES
            ]
    report(runs, labels)
    print(f"\n{common.BUSY_NOTE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
