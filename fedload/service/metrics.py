"""The daemon's Prometheus metrics: their names, what a finished run adds to them, and the HTTP endpoint.

Counters and histograms count the runs this daemon finished (worker processes' runs too, once, in the main
process), from its start. Gauges about a feeder's state (its last success and last run, the failures since) are
read from `fedload.runs` (see `fedload.superhub.bookkeeping.feeder_states`), so that they survive a restart and
agree with `fedload status`. The registry is the daemon's own, never prometheus_client's global one; it also holds
prometheus_client's standard collectors (`process_*`, `python_info`, `python_gc_*`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from fedload import __version__
from fedload.errors import ConfigError, ErrorKind
from fedload.results import FeederRun, Outcome
from fedload.service.targets import Verdict
from fedload.superhub.bookkeeping import FeederState

__all__ = ["DaemonMetrics", "MetricsServer"]

_RUN_BUCKETS_S = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 21600)
_SWAP_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_STOP_S = 5.0  # the longest wait for the HTTP thread at shutdown


class DaemonMetrics:
    """Every metric the daemon exports, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        feeder = ["feeder"]
        self.runs = self._counter("runs", "Finished runs, by outcome.", [*feeder, "outcome"])
        self.failures = self._counter("run_failures", "Failed runs, by kind of error.", [*feeder, "error_kind"])
        self.duration = Histogram(
            "fedload_run_duration_seconds", "Run time.", feeder, registry=self.registry, buckets=_RUN_BUCKETS_S
        )
        self.rows = self._counter("rows_loaded", "Rows loaded by successful runs.", feeder)
        self.bytes = self._counter("bytes_received", "Stream bytes received from the feeder (compressed).", feeder)
        self.swap_wait = Histogram(
            "fedload_swap_lock_wait_seconds",
            "How long swaps waited for their locks.",
            feeder,
            registry=self.registry,
            buckets=_SWAP_BUCKETS_S,
        )
        self.cancelled = self._counter("swap_cancelled_queries", "Queries swaps cancelled to get locks.", feeder)
        self.rejected = self._counter("rejected_rows", "Rows set aside in fedload.rejects.", feeder)
        self.last_success = self._gauge("feeder_last_success_timestamp_seconds", "End of the last success.", feeder)
        self.last_run = self._gauge("feeder_last_run_timestamp_seconds", "End of the last finished run.", feeder)
        self.data_time = self._gauge(
            "feeder_data_timestamp_seconds",
            "When the last success's data was true: the feeder's snapshot, at most the run's start.",
            feeder,
        )
        self.failing = self._gauge("feeder_consecutive_failures", "Failed runs since the last success.", feeder)
        self.lock_failing = self._gauge(
            "feeder_swap_lock_failures", "Runs since the last success that failed for want of locks.", feeder
        )
        self.paused = self._gauge("feeder_paused", "1 while the feeder is paused (feeder pause), else 0.", feeder)
        self.paused_since = self._gauge(
            "feeder_paused_since_timestamp_seconds", "When the feeder was paused (no series when it is not).", feeder
        )
        self.displaced = self._gauge(
            "feeder_displaced_entities",
            "The feeder's entities shown by another feeder, newer there (superhub.entity_key; no series without).",
            feeder,
        )
        self.displaced_by = self._gauge(
            "feeder_displaced_by_entities",
            "The feeder's entities shown by feeder `by` (superhub.entity_key; a series per pair with some).",
            [*feeder, "by"],
        )
        self.superhub_up = self._gauge(
            "superhub_up",
            "1 if the last bookkeeping query on the superhub (with shards: on every shard this daemon loads) worked.",
        )
        # With shards: which shard each feeder loads into, as a series to join on (`* on (feeder)
        # group_left (shard) fedload_feeder_info`), and each shard's own check. A daemon per shard exports its own
        # shard's feeders and check only, so the series of several daemons add up.
        self.feeder_info = self._gauge(
            "feeder_info",
            "1 per feeder, with its shard (empty without shards).",
            [
                "feeder",
                "shard",
            ],
        )
        self.shard_up = self._gauge("shard_up", "1 if the last bookkeeping query on the shard worked.", ["shard"])
        self.workers = self._gauge("worker_processes", "Worker processes running feeders.")
        self.target = self._gauge(
            "feeder_freshness_target_seconds", "The feeder's freshness target (no series without one).", feeder
        )
        self.capacity = CapacityCollector()
        self.registry.register(self.capacity)
        Info("fedload_build", "fedload's version.", registry=self.registry).info({"version": __version__})
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def _counter(self, name: str, doc: str, labels: list[str]) -> Counter:
        return Counter(f"fedload_{name}", doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> Gauge:
        return Gauge(f"fedload_{name}", doc, labels, registry=self.registry)

    def add_feeders(self, feeders: Iterable[str]) -> None:
        """Show the feeders' counters at zero before their first run, so that `increase()` sees the first one."""
        for name in feeders:
            for outcome in (Outcome.SUCCESS, Outcome.FAILED):
                self.runs.labels(name, outcome)
            for metric in (self.rows, self.bytes, self.cancelled, self.rejected):
                metric.labels(name)

    def remove_feeders(self, feeders: Iterable[str]) -> None:
        """Drop every series of feeders no longer configured."""
        for name in feeders:
            for outcome in Outcome:
                _forget(self.runs, name, outcome)
            for kind in ErrorKind:
                _forget(self.failures, name, kind)
            for metric in (self.duration, self.rows, self.bytes, self.swap_wait, self.cancelled, self.rejected):
                _forget(metric, name)
            for gauge in (self.last_success, self.last_run, self.failing, self.lock_failing):
                _forget(gauge, name)
            for gauge in (self.paused, self.paused_since, self.displaced):
                _forget(gauge, name)
            self.set_displaced_by({name: None})
            _forget(self.data_time, name)
            _forget(self.target, name)

    def set_targets(self, targets: Mapping[str, float | None]) -> None:
        """Each feeder's freshness target; None: no series."""
        for feeder, target in targets.items():
            _set(self.target, feeder, target)

    def set_shards(self, shards: dict[str, str | None]) -> None:
        """Each feeder's shard (None: no shards), replacing the feeders' earlier ones."""
        wanted = {(feeder, shard or "") for feeder, shard in shards.items()}
        for labels in self._info_labels() - wanted:
            _forget(self.feeder_info, *labels)
        for feeder, shard in wanted:
            self.feeder_info.labels(feeder, shard).set(1)

    def _info_labels(self) -> set[tuple[str, str]]:
        samples = (sample for metric in self.feeder_info.collect() for sample in metric.samples)
        return {(sample.labels["feeder"], sample.labels["shard"]) for sample in samples}

    def record_run(self, run: FeederRun) -> None:
        """Count a finished run (a busy one too: it did nothing, the outcome says so); a paused feeder's skipped
        run is no run (`fedload_feeder_paused` says it is paused)."""
        name = run.feeder
        if run.outcome is Outcome.PAUSED:
            return
        self.runs.labels(name, run.outcome).inc()
        if run.outcome is Outcome.BUSY:
            return
        if run.outcome is Outcome.FAILED:
            self.failures.labels(name, run.error_kind or ErrorKind.INTERNAL).inc()
        self.duration.labels(name).observe(run.seconds)
        self.bytes.labels(name).inc(run.raw_bytes)
        if run.swap_lock_ms is not None:
            self.swap_wait.labels(name).observe(run.swap_lock_ms / 1000)
        self.cancelled.labels(name).inc(run.cancelled_backends or 0)
        if run.succeeded:
            self.rows.labels(name).inc(sum(run.rows.values()))
            self.rejected.labels(name).inc(sum(run.rejected.values()))

    def apply_history(self, states: Iterable[FeederState]) -> None:
        """Set the feeders' state gauges from the run history; a feeder without such a run has no series."""
        for state in states:
            _set(self.last_success, state.feeder, state.last_success_s)
            _set(self.last_run, state.feeder, state.last_run_s)
            self.failing.labels(state.feeder).set(state.failures)
            self.lock_failing.labels(state.feeder).set(state.swap_lock_failures)
            self.paused.labels(state.feeder).set(0 if state.paused_since_s is None else 1)
            _set(self.paused_since, state.feeder, state.paused_since_s)
            _set(self.displaced, state.feeder, state.displaced_entities)
            self.set_displaced_by({state.feeder: state.displaced_by})
            _set(self.data_time, state.feeder, state.data_s)

    def set_displaced(self, counts: Mapping[str, int | None]) -> None:
        """Set the feeders' displaced entities (with shards, read from the coordinator); None: no series."""
        for feeder, count in counts.items():
            _set(self.displaced, feeder, count)

    def set_displaced_by(self, pairs: Mapping[str, Mapping[str, int] | None]) -> None:
        """Set, per feeder, how many of its entities each other feeder shows; a pair no longer displacing, or a
        feeder with None, loses its series."""
        samples = (sample for metric in self.displaced_by.collect() for sample in metric.samples)
        present = {(sample.labels["feeder"], sample.labels["by"]) for sample in samples}
        for feeder, by in pairs.items():
            for gone in {other for name, other in present if name == feeder} - set(by or {}):
                _forget(self.displaced_by, feeder, gone)
            for other, count in (by or {}).items():
                self.displaced_by.labels(feeder, other).set(count)


class CapacityCollector:
    """The daemon's verdict on the freshness targets (docs/freshness.md); no series while it has none (no feeder
    with a target, no run measured). `verdict` is replaced whole by the daemon's loop, read by the HTTP thread."""

    def __init__(self) -> None:
        self.verdict: Verdict | None = None

    def describe(self) -> list[Metric]:
        """Nothing to check against the registry's other names at registration."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The verdict's series, if there is one."""
        v = self.verdict
        if v is None:
            return
        yield GaugeMetricFamily(
            "fedload_freshness_target_reachable",
            "1 if the daemon's lanes hold every feeder within its freshness target, else 0.",
            value=1 if v.reachable else 0,
        )
        yield GaugeMetricFamily(
            "fedload_round_seconds", "The time to run every feeder once with the daemon's lanes.", value=v.round_s
        )
        if v.lanes_needed is not None:
            yield GaugeMetricFamily(
                "fedload_freshness_lanes_needed",
                "The lanes (parallel runs) that would hold the smallest freshness target.",
                value=v.lanes_needed,
            )


def _set(gauge: Gauge, feeder: str, value: float | None) -> None:
    if value is None:
        _forget(gauge, feeder)
    else:
        gauge.labels(feeder).set(value)


def _forget(metric: Counter | Gauge | Histogram, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never had that series
        metric.remove(*labels)


class MetricsServer:
    """prometheus_client's HTTP server on a thread, serving a registry at /metrics (any path, in fact)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server, self._thread = server, thread

    @classmethod
    def start(cls, registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
        """Listen on host:port; ConfigError naming `daemon.metrics_listen` if the address cannot be used."""
        try:
            server, thread = start_http_server(port, host, registry=registry)
        except OSError as exc:
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            reason = exc.strerror or str(exc)
            raise ConfigError(f"daemon.metrics_listen: cannot serve metrics on {where}: {reason}") from exc
        return cls(server, thread)

    @property
    def port(self) -> int:
        """The port listened on."""
        return int(self._server.server_port)

    def stop(self) -> None:
        """Stop serving and close the socket (blocks for up to half a second: call it off the event loop)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(_STOP_S)
