"""Schema files from pg_dump 15, 17 and 18 with the features those majors have: the parents the superhub gets have
what the feeder's tables have (constraints, enforcement, generated columns, indexes, extensions), the feeder key
aside; what the superhub's PostgreSQL or its extensions cannot hold is refused before anything is created."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import asyncpg
import pytest
import structlog

from fedload.config import parse_config
from fedload.errors import ConfigError
from fedload.localpg import LocalCluster
from fedload.results import Outcome
from fedload.superhub.schema_file import check_schema_file, create_parents_from_file, schema_file_refusals
from tests.support import feature_schema
from tests.support.federation import new_database, psql_bool, psql_int, sync

T = TypeVar("T")


def _database(cluster: LocalCluster, sql: str = "") -> str:
    return new_database(cluster, "sfx", sql)


def _feeder_and_dump(cluster: LocalCluster, tmp: Path) -> tuple[str, Path]:
    """A feeder database with the features of the cluster's major and its rows, and its pg_dump --schema-only."""
    major = cluster.install.major
    feeder = _database(cluster, feature_schema.schema(major) + feature_schema.data(major))
    dump = [cluster.install.tool("pg_dump"), "--schema-only", f"--dbname={cluster.conninfo(feeder)}"]
    path = tmp / f"schema{major}.sql"
    path.write_text(subprocess.run(dump, capture_output=True, check=True, text=True).stdout)
    return feeder, path


def _wanted(schema: str, name: str) -> bool:
    return schema == "public"


async def _run(cluster: LocalCluster, db: str, call: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    conn = await asyncpg.connect(cluster.dsn(db))
    try:
        return await call(conn)
    finally:
        await conn.close()


async def _create(cluster: LocalCluster, db: str, path: Path) -> list[str]:
    return await _run(cluster, db, lambda conn: create_parents_from_file(conn, path, "hub_id", "integer", _wanted))


_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity, a.attgenerated,
       pg_get_expr(d.adbin, d.adrelid), co.collname
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_collation co ON co.oid = a.attcollation AND co.collname <> 'default'
WHERE a.attrelid = 'public.{t}'::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attname <> 'hub_id'
ORDER BY a.attname
"""
_CONSTRAINTS = """
SELECT conname, contype, pg_get_constraintdef(oid), convalidated{enforced} FROM pg_constraint
WHERE conrelid = 'public.{t}'::regclass AND contype <> 'f' AND conname NOT LIKE '%hub_id_not_null' ORDER BY conname
"""
_INDEXES = "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'public.{t}'::regclass ORDER BY 1"
_EXTENSIONS = (
    "SELECT string_agg(extname || ' in ' || extnamespace::regnamespace, ', ' ORDER BY extname) FROM pg_extension"
)


def _without_key(text: str) -> str:
    """A superhub definition with the feeder key fedload adds taken out: `(hub_id, ...`, `hub_id WITH =, `."""
    return text.replace(" ON ONLY ", " ON ").replace("(hub_id, ", "(").replace("hub_id WITH =, ", "")


def _catalog(cluster: LocalCluster, db: str, table: str) -> str:
    enforced = ", conenforced" if cluster.install.major >= 18 else ""
    queries = [_COLUMNS.format(t=table), _CONSTRAINTS.format(t=table, enforced=enforced)]
    return "\n".join(_without_key(cluster.psql(q.replace("{t}", table), dbname=db)) for q in [*queries, _INDEXES])


@pytest.mark.pg_major(15, 17, 18)  # feeder and superhub of that major (on 15, the module's own cluster)
async def test_pg_dump_files_create_parents_like_the_feeders_tables(
    major_cluster: LocalCluster, tmp_path: Path
) -> None:
    """Each parent has its feeder table's columns, identity, generated kinds, defaults, collations, constraints (names,
    validity, enforcement) and indexes (operator classes included), the key aside; the extensions it needs are
    created in their schema; everything else is listed as left out; then a sync loads every row."""
    cluster, major = major_cluster, major_cluster.install.major
    feeder, path = _feeder_and_dump(cluster, tmp_path)
    assert check_schema_file(path, "hub_id") == []
    hub = _database(cluster)
    with structlog.testing.capture_logs() as logs:
        created = await _create(cluster, hub, path)
    assert sorted(created) == sorted(f"public.{t}" for t in feature_schema.tables(major))
    for table in feature_schema.tables(major):
        assert _catalog(cluster, hub, table) == _catalog(cluster, feeder, table), table
    extensions = cluster.psql(_EXTENSIONS, dbname=hub).strip()
    needed = "citext in public, hstore in public, pg_trgm in public, plpgsql in pg_catalog"
    assert extensions == (needed if major < 17 else "btree_gist in public, " + needed)
    if major >= 18:
        enforced = "SELECT conenforced, convalidated FROM pg_constraint WHERE conname = 'invoice_total_positive'"
        assert cluster.psql(enforced, dbname=hub).strip() == "f|f"
    items = next(e["items"] for e in logs if e["event"] == "schema_file.left_out")
    for item in (
        "view public.customer_list",
        "column default view public.customer_list",
        "materialized view public.sales_by_store",
        "index sales_by_store_idx on materialized view public.sales_by_store",
        "function public.touch",
        "trigger payment_touch on public.payment",
        "rule customer_list_insert on public.customer_list",
        "policy customer_by_store on public.customer",
        "foreign key payment_customer_id_fkey on public.payment",
    ):
        assert item in items, (item, items)
    assert any(i.startswith("publication ") for i in items)
    assert any(i.startswith(("grant ", "comment ", "owner ")) for i in items)
    assert ("extension btree_gist" in items) == (major < 17)
    await _sync_and_compare(cluster, feeder, hub, major)


async def _sync_and_compare(cluster: LocalCluster, feeder: str, hub: str, major: int) -> None:
    """A sync loads every row of every table, including those only NOT ENFORCED allows."""
    config = parse_config(
        {
            "superhub": {"dsn": cluster.dsn(hub), "tables": ["public.*"]},
            "feeders": {
                "hub1": {
                    "key": 1,
                    "transport": "local",
                    "database": cluster.conninfo(feeder),
                    "pg_dump": cluster.install.tool("pg_dump"),
                }
            },
        }
    )
    (run,) = await sync(config, "hub1")
    assert run.outcome == Outcome.SUCCESS, run.error
    for table in feature_schema.tables(major):
        columns = cluster.psql(
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
            f"WHERE attrelid = 'public.{table}'::regclass AND attnum > 0 AND NOT attisdropped",
            dbname=feeder,
        ).strip()
        digest = f"SELECT count(*) || ':' || md5(string_agg(ROW({columns})::text, '|' ORDER BY ROW({columns})::text))"
        expected = cluster.psql(f"{digest} FROM public.{table}", dbname=feeder)
        assert cluster.psql(f"{digest} FROM public.{table} WHERE hub_id = 1", dbname=hub) == expected, table
    if major >= 18:
        assert psql_int(cluster, "SELECT count(*) FROM public.invoice WHERE total < 0", hub) == 2


@pytest.mark.pg_major(18)
async def test_clauses_an_older_superhub_lacks_are_refused_before_anything_is_created(
    major_cluster: LocalCluster, cluster: LocalCluster, tmp_path: Path
) -> None:
    """A pg_dump 18 file on a PostgreSQL 15 superhub: one sentence per clause 15 lacks, naming it and its line;
    no table, type or extension is created."""
    _, path = _feeder_and_dump(major_cluster, tmp_path)
    lines = path.read_text().splitlines()
    hub = _database(cluster)
    with pytest.raises(ConfigError) as caught:
        await _create(cluster, hub, path)
    problems = caught.value.problems
    expected = {
        "VIRTUAL generated column total_with_tax": "total_with_tax numeric GENERATED ALWAYS AS",
        "NOT ENFORCED (constraint invoice_total_positive)": "ADD CONSTRAINT invoice_total_positive",
        "named NOT NULL constraint invoice_customer_required": "CONSTRAINT invoice_customer_required NOT NULL",
        "WITHOUT OVERLAPS (constraint invoice_pkey)": "ADD CONSTRAINT invoice_pkey",
        "EXCLUDE on a partitioned table (constraint room_booking_no_overlap)": "room_booking_no_overlap EXCLUDE",
    }
    for clause, text in expected.items():
        problem = next(p for p in problems if clause in p)
        line = int(re.match(r"schema18\.sql:(\d+): ", problem).group(1))  # type: ignore[union-attr]
        assert text in lines[line - 1] or text in lines[line], (problem, lines[line - 1])
        assert "needs PostgreSQL 1" in problem
        assert "the superhub runs PostgreSQL 15" in problem
    assert len(problems) == len(expected)
    created = "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace"
    assert psql_int(cluster, created, hub) == 0
    assert psql_int(cluster, "SELECT count(*) FROM pg_extension", hub) == 1  # plpgsql


async def test_an_extension_the_superhub_lacks_is_named_with_the_table(cluster: LocalCluster, tmp_path: Path) -> None:
    """A table needing an extension the superhub does not have (for a column's type, or its domain's): the refusal
    (check-config --connect, sync) names both; the file alone is fine (the extension may be there); nothing is
    created."""
    path = tmp_path / "schema.sql"
    path.write_text(
        "CREATE EXTENSION IF NOT EXISTS fedload_no_such_extension WITH SCHEMA public;\n"
        "CREATE TABLE public.plain (id integer NOT NULL);\n"
        "CREATE TABLE public.fancy (id integer NOT NULL, shape public.fancy_shape);\n"
        "CREATE DOMAIN public.shape AS public.fancy_shape;\n"
        "CREATE TABLE public.by_domain (s public.shape);\n"
    )
    assert check_schema_file(path, "hub_id") == []
    hub = _database(cluster)
    sentences = [
        f"schema.sql:1: table public.{table} needs extension fedload_no_such_extension, which the superhub does not "
        "have (it is not in pg_available_extensions)"
        for table in ("fancy", "by_domain")
    ]
    refusals = await _run(cluster, hub, lambda conn: schema_file_refusals(conn, path, "hub_id", "integer", _wanted))
    assert refusals == sentences
    with pytest.raises(ConfigError) as caught:
        await _create(cluster, hub, path)
    assert caught.value.problems == sentences
    assert psql_bool(cluster, "SELECT to_regclass('public.plain') IS NULL", hub)
