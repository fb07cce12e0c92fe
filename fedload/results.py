"""What a feeder's run is doing and how it ended: its phases, its outcome, its live progress and its result."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from fedload.errors import ErrorKind

__all__ = ["RECORDED_OUTCOMES", "FeederRun", "Outcome", "Phase", "Progress", "ProgressCallback"]


class Outcome(StrEnum):
    """How a run ended (or that it has not yet); the values are those of `fedload.runs.outcome` and of JSON."""

    RUNNING = "running"  # recorded at the start, replaced when the run finishes
    SUCCESS = "success"
    FAILED = "failed"
    BUSY = "busy"  # another process holds the feeder's lock: nothing done, nothing recorded
    PAUSED = "paused"  # `fedload feeder pause`: skipped by the daemon and by a sync without names, nothing recorded
    ABANDONED = "abandoned"  # recorded as running but never finished (the process died); set by the next run


# The outcomes `fedload.runs` holds: a busy or paused run never starts a record.
RECORDED_OUTCOMES = tuple(o for o in Outcome if o not in (Outcome.BUSY, Outcome.PAUSED))


class Phase(StrEnum):
    """Where a run is; when it ends, a progress display shows its Outcome instead."""

    WAITING = "waiting"  # for a slot (max_parallel_feeders)
    CONNECT = "connect"  # to the superhub, the feeder's lock, the run's record, the expected parents
    LOAD = "load"  # the dump into staging tables
    SWAP = "swap"  # verified and indexed staging tables replace the feeder's partitions
    ANALYZE = "analyze"  # the new partitions, after the commit


@dataclass(slots=True)
class Progress:
    """Live state of one feeder's run, for progress displays; `phase` is a Phase, then the run's Outcome."""

    feeder: str
    phase: str = Phase.WAITING
    raw_bytes: int = 0
    dump_bytes: int = 0
    rows: int = 0
    started: float = field(default_factory=time.monotonic)


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class FeederRun:
    """How one feeder's run ended; `rows` and `rejected` are keyed by `str(TableName)` (as in JSON output)."""

    feeder: str
    outcome: Outcome
    error: str | None
    rows: dict[str, int]
    raw_bytes: int
    dump_bytes: int
    seconds: float
    swap_lock_ms: float | None = None
    plan: tuple[str, ...] = ()  # a dry run's account of what the swap would do
    rejected: dict[str, int] = field(default_factory=dict)  # bad_rows = "reject": rows set aside, per table
    swap_attempts: int | None = None
    cancelled_backends: int | None = None  # queries the swap cancelled to get its locks
    error_kind: ErrorKind | None = None  # what kind of failure `error` is (None when the run did not fail)
    unchanged_tables: tuple[str, ...] = ()  # "schema.table" kept as they were: their digest was unchanged
    changed_rows_tables: tuple[str, ...] = ()  # "schema.table" changed in place by their changed rows only

    @classmethod
    def failed(cls, feeder: str, error: str, *, kind: ErrorKind, seconds: float) -> FeederRun:
        """A run that failed before or around its pipeline, with nothing loaded."""
        return cls(
            feeder=feeder,
            outcome=Outcome.FAILED,
            error=error,
            error_kind=kind,
            rows={},
            raw_bytes=0,
            dump_bytes=0,
            seconds=seconds,
        )

    @property
    def succeeded(self) -> bool:
        """The run's outcome is success."""
        return self.outcome is Outcome.SUCCESS
