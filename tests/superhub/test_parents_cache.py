"""The parents' definitions are read once per schema state: swaps keep the cache, every DDL that changes a
definition makes the next run read the catalog again, and a failed run forgets it."""

from __future__ import annotations

import asyncpg

from fedload.names import TablePattern
from fedload.results import Outcome
from fedload.superhub import parents_cache
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import sync_feeder
from fedload.superhub.schema import read_parents
from tests.support.federation import Federation, sync

PATTERNS = [TablePattern("public.*")]
# Each changes what read_parents returns (or its set of parents); applied in this order.
DDL = [
    "ALTER TABLE hosts ADD COLUMN extra text",
    "ALTER TABLE hosts ALTER COLUMN extra SET DEFAULT 'x'",
    "ALTER TABLE contexts ALTER COLUMN score TYPE bigint",
    "CREATE INDEX hosts_name ON hosts (name)",
    "ALTER INDEX hosts_name RENAME TO hosts_name2",
    "ALTER TABLE contexts ADD CONSTRAINT score_positive CHECK (score > -1)",
    "ALTER TABLE contexts RENAME CONSTRAINT score_positive TO score_not_negative",
    "CREATE TYPE mood AS ENUM ('a'); ALTER TABLE contexts ADD COLUMN mood mood",
    "ALTER TYPE mood RENAME TO mood2",
    "CREATE SCHEMA other; ALTER TYPE mood2 SET SCHEMA other",
    "ALTER SCHEMA other RENAME TO other2",
    'ALTER TABLE hosts ALTER COLUMN name SET DATA TYPE text COLLATE "C"',
    "ALTER TABLE hosts DROP COLUMN extra",
    "CREATE TABLE public.more (hub_id integer NOT NULL, x integer) PARTITION BY LIST (hub_id)",
    "ALTER TABLE more RENAME TO more2",
    "ALTER TABLE more2 RENAME COLUMN x TO y",
]


async def _fingerprint(dsn: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        fingerprint: str = await conn.fetchval(parents_cache.FINGERPRINT)
        return fingerprint
    finally:
        await conn.close()


async def _cached_and_read(dsn: str) -> tuple[object, object]:
    """What the cache gives, and what a fresh read of the catalog gives."""
    conn = await asyncpg.connect(dsn)
    try:
        cached = await parents_cache.cached_parents(conn, dsn, PATTERNS, "hub_id")
        return cached, await read_parents(conn, PATTERNS, "hub_id")
    finally:
        await conn.close()


async def test_swaps_keep_the_fingerprint_and_each_definition_change_moves_it(federation: Federation) -> None:
    """Syncs (new partitions, swapped partitions) leave the catalog's fingerprint as it was; each DDL that changes
    a parent's definition (columns, types, defaults, collations, indexes, constraints, names, a new parent)
    changes it, and the cache then gives exactly what the catalog says."""
    dsn = federation.cluster.dsn(federation.superhub)
    await sync(federation.config(), "hub1")
    before = await _fingerprint(dsn)
    await sync(federation.config(), "hub1", "hub2")
    assert (await _fingerprint(dsn)) == before
    cached, read = await _cached_and_read(dsn)
    assert cached == read
    for ddl in DDL:
        federation.superhub_sql(ddl)
        after = await _fingerprint(dsn)
        assert after != before, ddl
        cached, read = await _cached_and_read(dsn)
        assert cached == read, ddl
        before = after


async def test_a_failed_run_forgets_the_cached_parents(federation: Federation) -> None:
    """A run that fails, whatever the reason, empties the cache, so the next run reads the catalog: a name the
    fingerprint does not cover (a function in an index expression) cannot keep failing runs."""
    await sync(federation.config(), "hub1")
    await _cached_and_read(federation.cluster.dsn(federation.superhub))
    assert parents_cache._cache
    run = await sync_feeder(feeder_job(federation.config(agent_command=["false"]), "hub1"))  # in this process
    assert run.outcome == Outcome.FAILED
    assert not parents_cache._cache
