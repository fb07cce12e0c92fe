"""Freshness targets (docs/freshness.md): which due feeder takes a free lane, and whether the lanes can hold every
feeder within its target. Pure, no I/O; the daemon's `TargetWatch` feeds it what it knows.

    order = start_order(candidates, now)       # the due feeders, the most behind first
    report = verdict(loads, lanes=2)           # None without a target or a measured run
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from fedload.service.schedule import FeederSchedule

__all__ = ["Candidate", "Load", "Verdict", "behind_for", "due_at", "is_due", "lateness", "start_order", "verdict"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A feeder not running now, as the choice of the next run sees it."""

    name: str
    schedule: FeederSchedule
    interval_s: float
    target_s: float | None = None  # its freshness target; None: it runs at its interval only
    age_s: float | None = None  # its data's age now (since its last success started); None: never loaded


def lateness(candidate: Candidate, now: float) -> float:
    """How far behind the feeder is: its data's age over its target (1.0: at its target; never loaded: infinite).
    Without a target its timer counts: 1.0 at its due time, one more per interval late, so that it competes with
    the feeders that have one and, waiting, ends up ahead of every feeder that has just run. So does the retry
    timer of a feeder whose last run failed: its age, growing while it fails, would put it first at every retry."""
    if not _by_age(candidate):
        return 1.0 + (now - candidate.schedule.next_at) / candidate.interval_s
    return math.inf if candidate.age_s is None else candidate.age_s / (candidate.target_s or math.inf)


def _by_age(candidate: Candidate) -> bool:
    """Whether its data's age against its target counts: it has a target and its last run did not fail."""
    return candidate.target_s is not None and not candidate.schedule.failures


def is_due(candidate: Candidate, now: float) -> bool:
    """Due: its timer has come, or it has a target and is past it; never before its hold (a backoff, a retry)."""
    if now < candidate.schedule.not_before:
        return False
    return now >= candidate.schedule.next_at or (_by_age(candidate) and lateness(candidate, now) >= 1.0)


def due_at(candidate: Candidate, now: float) -> float:
    """When the feeder becomes due if nothing changes: its timer, or sooner when its target comes first, never
    before its hold."""
    schedule, past_target_at = candidate.schedule, math.inf
    if _by_age(candidate) and candidate.age_s is not None and candidate.target_s is not None:
        past = lateness(candidate, now) >= 1.0
        past_target_at = now if past else max(now + candidate.target_s - candidate.age_s, math.nextafter(now, math.inf))
    elif _by_age(candidate):
        past_target_at = now  # never loaded: past any target
    return max(schedule.not_before, min(schedule.next_at, past_target_at))


def start_order(candidates: Iterable[Candidate], now: float) -> list[Candidate]:
    """The due feeders in the order free lanes take them: the most behind first, then the longest due, by name."""
    due = [c for c in candidates if is_due(c, now)]
    return sorted(due, key=lambda c: (-lateness(c, now), c.schedule.next_at, c.name))


@dataclass(frozen=True, slots=True)
class Load:
    """A feeder as the capacity verdict sees it (a paused feeder is none: it takes no lane)."""

    name: str
    target_s: float | None
    run_s: float | None  # its last run's duration; None: not measured yet
    behind_s: float | None = None  # how long it has been past its target while the daemon ran (None: not past it,
    # or it is failing: its age then says nothing of the lanes)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether the lanes hold every feeder within its target, measured from the feeders' last run times."""

    reachable: bool
    round_s: float  # the time to run every feeder once with the lanes there are (at least the longest run)
    lanes: int
    lanes_needed: int | None  # ceil(sum of run times / smallest target); None: no number will do (too_long)
    smallest_target_s: float
    behind: tuple[str, ...] = ()  # feeders past their target for more than a round
    too_long: tuple[str, ...] = ()  # feeders whose run alone outlasts the smallest target: no round is short enough


def behind_for(age_s: float | None, target_s: float | None, up_s: float) -> float | None:
    """How long a feeder has been past its target, counted from the daemon's start at the earliest (`up_s` ago):
    the data of a daemon's first round may be old from before it. None when it is not past it."""
    if age_s is None or target_s is None or age_s <= target_s:
        return None
    return min(age_s - target_s, up_s)


def verdict(loads: Iterable[Load], lanes: int) -> Verdict | None:
    """Unreachable when a round takes longer than the smallest target, or when a feeder has been past its target
    for more than a round; None without a target or without a measured run."""
    loads = list(loads)
    targets = [load.target_s for load in loads if load.target_s is not None]
    runs = [load.run_s for load in loads if load.run_s is not None]
    if not targets or not runs:
        return None
    total_s, smallest_s = sum(runs), min(targets)
    round_s = max(total_s / lanes, *runs)
    too_long = tuple(sorted(x.name for x in loads if x.run_s is not None and x.run_s > smallest_s))
    behind = tuple(sorted(x.name for x in loads if x.behind_s is not None and x.behind_s > round_s))
    return Verdict(
        reachable=round_s <= smallest_s and not behind,
        round_s=round_s,
        lanes=lanes,
        lanes_needed=None if too_long else max(1, math.ceil(total_s / smallest_s)),
        smallest_target_s=smallest_s,
        behind=behind,
        too_long=too_long,
    )
