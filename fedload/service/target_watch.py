"""The daemon's freshness targets at work (docs/freshness.md): what it knows of each feeder's data age and run time,
the candidates it hands `fedload.service.targets`, and its verdict on the lanes, said once in the log when the
targets cannot be held (`daemon.freshness_unreachable`) and once when they can again
(`daemon.freshness_reachable`), exported as metrics and recorded for `fedload status` (`fedload.capacity`).

Ages are kept on the daemon's monotonic clock: a feeder's data is dated from the start of its last success (read
from the run history at start and at each reload, then from the daemon's own runs). A feeder's snapshot can only
make its data older than that start (a slow clock, a lagging replica), which running it more often cannot
change: that part shows in `status` and the metrics, not in the schedule. Without any target nothing is read.
"""

from __future__ import annotations

import functools
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping

from fedload.config import Config
from fedload.errors import FedloadError
from fedload.log import get_logger
from fedload.results import FeederRun, Outcome
from fedload.service.metrics import DaemonMetrics
from fedload.service.schedule import FeederSchedule
from fedload.service.targets import Candidate, Load, Verdict, behind_for, verdict
from fedload.superhub.bookkeeping import CapacityReport, forget_capacity, read_feeder_states, store_capacity
from fedload.superhub.bookkeeping.connection import ShardHistories
from fedload.superhub.job import superhub_target

__all__ = ["TargetWatch", "lanes_of"]

log = get_logger()
_REPORT_EVERY_S = 60.0  # the recorded verdict's figures are written again at most this often while unchanged


def lanes_of(config: Config) -> int:
    """The runs the daemon may have at once: max_parallel_feeders, capped by the worker processes (0: none)."""
    parallel, workers = config.superhub.max_parallel_feeders, config.superhub.workers
    return parallel if workers == 0 else min(parallel, workers)


class TargetWatch:
    """See the module docstring. `config` gives the daemon's configuration now, `feeders` this daemon's feeders."""

    def __init__(
        self,
        history: ShardHistories,
        metrics: DaemonMetrics,
        config: Callable[[], Config],
        feeders: Callable[[Config], Mapping[str, object]],
    ) -> None:
        self._history, self._metrics, self._config, self._feeders = history, metrics, config, feeders
        self._started = time.monotonic()
        self._data_at: dict[str, float] = {}  # monotonic start of each feeder's last success
        self._run_s: dict[str, float] = {}  # each feeder's last run's duration
        self._running_since: dict[str, float] = {}
        self._verdict: Verdict | None = None
        self._reported_at = -float("inf")

    def _targets(self) -> dict[str, float]:
        config = self._config()
        named = ((name, config.freshness_target_s(name)) for name in self._feeders(config))
        return {name: target for name, target in named if target is not None}

    async def read_history(self) -> None:
        """The last success (its start, its duration) of each feeder with a target, from its superhub's history
        (the newer of it and the daemon's own); a superhub that cannot say is logged, its feeders counted as never
        loaded until they run."""
        config, targeted = self._config(), list(self._targets())
        for shard, names in config.by_shard(targeted).items():
            read = functools.partial(read_feeder_states, feeders=names)
            try:
                states = await self._history.write(superhub_target(config, shard), read)
            except (FedloadError, OSError, TimeoutError) as exc:
                log.warning("daemon.freshness_history_unread", shard=shard, error=str(exc) or type(exc).__name__)
                continue
            now = time.monotonic()
            for state in states:
                if state.success_age_s is not None:  # a manual sync since the daemon's own last run: newer
                    known = self._data_at.get(state.feeder, -math.inf)
                    self._data_at[state.feeder] = max(known, now - state.success_age_s)
                if state.success_run_s is not None:
                    self._run_s.setdefault(state.feeder, state.success_run_s)

    def started(self, name: str) -> None:
        """A run of the feeder starts now."""
        self._running_since[name] = time.monotonic()

    def finished(self, name: str, run: FeederRun | None) -> None:
        """Its run ended (`run` None: it crashed): a success dates its data from the run's start; a success or a
        failure measures its run time (a busy or paused feeder did not run)."""
        start = self._running_since.pop(name, None)
        if run is None or run.outcome not in (Outcome.SUCCESS, Outcome.FAILED):
            return
        self._run_s[name] = run.seconds
        if run.outcome is Outcome.SUCCESS and start is not None:
            self._data_at[name] = start

    def candidate(self, name: str, schedule: FeederSchedule, now: float) -> Candidate:
        """The feeder as the choice of the next run sees it."""
        config = self._config()
        data_at = self._data_at.get(name)
        return Candidate(
            name=name,
            schedule=schedule,
            interval_s=config.feeders[name].interval_s,
            target_s=config.freshness_target_s(name),
            age_s=None if data_at is None else now - data_at,
        )

    def judge(self, schedules: Mapping[str, FeederSchedule], paused: Iterable[str]) -> CapacityReport | None:
        """The verdict now: logged and exported when it changes; the report to record when it changed or its
        figures are a minute old, else None."""
        now, targets, skip = time.monotonic(), self._targets(), set(paused)
        loads = [self._load(name, targets.get(name), schedules[name], now) for name in schedules if name not in skip]
        new = verdict(loads, lanes_of(self._config()))
        old, self._verdict = self._verdict, new
        self._metrics.capacity.verdict = new
        if new is not None and (old is None or old.reachable != new.reachable):
            self._say(new, targets)
        changed = _shape(old) != _shape(new)
        if new is None or (not changed and now - self._reported_at < _REPORT_EVERY_S):
            return None
        self._reported_at = now
        return _report(new)

    def forgotten(self) -> bool:
        """Whether a verdict was reported and there is none any more (no feeder has a target): once."""
        if self._verdict is None and self._reported_at > -float("inf"):
            self._reported_at = -float("inf")
            return True
        return False

    async def record(self, report: CapacityReport | None) -> None:
        """Record `report` (None: forget the verdict) on each superhub (shard) this daemon loads; best effort."""
        config = self._config()
        for shard in config.by_shard(list(self._feeders(config))):
            write = functools.partial(store_capacity, report=report) if report is not None else forget_capacity
            try:
                await self._history.write(superhub_target(config, shard), write)
            except (FedloadError, OSError, TimeoutError) as exc:
                log.warning("daemon.freshness_not_recorded", shard=shard, error=str(exc) or type(exc).__name__)

    def _load(self, name: str, target_s: float | None, schedule: FeederSchedule, now: float) -> Load:
        data_at = self._data_at.get(name)
        age_s = None if data_at is None or schedule.failures else now - data_at
        behind_s = behind_for(age_s, target_s, now - self._started)
        return Load(name=name, target_s=target_s, run_s=self._run_s.get(name), behind_s=behind_s)

    def _say(self, new: Verdict, targets: Mapping[str, float]) -> None:
        if new.reachable:
            log.info("daemon.freshness_reachable", **_figures(new))
            return
        log.warning(
            "daemon.freshness_unreachable",
            **_figures(new),
            lanes_needed=new.lanes_needed,
            cores=os.cpu_count() or 1,
            behind=list(new.behind),
            too_long=list(new.too_long),
            targets=dict(sorted(targets.items())),
        )


def _figures(v: Verdict) -> dict[str, object]:
    return {"round_s": round(v.round_s, 3), "lanes": v.lanes, "smallest_target_s": v.smallest_target_s}


def _shape(v: Verdict | None) -> tuple[object, ...] | None:
    """What a change of makes the verdict worth recording at once (not the round time, which moves each run)."""
    return None if v is None else (v.reachable, v.lanes, v.lanes_needed, v.behind, v.too_long)


def _report(v: Verdict) -> CapacityReport:
    return CapacityReport(
        reachable=v.reachable,
        round_s=v.round_s,
        lanes=v.lanes,
        lanes_needed=v.lanes_needed,
        cores=os.cpu_count() or 1,
        smallest_target_s=v.smallest_target_s,
        behind=v.behind,
        too_long=v.too_long,
        reported_by=f"{socket.gethostname()}:{os.getpid()}",
    )
