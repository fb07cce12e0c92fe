"""Start-up time of the quick commands: `fedload --help` and `fedload check-config`, best of several runs.

    uv run python bench/bench_startup.py [--runs 10] [--config fedload.toml]

Each run is a fresh `python -m fedload` process; the best (least disturbed) wall time counts. For reference, the
time of a bare `python -c pass` is printed too, and the heavy libraries each command imports (from `-X importtime`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("pglast", "asyncssh", "asyncpg", "pydantic", "structlog", "rich", "zstandard")


def best_of(argv: list[str], runs: int) -> float:
    """The shortest wall time of `runs` runs of `argv`, in seconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=REPO)
        times.append(time.perf_counter() - start)
    return min(times)


def heavy_imports(args: list[str]) -> list[str]:
    """The heavy top-level packages `python -m fedload ARGS` imports."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fedload", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    modules = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    return [name for name in HEAVY if name in modules]


def main() -> None:
    """Print one line per command: best wall time in ms and the heavy packages it imported."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="runs per command (default 10)")
    parser.add_argument("--config", default=str(REPO / "fedload.toml"), help="configuration for check-config")
    options = parser.parse_args()
    commands = {
        "python -c pass": ([sys.executable, "-c", "pass"], None),
        "fedload --help": ([sys.executable, "-m", "fedload", "--help"], ["--help"]),
        "fedload check-config": (
            [sys.executable, "-m", "fedload", "check-config", "--config", options.config],
            ["check-config", "--config", options.config],
        ),
    }
    print(f"{'command':<24} {'best of ' + str(options.runs):>10}  heavy imports")
    for name, (argv, args) in commands.items():
        seconds = best_of(argv, options.runs)
        imported = ", ".join(heavy_imports(args)) if args is not None else ""
        print(f"{name:<24} {seconds * 1000:>7.0f} ms  {imported or '-'}")


if __name__ == "__main__":
    main()
