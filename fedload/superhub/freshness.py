"""When a run's data was true: the time of the feeder's snapshot as its agent states it, checked here; the run's
record keeps the earlier of it and the run's start on the superhub (fedload.superhub.bookkeeping.runs), so a feeder
can make its own data look older, never fresher (docs/freshness.md)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from fedload.errors import DumpError
from fedload.stream import Trailer

__all__ = ["stated_snapshot"]

_EARLIEST = datetime(1, 1, 2, tzinfo=UTC)  # a day inside datetime's range, whatever the time zone
_LATEST = datetime(9999, 12, 30, tzinfo=UTC)


def stated_snapshot(trailer: Trailer | None) -> datetime | None:
    """The time the trailer says the dump's snapshot was taken (UTC); None where it says none (an agent before it,
    a feeder without the agent). A time beyond what a datetime holds is taken as its first or last: either way the
    earlier of it and the run's start is what counts. DumpError for a value that is no time (NaN, infinite)."""
    stated = None if trailer is None else trailer.snapshot_epoch_s
    if stated is None:
        return None
    if not math.isfinite(stated):
        raise DumpError(f"the feeder's trailer states snapshot_epoch_s = {stated!r}, which is no time")
    if stated <= _EARLIEST.timestamp():
        return _EARLIEST
    if stated >= _LATEST.timestamp():
        return _LATEST
    return datetime.fromtimestamp(stated, UTC)
