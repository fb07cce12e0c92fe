"""Data age under constant change: how old the superhub's data gets while the feeders keep changing (issue 55).

    uv run python bench/freshness.py [--feeders 10] [--rows 300000] [--seconds 180] [--ways binary,copy,shell,seed]

A throwaway feeder cluster holds --feeders databases of the six CFEngine-like tables (bench/common.py), a throwaway
superhub cluster receives them, a real OpenSSH sshd on loopback plays the link. While a way runs, a writer plays
the hosts' agents: every --commit-s seconds each feeder commits one transaction in which a tenth of its hosts
report (their `__hosts.lastreporttimestamp` and `__lastseenhosts` rows re-stamped with now(), one context each
changed, one `__promiselog` row each appended); `__variables` and `__software` (half of the rows) never change. A
reader on the superhub samples every feeder's age, `now() - max(lastreporttimestamp)` of its hosts there, every
--sample-s seconds. The ways, one after another, each for --seconds:

  binary, copy  `fedload daemon` with every feeder at `interval_s = --interval-s`, in that dump mode
  shell         per feeder, back to back: ssh 'pg_dump | zstd' | zstd -d | psql into fresh tables, then a swap
                (three schema renames in one transaction), --lanes feeders at a time
  seed          the same with the seed's pipeline: pg_dump --column-inserts --rows-per-insert, gzip, gunzip

Ages count from the moment every feeder's data on the superhub first holds a report of the writer's (the "first
full load", also printed). Feeder side (the feeder cluster, the sshd and what it runs) is pinned to CPU 0, the
superhub side (the superhub cluster, the daemon or the shell pipelines' local half) to CPU 1, unless --shared.
"CPU busy 0 / 1" is each CPU's busy share while the way ran (/proc/stat): the side near 100% bounds it.
After --seconds the writer stops and each way must converge: the superhub then holds exactly the feeders' rows
(counted per table and feeder), or the script fails. `--tree PATH` runs the fedload ways a second time with the
fedload of another checkout (e.g. `git worktree add /tmp/main main`), for a ratio to it in the same run: its daemon
and its agents (sshd's sessions start without the daemon's environment: the agent command sets PYTHONPATH).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import common

from fedload.config import Analyze
from fedload.localpg import LocalCluster

FEEDER_CPU, SUPERHUB_CPU = "0", "1"
_AgeReader = Callable[[], Awaitable[list[float | None]]]
TABLES = list(common.DATASET_TABLES)
CONVERGE_TIMEOUT_S = 300.0
_HOSTS_PER_TICK = 10  # a tenth of the hosts report at each commit

# One writer commit: a tenth of the hosts (those whose key hashes to the tick's residue) report.
_WRITER_SQL = """
UPDATE public.__hosts SET lastreporttimestamp = now() WHERE abs(hashtext(hostkey)) % 10 = $1;
UPDATE public.__lastseenhosts SET lastseentimestamp = now() WHERE abs(hashtext(hostkey)) % 10 = $1;
UPDATE public.__contexts SET changetimestamp = now()
    WHERE abs(hashtext(hostkey)) % 10 = $1 AND contextname LIKE 'any%';
INSERT INTO public.__promiselog (id, hostkey, changetimestamp, policyfile, promiseoutcome)
SELECT m.base + row_number() OVER (), h.hostkey, now(), '/var/cfengine/inputs/promises.cf', 'KEPT'
FROM public.__hosts h, (SELECT coalesce(max(id), 0) AS base FROM public.__promiselog) m
WHERE abs(hashtext(h.hostkey)) % 10 = $1;
"""


@dataclass
class WayResult:
    """One way's ages (seconds, sampled after its first full load) and its loads."""

    way: str
    first_full_load_s: float
    ages: list[float]
    loads: int
    equal: bool
    busy: dict[str, float]  # each side's CPU busy share while the way ran (pinned: feeder CPU 0, superhub CPU 1)
    parts: dict[str, float] = field(default_factory=dict)  # CPU share of each process tree (`Harness.trees`)
    notes: str = ""

    def quantile(self, q: float) -> float:
        ordered = sorted(self.ages)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Harness:
    """The clusters, the sshd and the options of one run."""

    work: common.Workspace
    feeders: LocalCluster
    superhub: LocalCluster
    sshd: common.SshServer
    args: argparse.Namespace
    feeder_dbs: list[str] = field(default_factory=list)

    # -- setup ---------------------------------------------------------------------------------------------------

    def populate(self) -> None:
        for i in range(1, self.args.feeders + 1):
            db = f"f{i}"
            self.feeders.psql(f"CREATE DATABASE {db}")
            sql, _ = common.dataset_sql(self.args.rows, hub=i, newlines=False)
            self.feeders.psql(common.SCHEMA_SQL + sql, db)
            self.feeders.psql("VACUUM (FREEZE, ANALYZE)", db)
            self.feeder_dbs.append(db)

    def arrange(self) -> None:
        """Feeder cluster and sshd (and the sessions it forks) on CPU 0, the superhub cluster on CPU 1."""
        if self.args.shared:
            return
        common.pin_tree(common.postmaster_pid(self.feeders), FEEDER_CPU)
        common.pin_tree(self.sshd.process.pid, FEEDER_CPU)
        common.pin_tree(common.postmaster_pid(self.superhub), SUPERHUB_CPU)

    def superhub_side(self, argv: Sequence[str]) -> list[str]:
        return list(argv) if self.args.shared else ["taskset", "-c", SUPERHUB_CPU, *argv]

    def restamp_old(self) -> None:
        """Before a way: every feeder's reports back to the dataset's own (old) times, so that a way's first load
        shows as the moment its data first holds the writer's reports."""
        for db in self.feeder_dbs:
            self.feeders.psql("UPDATE public.__hosts SET lastreporttimestamp = '2024-05-01 00:00:00+00'", db)
        self.feeders.psql("CHECKPOINT")
        self.superhub.psql("CHECKPOINT")

    # -- the writer and the reader -------------------------------------------------------------------------------

    async def write(self, stop: asyncio.Event) -> int:
        """Every feeder commits one reporting transaction every --commit-s seconds until `stop`; commits made."""
        connections = [await asyncpg.connect(self.feeders.dsn(db)) for db in self.feeder_dbs]
        commits, tick = 0, 0
        try:
            while not stop.is_set():
                started = time.monotonic()
                for connection in connections:
                    async with connection.transaction():
                        await connection.execute(_WRITER_SQL.replace("$1", str(tick % _HOSTS_PER_TICK)))
                    commits += 1
                tick += 1
                await _sleep_or_stop(stop, self.args.commit_s - (time.monotonic() - started))
        finally:
            for connection in connections:
                await connection.close()
        return commits

    async def sample(self, read_ages: _AgeReader, stop: asyncio.Event) -> tuple[float, list[float]]:
        """Sample every feeder's age until `stop`: the seconds to the first full load, and the worst age of each
        sample from --warmup-s after it."""
        started = time.monotonic()
        first_full: float | None = None
        worst: list[float] = []
        while not stop.is_set():
            ages = await read_ages()
            if first_full is None and all(a is not None and a < time.monotonic() - started + 1 for a in ages):
                first_full = time.monotonic() - started
            if first_full is not None and time.monotonic() - started >= first_full + self.args.warmup_s:
                worst.append(max(a for a in ages if a is not None))
            await _sleep_or_stop(stop, self.args.sample_s)
        return (first_full if first_full is not None else float("nan")), worst

    # -- ways ----------------------------------------------------------------------------------------------------

    async def run_way(self, way: str, tree: Path | None) -> WayResult:
        label = way if tree is None else f"{way}@{tree.name}"
        self.restamp_old()
        print(f"  {label} ({self.args.seconds:.0f} s; load {os.getloadavg()[0]:.2f}) ...", flush=True)
        if way in ("binary", "copy"):
            way_runner: _Way = _DaemonWay(self, way, label, tree)
        else:
            way_runner = _ShellWay(self, way, label)
        await way_runner.prepare()
        stop_writer, stop_reader = asyncio.Event(), asyncio.Event()
        way_runner.start()
        writer = asyncio.create_task(self.write(stop_writer))
        reader = asyncio.create_task(self.sample(way_runner.ages, stop_reader))
        busy_before, started = common.cpu_busy_seconds(), time.monotonic()
        trees_before = {part: common.tree_cpu_seconds(pid) for part, pid in self.trees().items()}
        await asyncio.sleep(self.args.seconds)
        trees_after = {part: common.tree_cpu_seconds(pid) for part, pid in self.trees().items()}
        busy_after, seconds = common.cpu_busy_seconds(), time.monotonic() - started
        busy = {cpu: (busy_after[cpu] - busy_before[cpu]) / seconds for cpu in (FEEDER_CPU, SUPERHUB_CPU)}
        parts = {part: (trees_after[part] - trees_before[part]) / seconds for part in trees_before}
        stop_reader.set()
        first_full, ages = await reader
        stop_writer.set()
        await writer
        equal = await way_runner.converge()
        loads = await way_runner.stop()
        return WayResult(label, first_full, ages, loads, equal, busy, parts)

    def trees(self) -> dict[str, int]:
        """The process trees whose CPU each way reports, by name: the feeders' server (the dumps' backends, the
        writer's and autovacuum), the sshd (its sessions, the agents, psql, zstd) and the superhub's server."""
        return {
            "feeder server": common.postmaster_pid(self.feeders),
            "feeder sshd": self.sshd.process.pid,
            "superhub server": common.postmaster_pid(self.superhub),
        }

    async def feeder_counts(self) -> dict[tuple[int, str], int]:
        counts = {}
        for i, db in enumerate(self.feeder_dbs, start=1):
            connection = await asyncpg.connect(self.feeders.dsn(db))
            try:
                for table in TABLES:
                    counts[i, table] = await connection.fetchval(f"SELECT count(*) FROM public.{table}")  # noqa: S608
            finally:
                await connection.close()
        return counts

    async def feeder_newest(self) -> list[float]:
        newest = []
        for db in self.feeder_dbs:
            connection = await asyncpg.connect(self.feeders.dsn(db))
            try:
                newest.append(await connection.fetchval(_NEWEST_EPOCH.format(source="public.__hosts")))
            finally:
                await connection.close()
        return newest


_AGE_SQL = "SELECT extract(epoch FROM now() - max(lastreporttimestamp))::float8 FROM live.__hosts"
_NEWEST_EPOCH = "SELECT extract(epoch FROM max(lastreporttimestamp))::float8 FROM {source}"


class _Way:
    """How one way is started, read, converged and stopped."""

    async def prepare(self) -> None: ...

    def start(self) -> None: ...

    async def ages(self) -> list[float | None]:
        raise NotImplementedError

    async def converge(self) -> bool:
        raise NotImplementedError

    async def stop(self) -> int:
        raise NotImplementedError


class _DaemonWay(_Way):
    """`fedload daemon` into a fresh superhub database."""

    def __init__(self, harness: Harness, mode: str, label: str, tree: Path | None) -> None:
        self.h, self.mode, self.tree, self.label = harness, mode, tree, label
        self.db = "fl_" + label.replace("@", "_").replace("-", "_").replace(".", "_")
        self.process: subprocess.Popen[bytes] | None = None
        self.connection: asyncpg.Connection | None = None
        self.started_at = 0.0

    async def prepare(self) -> None:
        self.h.superhub.psql(f"CREATE DATABASE {self.db}")
        config = self.h.work.dir / f"{self.db}.toml"
        config.write_text(self.config_toml())
        self.config = config

    def config_toml(self) -> str:
        schema = self.h.work.dir / "schema.sql"
        schema.write_text(common.SCHEMA_SQL)
        ssh = self.h.sshd.ssh_config()
        lines = [
            'log_level = "warning"',
            "[superhub]",
            f"dsn = {json.dumps(self.h.superhub.dsn(self.db))}",
            f"tables = {json.dumps([f'public.{t}' for t in TABLES])}",
            f"schema_file = {json.dumps(str(schema))}",
            f"max_parallel_feeders = {self.h.args.lanes}",
            f'analyze = "{self.h.args.analyze}"',
        ]
        for i, db in enumerate(self.h.feeder_dbs, start=1):
            lines += [
                f"[feeders.hub{i}]",
                f"key = {i}",
                f'dump_mode = "{self.mode}"',
                f"interval_s = {self.h.args.interval_s}",
                'transport = "ssh"',
                f"database = {json.dumps(self.h.feeders.conninfo(db))}",
                f"pg_dump = {json.dumps(self.h.feeders.install.tool('pg_dump'))}",
                f"agent_command = {json.dumps(self.agent_command())}",
                *common.ssh_feeder_lines(f"hub{i}", ssh),
            ]
        return "\n".join(lines) + "\n"

    def agent_command(self) -> list[str]:
        """The agent sshd runs: this interpreter's fedload, or the tree's (sshd's sessions get a fresh environment:
        the daemon's PYTHONPATH does not reach them)."""
        python = [sys.executable, "-m", "fedload"]
        return python if self.tree is None else ["env", f"PYTHONPATH={self.tree}", *python]

    def start(self) -> None:
        env = common.tree_environment(self.tree)
        argv = self.h.superhub_side([sys.executable, "-m", "fedload", "daemon", "--config", str(self.config)])
        log = (self.h.work.dir / f"{self.db}.log").open("wb")
        self.process = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        self.started_at = time.time()

    async def _connection(self) -> asyncpg.Connection:
        if self.connection is None:
            self.connection = await asyncpg.connect(self.h.superhub.dsn(self.db))
        return self.connection

    async def ages(self) -> list[float | None]:
        connection = await self._connection()
        try:
            rows = await connection.fetch(
                "SELECT hub_id::int AS key, extract(epoch FROM now() - max(lastreporttimestamp))::float8 AS age "
                "FROM public.__hosts GROUP BY 1"
            )
        except asyncpg.UndefinedTableError:
            rows = []
        by_key = {r["key"]: r["age"] for r in rows}
        return [by_key.get(i) for i in range(1, len(self.h.feeder_dbs) + 1)]

    async def converge(self) -> bool:
        """Wait until the superhub holds every feeder's last report and exactly its rows."""
        newest, wanted = await self.h.feeder_newest(), await self.h.feeder_counts()
        connection = await self._connection()
        deadline = time.monotonic() + CONVERGE_TIMEOUT_S
        while time.monotonic() < deadline:
            got = await connection.fetch(
                "SELECT hub_id::int AS key, extract(epoch FROM max(lastreporttimestamp))::float8 AS newest "
                "FROM public.__hosts GROUP BY 1"
            )
            have = {r["key"]: r["newest"] for r in got}
            if all(have.get(i) is not None and have[i] >= n - 1e-3 for i, n in enumerate(newest, start=1)):
                return await self._counts_equal(connection, wanted)
            await asyncio.sleep(0.5)
        return False

    async def _counts_equal(self, connection: asyncpg.Connection, wanted: dict[tuple[int, str], int]) -> bool:
        for (key, table), count in wanted.items():
            have = await connection.fetchval(f"SELECT count(*) FROM public.{table} WHERE hub_id = $1", key)  # noqa: S608
            if have != count:
                print(f"    {table} of feeder {key}: {have} rows on the superhub, {count} on the feeder")
                return False
        return True

    async def stop(self) -> int:
        connection = await self._connection()
        loads = await connection.fetchval(
            "SELECT count(*) FROM fedload.runs WHERE outcome = 'success' AND started_at >= to_timestamp($1)",
            self.started_at,
        )
        failures = await connection.fetchval(
            "SELECT count(*) FROM fedload.runs WHERE outcome NOT IN ('success', 'running') "
            "AND started_at >= to_timestamp($1)",
            self.started_at,
        )
        spans = await connection.fetchrow(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)) AS run, "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - data_at)) AS lag "
            "FROM fedload.runs WHERE outcome = 'success' AND started_at >= to_timestamp($1)",
            self.started_at,
        )
        if spans is not None and spans["run"] is not None:
            print(f"    {self.label}: median run {spans['run']:.2f} s, its data {spans['lag']:.2f} s old at its end")
        await connection.close()
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        if failures:
            print(f"    {failures} runs failed: see {self.h.work.dir / (self.db + '.log')}")
        return int(loads)


class _ShellWay(_Way):
    """Back-to-back shell pipelines, one plain database per feeder: load into `public` (emptied in the load's
    transaction), then swap it with `live`, which readers read."""

    def __init__(self, harness: Harness, way: str, label: str) -> None:
        self.h, self.way, self.label = harness, way, label
        self.dbs = [f"sh_{way}_{i}" for i in range(1, len(harness.feeder_dbs) + 1)]
        self.stopping = threading.Event()
        self.loads = 0
        self.lock = threading.Lock()
        self.next_feeder = 0
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.connections: list[asyncpg.Connection] = []

    async def prepare(self) -> None:
        live_schema = "CREATE SCHEMA live;\n" + common.SCHEMA_SQL.replace("public.", "live.")
        for db in self.dbs:
            self.h.superhub.psql(f"CREATE DATABASE {db}")
            self.h.superhub.psql(common.SCHEMA_SQL + live_schema, db)
        self.connections = [await asyncpg.connect(self.h.superhub.dsn(db)) for db in self.dbs]

    def pipeline(self, i: int) -> str:
        source, target = self.h.feeder_dbs[i], self.dbs[i]
        tables = [f"public.{t}" for t in TABLES]
        if self.way == "shell":
            dump = shlex.join(common.pg_dump_argv(self.h.feeders, source, tables, inserts=False))
            remote, local = f"{dump} | zstd -q", "zstd -d -q"
        else:
            argv = common.pg_dump_argv(self.h.feeders, source, tables, inserts=True)
            argv.insert(argv.index("--column-inserts") + 1, "--rows-per-insert=1000")
            remote, local = f"{shlex.join(argv)} | gzip", "gunzip"
        truncate = "TRUNCATE " + ", ".join(tables)
        load = common.psql_argv(self.h.superhub, target, "--single-transaction", "-c", truncate, "-f", "-")
        swap = (
            "BEGIN; ALTER SCHEMA live RENAME TO old; ALTER SCHEMA public RENAME TO live; "
            "ALTER SCHEMA old RENAME TO public; COMMIT;"
        )
        hub = (lambda s: s) if self.h.args.shared else (lambda s: f"taskset -c {SUPERHUB_CPU} {s}")
        return (
            f"{hub(self.h.sshd.remote(remote))} | {hub(local)} | {hub(shlex.join(load))} && "
            f"{hub(shlex.join(common.psql_argv(self.h.superhub, target, '-c', swap)))}"
        )

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._lane, daemon=True) for _ in range(self.h.args.lanes)]
        for thread in self.threads:
            thread.start()

    def _lane(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                i = self.next_feeder
                self.next_feeder = (i + 1) % len(self.dbs)
            result = subprocess.run(
                ["bash", "-o", "pipefail", "-c", self.pipeline(i)], capture_output=True, check=False
            )
            if result.returncode != 0:
                self.errors.append(result.stderr.decode(errors="replace")[-500:])
                return
            with self.lock:
                self.loads += 1

    async def ages(self) -> list[float | None]:
        return [await connection.fetchval(_AGE_SQL) for connection in self.connections]

    async def converge(self) -> bool:
        newest, wanted = await self.h.feeder_newest(), await self.h.feeder_counts()
        deadline = time.monotonic() + CONVERGE_TIMEOUT_S
        while time.monotonic() < deadline and not self.errors:
            have = [await c.fetchval(_NEWEST_EPOCH.format(source="live.__hosts")) for c in self.connections]
            if all(h is not None and h >= n - 1e-3 for h, n in zip(have, newest, strict=True)):
                break
            await asyncio.sleep(0.5)
        else:
            return False
        self.stopping.set()
        await asyncio.to_thread(self._join)
        for i, connection in enumerate(self.connections, start=1):
            for table in TABLES:
                if await connection.fetchval(f"SELECT count(*) FROM live.{table}") != wanted[i, table]:  # noqa: S608
                    return False
        return True

    def _join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=CONVERGE_TIMEOUT_S)

    async def stop(self) -> int:
        self.stopping.set()
        await asyncio.to_thread(self._join)
        for connection in self.connections:
            await connection.close()
        if self.errors:
            print(f"    {self.label} failed: {self.errors[0]}")
        return self.loads


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)


def report(results: Sequence[WayResult], args: argparse.Namespace) -> None:
    by_way = {r.way: r for r in results}
    rows = []
    for r in results:
        worst = max(r.ages, default=float("nan"))
        ratios = [
            f"{worst / max(by_way[base].ages):.2f}x {base}"
            for base in ("shell", "seed")
            if base in by_way and by_way[base].ages and r.way != base
        ]
        rows.append(
            [
                r.way,
                f"{worst:.1f}",
                f"{r.quantile(0.99):.1f}",
                f"{statistics.median(r.ages) if r.ages else float('nan'):.1f}",
                r.loads,
                f"{r.first_full_load_s:.1f}",
                "yes" if r.equal else "NO",
                f"{r.busy[FEEDER_CPU]:.0%} / {r.busy[SUPERHUB_CPU]:.0%}",
                ", ".join(ratios) or "-",
            ]
        )
    title = (
        f"Data age on the superhub (s), {args.feeders} feeders x {args.rows} rows, a commit per feeder every "
        f"{args.commit_s} s, {args.seconds:.0f} s per way, {'shared CPUs' if args.shared else 'pinned'}, "
        f"{args.lanes} lanes"
        + (f", ages from {args.warmup_s:.0f} s after the first full load" if args.warmup_s else "")
    )
    headers = ["way", "worst", "p99", "median", "loads", "first full load", "equal", "CPU busy 0 / 1", "worst vs"]
    common.print_table(title, headers, rows)
    parts = list(results[0].parts) if results else []
    shares = [[r.way, *(f"{r.parts[part]:.0%}" for part in parts)] for r in results]
    common.print_table("CPU share of each process tree while the way ran (of one CPU)", ["way", *parts], shares)
    aim = by_way.get("binary") or by_way.get("copy")
    if aim is not None and "shell" in by_way and aim.ages and by_way["shell"].ages:
        worst = max(aim.ages)
        ok = worst <= 10 and worst <= 0.25 * max(by_way["shell"].ages)
        print(f"\naim (issue 55): worst age <= 10 s and <= 0.25x the shell pipeline's: {common.verdict(ok)}")
    print(common.BUSY_NOTE)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--feeders", type=int, default=10)
    parser.add_argument("--rows", type=int, default=300_000, help="rows per feeder (default 300000)")
    parser.add_argument("--seconds", type=float, default=180.0, help="how long each way runs (default 180)")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=0.0,
        help="ages count from this long after the first full load (0; the steady state: e.g. 60, past the first "
        "runs of a new superhub, which store the digests and delta states)",
    )
    parser.add_argument("--commit-s", type=float, default=2.0, help="each feeder commits every so often (2)")
    parser.add_argument("--sample-s", type=float, default=0.5, help="the reader samples every so often (0.5)")
    parser.add_argument("--interval-s", type=float, default=1.0, help="the daemon ways' interval_s (1)")
    parser.add_argument(
        "--analyze", choices=typing.get_args(Analyze), default="after_swap", help="the daemon's analyze setting"
    )
    parser.add_argument("--lanes", type=int, default=os.cpu_count() or 2, help="feeders at a time (CPU count)")
    parser.add_argument("--ways", default="binary,copy,shell,seed", help="comma-separated (binary,copy,shell,seed)")
    parser.add_argument("--tree", type=Path, help="also run the fedload ways with this checkout's fedload")
    parser.add_argument("--shared", action="store_true", help="do not pin the two sides to separate CPUs")
    common.add_common_arguments(parser)
    args = parser.parse_args()
    unknown = set(args.ways.split(",")) - {"binary", "copy", "shell", "seed"}
    if unknown:
        parser.error(f"unknown ways: {', '.join(sorted(unknown))}")
    return args


async def run(harness: Harness, args: argparse.Namespace) -> list[WayResult]:
    results = []
    for way in args.ways.split(","):
        results.append(await harness.run_way(way, None))
        if args.tree is not None and way in ("binary", "copy"):
            results.append(await harness.run_way(way, args.tree.resolve()))
    return results


def main() -> int:
    args = parse_args()
    print(common.machine_line())
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        feeders, superhub = work.cluster("feeders"), work.cluster("superhub")
        harness = Harness(work, feeders, superhub, work.sshd(), args)
        print(f"  populating {args.feeders} feeders x {args.rows} rows ...", flush=True)
        harness.populate()
        harness.arrange()
        results = asyncio.run(run(harness, args))
    report(results, args)
    return 0 if all(r.equal for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
