"""`fedload sync`: run the pipeline once for some or all feeders, in parallel within the configured bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from fedload.config import Config
from fedload.errors import ErrorKind, internal_error
from fedload.log import get_logger
from fedload.results import FeederRun, Outcome, Progress, ProgressCallback
from fedload.service.coordinator_keeper import CoordinatorKeeper
from fedload.service.pauses import pause_of, paused_run
from fedload.service.workers import ForkedWorker, worker_modules, worker_pool
from fedload.superhub.bookkeeping.connection import ShardHistories
from fedload.superhub.job import feeder_jobs, parents_spec, superhub_target
from fedload.superhub.pipeline import sync_feeder
from fedload.superhub.session import prepare_superhub

__all__ = ["prepare_superhub", "sync_feeders"]

log = get_logger()
COORDINATOR_WAIT_S = 60.0  # the longest a feeder new to its shard waits for the coordinator's build, or a sync for
# the build after its runs; the feeder's run then fails, the next sync tries again


async def sync_feeders(
    config: Config,
    names: Sequence[str],
    progress: ProgressCallback | None = None,
    *,
    dry_run: bool = False,
    forked: list[ForkedWorker] | None = None,
    skip_paused: bool = False,
) -> list[FeederRun]:
    """Sync the named feeders, at most `max_parallel_feeders` at a time; results in the order of `names`.

    A dry run reads every dump and loads it into staging tables like a sync, checks that the swap is allowed,
    and rolls back: nothing on the superhub changes, not even the run history. `forked`: the first worker
    processes, forked before the event loop started (`fork_workers`). `skip_paused`: a paused feeder (`fedload
    feeder pause`) is not run, its result says so (outcome paused); `fedload sync` without names.
    """
    slots = asyncio.Semaphore(config.superhub.max_parallel_feeders)
    history = ShardHistories()  # one connection (per shard) records every feeder's runs
    pool = worker_pool(config.superhub.workers, worker_modules(config.feeders.values()), forked)
    jobs = feeder_jobs(config, names)  # with shards, each feeder's shard is its superhub
    built = config if not dry_run else config.model_copy(update={"coordinator": None})  # a dry run changes nothing
    coordinator = CoordinatorKeeper(built, feeders=lambda _: names)

    async def one(name: str) -> FeederRun:
        if skip_paused and (pause := await pause_of(history, jobs[name])) is not None:
            log.info("sync.feeder_paused", feeder=name, reason=pause.reason, since=str(pause.since), by=pause.by)
            if progress is not None:
                progress(Progress(name, phase=Outcome.PAUSED))
            return paused_run(pause)
        if not await coordinator.ready(name, wait_s=COORDINATOR_WAIT_S):
            return _not_built(name, config)
        async with slots:
            started = time.monotonic()
            try:
                if pool is None:
                    run = await sync_feeder(jobs[name], progress=progress, dry_run=dry_run, history=history)
                else:
                    run = await pool.run(jobs[name], history=history, progress=progress, dry_run=dry_run)
            except Exception as exc:  # both report a run's failures: this is a bug around the run,
                # which fails this feeder only, never the others' runs or the sync's summary
                log.error("sync.run_crashed", feeder=name, exc_info=exc)
                return FeederRun.failed(
                    name, internal_error(exc), kind=ErrorKind.INTERNAL, seconds=time.monotonic() - started
                )
        if run.succeeded and not dry_run:
            coordinator.loaded(name)  # given another shard: the coordinator is built again to read it there
        return run

    try:
        if pool is not None:  # the workers start while the superhub is prepared
            pool.start_ahead(min(len(names), config.superhub.max_parallel_feeders))
        if not dry_run:
            for shard in config.by_shard(names):
                await prepare_superhub(superhub_target(config, shard), parents_spec(config))
        coordinator.start()  # beside the runs: a feeder new to its shard waits for it, the others go on
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(name)) for name in names]
        if not await coordinator.settled(COORDINATOR_WAIT_S):
            log.warning("sync.coordinator_not_built", pending=sorted(coordinator.pending), wait_s=COORDINATOR_WAIT_S)
    finally:
        await asyncio.shield(coordinator.close())
        if pool is not None:
            await asyncio.shield(pool.close())
        await asyncio.shield(history.close())
    return [task.result() for task in tasks]


def _not_built(name: str, config: Config) -> FeederRun:
    """The run of a feeder new to its shard when the coordinator could not be built to read it there."""
    error = (
        f"feeder {name} is not loaded on shard {config.feeders[name].shard}: the coordinator could not be built to "
        f"read it there within {COORDINATOR_WAIT_S:g} s (see coordinator.build_failed), and a load before that "
        "would show it twice or outside its bound"
    )
    return FeederRun.failed(name, error, kind=ErrorKind.SUPERHUB, seconds=0.0)
