"""Swap a feeder's staging tables in as its partitions, all tables at once, inside the load's transaction.

Per table: DETACH and DROP the old partition, ATTACH the staging table (its CHECK constraint and prebuilt indexes
make ATTACH cheap), move it to `fedload_parts` under the partition's stable name. DETACH takes ACCESS EXCLUSIVE
on the parent until COMMIT, so the swap runs last, under a short `lock_timeout` inside a savepoint, and is retried:
a long report holding the parent delays the swap, never the other way round for long.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
import time
from collections.abc import Iterable

import asyncpg

from fedload.errors import SuperhubError
from fedload.importer import StagedTable
from fedload.log import get_logger
from fedload.schema import PARTS_SCHEMA, ident, key_literal, qualified

__all__ = ["analyze_partitions", "describe_swap", "drop_partitions", "partition_name", "swap_in"]

_MAX_IDENTIFIER_BYTES = 63
_MAY_ALTER = "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = $1::regclass"
log = get_logger()


def partition_name(table: str, feeder: str) -> str:
    """The stable name of a feeder's partition of `table`: `<table>__<feeder>`, shortened with a hash if long."""
    name = f"{table}__{feeder}"
    if len(name.encode()) <= _MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{table.encode()[:40].decode(errors='ignore')}__{feeder[:12]}_{digest}"


async def swap_in(
    conn: asyncpg.Connection,
    staged: Iterable[StagedTable],
    *,
    feeder: str,
    key: int | str,
    lock_timeout_s: float = 0.5,
    max_wait_s: float = 300.0,
) -> None:
    """Replace the feeder's partitions by the staging tables (caller commits); SuperhubError if locks never come.

    All parents are locked first, in one statement and one order. A reader holding one parent while waiting for
    another could still deadlock with the swap; `lock_timeout_s` below the server's deadlock_timeout (1 s by
    default) makes the swap, not the reader, give up: it rolls back to its savepoint and tries again.
    """
    tables = sorted(staged, key=lambda s: s.parent.qualified_name)
    parents = ", ".join(t.parent.sql_name for t in tables)
    deadline = time.monotonic() + max_wait_s
    for attempt in itertools.count(1):
        try:
            async with conn.transaction():  # a savepoint: a lock timeout undoes the swap, not the load
                await conn.execute(f"SET LOCAL lock_timeout = '{int(lock_timeout_s * 1000)}ms'")
                await conn.execute(f"LOCK TABLE {parents} IN ACCESS EXCLUSIVE MODE")
                for table in tables:
                    await _swap_table(conn, table, feeder, key)
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError):
            log.info("swap.lock_busy", feeder=feeder, attempt=attempt)
            if time.monotonic() > deadline:
                raise SuperhubError(
                    f"could not lock the parent tables of feeder {feeder} for the swap within {max_wait_s:g} s"
                ) from None
            await asyncio.sleep(random.uniform(0.05, min(0.05 * attempt, 1.0)))  # noqa: S311 - jitter only
        else:
            return


async def _swap_table(conn: asyncpg.Connection, table: StagedTable, feeder: str, key: int | str) -> None:
    started = time.monotonic()
    parent = table.parent.sql_name
    name = partition_name(table.parent.name, feeder)
    old = qualified(PARTS_SCHEMA, name)
    if await conn.fetchval("SELECT to_regclass($1)", old) is not None:
        await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {old}")
        await conn.execute(f"DROP TABLE {old}")
    await conn.execute(f"ALTER TABLE {parent} ATTACH PARTITION {table.stage_sql} FOR VALUES IN ({key_literal(key)})")
    await conn.execute(f"ALTER TABLE {table.stage_sql} SET SCHEMA {ident(PARTS_SCHEMA)}")
    await conn.execute(f"ALTER TABLE {qualified(PARTS_SCHEMA, table.stage_name)} RENAME TO {ident(name)}")
    log.debug("swap.table", table=table.parent.qualified_name, ms=round((time.monotonic() - started) * 1000, 1))


async def analyze_partitions(conn: asyncpg.Connection, parents: Iterable[str], feeder: str) -> None:
    """ANALYZE the feeder's partitions of the named parent tables (`schema.name`), after their swap committed:
    readers are not blocked by it, and a failure only costs planner statistics until autovacuum runs."""
    for parent in sorted(parents):
        table = qualified(PARTS_SCHEMA, partition_name(parent.split(".", 1)[1], feeder))
        try:
            await conn.execute(f"ANALYZE {table}")
        except asyncpg.PostgresError as exc:
            log.warning("swap.analyze_failed", feeder=feeder, table=parent, error=str(exc))


async def describe_swap(conn: asyncpg.Connection, staged: Iterable[StagedTable], *, feeder: str) -> list[str]:
    """What `swap_in` would do, one line per table, after checking it may; SuperhubError if it may not."""
    lines = []
    for table in sorted(staged, key=lambda s: s.parent.qualified_name):
        parent = table.parent
        if not await conn.fetchval(_MAY_ALTER, parent.sql_name):
            raise SuperhubError(f"the superhub user does not own {parent.qualified_name}, so it cannot swap partitions")
        old = qualified(PARTS_SCHEMA, partition_name(parent.name, feeder))
        if await conn.fetchval("SELECT to_regclass($1)", old) is None:
            line = f"{parent.qualified_name}: attach a new partition of {table.rows:,} rows"
        else:
            current = await conn.fetchval(f"SELECT count(*) FROM {old}")  # noqa: S608 - quoted name
            line = f"{parent.qualified_name}: replace {current:,} rows by {table.rows:,}"
        if table.dropped_columns:
            line += f" (feeder columns dropped: {', '.join(table.dropped_columns)})"
        lines.append(line)
    return lines


async def drop_partitions(conn: asyncpg.Connection, parents: Iterable[str], feeder: str) -> list[str]:
    """Detach and drop the feeder's partitions of the named parents (`schema.name`); the ones dropped."""
    dropped = []
    async with conn.transaction():
        for parent in sorted(parents):
            schema, table = parent.split(".", 1)
            old = qualified(PARTS_SCHEMA, partition_name(table, feeder))
            if await conn.fetchval("SELECT to_regclass($1)", old) is not None:
                await conn.execute(f"ALTER TABLE {qualified(schema, table)} DETACH PARTITION {old}")
                await conn.execute(f"DROP TABLE {old}")
                dropped.append(parent)
    return dropped
