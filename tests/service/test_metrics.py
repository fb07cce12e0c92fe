"""The daemon's Prometheus metrics: scraped over HTTP from a real daemon, they agree with the run history."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedload import __version__
from fedload.config import parse_config
from fedload.errors import ConfigError, ErrorKind
from fedload.results import FeederRun, Outcome
from fedload.service.metrics import DaemonMetrics, FeederState
from tests.federation import DaemonProcess, Federation, config_toml, runs_exist, successes, write_script

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Per feeder, from the run history: finished runs by outcome, failures by kind, timestamps, rows, bytes, swaps.
_HISTORY = """
SELECT 'runs', feeder, outcome, count(*)::float8 FROM fedload.runs WHERE outcome <> 'running' GROUP BY 2, 3
UNION ALL SELECT 'failures', feeder, error_kind, count(*) FROM fedload.runs WHERE outcome = 'failed' GROUP BY 2, 3
UNION ALL SELECT 'durations', feeder, '', count(*) FROM fedload.runs WHERE outcome <> 'running' GROUP BY 2
UNION ALL SELECT 'swaps', feeder, '', count(*) FROM fedload.runs WHERE swap_lock_ms IS NOT NULL GROUP BY 2
UNION ALL SELECT 'bytes', feeder, '', sum(raw_bytes) FROM fedload.runs WHERE outcome <> 'running' GROUP BY 2
UNION ALL SELECT 'rows', feeder, '', sum(value::bigint) FROM fedload.runs, jsonb_each_text(rows)
    WHERE outcome = 'success' GROUP BY 2
UNION ALL SELECT 'last_success', feeder, '', extract(epoch FROM max(finished_at)) FROM fedload.runs
    WHERE outcome = 'success' GROUP BY 2
UNION ALL SELECT 'last_run', feeder, '', extract(epoch FROM max(finished_at)) FROM fedload.runs
    WHERE outcome <> 'running' GROUP BY 2
ORDER BY 1, 2, 3
"""
# What the metrics say of the same, in the same shape.
_FROM_METRICS = {
    "fedload_runs_total": ("runs", "outcome"),
    "fedload_run_failures_total": ("failures", "error_kind"),
    "fedload_run_duration_seconds_count": ("durations", None),
    "fedload_swap_lock_wait_seconds_count": ("swaps", None),
    "fedload_bytes_received_total": ("bytes", None),
    "fedload_rows_loaded_total": ("rows", None),
    "fedload_feeder_last_success_timestamp_seconds": ("last_success", None),
    "fedload_feeder_last_run_timestamp_seconds": ("last_run", None),
}


def scrape(port: int) -> Samples:
    """GET /metrics and parse it as Prometheus does: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def history(fed: Federation) -> dict[tuple[str, str, str], float]:
    """The run history, summed up as in `_HISTORY` (zeros left out, like series at zero in `as_history`)."""
    out = {}
    for line in fed.superhub_sql(_HISTORY).splitlines():
        what, feeder, label, value = line.split("|")
        if float(value):
            out[what, feeder, label] = float(value)
    return out


def as_history(samples: Samples) -> dict[tuple[str, str, str], float]:
    """The metrics in the shape of `history` (series at zero left out, as the history has no row for them)."""
    out = {}
    for (name, labels), value in samples.items():
        if name in _FROM_METRICS and value:
            what, label = _FROM_METRICS[name]
            tags = dict(labels)
            out[what, tags["feeder"], tags[label] if label else ""] = value
    return out


def differences(expected: dict[tuple[str, str, str], float], got: dict[tuple[str, str, str], float]) -> list[str]:
    """Keys whose values differ (timestamps to the millisecond, counts exactly)."""
    return [
        f"{key}: history {expected.get(key)}, metrics {got.get(key)}"
        for key in sorted(expected.keys() | got.keys())
        if key not in expected or key not in got or abs(expected[key] - got[key]) > 1e-3
    ]


def agreeing(daemon: DaemonProcess, fed: Federation, port: int, timeout_s: float = 60.0) -> Samples:
    """A scrape that agrees with the run history read just before and just after it (no run ended in between);
    fails with the differences if none does within `timeout_s`."""
    deadline, problems = time.monotonic() + timeout_s, ["no scrape yet"]
    while time.monotonic() < deadline:
        assert daemon.process.poll() is None, daemon.log_path.read_text()[-3000:]
        before, samples, after = history(fed), scrape(port), history(fed)
        if before == after and not (problems := differences(before, as_history(samples))):
            return samples
        time.sleep(0.2)
    pytest.fail(f"the metrics never agreed with fedload.runs: {problems}")


def metrics_port(daemon: DaemonProcess) -> int:
    """The port the daemon serves its metrics on (it was told port 0: any free one)."""
    daemon.wait_for("metrics", lambda: any(e["event"] == "daemon.metrics_serving" for e in daemon.events()))
    event = next(e for e in daemon.events() if e["event"] == "daemon.metrics_serving")
    assert event["listen"] == "127.0.0.1:0"
    return int(str(event["port"]))


def with_metrics(text: str) -> str:
    """A daemon configuration that serves metrics on 127.0.0.1, any free port, without hub3."""
    return text.split("[feeders.hub3]", maxsplit=1)[0].replace(
        "[daemon]\n", '[daemon]\nmetrics_listen = "127.0.0.1:0"\n'
    )


def failures(fed: Federation, feeder: str) -> int:
    """Failed runs of a feeder so far."""
    return int(fed.superhub_sql(f"SELECT count(*) FROM fedload.runs WHERE feeder = '{feeder}' AND outcome = 'failed'"))


def test_metrics_agree_with_the_run_history(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess]
) -> None:
    """Two feeders, one failing, several runs each (in worker processes): counts, outcomes, error kinds, rows, bytes
    and timestamps scraped from /metrics equal those of fedload.runs; the superhub is up, the version shown."""
    failing = write_script(federation.tmp / "fail.sh", "echo no dump here >&2\nexit 3\n")
    daemon = start_daemon(with_metrics(config_toml(federation, interval_s=1, agent_command=failing)))
    port = metrics_port(daemon)
    daemon.wait_for(
        "runs of both feeders",
        lambda: runs_exist(federation) and successes(federation, "hub2") >= 3 and failures(federation, "hub1") >= 2,
    )
    samples = agreeing(daemon, federation, port)
    assert samples["fedload_runs_total", (("feeder", "hub1"), ("outcome", "success"))] == 0
    assert samples["fedload_runs_total", (("feeder", "hub2"), ("outcome", "success"))] >= 3
    assert samples["fedload_run_failures_total", (("error_kind", ErrorKind.TRANSPORT), ("feeder", "hub1"))] >= 2
    assert samples["fedload_feeder_consecutive_failures", (("feeder", "hub2"),)] == 0
    assert samples["fedload_feeder_consecutive_failures", (("feeder", "hub1"),)] >= 2
    assert ("fedload_feeder_last_success_timestamp_seconds", (("feeder", "hub1"),)) not in samples  # never succeeded
    assert samples["fedload_rows_loaded_total", (("feeder", "hub2"),)] > 0
    assert samples["fedload_superhub_up", ()] == 1
    assert samples["fedload_worker_processes", ()] >= 1
    assert samples["fedload_build_info", (("version", __version__),)] == 1
    assert daemon.stop() == 0


def test_a_restarted_daemon_reports_freshness_from_the_history(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess]
) -> None:
    """After a restart, before any new run has ended, the last-success and last-run timestamps are those of
    fedload.runs (and of the daemon before), not missing: no false "never succeeded" after a deploy."""
    first = start_daemon(with_metrics(config_toml(federation, interval_s=3600)))
    port = metrics_port(first)
    first.wait_for(
        "a success each",
        lambda: runs_exist(federation) and min(successes(federation, f) for f in ("hub1", "hub2")) >= 1,
    )
    before = agreeing(first, federation, port)
    assert first.stop() == 0
    finished = history(federation)
    slow = write_script(federation.tmp / "slow.sh", "sleep 60\n")
    text = with_metrics(config_toml(federation, interval_s=3600))
    second = start_daemon(text.replace('transport = "local"', f'transport = "local"\nagent_command = ["{slow}"]'))
    port = metrics_port(second)
    second.wait_for("the superhub check", lambda: scrape(port).get(("fedload_superhub_up", ())) == 1)
    after = scrape(port)
    assert history(federation) == finished  # no run ended meanwhile
    timestamps = {key: value for key, value in finished.items() if key[0] in ("last_success", "last_run")}
    assert len(timestamps) == 4
    assert not differences(timestamps, {k: v for k, v in as_history(after).items() if k in timestamps})
    for feeder in ("hub1", "hub2"):
        key = ("fedload_feeder_last_success_timestamp_seconds", (("feeder", feeder),))
        assert after[key] == pytest.approx(before[key], abs=1e-3)
        assert after[key] > time.time() - 600
        assert after["fedload_runs_total", (("feeder", feeder), ("outcome", "success"))] == 0  # a new process
    assert second.stop() == 0


def test_metrics_port_in_use_is_a_clear_start_up_error(tmp_path: Path) -> None:
    """A metrics address already in use: one line naming the setting and the address, exit 2, before anything."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "fedload.toml"
        config.write_text(
            f'[superhub]\ndsn = "postgresql://fedload@127.0.0.1:1/superhub"\ntables = ["public.t"]\n'
            f'[daemon]\nmetrics_listen = "127.0.0.1:{port}"\n'
        )
        daemon = subprocess.run(
            [sys.executable, "-m", "fedload", "daemon", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert daemon.returncode == 2
    assert daemon.stderr.splitlines() == [
        f"fedload: daemon.metrics_listen: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    ]


@pytest.mark.parametrize("listen", ["9187", "localhost", "::1:9187", "127.0.0.1:65536", "127.0.0.1:http"])
def test_metrics_listen_must_be_host_and_port(listen: str) -> None:
    """metrics_listen is HOST:PORT (an IPv6 host in brackets), or the file is refused."""
    with pytest.raises(ConfigError, match=r"daemon\.metrics_listen: .* is not HOST:PORT"):
        parse_config({"superhub": {"dsn": "x", "tables": ["public.t"]}, "daemon": {"metrics_listen": listen}})


def test_a_busy_run_is_counted_as_busy_only() -> None:
    """A busy run did nothing: it counts under outcome "busy" and adds no duration, failure, bytes or rows."""
    metrics = DaemonMetrics()
    metrics.add_feeders(["hub1"])
    busy = FeederRun(feeder="hub1", outcome=Outcome.BUSY, error=None, rows={}, raw_bytes=0, dump_bytes=0, seconds=0)
    failed = FeederRun.failed("hub1", "unreachable", kind=ErrorKind.TRANSPORT, seconds=2.0)
    metrics.record_run(busy)
    metrics.record_run(failed)
    value = metrics.registry.get_sample_value
    assert value("fedload_runs_total", {"feeder": "hub1", "outcome": "busy"}) == 1
    assert value("fedload_runs_total", {"feeder": "hub1", "outcome": "failed"}) == 1
    assert value("fedload_runs_total", {"feeder": "hub1", "outcome": "success"}) == 0
    assert value("fedload_run_failures_total", {"feeder": "hub1", "error_kind": "transport"}) == 1
    assert value("fedload_run_duration_seconds_count", {"feeder": "hub1"}) == 1
    assert value("fedload_run_duration_seconds_sum", {"feeder": "hub1"}) == 2.0
    metrics.remove_feeders(["hub1"])
    assert value("fedload_runs_total", {"feeder": "hub1", "outcome": "busy"}) is None


def test_deploy_files_name_only_exported_metrics() -> None:
    """Every fedload_* name in the alert rules, the scrape example and the dashboard is one the daemon exports."""
    metrics = DaemonMetrics()
    metrics.add_feeders(["hub1"])
    metrics.record_run(
        FeederRun(
            feeder="hub1",
            outcome=Outcome.SUCCESS,
            error=None,
            rows={},
            raw_bytes=0,
            dump_bytes=0,
            seconds=1.0,
            swap_lock_ms=1.0,
        )
    )
    metrics.record_run(FeederRun.failed("hub1", "unreachable", kind=ErrorKind.TRANSPORT, seconds=1.0))
    metrics.apply_history([FeederState("hub1", last_success_s=1.0, last_run_s=1.0, failures=0, swap_lock_failures=0)])
    exported = {s.name for family in metrics.registry.collect() for s in family.samples}
    files = ("fedload-alerts.yml", "prometheus.yml", "grafana-dashboard.json")
    named = {name for f in files for name in re.findall(r"\bfedload_[a-z_]+", (DEPLOY / f).read_text())}
    assert "fedload_feeder_last_success_timestamp_seconds" in named
    assert named - exported == set()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: apt install prometheus)")
def test_alert_rules_are_valid_and_fire_when_they_should() -> None:
    """promtool accepts the scrape example and the rules, and the rules' unit tests (tests/service/alerts) pass."""
    for argv in (
        ["promtool", "check", "config", str(DEPLOY / "prometheus.yml")],
        ["promtool", "test", "rules", "fedload-alerts.test.yml"],
    ):
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, check=False, cwd=Path(__file__).parent / "alerts"
        )
        assert done.returncode == 0, done.stdout + done.stderr
