"""`fedload daemon`: sync every feeder on its own schedule until told to stop.

- One run per feeder at a time (across processes too: the pipeline's advisory lock), at most
  `max_parallel_feeders` runs at once; a failing feeder backs off on its own and never delays the others.
- SIGTERM/SIGINT: two-phase shutdown. Start nothing new, let running syncs finish for `shutdown_grace_s`, then
  cancel them (their transactions roll back: old data intact, no staging left).
- SIGHUP: reload the configuration file; an invalid one is logged and the running configuration kept.
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
from pathlib import Path

from fedload import systemd
from fedload.config import Config, load_config
from fedload.english import counted
from fedload.errors import ConfigError, FedloadError, one_line
from fedload.log import get_logger
from fedload.pipeline import sync_feeder
from fedload.results import FeederRun, Outcome
from fedload.schedule import FeederSchedule, after_failure, after_success, first_run
from fedload.superhub import close_superhub, connect_superhub, prepare_superhub, superhub_errors

__all__ = ["Daemon", "run_daemon"]

log = get_logger()
_BUSY_RETRY_S = 30.0
_PREPARE_MAX_S = 60.0  # backoff while the superhub is unreachable: 1, 2, 4 ... 60 s


class Daemon:
    """The scheduler loop; see the module docstring."""

    def __init__(self, config: Config, config_path: Path, *, shutdown_grace_s: float = 60.0) -> None:
        self.config = config
        self._config_path = config_path
        self._grace_s = shutdown_grace_s
        self._rng = random.Random()  # noqa: S311 - jitter, not secrets
        self._schedules: dict[str, FeederSchedule] = {}
        self._running: dict[str, asyncio.Task[FeederRun]] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._reload_requested = False

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT; 0 after a clean shutdown. Ready for systemd at once, superhub or not."""
        self._install_signal_handlers()
        systemd.notify("READY=1", "STATUS=connecting to the superhub")
        watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
        try:
            if await self._prepare():
                now = time.monotonic()
                feeders = self.config.feeders.items()
                self._schedules = {name: first_run(now, f.interval_s, self._rng) for name, f in feeders}
                systemd.notify(f"STATUS=scheduling {counted(len(self._schedules), 'feeder')}")
                log.info("daemon.started", feeders=sorted(self._schedules))
                await self._loop()
            await self._shutdown()
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        log.info("daemon.stopped")
        return 0

    async def _loop(self) -> None:
        while not self._stopping:
            if self._reload_requested:
                self._reload()
            self._start_due()
            await self._sleep_until_next()

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
                await prepare_superhub(self.config)
            except FedloadError as exc:
                await self._wait_to_retry(attempt, exc)
            else:
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
            new = load_config(self._config_path)
        except ConfigError as exc:
            log.error("daemon.reload_failed", path=str(self._config_path), problems=exc.problems)
        else:
            now = time.monotonic()
            added = sorted(set(new.feeders) - set(self.config.feeders))
            removed = sorted(set(self.config.feeders) - set(new.feeders))
            for name in removed:
                self._schedules.pop(name, None)
            for name in added:
                self._schedules[name] = first_run(now, new.feeders[name].interval_s, self._rng)
            self.config = new
            log.info("daemon.reloaded", added=added, removed=removed)
        systemd.notify("READY=1")

    def _start_due(self) -> None:
        now = time.monotonic()
        slots = self.config.superhub.max_parallel_feeders - len(self._running)
        due = sorted((s.next_at, name) for name, s in self._schedules.items() if s.next_at <= now)
        for _, name in due:
            if slots <= 0:
                return
            if name not in self._running:
                task = asyncio.create_task(sync_feeder(name, self.config), name=f"sync-{name}")
                task.add_done_callback(lambda t, n=name: self._finished(n, t))  # type: ignore[misc]
                self._running[name] = task
                slots -= 1

    def _finished(self, name: str, task: asyncio.Task[FeederRun]) -> None:
        self._running.pop(name, None)
        self._wake.set()
        if task.cancelled() or name not in self._schedules:
            return
        now, interval = time.monotonic(), self.config.feeders[name].interval_s
        exc = task.exception()
        run = None if exc is not None else task.result()
        previous = self._schedules[name]
        if run is not None and run.outcome is Outcome.SUCCESS:
            self._schedules[name] = after_success(now, interval, self._rng)
        elif run is not None and run.outcome is Outcome.BUSY:
            self._schedules[name] = FeederSchedule(now + _BUSY_RETRY_S, previous.failures)
        else:
            self._schedules[name] = after_failure(now, interval, previous, self._rng)
            log.warning(
                "daemon.feeder_failed",
                feeder=name,
                failures=self._schedules[name].failures,
                retry_in_s=round(self._schedules[name].next_at - now, 1),
                error=str(exc) if exc else run.error if run else None,
            )
        asyncio.get_running_loop().create_task(self._record_schedule(name))

    async def _record_schedule(self, name: str) -> None:
        """Store the feeder's next run for `fedload status` (best effort)."""
        schedule = self._schedules.get(name)
        if schedule is None:
            return
        try:
            with superhub_errors(self.config):
                await self._store_schedule(name, schedule)
        except (FedloadError, OSError) as exc:
            log.warning("daemon.schedule_not_recorded", feeder=name, error=str(exc))

    async def _store_schedule(self, name: str, schedule: FeederSchedule) -> None:
        conn = await connect_superhub(self.config)
        try:
            await conn.execute(
                "INSERT INTO fedload.schedule (feeder, next_run_at, failures) "
                "VALUES ($1, now() + make_interval(secs => $2), $3) ON CONFLICT (feeder) DO UPDATE "
                "SET next_run_at = excluded.next_run_at, failures = excluded.failures, updated_at = now()",
                name,
                max(0.0, schedule.next_at - time.monotonic()),
                schedule.failures,
            )
        finally:
            await close_superhub(conn)

    async def _sleep_until_next(self) -> None:
        waiting = [s.next_at for name, s in self._schedules.items() if name not in self._running]
        timeout = max(0.05, min(waiting, default=time.monotonic() + 60) - time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), min(timeout, 60.0))
        self._wake.clear()

    async def _shutdown(self) -> None:
        systemd.notify("STOPPING=1")
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

    async def _watchdog(self) -> None:
        interval = systemd.watchdog_interval_s()
        while interval is not None:
            systemd.notify("WATCHDOG=1")
            await asyncio.sleep(interval)


def run_daemon(config: Config, config_path: Path) -> int:
    """Entry point of `fedload daemon`."""
    return asyncio.run(Daemon(config, config_path, shutdown_grace_s=config.daemon.shutdown_grace_s).run())
