"""The swap methods compared: "partition" (DETACH + ATTACH) and "mvcc" (DELETE + INSERT), with fedload's swap_in.

    uv run python bench/bench_swap.py [--rows 100000] [--report-s 4] [--max-wait-s 3]

A superhub parent `t` (primary key (hub_id, id), an index on payload) with two feeders' partitions. Part 1, no
readers: one feeder's data replaced by fresh staging data (as a sync does), per method: the swap's time, its WAL
bytes (pg_current_wal_lsn() before and after), the partition's size and dead tuples after it, and the VACUUM it
then needs (time, WAL). Part 2, constant reporting: two sessions run `SELECT count(*), pg_sleep(report_s) FROM t`
back to back, staggered so that one always holds `t`; a short reader counts feeder 2's rows in a loop; each policy
swaps feeder 1: its outcome, time, queries cancelled, and the short readers' latencies while it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import common

from fedload.config import SwapMethod, SwapOnTimeout
from fedload.errors import SwapLockError
from fedload.log import configure_logging
from fedload.names import TableName, TablePattern
from fedload.superhub.schema import ParentTable, read_parents
from fedload.superhub.staged import StagedTable
from fedload.superhub.swap import SwapPolicy, SwapStats, swap_in

PARENT = """
CREATE SCHEMA IF NOT EXISTS fedload_stage; CREATE SCHEMA IF NOT EXISTS fedload_parts;
CREATE TABLE public.t (hub_id integer NOT NULL, id integer NOT NULL, payload text, seen timestamptz,
    PRIMARY KEY (hub_id, id)) PARTITION BY LIST (hub_id);
CREATE INDEX ON public.t (payload);
"""
STAGE = """
CREATE TABLE fedload_stage.{name} (hub_id integer NOT NULL DEFAULT {hub}, id integer NOT NULL, payload text,
    seen timestamptz, CONSTRAINT fedload_feeder_key CHECK (hub_id IS NOT NULL AND hub_id = {hub}));
INSERT INTO fedload_stage.{name} SELECT {hub}, g, md5((g + {salt})::text) || repeat('x', 60), now()
FROM generate_series(1, {rows}) g;
ALTER TABLE fedload_stage.{name} ADD PRIMARY KEY (hub_id, id);
CREATE INDEX ON fedload_stage.{name} (payload);
"""
_stage_names = iter(range(1_000_000))


@dataclass
class Bench:
    """The superhub database and what every step needs."""

    dsn: str
    rows: int
    parent: ParentTable | None = None

    async def connect(self) -> asyncpg.Connection:
        """A new connection to the superhub."""
        return await asyncpg.connect(self.dsn, command_timeout=600)

    async def sync(self, hub: int, policy: SwapPolicy, stats: SwapStats | None = None) -> tuple[float, int]:
        """Load fresh staging data for `hub` and swap it in, in one transaction; swap seconds and WAL bytes."""
        conn = await self.connect()
        stats = stats or SwapStats()
        try:
            assert self.parent is not None
            name = f"s{next(_stage_names)}"
            async with conn.transaction():
                await conn.execute(STAGE.format(name=name, hub=hub, rows=self.rows, salt=time.monotonic_ns()))
                before = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
                started = time.monotonic()
                staged = StagedTable(self.parent, name, rows=self.rows)
                await swap_in(
                    conn, [staged], feeder=f"hub{hub}", key=hub, policy=policy, stats=stats, connect=self.connect
                )
            seconds = time.monotonic() - started
            wal = await conn.fetchval("SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", before)
            return seconds, int(wal)
        finally:
            await conn.close()


async def setup(bench: Bench) -> None:
    """The parent and both feeders' first partitions (attached, as a feeder's first sync does)."""
    conn = await bench.connect()
    try:
        await conn.execute(PARENT)
        parents = await read_parents(conn, [TablePattern("public.t")], "hub_id")
        bench.parent = parents[TableName("public", "t")]
    finally:
        await conn.close()
    for hub in (1, 2):
        await bench.sync(hub, SwapPolicy())


async def partition_state(bench: Bench) -> tuple[int, int]:
    """Feeder 1's partition: its size in bytes and its dead tuples (after the statistics are flushed)."""
    conn = await bench.connect()
    try:
        await asyncio.sleep(1.2)  # PostgreSQL 15+ flushes table statistics at most once a second
        part = await conn.fetchval("SELECT tableoid::regclass::text FROM public.t WHERE hub_id = 1 LIMIT 1")
        size = await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", part)
        dead = await conn.fetchval("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass", part)
        return int(size), int(dead or 0)
    finally:
        await conn.close()


async def vacuum_cost(bench: Bench) -> tuple[float, int]:
    """VACUUM feeder 1's partition: seconds and WAL bytes."""
    conn = await bench.connect()
    try:
        part = await conn.fetchval("SELECT tableoid::regclass::text FROM public.t WHERE hub_id = 1 LIMIT 1")
        before = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        started = time.monotonic()
        await conn.execute(f"VACUUM {part}")
        seconds = time.monotonic() - started
        wal = await conn.fetchval("SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", before)
        return seconds, int(wal)
    finally:
        await conn.close()


async def quiet_costs(bench: Bench) -> list[list[object]]:
    """Part 1: each method's costs without readers (three syncs each: the first turns a method on)."""
    rows: list[list[object]] = []
    for method in (SwapMethod.PARTITION, SwapMethod.MVCC):
        policy = SwapPolicy(method=method)
        await bench.sync(1, policy)
        await vacuum_cost(bench)  # start each method from a clean partition
        timings = []
        for _ in range(3):
            seconds, wal = await bench.sync(1, policy)
            timings.append((seconds, wal))
            size, dead = await partition_state(bench)
            vacuum_s, vacuum_wal = await vacuum_cost(bench) if method is SwapMethod.MVCC else (0.0, 0)
        best = min(timings)
        rows.append(
            [
                method.value,
                f"{best[0] * 1000:.0f}",
                f"{common.mb(best[1]):.1f}",
                f"{common.mb(size):.1f}",
                f"{dead:,}",
                f"{vacuum_s * 1000:.0f}",
                f"{common.mb(vacuum_wal):.1f}",
            ]
        )
    return rows


@dataclass
class Readers:
    """Long reports that always hold `t`, and a short reader recording each query's start and latency."""

    bench: Bench
    report_s: float
    latencies: list[tuple[float, float]] = field(default_factory=list)
    cancelled: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _report(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        conn = await asyncpg.connect(self.bench.dsn, server_settings={"application_name": "report"})
        try:
            while not self._stop.is_set():
                try:
                    await conn.fetch(f"SELECT count(*), pg_sleep({self.report_s}) FROM public.t")  # noqa: S608
                except asyncpg.QueryCanceledError:
                    self.cancelled += 1
        finally:
            conn.terminate()

    async def _short(self) -> None:
        conn = await asyncpg.connect(self.bench.dsn, server_settings={"application_name": "dashboard"})
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                with contextlib.suppress(asyncpg.QueryCanceledError):
                    await conn.fetchval("SELECT count(*) FROM public.t WHERE hub_id = 2")
                self.latencies.append((started, time.monotonic() - started))
                await asyncio.sleep(0.01)
        finally:
            conn.terminate()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Readers]:
        """Start the readers (two staggered reports, one short loop), let them settle; stop them at the end."""
        async with asyncio.TaskGroup() as group:
            reports = [group.create_task(self._report(0.0)), group.create_task(self._report(self.report_s / 2))]
            group.create_task(self._short())
            await asyncio.sleep(self.report_s)
            try:
                yield self
            finally:
                self._stop.set()
                for task in reports:  # asyncpg cancels the running query on the server
                    task.cancel()

    def during(self, start: float, end: float) -> list[float]:
        """Latencies (ms) of the short queries that started between `start` and `end`."""
        return [ms * 1000 for t, ms in self.latencies if start <= t <= end]


async def contended(bench: Bench, name: str, policy: SwapPolicy, report_s: float) -> list[object]:
    """Part 2: one policy's swap of feeder 1 under constant reporting."""
    async with Readers(bench, report_s).running() as readers:
        started = time.monotonic()
        stats = SwapStats()
        try:
            await bench.sync(1, policy, stats)
            outcome = "success"
        except SwapLockError:
            outcome = "failed (locks)"
        ended = time.monotonic()
        await asyncio.sleep(0.5)
    latencies = readers.during(started, ended) or [0.0]
    return [
        name,
        outcome,
        f"{ended - started:.1f}",
        stats.attempts or "-",
        readers.cancelled,
        len(latencies),
        f"{statistics.median(latencies):.0f}",
        f"{_p99(latencies):.0f}",
        f"{max(latencies):.0f}",
    ]


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def run(dsn: str, options: argparse.Namespace) -> None:
    """Both parts; one table each."""
    bench = Bench(dsn, options.rows)
    await setup(bench)
    common.print_table(
        f"Swap of one feeder's {options.rows:,} rows, no readers (best of 3; mvcc: vacuum after each)",
        ["method", "swap ms", "swap WAL MB", "partition MB", "dead tuples", "vacuum ms", "vacuum WAL MB"],
        await quiet_costs(bench),
    )
    base = {"lock_timeout_s": 0.5, "max_wait_s": options.max_wait_s, "cancel_wait_s": 10.0}
    policies = {
        "partition, fail": SwapPolicy(**base),
        "partition, cancel": SwapPolicy(on_timeout=SwapOnTimeout.CANCEL, **base),
        "mvcc": SwapPolicy(method=SwapMethod.MVCC, **base),
    }
    await bench.sync(1, SwapPolicy())
    rows = [await contended(bench, name, policy, options.report_s) for name, policy in policies.items()]
    common.print_table(
        f"Constant reporting ({options.report_s:g} s reports, staggered; swap_max_wait_s = {options.max_wait_s:g}): "
        "short readers during the swap",
        [
            "policy",
            "outcome",
            "load+swap s",
            "tries",
            "reports cancelled",
            "short queries",
            "p50 ms",
            "p99 ms",
            "max ms",
        ],
        rows,
    )


def main() -> None:
    """Start a throwaway cluster, run the benchmark, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per feeder (default 100000)")
    parser.add_argument("--report-s", type=float, default=4.0, help="length of each long report (default 4)")
    parser.add_argument("--max-wait-s", type=float, default=3.0, help="swap_max_wait_s (default 3)")
    common.add_common_arguments(parser)
    options = parser.parse_args()
    configure_logging(level="warning")
    print(common.machine_line(), file=sys.stderr)
    with common.Workspace(common.pick_install(options.pg_major), keep=options.keep) as workspace:
        cluster = workspace.cluster("swap")
        cluster.psql("CREATE DATABASE superhub")
        print(f"PostgreSQL {workspace.install.major}, wal_level = {cluster.psql('SHOW wal_level').strip()}")
        asyncio.run(run(cluster.dsn("superhub"), options))


if __name__ == "__main__":
    main()
