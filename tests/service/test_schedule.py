"""The daemon's schedule: jitter around the interval, backoff after failures, capped."""

from __future__ import annotations

import random

from fedload.service.schedule import FeederSchedule, after_failure, after_success, first_run


def test_first_runs_start_within_seconds_even_for_long_intervals() -> None:
    """A fresh daemon starts every feeder within a few seconds, spread out."""
    rng = random.Random(1)
    starts = [first_run(100.0, 3600.0, rng).next_at for _ in range(50)]
    assert all(100.0 <= s <= 105.0 for s in starts)
    assert len({round(s, 3) for s in starts}) > 40


def test_success_schedules_the_interval_with_jitter() -> None:
    """After a success the next run is the interval away, +-10 %."""
    rng = random.Random(2)
    gaps = [after_success(0.0, 300.0, rng).next_at for _ in range(100)]
    assert all(270.0 <= g <= 330.0 for g in gaps)
    assert max(gaps) - min(gaps) > 20


def test_failures_back_off_exponentially_up_to_the_cap() -> None:
    """Each failure doubles the delay (from at most 30 s) until the cap; failures are counted."""
    rng = random.Random(3)
    schedule = FeederSchedule(0.0)
    delays = []
    for _ in range(12):
        schedule = after_failure(0.0, 300.0, schedule, rng, cap_s=1000.0)
        delays.append(schedule.next_at)
    assert schedule.failures == 12
    assert 27 <= delays[0] <= 33
    assert 54 <= delays[1] <= 66
    assert all(d <= 1100 for d in delays)
    assert delays[-1] >= 900
