"""End to end: N feeders of CFEngine-like tables into one superhub, eight ways, on the same data and machine.

    uv run --group bench python bench/bench_e2e.py [--feeders 4] [--rows 50000] [--rss-rows 200000]

A throwaway feeder cluster holds N databases (one per feeder) of six CFEngine-like tables (__hosts, __contexts,
__variables, __software, __lastseenhosts, __promiselog) with --rows rows each; a throwaway superhub cluster
receives them; a real OpenSSH sshd on loopback plays the link to the feeders. Each way loads every feeder, at
most --parallel at a time (default: the CPU count, fedload's default max_parallel_feeders):

  (a) naive:   ssh feeder 'pg_dump --column-inserts | gzip' | gunzip | psql --single-transaction
  (b) merged:  the same with the classic line-based awk merge of INSERTs (merge_inserts.awk) before gzip
  (c) limit:   pg_dump (COPY) | psql --single-transaction, no network, no compression: the physical limit
  (d) fedload inserts mode, (e) fedload copy mode, (f) fedload binary mode: `python -m fedload sync --config ...`
      over the sshd, end to end (agent, stream checks, load into staging, indexes, atomic swap into the parents)
  (g) binary limit: per table, psql -c "COPY t TO STDOUT (FORMAT binary)" | psql -c "COPY t FROM STDIN (FORMAT
      binary)", no network, no compression: the limit of PostgreSQL's binary format
  (h) the user's pipe: ssh feeder 'pg_dump | zstd' | zstd -d | psql --single-transaction, what a user writes in one
      line (COPY format, zstd's default level)

(a)-(c), (g) and (h) load into plain tables (one database per feeder, as created by the schema); (d)-(f) into a
fresh superhub. Then fedload runs again on feeders with --rss-rows rows, to show that its peak RSS (the largest
superhub-side process, the sync or one of its worker processes, read with wait4; agent and pg_dump, read by a
wrapper on the feeder side) does not grow with the dump.
Autovacuum is off on the superhub cluster and both clusters CHECKPOINT before each way, so that no way pays for
the background work the way before it left (autovacuum analyzing and vacuuming 1.5 M fresh rows, dirty pages).
Prints the tables and writes a PNG bar chart (--png).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import sys
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import common

from fedload.localpg import LocalCluster
from transforms.cli import positive_int

if TYPE_CHECKING:
    from matplotlib.axes import Axes

HERE = Path(__file__).resolve().parent
AWK = HERE / "merge_inserts.awk"
TIME = "/usr/bin/time"  # GNU time: the CPU seconds of one command, from its wait4
FEEDER_CPU, SUPERHUB_CPU = "0", "1"
ARRANGEMENTS = ("shared", "pinned")
TABLES = [f"public.{t}" for t in common.DATASET_TABLES]
SHORT_LABELS = {
    "naive": "(a) naive\nper-row INSERTs",
    "merged": "(b) awk-merged\nINSERTs",
    "limit": "(c) limit\nCOPY, local",
    "inserts": "(d) fedload\ninserts mode",
    "copy": "(e) fedload\ncopy mode",
    "binary": "(f) fedload\nbinary mode",
    "binlimit": "(g) binary limit\npsql|psql",
    "zpipe": "(h) user's pipe\npg_dump|zstd|ssh",
}
FEDLOAD_WAYS = (("inserts", "d"), ("copy", "e"), ("binary", "f"))
MEDIAN_NOTE = (
    "the median of {repeat} runs of each way, interleaved; 'paired': the range of a way's ratio to the limit run "
    "in the same repetition"
)
_COUNT_ALL = " + ".join(f"(SELECT count(*) FROM {t})" for t in TABLES)  # noqa: S608 - our own table names


@dataclass(frozen=True, slots=True)
class Result:
    """One way of loading every feeder."""

    key: str
    label: str
    seconds: float
    rows: int
    superhub_cpu_s: float = 0.0
    arrangement: str = "shared"
    feeder_cpu_s: float = 0.0
    rep: int = 0


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
    superhub_cpu_s: float = 0.0
    arrangement: str = "shared"
    feeder_cpu_s: float = 0.0
    rep: int = 0


@dataclass
class Bench:
    """The clusters, the sshd and the options of one benchmark run."""

    work: common.Workspace
    feeders: LocalCluster
    superhub: LocalCluster
    sshd: common.SshServer
    count: int
    parallel: int
    analyze: str = "after_swap"
    arrangement: str = "shared"
    rep: int = 0  # the repetition under way (--repeat): part of every database's name
    runs: list[FedloadRun] = field(default_factory=list)

    @property
    def pinned(self) -> bool:
        """Feeder side on CPU 0, superhub side on CPU 1."""
        return self.arrangement == "pinned"

    def arrange(self, arrangement: str) -> None:
        """Pin (or unpin) the running servers: the feeder cluster and sshd (with the sessions it will fork: the
        agents, pg_dump) on CPU 0, the superhub cluster on CPU 1; shared: every CPU for all."""
        self.arrangement = arrangement
        every = f"0-{(os.cpu_count() or 1) - 1}"
        feeder_cpus, superhub_cpus = (FEEDER_CPU, SUPERHUB_CPU) if self.pinned else (every, every)
        common.pin_tree(common.postmaster_pid(self.feeders), feeder_cpus)
        common.pin_tree(self.sshd.process.pid, feeder_cpus)
        common.pin_tree(common.postmaster_pid(self.superhub), superhub_cpus)

    def feeder_side(self, command: str, record: Path) -> str:
        """A shell command run on the feeder's CPU when pinned; its CPU seconds appended to `record`."""
        timed = f"{TIME} -a -o {shlex.quote(str(record))} -f '%U %S' {command}"
        return f"taskset -c {FEEDER_CPU} {timed}" if self.pinned else timed

    def superhub_side(self, command: str, record: Path) -> str:
        """A shell command run on the superhub's CPU when pinned; its CPU seconds appended to `record`."""
        timed = f"{TIME} -a -o {shlex.quote(str(record))} -f '%U %S' {command}"
        return f"taskset -c {SUPERHUB_CPU} {timed}" if self.pinned else timed

    def feeder_cpu(self) -> float:
        """CPU seconds of the feeder side so far: the feeder cluster and the sshd with its reaped sessions (the
        agents and their pg_dump or psql, the remote shells and compressors, sshd's own encryption)."""
        return common.tree_cpu_seconds(common.postmaster_pid(self.feeders)) + common.tree_cpu_seconds(
            self.sshd.process.pid
        )

    def superhub_cpu(self) -> float:
        """CPU seconds of the superhub cluster so far (postmaster, its children, reaped backends)."""
        return common.tree_cpu_seconds(common.postmaster_pid(self.superhub))

    def settle(self) -> None:
        """Before a measured way: the previous ways' dirty pages written out (CHECKPOINT on both clusters), so
        that no way pays for the one before it. Autovacuum is off on the superhub (`quiet_superhub`) for the
        same reason: it would analyze and vacuum the last way's fresh tables during the next way."""
        self.superhub.psql("CHECKPOINT")
        self.feeders.psql("CHECKPOINT")

    def quiet_superhub(self) -> None:
        """No autovacuum on the superhub cluster: each way's statistics cost shows only where it runs ANALYZE
        itself (fedload with `analyze = "after_swap"`)."""
        self.superhub.psql("ALTER SYSTEM SET autovacuum = off")
        self.superhub.psql("SELECT pg_reload_conf()")

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

    def shell_way(self, key: str, label: str, pipeline: Callable[[str, str, Path], str]) -> Result:
        """Load every feeder `f<i>` into its own plain-table database `<arrangement>_<key><i>` with a shell
        pipeline; superhub-side CPU: the pipeline's superhub-side commands (recorded by /usr/bin/time) plus the
        superhub cluster's; feeder-side CPU: the feeder cluster's, the sshd's and the local feeder-side commands'
        (recorded in `<record>.feeder`)."""
        scripts, targets, records = [], [], []
        for i in range(1, self.count + 1):
            target = f"{self.arrangement}{self.rep}_{key}{i}"
            self.superhub.psql(f"CREATE DATABASE {target}")
            self.superhub.psql(common.SCHEMA_SQL, target)
            records.append(record := self.work.dir / f"cpu-{target}")
            scripts.append(pipeline(f"f{i}", target, record))
            targets.append(target)
        self.settle()
        print(f"  {label} ({self.arrangement}; load {os.getloadavg()[0]:.2f}) ...", flush=True)
        cpu_before, feeder_before = self.superhub_cpu(), self.feeder_cpu()
        with common.timed() as elapsed, ThreadPoolExecutor(self.parallel) as pool:
            list(pool.map(common.run_shell, scripts))
        cpu = self.superhub_cpu() - cpu_before + sum(_recorded_cpu(r) for r in records)
        feeder_cpu = self.feeder_cpu() - feeder_before + sum(_recorded_cpu(_feeder_record(r)) for r in records)
        rows = sum(int(self.superhub.psql(f"SELECT {_COUNT_ALL}", target)) for target in targets)
        return Result(key, label, elapsed(), rows, cpu, self.arrangement, feeder_cpu, self.rep)

    def naive(self, source: str, target: str, record: Path) -> str:
        """(a): per-row INSERTs, gzip, ssh, gunzip, psql."""
        remote = self.sshd.remote(f"{self.pg_dump(source, inserts=True)} | gzip")
        return self.receive(remote, target, record)

    def merged(self, source: str, target: str, record: Path) -> str:
        """(b): (a) with the line-based awk merge before gzip, on the feeder."""
        remote = self.sshd.remote(f"{self.pg_dump(source, inserts=True)} | awk -f {shlex.quote(str(AWK))} | gzip")
        return self.receive(remote, target, record)

    def receive(self, remote: str, target: str, record: Path) -> str:
        """The superhub side of (a) and (b): the ssh client, gunzip and psql (the remote side runs under sshd)."""
        hub = self.superhub_side
        return f"{hub(remote, record)} | {hub('gunzip', record)} | {hub(self.psql(target), record)}"

    def binary_limit(self, source: str, target: str, record: Path) -> str:
        """(g): each table's binary COPY out of the feeder straight into psql's binary COPY, on one machine."""
        pipes = []
        for table in TABLES:
            out = common.psql_argv(self.feeders, source, "-c", f"COPY {table} TO STDOUT (FORMAT binary)")
            into = common.psql_argv(self.superhub, target, "-c", f"COPY {table} FROM STDIN (FORMAT binary)")
            feeder = self.feeder_side(shlex.join(out), _feeder_record(record))
            pipes.append(f"{feeder} | {self.superhub_side(shlex.join(into), record)}")
        return " && ".join(pipes)

    def user_pipe(self, source: str, target: str, record: Path) -> str:
        """(h): pg_dump's COPY output compressed by zstd on the feeder, over ssh, zstd -d and psql."""
        remote = self.sshd.remote(f"{self.pg_dump(source, inserts=False)} | zstd -q")
        hub = self.superhub_side
        return f"{hub(remote, record)} | {hub('zstd -d -q', record)} | {hub(self.psql(target), record)}"

    def limit(self, source: str, target: str, record: Path) -> str:
        """(c): COPY output straight into psql, on one machine."""
        feeder = self.feeder_side(self.pg_dump(source, inserts=False), _feeder_record(record))
        return f"{feeder} | {self.superhub_side(self.psql(target), record)}"

    def all_ways(self, per_feeder: int, ways: str) -> list[Result]:
        """The chosen ways of (a)-(h) in the current arrangement (the limit, (c), always), in their order at an
        even repetition and the other way round at an odd one, so that a machine getting busier or quieter during
        the run weighs on all ways alike."""
        shell = (
            ("a", "naive", "(a) naive: --column-inserts|gzip|ssh|psql", self.naive),
            ("b", "merged", "(b) awk-merged INSERTs|gzip|ssh|psql", self.merged),
            ("c", "limit", "(c) limit: pg_dump COPY|psql, local", self.limit),
            ("g", "binlimit", "(g) binary limit: psql COPY binary|psql, local", self.binary_limit),
            ("h", "zpipe", "(h) user's pipe: pg_dump|zstd|ssh|zstd -d|psql", self.user_pipe),
        )
        chosen: list[Callable[[], Result]] = [
            functools.partial(self.shell_way, key, label, way)
            for letter, key, label, way in shell
            if letter in ways + "c"
        ]
        chosen += [
            functools.partial(self._fedload_way, mode, letter, per_feeder)
            for mode, letter in FEDLOAD_WAYS
            if letter in ways
        ]
        return [run() for run in (chosen if self.rep % 2 == 0 else chosen[::-1])]

    def _fedload_way(self, mode: str, letter: str, per_feeder: int) -> Result:
        r = self.fedload(mode, "f", per_feeder)
        label = f"({letter}) fedload {mode} mode over ssh"
        return Result(mode, label, r.seconds, r.rows, r.superhub_cpu_s, self.arrangement, r.feeder_cpu_s, self.rep)

    def fedload(self, mode: str, prefix: str, rows_per_feeder: int) -> FedloadRun:
        """`python -m fedload sync` of every feeder `<prefix><i>` into a fresh superhub database."""
        name = f"{self.arrangement}{self.rep}_{prefix}_{mode}"
        self.superhub.psql(f"CREATE DATABASE {name}")
        agent_rss = self.work.dir / f"agent-rss-{name}"
        config = self.work.dir / f"{name}.toml"
        config.write_text(self.config_toml(mode, prefix, name, agent_rss))
        self.settle()
        load = os.getloadavg()[0]
        print(f"  fedload {mode} mode ({rows_per_feeder} rows per feeder; {self.arrangement}; load {load:.2f}) ...")
        argv = [sys.executable, "-m", "fedload", "sync", "--json", "--config", str(config)]
        if self.pinned:
            argv = ["taskset", "-c", SUPERHUB_CPU, *argv]  # taskset execs: wait4 still measures fedload
        cpu_before, feeder_before = self.superhub_cpu(), self.feeder_cpu()
        measured = common.run_measured(argv, stderr=self.work.dir / f"{name}.log")
        server_cpu, feeder_cpu = self.superhub_cpu() - cpu_before, self.feeder_cpu() - feeder_before
        runs = json.loads(measured.stdout or b"[]")
        failed = [r for r in runs if r["outcome"] != "success"]
        if measured.status != 0 or failed or len(runs) != self.count:
            sys.exit(f"fedload sync failed (status {measured.status}): {failed or measured.stdout!r}")
        loaded = sum(sum(r["rows"].values()) for r in runs)
        if loaded != rows_per_feeder * self.count:
            sys.exit(f"fedload {mode} mode loaded {loaded} rows, not {rows_per_feeder * self.count}")
        run = FedloadRun(
            mode,
            rows_per_feeder,
            measured.seconds,
            loaded,
            sum(r["dump_bytes"] for r in runs),
            sum(r["raw_bytes"] for r in runs),
            measured.max_rss_kib,
            measured.cpu_s,
            *common.recorded_usage(agent_rss),
            measured.cpu_s + server_cpu,
            self.arrangement,
            feeder_cpu,
            self.rep,
        )
        self.runs.append(run)
        return run

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
            f'analyze = "{self.analyze}"',
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
                *common.ssh_feeder_lines(f"hub{i}", ssh),
            ]
        return "\n".join(lines) + "\n"


def _feeder_record(record: Path) -> Path:
    """Where a way's feeder-side local commands record their CPU seconds, beside its superhub-side record."""
    return record.with_name(record.name + ".feeder")


def _recorded_cpu(record: Path) -> float:
    """The CPU seconds /usr/bin/time appended to a file ("user system" per line); 0 if none."""
    if not record.exists():
        return 0.0
    lines = [line.split() for line in record.read_text().splitlines()]
    return sum(float(f[0]) + float(f[1]) for f in lines if len(f) == 2 and f[0][:1].isdigit())


def median_results(results: Sequence[Result]) -> list[Result]:
    """Per arrangement and way, the repetition of median wall time."""
    return _medians(results, lambda r: (r.arrangement, r.key))


def median_runs(runs: Sequence[FedloadRun]) -> list[FedloadRun]:
    """Per mode, size and arrangement, the fedload run of median wall time."""
    return _medians(runs, lambda r: (r.mode, r.rows_per_feeder, r.arrangement))


_Timed = TypeVar("_Timed", Result, FedloadRun)


def _medians(items: Sequence[_Timed], group: Callable[[_Timed], Hashable]) -> list[_Timed]:
    """Per group, the item of median `seconds` (of an even count, the lower middle one)."""
    groups: dict[Hashable, list[_Timed]] = {}
    for item in items:
        groups.setdefault(group(item), []).append(item)
    return [sorted(members, key=lambda r: r.seconds)[(len(members) - 1) // 2] for members in groups.values()]


def paired_ratios(results: Sequence[Result]) -> dict[tuple[str, str], str]:
    """Per arrangement and way, the range of its speed over the limit's in the same repetition: "0.61-0.70"."""
    speed = {(r.arrangement, r.key, r.rep): r.rows / r.seconds for r in results}
    ratios: dict[tuple[str, str], list[float]] = {}
    for (a, key, i), value in speed.items():
        if (limit := speed.get((a, "limit", i))) is not None:
            ratios.setdefault((a, key), []).append(value / limit)
    return {k: f"{min(v):.2f}-{max(v):.2f}" for k, v in ratios.items()}


def report(results: Sequence[Result], expected_rows: int) -> None:
    """Wall seconds, rows/s, ratios to that arrangement's limit and naive, superhub-side CPU; the arrangements
    side by side; targets on (e). Repeated ways: the repetition of median wall time, and the range of the ratios to
    the limit in the same repetition."""
    repeated = len({r.rep for r in results}) > 1
    paired = paired_ratios(results)
    results = median_results(results)
    arrangements = [a for a in ARRANGEMENTS if any(r.arrangement == a for r in results)]
    by = {(r.arrangement, r.key): r for r in results}
    speed = {k: r.rows / r.seconds for k, r in by.items()}
    headers, lines, targets = ["way"], [], []
    for a in arrangements:
        headers += [f"{a}: wall s", "rows/s", "/ limit", *(["paired"] if repeated else []), "/ naive"]
        headers += ["hub CPU s", "feeder CPU s"]
    for key in SHORT_LABELS:
        if not any((a, key) in by for a in arrangements):
            continue
        line = [next(by[a, key].label for a in arrangements if (a, key) in by)]
        for a in arrangements:
            if (a, key) not in by:
                line += ["-"] * (7 if repeated else 6)
                continue
            r, limit, naive = by[a, key], speed.get((a, "limit"), 0.0), speed.get((a, "naive"), 0.0)
            line += [
                f"{r.seconds:.2f}" + ("" if r.rows == expected_rows else f" ROWS {r.rows} != {expected_rows}"),
                f"{speed[a, key]:,.0f}",
                common.fmt_ratio(speed[a, key] / limit) if limit else "-",
                *([paired.get((a, key), "-")] if repeated else []),
                common.fmt_ratio(speed[a, key] / naive) if naive else "-",
                f"{r.superhub_cpu_s:.1f}",
                f"{r.feeder_cpu_s:.1f}",
            ]
            targets += _targets(a, key, speed)
        lines.append(line)
    common.print_table(
        f"End to end, {expected_rows:,} rows in all (shared: all processes on every CPU; pinned: feeder side on "
        f"CPU {FEEDER_CPU}, superhub side on CPU {SUPERHUB_CPU}; hub CPU: superhub cluster + superhub-side commands; "
        "feeder CPU: feeder cluster + sshd and its sessions + local feeder-side commands)",
        headers,
        lines,
    )
    for target in targets:
        print(f"target {target}")


def _targets(arrangement: str, key: str, speed: dict[tuple[str, str], float]) -> list[str]:
    """The aims of issue #44 for the fedload way `key` in `arrangement`, met or not, where their references ran."""
    aims = {  # way: (reference, at least, pinned, shared)
        "copy": [("limit", 1.0, 1.0)],
        "binary": [("limit", 1.2, 1.0), ("zpipe", 1.3, 1.3)],
        "inserts": [("copy", 0.8, 0.8)],
    }
    lines = []
    for reference, pinned, shared in aims.get(key, []):
        if (arrangement, reference) in speed:
            ratio = speed[arrangement, key] / speed[arrangement, reference]
            aim = pinned if arrangement == "pinned" else shared
            lines.append(f"{key} {arrangement}: >= {aim}x {reference}: {common.verdict(ratio >= aim)} ({ratio:.2f}x)")
    return lines


def report_rss(runs: Sequence[FedloadRun]) -> None:
    """Peak RSS and CPU time by mode and size."""
    common.print_table(
        "fedload's memory and CPU (sync RSS: the largest of the sync and its worker processes, wait4's maxrss; "
        "sync CPU: the sync and its workers together; agent: the largest agent + pg_dump; "
        "agents CPU: all feeders' agents together, with their pg_dump or psql; hub CPU: the sync and the superhub "
        "cluster; feeder CPU: the feeder cluster, sshd and its sessions, the agents included)",
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
            "hub CPU s",
            "feeder CPU s",
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
                f"{r.superhub_cpu_s:.1f}",
                f"{r.feeder_cpu_s:.1f}",
            ]
            for r in sorted(runs, key=lambda r: (r.mode, r.rows_per_feeder))
        ],
    )


def report_marginal(runs: Sequence[FedloadRun], limit: Result) -> None:
    """Rows/s between fedload's two sizes: its throughput without the fixed cost of a run."""
    lines = []
    for mode, _ in FEDLOAD_WAYS:
        sizes = sorted((r for r in runs if r.mode == mode), key=lambda r: r.rows)
        if len(sizes) != 2:
            continue
        small, big = sizes
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
    base = next((r for r in results if r.key == "naive"), None) or next(r for r in results if r.key == "limit")
    colors = {"naive": "#b0b0b0", "merged": "#8c8c8c", "limit": "#4c72b0", "inserts": "#dd8452", "copy": "#55a868"}
    colors |= {"binary": "#2a7a3a", "binlimit": "#2c4c80", "zpipe": "#a0a0c0"}
    speeds = [r.rows / r.seconds for r in results]
    bars = ax.bar([SHORT_LABELS[r.key] for r in results], speeds, color=[colors[r.key] for r in results])
    for bar, r, speed in zip(bars, results, speeds, strict=True):
        ratio = speed / (base.rows / base.seconds)
        where = (bar.get_x() + bar.get_width() / 2, bar.get_height())
        ax.annotate(f"{r.seconds:.1f} s\n{ratio:.2f}x {base.key}", where, ha="center", va="bottom", fontsize=8)
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
    ax.bar([p - width / 2 for p in positions], sync, width, color="#55a868", label="sync or a worker (superhub)")
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
    parser.add_argument(
        "--arrangement",
        choices=[*ARRANGEMENTS, "both"],
        default="both",
        help="shared: every process on every CPU; pinned: feeder side on CPU 0, superhub side on CPU 1 (both)",
    )
    parser.add_argument(
        "--analyze",
        choices=["after_swap", "autovacuum"],
        default="after_swap",
        help="fedload's superhub.analyze: after_swap (default) or autovacuum (then, as autovacuum is off on the "
        "benchmark's superhub, no way analyzes: like with like)",
    )
    parser.add_argument(
        "--ways", default="abcdefgh", help="which ways to run, as letters (default all; the limit (c) always runs)"
    )
    parser.add_argument(
        "--repeat",
        type=positive_int,
        default=1,
        help="run every way this many times, in reverse order every other time; report the median (default 1)",
    )
    parser.add_argument("--png", type=Path, default=HERE / "out" / "e2e.png", help="chart (default bench/out/e2e.png)")
    common.add_common_arguments(parser)
    return parser.parse_args()


def main() -> int:
    """Set up, run the ways and the second fedload size, report; 1 if any way lost rows."""
    args = parse_args()
    rss_rows = args.rss_rows or 4 * args.rows
    arrangements = list(ARRANGEMENTS) if args.arrangement == "both" else [args.arrangement]
    if "pinned" in arrangements and (os.cpu_count() or 1) < 2:
        sys.exit("the pinned arrangement needs two CPUs")
    print(common.machine_line())
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        feeders, superhub = work.cluster("feeders"), work.cluster("superhub")
        bench = Bench(work, feeders, superhub, work.sshd(), args.feeders, args.parallel, args.analyze)
        bench.quiet_superhub()
        print(f"generating {args.feeders} feeders x ~{args.rows} rows ...", flush=True)
        per_feeder = bench.populate("f", args.rows)
        expected = per_feeder * args.feeders
        results: list[Result] = []
        for arrangement in arrangements:
            bench.arrange(arrangement)
            for bench.rep in range(args.repeat):
                print(f"loading, {arrangement}, repetition {bench.rep + 1} of {args.repeat}:", flush=True)
                results += bench.all_ways(per_feeder, args.ways)
            bench.rep = 0
        print(f"second size for peak RSS ({arrangements[-1]}): {args.feeders} feeders x ~{rss_rows} rows ...")
        rss_per_feeder = bench.populate("r", rss_rows)
        runs = [r for r in bench.runs if r.rows_per_feeder == per_feeder and r.arrangement == arrangements[-1]]
        modes = [mode for mode, letter in FEDLOAD_WAYS if letter in args.ways]
        for bench.rep in range(args.repeat):
            runs += [bench.fedload(mode, "r", rss_per_feeder) for mode in modes]
    report(results, expected)
    runs = median_runs(runs)
    report_rss(runs)
    last = [r for r in median_results(results) if r.arrangement == arrangements[-1]]
    report_marginal(runs, next(r for r in last if r.key == "limit"))
    title = (
        f"{args.feeders} feeders x {per_feeder:,} rows, CFEngine-like tables, "
        f"{os.cpu_count()} CPUs, parallel {args.parallel}, {arrangements[-1]}"
    )
    plot(last, runs, title, args.png)
    print(f"\n{common.BUSY_NOTE if args.repeat == 1 else MEDIAN_NOTE.format(repeat=args.repeat)}")
    return 0 if all(r.rows == expected for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
