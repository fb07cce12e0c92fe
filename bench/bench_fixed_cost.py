"""Where a run's fixed time goes: per phase, and the superhub's CPU against the feeders', pinned.

    uv run python bench/bench_fixed_cost.py [--feeders 100] [--rows 2000] [--parallel 2]

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
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import bench_scale
import common

from fedload.localpg import LocalCluster
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


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--feeders", type=positive_int, default=100, help="feeders (default 100)")
    parser.add_argument("--rows", type=positive_int, default=2000, help="rows per feeder (default 2000)")
    parser.add_argument("--parallel", type=positive_int, default=2, help="max_parallel_feeders (default 2)")
    common.add_common_arguments(parser)
    return parser.parse_args()


def main() -> int:
    """Create the feeders, pin, run two rounds, report."""
    args = parse_args()
    print(common.machine_line())
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
