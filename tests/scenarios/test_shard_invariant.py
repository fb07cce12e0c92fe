"""The invariant of docs/scale-out.md on the paths where a coordinator build fails or waits (issue 35): a feeder
given another shard by hand loads there only once a build reads that shard through a filter; a failed build is
retried with backoff and the pending feeder is kept until a build has switched it; SIGTERM and SIGHUP act at once
while a build waits; `sync` loads the feeders their shards hold without waiting for the build."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import asyncpg
import pytest

import fedload.service.sync as sync_module
from fedload.config import Config, parse_config
from fedload.results import Outcome
from fedload.service.sync import sync_feeders
from tests.support.federation import DaemonProcess, Federation, sync
from tests.support.shards import COUNTS, config_file, coord_sql, shard_sql, with_coordinator

LAYOUT = {"s1": ["hub1", "hub2"], "s2": ["hub3"]}
BEFORE, AFTER = "1:300,2:200,3:100", "1:300,2:201,3:100"  # hub2 gains a host: its rows tell its shard
READING = """
SELECT (SELECT string_agg(hub_id || ':' || n, ',' ORDER BY hub_id)
        FROM (SELECT hub_id, count(*) AS n FROM hosts GROUP BY 1) AS g),
       (SELECT count(*) FROM hosts WHERE hub_id = 2),
       (SELECT count(*) FROM hosts)
"""
BUILDERS_LOCK = "SELECT pg_advisory_lock(1717920876, 1)"  # the coordinator builders' lock (coordinator.py)


async def _hand_moved(federation: Federation, **superhub: object) -> tuple[Config, Path]:
    """hub1, hub2 on s1 and hub3 on s2, synced with a coordinator; hub2 then gains a host and is given s2 in the
    configuration (its file, a daemon's interval 0.5 s)."""
    config = with_coordinator(federation, LAYOUT)
    assert all(run.succeeded for run in await sync(config))
    federation.cluster.psql("INSERT INTO hosts (hostkey) VALUES ('moved')", dbname=federation.feeders["hub2"])
    document = config.model_dump(mode="json", exclude_none=True)
    document["feeders"]["hub2"]["shard"] = "s2"
    document["superhub"] |= {"worker_processes": 0, **superhub}
    for feeder in document["feeders"].values():
        feeder["interval_s"] = 0.5
    moved = parse_config(document)
    return moved, config_file(federation, moved)


def _odd(reading: asyncpg.Record) -> bool:
    """A reading that breaks the invariant: a feeder twice, hub2's filtered count other than its grouped one, or
    a total other than the sum."""
    grouped, hub2, total = reading
    counts = [part.split(":") for part in grouped.split(",")]
    keys = [key for key, _ in counts]
    return len(keys) != len(set(keys)) or dict(counts).get("2") != str(hub2) or total != sum(int(n) for _, n in counts)


async def _read_until(dsn: str, done: asyncio.Event, seen: list[asyncpg.Record]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        while not done.is_set():
            reading = await conn.fetchrow(READING)
            assert reading is not None
            seen.append(reading)
            await asyncio.sleep(0.02)
    finally:
        await conn.close()


async def _until(what: str, predicate: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _events(daemon: DaemonProcess, name: str) -> int:
    return sum(1 for e in daemon.events() if e.get("event") == name)


async def test_failed_builds_are_retried_and_the_feeder_waits_for_them(federation: Federation) -> None:
    """A report holds the coordinator's parent past swap_max_wait_s, twice: when the daemon starts (hub2, new to
    s2, waits: loading it while s2 is read directly would show it twice) and again once hub2 is loaded (its switch
    fails, hub2 stays pending and read from s1). Both builds are retried until they succeed, and a reader sees
    every feeder exactly once all along, hub2 first with its s1 rows and at last with its s2 rows."""
    config, path = await _hand_moved(federation, swap_max_wait_s=1.0, swap_lock_timeout_s=0.2)
    assert config.coordinator is not None
    dsn = config.coordinator.dsn

    seen: list[asyncpg.Record] = []
    done = asyncio.Event()
    reader = asyncio.create_task(_read_until(dsn, done, seen))
    report = await asyncpg.connect(dsn)
    daemon = DaemonProcess(path, federation.tmp / "retry.log")
    try:
        for _ in range(2):  # at start-up, then for the switch after hub2's load
            transaction = report.transaction()
            await transaction.start()
            await report.execute("LOCK TABLE ONLY hosts IN ACCESS SHARE MODE")  # as a report, on the coordinator
            failed = _events(daemon, "coordinator.build_failed")
            await _until("a failed build", lambda f=failed: _events(daemon, "coordinator.build_failed") > f)
            await asyncio.sleep(1.5)
            built = _events(daemon, "coordinator.built")
            await transaction.rollback()
            await _until("a build", lambda b=built: _events(daemon, "coordinator.built") > b)
        await _until("hub2 read from s2", lambda: any(r[0] == AFTER for r in seen))
        assert _events(daemon, "daemon.feeder_waits_for_coordinator") >= 1
        assert daemon.stop() == 0
    finally:
        daemon.stop()
        daemon.close_log()
        done.set()
        await reader
        await report.close()
    odd = [tuple(r) for r in seen if _odd(r) or r[0] not in (BEFORE, AFTER)]
    assert (odd[:5], len(seen) > 50, seen[0][0], seen[-1][0]) == ([], True, BEFORE, AFTER)
    assert [r[0] for r in seen].index(AFTER) > [r[0] for r in seen].index(BEFORE)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
async def test_signals_act_at_once_while_a_build_waits(federation: Federation, signal_name: str) -> None:
    """A session holds the coordinator builders' lock, so the daemon's build waits: SIGTERM stops the daemon
    within 2 s; SIGHUP reloads within 2 s (and the loads of the feeders their shards hold went on meanwhile)."""
    config, path = await _hand_moved(federation)
    assert config.coordinator is not None
    coord = config.coordinator.dsn

    blocker = await asyncpg.connect(coord)
    await blocker.execute(BUILDERS_LOCK)
    daemon = DaemonProcess(path, federation.tmp / f"{signal_name}.log")
    try:
        probe = await asyncpg.connect(coord)
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'"
        deadline = time.monotonic() + 60
        while await probe.fetchval(waiting) == 0:
            assert time.monotonic() < deadline, daemon.log_path.read_text()[-2000:]
            await asyncio.sleep(0.1)
        await probe.close()
        started = time.monotonic()
        if signal_name == "SIGTERM":
            daemon.process.terminate()
            await asyncio.to_thread(daemon.process.wait, 30)
            took = time.monotonic() - started
        else:
            daemon.process.send_signal(signal.SIGHUP)
            await _until("the reload", lambda: _events(daemon, "daemon.reloaded") > 0, timeout_s=30)
            took = time.monotonic() - started
            hub1 = {"event": "sync.feeder_done", "feeder": "hub1", "outcome": "success"}  # the daemon's JSON log
            loads = lambda: any(hub1.items() <= e.items() for e in daemon.events())  # noqa: E731
            await _until("hub1 (which s1 holds) loaded while the build waits", loads, timeout_s=30)
    finally:
        daemon.stop()
        daemon.close_log()
        await blocker.close()
    assert took < 2.0


async def test_sync_loads_what_its_shards_hold_while_the_build_waits(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The builders' lock held by another session: `sync` loads hub1 and hub3, which their shards hold, without
    waiting for the build; hub2, new to s2, fails after COORDINATOR_WAIT_S with one line saying why, not loaded
    there (s2 is read directly under a bound without it); the coordinator still reads it once, from s1."""
    config, _ = await _hand_moved(federation)
    assert config.coordinator is not None
    monkeypatch.setattr(sync_module, "COORDINATOR_WAIT_S", 3.0)

    blocker = await asyncpg.connect(config.coordinator.dsn)
    try:
        await blocker.execute(BUILDERS_LOCK)
        started = time.monotonic()
        runs = await sync_feeders(config, list(config.feeders))
        seconds = time.monotonic() - started
    finally:
        await blocker.close()
    assert [(r.feeder, r.outcome) for r in runs] == [
        ("hub1", Outcome.SUCCESS),
        ("hub2", Outcome.FAILED),
        ("hub3", Outcome.SUCCESS),
    ]
    assert (runs[1].error or "").startswith("feeder hub2 is not loaded on shard s2: the coordinator could not be built")
    assert seconds < 20, seconds
    assert shard_sql(federation, "s2", COUNTS.format(table="hosts")) == "3:100"
    assert coord_sql(federation, COUNTS.format(table="hosts")) == BEFORE
