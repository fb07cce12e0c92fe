"""Inserts mode's COPY path (fedload.superhub.literal_copy): tuples go by COPY only where COPY loads exactly what an
INSERT of the same text would, on a real PostgreSQL; everything else keeps the INSERT path."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Iterator

import asyncpg
import pytest
import structlog
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from fedload.localpg import LocalCluster
from fedload.results import Outcome
from fedload.superhub.literal_copy import CSV_NULL, CSV_QUOTE, copy_rows_pattern, csv_rows
from tests.support.federation import Federation, assert_feeders_equal_partitions, sync

TIMEOUT_S = 30.0
# (column, type as declared, type as fedload reads it: format_type without modifiers)
COLUMNS = (
    ("t", "text", "text"),
    ("i", "integer", "integer"),
    ("s", "smallint", "smallint"),
    ("b", "bigint", "bigint"),
    ("n", "numeric", "numeric"),
    ("n2", "numeric(8,2)", "numeric"),
    ("r", "real", "real"),
    ("d", "double precision", "double precision"),
    ("f", "boolean", "boolean"),
    ("dt", "date", "date"),
    ("j", "jsonb", "jsonb"),
    ("v", "varchar(4)", "character varying"),
)
Columns = tuple[tuple[str, str, str], ...]
Sample = tuple[Columns, str]
NASTY = ("'", "''", "\\", "\\.", "\n\\.\n", '"', ",", "\n", "\r\n", "\t", "NULL", "'), (", "');DROP TABLE x;--", "ü")
_tables = itertools.count()


def string_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


texts = st.lists(
    st.one_of(
        st.sampled_from(NASTY), st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=6)
    )
)
strings = texts.map(lambda parts: string_literal("".join(parts)))
signs = st.sampled_from(["", "-", "+"])
integers = st.builds(lambda s, d: s + d, signs, st.from_regex(r"\A[0-9]{1,4}\Z"))
decimals = st.builds(
    lambda s, m, e: s + m + e,
    signs,
    st.from_regex(r"\A(?:[0-9]{1,20}(?:\.[0-9]{0,12})?|\.[0-9]{1,12})\Z"),
    st.sampled_from(["", "", "", "e5", "E-3", "e+2"]),
)
refused = st.sampled_from(["'x'", "''", "' '"])  # invalid for each type but text
refused_integers = st.one_of(refused, st.just("99999999999999999999"))
refused_decimals = st.one_of(refused, st.sampled_from(["1e400", "-1e-400", "1e-400"]))
REFUSED = {"smallint": refused_integers, "integer": refused_integers, "bigint": refused_integers}
REFUSED |= {"numeric": refused_decimals, "real": refused_decimals, "double precision": refused_decimals}
booleans = st.sampled_from(["true", "false"])
# What the pattern must refuse somewhere: other spellings, other literal kinds, expressions.
others = st.sampled_from(["null", "TRUE", "False", "E'a\\nb'", "B'101'", "X'1F'", "DEFAULT", "1::int", "now()", "'x'"])
# Values of the kinds pg_dump writes for each type (strings for all; some of them invalid for the type).
FITTING = {
    "integer": st.one_of(integers, strings),
    "smallint": st.one_of(integers, strings),
    "bigint": st.one_of(integers, strings),
    "numeric": st.one_of(decimals, integers, st.sampled_from(["'NaN'"])),
    "real": st.one_of(decimals, st.sampled_from(["'NaN'", "'-Infinity'", "'-0'"])),
    "double precision": st.one_of(decimals, st.sampled_from(["'Infinity'", "'-0'"])),
    "boolean": st.one_of(booleans, st.sampled_from(["'t'", "'no'"])),
    "date": st.sampled_from(["'2024-02-29'", "'infinity'", "'20240101'", "'2023-02-30'"]),
    "jsonb": st.sampled_from(['\'{"a": [1, null, "\\\\u00fc"]}\'', "'null'", "'{'"]),
}
whitespace = st.sampled_from(["", " ", "  ", "\n", "\t", "\r\n "])


def fitting(base_type: str) -> st.SearchStrategy[str]:
    """Mostly what pg_dump writes for the type, sometimes a value the type refuses (both ways must fail)."""
    fits = FITTING.get(base_type, strings)
    wrong = REFUSED.get(base_type, refused)
    return st.one_of(st.just("NULL"), fits, fits, fits, fits if base_type in ("text", "character varying") else wrong)


def anything(_: str) -> st.SearchStrategy[str]:
    return st.one_of(st.just("NULL"), strings, integers, decimals, booleans, others, refused_integers, refused_decimals)


@st.composite
def samples(draw: st.DrawFn, pick: Callable[[str], st.SearchStrategy[str]], max_columns: int) -> Sample:
    """Some of the columns, and one to four tuples for them with random whitespace around the punctuation."""
    columns = tuple(draw(st.lists(st.sampled_from(COLUMNS), min_size=1, max_size=max_columns, unique=True)))
    rows = []
    for _ in range(draw(st.integers(1, 4))):
        items = [draw(whitespace) + draw(pick(base)) + draw(whitespace) for _, _, base in columns]
        rows.append("(" + ",".join(items) + ")")
    return columns, (draw(whitespace) + "," + draw(whitespace)).join(rows)


@pytest.fixture(scope="module")
def conn(cluster: LocalCluster) -> Iterator[tuple[asyncio.AbstractEventLoop, asyncpg.Connection]]:
    loop = asyncio.new_event_loop()
    connection = loop.run_until_complete(asyncpg.connect(cluster.dsn(), timeout=TIMEOUT_S))
    yield loop, connection
    loop.run_until_complete(connection.close())
    loop.close()


async def load_both(conn: asyncpg.Connection, columns: Columns, tuples: str) -> tuple[object, object]:
    """What an INSERT of the tuples and a COPY of their CSV rows leave in two fresh tables: the rows as text, in
    order, or the failure's SQLSTATE class (22: data, 23: constraint)."""
    n = next(_tables)
    ddl = ", ".join(f"{name} {declared}" for name, declared, _ in columns)
    outcomes: list[object] = []
    transaction = conn.transaction()
    await transaction.start()
    try:
        for way in ("insert", "copy"):
            table = f"lc_{way}_{n}"
            await conn.execute(f"CREATE TABLE {table} ({ddl})")
            try:
                async with conn.transaction():  # a savepoint: the failure of one way leaves the other free
                    if way == "insert":
                        await conn.execute(f"INSERT INTO {table} VALUES {tuples}")
                    else:
                        await conn.copy_to_table(
                            table,
                            source=_once(csv_rows(tuples.encode())),
                            format="csv",
                            quote=CSV_QUOTE,
                            escape=CSV_QUOTE,
                            null=CSV_NULL,
                        )
                outcomes.append(await conn.fetchval(f"SELECT array_agg(r::text ORDER BY ctid) FROM {table} r"))
            except asyncpg.PostgresError as exc:
                outcomes.append(f"error class {exc.sqlstate[:2]}")
    finally:
        await transaction.rollback()
    return outcomes[0], outcomes[1]


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def check_same(conn: tuple[asyncio.AbstractEventLoop, asyncpg.Connection], sample: Sample) -> bool:
    """False if the COPY path refuses the tuples; else asserts it loads what the INSERT loads."""
    columns, tuples = sample
    note(repr(tuples))
    if copy_rows_pattern(tuple(base for _, _, base in columns)).fullmatch(tuples.encode()) is None:
        event("INSERT path")
        return False
    event("COPY path")
    loop, connection = conn
    by_insert, by_copy = loop.run_until_complete(load_both(connection, columns, tuples))
    event(f"INSERT: {'rows' if isinstance(by_insert, list) else by_insert}")
    assert by_copy == by_insert
    return True


_PROPERTY = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@_PROPERTY
@given(sample=samples(fitting, len(COLUMNS)))
def test_the_copy_path_takes_what_pg_dump_writes_and_loads_it_as_an_insert_would(
    conn: tuple[asyncio.AbstractEventLoop, asyncpg.Connection], sample: Sample
) -> None:
    """Values of the kinds pg_dump writes for each column type go by COPY, with the INSERT's rows or its failure."""
    negative_zero = "-0" in sample[1] or "-." in sample[1]  # a float's negative zero keeps the INSERT path
    assert check_same(conn, sample) or negative_zero


@_PROPERTY
@given(sample=samples(anything, 2))
def test_whatever_the_copy_path_takes_it_loads_as_an_insert_would(
    conn: tuple[asyncio.AbstractEventLoop, asyncpg.Connection], sample: Sample
) -> None:
    """Any literal in any column: where the pattern lets it through, COPY and INSERT agree."""
    check_same(conn, sample)


@pytest.mark.parametrize(
    ("base_type", "value"),
    [
        ("double precision", "-0"),  # an INSERT makes it +0 (integer 0 negated), COPY would keep -0
        ("real", "-0.0e5"),
        ("numeric", "1::numeric"),
        ("text", "5"),  # an INSERT writes the integer's text: 007 would become 7
        ("text", "true"),
        ("integer", "1.5"),  # an INSERT rounds it, COPY would refuse it
        ("integer", "true"),
        ("boolean", "1"),  # an INSERT refuses it, COPY would read true
        ("boolean", "TRUE"),
        ("date", "20240101"),
        ("text", "null"),
        ("text", "E'a\\nb'"),
        ("text", "DEFAULT"),
        ("bytea", "X'00'"),
    ],
)
def test_the_copy_path_refuses_values_whose_meaning_copy_would_change(base_type: str, value: str) -> None:
    assert copy_rows_pattern((base_type,)).fullmatch(f"({value})".encode()) is None
    assert copy_rows_pattern((base_type,)).fullmatch(b"('x')") is not None


def test_csv_rows_changes_nothing_inside_strings() -> None:
    tuples = b"(1 , 'a''b\n), (2, ''', NULL ),\n\t(3,'\\.',' NULL')"
    assert copy_rows_pattern(("integer", "text", "text")).fullmatch(tuples) is not None
    assert csv_rows(tuples) == b"1,'a''b\n), (2, ''',NULL\n3,'\\.',' NULL'\n"


async def test_inserts_mode_loads_the_feeders_tables_by_copy(federation: Federation) -> None:
    """A sync in inserts mode loads every INSERT tuple of pg_dump's output through the COPY path, exactly."""
    config = federation.config(dump_mode="inserts")
    in_process = config.superhub.model_copy(update={"worker_processes": 0})  # where the test reads the log events
    with structlog.testing.capture_logs() as logs:
        runs = await sync(config.model_copy(update={"superhub": in_process}))
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 3, [r.error for r in runs]
    assert_feeders_equal_partitions(federation)
    loaded = [e for e in logs if e["event"] == "import.table_loaded" and e.get("mode") == "inserts"]
    assert len(loaded) == 6
    assert all(e["rows_by_copy"] == e["rows"] > 0 for e in loaded), loaded
