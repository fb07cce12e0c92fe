"""Where the superhub side spends CPU: one `fedload sync` under cProfile, plus the server's statement log.

    uv run --group bench python bench/profile_sync.py [--feeders 4] [--rows 300000] [--modes copy,inserts]

The same feeders and config as bench_e2e.py (one feeder cluster, feeders over the loopback sshd, agents on the
"feeder"); the superhub cluster logs every statement with its duration (`log_min_duration_statement = 0`). For
each mode, `python -m cProfile -o OUT.prof -m fedload sync --json --config ...` runs once into a fresh superhub
database. Printed per mode: the wall time, the top functions by cumulative and by own time (pstats), and the
server's time by statement kind (from the log). The .prof files and the server log stay in --out (default
bench/out/profile) for `python -m pstats` or snakeviz.
"""

from __future__ import annotations

import argparse
import io
import os
import pstats
import re
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import bench_e2e
import common

from transforms.cli import positive_int

HERE = Path(__file__).resolve().parent
_DURATION = re.compile(r"duration: ([0-9.]+) ms\s+(statement|execute [^:]*|parse [^:]*|bind [^:]*):\s*(.*)")
_KINDS = (
    ("COPY", re.compile(r"^COPY ", re.I)),
    ("INSERT", re.compile(r"^INSERT ", re.I)),
    ("CREATE INDEX", re.compile(r"^CREATE (UNIQUE )?INDEX", re.I)),
    ("ANALYZE", re.compile(r"^ANALYZE", re.I)),
    ("ALTER TABLE", re.compile(r"^ALTER TABLE", re.I)),
    ("CREATE TABLE", re.compile(r"^CREATE TABLE", re.I)),
    ("SELECT", re.compile(r"^(WITH|SELECT)", re.I)),
)


def statement_kind(text: str) -> str:
    """A short label for a logged statement."""
    stripped = text.strip().lstrip("(")
    for label, pattern in _KINDS:
        if pattern.match(stripped):
            return label
    return stripped.split(None, 2)[0].upper() if stripped else "?"


def server_time(log_text: str) -> dict[str, tuple[int, float]]:
    """Statements and milliseconds by kind (parse/bind/execute steps counted apart), from the server log."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for match in _DURATION.finditer(log_text):
        ms, step, text = float(match[1]), match[2].split()[0], match[3]
        label = statement_kind(text) if step in ("statement", "execute") else f"({step}) {statement_kind(text)}"
        totals[label][0] += 1
        totals[label][1] += ms
    return {k: (int(v[0]), v[1]) for k, v in sorted(totals.items(), key=lambda kv: -kv[1][1])}


def top_functions(prof: Path, sort: str, limit: int) -> str:
    """pstats' table of the top functions."""
    out = io.StringIO()
    stats = pstats.Stats(str(prof), stream=out)
    stats.strip_dirs().sort_stats(sort).print_stats(limit)
    text = out.getvalue()
    return text[text.find("   ncalls") :]


def profile_mode(bench: bench_e2e.Bench, mode: str, per_feeder: int, out_dir: Path) -> None:
    """One profiled `fedload sync` of every feeder into a fresh superhub database; print what it found."""
    name = f"prof_{mode}"
    bench.superhub.psql(f"CREATE DATABASE {name}")
    config = bench.work.dir / f"{name}.toml"
    config.write_text(bench.config_toml(mode, "f", name, bench.work.dir / f"agent-rss-{name}"))
    prof = out_dir / f"sync-{mode}.prof"
    server_log = bench.superhub.dir / "server.log"
    log_start = server_log.stat().st_size
    argv = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "fedload", "sync", "--json", "--config"]
    print(f"\n=== {mode} mode: {bench.count} feeders x {per_feeder:,} rows, profiled ... (load {load()})", flush=True)
    measured = common.run_measured([*argv, str(config)], stderr=bench.work.dir / f"{name}.log")
    if measured.status != 0:
        sys.exit(f"fedload sync failed: {measured.stdout[-2000:]!r}")
    print(f"wall {measured.seconds:.2f} s, sync process CPU {measured.cpu_s:.2f} s (with cProfile's overhead)")
    with server_log.open("rb") as file:
        file.seek(log_start)
        log_text = file.read().decode(errors="replace")
    (out_dir / f"server-{mode}.log").write_text(log_text)
    print(top_functions(prof, "cumulative", 45))
    print(top_functions(prof, "tottime", 25))
    common.print_table(
        f"server time by statement ({mode} mode, from log_min_duration_statement = 0)",
        ["statement", "count", "total ms"],
        [[kind, n, f"{ms:,.0f}"] for kind, (n, ms) in server_time(log_text).items()],
    )


def load() -> str:
    """The 1-minute load average."""
    return f"{os.getloadavg()[0]:.2f}"


def main() -> int:
    """Set up the feeders, then profile one sync per mode."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--feeders", type=positive_int, default=4)
    parser.add_argument("--rows", type=positive_int, default=300_000, help="rows per feeder (default 300000)")
    parser.add_argument("--modes", default="copy,inserts")
    parser.add_argument("--parallel", type=positive_int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "profile")
    common.add_common_arguments(parser)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(common.machine_line())
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        feeders, superhub = work.cluster("feeders"), work.cluster("superhub")
        print(f"PostgreSQL {work.install.major} ({work.install.bindir})")
        superhub.psql("ALTER SYSTEM SET log_min_duration_statement = 0")
        superhub.psql("SELECT pg_reload_conf()")
        bench = bench_e2e.Bench(work, feeders, superhub, work.sshd(), args.feeders, args.parallel)
        print(f"generating {args.feeders} feeders x ~{args.rows} rows ...", flush=True)
        per_feeder = bench.populate("f", args.rows)
        for mode in args.modes.split(","):
            profile_mode(bench, mode, per_feeder, args.out)
        shutil.copy(superhub.dir / "server.log", args.out / "server-all.log")
    print(f"\nprofiles and server logs in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
