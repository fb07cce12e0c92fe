"""This checkout against another revision, on the same machine, in one run, interleaved: ratios new/old.

    uv run python bench/compare.py --against REV [--new REV] [--feeders 100] [--rows 2000] [--reps 3] [--dumps 10]

"new" is the checkout this script runs from (its working tree, uncommitted changes included, with the Python of
`uv run`), or with `--new REV2` that revision, built as REV is (then editing the working tree during the run
changes nothing); "old" is REV, checked out with `git worktree add --detach` into a temporary directory and given
its own environment there by `uv sync --frozen --no-dev --compile-bytecode` (REV's lock file, REV's dependencies). Each
side runs its own interpreter, `TREE/.venv/bin/python -m fedload ...`, and everything fedload starts from it runs
that interpreter too (a local agent is `sys.executable -m fedload`, a worker `sys.executable -m
fedload.service.worker` or a fork), so REV's code is what runs in its agents and workers. Each side's commands run
in its own tree, as `python -m` puts the current directory first on sys.path (run from this checkout, the old
side's `-m fedload` would import this checkout's code); the script checks that each interpreter imports
`fedload` and `transforms` from its own tree there, with PYTHONPATH removed from the environment. Both trees and
both environments get their bytecode compiled first (this machine sets PYTHONDONTWRITEBYTECODE, see bench/README.md),
so neither side pays for compiling.

The workload is bench_scale.py's: --feeders feeder databases of --rows rows in `hosts` and `contexts` (with its
schema drift) over three feeder clusters, local transport, `max_parallel_feeders = --parallel`. One repetition of a
side: a fresh superhub database, `fedload sync` (round 1: every partition new), then every third feeder's data
changes (5 hosts set aside, 37 contexts added), `fedload sync` again (round 2: every partition swapped) with
bench_scale's reader counting each parent by feeder in a loop (each count must be the feeder's old or new one),
then the change is undone and the database dropped, so every repetition of either side loads the same rows. After
the repetitions: --dumps one-table agent dumps per side (`fedload agent dump --quiet` of feeder 1's `contexts`,
stdout a pipe read by this script), the sides alternating.

Interleaved: repetition i runs new then old for even i, old then new for odd i (A B B A ...), so a machine that
gets busier or quieter during the run weighs on both alike. Printed per measure: each side's median and range,
the ratio of the medians new/old, and the range of the per-repetition ratios (the spread). Any failed run, count
mismatch or torn total is printed and makes the exit status 1.

`--pin`: the feeder clusters and the agents (with their pg_dump) on CPU 0, the superhub cluster and `fedload sync`
on CPU 1, as bench_e2e.py's pinned arrangement (agents through `agent_command = ["taskset", "-c", "0", ...]`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import bench_scale
import common

from fedload.localpg import LocalCluster
from transforms.cli import positive_int

REPO = Path(__file__).resolve().parent.parent
CHANGE_ON = """
CREATE TABLE IF NOT EXISTS hosts_aside (LIKE hosts);
WITH moved AS (DELETE FROM hosts WHERE hostkey IN (SELECT hostkey FROM hosts ORDER BY hostkey LIMIT 5) RETURNING *)
INSERT INTO hosts_aside SELECT * FROM moved;
INSERT INTO contexts (hostkey, contextname, tags, score) SELECT 'SHA=new', 'new_' || g, NULL, g
FROM generate_series(1, 37) g;
"""
CHANGE_OFF = """
INSERT INTO hosts SELECT * FROM hosts_aside;
TRUNCATE hosts_aside;
DELETE FROM contexts WHERE hostkey = 'SHA=new';
"""
DUMP_TABLE = "public.contexts"


@dataclass(frozen=True, slots=True)
class Side:
    """One of the two compared checkouts: its tree and the interpreter of its own environment."""

    name: str
    label: str
    tree: Path
    python: Path

    def argv(self, cpu: str | None) -> list[str]:
        """The interpreter's command line, under `taskset -c cpu` if given."""
        return [*(["taskset", "-c", cpu] if cpu else []), str(self.python)]


@dataclass
class Samples:
    """The measures of one side, one value per repetition (or per dump)."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, measure: str, value: float) -> None:
        """Record one value."""
        self.values.setdefault(measure, []).append(value)


def git(*args: str, cwd: Path = REPO) -> str:
    """A git command's output; exits with its error if it fails."""
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def run_checked(argv: Sequence[str], cwd: Path, what: str) -> None:
    """Run a build step; exit with its output if it fails."""
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False, env=child_env())
    if result.returncode != 0:
        sys.exit(f"{what} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")


def child_env() -> dict[str, str]:
    """The environment of every command started here: no PYTHONPATH or VIRTUAL_ENV that could mix the trees."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


@contextmanager
def built_side(name: str, rev: str, keep: bool) -> Iterator[Side]:
    """REV in a temporary worktree with its own environment; removed at the end unless `keep`."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = Path(tempfile.mkdtemp(prefix=f"fedload-compare-{commit[:10]}-"))
    git("worktree", "add", "--detach", str(tree), commit)
    try:
        uv = shutil.which("uv") or sys.exit("uv not found: it builds REV's environment")
        print(f"building {rev} ({commit[:10]}) in {tree} ...", flush=True)
        python = getattr(sys, "_base_executable", sys.executable)  # the same interpreter as this side's
        build = [uv, "sync", "--frozen", "--no-dev", "--compile-bytecode", "--quiet", "--python", python]
        run_checked(build, tree, "uv sync of REV")
        yield Side(name, f"{rev} ({commit[:10]})", tree, tree / ".venv" / "bin" / "python")
    finally:
        if keep:
            print(f"kept {tree} (remove with: git worktree remove --force {tree})")
        else:
            git("worktree", "remove", "--force", str(tree))


@contextmanager
def new_side(rev: str | None, keep: bool) -> Iterator[Side]:
    """REV built as `built_side` does, or by default this checkout with the interpreter running this script."""
    if rev is not None:
        with built_side("new", rev, keep) as side:
            yield side
        return
    head = git("rev-parse", "--short=10", "HEAD")
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    yield Side("new", f"working tree ({head}{dirty})", REPO, Path(sys.executable))


def prepare(side: Side) -> None:
    """Compile the side's bytecode (its tree and its environment) and check it imports fedload from its tree."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run(
        [str(side.python), "-c", code], capture_output=True, text=True, check=True, env=child_env()
    ).stdout.strip()
    compile_all = [str(side.python), "-m", "compileall", "-q", "-j", "0"]
    run_checked([*compile_all, "fedload", "transforms", purelib], side.tree, f"compileall ({side.name})")
    code = "import fedload, transforms; print(fedload.__file__); print(transforms.__file__)"
    found = subprocess.run(  # from the side's tree, as its commands run: `-m` and `-c` import from there first
        [str(side.python), "-c", code], capture_output=True, text=True, check=True, cwd=side.tree, env=child_env()
    ).stdout.split()
    if not all(Path(path).resolve().is_relative_to(side.tree.resolve()) for path in found):
        sys.exit(f"the {side.name} interpreter {side.python} imports {found}, not from {side.tree}")


def toggle(feeders: bench_scale.Feeders, numbers: Sequence[int], *, on: bool) -> None:
    """Apply (on) or undo the change of round 2 on the given feeders, one psql script per cluster."""
    scripts: dict[int, list[str]] = {}
    for i in numbers:
        scripts.setdefault(i % len(feeders.clusters), []).append(f"\\c f{i}\n{CHANGE_ON if on else CHANGE_OFF}")
    for index, parts in scripts.items():
        feeders.clusters[index].psql("".join(parts))


def changed_counts(old: bench_scale.Counts, numbers: Sequence[int]) -> bench_scale.Counts:
    """The counts after CHANGE_ON on the given feeders."""
    new = dict(old)
    for i in numbers:
        for table, delta in bench_scale.CHANGE_DELTA.items():
            new[table, i] += delta
    return new


@dataclass(frozen=True, slots=True)
class Setup:
    """What every repetition of either side shares."""

    feeders: bench_scale.Feeders
    superhub: LocalCluster
    count: int
    parallel: int
    work: Path
    pin: bool


def config_text(setup: Setup, side: Side, db: str, schema: Path) -> str:
    """bench_scale's configuration, with the agents under `taskset -c 0` when pinned."""
    numbers = list(range(1, setup.count + 1))
    text = setup.feeders.config_toml(numbers, setup.superhub, db, schema, setup.parallel)
    if setup.pin:
        agent = json.dumps([*side.argv("0"), "-m", "fedload"])
        text = text.replace('transport = "local"\n', f'transport = "local"\nagent_command = {agent}\n')
    return text


def scale_once(setup: Setup, side: Side, rep: int, samples: Samples) -> list[str]:
    """One repetition of the two rounds for a side; the problems seen (failures, wrong counts, torn totals)."""
    numbers = list(range(1, setup.count + 1))
    old = {k: v for k, v in setup.feeders.counts.items() if k[1] <= setup.count}
    changed = numbers[::3]
    new = changed_counts(old, changed)
    db = f"cmp_{side.name}_{rep}"
    setup.superhub.psql(f"CREATE DATABASE {db}")
    schema = setup.work / "schema.sql"
    schema.write_text(bench_scale.SCHEMA)
    config = setup.work / f"{db}.toml"
    config.write_text(config_text(setup, side, db, schema))
    dsn = setup.superhub.dsn(db)
    python = side.argv("1" if setup.pin else None)
    server = common.postmaster_pid(setup.superhub)
    feeder_servers = [common.postmaster_pid(cluster) for cluster in setup.feeders.clusters]
    cpu_before, feeders_before = common.tree_cpu_seconds(server), _cpu(feeder_servers)
    first = bench_scale.run_round(config, dsn, setup.count, 1, None, python=python, cwd=side.tree)
    cpu_first, feeders_first = common.tree_cpu_seconds(server), _cpu(feeder_servers) - feeders_before
    got = bench_scale.superhub_counts(setup.superhub, db)
    problems = [*first.failures, *bench_scale.check_counts(f"{side.name} rep {rep} round 1", got, old)]
    toggle(setup.feeders, changed, on=True)
    try:
        cpu_before_second, feeders_before = common.tree_cpu_seconds(server), _cpu(feeder_servers)
        second = bench_scale.run_round(config, dsn, setup.count, 2, (old, new), python=python, cwd=side.tree)
        cpu_second = common.tree_cpu_seconds(server) - cpu_before_second
        feeders_second = _cpu(feeder_servers) - feeders_before
    finally:
        toggle(setup.feeders, changed, on=False)
    got = bench_scale.superhub_counts(setup.superhub, db)
    problems += [*second.failures, *bench_scale.check_counts(f"{side.name} rep {rep} round 2", got, new)]
    problems += [f"{side.name} rep {rep} torn total: {t}" for t in second.seen.torn]
    setup.superhub.psql(f"DROP DATABASE {db} WITH (FORCE)")
    for r, server_cpu, feeders_cpu in (
        (first, cpu_first - cpu_before, feeders_first),
        (second, cpu_second, feeders_second),
    ):
        samples.add(f"round {r.number} s", r.seconds)
        samples.add(f"round {r.number} CPU s (sync+agents)", r.cpu_s)
        samples.add(f"round {r.number} superhub server CPU s", server_cpu)
        samples.add(f"round {r.number} feeder servers CPU s", feeders_cpu)
    samples.add("round 2 reader p99 ms", bench_scale.percentile(second.seen.latencies_s, 99) * 1000)
    print(f"  {side.name} rep {rep}: round 1 {first.seconds:.2f} s, round 2 {second.seconds:.2f} s", flush=True)
    return [f"{side.name} rep {rep}: {p}" for p in problems]


def _cpu(postmasters: Sequence[int]) -> float:
    """CPU seconds of these servers' process trees (pg_dump's backends, once they exit, included)."""
    return sum(common.tree_cpu_seconds(pid) for pid in postmasters)


def dump_once(setup: Setup, side: Side, samples: Samples) -> list[str]:
    """One `fedload agent dump` of one table of feeder 1, timed."""
    cluster = setup.feeders.cluster_of(1)
    argv = [*side.argv("0" if setup.pin else None), "-m", "fedload", "agent", "dump", "--quiet"]
    argv += ["--database", cluster.conninfo("f1"), "--table", DUMP_TABLE, "--pg-dump", cluster.install.tool("pg_dump")]
    measured = common.run_measured(argv, cwd=side.tree)
    samples.add("agent dump s (one table)", measured.seconds)
    return [] if measured.status == 0 else [f"{side.name}: agent dump exited {measured.status}"]


def interleaved(sides: Sequence[Side], times: int) -> Iterator[tuple[int, Side]]:
    """(i, side) for i in range(times): both sides each time, the order reversed every other time."""
    for i in range(times):
        for side in sides if i % 2 == 0 else reversed(sides):
            yield i, side


def spread(values: Sequence[float]) -> str:
    """min-max of the values."""
    return f"{min(values):.3g}-{max(values):.3g}"


def report(sides: Sequence[Side], samples: dict[str, Samples], reps: int, dumps: int) -> None:
    """The comparison table: medians, ratio of the medians, spread of the paired ratios."""
    new, old = (samples[s.name] for s in sides)
    rows = []
    for measure, new_values in new.values.items():
        old_values = old.values[measure]
        ratios = [n / o for n, o in zip(new_values, old_values, strict=True) if o]
        median_old = statistics.median(old_values)
        rows.append(
            [
                measure,
                len(new_values),
                f"{statistics.median(new_values):.3f} ({spread(new_values)})",
                f"{median_old:.3f} ({spread(old_values)})",
                common.fmt_ratio(statistics.median(new_values) / median_old) if median_old else "-",
                spread(ratios) if ratios else "-",
            ]
        )
    common.print_table(
        f"new = {sides[0].label}\nold = {sides[1].label}\n{reps} repetitions of the rounds, {dumps} dumps, interleaved",
        ["measure", "n", "new median (range)", "old median (range)", "new/old", "paired ratios (range)"],
        rows,
    )


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, metavar="REV", help="the revision to compare with (old)")
    parser.add_argument("--new", metavar="REV", help="a revision as new (default: this working tree)")
    parser.add_argument("--feeders", type=positive_int, default=100, help="feeders per round (default 100)")
    parser.add_argument("--rows", type=positive_int, default=2000, help="rows per feeder (default 2000)")
    parser.add_argument("--reps", type=positive_int, default=3, help="repetitions of the two rounds (default 3)")
    parser.add_argument("--dumps", type=int, default=10, help="one-table agent dumps per side (default 10)")
    parser.add_argument("--parallel", type=positive_int, default=2, help="max_parallel_feeders (default 2)")
    parser.add_argument("--pin", action="store_true", help="feeder side on CPU 0, superhub side on CPU 1")
    parser.add_argument("--keep-build", action="store_true", help="keep the temporary worktrees")
    common.add_common_arguments(parser)
    return parser.parse_args()


def pin_clusters(setup: Setup) -> None:
    """The feeder clusters' servers on CPU 0, the superhub's on CPU 1."""
    for cluster in setup.feeders.clusters:
        common.pin_tree(common.postmaster_pid(cluster), "0")
    common.pin_tree(common.postmaster_pid(setup.superhub), "1")


def main() -> int:
    """Build REV, create the feeders once, run the sides interleaved, print the ratios; 1 on any problem."""
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up (clusters, worktrees) when stopped
    os.environ.pop("PYTHONPATH", None)
    print(common.machine_line())
    with (
        new_side(args.new, args.keep_build) as new,
        built_side("old", args.against, args.keep_build) as old,
        common.Workspace(common.pick_install(args.pg_major)) as work,
    ):
        sides = [new, old]
        for side in sides:
            prepare(side)
        print(f"PostgreSQL {work.install.major}; new = {new.label}; old = {old.label}")
        feeders = bench_scale.Feeders([work.cluster(f"feeders{c}") for c in range(1, 4)])
        setup = Setup(feeders, work.cluster("superhub"), args.feeders, args.parallel, work.dir, args.pin)
        if args.pin:
            pin_clusters(setup)
        print(f"creating {args.feeders} feeders x ~{args.rows} rows ...", flush=True)
        feeders.create(args.feeders, args.rows)
        samples = {s.name: Samples() for s in sides}
        problems = []
        for rep, side in interleaved(sides, args.reps):
            problems += scale_once(setup, side, rep, samples[side.name])
        for _, side in interleaved(sides, args.dumps):
            problems += dump_once(setup, side, samples[side.name])
    report(sides, samples, args.reps, args.dumps)
    for problem in problems[:40]:
        print(f"PROBLEM {problem}")
    print(f"\n{common.BUSY_NOTE}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
