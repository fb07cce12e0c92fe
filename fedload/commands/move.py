"""`fedload feeder move NAME --to SHARD`: move a feeder to another shard while every reader of the coordinator
sees it served from exactly one shard, in six steps under the coordinator's move lock (build for the new shard,
sync there, build again, drop on the old shards, rewrite the configuration, build from it), the file rewritten
last so that running the move again finishes it wherever it stopped. The steps and what each guarantees:
docs/scale-out.md, "Moving a feeder to another shard".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from fedload.config import Config, load_config
from fedload.config_edit import set_feeder_shard
from fedload.english import counted
from fedload.errors import FedloadError, SuperhubError, UsageError
from fedload.log import get_logger
from fedload.results import FeederRun, Outcome
from fedload.scaleout.coordinator import CoordinatorReport, build_coordinator, moving_feeders
from fedload.scaleout.shard_side import read_shard
from fedload.superhub.bookkeeping import Pause, ensure_superhub, forget_move, read_pause, write_pause
from fedload.superhub.job import feeder_job, parents_spec, superhub_target, swap_policy
from fedload.superhub.pipeline import sync_feeder
from fedload.superhub.removal import BUSY_WAIT_S, FeederBusyError, drop_feeder
from fedload.superhub.session import superhub_session

__all__ = ["MoveError", "move_feeder"]

log = get_logger()
_BUSY_WAIT_S = BUSY_WAIT_S  # how long the removal on an old shard (or the load on the new one) waits for a run there
_BUSY_POLL_S = 0.5


class MoveError(SuperhubError):
    """A move stopped part-way; the message says where the feeder is served from and what to run."""


@dataclass(frozen=True, slots=True)
class _Move:
    name: str
    to: str
    before: Config  # the configuration as it was
    staged: Config  # the same with the feeder on `to`, every shard kept (not validated: `to` may be its only one)
    path: Path

    @property
    def came_from(self) -> str:
        """The shard the configuration named before the move."""
        return self.before.feeders[self.name].shard or ""

    @property
    def again(self) -> str:
        """What to run to finish the move, for a message."""
        return f'run "fedload feeder move {self.name} --to {self.to}" again'


def move_feeder(config: Config, path: Path, name: str, to: str) -> int:
    """Move feeder `name` to shard `to` (see the module); 0 when it is there, MoveError when the move stopped."""
    move = _planned(config, path, name, to)
    asyncio.run(_run(move))
    return 0


def _planned(config: Config, path: Path, name: str, to: str) -> _Move:
    if not config.shards:
        raise UsageError("feeder move needs [shards] in the configuration")
    if name not in config.feeders:
        raise UsageError(f"unknown feeder {name}; configured: {', '.join(config.feeders)}")
    if to not in config.shards:
        raise UsageError(f"unknown shard {to}; shards: {', '.join(config.shards)}")
    feeders = dict(config.feeders)
    feeders[name] = feeders[name].model_copy(update={"shard": to})
    return _Move(name, to, config, config.model_copy(update={"feeders": feeders}), path)


async def _run(move: _Move) -> None:
    holders = await _holders(move.before, move.name)
    sources = sorted((holders | {move.came_from}) - {move.to})
    if not sources:
        print(f"feeder {move.name} is on shard {move.to} already")
        await _finish_build(move.before, move.name)
        return
    async with contextlib.AsyncExitStack() as held:
        if move.before.coordinator is not None:
            try:
                await held.enter_async_context(moving_feeders(move.before))
            except SuperhubError as exc:
                raise MoveError(f"feeder {move.name}: nothing changed ({exc}): {move.again} to finish") from exc
        await _steps(move, sources)


async def _holders(config: Config, name: str) -> set[str]:
    """The shards holding partitions of the feeder."""
    return {shard for shard in config.shards if name in (await read_shard(config, shard)).held}


async def _steps(move: _Move, sources: list[str]) -> None:
    run = await _load_and_switch(move)
    for shard in sources:
        await _remove_from(move, shard)
    await _name_new_shard(move, sources)
    try:
        final = await asyncio.to_thread(load_config, move.path)
        await _build(move, "6/6 coordinator: reads the shards directly again", config=final, failed="")
    except FedloadError as exc:  # moved all the same: the next build reads the old shards directly again
        filtered = ", ".join(sources)
        print(f"feeder {move.name}: the coordinator reads {filtered} through a filter until its next build: {exc}")
    log.info("feeder.moved", feeder=move.name, to=move.to, came_from=sources, run_seconds=round(run.seconds, 1))
    print(f"feeder {move.name}: moved to shard {move.to} ({counted(sum(run.rows.values()), 'row')} loaded there)")


async def _load_and_switch(move: _Move) -> FeederRun:
    """Steps 1 to 3: the new shard filtered, the feeder loaded there, the coordinator switched to it."""
    name, to = move.name, move.to
    report = await _build(
        move,
        "1/6 coordinator: reads it from where it is, and shard {to} through a filter",
        failed=f"nothing changed: {move.again} to finish",
    )
    served = f"shard {move.came_from}" if report is None else f"shard {report.pending.get(name, to)}"
    await _allow_on(move)
    print(f"feeder {name}: 2/6 loading on shard {to}", flush=True)
    run = await _load(move)
    if not run.succeeded:
        raise MoveError(
            f"feeder {name}: the load on shard {to} failed ({run.error}); it is still served from {served}: "
            f"{move.again} to finish"
        )
    report = await _build(
        move,
        "3/6 coordinator: reads it from shard {to}",
        failed=f"it is loaded there but still served from {served}: {move.again} to finish",
    )
    if report is not None and name in report.pending:
        raise MoveError(
            f"feeder {name}: loaded on shard {to}, but the coordinator still reads it from {served}: "
            f"{move.again} to finish"
        )
    return run


async def _load(move: _Move) -> FeederRun:
    """Step 2: the feeder synced on its new shard; while a run of it there holds its run lock (a daemon that
    already has the new configuration), that run's end is waited for and the load tried again, up to
    `_BUSY_WAIT_S`."""
    deadline = time.monotonic() + _BUSY_WAIT_S
    while (run := await sync_feeder(feeder_job(move.staged, move.name))).outcome is Outcome.BUSY:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(_BUSY_POLL_S)
    return run


async def _name_new_shard(move: _Move, sources: list[str]) -> None:
    """Step 5: the configuration file names the new shard."""
    name, to = move.name, move.to
    try:
        emptied = await asyncio.to_thread(set_feeder_shard, move.path, name, to)
    except FedloadError as exc:
        raise MoveError(
            f"feeder {name} is served from shard {to} and gone from {', '.join(sources)}, but {exc}; "
            f'set feeders.{name}.shard = "{to}" there by hand, or run the move again'
        ) from exc
    gone = f" and no longer has [shards.{emptied[0]}], which has no feeders left" if emptied else ""
    print(f"feeder {name}: 5/6 {move.path} names shard {to}{gone}", flush=True)


async def _finish_build(config: Config, name: str) -> None:
    """A move found done: build the coordinator from the file, which names the new shard (a move that stopped
    before its last build left the old shard read through a filter)."""
    if config.coordinator is None:
        return
    try:
        await build_coordinator(config)
    except FedloadError as exc:
        print(f"feeder {name}: the coordinator's build failed ({exc}); its next build reads the shards directly")


async def _build(move: _Move, step: str, *, failed: str, config: Config | None = None) -> CoordinatorReport | None:
    """A coordinator build of the move (none without a coordinator), said as `step` first; MoveError saying
    `failed` (where the feeder is served from) if it fails."""
    if move.before.coordinator is None:
        return None
    print(f"feeder {move.name}: {step.format(to=move.to)}", flush=True)
    try:
        return await build_coordinator(config or move.staged, moving=True)
    except FedloadError as exc:
        if not failed:
            raise
        raise MoveError(f"feeder {move.name}: the coordinator's build failed ({exc}); {failed}") from exc


async def _allow_on(move: _Move) -> None:
    """Forget an earlier move of the feeder away from the new shard, which would refuse its load there; a paused
    feeder's pause goes there too (the old shard's is forgotten with its history)."""
    pause = await _pause_on(move, move.came_from)
    async with superhub_session(superhub_target(move.staged, move.to)) as conn:
        await forget_move(conn, move.name)
        if pause is not None:
            await ensure_superhub(conn)  # a shard set up by an older fedload gets fedload.paused
            await write_pause(conn, pause)


async def _pause_on(move: _Move, shard: str) -> Pause | None:
    """The feeder's pause on `shard`; None, said, if that shard cannot be read (a move off a shard that is down
    goes on without it)."""
    try:
        async with superhub_session(superhub_target(move.before, shard)) as conn:
            return await read_pause(conn, move.name)
    except FedloadError as exc:
        print(
            f"feeder {move.name}: cannot read shard {shard} ({exc}); if it was paused there, "
            f"pause it again after the move (fedload feeder pause {move.name})",
            flush=True,
        )
        return None


async def _remove_from(move: _Move, shard: str) -> None:
    """Step 4 on one old shard: waits a while for a run of the feeder there (an old daemon) to end, and for the
    parents' locks as a swap does (`drop_feeder`)."""
    try:
        dropped, runs = await drop_feeder(
            superhub_target(move.before, shard),
            parents_spec(move.before),
            move.name,
            move.before.feeders[move.name].key,
            moved_to=move.to,
            policy=swap_policy(move.before),  # the coordinator reads it from the new shard already: no entity change
            busy_wait_s=_BUSY_WAIT_S,
        )
    except FeederBusyError:
        raise MoveError(
            f"feeder {move.name} is served from shard {move.to}, but a run of it on shard {shard} held it "
            f"for {_BUSY_WAIT_S:g} s: {move.again} to remove it there"
        ) from None
    except FedloadError as exc:  # the old shard down, say: the file still names it, a rerun finishes
        raise MoveError(
            f"feeder {move.name} is served from shard {move.to}, but dropping it from shard {shard} failed "
            f"({exc}): {move.again} to remove it there"
        ) from exc
    rows = sum(dropped.values())
    print(
        f"feeder {move.name}: 4/6 dropped from shard {shard}: {counted(len(dropped), 'partition')}, "
        f"{counted(rows, 'row')}, {counted(runs, 'recorded run')}",
        flush=True,
    )
