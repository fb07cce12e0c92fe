"""The daemon's verdict on its freshness targets: said once when the lanes cannot hold them, once when they can
again, exported while there is a target, gone (and forgotten once) when there is none."""

from __future__ import annotations

import dataclasses
from typing import Any

from prometheus_client import generate_latest
from structlog.testing import capture_logs

from fedload.config import Config, parse_config
from fedload.results import FeederRun, Outcome
from fedload.service.metrics import DaemonMetrics
from fedload.service.schedule import FeederSchedule
from fedload.service.target_watch import TargetWatch
from fedload.superhub.bookkeeping.connection import ShardHistories


def _config(target_s: float | None) -> Config:
    daemon: dict[str, Any] = {} if target_s is None else {"freshness_target_s": target_s}
    feeder = {"transport": "local", "interval_s": 300}
    return parse_config(
        {
            "superhub": {"dsn": "postgresql:///x", "tables": ["public.*"], "max_parallel_feeders": 1},
            "daemon": daemon,
            "feeders": {"hub1": {"key": 1, **feeder}, "hub2": {"key": 2, **feeder}},
        }
    )


def _ran(watch: TargetWatch, name: str, seconds: float) -> None:
    watch.started(name)
    run = FeederRun(feeder=name, outcome=Outcome.SUCCESS, error=None, rows={}, raw_bytes=0, dump_bytes=0, seconds=0.0)
    watch.finished(name, dataclasses.replace(run, seconds=seconds))


def _series(metrics: DaemonMetrics) -> dict[str, str]:
    lines = generate_latest(metrics.registry).decode().splitlines()
    return {line.split(" ")[0]: line.split(" ")[1] for line in lines if line.startswith("fedload_")}


def test_unreachable_is_said_once_and_cleared_once() -> None:
    """Two 30 s runs on one lane against a 45 s target: one warning with the round, lanes needed and the targets,
    the metric at 0; judged again, silence; a 90 s target: one info, the metric at 1; no target: no series."""
    config, metrics = _config(45.0), DaemonMetrics()
    watch = TargetWatch(ShardHistories(), metrics, lambda: config, lambda c: c.feeders)
    schedules = {"hub1": FeederSchedule(0.0), "hub2": FeederSchedule(0.0)}
    for name in schedules:
        _ran(watch, name, 30.0)
    with capture_logs() as first:
        report = watch.judge(schedules, paused=())
        again = watch.judge(schedules, paused=())
    assert [e["event"] for e in first] == ["daemon.freshness_unreachable"]
    said = first[0]
    assert (said["round_s"], said["lanes"], said["lanes_needed"], said["smallest_target_s"]) == (60.0, 1, 2, 45.0)
    assert said["targets"] == {"hub1": 45.0, "hub2": 45.0}
    assert report is not None
    assert not report.reachable
    assert again is None  # unchanged, recorded less than a minute ago
    assert _series(metrics)["fedload_freshness_target_reachable"] == "0.0"
    assert _series(metrics)["fedload_round_seconds"] == "60.0"
    config = _config(90.0)
    with capture_logs() as cleared:
        report = watch.judge(schedules, paused=())
    assert [e["event"] for e in cleared] == ["daemon.freshness_reachable"]
    assert report is not None
    assert report.reachable
    assert _series(metrics)["fedload_freshness_target_reachable"] == "1.0"
    config = _config(None)
    assert watch.judge(schedules, paused=()) is None
    assert "fedload_freshness_target_reachable" not in _series(metrics)
    assert (watch.forgotten(), watch.forgotten()) == (True, False)


def test_a_paused_feeder_takes_no_lane() -> None:
    """A paused feeder's run time is not counted: one 30 s run fits a 45 s target on one lane."""
    config = _config(45.0)
    watch = TargetWatch(ShardHistories(), DaemonMetrics(), lambda: config, lambda c: c.feeders)
    schedules = {"hub1": FeederSchedule(0.0), "hub2": FeederSchedule(0.0)}
    for name in schedules:
        _ran(watch, name, 30.0)
    report = watch.judge(schedules, paused=["hub2"])
    assert report is not None
    assert (report.reachable, report.round_s) == (True, 30.0)
