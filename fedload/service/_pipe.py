"""Messages between fedload and its own worker processes: typed values, as length-prefixed pickles over a Unix
socket pair.

Only fedload's parent and the workers it started are at either end (the socket is inherited, never named), so
pickle carries runs, progress and results as they are. Feeder data never crosses it.

    parent -> worker: Run, then HistoryWritten or HistoryFailed for each history request; Cancel; Forget (at any
                      time, a run under way or not)
    worker -> parent: Ready once; for each run Progressed, StartRun and FinishRun (history requests), then
                      Done, Cancelled or Crashed
"""

from __future__ import annotations

import asyncio
import pickle
from dataclasses import dataclass

from fedload.errors import ErrorKind
from fedload.results import FeederRun, Progress
from fedload.superhub.bookkeeping import RunRecord
from fedload.superhub.job import Job

__all__ = [
    "Cancel",
    "Cancelled",
    "Crashed",
    "Done",
    "FinishRun",
    "Forget",
    "HistoryFailed",
    "HistoryWritten",
    "Progressed",
    "Ready",
    "Run",
    "StartRun",
    "ToParent",
    "ToWorker",
    "for_parent",
    "for_worker",
    "frame",
]

_HEADER = 4
_MAX_MESSAGE = 64 << 20  # a run's job or result is kilobytes: anything larger is a bug


# From the parent to a worker.


@dataclass(frozen=True, slots=True)
class Run:
    """Sync one feeder: its job is all the worker reads of the configuration, and no larger with more feeders."""

    job: Job
    dry_run: bool


@dataclass(frozen=True, slots=True)
class HistoryWritten:
    """The parent wrote what history request `request_id` asked: `result` is StartRun's run id, else None."""

    request_id: int
    result: int | None


@dataclass(frozen=True, slots=True)
class HistoryFailed:
    """The parent could not write history request `request_id`: why, and the kind of its failure."""

    request_id: int
    error: str
    kind: ErrorKind


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel the run under way (its transaction rolls back, its record says so)."""


@dataclass(frozen=True, slots=True)
class Forget:
    """Close the feeder's kept SSH connection, and keep none of its run under way (paused, removed, reconfigured:
    fedload.transport.kept_ssh)."""

    feeder: str
    reason: str


ToWorker = Run | HistoryWritten | HistoryFailed | Cancel | Forget


# From a worker to the parent.


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker has imported what it needs and serves runs."""


@dataclass(frozen=True, slots=True)
class Progressed:
    """The run's progress (at most every 0.2 s, and at each phase)."""

    progress: Progress


@dataclass(frozen=True, slots=True)
class StartRun:
    """Record a new run of `feeder` in the run history (answered with its id)."""

    request_id: int
    feeder: str


@dataclass(frozen=True, slots=True)
class FinishRun:
    """Record how run `run_id` ended."""

    request_id: int
    run_id: int
    record: RunRecord


@dataclass(frozen=True, slots=True)
class Done:
    """The run ended with `result` (succeeded or failed, as its pipeline reports)."""

    result: FeederRun


@dataclass(frozen=True, slots=True)
class Cancelled:
    """The run ended cancelled."""


@dataclass(frozen=True, slots=True)
class Crashed:
    """The run ended without a result: a bug, or a request the worker refused; `error` says which."""

    error: str


ToParent = Ready | Progressed | StartRun | FinishRun | Done | Cancelled | Crashed


def frame(message: ToWorker | ToParent) -> bytes:
    """`message` ready to write: its length, then its pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(_HEADER, "big") + data


async def for_worker(reader: asyncio.StreamReader) -> ToWorker:
    """The parent's next message to this worker (see `_receive`); TypeError if it is not one."""
    message = await _receive(reader)
    if not isinstance(message, Run | HistoryWritten | HistoryFailed | Cancel | Forget):
        raise TypeError(f"not a message for a worker: {type(message).__name__}")
    return message


async def for_parent(reader: asyncio.StreamReader) -> ToParent:
    """A worker's next message to its parent (see `_receive`); TypeError if it is not one."""
    message = await _receive(reader)
    if not isinstance(message, Ready | Progressed | StartRun | FinishRun | Done | Cancelled | Crashed):
        raise TypeError(f"not a worker's message: {type(message).__name__}")
    return message


async def _receive(reader: asyncio.StreamReader) -> object:
    """The next message; asyncio.IncompleteReadError when the other end has gone, ValueError if it is too large."""
    size = int.from_bytes(await reader.readexactly(_HEADER), "big")
    if size > _MAX_MESSAGE:
        raise ValueError(f"a worker message of {size} bytes")
    message: object = pickle.loads(await reader.readexactly(size))  # noqa: S301 - our own process at the other end
    return message
