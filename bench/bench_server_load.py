"""Where the superhub's server spends CPU when loading one feeder: plain COPY vs fedload's staging load.

The same COPY text (one feeder's six CFEngine-like tables, taken with COPY TO STDOUT from a source database) is
loaded into the same cluster in several ways, each in its own transaction on a fresh connection; the CPU is the
loading backend's own (utime + stime of /proc/<pg_backend_pid()>/stat, read by this process before and after),
so the network, the feeder and this process do not count. Best of --repeat.

    uv run --group bench python bench/bench_server_load.py --rows 300000

Ways:
  plain        the limit's load: COPY into tables created beforehand (psql --single-transaction of a pg_dump)
  stage        fedload's staging load: CREATE TABLE in the transaction, the feeder key column with the key as
               default, the key CHECK, COPY ... FREEZE with a column list
  stage+analyze  stage, then ANALYZE of each table (what a run does after the swap)
  analyze      ANALYZE alone, of the tables `stage` loaded
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
from common import (
    DATASET_TABLES,
    SCHEMA_SQL,
    Workspace,
    add_common_arguments,
    dataset_sql,
    machine_line,
    pick_install,
    print_table,
)

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _backend_cpu_s(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


async def _columns(conn: asyncpg.Connection, table: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum",
        f"public.{table}",
    )
    return [r["attname"] for r in rows]


async def _source_data(dsn: str) -> dict[str, bytes]:
    conn = await asyncpg.connect(dsn)
    try:
        data = {}
        for table in DATASET_TABLES:
            buffer = io.BytesIO()
            await conn.copy_from_table(table, schema_name="public", output=buffer)
            data[table] = buffer.getvalue()
        return data
    finally:
        await conn.close()


async def _measured(dsn: str, step: Callable[[asyncpg.Connection], Awaitable[None]]) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        pid = conn.get_server_pid()
        before = _backend_cpu_s(pid)
        await step(conn)
        return _backend_cpu_s(pid) - before
    finally:
        await conn.close()


def _plain(data: dict[str, bytes], columns: dict[str, list[str]]) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    async def step(conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            for table, text in data.items():
                await conn.execute(f"TRUNCATE public.{table}")
                await conn.copy_to_table(table, schema_name="public", source=io.BytesIO(text), columns=columns[table])

    return step


def _stage(
    data: dict[str, bytes], columns: dict[str, list[str]], *, analyze: bool
) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    async def step(conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            for table, text in data.items():
                await conn.execute(f"DROP TABLE IF EXISTS stage.{table}")
                await conn.execute(
                    f"CREATE TABLE stage.{table} (LIKE public.{table} INCLUDING DEFAULTS, "
                    "feeder int NOT NULL DEFAULT 7, CONSTRAINT k CHECK (feeder IS NOT NULL AND feeder = 7))"
                )
                await conn.copy_to_table(
                    table, schema_name="stage", source=io.BytesIO(text), columns=columns[table], freeze=True
                )
        if analyze:
            for table in data:
                await conn.execute(f"ANALYZE stage.{table}")

    return step


def _analyze(data: dict[str, bytes]) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    async def step(conn: asyncpg.Connection) -> None:
        for table in data:
            await conn.execute(f"ANALYZE stage.{table}")

    return step


async def _main(args: argparse.Namespace) -> None:
    with Workspace(pick_install(args.pg_major), keep=args.keep) as workspace:
        cluster = workspace.cluster("hub")
        if args.wal_level != "replica":  # minimal: a table created in the loading transaction writes no WAL
            cluster.psql(f"ALTER SYSTEM SET wal_level = {args.wal_level}")
            cluster.psql("ALTER SYSTEM SET max_wal_senders = 0")
            cluster.halt()
            cluster.resume()
        cluster.psql("CREATE DATABASE source")
        cluster.psql("CREATE DATABASE target")
        sql, total = dataset_sql(args.rows, hub=1)
        cluster.psql(SCHEMA_SQL + sql, "source")
        cluster.psql(SCHEMA_SQL + "CREATE SCHEMA stage;", "target")
        data = await _source_data(cluster.dsn("source"))
        conn = await asyncpg.connect(cluster.dsn("target"))
        columns = {t: await _columns(conn, t) for t in data}
        await conn.close()
        dsn = cluster.dsn("target")
        ways = {
            "plain": _plain(data, columns),
            "stage": _stage(data, columns, analyze=False),
            "stage+analyze": _stage(data, columns, analyze=True),
            "analyze": _analyze(data),
        }
        best = {way: min([await _measured(dsn, step) for _ in range(args.repeat)]) for way, step in ways.items()}
        limit = best["plain"]
        print(machine_line())
        print_table(
            f"server CPU of one load, {total:,} rows in six tables, best of {args.repeat}, wal_level {args.wal_level}",
            ["way", "backend CPU s", "/ plain", "rows/s per core"],
            [[way, f"{s:.2f}", f"{s / limit:.2f}x", f"{total / s:,.0f}" if s else "-"] for way, s in best.items()],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000, help="rows of the feeder (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each way; the best counts")
    parser.add_argument(
        "--wal-level", choices=["replica", "minimal"], default="replica", help="the server's wal_level (replica)"
    )
    add_common_arguments(parser)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
