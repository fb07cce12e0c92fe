"""Run bookkeeping on the superhub (`fedload.runs`), the schemas fedload owns, and the per-feeder run lock."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass, fields

import asyncpg

from fedload.errors import ConfigError, ErrorKind
from fedload.results import RECORDED_OUTCOMES, Outcome
from fedload.superhub.schema import PARTS_SCHEMA, STAGE_SCHEMA

__all__ = [
    "RunRecord",
    "ensure_superhub",
    "finish_run",
    "forget_feeder",
    "forget_rejects",
    "moved_away",
    "note_moved",
    "start_run",
    "try_feeder_lock",
    "unlock_feeder",
]

_LOCK_CLASS = 0x6665646C  # "fedl": the advisory-lock namespace of fedload; the object id is hashtext(feeder)
_OUTCOMES_SQL = ", ".join(f"'{outcome}'" for outcome in RECORDED_OUTCOMES)
_BOOTSTRAP = f"""
SELECT pg_advisory_xact_lock({_LOCK_CLASS}, 0);
CREATE SCHEMA IF NOT EXISTS fedload;
CREATE SCHEMA IF NOT EXISTS {STAGE_SCHEMA};
CREATE SCHEMA IF NOT EXISTS {PARTS_SCHEMA};
CREATE TABLE IF NOT EXISTS fedload.runs (
    id bigserial PRIMARY KEY,
    feeder text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    outcome text NOT NULL DEFAULT '{Outcome.RUNNING}' CHECK (outcome IN ({_OUTCOMES_SQL})),
    error text,
    raw_bytes bigint,
    dump_bytes bigint,
    rows jsonb,
    swap_lock_ms double precision,
    rejected jsonb,
    host text,
    pid integer
);
ALTER TABLE fedload.runs ADD COLUMN IF NOT EXISTS swap_attempts integer,
    ADD COLUMN IF NOT EXISTS cancelled_backends integer,
    ADD COLUMN IF NOT EXISTS swap_lock_failed boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS agent_version text,
    ADD COLUMN IF NOT EXISTS error_kind text;
CREATE INDEX IF NOT EXISTS runs_feeder_started ON fedload.runs (feeder, started_at DESC);
CREATE TABLE IF NOT EXISTS fedload.rejects (
    id bigserial PRIMARY KEY,
    run_id bigint,
    feeder text NOT NULL,
    table_name text NOT NULL,
    sqlstate text,
    error text NOT NULL,
    row_text text,
    rejected_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS rejects_feeder ON fedload.rejects (feeder, run_id);
CREATE TABLE IF NOT EXISTS fedload.schedule (
    feeder text PRIMARY KEY,
    next_run_at timestamptz NOT NULL,
    failures integer NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS fedload.moved (
    feeder text PRIMARY KEY,
    to_shard text NOT NULL,
    moved_at timestamptz NOT NULL DEFAULT now()
);
"""
# The bootstrap's own fingerprint, kept as the comment of fedload.runs: while it matches and fedload's tables and
# schemas exist, a run skips the bootstrap, whose ALTER TABLE would lock fedload.runs (and queue every run behind
# a long report reading it) and whose advisory lock would make parallel runs start one by one.
_SCHEMA_MARK = f"fedload schema {hashlib.sha256(_BOOTSTRAP.encode()).hexdigest()[:16]}"
_BOOTSTRAP += f"COMMENT ON TABLE fedload.runs IS '{_SCHEMA_MARK}';\n"
_IS_CURRENT = f"""
SELECT coalesce(obj_description(to_regclass('fedload.runs'), 'pg_class') = $1, false)
   AND to_regclass('fedload.rejects') IS NOT NULL AND to_regclass('fedload.schedule') IS NOT NULL
   AND to_regclass('fedload.moved') IS NOT NULL
   AND to_regnamespace('{STAGE_SCHEMA}') IS NOT NULL AND to_regnamespace('{PARTS_SCHEMA}') IS NOT NULL
"""


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


async def ensure_superhub(conn: asyncpg.Connection) -> None:
    """Create fedload's schemas and history table if missing or older (safe to race with other processes)."""
    if await conn.fetchval(_IS_CURRENT, _SCHEMA_MARK):
        return
    async with conn.transaction():
        await conn.execute(_BOOTSTRAP)


async def try_feeder_lock(conn: asyncpg.Connection, feeder: str) -> bool:
    """Take the feeder's session advisory lock, held by whoever syncs it (daemon or sync, any host)."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock($1, hashtext($2))", _LOCK_CLASS, feeder))


async def unlock_feeder(conn: asyncpg.Connection, feeder: str) -> None:
    """Release the feeder's advisory lock."""
    await conn.execute("SELECT pg_advisory_unlock($1, hashtext($2))", _LOCK_CLASS, feeder)


async def forget_rejects(conn: asyncpg.Connection, feeder: str, *, except_run: int | None = None) -> None:
    """Delete the rejected rows recorded for the feeder's earlier data (all, or all but `except_run`'s)."""
    await conn.execute(
        "DELETE FROM fedload.rejects WHERE feeder = $1 AND run_id IS DISTINCT FROM $2", feeder, except_run
    )


async def forget_feeder(conn: asyncpg.Connection, feeder: str) -> int:
    """Delete the feeder's run history, schedule and rejected rows (after its removal); the runs deleted."""
    async with conn.transaction():
        await forget_rejects(conn, feeder)
        await conn.execute("DELETE FROM fedload.schedule WHERE feeder = $1", feeder)
        deleted: str = await conn.execute("DELETE FROM fedload.runs WHERE feeder = $1", feeder)
    return int(deleted.rsplit(maxsplit=1)[-1])


async def note_moved(conn: asyncpg.Connection, feeder: str, to_shard: str | None) -> None:
    """Record that the feeder moved away from this superhub to `to_shard` (`fedload feeder move`), so that a run of
    it here, by a daemon whose configuration still names this shard, is refused; None: it may run here again."""
    if to_shard is None:
        await conn.execute("DELETE FROM fedload.moved WHERE feeder = $1", feeder)
        return
    await conn.execute(
        "INSERT INTO fedload.moved (feeder, to_shard) VALUES ($1, $2) "
        "ON CONFLICT (feeder) DO UPDATE SET to_shard = excluded.to_shard, moved_at = now()",
        feeder,
        to_shard,
    )


async def moved_away(conn: asyncpg.Connection, feeder: str) -> ConfigError | None:
    """The error a run of the feeder here gets if it moved away to another shard, else None."""
    moved = await conn.fetchrow("SELECT to_shard, moved_at FROM fedload.moved WHERE feeder = $1", feeder)
    if moved is None:
        return None
    return ConfigError(
        f"feeder {feeder} moved to shard {moved['to_shard']} at {moved['moved_at']:%Y-%m-%d %H:%M:%S %Z} "
        f"(fedload feeder move), but this configuration still names this shard: reload it"
    )


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


_JSON_COLUMNS = frozenset({"rows", "rejected"})
_RECORD_COLUMNS = tuple(f.name for f in fields(RunRecord))
_FINISH = "UPDATE fedload.runs SET finished_at = now(), {} WHERE id = $1".format(  # noqa: S608 - our column names
    ", ".join(
        f"{column} = ${i}{'::jsonb' if column in _JSON_COLUMNS else ''}"
        for i, column in enumerate(_RECORD_COLUMNS, start=2)
    )
)


async def finish_run(conn: asyncpg.Connection, run_id: int, record: RunRecord) -> None:
    """Record how a run ended: every field of the record into the column of its name."""
    await conn.execute(_FINISH, run_id, *(_column_value(c, getattr(record, c)) for c in _RECORD_COLUMNS))


def _column_value(column: str, value: object) -> object:
    if column in _JSON_COLUMNS and value is not None:
        return json.dumps(value)
    return str(value) if isinstance(value, Outcome | ErrorKind) else value
