"""Swaps under constant reporting: long readers that never leave a gap, per swap method and timeout policy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from asyncio.subprocess import DEVNULL, PIPE
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from fedload.commands.status import read_status
from fedload.config import Config, SuperhubConfig
from fedload.names import TableName
from fedload.results import Outcome
from fedload.superhub import blockers, pipeline, swap
from fedload.superhub.pipeline import FeederRun
from fedload.superhub.schema import PARTS_SCHEMA, qualified
from tests.support.federation import Federation, end_process, new_database, psql_int, staging_leftovers, sync

LONG_QUERY = "SELECT count(*), pg_sleep(2) FROM hosts"
# Per feeder, by its key, and per table, in one statement (one snapshot): "key:hosts:contexts". A feeder with no
# rows reads "k:0:0", never a missing line; one table swapped without the other reads as a line of its own.
TOTALS = (
    "SELECT k || ':' || (SELECT count(*) FROM hosts WHERE hub_id = k) || ':' || "
    "(SELECT count(*) FROM contexts WHERE hub_id = k) FROM unnest(ARRAY[1, 2, 3]) AS k"
)
BOUND_S = 30.0  # generous: a swap that waits 1-2 s and cancels for up to 5 s finishes well within it


class Sessions:
    """Background psql loops on the superhub: staggered long reports, and a short reader that counts rows."""

    def __init__(self, fed: Federation, *, application: str = "report", user: str = "postgres") -> None:
        self._fed = fed
        self._env = {**os.environ, "PGAPPNAME": application}
        self._user = user
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._processes: set[subprocess.Popen[str]] = set()
        self._lock = threading.Lock()
        self.seen: set[str] = set()  # "key:hosts:contexts" lines the counting reader saw

    def _psql(self, sql: str, env: dict[str, str]) -> tuple[int, str]:
        """Run one query with psql; its exit status and output (a stopped loop's query is killed, status < 0)."""
        cluster = self._fed.cluster
        argv = [cluster.install.tool("psql"), "-X", "-At", "-h", cluster.host, "-p", str(cluster.port)]
        argv += ["-U", self._user, "-d", self._fed.superhub, "-c", sql]
        with self._lock:
            if self._stop.is_set():
                return -1, ""
            process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._processes.add(process)
        try:
            out, _ = process.communicate(timeout=60)
        finally:
            with self._lock:
                self._processes.discard(process)
        return process.returncode, out

    def _report_loop(self) -> None:
        while not self._stop.is_set():
            self._psql(LONG_QUERY, self._env)

    def _count_loop(self) -> None:
        env = {**os.environ, "PGAPPNAME": "counter"}
        while not self._stop.is_set():
            status, out = self._psql(TOTALS, env)
            if status == 0:
                self.seen.update(out.split())
            time.sleep(0.02)

    def wait_to_see(self, line: str, timeout_s: float = 10.0) -> None:
        """Wait until the counting reader has seen `line` (bounded: the check after it says if it never did)."""
        deadline = time.monotonic() + timeout_s
        while line not in self.seen and time.monotonic() < deadline:
            time.sleep(0.02)

    def _start(self, target: Any) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)

    @contextlib.contextmanager
    def running(self, *, reports: int = 2) -> Iterator[Sessions]:
        """Reports staggered so that one always holds the table, and the counter; stopped and joined at the end."""
        try:
            for _ in range(reports):
                self._start(self._report_loop)
                time.sleep(1.0)
            self._start(self._count_loop)
            yield self
        finally:
            with self._lock:
                self._stop.set()
                for process in self._processes:
                    process.kill()
            for thread in self._threads:
                thread.join(timeout=10)


def swap_config(fed: Federation, **superhub: Any) -> Config:
    """The federation's configuration with some `swap_*` settings of the superhub; runs in this process, where
    the tests read their log events."""
    config = fed.config()
    checked = SuperhubConfig.model_validate(config.superhub.model_dump() | {"worker_processes": 0} | superhub)
    return config.model_copy(update={"superhub": checked})


@dataclass(frozen=True)
class Totals:
    """What readers may see: hub1's line before and after its sync, and the other feeders' lines (unchanged)."""

    old: str
    new: str
    others: frozenset[str]

    @property
    def hosts_before(self) -> str:
        return self.old.split(":")[1]


async def first_sync_then_change(fed: Federation, config: Config) -> Totals:
    """Sync all feeders, then delete some of hub1's hosts and contexts; the totals readers may see."""
    assert [r.outcome for r in await sync(config)] == [Outcome.SUCCESS] * 3
    before = fed.superhub_sql(TOTALS).split()
    feeder = fed.feeders["hub1"]
    fed.cluster.psql("DELETE FROM hosts WHERE hostkey LIKE 'SHA=1%'", dbname=feeder)
    fed.cluster.psql("DELETE FROM contexts WHERE contextname LIKE 'ctx1%'", dbname=feeder)
    counts = fed.cluster.psql("SELECT (SELECT count(*) FROM hosts) || ':' || count(*) FROM contexts", dbname=feeder)
    old = next(line for line in before if line.startswith("1:"))
    return Totals(old, f"1:{counts.strip()}", frozenset(before) - {old})


async def timed_sync(config: Config) -> tuple[FeederRun, float]:
    """Sync hub1; its run and the seconds it took."""
    started = time.monotonic()
    (run,) = await sync(config, "hub1")
    return run, time.monotonic() - started


def assert_only_whole_totals(seen: set[str], totals: Totals, *hub1: str) -> None:
    """The counting reader saw hub1's lines `hub1` only (old or new totals of both tables at once, never empty,
    never one table without the other), and the other feeders' unchanged lines; it saw every feeder."""
    assert seen, "the reader saw nothing"
    assert {line for line in seen if line.startswith("1:")} <= set(hub1), sorted(seen)
    assert {line for line in seen if not line.startswith("1:")} <= totals.others, sorted(seen)
    assert {line.split(":")[0] for line in seen} == {"1", "2", "3"}


async def test_partition_swap_fails_in_bound_and_status_flags_it(federation: Federation) -> None:
    """swap_on_timeout = "fail": the swap gives up after swap_max_wait_s; old data stays; status flags the feeder."""
    config = swap_config(federation, swap_max_wait_s=1.0, swap_lock_timeout_s=0.2)
    totals = await first_sync_then_change(federation, config)
    with Sessions(federation).running() as sessions:
        runs = [await timed_sync(config) for _ in range(2)]
    for run, seconds in runs:
        assert run.outcome == Outcome.FAILED
        assert "could not lock the parent tables of feeder hub1" in (run.error or "")
        assert seconds < BOUND_S
        assert (run.swap_attempts or 0) > 1
    assert_only_whole_totals(sessions.seen, totals, totals.old)
    assert federation.superhub_sql("SELECT count(*) FROM hosts WHERE hub_id = 1") == totals.hosts_before
    assert staging_leftovers(federation) == 0
    hub1 = next(s for s in await read_status(config) if s.feeder == "hub1")
    assert hub1.swaps_starved
    assert hub1.swap_lock_failures == 2
    assert (hub1.swap_attempts or 0) > 1
    assert (hub1.swap_wait_ms or 0) >= 1000
    assert totals.new != totals.old


class HeldSession:
    """One psql session that reads the superhub's `hosts` in a transaction: its query (`pg_sleep(sleep_s)`) blocks
    a swap, and is either cancelled (then the session rolls back to its savepoint and goes on) or ends by itself.
    It prints its backend pid before and after, so a test sees whether the same session survived."""

    def __init__(self, fed: Federation, *, sleep_s: float = 30, application: str = "held", dbname: str = "") -> None:
        cluster = fed.cluster
        argv = [cluster.install.tool("psql"), "-X", "-At", "-h", cluster.host, "-p", str(cluster.port)]
        script = (
            "SELECT 'pid:' || pg_backend_pid();\nBEGIN;\nSAVEPOINT report;\n"
            f"SELECT count(*), pg_sleep({sleep_s}) FROM hosts;\nROLLBACK TO SAVEPOINT report;\n"
            "SELECT 'alive:' || pg_backend_pid() || ':' || count(*) FROM contexts;\nCOMMIT;\n"
        )
        self._fed, self._dbname = fed, dbname or fed.superhub
        path = fed.tmp / f"{application.replace(' ', '_')}.sql"
        path.write_text(script)
        env = {**os.environ, "PGAPPNAME": application}
        self.process = subprocess.Popen(
            [*argv, "-U", "postgres", "-d", self._dbname, "-f", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self._wait_until_sleeping(application)

    def _wait_until_sleeping(self, application: str) -> None:
        sql = (
            "SELECT count(*) FROM pg_stat_activity "
            f"WHERE application_name = '{application}' AND query LIKE '%pg_sleep%'"
        )
        deadline = time.monotonic() + 10
        while psql_int(self._fed.cluster, sql, self._dbname) != 1:
            assert time.monotonic() < deadline, "the held session never started its query"
            time.sleep(0.05)

    def finish(self) -> tuple[int, str, str]:
        """Wait for the session's end; its exit status, output and errors."""
        out, err = self.process.communicate(timeout=60)
        return self.process.returncode, out, err

    def assert_survived(self) -> None:
        """The session lived through its query's cancel: the same backend went on in the same transaction."""
        status, out, err = self.finish()
        lines = out.split()
        assert status == 0, (status, out, err)
        pid = next(line.split(":")[1] for line in lines if line.startswith("pid:"))
        alive = [line for line in lines if line.startswith("alive:")]
        assert [line.split(":")[1] for line in alive] == [pid], (out, err)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@contextlib.contextmanager
def held(fed: Federation, **options: Any) -> Iterator[HeldSession]:
    """A `HeldSession` for the block, killed at the end if still there."""
    session = HeldSession(fed, **options)
    try:
        yield session
    finally:
        session.kill()


CANCELLING = {"swap_max_wait_s": 1.0, "swap_lock_timeout_s": 0.2, "swap_on_timeout": "cancel", "swap_cancel_wait_s": 5}


async def test_partition_swap_cancels_blocking_reports(federation: Federation) -> None:
    """swap_on_timeout = "cancel": the blocking reports are cancelled, logged and counted; the swap completes; a
    cancelled session survives (cancelled, never terminated): same backend, its transaction goes on."""
    config = swap_config(federation, **CANCELLING)
    totals = await first_sync_then_change(federation, config)
    with held(federation) as session, capture_logs() as events, Sessions(federation).running() as sessions:
        run, seconds = await timed_sync(config)
        sessions.wait_to_see(totals.new)
    assert run.outcome == Outcome.SUCCESS, run.error
    assert seconds < BOUND_S
    cancelled = [e for e in events if e["event"] == "swap.blocker_cancelled"]
    assert cancelled
    assert run.cancelled_backends == len(cancelled)
    report = next(e for e in cancelled if e["application_name"] == "report")
    assert report["query"] == LONG_QUERY
    assert report["user"] == "postgres"
    assert report["query_start"]
    assert report["pid"]
    assert [e for e in cancelled if e["application_name"] == "held"]
    session.assert_survived()
    assert_only_whole_totals(sessions.seen, totals, totals.old, totals.new)
    assert totals.new in sessions.seen
    recorded = federation.superhub_sql("SELECT cancelled_backends FROM fedload.runs ORDER BY id DESC LIMIT 1")
    assert recorded == str(len(cancelled))


async def test_negative_control_a_terminated_blocker_is_seen(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control of "cancel, never terminate": with the watcher sabotaged to pg_terminate_backend, the same
    check of the blocking session fails."""
    monkeypatch.setattr(blockers, "_CANCEL", "SELECT pg_terminate_backend($1)")
    config = swap_config(federation, **CANCELLING)
    await first_sync_then_change(federation, config)
    with held(federation) as session:
        run, _ = await timed_sync(config)
        assert run.outcome == Outcome.SUCCESS, run.error
        with pytest.raises(AssertionError):
            session.assert_survived()


@pytest.mark.parametrize("reads_stats", [True, False], ids=["pg_read_all_stats", "plain"])
async def test_a_cancel_the_superhub_user_may_not_send_is_logged_and_the_bound_applies(
    federation: Federation, reads_stats: bool
) -> None:
    """The superhub user, neither a superuser nor in pg_signal_backend, may not cancel a superuser's report: with
    pg_read_all_stats it sees the query and logs swap.cancel_refused; without, it cannot even see that the session
    is active (pg_stat_activity hides other roles' state) and waits for it (swap.blocker_awaited). Either way the
    swap gives up within swap_max_wait_s + swap_cancel_wait_s and the report is untouched."""
    cluster = federation.cluster
    role = f"loader_{'stats' if reads_stats else 'plain'}"
    cluster.psql(f"DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    if reads_stats:
        cluster.psql(f"GRANT pg_read_all_stats TO {role}")
    database = new_database(cluster, "loaderhub")
    cluster.psql(f"ALTER DATABASE {database} OWNER TO {role}")
    dsn = cluster.dsn(database).replace("postgres@", f"{role}@")
    config = swap_config(federation, dsn=dsn, **CANCELLING | {"swap_cancel_wait_s": 2})
    assert [r.outcome for r in await sync(config)] == [Outcome.SUCCESS] * 3
    with held(federation, dbname=database, sleep_s=8) as session, capture_logs() as events:
        run, seconds = await timed_sync(config)
        session.assert_survived()  # its query ran to its end: nobody cancelled it
    assert run.outcome == Outcome.FAILED
    assert "(0 queries cancelled)" in (run.error or ""), run.error
    assert 3.0 <= seconds < BOUND_S
    refused = [e["application_name"] for e in events if e["event"] == "swap.cancel_refused"]
    awaited = [(e["application_name"], e["state"]) for e in events if e["event"] == "swap.blocker_awaited"]
    assert (refused, awaited) == ((["held"], []) if reads_stats else ([], [("held", None)]))
    assert not [e for e in events if e["event"] == "swap.blocker_cancelled"]


async def test_other_fedload_sessions_and_idle_transactions_are_waited_for(federation: Federation) -> None:
    """Escalated, the swap cancels neither another fedload session nor an idle transaction: it waits for them
    (swap.blocker_awaited) and swaps once they are gone; both sessions end normally."""
    config = swap_config(federation, **CANCELLING | {"swap_max_wait_s": 0.5, "swap_cancel_wait_s": 20})
    totals = await first_sync_then_change(federation, config)
    psql = [
        federation.cluster.install.tool("psql"),
        "-X",
        "-At",
        "-d",
        federation.cluster.conninfo(federation.superhub),
    ]
    env = {**os.environ, "PGAPPNAME": "idle"}
    idle = await asyncio.create_subprocess_exec(*psql, stdin=PIPE, stdout=PIPE, env=env)
    assert idle.stdin is not None
    idle.stdin.write(b"BEGIN;\nSELECT 'read:' || count(*) FROM contexts;\n")
    await idle.stdin.drain()

    async def commit_in_3_s() -> None:
        await asyncio.sleep(3.0)
        await asyncio.wait_for(idle.communicate(b"COMMIT;\nSELECT 'committed';\n"), 30)

    committing: asyncio.Task[None] | None = None
    try:
        with held(federation, application="fedload elsewhere", sleep_s=6) as other, capture_logs() as events:
            committing = asyncio.create_task(commit_in_3_s())
            run, _ = await timed_sync(config)
            other.assert_survived()
    finally:
        if committing is not None:
            await asyncio.wait_for(committing, 40)
        await end_process(idle)
    assert run.outcome == Outcome.SUCCESS, run.error
    assert run.cancelled_backends == 0
    assert (run.swap_lock_ms or 0) >= 4000  # it waited for both: contexts (idle, ~3 s), then hosts (~6 s)
    awaited = {(e["application_name"], e["state"]) for e in events if e["event"] == "swap.blocker_awaited"}
    assert {("fedload elsewhere", "active"), ("idle", "idle in transaction")} <= awaited, awaited
    assert not [e for e in events if e["event"] == "swap.blocker_cancelled"]
    assert idle.returncode == 0
    assert federation.superhub_sql(TOTALS).split()[0] == totals.new


@pytest.fixture
def reporter(federation: Federation) -> str:
    """A role that may read the superhub's tables, as report users do."""
    federation.cluster.psql("DO $$ BEGIN CREATE ROLE reporter LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    return "reporter"


@pytest.mark.parametrize("protected_by", ["role", "application"])
async def test_never_cancel_sessions_are_spared(federation: Federation, reporter: str, protected_by: str) -> None:
    """Reports of a never-cancel role or application are not cancelled: the swap stops waiting and fails instead."""
    protection = {"swap_never_cancel_roles": [reporter]} if protected_by == "role" else {}
    protection |= {"swap_never_cancel_applications": ["report"]} if protected_by == "application" else {}
    config = swap_config(
        federation,
        swap_max_wait_s=1.0,
        swap_lock_timeout_s=0.2,
        swap_on_timeout="cancel",
        swap_cancel_wait_s=5,
        **protection,
    )
    totals = await first_sync_then_change(federation, config)
    federation.superhub_sql(f"GRANT SELECT ON hosts, contexts TO {reporter}")
    with capture_logs() as events, Sessions(federation, user=reporter).running() as sessions:
        run, seconds = await timed_sync(config)
    assert run.outcome == Outcome.FAILED
    assert "swap_never_cancel" in (run.error or ""), run.error
    assert seconds < BOUND_S
    assert not [e for e in events if e["event"] == "swap.blocker_cancelled" and e["application_name"] == "report"]
    assert [e for e in events if e["event"] == "swap.blocker_spared"]
    assert_only_whole_totals(sessions.seen, totals, totals.old)
    assert federation.superhub_bool("SELECT swap_lock_failed FROM fedload.runs ORDER BY id DESC LIMIT 1")


HUB1_PARTITION = "SELECT tableoid::regclass FROM hosts WHERE hub_id = 1 LIMIT 1"


async def mvcc_swap_under_reports(fed: Federation, methods: dict[str, Any]) -> tuple[FeederRun, Totals, Sessions, str]:
    """hub1 changed, then synced by `methods` while reports run and the counter reads; its run, the totals, the
    readers, and hub1's partition of hosts before the swap."""
    config = swap_config(fed, swap_max_wait_s=1.0, swap_lock_timeout_s=0.2, **methods)
    totals = await first_sync_then_change(fed, config)
    partition = fed.superhub_sql(HUB1_PARTITION)
    with Sessions(fed).running() as sessions:
        run, seconds = await timed_sync(config)
        sessions.wait_to_see(totals.new)
    assert seconds < BOUND_S
    return run, totals, sessions, partition


@pytest.mark.parametrize(
    "methods",
    [{"swap_method": "mvcc"}, {"swap_method_tables": {"public.hosts": "mvcc"}}],
    ids=["superhub", "per-table"],
)
async def test_mvcc_swap_never_waits_for_readers(federation: Federation, methods: dict[str, Any]) -> None:
    """swap_method = "mvcc": the swap completes at its first try under constant reports; readers see old or new."""
    run, totals, sessions, partition = await mvcc_swap_under_reports(federation, methods)
    assert run.outcome == Outcome.SUCCESS, run.error
    assert run.swap_attempts == 1
    assert run.cancelled_backends == 0
    assert_only_whole_totals(sessions.seen, totals, totals.old, totals.new)
    assert totals.new in sessions.seen
    assert federation.superhub_sql(HUB1_PARTITION) == partition  # rows replaced in the same partition
    assert staging_leftovers(federation) == 0
    vacuumed = f"SELECT vacuum_count > 0 FROM pg_stat_user_tables WHERE relid = '{partition}'::regclass"
    assert federation.superhub_bool(vacuumed)  # the dead old rows are freed after the swap, not left


async def test_negative_control_a_non_atomic_mvcc_swap_is_seen(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control of "old or new, never empty": with the mvcc swap sabotaged to empty the partition in a
    transaction of its own (committed, then 1 s before the rows come back), the readers' check fails."""
    original = swap._replace_rows
    dsn = federation.cluster.dsn(federation.superhub)

    async def emptied_apart(conn: asyncpg.Connection, table: Any, partition: str) -> None:
        other = await asyncpg.connect(dsn)
        try:
            await other.execute(f"DELETE FROM {partition}")
        finally:
            await other.close()
        await asyncio.sleep(1.0)
        await original(conn, table, partition)

    monkeypatch.setattr(swap, "_replace_rows", emptied_apart)
    run, totals, sessions, _ = await mvcc_swap_under_reports(federation, {"swap_method": "mvcc"})
    assert run.outcome == Outcome.SUCCESS, run.error
    with pytest.raises(AssertionError):
        assert_only_whole_totals(sessions.seen, totals, totals.old, totals.new)
    assert "1:0:0" in sessions.seen


async def test_negative_control_a_partition_swap_detached_apart_is_seen(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control of the partition swap's atomicity: with hub1's old hosts partition detached and dropped in
    a transaction of its own (committed, 1 s before the swap attaches the new one), the counting reader's check
    fails: it saw hub1 without hosts."""
    original = swap.swap_in
    dsn = federation.cluster.dsn(federation.superhub)

    async def detached_apart(conn: asyncpg.Connection, *args: Any, **kwargs: Any) -> Any:
        other = await asyncpg.connect(dsn)
        try:
            old = await swap.feeder_partition(other, TableName("public", "hosts"), "hub1", 1)
            await other.execute(f"ALTER TABLE hosts DETACH PARTITION {old}; DROP TABLE {old}")
        finally:
            await other.close()
        await asyncio.sleep(1.0)
        return await original(conn, *args, **kwargs)

    config = swap_config(federation)
    totals = await first_sync_then_change(federation, config)
    monkeypatch.setattr(pipeline, "swap_in", detached_apart)
    with Sessions(federation).running(reports=0) as sessions:
        run, _ = await timed_sync(config)
        sessions.wait_to_see(totals.new)
    assert run.outcome == Outcome.SUCCESS, run.error
    with pytest.raises(AssertionError):
        assert_only_whole_totals(sessions.seen, totals, totals.old, totals.new)
    assert any(line.startswith("1:0:") for line in sessions.seen), sorted(sessions.seen)


async def test_partition_swap_retries_until_a_held_lock_is_released(federation: Federation) -> None:
    """A session holding a lock on a parent for a while makes the swap's short tries time out; it retries, and
    succeeds once the lock is released, within swap_max_wait_s."""
    config = swap_config(federation, swap_max_wait_s=20.0, swap_lock_timeout_s=0.2)
    totals = await first_sync_then_change(federation, config)
    cluster = federation.cluster
    argv = [cluster.install.tool("psql"), "-X", "-At", "-h", cluster.host, "-p", str(cluster.port), "-U", "postgres"]
    sql = "BEGIN; LOCK TABLE hosts IN ACCESS SHARE MODE; SELECT pg_sleep(4); COMMIT;"
    env = {**os.environ, "PGAPPNAME": "holder"}
    holder = await asyncio.create_subprocess_exec(*argv, "-d", federation.superhub, "-c", sql, env=env, stdout=DEVNULL)
    try:
        held = "SELECT count(*) FROM pg_locks JOIN pg_stat_activity USING (pid) WHERE application_name = 'holder'"
        deadline = time.monotonic() + 10
        while federation.superhub_int(held) == 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - polls the server
            await asyncio.sleep(0.05)
        with capture_logs() as events:
            run, seconds = await timed_sync(config)
        assert holder.returncode == 0  # the holder committed before the swap got its locks
    finally:
        await end_process(holder)
    assert run.outcome == Outcome.SUCCESS, run.error
    busy = [e for e in events if e["event"] == "swap.lock_busy"]
    assert len(busy) >= 2
    assert run.swap_attempts == len(busy) + 1
    assert (run.swap_lock_ms or 0) >= 1000
    assert seconds < BOUND_S
    assert federation.superhub_sql(TOTALS).split()[0] == totals.new
    assert staging_leftovers(federation) == 0


@pytest.mark.parametrize(
    "mode",
    ["SHARE UPDATE EXCLUSIVE", "ACCESS SHARE"],
    ids=["another-feeders-partition-analyzed", "another-feeders-partition-read"],
)
async def test_a_swap_does_not_wait_for_another_feeders_partition(federation: Federation, mode: str) -> None:
    """hub2's partition of hosts held as an ANALYZE or autovacuum holds it (SHARE UPDATE EXCLUSIVE), or as a report
    reading that partition alone does (ACCESS SHARE): hub1's swap locks the parents themselves and its own
    partitions, not hub2's, so it succeeds at its first try, and the holder goes on (an autovacuum that a swap
    waited for would cancel itself)."""
    config = swap_config(federation, swap_max_wait_s=1.0, swap_lock_timeout_s=0.2)
    totals = await first_sync_then_change(federation, config)
    hub2_hosts = qualified(PARTS_SCHEMA, swap.partition_name(TableName("public", "hosts"), "hub2"))
    holder = await asyncpg.connect(federation.cluster.dsn(federation.superhub))
    try:
        async with holder.transaction():
            await holder.execute(f"LOCK TABLE {hub2_hosts} IN {mode} MODE")
            with capture_logs() as events:
                run, _ = await timed_sync(config)
            assert await holder.fetchval(f"SELECT count(*) FROM {hub2_hosts}") > 0  # still in its transaction
    finally:
        await holder.close()
    assert run.outcome == Outcome.SUCCESS, run.error
    assert [e for e in events if e["event"] == "swap.lock_busy"] == []
    assert run.swap_attempts == 1
    assert federation.superhub_sql(TOTALS).split()[0] == totals.new
