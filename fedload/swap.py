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
from fedload.names import TableName
from fedload.schema import PARTS_SCHEMA, ident, key_literal, qualified

__all__ = ["analyze_partitions", "describe_swap", "drop_partitions", "feeder_partition", "partition_name", "swap_in"]

_MAX_IDENTIFIER_BYTES = 63
_MAY_ALTER = "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = $1::regclass"
log = get_logger()


def partition_name(table: TableName, feeder: str) -> str:
    """The stable name of a feeder's partition of `table`: `<schema>.<table>__<feeder>`, hashed if long."""
    return _shortened(f"{table.schema}.{table.name}__{feeder}")


def _legacy_partition_name(table: str, feeder: str) -> str:
    """The name fedload 0.1 gave partitions (without the schema): still found, and renamed at the next swap."""
    return _shortened(f"{table}__{feeder}", keep=40)


def _shortened(name: str, keep: int = 44) -> str:
    if len(name.encode()) <= _MAX_IDENTIFIER_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    head, _, feeder = name.rpartition("__")
    return f"{head.encode()[:keep].decode(errors='ignore')}__{feeder[:8]}_{digest}"


_FEEDER_PARTITION = """
SELECT c.oid::regclass::text
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass
  AND (pg_get_expr(c.relpartbound, c.oid) = ANY($2::text[]) OR c.oid = ANY(
       SELECT to_regclass(n) FROM unnest($3::text[]) AS n))
ORDER BY pg_get_expr(c.relpartbound, c.oid) = ANY($2::text[]) DESC
LIMIT 1
"""


async def feeder_partition(
    conn: asyncpg.Connection, parent: TableName, feeder: str, key: int | str | None
) -> str | None:
    """The feeder's current partition of `parent` (SQL name), found by its bound (the feeder's key) or by the
    names fedload gives partitions; None if it has none."""
    bounds = [f"FOR VALUES IN ({literal})" for literal in _key_literals(key)]
    names = [
        qualified(PARTS_SCHEMA, partition_name(parent, feeder)),
        qualified(PARTS_SCHEMA, _legacy_partition_name(parent.name, feeder)),
    ]
    found: str | None = await conn.fetchval(_FEEDER_PARTITION, parent.sql, bounds, names)
    return found


def _key_literals(key: int | str | None) -> set[str]:
    """The key as PostgreSQL prints it in a partition bound: 1 for an integer column, '1' for a text one."""
    if key is None:
        return set()
    literals = {key_literal(str(key))}
    if isinstance(key, int) or key.lstrip("-").isdigit():
        literals.add(str(int(key)))
    return literals


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
    parent = table.parent
    old = await feeder_partition(conn, parent.table, feeder, key)
    if old is not None:
        await conn.execute(f"ALTER TABLE {parent.sql_name} DETACH PARTITION {old}")
        await conn.execute(f"DROP TABLE {old}")
    await conn.execute(
        f"ALTER TABLE {parent.sql_name} ATTACH PARTITION {table.stage_sql} FOR VALUES IN ({key_literal(key)})"
    )
    await conn.execute(f"ALTER TABLE {table.stage_sql} SET SCHEMA {ident(PARTS_SCHEMA)}")
    name = await _free_partition_name(conn, parent.table, feeder)
    await conn.execute(f"ALTER TABLE {qualified(PARTS_SCHEMA, table.stage_name)} RENAME TO {ident(name)}")
    log.debug("swap.table", table=parent.qualified_name, ms=round((time.monotonic() - started) * 1000, 1))


async def _free_partition_name(conn: asyncpg.Connection, parent: TableName, feeder: str) -> str:
    """The partition's stable name, or, if another table has taken it, that name with a hash of the parent."""
    name = partition_name(parent, feeder)
    if await conn.fetchval("SELECT to_regclass($1)", qualified(PARTS_SCHEMA, name)) is None:
        return name
    digest = hashlib.sha256(f"{parent.schema}\0{parent.name}".encode()).hexdigest()[:8]
    return _shortened(f"{parent.schema}.{parent.name}_{digest}__{feeder}")


async def analyze_partitions(
    conn: asyncpg.Connection, parents: Iterable[TableName], feeder: str, key: int | str
) -> None:
    """ANALYZE the feeder's partitions of the parent tables, after their swap committed: readers are not
    blocked by it, and a failure only costs planner statistics until autovacuum runs."""
    for parent in sorted(parents):
        try:
            table = await feeder_partition(conn, parent, feeder, key)
            if table is not None:
                await conn.execute(f"ANALYZE {table}")
        except asyncpg.PostgresError as exc:
            log.warning("swap.analyze_failed", feeder=feeder, table=str(parent), error=str(exc))


async def describe_swap(
    conn: asyncpg.Connection, staged: Iterable[StagedTable], *, feeder: str, key: int | str
) -> list[str]:
    """What `swap_in` would do, one line per table, after checking it may; SuperhubError if it may not."""
    lines = []
    for table in sorted(staged, key=lambda s: s.parent.qualified_name):
        parent = table.parent
        if not await conn.fetchval(_MAY_ALTER, parent.sql_name):
            raise SuperhubError(f"the superhub user does not own {parent.qualified_name}, so it cannot swap partitions")
        old = await feeder_partition(conn, parent.table, feeder, key)
        if old is None:
            line = f"{parent.qualified_name}: attach a new partition of {table.rows:,} rows"
        else:
            current = await conn.fetchval(f"SELECT count(*) FROM {old}")  # noqa: S608 - quoted name
            line = f"{parent.qualified_name}: replace {current:,} rows by {table.rows:,}"
        if table.dropped_columns:
            line += f" (feeder columns dropped: {', '.join(table.dropped_columns)})"
        lines.append(line)
    return lines


async def drop_partitions(
    conn: asyncpg.Connection, parents: Iterable[TableName], feeder: str, key: int | str | None
) -> dict[TableName, int]:
    """Detach and drop the feeder's partitions of the parents; the ones dropped, with the rows they held."""
    dropped = {}
    async with conn.transaction():
        for parent in sorted(parents):
            old = await feeder_partition(conn, parent, feeder, key)
            if old is not None:
                dropped[parent] = await conn.fetchval(f"SELECT count(*) FROM {old}")  # noqa: S608 - catalog name
                await conn.execute(f"ALTER TABLE {parent.sql} DETACH PARTITION {old}")
                await conn.execute(f"DROP TABLE {old}")
    return dropped
