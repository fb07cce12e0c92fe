"""A paused feeder and the daemon: skipped (said once, in the log and the metrics) while the others go on, still
skipped by a restarted daemon, run again after `resume`; a run under way when the pause comes finishes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fedload.results import Outcome
from fedload.service.sync import sync_feeders
from tests.service.test_metrics import Samples, metrics_port, scrape, with_metrics
from tests.support.federation import (
    AGENT,
    CONTEXT_COLS,
    DaemonProcess,
    Federation,
    config_toml,
    fedload,
    runs_exist,
    successes,
    sync,
    write_script,
)
from tests.support.mid_copy import feeder_rows, grow, rows_in_flight_soon


def _runs(fed: Federation, feeder: str) -> int:
    return fed.superhub_int(f"SELECT count(*) FROM fedload.runs WHERE feeder = '{feeder}'")


def _logged(daemon: DaemonProcess, event: str) -> list[dict[str, object]]:
    return [e for e in daemon.events() if e["event"] == event]


def _paused_series(samples: Samples) -> dict[str, float]:
    """fedload_feeder_paused by feeder, and whether a paused-since series exists for it (as 2.0)."""
    out: dict[str, float] = {}
    for (name, labels), value in samples.items():
        feeder = dict(labels).get("feeder", "")
        if name == "fedload_feeder_paused":
            out[feeder] = out.get(feeder, 0.0) + value
        elif name == "fedload_feeder_paused_since_timestamp_seconds":
            out[feeder] = out.get(feeder, 0.0) + (2.0 if value > 0 else 0.0)
    return out


def _wait_metrics(daemon: DaemonProcess, port: int, expected: dict[str, float]) -> None:
    daemon.wait_for(f"metrics {expected}", lambda: _paused_series(scrape(port)) == expected, timeout_s=30)


def _hub2_stays_skipped(daemon: DaemonProcess, fed: Federation) -> None:
    """While hub1 syncs three more times, hub2 gets no run at all."""
    runs, before = _runs(fed, "hub2"), successes(fed, "hub1")
    daemon.wait_for("three more runs of hub1", lambda: successes(fed, "hub1") >= before + 3)
    assert _runs(fed, "hub2") == runs


def test_the_daemon_skips_a_paused_feeder_across_a_restart_until_resumed(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess]
) -> None:
    """hub2 paused: the daemon logs daemon.feeder_paused once with the reason, runs hub1 on and hub2 never, its
    metrics say hub2 is paused (and since when), its data stays; a restarted daemon skips it too; after resume
    the daemon logs daemon.feeder_resumed and runs it again."""
    text = with_metrics(config_toml(federation))
    config = federation.tmp / "fedload.toml"
    daemon = start_daemon(text)
    port = metrics_port(daemon)
    daemon.wait_for(
        "a success of each",
        lambda: runs_exist(federation) and min(successes(federation, f) for f in ("hub1", "hub2")) >= 1,
    )
    _wait_metrics(daemon, port, {"hub1": 0.0, "hub2": 0.0})
    paused = fedload("feeder", "pause", "hub2", "--reason", "hub2 upgrade", "--config", str(config))
    assert paused.returncode == 0, paused.stderr
    daemon.wait_for("the pause seen", lambda: bool(_logged(daemon, "daemon.feeder_paused")))
    _hub2_stays_skipped(daemon, federation)
    [event] = _logged(daemon, "daemon.feeder_paused")
    assert (event["feeder"], event["reason"]) == ("hub2", "hub2 upgrade")
    _wait_metrics(daemon, port, {"hub1": 0.0, "hub2": 3.0})  # paused, with its since series
    assert federation.superhub_int("SELECT count(*) FROM hosts WHERE hub_id = 2") == 200
    assert daemon.stop() == 0

    again = start_daemon(text)
    again.wait_for("the pause seen again", lambda: bool(_logged(again, "daemon.feeder_paused")))
    _hub2_stays_skipped(again, federation)
    resumed = fedload("feeder", "resume", "hub2", "--config", str(config))
    assert resumed.returncode == 0, resumed.stderr
    before = successes(federation, "hub2")
    again.wait_for("hub2 runs again", lambda: successes(federation, "hub2") > before, timeout_s=30)
    assert [e["feeder"] for e in _logged(again, "daemon.feeder_resumed")] == ["hub2"]
    _wait_metrics(again, metrics_port(again), {"hub1": 0.0, "hub2": 0.0})
    assert again.stop() == 0


async def test_a_pause_does_not_stop_a_run_under_way(federation: Federation) -> None:
    """hub1 paused while its run is mid-COPY (its agent holds the second half of the stream for 3 s): the run goes
    on and succeeds with the new data; the next sync without names skips it."""
    assert (await sync(federation.config(), "hub1"))[0].outcome == Outcome.SUCCESS
    grow(federation)
    stream, half = federation.tmp / "s.bin", f"$(( $(stat -c %s {federation.tmp}/s.bin) / 2 ))"
    slow = write_script(
        federation.tmp / "slow.sh",
        f'{AGENT} "$@" > {stream}\nhead -c {half} {stream}; sleep 3\ntail -c +$(({half} + 1)) {stream}\n',
    )
    config = federation.config(agent_command=[slow])
    path = federation.tmp / "fedload.toml"
    path.write_text(config_toml(federation))
    run = asyncio.create_task(sync_feeders(config, ["hub1"], skip_paused=True))
    await rows_in_flight_soon(federation)
    started = time.monotonic()
    paused = await asyncio.to_thread(fedload, "feeder", "pause", "hub1", "--config", str(path))
    assert paused.returncode == 0, paused.stderr
    [done] = await run
    assert (done.outcome, done.error) == (Outcome.SUCCESS, None)
    assert time.monotonic() - started < 60
    assert feeder_rows(federation)[1] == federation.digest(federation.feeders["hub1"], "contexts", CONTEXT_COLS)
    [skipped] = await sync_feeders(config, ["hub1"], skip_paused=True)
    assert skipped.outcome == Outcome.PAUSED
