"""Round trips on real PostgreSQL: rows are pg_dumped, transformed and loaded with psql into a fresh database.

The source rows are loaded with asyncpg's binary COPY and the results are compared as ordered row digests computed
by PostgreSQL, so neither side of a comparison depends on the transformer or on hand-written SQL escaping.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from fedload.localpg import LocalCluster, PgInstall, find_installs
from transforms import DEFAULT_MAX_STATEMENT_BYTES, Transformer, TransformOptions, load_remap

TIMEOUT_S = 60.0
_names = itertools.count()


def quote_ident(name: str) -> str:
    """`name` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


# A table and a column whose names need quoting, with spaces, `;`, `"` (written `""`) and INSERT look-alikes.
TABLE_NAME = 'Tab; "x" ); INSERT INTO y VALUES (ü'
WEIRD_COLUMN = 'Col "q" ;  y'
TABLE = f"public.{quote_ident(TABLE_NAME)}"
COLUMNS: tuple[tuple[str, str], ...] = (
    (WEIRD_COLUMN, "text"),
    ("txt", "text"),
    ("tags", "text[]"),
    ("doc", "jsonb"),
    ("raw", "json"),
    ("blob", "bytea"),
    ("n", "integer"),
    ("big", "bigint"),
    ("amount", "numeric"),
    ("select", "boolean"),
)
TABLE_DDL = f"CREATE TABLE {TABLE} ({', '.join(f'{quote_ident(c)} {t}' for c, t in COLUMNS)})"
DIGEST = (
    "SELECT count(*) || ':' || coalesce(md5(string_agg(r::text, E'\\n' ORDER BY r::text COLLATE \"C\")), '') "
    "FROM ({select}) r"
)
DUMP_MODES: tuple[tuple[str, ...], ...] = ((), ("--inserts",), ("--column-inserts",))

Row = tuple[Any, ...]

# Fragments that break naive SQL or COPY handling; mixed with arbitrary unicode (no NUL: text cannot hold it).
NASTY = (
    "'",
    "''",
    "\\",
    "\\\\",
    "\n",
    "\r",
    "\r\n",
    "\t",
    ";",
    ");",
    "');",
    "'), (",
    "INSERT INTO x VALUES (",
    "\nINSERT INTO x VALUES ('a');\n",
    "\\.",
    "\n\\.\n",
    "\\N",
    "NULL",
    "E'",
    "$$",
    "$x$",
    "--",
    "/*",
    "*/",
    '"',
    '""',
    "{",
    "}",
    ",",
    "(",
    ")",
    " ",
    "\\restrict x\n",
    "\u2028",
    "\ufeff",
    "é",
    "😀",
)
UNICODE = st.characters(codec="utf-8", exclude_characters="\x00")
TEXT = st.lists(st.one_of(st.sampled_from(NASTY), st.text(UNICODE, max_size=6)), max_size=5).map("".join)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=6,
)
NUMERIC = st.decimals(min_value=-(10**20), max_value=10**20, allow_nan=False, allow_infinity=False) | st.sampled_from(
    [Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity"), Decimal("1.50"), Decimal("-0.000")]
)


def nullable(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Values of `strategy`, sometimes NULL."""
    return st.none() | strategy


ROW: st.SearchStrategy[Row] = st.tuples(
    nullable(TEXT),
    nullable(TEXT),
    nullable(st.lists(nullable(TEXT), max_size=4)),
    nullable(JSON.map(lambda v: json.dumps(v, ensure_ascii=False))),
    nullable(st.tuples(JSON, st.booleans()).map(lambda v: json.dumps(v[0], ensure_ascii=v[1], indent=v[1] or None))),
    nullable(st.binary(max_size=16)),
    nullable(st.integers(-(2**31), 2**31 - 1)),
    nullable(st.integers(-(2**63), 2**63 - 1)),
    nullable(NUMERIC),
    nullable(st.booleans()),
)
ROWS = st.lists(ROW, min_size=1, max_size=12)
CHUNK = st.integers(1, 300) | st.just(1 << 20)


@dataclass
class Database:
    """A database on a test cluster holding the test table, with an asyncpg connection on the module's loop."""

    cluster: LocalCluster
    name: str
    connection: asyncpg.Connection[asyncpg.Record]
    runner: asyncio.Runner

    def __repr__(self) -> str:
        return f"<database {self.name} on PostgreSQL {self.cluster.install.major}>"

    def execute(self, sql: str) -> None:
        """Run SQL."""
        self.runner.run(self.connection.execute(sql, timeout=TIMEOUT_S))

    def digest(self, select: str = f"SELECT * FROM {TABLE}") -> str:
        """Row count and md5 of the rows of `select`, as text, in byte order."""
        value = self.runner.run(self.connection.fetchval(DIGEST.format(select=select), timeout=TIMEOUT_S))
        assert isinstance(value, str)
        return value

    def refill(self, rows: Sequence[Row]) -> None:
        """Replace the test table's rows by `rows` (binary COPY: no SQL text involved)."""
        self.execute(f"TRUNCATE {TABLE}")
        copy = self.connection.copy_records_to_table(
            TABLE_NAME, records=rows, columns=[c for c, _ in COLUMNS], schema_name="public", timeout=TIMEOUT_S
        )
        self.runner.run(copy)

    def load(self, sql: bytes, psql: str) -> None:
        """Run a dump with psql, stopping at the first error; fail the test with psql's message."""
        argv = [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.cluster.conninfo(self.name)]
        result = subprocess.run(argv, input=sql, capture_output=True, timeout=TIMEOUT_S, check=False)
        if result.returncode != 0:
            pytest.fail(f"psql exited with {result.returncode}: {result.stderr.decode(errors='replace')[-2000:]}")


MakeDatabase = Callable[[LocalCluster, str], Database]


@pytest.fixture(scope="module")
def newest(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """A cluster of the newest installed major (the module cluster if that is it): it loads every pg_dump's output."""
    installs = find_installs()
    install = installs[max(installs)]
    if install.major == cluster.install.major:
        yield cluster
        return
    running = LocalCluster(install, name=f"roundtrip{install.major}").start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def make_database(cluster: LocalCluster, newest: LocalCluster) -> Iterator[MakeDatabase]:
    """Factory: a new database with the test table (given DDL) on a cluster; connections close before the clusters.

    Both clusters are requested here so that they are torn down after this fixture.
    """
    with asyncio.Runner() as runner:
        made: list[Database] = []

        def make(on: LocalCluster, ddl: str) -> Database:
            name = f"roundtrip_{next(_names)}"
            on.psql(f"CREATE DATABASE {name}")
            on.psql(ddl, dbname=name)
            connection = runner.run(asyncpg.connect(on.dsn(name), timeout=TIMEOUT_S))
            made.append(Database(on, name, connection, runner))
            return made[-1]

        yield make
        for database in made:
            runner.run(database.connection.close(timeout=TIMEOUT_S))


@pytest.fixture(scope="module")
def source(make_database: MakeDatabase, cluster: LocalCluster) -> Database:
    """The source database of the property tests, on the module cluster."""
    return make_database(cluster, TABLE_DDL)


@pytest.fixture(scope="module")
def target(make_database: MakeDatabase, newest: LocalCluster) -> Database:
    """A fresh database with the source's table, on the newest cluster."""
    return make_database(newest, TABLE_DDL)


@pytest.fixture(scope="module")
def dumpers(cluster: LocalCluster) -> list[PgInstall]:
    """The installed pg_dumps that can dump the module cluster, oldest first."""
    return [install for major, install in sorted(find_installs().items()) if major >= cluster.install.major]


def pg_dump(install: PgInstall, database: Database, options: Sequence[str]) -> bytes:
    """A data-only plain-format dump of `database` by the pg_dump of `install`."""
    argv = [install.tool("pg_dump"), "--data-only", *options, "--dbname", database.cluster.conninfo(database.name)]
    result = subprocess.run(argv, capture_output=True, timeout=TIMEOUT_S, check=False)
    if result.returncode != 0:
        pytest.fail(f"pg_dump {options} failed: {result.stderr.decode(errors='replace')[-2000:]}")
    return result.stdout


def transform(dump: bytes, options: TransformOptions, chunk: int) -> bytes:
    """The transformer's output for `dump` fed in pieces of `chunk` bytes."""
    transformer = Transformer(options)
    out: list[bytes] = []
    for start in range(0, len(dump), chunk):
        out += transformer.feed(dump[start : start + chunk])
    return b"".join(out + transformer.close())


def insert_statements(sql: bytes) -> int:
    """How many INSERT statements into the test table start a line of `sql`."""
    return len(re.findall(rb"^INSERT INTO " + re.escape(TABLE.encode()), sql, re.MULTILINE))


SETTINGS = settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(
    rows=ROWS,
    rows_per_statement=st.integers(1, 4),
    max_statement_bytes=st.sampled_from([DEFAULT_MAX_STATEMENT_BYTES, DEFAULT_MAX_STATEMENT_BYTES, 1, 400]),
    rows_per_insert=st.integers(2, 5),
    chunk=CHUNK,
    data=st.data(),
)
def test_every_dump_mode_round_trips_through_the_transformer(
    source: Database,
    target: Database,
    dumpers: list[PgInstall],
    *,
    rows: list[Row],
    rows_per_statement: int,
    max_statement_bytes: int,
    rows_per_insert: int,
    chunk: int,
    data: st.DataObject,
) -> None:
    """Nasty rows dumped as COPY, INSERTs, column INSERTs and multi-row INSERTs, merged and loaded, come out equal."""
    install = data.draw(st.sampled_from(dumpers), label="pg_dump")
    source.refill(rows)
    expected = source.digest()
    assert expected.startswith(f"{len(rows)}:")
    options = TransformOptions(rows_per_statement, max_statement_bytes)
    agents = ("--column-inserts", f"--rows-per-insert={rows_per_statement}")  # the agent's (pg_dump 12+): passed whole
    for mode in (*DUMP_MODES, (f"--rows-per-insert={rows_per_insert}",), agents):
        out = transform(pg_dump(install, source, mode), options, chunk)
        note(f"{mode}: {out.decode(errors='replace')}")
        if mode:
            statements = insert_statements(out)
            assert math.ceil(len(rows) / rows_per_statement) <= statements <= len(rows), mode
            if max_statement_bytes == DEFAULT_MAX_STATEMENT_BYTES:
                assert statements == math.ceil(len(rows) / rows_per_statement), mode
        target.execute(f"TRUNCATE {TABLE}")
        target.load(out, install.tool("psql"))
        assert target.digest() == expected, mode


# The remap under test: rename the weird column, drop one, add constants of four kinds, put them in a new order.
RENAMED = 'Re"named; ) x'
CONSTANT_COLUMN = 'Const; "c"'
CONSTANT_TEXT = "'it''s; );\n\\.\t\r\\N é'"
REMAP_ORDER = (
    "select",
    "amount",
    "flag",
    CONSTANT_COLUMN,
    "big",
    "n",
    "blob",
    "doc",
    "tags",
    "txt",
    RENAMED,
    "rate",
    "missing",
)
TABLE_KEY = json.dumps("public." + TABLE_NAME, ensure_ascii=False)
REMAP_TOML = f"""
[tables.{TABLE_KEY}]
drop = ["raw"]
columns = {json.dumps(REMAP_ORDER, ensure_ascii=False)}

[tables.{TABLE_KEY}.rename]
{json.dumps(WEIRD_COLUMN)} = {json.dumps(RENAMED)}

[tables.{TABLE_KEY}.add]
{json.dumps(CONSTANT_COLUMN)} = {json.dumps(CONSTANT_TEXT, ensure_ascii=False)}
flag = "TRUE"
rate = "-1.5e3"
missing = "NULL"
"""
# The target table's own column order differs from both the dump's and the remap's: loads go by column name.
REMAPPED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("missing", "integer", "NULL::integer"),
    ("txt", "text", "txt"),
    (RENAMED, "text", quote_ident(WEIRD_COLUMN)),
    ("rate", "numeric", "(-1.5e3)::numeric"),
    ("blob", "bytea", "blob"),
    (CONSTANT_COLUMN, "text", f"{CONSTANT_TEXT}::text"),
    ("tags", "text[]", "tags"),
    ("n", "integer", "n"),
    ("flag", "boolean", "TRUE"),
    ("doc", "jsonb", "doc"),
    ("big", "bigint", "big"),
    ("amount", "numeric", "amount"),
    ("select", "boolean", '"select"'),
)
REMAPPED_DDL = f"CREATE TABLE {TABLE} ({', '.join(f'{quote_ident(c)} {t}' for c, t, _ in REMAPPED_COLUMNS)})"
REMAPPED_FROM_SOURCE = f"SELECT {', '.join(e for _, _, e in REMAPPED_COLUMNS)} FROM {TABLE}"


@pytest.fixture(scope="module")
def remap_target(make_database: MakeDatabase, newest: LocalCluster) -> Database:
    """A fresh database with the remapped table, on the newest cluster."""
    return make_database(newest, REMAPPED_DDL)


@pytest.fixture(scope="module")
def remap_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The remap as a TOML file, as an operator would write it."""
    path = tmp_path_factory.mktemp("remap") / "remap.toml"
    path.write_text(REMAP_TOML, encoding="utf-8")
    return path


@SETTINGS
@given(
    rows=ROWS,
    rows_per_statement=st.integers(1, 4),
    rows_per_insert=st.integers(2, 5),
    chunk=CHUNK,
    data=st.data(),
)
def test_remapped_dumps_load_as_the_remapped_projection(
    source: Database,
    remap_target: Database,
    dumpers: list[PgInstall],
    remap_file: Path,
    *,
    rows: list[Row],
    rows_per_statement: int,
    rows_per_insert: int,
    chunk: int,
    data: st.DataObject,
) -> None:
    """COPY and column-INSERT dumps through a rename/drop/add/reorder remap load exactly the SQL projection."""
    install = data.draw(st.sampled_from(dumpers), label="pg_dump")
    options = TransformOptions(rows_per_statement, remap=load_remap(remap_file))
    source.refill(rows)
    expected = source.digest(REMAPPED_FROM_SOURCE)
    assert expected.startswith(f"{len(rows)}:")
    merged = (f"--rows-per-insert={rows_per_insert}", f"--rows-per-insert={rows_per_statement}")  # the agent's: 2nd
    for mode in ((), ("--column-inserts",), *(("--column-inserts", rows) for rows in merged)):
        out = transform(pg_dump(install, source, mode), options, chunk)
        note(f"{mode}: {out.decode(errors='replace')}")
        remap_target.execute(f"TRUNCATE {TABLE}")
        remap_target.load(out, install.tool("psql"))
        assert remap_target.digest() == expected, mode


def fixed_rows(count: int) -> list[Row]:
    """Deterministic rows cycling through the nasty fragments, with NULLs in every column at different rates."""
    rows = []
    for i in range(count):
        text = NASTY[i % len(NASTY)] + str(i) + NASTY[i * 7 % len(NASTY)]
        values = (
            text,
            text[::-1] + "\U0010fffd",
            [text, None, "{a,b}", 'q"', ""][: i % 6],
            json.dumps({text: [i, None, text], "n": i / 7}),
            json.dumps([text, {"k": i}], ensure_ascii=i % 2 == 0),
            text.encode() + bytes([i % 256, 0, 255]),
            i * (-1) ** i,
            i * 10**15,
            Decimal(i).scaleb(-3) if i % 13 else Decimal("NaN"),
            i % 3 == 0,
        )
        rows.append(tuple(None if (i + col) % (col + 5) == 0 else v for col, v in enumerate(values)))
    return rows


@pytest.mark.pg_major(15, 17, 18)
def test_cli_output_loads_for_dumps_of_each_pg_dump_major(
    cluster: LocalCluster, newest: LocalCluster, make_database: MakeDatabase, pg_install: PgInstall
) -> None:
    """pg_dump N | python -m fedload transform | psql N -v ON_ERROR_STOP=1 loads every dump mode exactly."""
    install = pg_install
    on = newest if newest.install.major <= install.major else cluster  # the newest server this pg_dump can dump
    source, target = make_database(on, TABLE_DDL), make_database(newest, TABLE_DDL)
    rows = fixed_rows(150)
    source.refill(rows)
    expected = source.digest()
    assert expected.startswith("150:")
    transformer = [sys.executable, "-m", "fedload", "transform", "--rows-per-statement", "7"]
    for mode in (*DUMP_MODES, ("--rows-per-insert=4",), ("--column-inserts", "--rows-per-insert=3")):
        dump = pg_dump(install, source, mode)
        result = subprocess.run(transformer, input=dump, capture_output=True, timeout=TIMEOUT_S, check=False)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        if mode:
            assert insert_statements(result.stdout) == math.ceil(150 / 7), mode
        target.execute(f"TRUNCATE {TABLE}")
        target.load(result.stdout, install.tool("psql"))
        assert target.digest() == expected, mode


def test_remap_of_an_empty_table_with_a_quoted_name_loads(
    source: Database, remap_target: Database, dumpers: list[PgInstall], remap_file: Path
) -> None:
    """An empty remapped table dumped as column INSERTs (only its 'Data for Name' comment) transforms and loads."""
    source.refill([])
    install = dumpers[0]
    out = transform(pg_dump(install, source, ["--column-inserts"]), TransformOptions(remap=load_remap(remap_file)), 1)
    remap_target.execute(f"TRUNCATE {TABLE}")
    remap_target.load(out, install.tool("psql"))
    assert remap_target.digest() == source.digest(REMAPPED_FROM_SOURCE) == "0:"
