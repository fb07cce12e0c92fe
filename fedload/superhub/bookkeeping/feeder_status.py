"""`fedload status`'s reading of the bookkeeping: per feeder, its last success and run, failures, swaps, next run,
pause."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from fedload.errors import ErrorKind
from fedload.results import Outcome
from fedload.superhub.bookkeeping.capacity import CapacityReport

__all__ = ["FeederStatus", "read_feeder_statuses"]

# $2 is success, $3 running
_QUERY = """
WITH feeders AS (
    SELECT unnest($1::text[]) AS feeder
    UNION SELECT feeder FROM fedload.runs
    UNION SELECT feeder FROM fedload.schedule
    UNION SELECT feeder FROM fedload.paused
), last_success AS (
    SELECT DISTINCT ON (feeder) feeder, finished_at, rows, extract(epoch FROM finished_at - started_at) AS seconds,
           jsonb_array_length(unchanged_tables) AS unchanged, jsonb_array_length(changed_rows_tables) AS changed,
           coalesce(data_at, started_at) AS data_at
    FROM fedload.runs WHERE outcome = $2 ORDER BY feeder, finished_at DESC
), last_run AS (
    SELECT DISTINCT ON (feeder) feeder, outcome, error, error_kind FROM fedload.runs WHERE outcome <> $3
    ORDER BY feeder, started_at DESC
), last_swap AS (
    SELECT DISTINCT ON (feeder) feeder, swap_lock_ms, swap_attempts, cancelled_backends FROM fedload.runs
    WHERE swap_attempts IS NOT NULL ORDER BY feeder, started_at DESC
)
SELECT f.feeder, s.finished_at AS last_success, extract(epoch FROM now() - s.data_at) AS data_age_s, s.data_at,
       s.rows, s.unchanged, s.changed, s.seconds AS duration_s, r.outcome AS last_outcome, r.error AS last_error,
       r.error_kind AS last_error_kind,
       sc.next_run_at AS next_run, coalesce(sc.failures, 0) AS failures, f.feeder = ANY($1::text[]) AS configured,
       EXISTS (SELECT FROM fedload.runs x WHERE x.feeder = f.feeder AND x.outcome = $3) AS running,
       w.swap_lock_ms AS swap_wait_ms, w.swap_attempts, w.cancelled_backends,
       (SELECT count(*) FROM fedload.runs x WHERE x.feeder = f.feeder AND x.swap_lock_failed AND x.id > coalesce(
           (SELECT max(y.id) FROM fedload.runs y WHERE y.feeder = f.feeder AND y.outcome = $2), 0)
       ) AS swap_lock_failures,
       p.feeder IS NOT NULL AS paused, p.reason AS paused_reason, p.paused_at AS paused_since, p.paused_by
FROM feeders f
LEFT JOIN last_success s USING (feeder)
LEFT JOIN last_run r USING (feeder)
LEFT JOIN last_swap w USING (feeder)
LEFT JOIN fedload.schedule sc USING (feeder)
LEFT JOIN fedload.paused p USING (feeder)
ORDER BY f.feeder
"""


@dataclass(frozen=True, slots=True)
class FeederStatus:
    """What the superhub knows about one feeder; `last_outcome`/`last_error` are of its last finished run."""

    feeder: str
    last_success: datetime | None
    data_age_s: float | None
    rows: int | None
    duration_s: float | None
    last_outcome: Outcome | None
    last_error: str | None
    last_error_kind: ErrorKind | None
    next_run: datetime | None
    failures: int
    configured: bool
    running: bool
    stale: bool
    swap_wait_ms: float | None = None  # the last swap's wait for its locks
    swap_attempts: int | None = None  # and the tries it took
    cancelled_backends: int | None = None  # and the queries it cancelled
    swap_lock_failures: int = 0  # runs since the last success that failed for want of locks
    shard: str | None = None  # with [shards]: the shard whose history this is (the feeder's, if configured)
    also_on: tuple[str, ...] = ()  # with [shards]: the other shards that hold history of it too (`fedload status`)
    paused: bool = False  # `fedload feeder pause`: the daemon and a sync without names skip it
    paused_reason: str | None = None
    paused_since: datetime | None = None
    paused_by: str | None = None  # user@host of the `feeder pause`
    # When the last success's data was true: its feeder's snapshot, at most its start (`data_age_s` is measured
    # from it); the start of a success recorded before fedload kept it.
    data_at: datetime | None = None
    unchanged_tables: int = 0  # of the last success's tables, those kept unchanged (their digest was)
    changed_rows_tables: int = 0  # and those changed in place by their changed rows only
    displaced_entities: int | None = None  # with superhub.entity_key: its entities shown by another feeder
    displaced_by: dict[str, int] | None = None  # and by which: per other feeder, how many of them it shows
    freshness_target_s: float | None = None  # its freshness target, from the configuration (docs/freshness.md)
    capacity: CapacityReport | None = None  # with a target: the daemon's last verdict on its lanes

    @property
    def behind_target(self) -> bool:
        """Its data is older than its freshness target (never loaded counts)."""
        target = self.freshness_target_s
        return target is not None and (self.data_age_s is None or self.data_age_s > target)

    @property
    def overdue(self) -> bool:
        """Stale, configured and not paused: what makes `fedload status` exit 1 (a paused feeder's data is old on
        purpose)."""
        return self.stale and self.configured and not self.paused

    @property
    def swaps_starved(self) -> bool:
        """Swaps keep failing for locks: at least two runs in a row since the last success."""
        return self.swap_lock_failures >= _STARVED_AFTER


_STARVED_AFTER = 2


async def read_feeder_statuses(
    conn: asyncpg.Connection, names: list[str], *, stale_after_s: float, shard: str | None = None
) -> list[FeederStatus]:
    """The status of each of the configured feeders `names` and of every other feeder the bookkeeping knows, by
    name; stale when its data is older than `stale_after_s`; `shard`: the shard whose bookkeeping `conn` reads."""
    records = await conn.fetch(_QUERY, names, Outcome.SUCCESS, Outcome.RUNNING)
    return [_status(r, stale_after_s, shard) for r in records]


def _status(r: asyncpg.Record, stale_after_s: float, shard: str | None) -> FeederStatus:
    data_age_s = None if r["data_age_s"] is None else float(r["data_age_s"])
    return FeederStatus(
        feeder=r["feeder"],
        last_success=r["last_success"],
        data_age_s=data_age_s,
        rows=None if r["rows"] is None else sum(json.loads(r["rows"]).values()),
        duration_s=None if r["duration_s"] is None else float(r["duration_s"]),
        last_outcome=None if r["last_outcome"] is None else Outcome(r["last_outcome"]),
        last_error=r["last_error"],
        last_error_kind=None if r["last_error_kind"] is None else ErrorKind(r["last_error_kind"]),
        next_run=r["next_run"],
        failures=r["failures"],
        configured=r["configured"],
        running=r["running"],
        stale=data_age_s is None or data_age_s > stale_after_s,
        swap_wait_ms=r["swap_wait_ms"],
        swap_attempts=r["swap_attempts"],
        cancelled_backends=r["cancelled_backends"],
        swap_lock_failures=r["swap_lock_failures"],
        unchanged_tables=r["unchanged"] or 0,
        changed_rows_tables=r["changed"] or 0,
        shard=shard,
        paused=r["paused"],
        paused_reason=r["paused_reason"],
        paused_since=r["paused_since"],
        paused_by=r["paused_by"],
        data_at=r["data_at"],
    )
