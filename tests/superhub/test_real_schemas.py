"""Schemas nobody on the team designed: missing tables, parents with constraints, names that could collide,
remaps applied by the superhub, and the feeder key inside a dump. Nothing may be lost, no run may report success
with less than the feeder has."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from fedload.commands.admin import remove_feeder
from fedload.config import Config, parse_config
from fedload.errors import ConfigError
from fedload.localpg import LocalCluster
from fedload.names import TableName, TablePattern
from fedload.results import Outcome
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import FeederRun, sync_feeder
from fedload.superhub.swap import _legacy_partition_name, partition_name
from tests.support.federation import psql_int, sync, write_script
from tests.support.sample_schema import FEEDER_SCHEMA, SAMPLE_DATA

_names = itertools.count()


@dataclass
class Lab:
    """A superhub database and one feeder database (hub1, key 1), each with the SQL a test gives it."""

    feeders: LocalCluster
    hub: LocalCluster
    tmp: Path
    superhub: str = ""
    feeder: str = ""
    tables: list[str] = field(default_factory=lambda: ["public.*"])

    def setup(self, superhub_sql: str, feeder_sql: str) -> Lab:
        suffix = next(_names)
        self.superhub, self.feeder = f"hub_{suffix}", f"feed_{suffix}"
        self.hub.psql(f"CREATE DATABASE {self.superhub}")
        self.feeders.psql(f"CREATE DATABASE {self.feeder}")
        if superhub_sql:
            self.hub.psql(superhub_sql, dbname=self.superhub)
        self.feeders.psql(feeder_sql, dbname=self.feeder)
        self.tmp.chmod(0o755)
        return self

    def config(self, superhub: dict[str, Any] | None = None, **feeder: Any) -> Config:
        hub = {"dsn": self.hub.dsn(self.superhub), "tables": self.tables, **(superhub or {})}
        hub1 = {
            "key": 1,
            "transport": "local",
            "database": self.feeders.conninfo(self.feeder),
            "pg_dump": self.feeders.install.tool("pg_dump"),
            **feeder,
        }
        return parse_config({"superhub": hub, "feeders": {"hub1": hub1}})

    async def sync(self, superhub: dict[str, Any] | None = None, **feeder: Any) -> FeederRun:
        return (await sync(self.config(superhub, **feeder), "hub1"))[0]

    def on_hub(self, sql: str) -> str:
        return self.hub.psql(sql, dbname=self.superhub).strip()

    def on_feeder(self, sql: str) -> str:
        return self.feeders.psql(sql, dbname=self.feeder).strip()

    def hub_int(self, sql: str) -> int:
        """The integer (a count) that `sql` selects on the superhub."""
        return psql_int(self.hub, sql, self.superhub)

    def leftovers(self) -> int:
        return self.hub_int("SELECT count(*) FROM pg_tables WHERE schemaname = 'fedload_stage'")


def succeeded(run: FeederRun) -> FeederRun:
    assert run.outcome == Outcome.SUCCESS, run.error
    return run


@pytest.fixture
def lab(cluster: LocalCluster, tmp_path: Path) -> Lab:
    """A superhub and a feeder on the PostgreSQL 15 cluster."""
    return Lab(cluster, cluster, tmp_path)


# -- 1. a table missing from a dump never becomes an empty partition ------------------------------------------------

HOSTS_FEEDER = """
CREATE TABLE "Hosts" (hostkey text PRIMARY KEY, "Name" text);
INSERT INTO "Hosts" SELECT 'h' || g, 'name ' || g FROM generate_series(1, 50) g;
CREATE TABLE contexts (hostkey text, ctx text);
INSERT INTO contexts SELECT 'h' || g, 'c' FROM generate_series(1, 20) g;
"""
HOSTS_SUPERHUB = """
CREATE TABLE "Hosts" (hub_id int NOT NULL, hostkey text NOT NULL, "Name" text, PRIMARY KEY (hub_id, hostkey))
    PARTITION BY LIST (hub_id);
CREATE TABLE contexts (hub_id int NOT NULL, hostkey text, ctx text) PARTITION BY LIST (hub_id);
"""
WAYS = [
    pytest.param({"dump_mode": "copy"}, id="copy"),
    pytest.param({"dump_mode": "inserts"}, id="inserts"),
    pytest.param({"dump_mode": "copy", "agent": False}, id="copy-without-agent"),
    pytest.param({"dump_mode": "inserts", "agent": False}, id="inserts-without-agent"),
]


@pytest.mark.parametrize("way", WAYS)
async def test_a_table_missing_from_the_dump_fails_the_run_and_keeps_its_rows(lab: Lab, way: dict[str, Any]) -> None:
    """A feeder that no longer has a configured table fails its run, naming it; its old rows stay."""
    lab.tables = ['public."Hosts"', "public.contexts"]
    lab.setup(HOSTS_SUPERHUB, HOSTS_FEEDER)
    succeeded(await lab.sync(**way))
    assert lab.hub_int('SELECT count(*) FROM "Hosts"') == 50
    lab.on_feeder("DROP TABLE \"Hosts\"; INSERT INTO contexts VALUES ('new', 'c')")
    run = await lab.sync(**way)
    assert run.outcome == Outcome.FAILED
    assert "lacks table(s) public.Hosts" in (run.error or "")
    assert "exclude_tables" in (run.error or "")
    assert lab.hub_int('SELECT count(*) FROM "Hosts"') == 50
    assert lab.hub_int("SELECT count(*) FROM contexts") == 20  # nothing half-done: contexts is not swapped either
    assert lab.leftovers() == 0


@pytest.mark.parametrize("way", WAYS)
async def test_an_empty_table_is_present(lab: Lab, way: dict[str, Any]) -> None:
    """A table that the feeder has but that is empty is in the dump: it replaces the old rows with none."""
    lab.setup(HOSTS_SUPERHUB, HOSTS_FEEDER)
    lab.tables = ['public."Hosts"', "public.contexts"]
    succeeded(await lab.sync(**way))
    lab.on_feeder("DELETE FROM contexts")
    assert succeeded(await lab.sync(**way)).rows == {"public.Hosts": 50, "public.contexts": 0}
    assert lab.hub_int("SELECT count(*) FROM contexts") == 0


async def test_an_excluded_table_keeps_its_partition_until_removed(lab: Lab) -> None:
    """exclude_tables lets a feeder stop sending a table; its partition goes only with `feeder remove --table`."""
    lab.setup(HOSTS_SUPERHUB, HOSTS_FEEDER)
    lab.tables = ['public."Hosts"', "public.contexts"]
    succeeded(await lab.sync())
    lab.on_feeder('DROP TABLE "Hosts"')
    run = succeeded(await lab.sync(exclude_tables=['public."Hosts"']))
    assert run.rows == {"public.contexts": 20}
    assert lab.hub_int('SELECT count(*) FROM "Hosts"') == 50
    config = lab.config(exclude_tables=['public."Hosts"'])
    assert await asyncio.to_thread(remove_feeder, config, "hub1", [TablePattern('public."Hosts"')], yes=True) == 0
    assert lab.hub_int('SELECT count(*) FROM "Hosts"') == 0
    assert lab.hub_int("SELECT count(*) FROM contexts") == 20


def test_an_unquoted_upper_case_pattern_is_a_configuration_error() -> None:
    """`public.Hosts` would fold to public.hosts: the configuration says so and how to write the mixed-case name."""
    with pytest.raises(ConfigError) as caught:
        parse_config({"superhub": {"dsn": "postgresql:///x", "tables": ["public.Hosts"]}})
    assert "'public.hosts'" in str(caught.value)
    assert """'public."Hosts"'""" in str(caught.value)


async def test_a_pattern_matching_no_parent_fails_the_run(lab: Lab) -> None:
    """A configured pattern that matches no parent on the superhub fails the run instead of syncing less."""
    lab.setup(HOSTS_SUPERHUB, HOSTS_FEEDER)
    lab.tables = ['public."Hosts"', "public.contexts", "public.hosts"]
    run = await lab.sync()
    assert run.outcome == Outcome.FAILED
    assert "'public.hosts' match(es) no partitioned table" in (run.error or "")


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("public.hosts", [("public", "hosts")], [("public", "Hosts"), ("other", "hosts")]),
        ('public."Hosts"', [("public", "Hosts")], [("public", "hosts")]),
        ('"My Schema"."a.b*"', [("My Schema", "a.b*")], [("My Schema", "a.bc")]),
        ("public.__promiselog_*", [("public", "__promiselog_"), ("public", "__promiselog_x.y")], [("x", "__p")]),
        ("s?.t[0-9]", [("s1", "t5")], [("s", "t5"), ("s1", "tx")]),
        ('public."say ""hi"""', [("public", 'say "hi"')], []),
    ],
)
def test_patterns_follow_postgresql_identifier_rules(
    pattern: str, matches: list[tuple[str, str]], misses: list[tuple[str, str]]
) -> None:
    """Unquoted parts fold to lower case, quoted parts keep case and make wildcards literal."""
    parsed = TablePattern(pattern)
    assert all(parsed.matches(TableName(*t)) for t in matches)
    assert not any(parsed.matches(TableName(*t)) for t in misses)


# -- 2. parents with ordinary constraints and indexes ---------------------------------------------------------------

KINDS = {
    "table check": ("CHECK (a >= 0)", ""),
    "named column check": ("", "CONSTRAINT positive_a CHECK (a >= 0)"),
    "not null": ("", "NOT NULL"),
    "default": ("", "DEFAULT 7"),
    "collation": ("", ""),
    "unique": ("UNIQUE (hub_id, a)", ""),
    "primary key": ("PRIMARY KEY (hub_id, id)", ""),
    "unique index": ("", ""),
    "partial index": ("", ""),
    "expression index": ("", ""),
    "identity": ("", ""),
    "generated": ("", ""),
}
INDEXES = {
    "unique index": "CREATE UNIQUE INDEX ON t (hub_id, b)",
    "partial index": "CREATE INDEX ON t (a) WHERE a > 10",
    "expression index": "CREATE INDEX ON t (lower(b))",
}


def _parent_ddl(kind: str, table: str = "t") -> str:
    table_constraint, column_extra = KINDS[kind]
    id_column = "id int GENERATED BY DEFAULT AS IDENTITY" if kind == "identity" else "id int NOT NULL"
    doubled = ", doubled int GENERATED ALWAYS AS (a * 2) STORED" if kind == "generated" else ""
    constraint = f", {table_constraint}" if table_constraint else ""
    collate = ' COLLATE "C"' if kind == "collation" else ""
    index = INDEXES.get(kind, "").replace(" ON t ", f" ON {table} ")
    return (
        f"CREATE TABLE {table} (hub_id int NOT NULL, {id_column}, a int {column_extra}, b text{collate}{doubled}"
        f"{constraint}) PARTITION BY LIST (hub_id); {index};"
    )


def _feeder_ddl(table: str = "t") -> str:
    return f"""
CREATE TABLE {table} (id int PRIMARY KEY, a int, b text, doubled int);
INSERT INTO {table} SELECT g, g, 'Row ' || g, -1 FROM generate_series(1, 40) g;
"""


FEEDER_T = _feeder_ddl()


def _kind_table(kind: str) -> str:
    return "t_" + kind.replace(" ", "_")


def _kind_problems(lab: Lab, kind: str) -> list[str]:
    """What is wrong with the partition of `kind`'s parent after the syncs (nothing when all is well)."""
    table = _kind_table(kind)
    problems = []
    if (got := lab.on_hub(f"SELECT count(*), sum(a) FROM {table}")) != "40|820":
        problems.append(f"count|sum {got}")
    partition = lab.on_hub(f"SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = '{table}'::regclass")
    if partition != f'fedload_parts."public.{table}__hub1"':
        return [*problems, f"partition {partition!r}"]
    parent_indexes = lab.hub_int(f"SELECT count(*) FROM pg_index WHERE indrelid = '{table}'::regclass")
    attached = lab.hub_int(
        "SELECT count(*) FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhparent "
        f"WHERE x.indrelid = '{table}'::regclass"
    )
    own = lab.hub_int(f"SELECT count(*) FROM pg_index WHERE indrelid = '{partition}'::regclass")
    if not attached == parent_indexes == own:  # every parent index reused, none built twice
        problems.append(f"indexes: parent {parent_indexes}, attached {attached}, partition's own {own}")
    if kind == "generated" and lab.hub_int(f"SELECT count(*) FROM {table} WHERE doubled = a * 2") != 40:
        problems.append("doubled not computed on the superhub")  # computed, never the dump's -1
    collation = "SELECT collname FROM pg_attribute JOIN pg_collation c ON c.oid = attcollation WHERE attrelid = "
    if kind == "collation" and lab.on_hub(f"{collation} '{partition}'::regclass AND attname = 'b'") != "C":
        problems.append("collation of b is not C")
    return problems


@pytest.mark.pg_major(15, 17, 18)
async def test_parents_with_constraints_and_indexes(
    major_cluster: LocalCluster, cluster: LocalCluster, tmp_path: Path
) -> None:
    """Staging tables carry what ATTACH requires and what the parent declares; repeated syncs succeed.

    One parent per kind of constraint or index, all synced by the same runs (one load per major instead of one
    per kind: each parent's checks below are its own)."""
    superhub_sql = "".join(_parent_ddl(kind, _kind_table(kind)) for kind in KINDS)
    feeder_sql = "".join(_feeder_ddl(_kind_table(kind)) for kind in KINDS)
    lab = Lab(cluster, major_cluster, tmp_path).setup(superhub_sql, feeder_sql)
    for _ in range(2):
        assert succeeded(await lab.sync()).rows == {f"public.{_kind_table(kind)}": 40 for kind in KINDS}
    problems = {kind: found for kind in KINDS if (found := _kind_problems(lab, kind))}
    assert not problems


async def test_a_row_breaking_a_parent_check_is_a_bad_row(lab: Lab) -> None:
    """A feeder row that breaks the parent's CHECK fails the run (or is rejected), never slips in."""
    lab.setup(_parent_ddl("table check"), FEEDER_T + "INSERT INTO t VALUES (99, -5, 'bad', 0);")
    run = await lab.sync()
    assert run.outcome == Outcome.FAILED
    assert "t_a_check" in (run.error or "")
    run = succeeded(await lab.sync({"bad_rows": "reject"}))
    assert run.rejected == {"public.t": 1}
    assert lab.hub_int("SELECT count(*) FROM t") == 40


# -- 3. names that cannot collide -----------------------------------------------------------------------------------

TWO_SCHEMAS = """
CREATE SCHEMA alpha; CREATE SCHEMA beta;
CREATE TABLE alpha.items (id int, what text); CREATE TABLE beta.items (id int, what text);
INSERT INTO alpha.items SELECT g, 'alpha' FROM generate_series(1, 3) g;
INSERT INTO beta.items SELECT g, 'beta' FROM generate_series(1, 5) g;
"""


async def test_a_table_name_in_two_schemas(lab: Lab) -> None:
    """alpha.items and beta.items get partitions of their own and keep their own rows, sync after sync."""
    superhub = TWO_SCHEMAS.split("INSERT", maxsplit=1)[0].replace(
        "what text)", "what text, hub_id int) PARTITION BY LIST (hub_id)"
    )
    lab.tables = ["alpha.items", "beta.items"]
    lab.setup(superhub, TWO_SCHEMAS)
    for _ in range(2):
        assert succeeded(await lab.sync()).rows == {"alpha.items": 3, "beta.items": 5}
    assert lab.on_hub("SELECT what, count(*) FROM alpha.items GROUP BY 1") == "alpha|3"
    assert lab.on_hub("SELECT what, count(*) FROM beta.items GROUP BY 1") == "beta|5"


LONG = "x" * 63
HOSTILE_FEEDER = f"""
CREATE TABLE "We""ird. Name" (n int, "Mixed Case" text, "a.b" text, "{LONG}" int, fedload_feeder_key int);
INSERT INTO "We""ird. Name" SELECT g, 'v' || g, 'dot', g, g FROM generate_series(1, 25) g;
INSERT INTO "We""ird. Name" VALUES (0, 'bad', 'dot', 0, -1);
CREATE TABLE "{LONG}" (n int);
INSERT INTO "{LONG}" SELECT generate_series(1, 4);
CREATE TABLE r1_0 (n int);
INSERT INTO r1_0 VALUES (1);
"""
HOSTILE_SUPERHUB = f"""
CREATE TABLE "We""ird. Name" (hub_id int NOT NULL, n int, "Mixed Case" text, "a.b" text, "{LONG}" int,
    fedload_feeder_key int, CONSTRAINT fedload_feeder_key CHECK (fedload_feeder_key >= 0))
    PARTITION BY LIST (hub_id);
CREATE TABLE "{LONG}" (hub_id int NOT NULL, n int) PARTITION BY LIST (hub_id);
CREATE TABLE r1_0 (hub_id int NOT NULL, n int) PARTITION BY LIST (hub_id);
"""


@pytest.mark.parametrize("bad_rows", ["fail", "reject"])
async def test_hostile_names(lab: Lab, bad_rows: str) -> None:
    """Quotes, dots, spaces, mixed case, 63-byte names and names fedload uses itself all sync, twice."""
    lab.tables = ['public."We""ird. Name"', f"public.{LONG}", "public.r1_0"]
    lab.setup(HOSTILE_SUPERHUB, HOSTILE_FEEDER)
    if bad_rows == "fail":
        run = await lab.sync()
        assert run.outcome == Outcome.FAILED
        assert '"fedload_feeder_key"' in (run.error or "")  # the user's CHECK, not fedload's own
        lab.on_feeder("""DELETE FROM "We""ird. Name" WHERE fedload_feeder_key < 0""")
    for _ in range(2):
        run = succeeded(await lab.sync({"bad_rows": bad_rows}))
        assert run.rows == {'public.We"ird. Name': 25, f"public.{LONG}": 4, "public.r1_0": 1}
    assert lab.on_hub("""SELECT count(*), sum(n) FROM "We""ird. Name" WHERE "a.b" = 'dot'""") == "25|325"
    assert lab.hub_int(f'SELECT count(*) FROM "{LONG}"') == 4


async def test_a_partition_named_by_an_older_fedload_is_replaced(lab: Lab) -> None:
    """A partition named `<table>__<feeder>` (fedload 0.1) is found by its bound and replaced, not duplicated."""
    lab.setup(HOSTS_SUPERHUB.replace('"Hosts"', "hosts"), HOSTS_FEEDER.replace('"Hosts"', "hosts"))
    lab.on_hub(
        "CREATE SCHEMA fedload_parts; CREATE TABLE fedload_parts.hosts__hub1 PARTITION OF hosts FOR VALUES IN (1);"
        "INSERT INTO hosts (hub_id, hostkey) VALUES (1, 'old')"
    )
    succeeded(await lab.sync())
    assert lab.hub_int("SELECT count(*) FROM hosts") == 50
    assert lab.on_hub("SELECT string_agg(relname, ',') FROM pg_class WHERE relname LIKE '%hosts__hub1'") == (
        "public.hosts__hub1"
    )


def test_partition_names_fit_and_differ() -> None:
    """Long names are shortened with a hash to PostgreSQL's 63 bytes; fedload 0.1's names are still recognised."""
    long_a, long_b = TableName("public", "t" * 60 + "a"), TableName("public", "t" * 60 + "b")
    names = {partition_name(t, "hub-with-a-long-name") for t in (long_a, long_b)}
    assert len(names) == 2
    assert all(len(n.encode()) <= 63 for n in names)
    assert partition_name(TableName("alpha", "items"), "f1") != partition_name(TableName("beta", "items"), "f1")
    table, feeder = "x" * 60, "feeder-name-long"  # fedload 0.1: table[:40] + "__" + feeder[:12] + "_" + hash
    digest = hashlib.sha256(f"{table}__{feeder}".encode()).hexdigest()[:8]
    assert _legacy_partition_name(table, feeder) == f"{'x' * 40}__feeder-name-_{digest}"


# -- 5. the remap belongs to the superhub ---------------------------------------------------------------------------

REMAP_FEEDER = """
CREATE TABLE hosts (hostkey text, hostname text, obsolete int);
INSERT INTO hosts SELECT 'h' || g, 'name ' || g, g FROM generate_series(1, 30) g;
"""
REMAP_SUPERHUB = """
CREATE TABLE hosts (hub_id int NOT NULL, hostkey text, name text, site text) PARTITION BY LIST (hub_id);
"""
REMAP = """
[tables."public.hosts"]
rename = { hostname = "name" }
drop = ["obsolete"]
add = { site = "'eu-west'" }
"""


@pytest.mark.parametrize("mode", ["copy", "inserts"])
async def test_the_superhub_applies_the_remap_whatever_the_feeder_runs(lab: Lab, tmp_path: Path, mode: str) -> None:
    """A remap in fedload.toml is applied by the superhub, also behind a forced command that ignores arguments."""
    lab.setup(REMAP_SUPERHUB, REMAP_FEEDER)
    remap = tmp_path / "remap.toml"
    remap.write_text(REMAP)
    forced = write_script(
        tmp_path / "forced.sh",
        f"exec {sys.executable} -m fedload agent dump --quiet --mode {mode} "
        f"--database '{lab.feeders.conninfo(lab.feeder)}' --pg-dump {lab.feeders.install.tool('pg_dump')} "
        "--table public.hosts\n",
    )
    extras: list[dict[str, Any]] = [{}, {"agent_command": [forced]}]
    for extra in extras:
        run = succeeded(await lab.sync(remap=str(remap), dump_mode=mode, **extra))
        assert run.rows == {"public.hosts": 30}
        assert lab.hub_int("SELECT count(*) FROM hosts WHERE name LIKE 'name %' AND site = 'eu-west'") == 30


@pytest.mark.parametrize("mode", ["copy", "inserts", "binary"])
async def test_a_remap_that_does_not_fit_fails_and_keeps_old_data(lab: Lab, tmp_path: Path, mode: str) -> None:
    """A remap naming a column or a table the dump lacks fails the run with a clear error; old data stays."""
    lab.setup(REMAP_SUPERHUB, REMAP_FEEDER)
    remap = tmp_path / "remap.toml"
    remap.write_text(REMAP)
    succeeded(await lab.sync(remap=str(remap), dump_mode=mode))
    remap.write_text(REMAP.replace("hostname", "host_name"))
    run = await lab.sync(remap=str(remap), dump_mode=mode)
    assert run.outcome == Outcome.FAILED
    assert "'host_name' is not in the dump's columns" in (run.error or "")
    remap.write_text(REMAP + '[tables."public.nosuch"]\ndrop = ["x"]\n')
    run = await lab.sync(remap=str(remap), dump_mode=mode)
    assert "names table(s) not in its dump: public.nosuch" in (run.error or "")
    assert lab.hub_int("SELECT count(*) FROM hosts") == 30
    assert lab.leftovers() == 0


async def test_a_rename_only_remap_stays_binary(lab: Lab, tmp_path: Path) -> None:
    """In binary mode a remap that only renames asks the feeder for its own names and loads the table in binary;
    one that drops or adds columns has it sent as text (above), as pg_dump would."""
    lab.setup(REMAP_SUPERHUB, REMAP_FEEDER)
    remap = tmp_path / "remap.toml"
    remap.write_text('[tables."public.hosts"]\nrename = { hostname = "name" }\n')
    with capture_logs() as logs:
        run = await sync_feeder(feeder_job(lab.config(None, remap=str(remap), dump_mode="binary"), "hub1"))
    assert succeeded(run).rows == {"public.hosts": 30}
    assert lab.hub_int("SELECT count(*) FROM hosts WHERE name LIKE 'name %' AND site IS NULL") == 30
    assert [e["mode"] for e in logs if e["event"] == "import.table_loaded"] == ["binary"]
    assert [e["columns"] for e in logs if e["event"] == "import.columns_dropped"] == [["obsolete"]]


# -- 6. the feeder key inside a dump --------------------------------------------------------------------------------

KEYED_FEEDER = """
CREATE TABLE hosts (hub_id int, hostkey text);
INSERT INTO hosts SELECT 1, 'h' || g FROM generate_series(1, 10) g;
"""


@pytest.mark.parametrize(("mode", "bad_rows"), [("copy", "fail"), ("inserts", "fail"), ("copy", "reject")])
async def test_the_feeder_key_inside_a_dump_must_be_the_feeders(lab: Lab, mode: str, bad_rows: str) -> None:
    """A dump carrying the key column with the feeder's own key loads; with another key the run fails."""
    lab.setup("CREATE TABLE hosts (hub_id int NOT NULL, hostkey text) PARTITION BY LIST (hub_id)", KEYED_FEEDER)
    succeeded(await lab.sync({"bad_rows": bad_rows}, dump_mode=mode))
    lab.on_feeder("UPDATE hosts SET hub_id = 2 WHERE hostkey = 'h3'")
    run = await lab.sync({"bad_rows": bad_rows}, dump_mode=mode)
    assert run.outcome == Outcome.FAILED
    assert "carries the feeder key column hub_id with a value other than its key 1" in (run.error or "")
    assert lab.hub_int("SELECT count(*) FROM hosts WHERE hub_id = 1") == 10
    assert lab.leftovers() == 0


# -- a sample database end to end: its pg_dump --schema-only creates the parents, its data round-trips ------------

_ROLE_ONCE = "DO $$BEGIN CREATE ROLE reader_sf; EXCEPTION WHEN duplicate_object THEN NULL; END$$;"


@pytest.mark.pg_major(15, 17, 18)
@pytest.mark.parametrize("mode", ["copy", "inserts"])
async def test_a_sample_database_round_trips_through_its_schema_file(
    major_cluster: LocalCluster, cluster: LocalCluster, tmp_path: Path, mode: str
) -> None:
    """Eleven tables with enums, domains, mixed-case names and a second schema: parents from the feeder's own
    schema-only dump, then every row of every table arrives as the feeder has it, sync after sync."""
    lab = Lab(cluster, major_cluster, tmp_path)
    lab.setup("", FEEDER_SCHEMA.replace("CREATE ROLE reader_sf;", _ROLE_ONCE) + SAMPLE_DATA)
    schema_file = tmp_path / "schema.sql"
    dump = [cluster.install.tool("pg_dump"), "--schema-only", f"--dbname={cluster.conninfo(lab.feeder)}"]
    dumped = await asyncio.to_thread(subprocess.run, dump, capture_output=True, check=True, text=True)
    schema_file.write_text(dumped.stdout)
    lab.tables = ["public.*", "sales.*"]
    tables = sorted(
        lab.on_feeder(
            "SELECT string_agg(format('%s.%s', table_schema, table_name), ',') FROM information_schema.tables "
            "WHERE table_type = 'BASE TABLE' AND table_schema IN ('public', 'sales')"
        ).split(",")
    )
    assert len(tables) == 12
    for _ in range(2):
        run = succeeded(await lab.sync({"schema_file": str(schema_file)}, dump_mode=mode))
        assert sorted(run.rows) == tables
    for table in tables:
        name = TableName(*table.split("."))
        columns = lab.on_feeder(
            f"SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
            f"WHERE attrelid = '{name.sql}'::regclass AND attnum > 0 AND NOT attisdropped"
        )
        digest = f"SELECT count(*) || ':' || md5(string_agg(ROW({columns})::text, '|' ORDER BY ROW({columns})::text))"
        expected = lab.on_feeder(f"{digest} FROM {name.sql}")
        assert lab.on_hub(f"{digest} FROM {name.sql} WHERE hub_id = 1") == expected, table
