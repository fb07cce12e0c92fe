"""`fedload sync`: run the pipeline once for some or all feeders, in parallel within the configured bound."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Sequence

from fedload.config import Config
from fedload.errors import ConfigError, UsageError
from fedload.log import get_logger
from fedload.pipeline import FeederRun, Progress, ProgressCallback, connect_superhub, sync_feeder
from fedload.runs import ensure_superhub
from fedload.schema import create_parents_from_file

__all__ = ["prepare_superhub", "run_sync", "sync_feeders"]

log = get_logger()


def _key_type(config: Config) -> str:
    return "integer" if all(isinstance(f.key, int) for f in config.feeders.values()) else "text"


async def prepare_superhub(config: Config) -> None:
    """fedload's own schemas, and the partitioned parents from the schema file when one is configured."""
    conn = await connect_superhub(config)
    try:
        await ensure_superhub(conn)
        if config.superhub.schema_file is not None:
            created = await create_parents_from_file(
                conn, config.superhub.schema_file, config.superhub.feeder_key, _key_type(config), config.superhub.tables
            )
            if created:
                log.info("superhub.parents_created", tables=created)
    finally:
        await conn.close(timeout=10)


async def sync_feeders(
    config: Config, names: Sequence[str], progress: ProgressCallback | None = None
) -> list[FeederRun]:
    """Sync the named feeders, at most `max_parallel_feeders` at a time; results in the order of `names`."""
    await prepare_superhub(config)
    slots = asyncio.Semaphore(config.superhub.max_parallel_feeders)

    async def one(name: str) -> FeederRun:
        async with slots:
            return await sync_feeder(name, config, progress=progress)

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(name)) for name in names]
    return [task.result() for task in tasks]


def _selected(config: Config, names: Sequence[str]) -> list[str]:
    if not config.feeders:
        raise ConfigError("the configuration has no [feeders.NAME] sections")
    unknown = [n for n in names if n not in config.feeders]
    if unknown:
        raise UsageError(f"unknown feeder(s) {', '.join(unknown)}; configured: {', '.join(config.feeders)}")
    return list(names) or list(config.feeders)


def _summary(runs: list[FeederRun]) -> str:
    header = f"{'feeder':<20} {'outcome':<8} {'rows':>12} {'MB':>9} {'seconds':>8}  error"
    lines = [
        f"{run.feeder:<20} {run.outcome:<8} {sum(run.rows.values()):>12} {run.raw_bytes / 1e6:>9.1f} "
        f"{run.seconds:>8.1f}  {run.error or ''}"
        for run in runs
    ]
    return "\n".join([header, *lines])


def run_sync(config: Config, names: Sequence[str], *, as_json: bool = False) -> int:
    """Sync once and print a summary; 0 if every feeder succeeded, 1 otherwise."""
    selected = _selected(config, names)
    progress = _progress_printer() if sys.stderr.isatty() and not as_json else None
    runs = asyncio.run(sync_feeders(config, selected, progress))
    if as_json:
        print(json.dumps([dataclasses.asdict(run) for run in runs]))
    else:
        print(_summary(runs))
    return 0 if all(run.outcome == "success" for run in runs) else 1


def _progress_printer() -> ProgressCallback:
    def show(state: Progress) -> None:
        print(f"\r{state.feeder}: {state.phase} {state.raw_bytes / 1e6:.1f} MB, {state.rows} rows", end="",
              file=sys.stderr)  # fmt: skip

    return show
