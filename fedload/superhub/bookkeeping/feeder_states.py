"""Each feeder's state as the run history (`fedload.runs`) tells it: last success and the time of its data, last
finished run, failures since; and its pause (`fedload.paused`).

One cheap query (three index lookups per feeder on `runs_feeder_started`), read by the daemon's metrics at start-up
and after each run, so that a restarted daemon reports the same freshness as the one before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from fedload.results import Outcome

__all__ = ["FeederState", "read_feeder_states"]

# $1 the feeders, $2 success, $3 running, $4 the failed outcomes (failed, abandoned)
_QUERY = """
SELECT f.feeder,
       extract(epoch FROM s.finished_at)::float8 AS last_success_s,
       extract(epoch FROM r.finished_at)::float8 AS last_run_s,
       c.failures, c.swap_lock_failures, extract(epoch FROM p.paused_at)::float8 AS paused_since_s,
       extract(epoch FROM coalesce(s.data_at, s.started_at))::float8 AS data_s,
       extract(epoch FROM now() - s.started_at)::float8 AS success_age_s,
       extract(epoch FROM s.finished_at - s.started_at)::float8 AS success_run_s
FROM unnest($1::text[]) AS f (feeder)
LEFT JOIN LATERAL (
    SELECT started_at, finished_at, data_at FROM fedload.runs
    WHERE feeder = f.feeder AND outcome = $2 ORDER BY started_at DESC LIMIT 1
) s ON true
LEFT JOIN LATERAL (
    SELECT finished_at FROM fedload.runs
    WHERE feeder = f.feeder AND outcome <> $3 ORDER BY started_at DESC LIMIT 1
) r ON true
CROSS JOIN LATERAL (
    SELECT count(*) AS failures, count(*) FILTER (WHERE swap_lock_failed) AS swap_lock_failures FROM fedload.runs
    WHERE feeder = f.feeder AND outcome = ANY($4::text[]) AND started_at > coalesce(s.started_at, '-infinity')
) c
LEFT JOIN fedload.paused p ON p.feeder = f.feeder
ORDER BY f.feeder
"""
_FAILED = [Outcome.FAILED, Outcome.ABANDONED]


@dataclass(frozen=True, slots=True)
class FeederState:
    """What the run history says of one feeder now; timestamps are Unix seconds, None if there is no such run."""

    feeder: str
    last_success_s: float | None
    last_run_s: float | None
    failures: int  # finished runs that failed since the last success (or ever, if it never succeeded)
    swap_lock_failures: int  # of those, runs whose swap never got its locks
    paused_since_s: float | None = None  # `fedload feeder pause`: since when; None when not paused
    data_s: float | None = None  # when the last success's data was true (`fedload.runs.data_at`; before it, start)
    success_age_s: float | None = None  # how long ago the last success started, on the superhub's clock
    success_run_s: float | None = None  # and how long it ran
    displaced_entities: int | None = None  # with superhub.entity_key: its entities shown by another feeder
    displaced_by: dict[str, int] | None = None  # and by which: per other feeder, how many of them it shows


async def read_feeder_states(conn: asyncpg.Connection, feeders: list[str]) -> list[FeederState]:
    """The state of each of `feeders` (with or without history). A superhub without fedload.runs yet (a daemon's
    metrics read it before the daemon's first set-up creates it) has no history: every feeder without runs."""
    try:
        records = await conn.fetch(_QUERY, feeders, Outcome.SUCCESS, Outcome.RUNNING, _FAILED)
    except asyncpg.UndefinedTableError:
        return [FeederState(feeder, None, None, failures=0, swap_lock_failures=0) for feeder in sorted(feeders)]
    return [
        FeederState(
            feeder=r["feeder"],
            last_success_s=r["last_success_s"],
            last_run_s=r["last_run_s"],
            failures=r["failures"],
            swap_lock_failures=r["swap_lock_failures"],
            paused_since_s=r["paused_since_s"],
            data_s=r["data_s"],
            success_age_s=r["success_age_s"],
            success_run_s=r["success_run_s"],
        )
        for r in records
    ]
