"""Paused feeders (`fedload feeder pause`) at run time: the daemon and a sync without names ask the feeder's superhub
(with shards, its shard) before each run and skip a paused feeder, saying so; a sync that names the feeder and
`feeder move` do not ask (a person asked for that run). A run under way when the pause comes finishes.

    if (pause := await pause_of(history, job)) is not None:
        return paused_run(pause)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from fedload.errors import FedloadError
from fedload.log import get_logger
from fedload.results import FeederRun, Outcome
from fedload.superhub.bookkeeping import Pause, read_pause
from fedload.superhub.bookkeeping.connection import ShardHistories
from fedload.superhub.job import Job

__all__ = ["PAUSED_RECHECK_S", "PauseWatch", "pause_of", "paused_run"]

log = get_logger()
PAUSED_RECHECK_S = 30.0  # the daemon asks again about a paused feeder at its interval, at least this often


async def pause_of(history: ShardHistories, job: Job) -> Pause | None:
    """The feeder's pause, read on its superhub through the process's bookkeeping connection; None when it is not
    paused, or when the superhub cannot say (the run then goes on and reports the superhub's failure itself)."""
    try:
        return await history.write(job.superhub, functools.partial(read_pause, feeder=job.name))
    except (FedloadError, OSError, TimeoutError) as exc:
        log.debug("sync.pause_unknown", feeder=job.name, error=str(exc) or type(exc).__name__)
        return None


def paused_run(pause: Pause) -> FeederRun:
    """The run a paused feeder did not do: outcome paused, the pause said in `error`, nothing loaded."""
    name = pause.feeder
    return FeederRun(
        feeder=name,
        outcome=Outcome.PAUSED,
        error=f"feeder {name} is {pause.describe()} (fedload feeder resume {name}; `fedload sync {name}` runs it)",
        rows={},
        raw_bytes=0,
        dump_bytes=0,
        seconds=0.0,
    )


class PauseWatch:
    """The daemon's view of its paused feeders: each run asks first; a pause is logged once when the daemon first
    finds it (`daemon.feeder_paused`, with its reason), and its end once (`daemon.feeder_resumed`); `changed` is
    called at each of them (the metrics read the pauses again)."""

    def __init__(self, history: ShardHistories, changed: Callable[[], None]) -> None:
        self._history = history
        self._changed = changed
        self._paused: set[str] = set()

    @property
    def paused(self) -> frozenset[str]:
        """The feeders found paused at their last due run."""
        return frozenset(self._paused)

    async def skipped(self, job: Job) -> FeederRun | None:
        """The skipped run if the feeder is paused, else None (the run goes on)."""
        name = job.name
        pause = await pause_of(self._history, job)
        if pause is None:
            if name in self._paused:
                self._paused.discard(name)
                log.info("daemon.feeder_resumed", feeder=name)
                self._changed()
            return None
        if name not in self._paused:
            self._paused.add(name)
            log.info("daemon.feeder_paused", feeder=name, reason=pause.reason, since=str(pause.since), by=pause.by)
            self._changed()
        return paused_run(pause)
