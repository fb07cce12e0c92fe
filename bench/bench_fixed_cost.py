"""Where a run's fixed time goes: per phase, and the superhub's CPU against the feeders', pinned.

    uv run python bench/bench_fixed_cost.py [--feeders 100] [--rows 2000] [--parallel 2]
    uv run python bench/bench_fixed_cost.py --ssh-reuse [--runs 20] [--repeat 3] [--rows 2000]

bench_scale.py's feeders (two tables, ~2,000 rows, local transport), two `fedload sync` rounds into a fresh
superhub database (round 1: every partition new; round 2: every partition swapped), in bench_e2e.py's pinned
arrangement: the feeder clusters and every agent (with its pg_dump) on CPU 0, the superhub cluster and `fedload
sync` (with its workers) on CPU 1. Each agent runs under GNU time (`agent_command = ["taskset", "-c", "0",
"/usr/bin/time", ...]`), which records its wall and CPU seconds, pg_dump included.

Measured per round:
- CPU seconds by side: the superhub cluster (`common.tree_cpu_seconds` of its postmaster, before and after), the
  sync process with its workers (wait4's rusage, less the agents' own), the agents and their pg_dump (GNU time),
  the feeder clusters (their trees);
- per run: the run's wall (the sync's JSON), the agent's wall (GNU time: from its start to its exit, pg_dump's
  start and the transport included), and the superhub server's time by phase: every statement the run's session
  and the history connection sent (`log_min_duration_statement = 0`; parse, bind and execute steps counted
  apart), sorted into session (reset, locks, BEGIN, savepoints), COMMIT, bookkeeping checks, catalog reads, staging
  DDL, COPY, index/constraints, the swap, ANALYZE and the history writes; with the number of statements (round
  trips) per run.

`--ssh-reuse`: the fixed cost of a small SSH feeder's run with and without its kept connection
(fedload.transport.kept_ssh). One feeder of `--rows` rows reached over the loopback sshd (its sessions, the agents,
on CPU 0), runs one after the other in this process as in a worker (superhub sessions kept, and the superhub on
CPU 1 with this process): `--runs` runs each way after one warm-up run, the ways interleaved `--repeat` times. Per
run: the wall, this process's CPU (the superhub side of the SSH handshake: key exchange, host key check, auth),
the superhub server's and the feeder side's (sshd and its sessions: the agent, pg_dump). Then the pool's choice of
worker (`workers._affine`) against the plain last-idle one, replayed on a daemon's schedule: the share of runs that
find their feeder's connection kept in the worker they get.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import time
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import bench_scale
import common

from fedload.config import parse_config
from fedload.localpg import LocalCluster
from fedload.log import configure_logging
from fedload.results import Outcome
from fedload.superhub.bookkeeping.connection import Bookkeeping, RunHistory
from fedload.superhub.job import Job, feeder_job, parents_spec, superhub_target
from transforms.cli import positive_int

FEEDER_CPU, SUPERHUB_CPU = "0", "1"
_ENTRY = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[(\d+)\] ([^:]*): ", re.MULTILINE)
_DURATION = re.compile(r"duration: ([0-9.]+) ms\s+(statement|execute [^:]*|parse [^:]*|bind [^:]*):\s*(.*)", re.S)
# The phase a statement belongs to: the first pattern its text matches (upper case; order matters).
PHASES = [
    ("history", r"FEDLOAD\.(RUNS|REJECTS|SCHEDULE|RUN_TABLES)\b"),
    ("bookkeeping check", r"FEDLOAD SCHEMA|FEDLOAD\.MOVED|PG_AVAILABLE_EXTENSIONS"),
    ("ANALYZE", r"^ANALYZE"),
    ("COPY", r"^COPY |^INSERT INTO \"FEDLOAD_STAGE\""),
    ("staging DDL", r"^CREATE (UNLOGGED )?TABLE \"FEDLOAD_STAGE\"|^DROP TABLE.*FEDLOAD_STAGE"),
    ("index/constraints", r"ADD PRIMARY KEY|ADD CONSTRAINT|^CREATE (UNIQUE )?INDEX|ADD UNIQUE"),
    ("swap", r"^LOCK |DETACH PARTITION|ATTACH PARTITION|SET SCHEMA|RENAME TO|LOCK_TIMEOUT|^DROP TABLE|RELPARTBOUND"),
    ("catalog", r"PG_CATALOG|PG_CLASS|PG_ATTRIBUTE|PG_INDEX|PG_CONSTRAINT|SEARCH_PATH|TO_REGCLASS|PG_INHERITS"),
    ("commit", r"^COMMIT"),
    ("session", r"ADVISORY|APPLICATION_NAME|^BEGIN|^ROLLBACK|SAVEPOINT|^RESET|^SET |^CLOSE|^UNLISTEN|PG_ADVI"),
]
_PHASES = [(name, re.compile(pattern)) for name, pattern in PHASES]


def phase_of(text: str) -> str:
    """The phase of a statement's text."""
    upper = " ".join(text.split()).upper()
    return next((name for name, pattern in _PHASES if pattern.search(upper)), "other")


@dataclass
class ServerTime:
    """The server's statement time of one round, by phase."""

    ms: defaultdict[str, float]
    statements: Counter[str]  # statements (a statement or an execute step: one round trip each)
    steps: Counter[str]  # parse, bind, execute and statement log entries


def server_time(log_text: str, sessions: Iterable[str]) -> ServerTime:
    """Sum the durations of the log's entries by phase, for the sessions whose application name is given."""
    wanted = set(sessions)
    ms: defaultdict[str, float] = defaultdict(float)
    statements, steps = Counter[str](), Counter[str]()
    names: dict[tuple[str, str], str] = {}  # (pid, prepared statement name) -> its text, from the parse step
    starts = list(_ENTRY.finditer(log_text))
    for match, following in zip(starts, [*starts[1:], None], strict=True):
        pid, app = match.group(1), match.group(2)
        body = log_text[match.end() : following.start() if following else len(log_text)]
        found = _DURATION.search(body.split("\nDETAIL:", 1)[0].split("\n\tDETAIL:", 1)[0])
        if app not in wanted or found is None:
            continue
        step, text = found.group(2), found.group(3)
        kind, _, name = step.partition(" ")
        if kind == "parse":
            names[pid, name] = text
        text = text.strip() or names.get((pid, name), "")
        phase = phase_of(text)
        ms[phase] += float(found.group(1))
        steps[phase] += 1
        if kind in ("statement", "execute"):
            statements[phase] += 1
    return ServerTime(ms, statements, steps)


@dataclass
class RoundResult:
    """What one pinned round measured."""

    number: int
    seconds: float
    runs: list[dict[str, object]]
    cpu: dict[str, float]
    agent_wall_s: list[float]
    server: ServerTime


def agents_usage(record: Path) -> tuple[list[float], float]:
    """The agents' walls and their total CPU seconds from GNU time's lines "%e %U %S"; the file is emptied."""
    walls, cpu = [], 0.0
    for line in record.read_text().splitlines() if record.exists() else []:
        parts = line.split()
        if len(parts) == 3 and all(p.replace(".", "", 1).isdigit() for p in parts):
            walls.append(float(parts[0]))
            cpu += float(parts[1]) + float(parts[2])
    record.write_text("")
    return walls, cpu


@dataclass(frozen=True, slots=True)
class Bench:
    """The clusters and files of the measurement."""

    superhub: LocalCluster
    feeders: bench_scale.Feeders
    count: int
    config: Path
    db: str
    record: Path


def run_pinned_round(bench: Bench, number: int) -> RoundResult:
    """One `fedload sync` on CPU 1, its CPU by side and the server's time by phase."""
    superhub_pid = common.postmaster_pid(bench.superhub)
    feeder_pids = [common.postmaster_pid(c) for c in bench.feeders.clusters]
    log = bench.superhub.dir / "server.log"
    offset = log.stat().st_size
    hub_before = common.tree_cpu_seconds(superhub_pid)
    feeders_before = sum(common.tree_cpu_seconds(p) for p in feeder_pids)
    python = ["taskset", "-c", SUPERHUB_CPU, sys.executable]
    result = bench_scale.run_round(bench.config, bench.superhub.dsn(bench.db), bench.count, number, None, python=python)
    walls, agents_cpu = agents_usage(bench.record)
    cpu = {
        "superhub server": common.tree_cpu_seconds(superhub_pid) - hub_before,
        "fedload sync + workers": result.cpu_s - agents_cpu,
        "agents + pg_dump": agents_cpu,
        "feeder servers": sum(common.tree_cpu_seconds(p) for p in feeder_pids) - feeders_before,
    }
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    sessions = [f"fedload f{i}" for i in range(1, bench.count + 1)] + ["fedload history", "fedload"]
    runs = json.loads(bench.config.with_suffix(f".round{number}.json").read_text() or "[]")
    if result.failures:
        sys.exit(f"round {number} failed: {result.failures[:5]}")
    return RoundResult(number, result.seconds, runs, cpu, walls, server_time(text, sessions))


def report(rounds: list[RoundResult], count: int) -> None:
    """The CPU table and the per-run phase table."""
    common.print_table(
        f"CPU seconds by side, {count} feeders (feeder side on CPU {FEEDER_CPU}, superhub side on {SUPERHUB_CPU})",
        ["round", "wall s", *rounds[0].cpu, "superhub share"],
        [
            [
                r.number,
                f"{r.seconds:.2f}",
                *(f"{v:.2f}" for v in r.cpu.values()),
                f"{(r.cpu['superhub server'] + r.cpu['fedload sync + workers']) / sum(r.cpu.values()):.0%}",
            ]
            for r in rounds
        ],
    )
    rows = [
        [name, *(f"{r.server.ms[name] / count:.2f} ms / {r.server.statements[name] / count:.1f}" for r in rounds)]
        for name in [*(p for p, _ in PHASES), "other"]
    ]
    rows.append(
        ["all statements"]
        + [
            f"{sum(r.server.ms.values()) / count:.2f} ms / {sum(r.server.statements.values()) / count:.1f}"
            for r in rounds
        ]
    )
    for label, pick in (
        ("run wall (median)", lambda r: statistics.median(float(str(x["seconds"])) for x in r.runs)),
        ("agent wall (median)", lambda r: statistics.median(r.agent_wall_s or [0.0])),
    ):
        rows.append([label] + [f"{pick(r) * 1000:.0f} ms" for r in rounds])
    common.print_table(
        "per run: superhub server time / statements (round trips), by phase; run and agent wall",
        ["phase", *(f"round {r.number}" for r in rounds)],
        rows,
    )


@dataclass
class ReuseRuns:
    """The runs of one way (kept connections or not) of one repetition: per-run figures."""

    walls: list[float]
    cpu: dict[str, float]  # CPU seconds of the runs by side, summed


async def ssh_runs(job: Job, runs: int, *, kept: bool, sides: dict[str, int], history: RunHistory) -> ReuseRuns:
    """One warm-up run, then `runs` runs of the job one after the other, SSH connections kept or not."""
    from fedload.superhub.pipeline import sync_feeder  # noqa: PLC0415 - after the pinning of this process
    from fedload.transport.kept_ssh import SshKeeper, close_kept_ssh, keep_ssh  # noqa: PLC0415

    def cpu() -> dict[str, float]:
        return {name: common.tree_cpu_seconds(pid) for name, pid in sides.items()} | {"fedload": common.cpu_seconds()}

    async def one() -> float:
        started = time.monotonic()
        run = await sync_feeder(job, history=history)
        if run.outcome is not Outcome.SUCCESS:
            sys.exit(f"a run failed: {run.error}")
        return time.monotonic() - started

    keep_ssh(SshKeeper() if kept else None)
    try:
        await one()  # warm-up: the parents' cache, and with `kept` the connection to keep
        before = cpu()
        walls = [await one() for _ in range(runs)]
        after = cpu()
    finally:
        await close_kept_ssh()
    return ReuseRuns(walls, {name: after[name] - before[name] for name in after})


async def measure_reuse(job: Job, runs: int, repeat: int, sides: dict[str, int]) -> dict[bool, list[ReuseRuns]]:
    """Both ways, interleaved, `repeat` times; the superhub's sessions kept as a worker keeps them, the history
    written on one connection as the daemon's."""
    from fedload.superhub.kept_sessions import close_kept, keep_sessions  # noqa: PLC0415

    keep_sessions()
    history = Bookkeeping()
    results: dict[bool, list[ReuseRuns]] = {False: [], True: []}
    try:
        for number in range(repeat):
            for kept in (False, True) if number % 2 == 0 else (True, False):
                print(f"  repetition {number + 1}, {'kept' if kept else 'new'} connections ...", flush=True)
                results[kept].append(await ssh_runs(job, runs, kept=kept, sides=sides, history=history))
    finally:
        await close_kept()
        await history.close()
    return results


def report_reuse(results: dict[bool, list[ReuseRuns]], runs: int) -> None:
    """Per run, median over the repetitions: wall and CPU by side, each way, and kept / new."""
    sides = list(results[False][0].cpu)

    def per_run(kept: bool, side: str | None) -> float:
        if side is None:
            return statistics.median(statistics.median(r.walls) for r in results[kept])
        return statistics.median(r.cpu[side] / runs for r in results[kept])

    rows = []
    for label, side in [("wall (median)", None), *((f"CPU {s}", s) for s in sides)]:
        new, kept = per_run(False, side), per_run(True, side)
        rows.append([label, f"{new * 1000:.1f} ms", f"{kept * 1000:.1f} ms", f"{kept / new:.2f}x" if new else "-"])
    superhub_new = per_run(False, "fedload") + per_run(False, "superhub server")
    superhub_kept = per_run(True, "fedload") + per_run(True, "superhub server")
    rows.append(
        [
            "CPU superhub side (fedload + server)",
            f"{superhub_new * 1000:.1f} ms",
            f"{superhub_kept * 1000:.1f} ms",
            f"{superhub_kept / superhub_new:.2f}x",
        ]
    )
    common.print_table(
        f"per run of one small SSH feeder, {runs} runs x {len(results[False])} repetitions (median)",
        ["", "new connection", "kept connection", "kept / new"],
        rows,
    )


def placement_share(
    feeders: int, workers: int, *, affinity: bool, interval_s: float, run_s: tuple[float, float], seed: int
) -> float:
    """The share of runs that find their feeder's connection kept in the worker they get, on a daemon's schedule
    (each feeder due `interval_s` after its run ends, jitter 10 %; a free lane to the due feeder waiting longest;
    lanes = workers), the worker chosen by the pool's `_affine` or, without affinity, the last idle one. A worker
    keeps the connections of the `MAX_IDLE` feeders it ran last, each for `IDLE_S`."""
    from types import SimpleNamespace  # noqa: PLC0415

    from fedload.service import workers as pool  # noqa: PLC0415
    from fedload.transport.kept_ssh import IDLE_S, MAX_IDLE  # noqa: PLC0415

    rng = random.Random(seed)
    idle: list[SimpleNamespace] = [SimpleNamespace(recent=[], last={}) for _ in range(workers)]
    due = {f: rng.uniform(0, interval_s) for f in range(feeders)}
    running: list[tuple[float, int, SimpleNamespace]] = []
    now, reused, total = 0.0, 0, 0
    while total < 5000:
        for end, feeder, worker in [r for r in running if r[0] <= now]:
            running.remove((end, feeder, worker))
            worker.recent = [*[f for f in worker.recent if f != feeder], feeder][-MAX_IDLE:]
            worker.last[feeder] = end
            idle.append(worker)
            due[feeder] = end + interval_s * rng.uniform(0.9, 1.1)
        busy = {f for _, f, _ in running}
        for feeder in sorted((f for f in due if due[f] <= now and f not in busy), key=due.__getitem__):
            if not idle:
                break
            worker = idle.pop(pool._affine(idle, feeder) if affinity else -1)  # type: ignore[arg-type]
            total += 1
            reused += feeder in worker.recent and now - worker.last.get(feeder, -IDLE_S) < IDLE_S
            running.append((now + rng.uniform(*run_s), feeder, worker))
        upcoming = [e for e, _, _ in running] + [d for f, d in due.items() if d > now and f not in busy]
        now = max(now + 0.001, min(upcoming, default=now + 0.1))
    return reused / total


def report_placement() -> None:
    """The share of runs on a kept connection, with and without the pool's feeder affinity."""
    rows = []
    for feeders, workers in ((10, 2), (10, 4), (40, 4), (100, 4)):
        shares = [
            statistics.mean(
                placement_share(feeders, workers, affinity=a, interval_s=1.0, run_s=(0.1, 0.4), seed=s)
                for s in range(5)
            )
            for a in (False, True)
        ]
        rows.append([feeders, workers, f"{shares[0]:.0%}", f"{shares[1]:.0%}"])
    common.print_table(
        "runs that find their feeder's connection kept (interval 1 s, runs 0.1-0.4 s, 5,000 runs x 5 seeds)",
        ["feeders", "workers (lanes)", "last idle worker", "feeder affinity"],
        rows,
    )


def run_ssh_reuse(args: argparse.Namespace) -> int:
    """--ssh-reuse: one small SSH feeder's runs with and without its kept connection; then the placement."""
    configure_logging(level="warning")
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        superhub = work.cluster("superhub")
        feeders = bench_scale.Feeders([work.cluster("feeders1")])
        feeders.create(1, args.rows)
        sshd = work.sshd()
        common.pin_tree(common.postmaster_pid(feeders.clusters[0]), FEEDER_CPU)
        common.pin_tree(sshd.process.pid, FEEDER_CPU)
        common.pin_tree(common.postmaster_pid(superhub), SUPERHUB_CPU)
        common.pin_tree(os.getpid(), SUPERHUB_CPU)
        superhub.psql("CREATE DATABASE superhub_fixed")
        schema = work.dir / "schema.sql"
        schema.write_text(bench_scale.SCHEMA)
        text = feeders.config_toml([1], superhub, "superhub_fixed", schema, 1)
        ssh = sshd.ssh_config()
        agent = json.dumps([sys.executable, "-m", "fedload"])
        text = text.replace('transport = "local"\n', f'transport = "ssh"\nagent_command = {agent}\n')
        text += "[feeders.f1.ssh]\n" + "".join(
            f"{key} = {json.dumps(str(value) if key in ('identity', 'known_hosts') else value)}\n"
            for key, value in ssh.model_dump(exclude_none=True).items()
        )
        config = parse_config(tomllib.loads(text))
        from fedload.superhub.session import prepare_superhub  # noqa: PLC0415

        asyncio.run(prepare_superhub(superhub_target(config), parents_spec(config)))
        sides = {"superhub server": common.postmaster_pid(superhub), "feeder side (sshd, agent)": sshd.process.pid}
        results = asyncio.run(measure_reuse(feeder_job(config, "f1"), args.runs, args.repeat, sides))
    report_reuse(results, args.runs)
    report_placement()
    print(f"\n{common.BUSY_NOTE}")
    return 0


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--feeders", type=positive_int, default=100, help="feeders (default 100)")
    parser.add_argument("--rows", type=positive_int, default=2000, help="rows per feeder (default 2000)")
    parser.add_argument("--parallel", type=positive_int, default=2, help="max_parallel_feeders (default 2)")
    parser.add_argument(
        "--ssh-reuse", action="store_true", help="one SSH feeder's runs with and without its kept connection"
    )
    parser.add_argument("--runs", type=positive_int, default=20, help="--ssh-reuse: runs each way (default 20)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="--ssh-reuse: repetitions (default 3)")
    common.add_common_arguments(parser)
    return parser.parse_args()


def main() -> int:
    """Create the feeders, pin, run two rounds, report."""
    args = parse_args()
    print(common.machine_line())
    if args.ssh_reuse:
        return run_ssh_reuse(args)
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        superhub = work.cluster("superhub")
        feeders = bench_scale.Feeders([work.cluster(f"feeders{c}") for c in range(1, 4)])
        print(f"creating {args.feeders} feeders x ~{args.rows} rows ...", flush=True)
        feeders.create(args.feeders, args.rows)
        superhub.psql(
            "ALTER SYSTEM SET log_min_duration_statement = 0; ALTER SYSTEM SET log_line_prefix = '%m [%p] %a: ';"
            "SELECT pg_reload_conf();"
        )
        for cluster in feeders.clusters:
            common.pin_tree(common.postmaster_pid(cluster), FEEDER_CPU)
        common.pin_tree(common.postmaster_pid(superhub), SUPERHUB_CPU)
        db = "superhub_fixed"
        superhub.psql(f"CREATE DATABASE {db}")
        schema, record = work.dir / "schema.sql", work.dir / "agents.time"
        schema.write_text(bench_scale.SCHEMA)
        numbers = list(range(1, args.feeders + 1))
        agent = ["taskset", "-c", FEEDER_CPU, "/usr/bin/time", "-a", "-o", str(record), "-f", "%e %U %S"]
        agent += [sys.executable, "-m", "fedload"]
        text = feeders.config_toml(numbers, superhub, db, schema, args.parallel)
        text = text.replace('transport = "local"\n', f'transport = "local"\nagent_command = {json.dumps(agent)}\n')
        config = work.dir / "fixed.toml"
        config.write_text(text)
        bench = Bench(superhub, feeders, args.feeders, config, db, record)
        rounds = []
        for number in (1, 2):
            print(f"  round {number} ...", flush=True)
            rounds.append(run_pinned_round(bench, number))
            if number == 1:
                feeders.change(numbers[::3])
    report(rounds, args.feeders)
    print(f"\n{common.BUSY_NOTE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
