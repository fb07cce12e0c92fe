"""fedload's schemas and tables on a superhub, created or brought up to date by one bootstrap."""

from __future__ import annotations

import hashlib

import asyncpg

from fedload.results import RECORDED_OUTCOMES, Outcome
from fedload.superhub.bookkeeping.locks import LOCK_CLASS
from fedload.superhub.schema import PARTS_SCHEMA, STAGE_SCHEMA

__all__ = ["ensure_superhub", "has_history"]

_OUTCOMES_SQL = ", ".join(f"'{outcome}'" for outcome in RECORDED_OUTCOMES)
_BOOTSTRAP = f"""
SELECT pg_advisory_xact_lock({LOCK_CLASS}, 0);
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
    ADD COLUMN IF NOT EXISTS error_kind text,
    ADD COLUMN IF NOT EXISTS unchanged_tables jsonb,
    ADD COLUMN IF NOT EXISTS changed_rows_tables jsonb;
CREATE INDEX IF NOT EXISTS runs_feeder_started ON fedload.runs (feeder, started_at DESC);
-- When a run's data was true (docs/freshness.md): the feeder's snapshot as stated, and a success's data time.
ALTER TABLE fedload.runs ADD COLUMN IF NOT EXISTS snapshot_at timestamptz, ADD COLUMN IF NOT EXISTS data_at timestamptz;
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
CREATE TABLE IF NOT EXISTS fedload.digests (
    feeder text NOT NULL,
    table_schema text NOT NULL,
    table_name text NOT NULL,
    digest text NOT NULL,
    rows bigint NOT NULL,
    fingerprint text NOT NULL,
    counters text NOT NULL DEFAULT '',
    run_id bigint,
    PRIMARY KEY (feeder, table_schema, table_name)
);
-- A table's delta state (fedload/feeder/delta.py) as JSON text: '' none.
ALTER TABLE fedload.digests ADD COLUMN IF NOT EXISTS delta text NOT NULL DEFAULT '';
-- The daemon's verdict on the freshness targets (docs/freshness.md): one row.
CREATE TABLE IF NOT EXISTS fedload.capacity (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    reachable boolean NOT NULL,
    round_s double precision NOT NULL,
    lanes integer NOT NULL,
    lanes_needed integer,
    cores integer NOT NULL,
    smallest_target_s double precision NOT NULL,
    behind jsonb NOT NULL DEFAULT '[]',
    too_long jsonb NOT NULL DEFAULT '[]',
    reported_by text,
    reported_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS fedload.paused (
    feeder text PRIMARY KEY,
    reason text,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text
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
   AND to_regclass('fedload.moved') IS NOT NULL AND to_regclass('fedload.paused') IS NOT NULL
   AND to_regclass('fedload.digests') IS NOT NULL AND to_regclass('fedload.capacity') IS NOT NULL
   AND to_regnamespace('{STAGE_SCHEMA}') IS NOT NULL AND to_regnamespace('{PARTS_SCHEMA}') IS NOT NULL
"""


async def ensure_superhub(conn: asyncpg.Connection) -> None:
    """Create fedload's schemas and history table if missing or older (safe to race with other processes)."""
    if await conn.fetchval(_IS_CURRENT, _SCHEMA_MARK):
        return
    async with conn.transaction():
        await conn.execute(_BOOTSTRAP)


async def has_history(conn: asyncpg.Connection) -> bool:
    """Whether the superhub has fedload's run history (`fedload.runs`), without creating it."""
    return await conn.fetchval("SELECT to_regclass('fedload.runs')") is not None
