"""`fedload status`: per feeder, the last success, the age of its data, rows, duration, last error, next run."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from datetime import datetime

import asyncpg
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fedload.commands.output import print_table
from fedload.config import Config, ConfigLocation
from fedload.english import counted
from fedload.errors import ErrorKind, FedloadError
from fedload.log import get_logger
from fedload.results import Outcome
from fedload.superhub.job import superhub_target
from fedload.superhub.runs import ensure_superhub
from fedload.superhub.session import SuperhubTarget, superhub_session

__all__ = ["FeederStatus", "read_status", "run_status"]

log = get_logger()

# $2 is success, $3 running
_QUERY = """
WITH feeders AS (
    SELECT unnest($1::text[]) AS feeder
    UNION SELECT feeder FROM fedload.runs
    UNION SELECT feeder FROM fedload.schedule
), last_success AS (
    SELECT DISTINCT ON (feeder) feeder, finished_at, rows, extract(epoch FROM finished_at - started_at) AS seconds
    FROM fedload.runs WHERE outcome = $2 ORDER BY feeder, finished_at DESC
), last_run AS (
    SELECT DISTINCT ON (feeder) feeder, outcome, error, error_kind FROM fedload.runs WHERE outcome <> $3
    ORDER BY feeder, started_at DESC
), last_swap AS (
    SELECT DISTINCT ON (feeder) feeder, swap_lock_ms, swap_attempts, cancelled_backends FROM fedload.runs
    WHERE swap_attempts IS NOT NULL ORDER BY feeder, started_at DESC
)
SELECT f.feeder, s.finished_at AS last_success, extract(epoch FROM now() - s.finished_at) AS data_age_s,
       s.rows, s.seconds AS duration_s, r.outcome AS last_outcome, r.error AS last_error,
       r.error_kind AS last_error_kind,
       sc.next_run_at AS next_run, coalesce(sc.failures, 0) AS failures, f.feeder = ANY($1::text[]) AS configured,
       EXISTS (SELECT FROM fedload.runs x WHERE x.feeder = f.feeder AND x.outcome = $3) AS running,
       w.swap_lock_ms AS swap_wait_ms, w.swap_attempts, w.cancelled_backends,
       (SELECT count(*) FROM fedload.runs x WHERE x.feeder = f.feeder AND x.swap_lock_failed AND x.id > coalesce(
           (SELECT max(y.id) FROM fedload.runs y WHERE y.feeder = f.feeder AND y.outcome = $2), 0)
       ) AS swap_lock_failures
FROM feeders f
LEFT JOIN last_success s USING (feeder)
LEFT JOIN last_run r USING (feeder)
LEFT JOIN last_swap w USING (feeder)
LEFT JOIN fedload.schedule sc USING (feeder)
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

    @property
    def swaps_starved(self) -> bool:
        """Swaps keep failing for locks: at least two runs in a row since the last success."""
        return self.swap_lock_failures >= _STARVED_AFTER


_STARVED_AFTER = 2


async def read_status(config: Config) -> list[FeederStatus]:
    """The status of every feeder that is configured or has history; with shards, read from each shard's history
    (a feeder is configured on its own shard only)."""
    stale_after_s = config.superhub.stale_after_s
    if not config.shards:
        return await _read_status(superhub_target(config), list(config.feeders), None, stale_after_s)
    statuses = []
    for shard in config.shards:
        names = config.by_shard().get(shard, [])
        try:
            statuses += await _read_status(superhub_target(config, shard), names, shard, stale_after_s)
        except FedloadError as exc:  # the other shards' feeders are still shown; this one's say why they are not
            log.warning("status.shard_unreachable", shard=shard, error=str(exc))
            statuses += [_unreachable(name, shard, exc) for name in names]
    return sorted(statuses, key=lambda s: (s.feeder, not s.configured))


def _unreachable(feeder: str, shard: str, exc: FedloadError) -> FeederStatus:
    """A configured feeder whose shard cannot be read: nothing known of it, so it counts as stale."""
    return FeederStatus(
        feeder=feeder,
        last_success=None,
        data_age_s=None,
        rows=None,
        duration_s=None,
        last_outcome=None,
        last_error=f"shard {shard} cannot be reached: {exc}",
        last_error_kind=ErrorKind.SUPERHUB,
        next_run=None,
        failures=0,
        configured=True,
        running=False,
        stale=True,
        shard=shard,
    )


async def _read_status(
    superhub: SuperhubTarget, names: list[str], shard: str | None, stale_after_s: float
) -> list[FeederStatus]:
    async with superhub_session(superhub) as conn:
        await ensure_superhub(conn)
        records = await conn.fetch(_QUERY, names, Outcome.SUCCESS, Outcome.RUNNING)
    return [_status(r, stale_after_s, shard) for r in records]


def _status(r: asyncpg.Record, stale_after_s: float, shard: str | None = None) -> FeederStatus:
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
        shard=shard,
    )


def _table(statuses: list[FeederStatus], location: ConfigLocation) -> Table:
    table = Table(title=f"fedload status, configuration {location}")
    sharded = any(s.shard is not None for s in statuses)
    for column in (
        *("feeder", *(["shard"] if sharded else []), "last success", "data age", "rows", "seconds"),
        *("last run", "next run", "last swap", "error kind", "last error"),
    ):
        table.add_column(column, justify="right" if column in ("data age", "rows", "seconds") else "left")
    for s in statuses:
        age = "never" if s.data_age_s is None else f"{s.data_age_s / 60:.1f} min"
        table.add_row(
            s.feeder + ("" if s.configured else " (not configured)"),
            *([s.shard or "-"] if sharded else []),
            s.last_success.strftime("%Y-%m-%d %H:%M:%S") if s.last_success else "-",
            Text(f"{age} STALE", style="red") if s.stale else age,
            f"{s.rows:,}" if s.rows is not None else "-",
            f"{s.duration_s:.1f}" if s.duration_s is not None else "-",
            Text(_last_run(s)),
            s.next_run.strftime("%H:%M:%S") if s.next_run else "-",
            _last_swap(s),
            s.last_error_kind or "",
            Text(s.last_error or ""),
        )
    return table


def _last_swap(s: FeederStatus) -> Text:
    """The last swap's wait and tries, and a red flag when swaps keep failing for locks."""
    parts = []
    if s.swap_attempts is not None:
        parts.append(f"waited {(s.swap_wait_ms or 0) / 1000:.1f} s, {counted(s.swap_attempts, 'try', 'tries')}")
    if s.cancelled_backends:
        parts.append(f"{counted(s.cancelled_backends, 'query', 'queries')} cancelled")
    if s.swaps_starved:
        flag = f"FAILING FOR LOCKS ({counted(s.swap_lock_failures or 0, 'run')} in a row)"
        return Text(", ".join([*parts, flag]), style="red")
    return Text(", ".join(parts) or "-")


def _last_run(s: FeederStatus) -> str:
    failures = f" ({s.failures} failures)" if s.failures else ""
    return (s.last_outcome or "-") + failures + (" [running]" if s.running else "")


def run_status(config: Config, *, as_json: bool, location: ConfigLocation) -> int:
    """Print the status, headed by the configuration file read (`location`; in JSON, each feeder's
    "configuration"); 1 if some configured feeder is stale, else 0."""
    statuses = asyncio.run(read_status(config))
    if as_json:
        read = {"configuration": str(location.whole_path)}
        print(json.dumps([asdict(s) | read for s in statuses], default=str))
    else:
        print_table(_table(statuses, location), Console())
    return 1 if any(s.stale and s.configured for s in statuses) else 0
