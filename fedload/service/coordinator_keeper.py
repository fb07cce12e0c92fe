"""Keeping the coordinator built beside the loads (docs/scale-out.md, "The invariant"), for `sync` and the daemon.

A coordinator reader sees each feeder exactly once, with all of its rows and only them, whether the query filters on
the key or not. A load can break that only where it lands on a shard that does not hold the feeder yet (a new
feeder, a feeder given another shard) while the coordinator still reads that shard directly under a bound without
the feeder's key: a build from the current configuration reads such a shard through a filter (or with the key in
its bound), so those loads wait for one. Loads of a feeder its shard already holds go on at once, coordinator or
not: a swap changes only the feeder's rows.

- One build at a time, in a task of its own: a failed or deferred build is retried with backoff (1, 2, 4 ... 60 s)
  until one succeeds; a new configuration (a reload) cancels a build of the old one, and a build whose
  configuration is no longer the newest does not commit (`build_coordinator(current=...)`).
- The feeders read from another shard than their own (`pending`) are kept until a build that no longer reports
  them has succeeded; a pending feeder's successful load asks for that build.

    keeper = CoordinatorKeeper(config)
    keeper.start()
    if await keeper.ready("hub4", wait_s=60): ...load hub4...; keeper.loaded("hub4")
    await keeper.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from fedload.config import Config
from fedload.errors import ErrorKind, FedloadError, internal_error
from fedload.log import get_logger

if TYPE_CHECKING:
    from fedload.scaleout.coordinator import CoordinatorReport
    from fedload.scaleout.shard_side import ShardState

__all__ = ["CoordinatorKeeper"]

log = get_logger()
_RETRY_MAX_S = 60.0


class CoordinatorKeeper:
    """See the module. `feeders`: which feeders this process loads (all by default); `changed`: called whenever
    feeders may have become ready to load."""

    def __init__(
        self,
        config: Config,
        *,
        feeders: Callable[[Config], Iterable[str]] | None = None,
        changed: Callable[[], None] | None = None,
        retry_max_s: float = _RETRY_MAX_S,
    ) -> None:
        self._config = config
        self._feeders = feeders or (lambda c: c.feeders)
        self._changed = changed or (lambda: None)
        self._retry_max_s = retry_max_s
        self._rng = random.Random()  # noqa: S311 - jitter, not secrets
        self._generation = 0  # of the configuration: one more at every reload
        self._built: int | None = None  # the generation of the last build that succeeded
        self._safe: set[str] = set()  # feeders whose loads cannot break the invariant (see the module)
        self.pending: frozenset[str] = frozenset()  # read from another shard, as the last successful build said
        self._wanted = asyncio.Event()
        self._state = asyncio.Event()  # set at every change of what is safe
        self._task: asyncio.Task[None] | None = None
        self._failures = 0  # builds failed or deferred so far
        self._loaded: dict[str, float] = {}  # feeder: when it last loaded (monotonic)
        self._started = 0.0  # when the last successful build started (monotonic)
        self._build: asyncio.Task[CoordinatorReport] | None = None

    @property
    def enabled(self) -> bool:
        """Whether there is a coordinator to keep."""
        return self._config.coordinator is not None

    def start(self) -> None:
        """Start building in the background (nothing without a coordinator)."""
        if self.enabled and self._task is None:
            self._wanted.set()
            self._task = asyncio.get_running_loop().create_task(self._keep(), name="coordinator")

    def may_load(self, name: str) -> bool:
        """Whether feeder `name` may load now without breaking the invariant."""
        return not self.enabled or name in self._safe

    async def ready(self, name: str, *, wait_s: float) -> bool:
        """Wait up to `wait_s` until feeder `name` may load; whether it may."""
        deadline = time.monotonic() + wait_s
        while not self.may_load(name):
            self._state.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state.wait(), max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                return self.may_load(name)
        return True

    def loaded(self, name: str) -> None:
        """Feeder `name` has loaded on its shard, which holds it now; a pending one asks for the build that reads
        it there."""
        self._safe.add(name)
        self._loaded[name] = time.monotonic()
        if name in self.pending:
            self._wanted.set()

    def reconfigured(self, config: Config) -> None:
        """A new configuration (a reload): feeders whose shard changed, and new ones, are safe again only after a
        build of it (or once their shard holds them); a build of the old one under way is cancelled."""
        old = self._config
        self._safe = {
            name
            for name in self._safe
            if name in config.feeders and name in old.feeders and config.feeders[name].shard == old.feeders[name].shard
        }
        self._config, self._generation = config, self._generation + 1
        if self._build is not None:
            self._build.cancel()
        if self.enabled:
            self._wanted.set()
            self.start()

    async def settled(self, wait_s: float) -> bool:
        """Wait up to `wait_s` until no build is wanted (the last one asked for has succeeded); whether so. Gives up
        at the first build that fails meanwhile: the invariant holds all the same (see the module), only a pending
        feeder stays read from its old shard."""
        deadline, failures = time.monotonic() + wait_s, self._failures
        while self.enabled and (self._wanted.is_set() or self._built != self._generation or self._loaded_pending()):
            if self._task is None or self._task.done() or time.monotonic() >= deadline or self._failures > failures:
                return False
            self._state.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state.wait(), max(0.0, deadline - time.monotonic()))
        return True

    def _loaded_pending(self) -> bool:
        """Whether a pending feeder has loaded since the last successful build started (which could not see it)."""
        return any(self._loaded.get(name, -1.0) >= self._started for name in self.pending)

    async def close(self) -> None:
        """Stop building at once (a build under way is cancelled: it rolls back)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _keep(self) -> None:
        held = asyncio.get_running_loop().create_task(self._note_held())  # beside the first build, not after it
        try:
            await self._keep_building()
        finally:
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await held

    async def _keep_building(self) -> None:
        attempt = 0
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            if await self._try_build():
                attempt = 0
                continue
            attempt += 1
            self._failures += 1
            self._state.set()
            delay_s = min(self._retry_max_s, 2.0 ** (attempt - 1)) * self._rng.uniform(0.8, 1.0)
            log.info("coordinator.build_retry", attempt=attempt, retry_s=round(delay_s, 1))
            with contextlib.suppress(TimeoutError):  # a reload (a new configuration) retries at once
                await asyncio.wait_for(self._wanted.wait(), delay_s)
            self._wanted.set()

    async def _try_build(self) -> bool:
        """One build of the newest configuration; whether it succeeded (a superseded build counts as done: the
        newer one is wanted already)."""
        generation, config, started = self._generation, self._config, time.monotonic()
        self._build = asyncio.get_running_loop().create_task(
            build_coordinator(config, current=lambda: self._generation == generation)
        )
        try:
            report = await self._build
        except asyncio.CancelledError:
            if self._generation != generation and not _cancelling():
                return True  # a reload cancelled it: the new configuration is wanted already
            raise
        except FedloadError as exc:
            log.error("coordinator.build_failed", error=str(exc), error_kind=exc.kind)
            return False
        except Exception as exc:  # a bug in the build: retried all the same, its traceback logged
            error = internal_error(exc)
            log.error("coordinator.build_failed", error=error, error_kind=ErrorKind.INTERNAL, exc_info=exc)
            return False
        finally:
            self._build = None
        if report.superseded:
            return True
        if report.deferred:
            return False
        self._succeeded(generation, config, report, started)
        return True

    def _succeeded(self, generation: int, config: Config, report: CoordinatorReport, started: float) -> None:
        self._built, self._started = generation, started
        self.pending = frozenset(report.pending)
        self._safe |= set(self._feeders(config))
        if self._loaded_pending():  # loaded while this build ran: build again to read them there
            self._wanted.set()
        self._state.set()
        self._changed()

    async def _note_held(self) -> None:
        """Before the first build has succeeded: the feeders their shards hold already may load (best effort)."""
        config = self._config
        for shard, names in config.by_shard(self._feeders(config)).items():
            if shard is None:
                continue
            try:
                held = (await read_shard(config, shard)).held
            except FedloadError as exc:
                log.warning("coordinator.holdings_unknown", shard=shard, error=str(exc))
                continue
            except Exception as exc:  # a bug: its feeders wait for a build, as if the shard could not be reached
                log.error("coordinator.holdings_unknown", shard=shard, error=internal_error(exc), exc_info=exc)
                continue
            self._safe |= held & set(names)
        self._state.set()
        self._changed()


async def build_coordinator(config: Config, *, current: Callable[[], bool]) -> CoordinatorReport:
    """fedload.scaleout.coordinator's build, imported at the first one: a sync or daemon without a coordinator does
    not import the scale-out code (~15 ms of every `fedload sync`'s start-up)."""
    from fedload.scaleout.coordinator import build_coordinator as build  # noqa: PLC0415

    return await build(config, current=current)


async def read_shard(config: Config, shard: str) -> ShardState:
    """fedload.scaleout.shard_side's read of a shard, imported at the first one (see `build_coordinator`)."""
    from fedload.scaleout.shard_side import read_shard as read  # noqa: PLC0415

    return await read(config, shard)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
