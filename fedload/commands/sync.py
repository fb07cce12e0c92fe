"""`fedload sync`: its face (the selection of feeders, the live display, the summary); `fedload.service.sync` runs
the feeders."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fedload.config import Config
from fedload.errors import ConfigError, FedloadError, UsageError
from fedload.log import get_logger
from fedload.results import FeederRun, Outcome
from fedload.service.sync import sync_feeders
from fedload.service.workers import ForkedWorker, fork_workers, reap_forked, worker_modules
from fedload.superhub.bookkeeping import has_history, last_sizes
from fedload.superhub.job import superhub_target
from fedload.superhub.session import superhub_session

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["expected_sizes", "run_interruptibly", "run_sync", "sync_with_display"]

log = get_logger()

T = TypeVar("T")


async def expected_sizes(config: Config, names: Sequence[str]) -> dict[str, int]:
    """The bytes each feeder sent in its last successful run (for the progress ETA); empty if the superhub
    cannot tell, the sync itself then reports why."""
    sizes: dict[str, int] = {}
    for shard, feeders in config.by_shard(names).items():
        try:
            async with superhub_session(superhub_target(config, shard)) as conn:
                if await has_history(conn):
                    sizes.update(await last_sizes(conn, feeders))
        except FedloadError as exc:
            log.debug("sync.no_expected_sizes", shard=shard, error=str(exc))
    return sizes


def _selected(config: Config, names: Sequence[str]) -> list[str]:
    if not config.feeders:
        raise ConfigError("the configuration has no [feeders.NAME] sections")
    unknown = [n for n in names if n not in config.feeders]
    if unknown:
        raise UsageError(f"unknown feeder(s) {', '.join(unknown)}; configured: {', '.join(config.feeders)}")
    return list(names) or list(config.feeders)


def run_sync(config: Config, names: Sequence[str], *, as_json: bool = False, dry_run: bool = False) -> int:
    """Sync once (or dry-run) and print a summary; 0 if every feeder succeeded (or, without `names`, was skipped
    as paused), 1 otherwise. Named feeders run even when paused: a person asked."""
    selected, skip_paused = _selected(config, names), not names
    superhub = config.superhub
    workers = min(len(selected), superhub.max_parallel_feeders, superhub.workers)
    preload = worker_modules(config.feeders.values())
    forked = fork_workers(workers, preload)  # before the event loop: see fork_workers
    try:
        if as_json:
            runs = run_interruptibly(
                sync_feeders(config, selected, dry_run=dry_run, forked=forked, skip_paused=skip_paused)
            )
            print(json.dumps([dataclasses.asdict(run) for run in runs]))
        else:
            from rich.console import Console  # noqa: PLC0415 - the display's; `--json` (scripts) spares its import

            display = sync_with_display(
                config, selected, Console(), dry_run=dry_run, forked=forked, skip_paused=skip_paused
            )
            runs = run_interruptibly(display)
    finally:
        reap_forked(forked)  # those the pool never took (it did not start: Ctrl-C, no superhub)
    return 0 if all(run.succeeded or run.outcome is Outcome.PAUSED for run in runs) else 1


def run_interruptibly(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, Ctrl-C (SIGINT) cancelling it once: the runs in the workers are cancelled, their records
    say so, and KeyboardInterrupt is raised when it has ended. The handler goes through the loop's wakeup fd, which
    whichever thread the kernel hands the signal to writes: asyncio.run's own handler runs only in the main thread
    once it runs Python code, and a loop waiting on a silent feeder (no fd ready, no timer due) may never."""
    return asyncio.run(_cancelled_by_sigint(main))


async def _cancelled_by_sigint(main: Coroutine[Any, Any, T]) -> T:
    task, loop = asyncio.current_task(), asyncio.get_running_loop()
    assert task is not None
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        if not interrupted:
            log.info("sync.interrupted")
        interrupted = True
        task.cancel()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        return await main
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)  # back to Python's default: KeyboardInterrupt


async def sync_with_display(
    config: Config,
    names: Sequence[str],
    console: Console,
    *,
    dry_run: bool = False,
    forked: list[ForkedWorker] | None = None,
    skip_paused: bool = False,
) -> list[FeederRun]:
    """Sync with a live table on a terminal (plain logs otherwise), then print the summary table; `skip_paused`:
    see `sync_feeders`."""
    from fedload.commands.output import print_table  # noqa: PLC0415 - rich, for people: see run_sync
    from fedload.commands.progress import dry_run_table, live_progress, summary_table  # noqa: PLC0415

    if console.is_terminal:
        with live_progress(console, await expected_sizes(config, names)) as progress:
            runs = await sync_feeders(config, names, progress, dry_run=dry_run, forked=forked, skip_paused=skip_paused)
    else:
        runs = await sync_feeders(config, names, dry_run=dry_run, forked=forked, skip_paused=skip_paused)
    print_table(summary_table(runs), console)
    if dry_run:
        print_table(dry_run_table(runs), console)
    return runs
