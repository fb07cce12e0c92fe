"""`fedload daemon` with freshness targets, as a real subprocess on a real superhub and feeders: one lane goes to
the feeder most behind its target first, and a target the lanes cannot hold is said once and shown in status."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import urllib.request
from collections.abc import Callable

from tests.support.federation import DaemonProcess, Federation, config_toml, sync, write_script

# Per feeder: its target and its data's age when the daemon starts. Behind: hub2 by 60 times its target, hub3 by
# 50, hub1 by 40: hub1's data is the oldest, hub2's the youngest, the names go hub1 first.
_TARGETS_AGES = {"hub1": (3600.0, 144_000.0), "hub2": (0.5, 30.0), "hub3": (60.0, 3000.0)}
_HISTORY_RUN_S = 0.4  # each feeder's last run time, as its history says: a round of 1.2 s on one lane
# Each of the daemon's own runs waits this long first: longer than hub2's target, so that the verdict stays
# unreachable once measured runs replace the history (runs of unchanged tables take ~0.1 s, a round 0.3 s < 0.5 s).
_RUN_AT_LEAST_S = 0.6


def _config(fed: Federation) -> str:
    slow_agent = write_script(
        fed.tmp / "slow-agent", f'sleep {_RUN_AT_LEAST_S}\nexec "{sys.executable}" -m fedload "$@"\n'
    )
    text = config_toml(fed, interval_s=3600).replace("[superhub]\n", "[superhub]\nmax_parallel_feeders = 1\n")
    text = text.replace("[daemon]\n", '[daemon]\nmetrics_listen = "127.0.0.1:0"\n')
    for name, (target_s, _) in _TARGETS_AGES.items():
        text = text.replace(
            f"[feeders.{name}]\n",
            f'[feeders.{name}]\nfreshness_target_s = {target_s}\nagent_command = ["{slow_agent}"]\n',
        )
    return text


def _age_history(fed: Federation) -> None:
    """Each feeder's one success moved back in time to its age, lasting `_HISTORY_RUN_S`."""
    for name, (_, age_s) in _TARGETS_AGES.items():
        fed.superhub_sql(
            f"UPDATE fedload.runs SET started_at = now() - make_interval(secs => {age_s}), "
            f"finished_at = now() - make_interval(secs => {age_s - _HISTORY_RUN_S}), "
            f"data_at = now() - make_interval(secs => {age_s}) WHERE feeder = '{name}'"
        )


def _daemon_runs(fed: Federation, after_id: int) -> list[str]:
    text = fed.superhub_sql(f"SELECT string_agg(feeder, ',' ORDER BY id) FROM fedload.runs WHERE id > {after_id}")
    return [x for x in text.split(",") if x]


def _status_output(fed: Federation, *options: str) -> str:
    command = [sys.executable, "-m", "fedload", "status", *options, "--config", str(fed.tmp / "fedload.toml")]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False).stdout


def _scrape(daemon: DaemonProcess) -> str:
    """The daemon's /metrics, on the port it logged."""
    port = next(e["port"] for e in daemon.events() if e["event"] == "daemon.metrics_serving")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def _status(fed: Federation) -> dict[str, dict[str, object]]:
    return {s["feeder"]: s for s in json.loads(_status_output(fed, "--json"))}


async def test_one_lane_goes_to_the_feeder_most_behind_and_an_unreachable_target_is_reported(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess]
) -> None:
    """With one lane the daemon runs hub2, hub3, hub1 (most behind their targets first; not by age, not by name);
    hub2's 0.5 s target against a 1.2 s round is logged once as unreachable (lanes needed: 3), and status --json
    shows the verdict and the target beside each feeder, as do the metrics."""
    config_text = _config(federation)
    (federation.tmp / "fedload.toml").write_text(config_text)
    await sync(federation.config())
    _age_history(federation)
    before = federation.superhub_int("SELECT max(id) FROM fedload.runs")
    daemon = start_daemon(config_text)
    daemon.wait_for("three runs", lambda: len(_daemon_runs(federation, before)) >= 3)
    assert _daemon_runs(federation, before)[:3] == ["hub2", "hub3", "hub1"]
    daemon.wait_for("the verdict in status", lambda: _status(federation)["hub2"]["capacity"] is not None)
    hub2 = _status(federation)["hub2"]
    capacity = hub2["capacity"]
    assert isinstance(capacity, dict)
    assert capacity["reachable"] is False
    assert capacity["lanes"] == 1
    assert capacity["smallest_target_s"] == 0.5
    assert hub2["freshness_target_s"] == 0.5
    text = _status_output(federation)
    assert "\ttarget\t" in text.splitlines()[1]  # piped: the header line of tab-separated columns
    assert "FRESHNESS TARGETS UNREACHABLE: 1 lane" in text
    target = 'fedload_feeder_freshness_target_seconds{feeder="hub2"} 0.5'
    daemon.wait_for("the targets' metric", lambda: target in _scrape(daemon))
    assert "fedload_freshness_target_reachable 0.0" in _scrape(daemon)
    said = next(e for e in daemon.events() if e["event"] == "daemon.freshness_unreachable")  # the first verdict
    assert (said["round_s"], said["lanes"], said["lanes_needed"]) == (1.2, 1, 3)
    assert said["targets"] == {name: target for name, (target, _) in _TARGETS_AGES.items()}
    assert daemon.stop() == 0
    verdicts = [e["event"] for e in daemon.events() if str(e["event"]).startswith("daemon.freshness_")]
    assert all(a != b for a, b in itertools.pairwise(verdicts)), verdicts  # each said once, until it changes
