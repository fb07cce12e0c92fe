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
from pathlib import Path

from tests.conftest import Category
from tests.federation import (
    AGENT,
    HOST_COLS,
    DaemonProcess,
    Federation,
    config_toml,
    runs_exist,
    staging_leftovers,
    successes,
    write_script,
)


def test_daemon_syncs_repeatedly_backs_off_and_recovers(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess]
) -> None:
    """Every feeder syncs again and again; a feeder that goes away backs off (visible in status) and comes back."""
    daemon = start_daemon(config_toml(federation))
    daemon.wait_for(
        "two rounds", lambda: runs_exist(federation) and min(successes(federation, f) for f in federation.feeders) >= 2
    )
    federation.cluster.psql(f"ALTER DATABASE {federation.feeders['hub2']} RENAME TO gone_{federation.feeders['hub2']}")
    daemon.wait_for(
        "backoff of hub2",
        lambda: (
            federation.superhub_sql("SELECT coalesce(max(failures), 0) FROM fedload.schedule WHERE feeder = 'hub2'")
            not in ("", "0", "1")
        ),
    )
    status = subprocess.run(
        [sys.executable, "-m", "fedload", "status", "--json", "--config", str(federation.tmp / "fedload.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    hub2 = next(s for s in json.loads(status.stdout) if s["feeder"] == "hub2")
    assert hub2["failures"] >= 2
    assert hub2["last_outcome"] == "failed"
    assert hub2["last_error"]
    before = successes(federation, "hub1")
    daemon.wait_for("others keep going", lambda: successes(federation, "hub1") > before + 1)
    federation.cluster.psql(f"ALTER DATABASE gone_{federation.feeders['hub2']} RENAME TO {federation.feeders['hub2']}")
    recovered = successes(federation, "hub2")
    daemon.wait_for("hub2 recovers", lambda: successes(federation, "hub2") > recovered, timeout_s=90)
    assert daemon.stop() == 0
    assert any(e["event"] == "daemon.feeder_failed" for e in daemon.events())


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


def test_sigterm_mid_load_exits_cleanly_with_old_data(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess], category: Category
) -> None:
    """SIGTERM while a slow feeder loads: the run is cancelled after the grace period, old data stays, exit 0."""
    category("fault:daemon SIGTERM mid-load")
    first = start_daemon(config_toml(federation, interval_s=3600))
    first.wait_for("first round", lambda: runs_exist(federation) and successes(federation, "hub1") >= 1)
    assert first.stop() == 0
    before = federation.digest(federation.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1")
    slow = write_script(
        federation.tmp / "slow.sh",
        f'{AGENT} "$@" > {federation.tmp}/s.bin\nhead -c 5000 {federation.tmp}/s.bin; sleep 60\n',
    )
    federation.cluster.psql("INSERT INTO hosts (hostkey) VALUES ('new')", dbname=federation.feeders["hub1"])
    daemon = start_daemon(config_toml(federation, interval_s=3600, agent_command=slow))
    daemon.wait_for(
        "hub1 loading",
        lambda: (
            federation.superhub_sql("SELECT count(*) FROM fedload.runs WHERE feeder = 'hub1' AND outcome = 'running'")
            == "1"
            and (federation.tmp / "s.bin").exists()
        ),
    )
    time.sleep(1.5)
    started = time.monotonic()
    assert daemon.stop() == 0
    assert time.monotonic() - started < 15
    assert federation.digest(federation.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1") == before
    assert staging_leftovers(federation) == "0"
    assert federation.superhub_sql("SELECT error FROM fedload.runs WHERE feeder = 'hub1' ORDER BY id DESC LIMIT 1") == (
        "the run was cancelled"
    )


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
