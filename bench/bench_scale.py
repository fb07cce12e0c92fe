"""A round of many small feeders: outcomes, wall time, superhub connections, memory, and what readers see.

    uv run --group bench python bench/bench_scale.py [--feeders 25,50,100] [--rows 2000] [--parallel N]

Feeder databases (the largest --feeders count of them, spread over three feeder clusters) hold two tables,
`hosts` and `contexts`, about --rows rows together; some drift from the superhub's schema: every tenth lacks
`hosts.site` (the superhub has a default), every tenth has an extra column in `contexts` (dropped with a warning),
every tenth has `contexts`' columns in another order. The transport is local (`transport = "local"`: the agent
runs as a child of `fedload sync`), so the numbers are the superhub's side plus the agents, without ssh.

For each feeder count N, a fresh superhub database and the first N feeders: `python -m fedload sync --json
--config X` runs twice as a subprocess. Between the rounds every third feeder's data changes (5 hosts deleted,
37 contexts added), so a reader can tell old from new. During both rounds a monitor thread polls the superhub
every 50 ms for client backends (fedload's, by application_name, and all others but the monitor's own) and the
sync process's VmHWM; during the second round a reader, on its own connection, counts every parent by hub_id in a
loop (`SELECT hub_id, count(*) FROM t GROUP BY hub_id`), timing each query and checking each feeder's count is
its old or its new count (anything else is a torn total). Printed per N and round: outcomes, wall time, peak
connections, peak RSS (VmHWM of the sync process; the superhub side's, the sum of the VmHWM of the sync and of
each worker process it starts, an upper bound of their joint peak; wait4's ru_maxrss, which also covers its
largest child, as a cross-check), reader p50/p99/max latency and torn totals, each next to its target.

`--moved-percent P` gives each feeder (but the first) P% of its hosts with the keys of the previous feeder's hosts
and a newer `seen` (hosts that moved); `--entities` also runs each count into a second superhub database with
`superhub.entity_key = "hostkey"`, `entity_newest = "public.hosts.seen"` (one entity, one feeder, #45; there the
counts are not the feeders', so neither they nor the reader's totals are checked; the reader still runs in round 2,
as the same load) and prints each round's wall time and mean run time with the rule against without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import common

from fedload.localpg import LocalCluster
from transforms.cli import positive_int

TABLES = ("hosts", "contexts")
SCHEMA = """
CREATE TABLE public.hosts (hostkey text NOT NULL, name text, site text DEFAULT 'none', seen timestamptz,
    online boolean, PRIMARY KEY (hostkey));
CREATE TABLE public.contexts (hostkey text NOT NULL, contextname text, tags text[], score integer);
"""
# Drifted feeder schemas (feeder number % 10 picks one): a column missing, one extra, another column order.
DRIFT = {
    3: SCHEMA.replace("site text DEFAULT 'none', ", ""),
    5: SCHEMA.replace("score integer)", "score integer, extra text DEFAULT 'x')"),
    7: SCHEMA.replace(
        "contexts (hostkey text NOT NULL, contextname text, tags text[], score integer)",
        "contexts (score integer, tags text[], contextname text, hostkey text NOT NULL)",
    ),
}
DATA = """
INSERT INTO hosts (hostkey, name, seen, online)
SELECT 'SHA=' || {host_g}, E'host ''' || g || E'''\\t\\\\ x', {seen_g}, g % 3 = 0
FROM generate_series(1, {hosts}) g;
INSERT INTO contexts (hostkey, contextname, tags, score)
SELECT 'SHA=' || {host_h}, 'ctx_' || g, ARRAY['a,b', 'c"d', NULL], g
FROM generate_series(1, {contexts}) g, LATERAL (SELECT 1 + g % {hosts} AS h) AS x;
"""


def host_key(i: int, number: str, hosts: int, moved: int) -> str:
    """The SQL of feeder i's key of host `number` (an SQL expression): its own, or for its last `moved` hosts
    (--moved-percent) the key of one of feeder i-1's first hosts: a host that moved from feeder i-1 to feeder i."""
    if i == 1 or moved == 0:
        return f"md5('{i}:' || {number})"
    first = hosts - moved
    return f"CASE WHEN {number} > {first} THEN md5('{i - 1}:' || ({number} - {first})) ELSE md5('{i}:' || {number}) END"


def host_seen(i: int, hosts: int, moved: int) -> str:
    """Feeder i's `seen` of host g: minutes ago, and for a moved host (see host_key) newer than any feeder's."""
    if i == 1 or moved == 0:
        return "now() - g * interval '1 minute'"
    moved_seen = "now() + g * interval '1 second'"
    return f"CASE WHEN g > {hosts - moved} THEN {moved_seen} ELSE now() - g * interval '1 minute' END"


CHANGE = """
DELETE FROM hosts WHERE hostkey IN (SELECT hostkey FROM hosts ORDER BY hostkey LIMIT 5);
INSERT INTO contexts (hostkey, contextname, tags, score) SELECT 'SHA=new', 'new_' || g, NULL, g
FROM generate_series(1, 37) g;
"""
CHANGE_DELTA = {"hosts": -5, "contexts": 37}
MONITOR_INTERVAL_S = 0.05
Counts = dict[tuple[str, int], int]  # (table, hub_id) -> rows


@dataclass
class Feeders:
    """The feeder databases `f<i>` spread over a few clusters, and their current row counts."""

    clusters: list[LocalCluster]
    counts: Counts = field(default_factory=dict)

    def cluster_of(self, i: int) -> LocalCluster:
        """The cluster holding feeder i."""
        return self.clusters[i % len(self.clusters)]

    def create(self, count: int, rows: int, moved_percent: float = 0.0) -> None:
        """Feeders 1..count with about `rows` rows each (a tenth in hosts), one psql script per cluster;
        `moved_percent` of each feeder's hosts (but the first feeder's) moved there from the feeder before it."""
        hosts = max(1, rows // 10)
        moved = round(hosts * moved_percent / 100)
        scripts: dict[int, list[str]] = {}
        for i in range(1, count + 1):
            schema = DRIFT.get(i % 10, SCHEMA)
            data = DATA.format(
                host_g=host_key(i, "g", hosts, moved),
                host_h=host_key(i, "h", hosts, moved),
                seen_g=host_seen(i, hosts, moved),
                hosts=hosts,
                contexts=rows - hosts,
            )
            scripts.setdefault(i % len(self.clusters), []).append(
                f"CREATE DATABASE f{i};\n\\c f{i}\n{schema}{data}VACUUM ANALYZE;\n"
            )
            self.counts.update({("hosts", i): hosts, ("contexts", i): rows - hosts})
        for index, parts in scripts.items():
            self.clusters[index].psql("".join(parts))

    def change(self, numbers: Sequence[int]) -> None:
        """Change the data of the given feeders (CHANGE), keeping `counts` up to date."""
        scripts: dict[int, list[str]] = {}
        for i in numbers:
            scripts.setdefault(i % len(self.clusters), []).append(f"\\c f{i}\n{CHANGE}")
            for table, delta in CHANGE_DELTA.items():
                self.counts[table, i] += delta
        for index, parts in scripts.items():
            self.clusters[index].psql("".join(parts))

    def config_toml(
        self,
        numbers: Sequence[int],
        superhub: LocalCluster,
        db: str,
        schema: Path,
        parallel: int,
        *,
        entities: bool = False,
    ) -> str:
        """fedload.toml for these feeders, local transport; `entities`: one entity, one feeder, by hosts.seen."""
        lines = [
            'log_level = "warning"',
            "[superhub]",
            f"dsn = {json.dumps(superhub.dsn(db))}",
            f"tables = {json.dumps([f'public.{t}' for t in TABLES])}",
            f"schema_file = {json.dumps(str(schema))}",
            f"max_parallel_feeders = {parallel}",
            *(['entity_key = "hostkey"', 'entity_newest = "public.hosts.seen"'] if entities else []),
        ]
        for i in numbers:
            cluster = self.cluster_of(i)
            lines += [
                f"[feeders.f{i}]",
                f"key = {i}",
                'transport = "local"',
                f"database = {json.dumps(cluster.conninfo(f'f{i}'))}",
                f"pg_dump = {json.dumps(cluster.install.tool('pg_dump'))}",
            ]
        return "\n".join(lines) + "\n"


@dataclass
class Observed:
    """What the monitor thread saw during one round."""

    peak_fedload_conns: int = 0
    peak_other_conns: int = 0
    peak_hwm_kib: int = 0
    hwm_by_pid: dict[int, int] = field(default_factory=dict)  # the sync and its superhub-side workers
    latencies_s: list[float] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    reads: int = 0


class Monitor:
    """A thread with its own event loop: polls connections and the sync's VmHWM; optionally runs the reader."""

    def __init__(self, dsn: str, pid: int, expected: tuple[Counts, Counts] | None) -> None:
        self.dsn, self.pid, self.expected = dsn, pid, expected
        self.seen = Observed()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self.error is not None:
            raise RuntimeError(f"monitor failed: {self.error!r}") from self.error

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001 - reported by __exit__ in the main thread
            self.error = exc

    async def _run(self) -> None:
        tasks = [self._poll()]
        if self.expected is not None:
            tasks.append(self._read(*self.expected))
        await asyncio.gather(*tasks)

    async def _poll(self) -> None:
        conn = await asyncpg.connect(self.dsn, server_settings={"application_name": "bench monitor"})
        query = """SELECT count(*) FILTER (WHERE application_name LIKE 'fedload%'),
            count(*) FILTER (WHERE application_name NOT LIKE 'fedload%' AND application_name NOT LIKE 'bench %')
            FROM pg_stat_activity WHERE backend_type = 'client backend'"""
        try:
            while not self._stop.is_set():
                row = await conn.fetchrow(query)
                assert row is not None
                fedload, other = int(row[0]), int(row[1])
                self.seen.peak_fedload_conns = max(self.seen.peak_fedload_conns, fedload)
                self.seen.peak_other_conns = max(self.seen.peak_other_conns, other)
                self.seen.peak_hwm_kib = max(self.seen.peak_hwm_kib, vm_hwm_kib(self.pid))
                for pid in superhub_side(self.pid):
                    self.seen.hwm_by_pid[pid] = max(self.seen.hwm_by_pid.get(pid, 0), vm_hwm_kib(pid))
                await asyncio.sleep(MONITOR_INTERVAL_S)
        finally:
            await conn.close()

    async def _read(self, old: Counts, new: Counts) -> None:
        conn = await asyncpg.connect(self.dsn, server_settings={"application_name": "bench reader"})
        feeders = {i for _, i in old}
        try:
            while not self._stop.is_set():
                for table in TABLES:
                    started = time.perf_counter()
                    rows = await conn.fetch(f"SELECT hub_id, count(*) FROM public.{table} GROUP BY hub_id")  # noqa: S608
                    self.seen.latencies_s.append(time.perf_counter() - started)
                    self.seen.reads += 1
                    got = {int(r[0]): int(r[1]) for r in rows}
                    for i in feeders:
                        n = got.get(i, 0)
                        if n not in (old[table, i], new[table, i]):
                            self.seen.torn.append(f"{table} f{i}: {n} (old {old[table, i]}, new {new[table, i]})")
        finally:
            await conn.close()


_WORKER = b"fedload.service.worker"
_FORKED_WORKER = b"fedload-worker\n"


def superhub_side(pid: int) -> list[int]:
    """`pid` and its worker processes: its children that run `python -m fedload.service.worker` or that it forked as
    workers (named fedload-worker). Not their descendants (the agents and pg_dumps that the local transport starts),
    which, forked but not yet exec'd, still show the worker's command line and name."""
    workers = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_bytes().rsplit(b")", 1)[1].split()[1])
            if parent != pid:
                continue
            if (
                _WORKER in (stat.parent / "cmdline").read_bytes()
                or (stat.parent / "comm").read_bytes() == _FORKED_WORKER
            ):
                workers.append(int(stat.parent.name))
        except OSError:
            continue
    return [pid, *workers]


def vm_hwm_kib(pid: int) -> int:
    """The peak resident set (VmHWM) of a running process, KiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


@dataclass(frozen=True, slots=True)
class Round:
    """One `fedload sync` of N feeders."""

    feeders: int
    number: int
    seconds: float
    status: int
    outcomes: Counter[str]
    failures: list[str]
    maxrss_kib: int
    cpu_s: float
    seen: Observed
    load: float
    swap_lock_ms: list[float]
    run_seconds: list[float] = field(default_factory=list)  # each feeder's run, as `sync --json` says


def run_round(
    config: Path,
    dsn: str,
    feeders: int,
    number: int,
    expected: tuple[Counts, Counts] | None,
    *,
    python: Sequence[str] = (sys.executable,),
    cwd: Path | None = None,
) -> Round:
    """`python -m fedload sync --json` under the monitor (and the reader if `expected` is given); `python` is the
    interpreter's command line (another checkout's, or under `taskset`), `cwd` its directory (`-m` imports from
    there first: another checkout's tree runs with its own)."""
    load = os.getloadavg()[0]
    log = config.with_suffix(f".round{number}.log").open("wb")
    argv = [*python, "-m", "fedload", "sync", "--json", "--config", str(config)]
    with common.timed() as elapsed:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, cwd=cwd)
        with Monitor(dsn, process.pid, expected) as monitor:
            assert process.stdout is not None
            out = process.stdout.read()
            _, wait_status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(wait_status)
    process.stdout.close()
    log.close()
    runs = json.loads(out or b"[]")
    failures = [f"{r['feeder']}: {r['outcome']}: {r['error']}" for r in runs if r["outcome"] != "success"]
    if len(runs) != feeders:
        failures.append(f"{feeders - len(runs)} feeders without a result (exit status {process.returncode})")
    config.with_suffix(f".round{number}.json").write_bytes(out)
    outcomes = Counter(r["outcome"] for r in runs)
    cpu = usage.ru_utime + usage.ru_stime
    swap_ms = [float(r["swap_lock_ms"]) for r in runs if r.get("swap_lock_ms") is not None]
    return Round(
        feeders,
        number,
        elapsed(),
        process.returncode,
        outcomes,
        failures,
        usage.ru_maxrss,
        cpu,
        monitor.seen,
        load,
        swap_ms,
        [float(r["seconds"]) for r in runs],
    )


def superhub_counts(superhub: LocalCluster, db: str) -> Counts:
    """Rows per (table, hub_id) on the superhub."""
    counts: Counts = {}
    for table in TABLES:
        out = superhub.psql(f"SELECT hub_id, count(*) FROM public.{table} GROUP BY hub_id", db)  # noqa: S608
        for line in out.split():
            hub, n = line.split("|")
            counts[table, int(hub)] = int(n)
    return counts


def check_counts(what: str, got: Counts, want: Counts) -> list[str]:
    """Differences between the superhub's counts and the feeders', as lines."""
    return [f"{what}: {k[0]} f{k[1]}: superhub {got.get(k, 0)}, feeder {n}" for k, n in want.items() if got.get(k) != n]


def scale_run(
    feeders: Feeders, superhub: LocalCluster, count: int, parallel: int, work: Path, *, entities: bool = False
) -> tuple[list[Round], list[str]]:
    """Two rounds of the first `count` feeders into a fresh superhub database; the rounds and any count errors.
    `entities`: with the entity rule, where the superhub's counts are not the feeders' (no counts checked; the
    reader runs, for the same load, but its torn totals are not reported)."""
    numbers = list(range(1, count + 1))
    db = f"superhub_{count}" + ("_entities" if entities else "")
    superhub.psql(f"CREATE DATABASE {db}")
    schema = work / "schema.sql"
    schema.write_text(SCHEMA)
    config = work / f"{db}.toml"
    config.write_text(feeders.config_toml(numbers, superhub, db, schema, parallel, entities=entities))

    def mine(all_counts: Counts) -> Counts:
        return {k: v for k, v in all_counts.items() if k[1] <= count}

    print(f"  {count} feeders, round 1 ...", flush=True)
    first = run_round(config, superhub.dsn(db), count, 1, None)
    old = mine(feeders.counts)
    problems = [] if entities else check_counts("after round 1", superhub_counts(superhub, db), old)
    feeders.change(numbers[::3])
    new = mine(feeders.counts)
    print(f"  {count} feeders, round 2 (data of {len(numbers[::3])} feeders changed; reader on) ...", flush=True)
    second = run_round(config, superhub.dsn(db), count, 2, (old, new))  # with the rule: the same load, unchecked
    problems += [] if entities else check_counts("after round 2", superhub_counts(superhub, db), new)
    return [first, second], problems


def report_entities(plain: Sequence[Round], ruled: Sequence[Round]) -> None:
    """Each round with the entity rule against the same round without it: wall time and mean run time."""
    lines = []
    for without, with_rule in zip(plain, ruled, strict=True):
        mean_without, mean_with = (statistics.fmean(r.run_seconds or [0.0]) for r in (without, with_rule))
        lines.append(
            [
                f"{without.feeders}, round {without.number}",
                f"{without.seconds:.2f} / {with_rule.seconds:.2f} ({with_rule.seconds / without.seconds:.2f}x)",
                f"{mean_without:.3f} / {mean_with:.3f} ({mean_with / mean_without:.2f}x)",
                f"{without.load:.1f} / {with_rule.load:.1f}",
            ]
        )
    common.print_table(
        "the entity rule (superhub.entity_key) against none, same feeders",
        ["feeders, round", "wall s without / with", "mean run s without / with", "load"],
        lines,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def report(rounds: Sequence[Round], rows: int, parallel: int, tables_in_flight: int) -> bool:
    """The tables; True if every target is met."""
    conn_target = parallel * tables_in_flight + 2
    hwm = [sum(r.seen.hwm_by_pid.values()) / 1024 for r in rounds]
    flat = max(hwm) <= 1.2 * min(hwm)
    ok = flat and max(hwm) <= 300
    lines = []
    for r in rounds:
        target_s = 20.0 * r.feeders / 100  # the 20 s per 100 feeders (of 2,000 rows)
        all_ok = not r.failures and r.outcomes["success"] == r.feeders
        conns_ok = r.seen.peak_fedload_conns <= conn_target
        ok &= all_ok and r.seconds <= target_s and conns_ok
        lines.append(
            [
                f"{r.feeders} x {rows:,}",
                r.number,
                ", ".join(f"{k} {v}" for k, v in sorted(r.outcomes.items())) + ("" if all_ok else " (MISSED)"),
                f"{r.seconds:.2f} (<= {target_s:.0f}: {common.verdict(r.seconds <= target_s)})",
                f"{r.feeders * rows / r.seconds:,.0f}",
                f"{r.seen.peak_fedload_conns} (<= {conn_target}: {common.verdict(conns_ok)})",
                r.seen.peak_other_conns,
                f"{r.seen.peak_hwm_kib / 1024:.0f}",
                f"{len(r.seen.hwm_by_pid) - 1} / {sum(r.seen.hwm_by_pid.values()) / 1024:.0f}",
                f"{r.maxrss_kib / 1024:.0f}",
                f"{r.cpu_s:.1f}",
                f"{percentile(r.swap_lock_ms, 50):.0f} / {max(r.swap_lock_ms, default=0):.0f}",
                f"{r.load:.2f}",
            ]
        )
    common.print_table(
        f"fedload sync rounds (max_parallel_feeders = {parallel}, local transport)",
        [
            "feeders x rows",
            "round",
            "outcomes (all succeed)",
            "wall s",
            "rows/s",
            "peak fedload conns",
            "other conns",
            "sync VmHWM MiB",
            "workers / superhub-side VmHWM MiB",
            "wait4 maxrss MiB",
            "CPU s (sync+agents)",
            "swap ms p50 / max",
            "load",
        ],
        lines,
    )
    print(
        f"superhub-side RSS: max {max(hwm):.0f} MiB (<= 300: {common.verdict(max(hwm) <= 300)}), "
        f"largest / smallest {max(hwm) / min(hwm):.2f} (flat, <= 1.2: {common.verdict(flat)})"
    )
    readers = []
    for r in rounds:
        if r.number != 2:
            continue
        p99 = percentile(r.seen.latencies_s, 99) * 1000
        ok &= p99 < 500 and not r.seen.torn
        readers.append(
            [
                f"{r.feeders} x {rows:,}",
                r.seen.reads,
                f"{percentile(r.seen.latencies_s, 50) * 1000:.1f}",
                f"{p99:.1f} (< 500: {common.verdict(p99 < 500)})",
                f"{max(r.seen.latencies_s, default=0) * 1000:.1f}",
                f"{statistics.fmean(r.seen.latencies_s) * 1000 if r.seen.latencies_s else 0:.1f}",
                f"{len(r.seen.torn)} (0: {common.verdict(not r.seen.torn)})",
            ]
        )
    common.print_table(
        "reader during round 2 (GROUP BY hub_id count of each parent, in a loop, own connection)",
        ["feeders x rows", "queries", "p50 ms", "p99 ms", "max ms", "mean ms", "torn totals"],
        readers,
    )
    for r in rounds:
        for failure in r.failures:
            print(f"FAILED ({r.feeders} feeders, round {r.number}): {failure}")
        for torn in r.seen.torn[:20]:
            print(f"TORN ({r.feeders} feeders): {torn}")
    return ok


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--feeders", default="25,50,100", help="feeder counts, comma-separated (default 25,50,100)")
    parser.add_argument("--rows", type=positive_int, default=2000, help="rows per feeder (default 2000)")
    parser.add_argument(
        "--parallel", type=positive_int, default=os.cpu_count() or 1, help="max_parallel_feeders (CPU count)"
    )
    parser.add_argument(
        "--tables-in-flight",
        type=positive_int,
        default=1,
        help="tables one feeder loads at a time, for the connection target (default 1: one stream per feeder)",
    )
    parser.add_argument("--clusters", type=positive_int, default=3, help="feeder clusters (default 3)")
    parser.add_argument(
        "--moved-percent", type=float, default=0.0, help="hosts of each feeder moved there from the one before"
    )
    parser.add_argument(
        "--entities",
        action="store_true",
        help="also run each count with superhub.entity_key (one entity, one feeder) and compare (#45)",
    )
    common.add_common_arguments(parser)
    return parser.parse_args()


def main() -> int:
    """Create the feeders once, run two rounds per feeder count, report; 1 if a target is missed."""
    args = parse_args()
    counts = sorted({int(c) for c in args.feeders.split(",")})
    print(common.machine_line())
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        print(f"PostgreSQL {work.install.major} ({work.install.bindir})")
        superhub = work.cluster("superhub")
        feeders = Feeders([work.cluster(f"feeders{c}") for c in range(1, args.clusters + 1)])
        print(f"creating {max(counts)} feeders x ~{args.rows} rows over {args.clusters} clusters ...", flush=True)
        with common.timed() as elapsed:
            feeders.create(max(counts), args.rows, args.moved_percent)
        print(f"  ({elapsed():.1f} s)")
        rounds: list[Round] = []
        ruled: list[Round] = []
        problems: list[str] = []
        for count in counts:
            more, wrong = scale_run(feeders, superhub, count, args.parallel, work.dir)
            rounds += more
            problems += wrong
            if args.entities:
                print(f"  {count} feeders with the entity rule ...", flush=True)
                ruled += scale_run(feeders, superhub, count, args.parallel, work.dir, entities=True)[0]
    ok = report(rounds, args.rows, args.parallel, args.tables_in_flight)
    if ruled:
        report_entities(rounds, ruled)
    for problem in problems[:20]:
        print(f"COUNT MISMATCH {problem}")
    print(f"\n{common.BUSY_NOTE}")
    return 0 if ok and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
