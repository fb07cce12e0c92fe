"""The run history (`fedload.runs`): a run's record, started and finished."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, fields
from datetime import datetime

import asyncpg

from fedload.errors import ErrorKind
from fedload.results import Outcome

__all__ = ["RUNS_FOR_PEOPLE", "RunRecord", "count_runs", "finish_run", "last_load", "last_sizes", "start_run"]

RUNS_FOR_PEOPLE = (  # for psql (`fedload demo` shows it): feeder, outcome, rows, seconds of each run
    "SELECT feeder, outcome, (SELECT sum(value::bigint) FROM jsonb_each_text(rows)), "
    "round(extract(epoch FROM finished_at - started_at), 1) FROM fedload.runs ORDER BY feeder"
)


@dataclass(slots=True, kw_only=True)
class RunRecord:
    """What a finished run reports; each field is the `fedload.runs` column of its name."""

    outcome: Outcome = Outcome.FAILED
    error: str | None = None
    raw_bytes: int = 0
    dump_bytes: int = 0
    rows: dict[str, int] | None = None
    swap_lock_ms: float | None = None
    rejected: dict[str, int] | None = None
    swap_attempts: int | None = None
    cancelled_backends: int | None = None  # queries the swap cancelled (swap_on_timeout = "cancel")
    swap_lock_failed: bool = False  # the run failed because the swap never got its locks
    agent_version: str | None = None  # the feeder's agent, as its stream's header says (None without the agent)
    error_kind: ErrorKind | None = None  # what kind of failure `error` is
    unchanged_tables: list[str] | None = None  # tables kept as they were: the feeder's digest was unchanged
    changed_rows_tables: list[str] | None = None  # tables whose changed buckets were applied in place
    # When the feeder's dump's snapshot was taken, as its agent states it (None: it states none). A success's
    # `data_at`, when its data was true, is the earlier of this and the run's start (`_DATA_AT`).
    snapshot_at: datetime | None = None


async def start_run(conn: asyncpg.Connection, feeder: str) -> int:
    """Record a new run (marking runs of this feeder that never finished as abandoned, in the same statement); its
    id."""
    run_id: int = await conn.fetchval(
        "WITH abandoned AS (UPDATE fedload.runs SET outcome = $4, finished_at = now(), "
        "error = 'the run never finished' WHERE feeder = $1 AND outcome = $5) "
        "INSERT INTO fedload.runs (feeder, host, pid) VALUES ($1, $2, $3) RETURNING id",
        feeder,
        socket.gethostname(),
        os.getpid(),
        Outcome.ABANDONED,
        Outcome.RUNNING,
    )
    return run_id


_JSON_COLUMNS = frozenset({"rows", "rejected", "unchanged_tables", "changed_rows_tables"})
_RECORD_COLUMNS = tuple(f.name for f in fields(RunRecord))
_PARAMETERS = {column: f"${i}" for i, column in enumerate(_RECORD_COLUMNS, start=2)}
# A success's data is as old as its snapshot, never younger than the run's start on the superhub's clock: a feeder
# cannot make its data look fresher than that (least() skips a NULL: without a stated snapshot, the start).
_DATA_AT = (
    f"data_at = CASE WHEN {_PARAMETERS['outcome']} = '{Outcome.SUCCESS}' "
    f"THEN least({_PARAMETERS['snapshot_at']}::timestamptz, started_at) END"
)
_FINISH = "UPDATE fedload.runs SET finished_at = now(), {}, {} WHERE id = $1".format(  # noqa: S608 - our columns
    ", ".join(
        f"{column} = {parameter}{'::jsonb' if column in _JSON_COLUMNS else ''}"
        for column, parameter in _PARAMETERS.items()
    ),
    _DATA_AT,
)


async def finish_run(conn: asyncpg.Connection, run_id: int, record: RunRecord) -> None:
    """Record how a run ended: every field of the record into the column of its name."""
    await conn.execute(_FINISH, run_id, *(_column_value(c, getattr(record, c)) for c in _RECORD_COLUMNS))


def _column_value(column: str, value: object) -> object:
    if column in _JSON_COLUMNS and value is not None:
        return json.dumps(value)
    return str(value) if isinstance(value, Outcome | ErrorKind) else value


async def count_runs(conn: asyncpg.Connection, feeder: str) -> int:
    """How many runs of the feeder the history holds."""
    runs: int = await conn.fetchval("SELECT count(*) FROM fedload.runs WHERE feeder = $1", feeder)
    return runs


_LAST_SIZES = """
SELECT DISTINCT ON (feeder) feeder, raw_bytes FROM fedload.runs
WHERE outcome = $2 AND feeder = ANY($1::text[]) AND raw_bytes > 0 ORDER BY feeder, finished_at DESC
"""


async def last_sizes(conn: asyncpg.Connection, feeders: list[str]) -> dict[str, int]:
    """The bytes each of `feeders` sent in its last successful run (none for a feeder that sent none yet)."""
    return {r["feeder"]: r["raw_bytes"] for r in await conn.fetch(_LAST_SIZES, feeders, Outcome.SUCCESS)}


_LAST_LOAD = """
SELECT (SELECT coalesce(sum(value::bigint), 0) FROM jsonb_each_text(rows)) AS rows,
       coalesce(jsonb_array_length(unchanged_tables), 0) AS kept
FROM fedload.runs WHERE feeder = $1 AND outcome = $2 ORDER BY started_at DESC LIMIT 1
"""


async def last_load(conn: asyncpg.Connection, feeder: str) -> tuple[int, int] | None:
    """The rows `feeder`'s last successful run loaded and the tables it kept unchanged (whose rows are not in its
    `rows`); None before its first."""
    row = await conn.fetchrow(_LAST_LOAD, feeder, Outcome.SUCCESS)
    return None if row is None else (row["rows"], row["kept"])
