"""`fedload daemon`: sync every feeder on its own schedule until told to stop.

- One run per feeder at a time (across processes too: the pipeline's advisory lock), at most
  `max_parallel_feeders` runs at once; a failing feeder backs off on its own and never delays the others.
- Freshness targets (docs/freshness.md): a feeder past its target is due before its interval, a free lane goes to
  the due feeder most behind (`fedload.service.targets`), and the daemon says once when its lanes cannot hold the
  targets (`fedload.service.target_watch`).
- SIGTERM/SIGINT: two-phase shutdown. Start nothing new, let running syncs finish for `shutdown_grace_s`, then
  cancel them (their transactions roll back: old data intact, no staging left).
- SIGHUP: reload the configuration file; an invalid one is logged and the running configuration kept.
- The workers keep each feeder's SSH connection for its next run (fedload.transport.kept_ssh); the daemon has them
  close it when it finds the feeder paused, when a reload removes the feeder or changes its SSH settings, and at
  its end.
- A paused feeder (`fedload feeder pause`) is skipped: each due run asks its superhub first, and a paused one is
  asked again at its interval, at most `PAUSED_RECHECK_S` later (a resume takes effect within that); a run under
  way finishes.
- systemd: READY=1 as soon as the configuration is valid and signals are handled, even while the superhub is
  unreachable (the daemon retries with backoff and says so in STATUS=, so a down superhub at boot is not a start
  timeout); WATCHDOG=1 pings when WatchdogSec is set, from the start; RELOADING=1/STOPPING=1.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import asyncpg

from fedload.config import Config, FeederConfig, load_config
from fedload.english import counted
from fedload.errors import ConfigError, ErrorKind, FedloadError, UsageError, internal_error, one_line
from fedload.log import get_logger
from fedload.results import FeederRun, Outcome
from fedload.service import systemd
from fedload.service.coordinator_keeper import CoordinatorKeeper
from fedload.service.daemon_metrics import DaemonMetricsService
from fedload.service.pauses import PAUSED_RECHECK_S, PauseWatch
from fedload.service.schedule import FeederSchedule, after_failure, after_success, first_run, held
from fedload.service.target_watch import TargetWatch
from fedload.service.targets import Candidate, due_at, start_order
from fedload.service.workers import worker_modules, worker_pool
from fedload.superhub.bookkeeping import store_next_run
from fedload.superhub.bookkeeping.connection import ShardHistories
from fedload.superhub.job import feeder_jobs, parents_spec, superhub_target
from fedload.superhub.pipeline import sync_feeder
from fedload.superhub.session import SuperhubTarget, prepare_superhub

__all__ = ["Daemon", "run_daemon"]

log = get_logger()
_BUSY_RETRY_S = 30.0
_COORDINATOR_RETRY_S = 2.0  # a feeder waiting for the coordinator's build is looked at again this often
_PREPARE_MAX_S = 60.0  # backoff while the superhub is unreachable: 1, 2, 4 ... 60 s
_BOOKKEEPING_DRAIN_S = 30.0  # at shutdown, the longest wait for the last schedule writes


class ScheduleStore:
    """Writes feeders' next runs into fedload.schedule for `fedload status`, through the daemon's one bookkeeping
    connection (the one its runs record their history on). Best effort: a failure is logged and the daemon
    carries on."""

    def __init__(self, bookkeeping: ShardHistories) -> None:
        self._bookkeeping = bookkeeping

    async def store(self, superhub: SuperhubTarget, name: str, schedule: FeederSchedule) -> None:
        """Record `schedule` as feeder `name`'s next run, on its superhub (with shards, its shard's)."""

        async def write(conn: asyncpg.Connection) -> None:
            next_in_s = max(0.0, schedule.next_at - time.monotonic())
            await store_next_run(conn, name, next_in_s=next_in_s, failures=schedule.failures)

        try:
            await self._bookkeeping.write(superhub, write)
        except (FedloadError, OSError) as exc:
            log.warning("daemon.schedule_not_recorded", feeder=name, error=str(exc))


class Daemon:
    """The scheduler loop; see the module docstring."""

    def __init__(
        self, config: Config, config_path: Path, *, shutdown_grace_s: float = 60.0, shard: str | None = None
    ) -> None:
        self.config = config
        self._jobs = feeder_jobs(config)  # each feeder's run, resolved again at each reload
        self._shard = shard  # --shard: only this shard's feeders
        self._config_path = config_path
        self._grace_s = shutdown_grace_s
        self._rng = random.Random()  # noqa: S311 - jitter, not secrets
        self._schedules: dict[str, FeederSchedule] = {}
        self._running: dict[str, asyncio.Task[FeederRun]] = {}
        self._bookkeeping: set[asyncio.Task[None]] = set()  # schedule writes under way
        self._history = ShardHistories()  # one bookkeeping connection (per shard): run history and schedule
        self._store = ScheduleStore(self._history)
        # Started once: a reload that changes superhub.worker_processes takes effect at the next start.
        self._pool = worker_pool(config.superhub.workers, worker_modules(config.feeders.values()))
        # Started once too: a reload that changes daemon.metrics_listen takes effect at the next start.
        self._metrics = DaemonMetricsService(
            config.daemon.metrics_listen, self._history, self._pool, lambda: self.config, shard=shard
        )
        self._pauses = PauseWatch(self._history, changed=self._metrics.poke)
        self._targets = TargetWatch(self._history, self._metrics.metrics, lambda: self.config, self._feeders)
        self._wake = asyncio.Event()
        self._stopping = False
        self._reload_requested = False
        # The coordinator, built beside the loads; a feeder new to its shard loads once a build has read it there.
        self._coordinator = CoordinatorKeeper(config, feeders=self._feeders, changed=self._wake.set)
        self._waiting: set[str] = set()  # feeders due but waiting for the coordinator's build

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT; 0 after a clean shutdown. Ready for systemd at once, superhub or not.
        ConfigError before anything else if the metrics cannot be served."""
        self._metrics.start(self.config.feeders)
        self._install_signal_handlers()
        systemd.notify("READY=1", "STATUS=connecting to the superhub")
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        try:
            if await self._prepare():
                self._metrics.poke()
                await self._targets.read_history()  # nothing to read without a freshness target
                now = time.monotonic()
                feeders = self._feeders(self.config).items()
                self._schedules = {name: first_run(now, f.interval_s, self._rng) for name, f in feeders}
                self._notify_scheduling()
                log.info("daemon.started", feeders=sorted(self._schedules))
                await self._loop()
        finally:  # also after a bug in the loop: the running syncs get their grace period
            await self._shutdown()
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
            await asyncio.shield(self._coordinator.close())
            await asyncio.shield(self._metrics.close())
            if self._pool is not None:
                await asyncio.shield(self._pool.close())
            await asyncio.shield(self._history.close())
        log.info("daemon.stopped")
        return 0

    def _feeders(self, config: Config) -> dict[str, FeederConfig]:
        """The feeders this daemon runs: all, or with --shard that shard's."""
        return {n: f for n, f in config.feeders.items() if self._shard is None or f.shard == self._shard}

    async def _loop(self) -> None:
        while not self._stopping:
            if self._reload_requested:
                self._reload()
                self._notify_scheduling()  # a reload may have added or removed feeders
            self._start_due()
            self._judge_targets()
            await self._sleep_until_next()

    def _notify_scheduling(self) -> None:
        systemd.notify(f"STATUS=scheduling {counted(len(self._schedules), 'feeder')}")

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self._request_reload)

    def _request_stop(self, name: str) -> None:
        log.info("daemon.stop_requested", signal=name, running=sorted(self._running))
        self._stopping = True
        self._wake.set()

    def _request_reload(self) -> None:
        self._reload_requested = True
        self._wake.set()

    async def _prepare(self) -> bool:
        """Set up the superhub's schemas, retrying with backoff while it is unreachable (saying so in systemd's
        STATUS); SIGHUP reloads the configuration and retries at once. False if told to stop first."""
        for attempt in itertools.count(1):
            if self._stopping:
                return False
            if self._reload_requested:
                self._reload()
            try:
                for shard in self.config.by_shard(self._feeders(self.config)):
                    await prepare_superhub(superhub_target(self.config, shard), parents_spec(self.config))
            except FedloadError as exc:
                await self._wait_to_retry(attempt, exc)
            else:
                self._coordinator.start()  # in the background: the loads of feeders their shards hold go on
                return True
        raise AssertionError("unreachable")  # pragma: no cover

    async def _wait_to_retry(self, attempt: int, exc: FedloadError) -> None:
        delay_s = min(_PREPARE_MAX_S, 2.0 ** (attempt - 1)) * self._rng.uniform(0.8, 1.0)
        error = one_line(str(exc), limit=200)
        log.error("daemon.superhub_unavailable", error=str(exc), attempt=attempt, retry_s=round(delay_s, 1))
        systemd.notify(f"STATUS=superhub unavailable, retry {attempt} in {delay_s:.0f} s: {error}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay_s)
        self._wake.clear()

    def _reload(self) -> None:
        self._reload_requested = False
        systemd.notify("RELOADING=1")
        try:
            new = self._load()
        except ConfigError as exc:
            log.error("daemon.reload_failed", path=str(self._config_path), problems=exc.problems)
        except Exception as exc:  # a bug reading the file: the running configuration stays, the daemon goes on
            log.error("daemon.reload_failed", path=str(self._config_path), problems=[internal_error(exc)], exc_info=exc)
        else:
            now = time.monotonic()
            added = sorted(set(self._feeders(new)) - set(self._feeders(self.config)))
            removed = sorted(set(self._feeders(self.config)) - set(self._feeders(new)))
            for name in removed:
                self._schedules.pop(name, None)
            self._forget_connections(removed, new)
            for name in added:
                self._schedules[name] = first_run(now, new.feeders[name].interval_s, self._rng)
            self.config, self._jobs = new, feeder_jobs(new)
            self._metrics.reconfigured(added, removed)
            log.info("daemon.reloaded", added=added, removed=removed)
            self._coordinator.reconfigured(new)  # feeders may have moved between shards' lists
            self._spawn(self._targets.read_history(), name="freshness-history")  # new feeders, new targets
        systemd.notify("READY=1")

    def _forget_connections(self, removed: list[str], new: Config) -> None:
        """Close the kept SSH connections of the feeders a reload removed or gave other SSH settings."""
        if self._pool is None:
            return
        for name in removed:
            self._pool.forget(name, "removed from the configuration")
        old = self._feeders(self.config)
        for name, feeder in self._feeders(new).items():
            if name in old and (old[name].transport, old[name].ssh) != (feeder.transport, feeder.ssh):
                self._pool.forget(name, "its ssh settings changed")

    def _load(self) -> Config:
        """The configuration file again; ConfigError also if this daemon's shard is gone from it."""
        new = load_config(self._config_path)
        if self._shard is not None and self._shard not in new.shards:
            raise ConfigError(f"{self._config_path}: shards: this daemon's shard {self._shard} is gone")
        return new

    def _start_due(self) -> None:
        """Give each free lane to the due feeder most behind (fedload.service.targets)."""
        now = time.monotonic()
        slots = self.config.superhub.max_parallel_feeders - len(self._running)
        if slots <= 0:
            return
        for candidate in start_order(self._candidates(now), now):
            if slots <= 0:
                return
            name = candidate.name
            if self._may_load(name, now):
                self._targets.started(name)
                task = asyncio.create_task(self._sync(name), name=f"sync-{name}")
                task.add_done_callback(lambda t, n=name: self._finished(n, t))  # type: ignore[misc]
                self._running[name] = task
                slots -= 1

    def _candidates(self, now: float) -> list[Candidate]:
        """The feeders not running now, with what they are due by."""
        schedules = self._schedules.items()
        return [self._targets.candidate(name, s, now) for name, s in schedules if name not in self._running]

    def _judge_targets(self) -> None:
        """The verdict on the freshness targets; recorded for `status` in the background when it changed."""
        report = self._targets.judge(self._schedules, self._pauses.paused)
        if report is not None or self._targets.forgotten():
            self._spawn(self._targets.record(report), name="freshness-report")

    def _may_load(self, name: str, now: float) -> bool:
        """Whether the feeder may load now; if not (new to its shard, the coordinator not yet built to read it
        there: the load would show it twice or outside its bound), its run waits for the build."""
        if self._coordinator.may_load(name):
            if name in self._waiting:
                self._waiting.discard(name)
                log.info("daemon.coordinator_ready", feeder=name)
            return True
        if name not in self._waiting:
            self._waiting.add(name)
            log.info("daemon.feeder_waits_for_coordinator", feeder=name, shard=self.config.feeders[name].shard)
        self._schedules[name] = held(now + _COORDINATOR_RETRY_S, self._schedules[name].failures)
        return False

    async def _sync(self, name: str) -> FeederRun:
        """One run of a feeder, in a worker process if the daemon has them."""
        job = self._jobs[name]  # with shards, the feeder's shard is its superhub
        if (skipped := await self._pauses.skipped(job)) is not None:
            if self._pool is not None:  # no connection to a feeder under maintenance
                self._pool.forget(name, "paused")
            return skipped
        if self._pool is None:
            return await sync_feeder(job, history=self._history)
        return await self._pool.run(job, history=self._history)

    def _finished(self, name: str, task: asyncio.Task[FeederRun]) -> None:
        self._running.pop(name, None)
        self._wake.set()
        self._targets.finished(name, None if task.cancelled() or task.exception() else task.result())
        if task.cancelled() or name not in self._schedules:
            return
        now, interval = time.monotonic(), self.config.feeders[name].interval_s
        exc = task.exception()
        if exc is not None:  # sync_feeder reports the run's failures: this is a bug, logged once with its traceback
            log.error("daemon.run_crashed", feeder=name, exc_info=exc)
            self._metrics.record(FeederRun.failed(name, internal_error(exc), kind=ErrorKind.INTERNAL, seconds=0.0))
        run = None if exc is not None else task.result()
        previous = self._schedules[name]
        if run is not None and run.outcome is Outcome.PAUSED:  # asked again soon; its schedule in status stays
            self._schedules[name] = held(now + min(interval, PAUSED_RECHECK_S), previous.failures)
            return
        if run is not None:
            self._metrics.record(run)
        if run is not None and run.outcome is Outcome.SUCCESS:
            self._schedules[name] = after_success(now, interval, self._rng)
            self._coordinator.loaded(name)  # a pending feeder: the coordinator is built again to read it there
        elif run is not None and run.outcome is Outcome.BUSY:
            self._schedules[name] = held(now + _BUSY_RETRY_S, previous.failures)
        else:
            self._schedules[name] = after_failure(now, interval, previous, self._rng)
            log.warning(
                "daemon.feeder_failed",
                feeder=name,
                failures=self._schedules[name].failures,
                retry_in_s=round(self._schedules[name].next_at - now, 1),
                error=str(exc) if exc else run.error if run else None,
                error_kind=ErrorKind.INTERNAL if run is None else run.error_kind,
            )
        schedule = self._store.store(self._jobs[name].superhub, name, self._schedules[name])
        self._spawn(schedule, name=f"schedule-{name}")

    def _spawn(self, step: Coroutine[Any, Any, None], *, name: str) -> None:
        """Start a bookkeeping task, kept until it is done so that shutdown can wait for it."""
        task = asyncio.get_running_loop().create_task(step, name=name)
        self._bookkeeping.add(task)
        task.add_done_callback(self._bookkeeping_done)

    def _bookkeeping_done(self, task: asyncio.Task[None]) -> None:
        self._bookkeeping.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("daemon.bookkeeping_crashed", task=task.get_name(), exc_info=exc)

    async def _sleep_until_next(self) -> None:
        """Until the next feeder is due (its timer, its target), a run ends, or a signal; at most a minute. With
        every lane taken, only a run's end can start another."""
        now = time.monotonic()
        lanes_full = len(self._running) >= self.config.superhub.max_parallel_feeders
        waiting = [] if lanes_full else [due_at(c, now) for c in self._candidates(now)]
        timeout = max(0.05, min(waiting, default=now + 60) - now)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), min(timeout, 60.0))
        self._wake.clear()

    async def _shutdown(self) -> None:
        """Let the runs finish within the grace period, cancel the rest, then wait for the last schedule writes.
        A coordinator build under way is cancelled at once (it rolls back; the next start builds again)."""
        systemd.notify("STOPPING=1")
        await asyncio.shield(self._coordinator.close())
        await self._drain_runs()
        await asyncio.sleep(0)  # the runs' done callbacks start their schedule writes
        await self._drain(self._bookkeeping, _BOOKKEEPING_DRAIN_S)

    async def _drain_runs(self) -> None:
        running = list(self._running.values())
        if not running:
            return
        log.info("daemon.draining", running=sorted(self._running), grace_s=self._grace_s)
        _, pending = await asyncio.wait(running, timeout=self._grace_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("daemon.cancelled_runs", feeders=sorted(t.get_name() for t in pending))
            await asyncio.wait(pending, timeout=60.0)

    @staticmethod
    async def _drain(tasks: set[asyncio.Task[Any]], timeout_s: float) -> None:
        """Wait up to `timeout_s` for `tasks`, then cancel those left and give them as long again to end."""
        if not tasks:
            return
        _, pending = await asyncio.wait(set(tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)

    async def _watchdog(self) -> None:
        interval = systemd.watchdog_interval_s()
        while interval is not None:
            systemd.notify("WATCHDOG=1")
            await asyncio.sleep(interval)


def run_daemon(config: Config, config_path: Path, shard: str | None = None) -> int:
    """Entry point of `fedload daemon` (`--shard NAME`: only that shard's feeders)."""
    if shard is not None and shard not in config.shards:
        known = f"shards: {', '.join(config.shards)}" if config.shards else "the configuration has no [shards]"
        raise UsageError(f"unknown shard {shard}; {known}")
    grace_s = config.daemon.shutdown_grace_s
    return asyncio.run(Daemon(config, config_path, shutdown_grace_s=grace_s, shard=shard).run())
