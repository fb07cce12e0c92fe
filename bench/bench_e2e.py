"""End to end: N feeders of CFEngine-like tables into one superhub, five ways, on the same data and machine.

    uv run --group bench python bench/bench_e2e.py [--feeders 4] [--rows 50000] [--rss-rows 200000]

A throwaway feeder cluster holds N databases (one per feeder) of six CFEngine-like tables (__hosts, __contexts,
__variables, __software, __lastseenhosts, __promiselog) with --rows rows each; a throwaway superhub cluster
receives them; a real OpenSSH sshd on loopback plays the link to the feeders. Each way loads every feeder, at
most --parallel at a time (default: the CPU count, fedload's default max_parallel_feeders):

  (a) naive:   ssh feeder 'pg_dump --column-inserts | gzip' | gunzip | psql --single-transaction
  (b) merged:  the same with the classic line-based awk merge of INSERTs (merge_inserts.awk) before gzip
  (c) limit:   pg_dump (COPY) | psql --single-transaction, no network, no compression: the physical limit
  (d) fedload inserts mode, (e) fedload copy mode: `python -m fedload sync --config ...` over the sshd, end to end
      (agent, stream checks, load into staging, indexes, atomic swap into the partitioned parents)

(a)-(c) load into plain tables (one database per feeder, as created by the schema); (d) and (e) into a fresh
superhub. Then fedload runs again on feeders with --rss-rows rows, to show that its peak RSS (superhub process,
read with wait4; agent and pg_dump, read by a wrapper on the feeder side) does not grow with the dump.
Prints the tables and writes a PNG bar chart (--png).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import common

from fedload.localpg import LocalCluster
from transforms.cli import positive_int

if TYPE_CHECKING:
    from matplotlib.axes import Axes

HERE = Path(__file__).resolve().parent
AWK = HERE / "merge_inserts.awk"
TABLES = [f"public.{t}" for t in common.DATASET_TABLES]
SHORT_LABELS = {
    "naive": "(a) naive\nper-row INSERTs",
    "merged": "(b) awk-merged\nINSERTs",
    "limit": "(c) limit\nCOPY, local",
    "inserts": "(d) fedload\ninserts mode",
    "copy": "(e) fedload\ncopy mode",
}
_COUNT_ALL = " + ".join(f"(SELECT count(*) FROM {t})" for t in TABLES)  # noqa: S608 - our own table names


@dataclass(frozen=True, slots=True)
class Result:
    """One way of loading every feeder."""

    key: str
    label: str
    seconds: float
    rows: int


@dataclass(frozen=True, slots=True)
class FedloadRun:
    """One `fedload sync` subprocess."""

    mode: str
    rows_per_feeder: int
    seconds: float
    rows: int
    dump_bytes: int
    wire_bytes: int
    rss_kib: int
    cpu_s: float
    agent_rss_kib: int
    agent_cpu_s: float


@dataclass
class Bench:
    """The clusters, the sshd and the options of one benchmark run."""

    work: common.Workspace
    feeders: LocalCluster
    superhub: LocalCluster
    sshd: common.SshServer
    count: int
    parallel: int

    def populate(self, prefix: str, rows: int) -> int:
        """One database per feeder, `<prefix><i>`, with about `rows` rows; the exact rows per feeder."""
        exact = 0
        for i in range(1, self.count + 1):
            db = f"{prefix}{i}"
            self.feeders.psql(f"CREATE DATABASE {db}")
            sql, exact = common.dataset_sql(rows, hub=i, newlines=False)  # newlines would defeat the awk baseline
            self.feeders.psql(common.SCHEMA_SQL + sql, db)
            self.feeders.psql("VACUUM (FREEZE, ANALYZE)", db)
        return exact

    def pg_dump(self, db: str, *, inserts: bool) -> str:
        """The feeder's pg_dump command line."""
        return shlex.join(common.pg_dump_argv(self.feeders, db, TABLES, inserts=inserts))

    def psql(self, db: str) -> str:
        """psql loading into a superhub database in one transaction."""
        return shlex.join(common.psql_argv(self.superhub, db, "--single-transaction"))

    def shell_way(self, key: str, label: str, pipeline: Callable[[str, str], str]) -> Result:
        """Load every feeder `f<i>` into its own plain-table database `<key><i>` with a shell pipeline."""
        scripts = []
        for i in range(1, self.count + 1):
            target = f"{key}{i}"
            self.superhub.psql(f"CREATE DATABASE {target}")
            self.superhub.psql(common.SCHEMA_SQL, target)
            scripts.append(pipeline(f"f{i}", target))
        print(f"  {label} ...", flush=True)
        with common.timed() as elapsed, ThreadPoolExecutor(self.parallel) as pool:
            list(pool.map(common.run_shell, scripts))
        rows = sum(int(self.superhub.psql(f"SELECT {_COUNT_ALL}", f"{key}{i}")) for i in range(1, self.count + 1))
        return Result(key, label, elapsed(), rows)

    def naive(self, source: str, target: str) -> str:
        """(a): per-row INSERTs, gzip, ssh, gunzip, psql."""
        remote = self.sshd.remote(f"{self.pg_dump(source, inserts=True)} | gzip")
        return f"{remote} | gunzip | {self.psql(target)}"

    def merged(self, source: str, target: str) -> str:
        """(b): (a) with the line-based awk merge before gzip, on the feeder."""
        remote = self.sshd.remote(f"{self.pg_dump(source, inserts=True)} | awk -f {shlex.quote(str(AWK))} | gzip")
        return f"{remote} | gunzip | {self.psql(target)}"

    def limit(self, source: str, target: str) -> str:
        """(c): COPY output straight into psql, on one machine."""
        return f"{self.pg_dump(source, inserts=False)} | {self.psql(target)}"

    def fedload(self, mode: str, prefix: str, rows_per_feeder: int) -> FedloadRun:
        """`python -m fedload sync` of every feeder `<prefix><i>` into a fresh superhub database."""
        name = f"{prefix}_{mode}"
        self.superhub.psql(f"CREATE DATABASE {name}")
        agent_rss = self.work.dir / f"agent-rss-{name}"
        config = self.work.dir / f"{name}.toml"
        config.write_text(self.config_toml(mode, prefix, name, agent_rss))
        print(f"  fedload {mode} mode ({rows_per_feeder} rows per feeder) ...", flush=True)
        argv = [sys.executable, "-m", "fedload", "sync", "--json", "--config", str(config)]
        measured = common.run_measured(argv, stderr=self.work.dir / f"{name}.log")
        runs = json.loads(measured.stdout or b"[]")
        failed = [r for r in runs if r["outcome"] != "success"]
        if measured.status != 0 or failed or len(runs) != self.count:
            sys.exit(f"fedload sync failed (status {measured.status}): {failed or measured.stdout!r}")
        loaded = sum(sum(r["rows"].values()) for r in runs)
        if loaded != rows_per_feeder * self.count:
            sys.exit(f"fedload {mode} mode loaded {loaded} rows, not {rows_per_feeder * self.count}")
        return FedloadRun(
            mode,
            rows_per_feeder,
            measured.seconds,
            loaded,
            sum(r["dump_bytes"] for r in runs),
            sum(r["raw_bytes"] for r in runs),
            measured.max_rss_kib,
            measured.cpu_s,
            *common.recorded_usage(agent_rss),
        )

    def config_toml(self, mode: str, prefix: str, superhub_db: str, agent_rss: Path) -> str:
        """fedload.toml for the run: the feeders over the loopback sshd, the agent under the RSS wrapper."""
        schema = self.work.dir / "schema.sql"
        schema.write_text(common.SCHEMA_SQL)
        ssh = self.sshd.ssh_config()
        agent = common.rss_wrapped(agent_rss, [sys.executable, "-m", "fedload"])
        lines = [
            'log_level = "warning"',
            "[superhub]",
            f"dsn = {json.dumps(self.superhub.dsn(superhub_db))}",
            f"tables = {json.dumps(TABLES)}",
            f"schema_file = {json.dumps(str(schema))}",
            f"max_parallel_feeders = {self.parallel}",
        ]
        for i in range(1, self.count + 1):
            lines += [
                f"[feeders.hub{i}]",
                f"key = {i}",
                f'dump_mode = "{mode}"',
                'transport = "ssh"',
                f"database = {json.dumps(self.feeders.conninfo(f'{prefix}{i}'))}",
                f"pg_dump = {json.dumps(self.feeders.install.tool('pg_dump'))}",
                f"agent_command = {json.dumps(agent)}",
                f"[feeders.hub{i}.ssh]",
                f"host = {json.dumps(ssh.host)}",
                f"port = {ssh.port}",
                f"user = {json.dumps(ssh.user)}",
                f"identity = {json.dumps(str(ssh.identity))}",
                f"known_hosts = {json.dumps(str(ssh.known_hosts))}",
            ]
        return "\n".join(lines) + "\n"


def report(results: Sequence[Result], expected_rows: int) -> None:
    """The main table: wall seconds, rows/s, ratios to the limit and to naive, targets."""
    speed = {r.key: r.rows / r.seconds for r in results}
    rows = []
    for r in results:
        to_limit, to_naive = speed[r.key] / speed["limit"], speed[r.key] / speed["naive"]
        target = ""
        if r.key == "copy":
            target = f">= 0.9x limit: {common.verdict(to_limit >= 0.9)}; >= 15x naive: {common.verdict(to_naive >= 15)}"
        check = "" if r.rows == expected_rows else f"  ROWS {r.rows} != {expected_rows}"
        rows.append(
            [
                r.label,
                f"{r.seconds:.2f}",
                f"{speed[r.key]:,.0f}",
                common.fmt_ratio(to_limit),
                common.fmt_ratio(to_naive),
                target + check,
            ]
        )
    common.print_table(
        f"End to end, {expected_rows:,} rows in all", ["way", "wall s", "rows/s", "/ limit", "/ naive", "target"], rows
    )


def report_rss(runs: Sequence[FedloadRun]) -> None:
    """Peak RSS and CPU time by mode and size."""
    common.print_table(
        "fedload's memory and CPU (superhub: the `fedload sync` process; agent: the largest agent + pg_dump; "
        "CPU: all feeders' agents together)",
        [
            "mode",
            "rows/feeder",
            "dump MB",
            "wire MB",
            "wall s",
            "sync RSS MiB",
            "agent RSS MiB",
            "sync CPU s",
            "agents CPU s",
        ],
        [
            [
                r.mode,
                f"{r.rows_per_feeder:,}",
                f"{common.mb(r.dump_bytes):.0f}",
                f"{common.mb(r.wire_bytes):.1f}",
                f"{r.seconds:.2f}",
                f"{r.rss_kib / 1024:.0f}",
                f"{r.agent_rss_kib / 1024:.0f}",
                f"{r.cpu_s:.1f}",
                f"{r.agent_cpu_s:.1f}",
            ]
            for r in sorted(runs, key=lambda r: (r.mode, r.rows_per_feeder))
        ],
    )


def report_marginal(runs: Sequence[FedloadRun], limit: Result) -> None:
    """Rows/s between fedload's two sizes: its throughput without the fixed cost of a run."""
    lines = []
    for mode in ("inserts", "copy"):
        small, big = sorted((r for r in runs if r.mode == mode), key=lambda r: r.rows)
        if big.rows > small.rows and big.seconds > small.seconds:
            marginal = (big.rows - small.rows) / (big.seconds - small.seconds)
            fixed = small.seconds - small.rows / marginal
            limit_speed = limit.rows / limit.seconds
            lines.append([mode, f"{marginal:,.0f}", common.fmt_ratio(marginal / limit_speed), f"{fixed:.1f}"])
    common.print_table(
        "fedload without its fixed cost (extra rows / extra seconds between the two sizes; noisy unless both are "
        "large)",
        ["mode", "marginal rows/s", "/ limit", "fixed cost s (start-up, ssh, agent, DDL)"],
        lines,
    )


def _plot_speed(ax: Axes, results: Sequence[Result], title: str) -> None:
    naive = next(r for r in results if r.key == "naive")
    colors = {"naive": "#b0b0b0", "merged": "#8c8c8c", "limit": "#4c72b0", "inserts": "#dd8452", "copy": "#55a868"}
    speeds = [r.rows / r.seconds for r in results]
    bars = ax.bar([SHORT_LABELS[r.key] for r in results], speeds, color=[colors[r.key] for r in results])
    for bar, r, speed in zip(bars, results, speeds, strict=True):
        ratio = speed / (naive.rows / naive.seconds)
        where = (bar.get_x() + bar.get_width() / 2, bar.get_height())
        ax.annotate(f"{r.seconds:.1f} s\n{ratio:.1f}x naive", where, ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("rows/s (higher is better)")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.margins(y=0.2)


def _plot_rss(ax: Axes, runs: Sequence[FedloadRun]) -> None:
    runs = sorted(runs, key=lambda r: (r.mode, r.rows_per_feeder))
    positions = list(range(len(runs)))
    width = 0.38
    sync = [r.rss_kib / 1024 for r in runs]
    agent = [r.agent_rss_kib / 1024 for r in runs]
    ax.bar([p - width / 2 for p in positions], sync, width, color="#55a868", label="fedload sync (superhub)")
    ax.bar([p + width / 2 for p in positions], agent, width, color="#dd8452", label="agent + pg_dump (feeder)")
    ax.set_xticks(positions)
    ax.set_xticklabels([f"{r.mode}\n{r.rows_per_feeder:,}/feeder\n{common.mb(r.dump_bytes):.0f} MB" for r in runs])
    ax.tick_params(axis="x", labelsize=8)
    ax.set_ylim(0, max(sync + agent) * 1.35)
    ax.set_ylabel("peak RSS, MiB")
    ax.set_title("fedload peak memory by dump size", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", ncol=2)


def plot(results: Sequence[Result], runs: Sequence[FedloadRun], title: str, path: Path) -> None:
    """Bar charts: rows/s of each way; peak RSS of fedload by size."""
    import matplotlib  # noqa: PLC0415 - only this script needs it, and the backend must be set first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (ax_speed, ax_rss) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    _plot_speed(ax_speed, results, title)
    _plot_rss(ax_rss, runs)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"\nchart written to {path}")


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--feeders", type=positive_int, default=4, help="number of feeders (default 4)")
    parser.add_argument("--rows", type=positive_int, default=50_000, help="rows per feeder (default 50000)")
    parser.add_argument(
        "--rss-rows",
        type=positive_int,
        help="rows per feeder of the second fedload size for peak RSS (default 4 x --rows)",
    )
    parser.add_argument(
        "--parallel", type=positive_int, default=os.cpu_count() or 1, help="feeders at a time (CPU count)"
    )
    parser.add_argument("--png", type=Path, default=HERE / "out" / "e2e.png", help="chart (default bench/out/e2e.png)")
    common.add_common_arguments(parser)
    return parser.parse_args()


def main() -> int:
    """Set up, run the five ways and the second fedload size, report; 1 if any way lost rows."""
    args = parse_args()
    rss_rows = args.rss_rows or 4 * args.rows
    print(common.machine_line())
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        feeders, superhub = work.cluster("feeders"), work.cluster("superhub")
        bench = Bench(work, feeders, superhub, work.sshd(), args.feeders, args.parallel)
        print(f"generating {args.feeders} feeders x ~{args.rows} rows ...", flush=True)
        per_feeder = bench.populate("f", args.rows)
        expected = per_feeder * args.feeders
        print("loading:", flush=True)
        results = [
            bench.shell_way("naive", "(a) naive: --column-inserts|gzip|ssh|psql", bench.naive),
            bench.shell_way("merged", "(b) awk-merged INSERTs|gzip|ssh|psql", bench.merged),
            bench.shell_way("limit", "(c) limit: pg_dump COPY|psql, local", bench.limit),
        ]
        runs = [bench.fedload(mode, "f", per_feeder) for mode in ("inserts", "copy")]
        results += [
            Result(r.mode, f"({'d' if r.mode == 'inserts' else 'e'}) fedload {r.mode} mode over ssh", r.seconds, r.rows)
            for r in runs
        ]
        print(f"second size for peak RSS: {args.feeders} feeders x ~{rss_rows} rows ...", flush=True)
        rss_per_feeder = bench.populate("r", rss_rows)
        runs += [bench.fedload(mode, "r", rss_per_feeder) for mode in ("inserts", "copy")]
    report(results, expected)
    report_rss(runs)
    report_marginal(runs, next(r for r in results if r.key == "limit"))
    title = (
        f"{args.feeders} feeders x {per_feeder:,} rows, CFEngine-like tables, "
        f"{os.cpu_count()} CPUs, parallel {args.parallel}"
    )
    plot(results, runs, title, args.png)
    print(f"\n{common.BUSY_NOTE}")
    return 0 if all(r.rows == expected for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
