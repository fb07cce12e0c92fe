"""When each feeder runs next: its interval with jitter, exponential backoff after failures, and the holds no
freshness target overrides (a backoff, a busy or paused feeder). Pure, no I/O; which due feeder starts first is
`fedload.service.targets`."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["FeederSchedule", "after_failure", "after_success", "first_run", "held"]

MAX_BACKOFF_S = 3600.0
_JITTER = 0.1  # +-10 % of the interval, so feeders configured alike spread out
_FIRST_RUN_SPREAD_S = 5.0


@dataclass(frozen=True, slots=True)
class FeederSchedule:
    """A feeder's next run time (monotonic seconds), how many runs in a row have failed, and the time before which
    it never starts, even past its freshness target (`not_before`: a backoff, a retry of a busy feeder)."""

    next_at: float
    failures: int = 0
    not_before: float = float("-inf")


def _jittered(seconds: float, rng: random.Random) -> float:
    return seconds * rng.uniform(1 - _JITTER, 1 + _JITTER)


def first_run(now: float, interval_s: float, rng: random.Random) -> FeederSchedule:
    """Start soon: spread over a tenth of the interval, at most the first few seconds."""
    return FeederSchedule(now + rng.uniform(0, min(interval_s * _JITTER, _FIRST_RUN_SPREAD_S)))


def after_success(now: float, interval_s: float, rng: random.Random) -> FeederSchedule:
    """The next regular run."""
    return FeederSchedule(now + _jittered(interval_s, rng))


def after_failure(
    now: float, interval_s: float, previous: FeederSchedule, rng: random.Random, cap_s: float = MAX_BACKOFF_S
) -> FeederSchedule:
    """Retry sooner than the interval at first, then back off exponentially up to `cap_s` (or the interval)."""
    failures = previous.failures + 1
    delay = min(max(cap_s, interval_s), min(interval_s, 30.0) * 2 ** (failures - 1))
    return held(now + _jittered(delay, rng), failures)


def held(until: float, failures: int = 0) -> FeederSchedule:
    """Run at `until`, not before it even past the freshness target."""
    return FeederSchedule(until, failures, not_before=until)
