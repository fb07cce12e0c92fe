"""Swaps under constant reporting: long readers that never leave a gap, per swap method and timeout policy."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from fedload.commands.status import read_status
from fedload.config import Config, SuperhubConfig
from fedload.superhub.pipeline import FeederRun
from tests.federation import Federation, staging_leftovers, sync

LONG_QUERY = "SELECT count(*), pg_sleep(2) FROM hosts"
COUNTS = "SELECT hub_id || ':' || count(*) FROM hosts GROUP BY hub_id"
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
        self.seen: set[str] = set()  # "hub_id:count" lines the counting reader saw

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
            status, out = self._psql(COUNTS, env)
            if status == 0:
                self.seen.update(out.split())
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


def first_sync_then_change(fed: Federation, config: Config) -> tuple[str, str]:
    """Sync all feeders, then delete some of hub1's hosts; hub1's old and new "1:count" lines."""
    assert [r.outcome for r in sync(config)] == ["success"] * 3
    old = fed.superhub_sql("SELECT count(*) FROM hosts WHERE hub_id = 1")
    fed.cluster.psql("DELETE FROM hosts WHERE hostkey LIKE 'SHA=1%'", dbname=fed.feeders["hub1"])
    new = fed.cluster.psql("SELECT count(*) FROM hosts", dbname=fed.feeders["hub1"]).strip()
    return f"1:{old}", f"1:{new}"


def timed_sync(config: Config) -> tuple[FeederRun, float]:
    """Sync hub1; its run and the seconds it took."""
    started = time.monotonic()
    run = sync(config, "hub1")[0]
    return run, time.monotonic() - started


def assert_only_whole_totals(seen: set[str], allowed: set[str]) -> None:
    """The counting reader saw each feeder's old or new total, never a mix; other feeders never changed."""
    assert {line for line in seen if line.startswith("1:")} <= allowed, seen
    assert {line.split(":")[0] for line in seen} <= {"1", "2", "3"}


def test_partition_swap_fails_in_bound_and_status_flags_it(federation: Federation) -> None:
    """swap_on_timeout = "fail": the swap gives up after swap_max_wait_s; old data stays; status flags the feeder."""
    config = swap_config(federation, swap_max_wait_s=1.0, swap_lock_timeout_s=0.2)
    old, new = first_sync_then_change(federation, config)
    with Sessions(federation).running() as sessions:
        runs = [timed_sync(config) for _ in range(2)]
    for run, seconds in runs:
        assert run.outcome == "failed"
        assert "could not lock the parent tables of feeder hub1" in (run.error or "")
        assert seconds < BOUND_S
        assert (run.swap_attempts or 0) > 1
    assert_only_whole_totals(sessions.seen, {old})
    assert federation.superhub_sql("SELECT count(*) FROM hosts WHERE hub_id = 1") == old.split(":")[1]
    assert staging_leftovers(federation) == "0"
    hub1 = next(s for s in asyncio.run(read_status(config)) if s.feeder == "hub1")
    assert hub1.swaps_starved
    assert hub1.swap_lock_failures == 2
    assert (hub1.swap_attempts or 0) > 1
    assert (hub1.swap_wait_ms or 0) >= 1000
    assert new != old


def test_partition_swap_cancels_blocking_reports(federation: Federation) -> None:
    """swap_on_timeout = "cancel": the blocking reports are cancelled, logged and counted; the swap completes."""
    config = swap_config(
        federation, swap_max_wait_s=1.0, swap_lock_timeout_s=0.2, swap_on_timeout="cancel", swap_cancel_wait_s=5
    )
    old, new = first_sync_then_change(federation, config)
    with capture_logs() as events, Sessions(federation).running() as sessions:
        run, seconds = timed_sync(config)
        time.sleep(0.3)  # the counter sees the new total
    assert run.outcome == "success", run.error
    assert seconds < BOUND_S
    cancelled = [e for e in events if e["event"] == "swap.blocker_cancelled"]
    assert cancelled
    assert run.cancelled_backends == len(cancelled)
    report = next(e for e in cancelled if e["application_name"] == "report")
    assert report["query"] == LONG_QUERY
    assert report["user"] == "postgres"
    assert report["query_start"]
    assert report["pid"]
    assert_only_whole_totals(sessions.seen, {old, new})
    assert new in sessions.seen
    recorded = federation.superhub_sql("SELECT cancelled_backends FROM fedload.runs ORDER BY id DESC LIMIT 1")
    assert recorded == str(len(cancelled))


@pytest.fixture
def reporter(federation: Federation) -> str:
    """A role that may read the superhub's tables, as report users do."""
    federation.cluster.psql("DO $$ BEGIN CREATE ROLE reporter LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    return "reporter"


@pytest.mark.parametrize("protected_by", ["role", "application"])
def test_never_cancel_sessions_are_spared(federation: Federation, reporter: str, protected_by: str) -> None:
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
    old, _ = first_sync_then_change(federation, config)
    federation.superhub_sql(f"GRANT SELECT ON hosts TO {reporter}")
    with capture_logs() as events, Sessions(federation, user=reporter).running() as sessions:
        run, seconds = timed_sync(config)
    assert run.outcome == "failed"
    assert "swap_never_cancel" in (run.error or ""), run.error
    assert seconds < BOUND_S
    assert not [e for e in events if e["event"] == "swap.blocker_cancelled" and e["application_name"] == "report"]
    assert [e for e in events if e["event"] == "swap.blocker_spared"]
    assert_only_whole_totals(sessions.seen, {old})
    assert federation.superhub_sql("SELECT swap_lock_failed FROM fedload.runs ORDER BY id DESC LIMIT 1") == "t"


@pytest.mark.parametrize(
    "methods",
    [{"swap_method": "mvcc"}, {"swap_method_tables": {"public.hosts": "mvcc"}}],
    ids=["superhub", "per-table"],
)
def test_mvcc_swap_never_waits_for_readers(federation: Federation, methods: dict[str, Any]) -> None:
    """swap_method = "mvcc": the swap completes at its first try under constant reports; readers see old or new."""
    config = swap_config(federation, swap_max_wait_s=1.0, swap_lock_timeout_s=0.2, **methods)
    old, new = first_sync_then_change(federation, config)
    partition = federation.superhub_sql("SELECT tableoid::regclass FROM hosts WHERE hub_id = 1 LIMIT 1")
    with Sessions(federation).running() as sessions:
        run, seconds = timed_sync(config)
        time.sleep(0.3)
    assert run.outcome == "success", run.error
    assert seconds < BOUND_S
    assert run.swap_attempts == 1
    assert run.cancelled_backends == 0
    assert_only_whole_totals(sessions.seen, {old, new})
    assert new in sessions.seen
    assert federation.superhub_sql("SELECT tableoid::regclass FROM hosts WHERE hub_id = 1 LIMIT 1") == partition
    assert staging_leftovers(federation) == "0"
    vacuumed = f"SELECT vacuum_count > 0 FROM pg_stat_user_tables WHERE relid = '{partition}'::regclass"
    assert federation.superhub_sql(vacuumed) == "t"  # the dead old rows are freed after the swap, not left


def test_partition_swap_retries_until_a_held_lock_is_released(federation: Federation) -> None:
    """A session holding a lock on a parent for a while makes the swap's short tries time out; it retries, and
    succeeds once the lock is released, within swap_max_wait_s."""
    config = swap_config(federation, swap_max_wait_s=20.0, swap_lock_timeout_s=0.2)
    _, new = first_sync_then_change(federation, config)
    cluster = federation.cluster
    argv = [cluster.install.tool("psql"), "-X", "-At", "-h", cluster.host, "-p", str(cluster.port), "-U", "postgres"]
    sql = "BEGIN; LOCK TABLE hosts IN ACCESS SHARE MODE; SELECT pg_sleep(4); COMMIT;"
    env = {**os.environ, "PGAPPNAME": "holder"}
    holder = subprocess.Popen([*argv, "-d", federation.superhub, "-c", sql], env=env, stdout=subprocess.DEVNULL)
    try:
        held = "SELECT count(*) FROM pg_locks JOIN pg_stat_activity USING (pid) WHERE application_name = 'holder'"
        deadline = time.monotonic() + 10
        while federation.superhub_sql(held) == "0" and time.monotonic() < deadline:
            time.sleep(0.05)
        with capture_logs() as events:
            run, seconds = timed_sync(config)
        assert holder.poll() == 0  # the holder committed before the swap got its locks
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert run.outcome == "success", run.error
    busy = [e for e in events if e["event"] == "swap.lock_busy"]
    assert len(busy) >= 2
    assert run.swap_attempts == len(busy) + 1
    assert (run.swap_lock_ms or 0) >= 1000
    assert seconds < BOUND_S
    assert f"1:{federation.superhub_sql('SELECT count(*) FROM hosts WHERE hub_id = 1')}" == new
    assert staging_leftovers(federation) == "0"
