"""The daemon's Prometheus metrics: scraped over HTTP from a real daemon, they agree with the run history."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedload import __version__
from fedload.config import parse_config
from fedload.errors import ConfigError, ErrorKind
from fedload.results import FeederRun, Outcome
from fedload.service.metrics import DaemonMetrics
from fedload.service.targets import Verdict
from fedload.superhub.bookkeeping import FeederState, read_feeder_states
from tests.support.federation import DaemonProcess, Federation, config_toml, runs_exist, successes, sync, write_script
from tests.support.shards import sharded, sharded_toml

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
UNION ALL SELECT 'data', feeder, '', extract(epoch FROM (array_agg(data_at ORDER BY started_at DESC))[1])
    FROM fedload.runs WHERE outcome = 'success' GROUP BY 2
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
    "fedload_feeder_data_timestamp_seconds": ("data", None),
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
    samples = agreeing(daemon, federation, port)  # the series' labels are a contract: in their own words below
    assert samples["fedload_runs_total", (("feeder", "hub1"), ("outcome", "success"))] == 0
    assert samples["fedload_runs_total", (("feeder", "hub2"), ("outcome", "success"))] >= 3
    assert samples["fedload_run_failures_total", (("error_kind", ErrorKind.TRANSPORT), ("feeder", "hub1"))] >= 2
    assert samples["fedload_feeder_consecutive_failures", (("feeder", "hub2"),)] == 0
    assert samples["fedload_feeder_consecutive_failures", (("feeder", "hub1"),)] >= 2
    assert ("fedload_feeder_last_success_timestamp_seconds", (("feeder", "hub1"),)) not in samples  # never succeeded
    assert ("fedload_feeder_data_timestamp_seconds", (("feeder", "hub1"),)) not in samples
    hub2 = (("feeder", "hub2"),)  # its data is as old as its snapshot, taken before its run ended
    assert (
        samples["fedload_feeder_data_timestamp_seconds", hub2]
        < samples["fedload_feeder_last_success_timestamp_seconds", hub2]
    )
    assert samples["fedload_rows_loaded_total", (("feeder", "hub2"),)] > 0
    assert samples["fedload_superhub_up", ()] == 1
    assert samples["fedload_worker_processes", ()] >= 1
    assert samples["fedload_build_info", (("version", __version__),)] == 1
    assert samples["process_resident_memory_bytes", ()] > 0  # prometheus_client's standard collectors
    assert samples["process_start_time_seconds", ()] > 0
    assert ("python_info", (("implementation", "CPython"), *sorted(_python_version().items()))) in samples
    assert daemon.stop() == 0


async def test_a_superhub_without_history_reads_as_no_runs(federation: Federation) -> None:
    """Before a daemon's first set-up creates fedload.runs, its metrics' read of the history finds no runs rather
    than failing (a first start warned `relation "fedload.runs" does not exist` and reported the superhub down)."""
    conn = await asyncpg.connect(federation.cluster.dsn(federation.superhub))
    try:
        states = await read_feeder_states(conn, ["hub2", "hub1"])
    finally:
        await conn.close()
    assert states == [FeederState("hub1", None, None, 0, 0), FeederState("hub2", None, None, 0, 0)]


def _python_version() -> dict[str, str]:
    major, minor, patchlevel = (str(part) for part in sys.version_info[:3])
    return {"major": major, "minor": minor, "patchlevel": patchlevel, "version": ".".join((major, minor, patchlevel))}


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
    value = metrics.registry.get_sample_value  # the series' labels are a contract: in their own words below
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
    metrics.apply_history(
        [FeederState("hub1", last_success_s=1.0, last_run_s=1.0, failures=0, swap_lock_failures=0, data_s=0.5)]
    )
    metrics.set_shards({"hub1": "s1"})
    metrics.set_targets({"hub1": 60.0})
    metrics.shard_up.labels("s1").set(1)
    metrics.set_displaced_by({"hub1": {"hub2": 1}})
    metrics.capacity.verdict = Verdict(reachable=False, round_s=90.0, lanes=1, lanes_needed=2, smallest_target_s=60.0)
    exported = {s.name for family in metrics.registry.collect() for s in family.samples}
    files = ("fedload-alerts.yml", "prometheus.yml", "grafana-dashboard.json")
    named = {name for f in files for name in re.findall(r"\bfedload_[a-z_]+", (DEPLOY / f).read_text())}
    assert "fedload_feeder_last_success_timestamp_seconds" in named
    assert "fedload_feeder_data_timestamp_seconds" in named
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


# Two daemons, one per shard, as Prometheus scrapes them: the instance label each target gets.
_INSTANCES = {"s1": "s1-daemon:9498", "s2": "s2-daemon:9498"}
_PHASE_MIN = (10, 40)  # minutes of the promtool test holding each scrape: all up, then shard s1 down


def _series(name: str, labels: tuple[tuple[str, str], ...], instance: str) -> str:
    """A promtool series selector: the sample's labels plus the target's job and instance."""
    tags = (("job", "fedload"), ("instance", instance), *labels)
    return name + "{" + ", ".join(f"{key}={json.dumps(value)}" for key, value in tags) + "}"


def _as_input_series(phases: list[Samples], instance: str, t0: float) -> list[dict[str, str]]:
    """One daemon's scrapes as promtool input series, each scrape held for its phase's minutes; timestamps made
    relative to the first scrape (t0 is minute 0); a series absent from a scrape is missing (`_`) there."""

    def value(name: str, sample: float) -> str:
        return str(round(sample - t0)) if name.endswith("_timestamp_seconds") else repr(sample)

    out = []
    for name, labels in sorted({key for phase in phases for key in phase}):
        values = [
            (value(name, phase[name, labels]) if (name, labels) in phase else "_") + f"x{minutes - 1}"
            for phase, minutes in zip(phases, _PHASE_MIN, strict=True)
        ]
        if all(math.isfinite(phase.get((name, labels), 0.0)) for phase in phases):
            out.append({"series": _series(name, labels, instance), "values": " ".join(values)})
    out += [{"series": _series("up", (), instance), "values": f"1x{sum(_PHASE_MIN) - 1}"}]
    return out


def _humanize_duration(seconds: float) -> str:
    """Prometheus's humanizeDuration for minutes to an hour."""
    whole = int(seconds)
    assert 60 <= whole < 3600
    return f"{whole // 60}m {whole % 60}s"


def _expected(samples: dict[str, list[Samples]], t0: float) -> dict[str, Any]:
    """The promtool tests of the joins and alerts over the two daemons' scrapes: each feeder once, with its shard;
    the stale and failing alerts once per feeder; the superhub alert for shard s1 only."""
    first, down = samples["s1"][0], samples["s1"][1]
    failures = first["fedload_feeder_consecutive_failures", (("feeder", "hub2"),)]
    stale_at_s = 45 * 60
    stale = []
    for shard, feeder in (("s1", "hub1"), ("s1", "hub2"), ("s2", "hub3")):
        last = samples[shard][1]["fedload_feeder_data_timestamp_seconds", (("feeder", feeder),)]
        age = _humanize_duration(stale_at_s - round(last - t0))
        stale.append(
            {
                "exp_labels": {
                    "severity": "warning",
                    "job": "fedload",
                    "instance": _INSTANCES[shard],
                    "feeder": feeder,
                },
                "exp_annotations": {
                    "summary": f"feeder {feeder}: data older than 30 minutes",
                    "description": f"The data of {feeder} is {age} old, as of its last successful sync's snapshot "
                    "(fedload status shows its last error).",
                },
            }
        )
    assert down["fedload_shard_up", (("shard", "s1"),)] == 0
    joined = [
        {"labels": '{feeder="hub1", instance="s1-daemon:9498", job="fedload", shard="s1"}', "value": 0},
        {"labels": '{feeder="hub2", instance="s1-daemon:9498", job="fedload", shard="s1"}', "value": failures},
        {"labels": '{feeder="hub3", instance="s2-daemon:9498", job="fedload", shard="s2"}', "value": 0},
    ]
    a = _INSTANCES["s1"]
    return {
        "promql_expr_test": [
            {
                "expr": "fedload_feeder_consecutive_failures * on (feeder) group_left (shard) fedload_feeder_info",
                "eval_time": "5m",
                "exp_samples": joined,
            },
            {
                "expr": "count(fedload_feeder_info) by (shard)",
                "eval_time": "5m",
                "exp_samples": [
                    {"labels": '{shard="s1"}', "value": 2},
                    {"labels": '{shard="s2"}', "value": 1},
                ],
            },
        ],
        "alert_rule_test": [
            {
                "eval_time": "5m",
                "alertname": "FedloadFeederFailing",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "warning", "job": "fedload", "instance": a, "feeder": "hub2"},
                        "exp_annotations": {
                            "summary": f"feeder hub2: {failures:g} runs failed in a row",
                            "description": 'See fedload_run_failures_total{feeder="hub2"} for the kind of error, '
                            "fedload status for the last one.",
                        },
                    }
                ],
            },
            {"eval_time": "45m", "alertname": "FedloadFeederStale", "exp_alerts": stale},
            {"eval_time": "9m", "alertname": "FedloadSuperhubDown", "exp_alerts": []},
            {
                "eval_time": "16m",
                "alertname": "FedloadSuperhubDown",
                "exp_alerts": [
                    {
                        "exp_labels": {"severity": "critical", "job": "fedload", "instance": a, "shard": "s1"},
                        "exp_annotations": {
                            "summary": f"fedload cannot reach shard s1 ({a})",
                            "description": "The daemon's bookkeeping query on shard s1 has failed for 5 minutes; "
                            "no feeder of that shard can sync.",
                        },
                    }
                ],
            },
        ],
    }


def _scrape_when(daemon: DaemonProcess, port: int, what: str, ready: Callable[[Samples], bool]) -> Samples:
    """The first scrape for which `ready` holds (within 60 s)."""
    found: list[Samples] = []

    def check() -> bool:
        found.append(scrape(port))
        return ready(found[-1])

    daemon.wait_for(what, check)
    return found[-1]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: apt install prometheus)")
async def test_two_daemons_one_per_shard_add_up_in_one_promtool_test(federation: Federation) -> None:
    """`fedload daemon --shard s1` and `--shard s2`, scraped before and while shard s1 is down, are the input of one
    promtool rule test: the README's join on fedload_feeder_info gives each feeder once with its shard, the
    failing and stale alerts fire once per feeder, FedloadSuperhubDown once, for shard s1; each daemon serves the
    process_* metrics."""
    config = sharded(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    assert all(run.succeeded for run in await sync(config))
    hub2, s1 = federation.feeders["hub2"], f"{federation.superhub}_s1"
    federation.cluster.psql(f"ALTER DATABASE {hub2} ALLOW_CONNECTIONS false")  # hub2 fails from now on
    daemons: dict[str, DaemonProcess] = {}
    try:
        for _ in range(3):
            assert not (await sync(config, "hub2"))[0].succeeded
        path = sharded_toml(federation, config)
        text = path.read_text().replace("interval_s = 0.5", "interval_s = 3600")
        path.write_text(text.replace("[daemon]\n", '[daemon]\nmetrics_listen = "127.0.0.1:0"\n'))
        for shard in ("s1", "s2"):
            daemons[shard] = DaemonProcess(path, federation.tmp / f"{shard}.log", None, "--shard", shard)
        ports = {shard: metrics_port(daemon) for shard, daemon in daemons.items()}
        up: dict[str, list[Samples]] = {
            shard: [
                _scrape_when(
                    daemon,
                    ports[shard],
                    f"{shard}'s daemon up",
                    lambda got: (
                        got.get(("fedload_superhub_up", ())) == 1
                        and got.get(("fedload_feeder_consecutive_failures", (("feeder", "hub2"),)), 3) >= 3
                    ),
                )
            ]
            for shard, daemon in daemons.items()
        }
        t0 = time.time()
        federation.cluster.psql(f"ALTER DATABASE {s1} ALLOW_CONNECTIONS false")
        federation.cluster.psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{s1}'")
        up["s1"].append(
            _scrape_when(daemons["s1"], ports["s1"], "s1 down", lambda got: got[("fedload_superhub_up", ())] == 0)
        )
        up["s2"].append(scrape(ports["s2"]))
    finally:
        federation.cluster.psql(f"ALTER DATABASE {s1} ALLOW_CONNECTIONS true")
        federation.cluster.psql(f"ALTER DATABASE {hub2} ALLOW_CONNECTIONS true")
        for daemon in daemons.values():
            daemon.stop()
            daemon.close_log()
    for shard, phases in up.items():
        assert {dict(labels)["feeder"] for name, labels in phases[0] if name == "fedload_feeder_info"} == set(
            config.by_shard()[shard]
        )
        assert phases[0]["process_resident_memory_bytes", ()] > 0
        assert phases[0]["process_cpu_seconds_total", ()] > 0
    assert up["s2"][1]["fedload_superhub_up", ()] == 1
    test = {
        "rule_files": [str(DEPLOY / "fedload-alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [s for shard in up for s in _as_input_series(up[shard], _INSTANCES[shard], t0)],
                **_expected(up, t0),
            }
        ],
    }
    rules = federation.tmp / "two-daemons.test.yml"
    rules.write_text(json.dumps(test, indent=1))
    promtool = ["promtool", "test", "rules", str(rules)]
    done = await asyncio.to_thread(subprocess.run, promtool, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
