"""`fedload daemon` as a real subprocess: repeated syncs, backoff and recovery, SIGHUP reload, SIGTERM mid-load."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedload.results import Outcome
from tests.support.fault_injection import sabotage_environment
from tests.support.federation import (
    AGENT,
    CONTEXT_COLS,
    HOST_COLS,
    DaemonProcess,
    Federation,
    config_toml,
    runs_exist,
    staging_leftovers,
    successes,
    sync,
    write_script,
)
from tests.support.fix_tally import Category
from tests.support.mid_copy import feeder_rows, mid_copy_agent, rows_in_flight

# Per feeder, the pause between a failed run's end and the next run's start, for each run that follows a failure.
_PAUSES_AFTER_FAILURES = """
SELECT coalesce(string_agg(extract(epoch FROM started_at - previous_end)::text, ',' ORDER BY id), '') FROM (
    SELECT id, started_at, lag(finished_at) OVER w AS previous_end, lag(outcome) OVER w AS previous_outcome
    FROM fedload.runs WHERE feeder = '{feeder}' WINDOW w AS (ORDER BY id)
) r WHERE previous_outcome = 'failed'
"""


def pauses_after_failures(fed: Federation, feeder: str) -> list[float]:
    """The seconds between each failed run of `feeder` and its next run, in order (timestamps of fedload.runs)."""
    text = fed.superhub_sql(_PAUSES_AFTER_FAILURES.format(feeder=feeder))
    return [float(x) for x in text.split(",") if x]


def assert_backoff_grows(pauses: list[float], interval_s: float) -> None:
    """The n-th retry in a row waits interval_s * 2**(n-1) (+-10 % jitter, plus the run's start-up): measured."""
    assert len(pauses) >= 3, pauses
    for n, pause in enumerate(pauses, start=1):
        planned = interval_s * 2 ** (n - 1)
        assert 0.9 * planned - 0.05 <= pause <= 1.1 * planned + 2.0, (n, planned, pauses)  # + a run's start-up


def test_daemon_syncs_repeatedly_backs_off_and_recovers(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess]
) -> None:
    """Every feeder syncs again and again; a feeder that goes away backs off (its retries measured 0.5, 1, 2 s
    apart in fedload.runs, visible in status) and comes back."""
    daemon = start_daemon(config_toml(federation))
    daemon.wait_for(
        "two rounds", lambda: runs_exist(federation) and min(successes(federation, f) for f in federation.feeders) >= 2
    )
    federation.cluster.psql(f"ALTER DATABASE {federation.feeders['hub2']} RENAME TO gone_{federation.feeders['hub2']}")
    daemon.wait_for("three retries of hub2", lambda: len(pauses_after_failures(federation, "hub2")) >= 3)
    assert_backoff_grows(pauses_after_failures(federation, "hub2")[:3], interval_s=0.5)
    status = subprocess.run(
        [sys.executable, "-m", "fedload", "status", "--json", "--config", str(federation.tmp / "fedload.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    hub2 = next(s for s in json.loads(status.stdout) if s["feeder"] == "hub2")
    assert hub2["failures"] >= 3
    assert hub2["last_outcome"] == "failed"  # the JSON of `status --json`: a contract, in its own words
    assert hub2["last_error"]
    before = successes(federation, "hub1")
    daemon.wait_for("others keep going", lambda: successes(federation, "hub1") > before + 1)
    federation.cluster.psql(f"ALTER DATABASE gone_{federation.feeders['hub2']} RENAME TO {federation.feeders['hub2']}")
    recovered = successes(federation, "hub2")
    daemon.wait_for("hub2 recovers", lambda: successes(federation, "hub2") > recovered, timeout_s=90)
    assert daemon.stop() == 0
    assert any(e["event"] == "daemon.feeder_failed" for e in daemon.events())


def test_negative_control_retries_at_the_plain_interval_are_seen(
    federation: Federation, start_daemon: Callable[..., DaemonProcess]
) -> None:
    """Negative control of "backs off": a daemon sabotaged to retry at its plain interval (failures still counted)
    fails the measurement of the pauses."""
    federation.cluster.psql(f"ALTER DATABASE {federation.feeders['hub2']} RENAME TO gone_{federation.feeders['hub2']}")
    env = sabotage_environment("no-backoff", federation.tmp)
    daemon = start_daemon(config_toml(federation).split("[feeders.hub3]")[0], env)
    daemon.wait_for(
        "three retries of hub2", lambda: runs_exist(federation) and len(pauses_after_failures(federation, "hub2")) >= 3
    )
    assert daemon.stop() == 0
    with pytest.raises(AssertionError):
        assert_backoff_grows(pauses_after_failures(federation, "hub2")[:3], interval_s=0.5)


def test_sighup_reloads_and_keeps_old_config_when_invalid(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess]
) -> None:
    """SIGHUP with a broken file logs the problem and keeps running; with a valid file it applies it."""
    text = config_toml(federation, interval_s=3600)
    daemon = start_daemon(text)
    config = federation.tmp / "fedload.toml"
    daemon.wait_for("first round", lambda: runs_exist(federation) and successes(federation, "hub3") >= 1)
    config.write_text(text.replace("[superhub]", "[superhub]\nbogus_key = 1"))
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_for("reload failure", lambda: any(e["event"] == "daemon.reload_failed" for e in daemon.events()))
    failure = next(e for e in daemon.events() if e["event"] == "daemon.reload_failed")
    assert "superhub.bogus_key: unknown key" in str(failure["problems"])
    config.write_text(text.split("[feeders.hub3]")[0])
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_for("reload", lambda: any(e["event"] == "daemon.reloaded" for e in daemon.events()))
    reloaded = next(e for e in daemon.events() if e["event"] == "daemon.reloaded")
    assert reloaded["removed"] == ["hub3"]
    assert daemon.stop() == 0


@dataclass
class Stopped:
    """A daemon stopped by SIGTERM while hub1's dump paused: how long the stop took, hub1's last run, its data."""

    seconds: float
    outcome: Outcome
    error: str | None
    data: tuple[str, str]
    after_resume_s: float | None  # from the agent's resuming its stream to the daemon's exit (None: never resumed)


async def sigterm_while_paused(
    fed: Federation, start_daemon: Callable[..., DaemonProcess], *, pause_s: float, grace_s: float, **env: str
) -> tuple[Stopped, tuple[str, str]]:
    """hub1 synced once, grown past several stream blocks, then loaded by a daemon whose agent pauses `pause_s`
    after the first half of its stream; SIGTERM once the superhub's COPY has rows in flight. What the stop did,
    and hub1's rows before."""
    assert (await sync(fed.config(), "hub1"))[0].outcome == Outcome.SUCCESS
    before = feeder_rows(fed)
    mid_copy_agent(fed)  # grows hub1; the agent below cuts its stream the same way
    stream, half = fed.tmp / "s.bin", f"$(( $(stat -c %s {fed.tmp}/s.bin) / 2 ))"
    slow = write_script(
        fed.tmp / "slow.sh",
        f'{AGENT} "$@" > {stream}\nhead -c {half} {stream}; sleep {pause_s}; date +%s.%N > {fed.tmp}/resumed\n'
        f"tail -c +$(({half} + 1)) {stream}\n",
    )
    text = config_toml(fed, interval_s=3600, agent_command=slow).split("[feeders.hub2]")[0]
    daemon = start_daemon(text.replace("shutdown_grace_s = 1", f"shutdown_grace_s = {grace_s}"), env or None)
    daemon.wait_for("hub1 mid-COPY", lambda: runs_exist(fed) and rows_in_flight(fed) > 0, timeout_s=120)
    started = time.monotonic()
    assert daemon.stop() == 0
    seconds, stopped_at = time.monotonic() - started, time.time()
    resumed = fed.tmp / "resumed"
    resumed_s = stopped_at - float(resumed.read_text()) if resumed.exists() else None
    last = fed.superhub_sql("SELECT outcome || '|' || coalesce(error, '') FROM fedload.runs ORDER BY id DESC LIMIT 1")
    outcome, _, error = last.partition("|")
    return Stopped(seconds, Outcome(outcome), error or None, feeder_rows(fed), resumed_s), before


def feeder_digests(fed: Federation, feeder: str) -> tuple[str, str]:
    """A feeder's own rows of every table, as `feeder_rows` reads them on the superhub."""
    db = fed.feeders[feeder]
    return fed.digest(db, "hosts", HOST_COLS), fed.digest(db, "contexts", CONTEXT_COLS)


def assert_finished_within_grace(stopped: Stopped, fed: Federation, *, pause_s: float, grace_s: float) -> None:
    """The run that could finish within the grace period did: success, the new data in, the daemon gone after the
    agent resumed its stream and within the grace period."""
    assert (stopped.outcome, stopped.error) == (Outcome.SUCCESS, None)
    assert stopped.data == feeder_digests(fed, "hub1")
    assert stopped.seconds < grace_s, stopped
    assert stopped.after_resume_s is not None, stopped  # the daemon waited for the rest of the stream
    assert 0 <= stopped.after_resume_s < grace_s, stopped


async def test_sigterm_lets_a_run_that_can_finish_within_the_grace_period_finish(
    federation: Federation, start_daemon: Callable[..., DaemonProcess]
) -> None:
    """SIGTERM while a feeder loads, its dump 3 s from its end, shutdown_grace_s = 20: the daemon waits for it;
    the run succeeds and the stop takes about the 3 s."""
    stopped, _ = await sigterm_while_paused(federation, start_daemon, pause_s=3, grace_s=20)
    assert_finished_within_grace(stopped, federation, pause_s=3, grace_s=20)
    assert staging_leftovers(federation) == 0


async def test_negative_control_a_daemon_that_cancels_at_once_is_seen(
    federation: Federation, start_daemon: Callable[..., DaemonProcess]
) -> None:
    """Negative control of the grace period: a daemon sabotaged to cancel its runs at SIGTERM (grace 0) fails the
    check of the run that could have finished."""
    env = sabotage_environment("no-grace", federation.tmp)
    stopped, before = await sigterm_while_paused(federation, start_daemon, pause_s=3, grace_s=20, **env)
    with pytest.raises(AssertionError):
        assert_finished_within_grace(stopped, federation, pause_s=3, grace_s=20)
    assert (stopped.outcome, stopped.data) == (Outcome.FAILED, before)


async def test_sigterm_cancels_a_run_that_cannot_finish_at_the_grace_bound(
    federation: Federation, start_daemon: Callable[..., DaemonProcess], category: Category
) -> None:
    """SIGTERM while a feeder's dump hangs, shutdown_grace_s = 3: the run is cancelled when the grace period ends
    (the stop takes 3 s and little more), old data stays, no staging left, exit 0."""
    category("fault:daemon SIGTERM mid-load")
    stopped, before = await sigterm_while_paused(federation, start_daemon, pause_s=60, grace_s=3)
    assert 3.0 <= stopped.seconds < 3.0 + 10.0, stopped
    assert (stopped.outcome, stopped.error, stopped.data) == (Outcome.FAILED, "the run was cancelled", before)
    assert staging_leftovers(federation) == 0


def test_ready_at_once_while_the_superhub_is_down(tmp_path: Path) -> None:
    """Under systemd with the superhub down: READY=1 and watchdog pings at once, STATUS says it retries; SIGTERM
    then exits 0 without ever logging daemon.started."""
    config = tmp_path / "fedload.toml"
    config.write_text(
        '[superhub]\ndsn = "postgresql://fedload@127.0.0.1:1/superhub"\ntables = ["public.t"]\n'
        '[feeders.hub1]\nkey = 1\ntransport = "local"\n'
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(tmp_path / "notify"))
        notify.settimeout(20)
        env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1000000"}
        daemon = subprocess.Popen(
            [sys.executable, "-m", "fedload", "--log-format", "json", "daemon", "--config", str(config)],
            env=env,
            stderr=subprocess.PIPE,
        )
        try:
            messages = [notify.recv(4096).decode()]
            while not any("retry 2 in" in m for m in messages):
                messages.append(notify.recv(4096).decode())
        finally:
            daemon.send_signal(signal.SIGTERM)
            _, stderr = daemon.communicate(timeout=30)
    assert messages[0] == "READY=1\nSTATUS=connecting to the superhub"
    assert "WATCHDOG=1" in messages
    retry = next(m for m in messages if m.startswith("STATUS=superhub unavailable, retry 1 in "))
    assert "cannot connect to the superhub" in retry
    assert daemon.returncode == 0
    events = [json.loads(line)["event"] for line in stderr.decode().splitlines()]
    assert "daemon.superhub_unavailable" in events
    assert "daemon.started" not in events
    assert events[-2:] == ["daemon.stop_requested", "daemon.stopped"]
