"""The schema file: a feeder's real `pg_dump --schema-only` output (PostgreSQL 15, 17, 18) creates working parents."""

from __future__ import annotations

import subprocess
from pathlib import Path

import asyncpg
import pytest
import structlog

from fedload.errors import ConfigError
from fedload.localpg import LocalCluster, PgInstall
from fedload.names import TablePattern
from fedload.superhub.schema import ParentsSpec
from fedload.superhub.schema_file import check_schema_file, create_parents_from_file
from fedload.superhub.session import create_parents
from tests.support.federation import new_database, psql_bool, psql_int
from tests.support.sample_schema import FEEDER_SCHEMA

WANTED_OUT = {("public", "not_wanted")}


def _database(cluster: LocalCluster, sql: str = "") -> str:
    return new_database(cluster, "sf", sql)


def _wanted(schema: str, name: str) -> bool:
    return (schema, name) not in WANTED_OUT


async def _create(cluster: LocalCluster, db: str, schema_file: Path) -> list[str]:
    conn = await asyncpg.connect(cluster.dsn(db))
    try:
        return await create_parents_from_file(conn, schema_file, "hub_id", "integer", _wanted)
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def feeder(cluster: LocalCluster) -> str:
    """A feeder database with the realistic schema."""
    if "reader_sf" not in cluster.psql("SELECT rolname FROM pg_roles"):
        cluster.psql("CREATE ROLE reader_sf")
    return _database(cluster, FEEDER_SCHEMA.replace("CREATE ROLE reader_sf;", ""))


def _dump(cluster: LocalCluster, feeder: str, install: PgInstall, tmp: Path) -> Path:
    out = subprocess.run(
        [install.tool("pg_dump"), "--schema-only", "-d", cluster.conninfo(feeder)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = tmp / f"schema{install.major}.sql"
    path.write_text(out)
    return path


@pytest.mark.pg_major(15, 17, 18)
async def test_pg_dump_schema_creates_working_parents(
    cluster: LocalCluster, feeder: str, tmp_path: Path, pg_install: PgInstall
) -> None:
    """Every wanted table becomes a list-partitioned parent with widened keys, indexes, CHECKs, types, defaults."""
    schema_file = _dump(cluster, feeder, pg_install, tmp_path)
    assert check_schema_file(schema_file, "hub_id") == []
    hub = _database(cluster)
    with structlog.testing.capture_logs() as logs:
        created = await _create(cluster, hub, schema_file)
    assert len(created) == 11
    assert {"public.Customer", "sales.orders", "sales.order_details"} <= set(created)
    assert "public.not_wanted" not in created

    def q(sql: str) -> str:
        return cluster.psql(sql, dbname=hub).strip()

    def q_int(sql: str) -> int:
        return psql_int(cluster, sql, hub)

    strategy = "SELECT partstrat, partattrs::text FROM pg_partitioned_table WHERE partrelid = '\"Invoice\"'::regclass"
    assert q(strategy) == "l|1"
    assert q("SELECT attname FROM pg_attribute WHERE attrelid = '\"Invoice\"'::regclass AND attnum = 1") == "hub_id"
    pk = "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'film_actor_pkey'"
    assert q(pk) == "PRIMARY KEY (hub_id, actor_id, film_id)"
    assert q("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'Customer_Email_key'") == (
        'UNIQUE (hub_id, "Email")'
    )
    indexes = q("SELECT indexname || ' ' || indexdef FROM pg_indexes WHERE tablename IN ('Customer', 'payment')")
    assert 'CREATE UNIQUE INDEX customer_lower_email ON ONLY public."Customer" USING btree (hub_id, lower' in indexes
    assert "WHERE (amount > (0)::numeric)" in indexes
    assert 'WHERE "Active"' in indexes
    checks = q("SELECT string_agg(conname, ',' ORDER BY conname) FROM pg_constraint WHERE contype = 'c'")
    for name in ("film_rate_positive", "film_title_not_blank", "qty_positive", "Invoice_Total_check", "year_check"):
        assert name in checks
    assert q(
        "SELECT string_agg(typname, ',' ORDER BY typname) FROM pg_type "
        "WHERE typtype IN ('e', 'd') AND typnamespace::regnamespace::text IN ('public', 'sales')"
    ) == ("Order Status,email,mpaa_rating,year")
    assert q_int("SELECT count(*) FROM pg_constraint WHERE contype = 'f'") == 0
    assert q_int("SELECT count(*) FROM pg_trigger") == 0
    assert q_int("SELECT count(*) FROM pg_views WHERE schemaname = 'public'") == 0
    assert q_int("SELECT count(*) FROM pg_proc WHERE proname = 'touch_last_update'") == 0
    q("CREATE TABLE sales.orders_1 PARTITION OF sales.orders FOR VALUES IN (1)")
    q('CREATE TABLE "public"."Invoice_1" PARTITION OF "public"."Invoice" FOR VALUES IN (1)')
    q("CREATE TABLE public.film_1 PARTITION OF public.film FOR VALUES IN (1)")
    assert q("INSERT INTO sales.orders (hub_id) VALUES (1) RETURNING order_id || status::text || order_date") == (
        "1new" + q("SELECT CURRENT_DATE")
    )
    assert q_int('INSERT INTO "Invoice" (hub_id, "CustomerId", "Total") VALUES (1, 5, 2) RETURNING "InvoiceId"') == 1
    assert q("INSERT INTO film (hub_id, title, language_id) VALUES (1, 'Up', 1) RETURNING film_id, rental_rate") == (
        "1|4.99"
    )
    with pytest.raises(ConfigError):
        q("INSERT INTO film (hub_id, title, language_id, release_year) VALUES (1, 'Old', 1, 1800)")
    warnings = [e for e in logs if e["event"] == "schema_file.left_out"]
    assert len(warnings) == 1
    items = warnings[0]["items"]
    for item in (
        "trigger film_actor_touch on public.film_actor",
        "function public.touch_last_update",
        "view public.film_list",
    ):
        assert item in items
    assert "foreign key film_actor_film_fkey on public.film_actor" in items
    assert any(i.startswith("grant ") for i in items)
    assert any(i.startswith("comment ") for i in items)
    assert (await _create(cluster, hub, schema_file)) == []  # existing parents are left alone


def test_check_schema_file_reports_lines(tmp_path: Path) -> None:
    """A broken schema file's problems name the file and the line."""
    path = tmp_path / "schema.sql"
    path.write_text(
        "\\restrict abc\n"
        "CREATE TABLE public.a (id integer NOT NULL, mood public.mood);\n"
        "\n"
        "CREATE TABLE public.b (id integer WITH nonsense);\n"
        "CREATE INDEX b_i ON public.zzz USING btree (id);\n"
        "\\unrestrict abc\n"
    )
    problems = check_schema_file(path, "hub_id")
    assert problems[0].startswith("schema.sql:2: column mood of table public.a uses type public.mood")
    assert problems[1].startswith("schema.sql:4: ")
    assert problems[2].startswith("schema.sql:5: table public.zzz is not created earlier in the file")
    assert len(problems) == 3


async def test_smuggled_statements_are_never_executed(cluster: LocalCluster, tmp_path: Path) -> None:
    """Functions, DROPs, COPY TO PROGRAM and injected defaults in a schema file are left out, never run."""
    hub = _database(cluster, "CREATE TABLE public.victim (id int);")
    path = tmp_path / "schema.sql"
    path.write_text(
        "CREATE FUNCTION public.evil() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;\n"
        "DROP TABLE public.victim;\n"
        "COPY (SELECT 1) TO PROGRAM 'touch /tmp/fedload-smuggled';\n"
        "CREATE TABLE public.t (id int DEFAULT 1 -- ) ; \n, x text DEFAULT 'a'');DROP TABLE public.victim;--');\n"
        "DO $$ BEGIN EXECUTE 'DROP TABLE public.victim'; END $$;\n"
    )
    assert any("DROP is not a schema definition" in p for p in check_schema_file(path, "hub_id"))
    assert (await _create(cluster, hub, path)) == ["public.t"]
    assert psql_int(cluster, "SELECT count(*) FROM pg_proc WHERE proname = 'evil'", hub) == 0
    assert psql_bool(cluster, "SELECT to_regclass('public.victim') IS NOT NULL", hub)
    assert not Path("/tmp/fedload-smuggled").exists()  # noqa: ASYNC240 - one stat of a local path


@pytest.mark.parametrize(
    ("tables", "read"),
    [(("public.t", 'public."Mixed"'), False), (("public.*",), True), (("public.t", "public.mixed"), True)],
)
async def test_the_file_is_read_only_when_a_parent_may_be_missing(
    cluster: LocalCluster, tmp_path: Path, tables: tuple[str, ...], read: bool
) -> None:
    """Every sync prepares the superhub: where the configured tables are named exactly and all exist, the schema
    file could create nothing and is not read (nor pglast imported); a pattern could match a table the file has and
    the superhub lacks, and so could a name that exists only in another case (`public.mixed` is not "Mixed"), so
    then the file is read, and its problems reported, every time."""
    hub = _database(cluster)
    path = tmp_path / "schema.sql"
    path.write_text('CREATE TABLE public.t (id int);\nCREATE TABLE public."Mixed" (id int);\n')
    parents = ParentsSpec(tuple(TablePattern(t) for t in tables), "hub_id", "integer", path)
    conn = await asyncpg.connect(cluster.dsn(hub))
    try:
        every_table = ParentsSpec((TablePattern("public.*"),), "hub_id", "integer", path)
        assert sorted(await create_parents(conn, every_table)) == ["public.Mixed", "public.t"]
        path.write_text("CREATE TABLE public.v (id int;\n")  # no longer valid SQL: reading it fails
        if read:
            with pytest.raises(ConfigError, match=r"schema\.sql:1"):
                await create_parents(conn, parents)
        else:
            assert await create_parents(conn, parents) == []
    finally:
        await conn.close()
