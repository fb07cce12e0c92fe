"""The agent's ways to run on a feeder, in one run, interleaved: the installed `fedload agent dump` and the zipapp
(`fedload agent pack`) with each compressor; wall time and bytes sent, as ratios to the installed agent.

    uv run python bench/bench_agent.py [--rows 300000] [--rounds 3]

A throwaway PostgreSQL cluster holds one table of `--rows` rows; each variant dumps it to /dev/null-like pipes
`--rounds` times (the variants take turns, so a disturbed moment hits them all); the median counts. Also the start
of `--version`, best of 10.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedload.commands.pack import pack
from fedload.localpg import LocalCluster, find_installs

_TABLE = """
CREATE TABLE hosts (hostkey text PRIMARY KEY, name text, seen timestamptz, online boolean, score integer);
INSERT INTO hosts SELECT 'SHA=' || md5(g::text), 'host-' || g || ' in ' || (g % 97), now() - g * interval '1 s',
    g % 3 = 0, g FROM generate_series(1, {rows}) g;
"""


def variants(pyz: Path, bin_dir: Path) -> dict[str, tuple[list[str], dict[str, str] | None]]:
    """name -> (agent command head, environment)."""
    return {
        "installed (zstandard)": ([sys.executable, "-m", "fedload", "agent"], None),
        "zipapp, zstandard": ([sys.executable, "-I", str(pyz)], {"PATH": "/nonexistent"}),
        "zipapp, zstd program": ([sys.executable, "-I", "-S", str(pyz)], {"PATH": str(bin_dir)}),
        "zipapp, gzip": ([sys.executable, "-I", "-S", str(pyz)], {"PATH": "/nonexistent"}),
    }


def timed(argv: list[str], env: dict[str, str] | None) -> tuple[float, int]:
    """Wall time and stdout bytes of one run."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=True, env=env, timeout=600)
    return time.perf_counter() - start, len(done.stdout)


def main() -> None:
    """Print one line per variant: median seconds and MB, and the ratios to the installed agent."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    installs = find_installs()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        pyz = directory / "fedload-agent.pyz"
        print(f"zipapp: {pack(pyz)} bytes")
        bin_dir = directory / "bin"
        bin_dir.mkdir()
        zstd = shutil.which("zstd")
        assert zstd is not None, "the zstd program is needed"
        (bin_dir / "zstd").symlink_to(zstd)
        cluster = LocalCluster(installs.get(15) or installs[min(installs)], name="bench-agent").start()
        try:
            cluster.psql(_TABLE.format(rows=options.rows))
            dump = ["dump", "--quiet", "--database", cluster.conninfo(), "--table", "public.hosts"]
            dump += ["--pg-dump", cluster.install.tool("pg_dump")]
            results: dict[str, list[tuple[float, int]]] = {}
            for _ in range(options.rounds):
                for name, (head, env) in variants(pyz, bin_dir).items():
                    results.setdefault(name, []).append(timed([*head, *dump], env))
        finally:
            cluster.stop()
        base = statistics.median(s for s, _ in results["installed (zstandard)"])
        base_bytes = results["installed (zstandard)"][0][1]
        print(f"{'variant':<24} {'median s':>9} {'ratio':>6} {'MB sent':>8} {'ratio':>6}")
        for name, runs in results.items():
            seconds = statistics.median(s for s, _ in runs)
            sent = runs[0][1]
            print(f"{name:<24} {seconds:9.2f} {seconds / base:6.2f} {sent / 1e6:8.2f} {sent / base_bytes:6.2f}")
        for name, argv in {
            "fedload --version": [sys.executable, "-m", "fedload", "--version"],
            "zipapp --version": [sys.executable, "-I", str(pyz), "--version"],
        }.items():
            best = min(timed(argv, None)[0] for _ in range(10))
            print(f"{name:<24} {best * 1000:7.0f} ms (best of 10)")


if __name__ == "__main__":
    main()
