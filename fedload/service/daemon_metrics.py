"""The daemon's metrics at work: served on `daemon.metrics_listen`, fed by its finished runs, refreshed from the run
history at start, after each run and every `_REFRESH_S` (that query is also the superhub check of
`fedload_superhub_up`). Without `metrics_listen` nothing is served and nothing is queried. A daemon per shard
(`shard`) exports that shard's feeders and checks that shard only: the series of several daemons add up, one per
feeder and one per shard.

    metrics = DaemonMetricsService(config.daemon.metrics_listen, history, pool, lambda: daemon.config, shard="s1")
    metrics.start(config.feeders)  # ConfigError if the address cannot be used
    metrics.record(run)            # from the daemon's done callback, for every run
    await metrics.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import asyncpg

from fedload.config import Config, FeederConfig, split_listen_address
from fedload.errors import FedloadError, internal_error
from fedload.log import get_logger
from fedload.results import FeederRun
from fedload.service.metrics import DaemonMetrics, MetricsServer
from fedload.service.workers import WorkerPool
from fedload.superhub.bookkeeping import FeederState, read_feeder_states
from fedload.superhub.bookkeeping.connection import ShardHistories
from fedload.superhub.entities import displaced_counts, displaced_pairs
from fedload.superhub.job import coordinator_target, superhub_target
from fedload.superhub.session import SuperhubTarget, superhub_session

__all__ = ["DaemonMetricsService", "read_states_of"]

_Read = TypeVar("_Read")
log = get_logger()
_REFRESH_S = 15.0  # the superhub check and history refresh, at least this often
_CHECK_S = 10.0  # the refresh query's own budget, on top of the connect timeout
_STOP_S = 5.0


class DaemonMetricsService:
    """See the module docstring."""

    def __init__(
        self,
        listen: str | None,
        history: ShardHistories,
        pool: WorkerPool | None,
        config: Callable[[], Config],
        *,
        shard: str | None = None,
    ) -> None:
        self.metrics = DaemonMetrics()
        self._listen, self._history, self._pool, self._config = listen, history, pool, config
        self._only = shard  # a daemon per shard (`--shard`): only its feeders and its shard
        self._server: MetricsServer | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        self._up: bool | None = None  # the last check's result, to log changes only

    @property
    def port(self) -> int | None:
        """The port served, None when off."""
        return None if self._server is None else self._server.port

    def start(self, feeders: Iterable[str]) -> None:
        """Serve the metrics and start refreshing them; nothing without `metrics_listen`."""
        if self._listen is None:
            return
        self.metrics.add_feeders(name for name in feeders if name in self._mine(self._config()))
        self.metrics.superhub_up.set(0)
        self._server = MetricsServer.start(self.metrics.registry, *split_listen_address(self._listen))
        log.info("daemon.metrics_serving", listen=self._listen, port=self._server.port)
        self._poke.set()
        self._refresher = asyncio.create_task(self._refresh_loop(), name="metrics-refresh")

    def record(self, run: FeederRun) -> None:
        """Count a finished run, and read the history again soon."""
        self.metrics.record_run(run)
        self.poke()

    def poke(self) -> None:
        """Refresh from the history now (after a run, after the superhub is set up)."""
        self._poke.set()

    def reconfigured(self, added: Iterable[str], removed: Iterable[str]) -> None:
        """After a reload: new feeders show up at zero, removed ones disappear."""
        self.metrics.add_feeders(added)
        self.metrics.remove_feeders(removed)
        self.poke()

    async def close(self) -> None:
        """Stop refreshing and serving."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.to_thread(self._server.stop), _STOP_S)

    async def _refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), _REFRESH_S)
            self._poke.clear()
            try:
                await self._refresh()
            except Exception as exc:  # a bug here must not end the refreshes or the daemon
                log.error("daemon.metrics_refresh_crashed", error=internal_error(exc), exc_info=exc)

    async def _refresh(self) -> None:
        self.metrics.workers.set(0 if self._pool is None else self._pool.processes)
        config = self._config()
        mine = self._mine(config)
        self.metrics.set_shards({name: feeder.shard for name, feeder in mine.items()})
        self.metrics.set_targets({name: config.freshness_target_s(name) for name in mine})
        errors: list[str] = []
        for shard, feeders in config.by_shard(mine).items():  # one group, shard None, without shards
            try:
                target = superhub_target(config, shard)
                entities = config.superhub.entity_key is not None and not config.shards  # shards: the coordinator's
                self.metrics.apply_history(await self._read_states(target, feeders, entities=entities))
            except (FedloadError, OSError, TimeoutError) as exc:
                errors.append(f"shard {shard}: {exc}" if shard else str(exc) or type(exc).__name__)
                self._shard(shard, up=False)
            else:
                self._shard(shard, up=True)
        self._superhub(up=not errors, error="; ".join(errors) or None)
        if config.shards and config.coordinator is not None and config.superhub.entity_key is not None:
            counts, pairs = await coordinator_displaced(config), await coordinator_displaced_by(config)
            self.metrics.set_displaced({name: None if counts is None else counts.get(name, 0) for name in mine})
            self.metrics.set_displaced_by({name: None if pairs is None else pairs.get(name, {}) for name in mine})

    def _mine(self, config: Config) -> dict[str, FeederConfig]:
        """The feeders this daemon exports: all, or its shard's."""
        return {n: f for n, f in config.feeders.items() if self._only is None or f.shard == self._only}

    async def _read_states(self, superhub: SuperhubTarget, feeders: list[str], *, entities: bool) -> list[FeederState]:
        """The feeders' states, from the history of the superhub (the shard) they load into; `entities`: with their
        displaced entities (superhub.entity_key)."""
        async with asyncio.timeout(superhub.connect_timeout_s + _CHECK_S):
            read = functools.partial(read_states_of, feeders, entities=entities)
            return await self._history.write(superhub, read)

    def _shard(self, shard: str | None, *, up: bool) -> None:
        if shard is not None:
            self.metrics.shard_up.labels(shard).set(1 if up else 0)

    def _superhub(self, *, up: bool, error: str | None = None) -> None:
        self.metrics.superhub_up.set(1 if up else 0)
        if up != self._up:
            (log.info if up else log.warning)("daemon.metrics_superhub", up=up, error=error)
        self._up = up


async def coordinator_displaced(config: Config) -> dict[str, int] | None:
    """With shards the coordinator keeps the entity registry: each feeder's displaced entities read there; None
    (logged) while it cannot be read."""
    return await _on_coordinator(config, displaced_counts)


async def coordinator_displaced_by(config: Config) -> dict[str, dict[str, int]] | None:
    """With shards: who displaced whom, read on the coordinator (`displaced_pairs`); None (logged) while it cannot
    be read."""
    return await _on_coordinator(config, displaced_pairs)


async def _on_coordinator(config: Config, read: Callable[[asyncpg.Connection], Awaitable[_Read]]) -> _Read | None:
    """`read` on a session of the coordinator, bounded; None (logged) while it cannot be read."""
    target = coordinator_target(config)
    try:
        async with asyncio.timeout(target.connect_timeout_s + _CHECK_S), superhub_session(target, "metrics") as conn:
            return await read(conn)
    except (FedloadError, OSError, TimeoutError) as exc:
        log.info("daemon.metrics_coordinator", error=str(exc) or type(exc).__name__)
        return None


async def read_states_of(feeders: list[str], conn: asyncpg.Connection, *, entities: bool) -> list[FeederState]:
    """The feeders' states as the metrics show them; `entities`: with their displaced entities (superhub.entity_key)."""
    states = await read_feeder_states(conn, feeders)
    if not entities:
        return states
    counts, pairs = await displaced_counts(conn), await displaced_pairs(conn)
    return [
        dataclasses.replace(s, displaced_entities=counts.get(s.feeder, 0), displaced_by=pairs.get(s.feeder, {}))
        for s in states
    ]
