"""Inserts mode reads each merged statement once: the splitter matches the importer's COPY-rows pattern where the
tuples start (transforms.inserts.CheckedInserts), and that one pass gives exactly what the usual reading gives (the
lexical scan for the `;`, the tuple scan, then the importer's check of the tuples), on any dump, cut anywhere."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from fedload.errors import DumpError
from fedload.names import TableName, TablePattern
from fedload.results import Outcome
from fedload.stream import MAX_BLOCK_BYTES
from fedload.superhub.importer import Importer, ImportPolicy
from fedload.superhub.literal_copy import copy_rows_pattern, csv_rows
from fedload.superhub.schema import Column, ParentTable
from tests.support.federation import SCHEMA, Federation, crafted_stream, new_database, sync, write_script
from transforms import DumpSplitter, DumpSyntaxError, InsertRows, Item

# (table as written, columns as written, the superhub's base types)
TARGETS: tuple[tuple[bytes, tuple[bytes, ...], tuple[str, ...]], ...] = (
    (b"public.t", (b"a", b"b", b"c"), ("integer", "text", "boolean")),
    (b'public."T;2"', (b'"x,y"', b"z"), ("numeric", "text[]")),
)
PATTERNS: dict[tuple[bytes, tuple[bytes, ...] | None], re.Pattern[bytes]] = {
    (table, columns): copy_rows_pattern(types) for table, columns, types in TARGETS
}
NASTY = ("'", "''", ";", "),(", "), (", "\n", "\r\n", "\t", "--", "/*", "*/", "$$", "E'", '"', ",", "\\", "NULL", "ü")
strings = st.lists(st.one_of(st.sampled_from(NASTY), st.text("ab ;,()'\n-$*/\\", max_size=4)), max_size=5).map(
    lambda parts: "'" + "".join(parts).replace("'", "''") + "'"
)
numbers = st.one_of(st.integers(-(10**6), 10**6).map(str), st.sampled_from(["1.5", "-0", "-0.0", ".5", "1e5", "+3"]))
# Values no COPY-rows pattern takes: the statement must be read the usual way and loaded by INSERT (or rejected).
others = st.sampled_from(
    ["E'a\\'b;'", "DEFAULT", "null", "TRUE", "B'101'", "X'1F'", "1::int", "now()", "(1)", "/* ; */ 1", "-- ;\n1"]
)
VALUE = {
    "integer": st.one_of(st.just("NULL"), numbers, strings),
    "text": st.one_of(st.just("NULL"), strings, strings),
    "boolean": st.one_of(st.just("NULL"), st.sampled_from(["true", "false"]), strings),
    "numeric": st.one_of(st.just("NULL"), numbers, strings),
    "text[]": st.one_of(st.just("NULL"), strings),
}
SPACE = st.sampled_from(["", " ", "\n\t", "  "])


@st.composite
def insert_statement(draw: st.DrawFn) -> str:
    """A multi- or single-row INSERT into one of the targets, mostly of values its pattern takes."""
    table, columns, types = draw(st.sampled_from(TARGETS))
    rows = []
    for _ in range(draw(st.integers(1, 4))):
        values = [draw(others if draw(st.integers(0, 15)) == 0 else VALUE[t]) for t in types]
        rows.append("(" + draw(st.sampled_from([", ", ",", " , "])).join(values) + ")")
    tail = draw(st.sampled_from(["", "", " ON CONFLICT DO NOTHING", " ", "\n"]))
    head = f"INSERT INTO {table.decode()} ({', '.join(c.decode() for c in columns)}) VALUES"
    return head + draw(SPACE) + (draw(SPACE) + "," + draw(SPACE)).join(rows) + tail + ";\n"


OTHER_ITEMS = st.sampled_from(
    [
        "SET statement_timeout = 0;\n",
        "-- Data for Name: t; Type: TABLE DATA\n",
        "\n",
        "SELECT 'x;y';\n",
        "INSERT INTO public.other (a) VALUES (1), (2);\n",
        "COPY public.t (a, b, c) FROM stdin;\n1\tx\tt\n\\.\n",
    ]
)


@st.composite
def dumps(draw: st.DrawFn) -> bytes:
    """Statements of a merged inserts-mode dump, sometimes cut short or with a byte changed."""
    dump = "".join(draw(st.lists(st.one_of(insert_statement(), insert_statement(), OTHER_ITEMS), max_size=8)))
    data = dump.encode()
    change = draw(st.sampled_from(["none", "none", "none", "cut", "flip"]))
    if data and change == "cut":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif data and change == "flip":
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.sampled_from(b"';,()\n"))]) + data[at + 1 :]
    return data


def split(data: bytes, chunk: int, *, checked: bool) -> list[Item] | str:
    """The items of `data` fed in chunks of `chunk` bytes (with the targets' patterns if `checked`), or the
    error."""
    splitter = DumpSplitter()
    if checked:
        splitter.read_tuples_with(lambda table, columns: PATTERNS.get((table, columns)))
    items: list[Item] = []
    try:
        for start in range(0, len(data), chunk):
            items += splitter.feed(data[start : start + chunk])
        return items + splitter.close()
    except DumpSyntaxError as exc:
        return str(exc)


def copy_rows(item: InsertRows) -> bytes | None:
    """What the importer sends by COPY for the item (None: the INSERT path), deciding as before the one pass."""
    pattern = PATTERNS.get((item.insert.table, item.insert.columns))
    if pattern is None or pattern.fullmatch(item.insert.values) is None:
        return None
    return csv_rows(item.insert.values)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=dumps(), chunk=st.one_of(st.integers(1, 40), st.just(1 << 20)))
def test_the_one_pass_reads_every_dump_as_the_usual_reading_does(data: bytes, chunk: int) -> None:
    """Same items, lines, offsets and errors; the statements it marks are those the importer's check would
    take, and their COPY rows are the same."""
    note(repr(data))
    usual, once = split(data, chunk, checked=False), split(data, chunk, checked=True)
    assert once == usual
    if isinstance(once, str):
        event("rejected")
        return
    for old, new in zip(usual, once, strict=True):
        if not isinstance(new, InsertRows):
            continue
        assert isinstance(old, InsertRows)
        pattern = new.insert.checked_by
        event("read in one pass" if pattern is not None else "read the usual way")
        if pattern is not None:
            assert pattern is PATTERNS[(new.insert.table, new.insert.columns)]
            assert pattern.fullmatch(old.insert.values) is not None
            assert csv_rows(new.insert.values) == copy_rows(old)


class RecordingConnection:
    """What the importer needs of asyncpg's connection: records what it is sent, COPY data as it is read."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes]] = []  # ("copy", table, data) or ("execute", sql, b"")

    async def execute(self, sql: str) -> str:
        self.sent.append(("execute", sql, b""))
        return "INSERT 0 0"

    async def copy_to_table(self, name: str, *, source: AsyncIterator[bytes], **options: object) -> str:
        self.sent.append(("copy", name, b""))
        at = len(self.sent) - 1
        try:
            async for data in source:
                self.sent[at] = ("copy", name, self.sent[at][2] + data)
        except Exception:
            self.sent.append(("aborted", name, b""))  # asyncpg: CopyFail and a cancel request to the server
            raise
        return "COPY 0"

    def merged(self) -> list[tuple[str, str, bytes]]:
        """What was sent, with consecutive COPYs into one table as one."""
        out: list[tuple[str, str, bytes]] = []
        for kind, what, data in self.sent:
            if kind == "copy" and out and out[-1][:2] == (kind, what):
                out[-1] = (kind, what, out[-1][2] + data)
            else:
                out.append((kind, what, data))
        return out


def importer(connection: RecordingConnection, kind: type[Importer] = Importer) -> Importer:
    """An importer of the targets' tables (public.other matches the tables configured, but has no parent)."""
    parents = {}
    for table, columns, types in TARGETS:
        name = TableName.from_dump(table)
        names = [*(c.decode().strip('"') for c in columns), "hub_id"]
        columns_sql = tuple(Column(n, t, False, None, None, t) for n, t in zip(names, (*types, "integer"), strict=True))
        parents[name] = ParentTable(name, columns_sql, ())
    policy = ImportPolicy("hub_id", (TablePattern("public.*"),))
    conn: Any = connection  # asyncpg's, as far as the importer looks
    return kind(conn, feeder="f", key=1, stage_prefix="s", parents=parents, policy=policy)


class StatementByStatement(Importer):
    """The importer before runs: one COPY per statement."""

    async def _next_in_run(self, items: Any) -> InsertRows | None:
        if (item := await anext(items, None)) is not None:
            items.give_back(item)
        return None


async def load(items: Sequence[Item], error: str | None, kind: type[Importer]) -> tuple[RecordingConnection, str]:
    """What an importer of `kind` sends for the items (then the splitter's error, if any), and how it ends."""

    async def stream() -> AsyncIterator[Item]:
        for item in items:
            yield item
        if error is not None:
            raise DumpSyntaxError(error, line=0, offset=0)

    connection = RecordingConnection()
    try:
        await importer(connection, kind).load(stream())
    except (DumpError, DumpSyntaxError) as exc:
        return connection, f"{type(exc).__name__}: {exc}"
    return connection, "loaded"


def items_and_error(data: bytes, chunk: int) -> tuple[list[Item], str | None]:
    """The items the importer's splitter gives for `data` fed in chunks, up to its error if any."""
    splitter = DumpSplitter()
    splitter.read_tuples_with(lambda table, columns: PATTERNS.get((table, columns)))
    items: list[Item] = []
    try:
        for start in range(0, len(data), chunk):
            items += splitter.feed(data[start : start + chunk])
        return items + splitter.close(), None
    except DumpSyntaxError as exc:
        return items, str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=dumps(), chunk=st.one_of(st.integers(1, 40), st.just(1 << 20)))
def test_a_run_of_statements_by_one_copy_sends_what_one_copy_each_sends(data: bytes, chunk: int) -> None:
    """The importer loads a run of statements COPY may take by one COPY: it sends the same rows, INSERTs and
    statements in the same order as with one COPY per statement, never more COPYs, and ends the same way."""
    note(repr(data))
    items, error = items_and_error(data, chunk)
    runs, runs_end = asyncio.run(load(items, error, Importer))
    each, each_end = asyncio.run(load(items, error, StatementByStatement))
    assert (runs.merged(), runs_end) == (each.merged(), each_end)
    copies = sum(kind == "copy" for kind, _, _ in runs.sent)
    assert copies <= sum(kind == "copy" for kind, _, _ in each.sent)
    event(f"{copies} COPYs, ends {runs_end.split(':')[0]}")


RUNS = (
    b"INSERT INTO public.t (a, b, c) VALUES (1, 'x', true), (2, 'y', NULL);\n\n"
    b"INSERT INTO public.t (a, b, c) VALUES (3, 'z', true), (4, '),(', NULL);\n"
    b"INSERT INTO public.t (a, b, c) VALUES (5, E'e', true), (6, 'y', NULL);\n"
    b"INSERT INTO public.t (a, b, c) VALUES (7, 'x', true), (8, 'y', NULL);\n"
    b"-- a comment\n"
    b"INSERT INTO public.t (a, b, c) VALUES (9, 'x', true), (10, 'y', NULL);\n"
    b"SET statement_timeout = 0;\n"
)


async def test_each_run_of_statements_copy_may_take_is_loaded_by_one_copy() -> None:
    """The statements of a run go by one COPY, past blank lines and comments, up to one that takes the INSERT path
    or another statement."""
    items, error = items_and_error(RUNS, 1 << 20)
    connection, end = await load(items, error, Importer)
    assert end.startswith("DumpError: the dump of feeder f lacks table(s) public.T;2")
    sent = [(kind, data) for kind, what, data in connection.sent if not what.startswith("CREATE TABLE")]
    assert sent == [
        ("copy", b"1,'x',true\n2,'y',NULL\n3,'z',true\n4,'),(',NULL\n"),
        ("execute", b""),
        ("copy", b"7,'x',true\n8,'y',NULL\n9,'x',true\n10,'y',NULL\n"),
    ]


async def test_an_error_in_a_run_is_raised_once_its_copy_has_ended() -> None:
    """A bad statement (or a bad dump) in the middle of a run ends the COPY, then fails the load, as between
    statements: never from inside the COPY, which asyncpg would abort with a cancel request to the server."""
    dump = RUNS.replace(b"(4, '),(', NULL)", b"(4, '\0', NULL)")
    for bad, error in ((dump, "dump line 3: a VALUES tuple contains a NUL byte"), (RUNS[:140], "input ends")):
        items, splitter_error = items_and_error(bad, 64)
        connection, end = await load(items, splitter_error, Importer)
        assert error in end
        assert [kind for kind, _, _ in connection.sent][-1] == "copy"
        assert connection.sent[-1][2] == b"1,'x',true\n2,'y',NULL\n"


MERGED = (
    b"SET statement_timeout = 0;\n"
    b"INSERT INTO public.t (a, b, c) VALUES\n\t(1, 'x;y', true),\n\t(-2, '), (''', NULL),\n\t(NULL, NULL, false);\n"
    b"INSERT INTO public.t (a, b, c) VALUES\n\t(3, 'a\nb', true),\n\t(4, '', false) ON CONFLICT DO NOTHING;\n"
    b'INSERT INTO public."T;2" ("x,y", z) VALUES (1.5e3, \'{a,"b c"}\'), (NULL, NULL);\n'
)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_merged_statements_of_known_targets_are_read_in_one_pass(chunk: int) -> None:
    """Each multi-row INSERT whose target the importer gave a pattern for is marked as checked by it."""
    inserts = [i for i in split(MERGED, chunk, checked=True) if isinstance(i, InsertRows)]
    assert [i.insert.checked_by for i in inserts] == [PATTERNS[(b"public.t", (b"a", b"b", b"c"))]] * 2 + [
        PATTERNS[(b'public."T;2"', (b'"x,y"', b"z"))]
    ]
    assert [i.line for i in inserts] == [2, 6, 10]


@pytest.mark.parametrize(
    ("statement", "why"),
    [
        (b"INSERT INTO public.t (a, b, c) VALUES (1, 'x', true);\n", "a single tuple may start a run"),
        (b"INSERT INTO public.t (a, b, c) VALUES (1, 'x', true), (2, E'y', true);\n", "an E'' literal"),
        (b"INSERT INTO public.t (a, b, c) VALUES (1, 'x', true), (2, 'y', DEFAULT);\n", "DEFAULT"),
        (b"INSERT INTO public.t (a, b, c) VALUES (1, 'x', true), (2, 'y' /* ; */, true);\n", "a comment"),
        (b"INSERT INTO public.t (a, c, b) VALUES (1, true, 'x'), (2, true, 'y');\n", "other columns"),
        (b"INSERT INTO t (a, b, c) VALUES (1, 'x', true), (2, 'y', true);\n", "the table written otherwise"),
    ],
)
def test_other_statements_are_read_the_usual_way(statement: bytes, why: str) -> None:
    """What the pattern does not take whole, or another target, is read and checked as before."""
    (item,) = [i for i in split(statement, 1 << 20, checked=True) if isinstance(i, InsertRows)]
    assert item.insert.checked_by is None, why
    assert split(statement, 1 << 20, checked=True) == split(statement, 1 << 20, checked=False)


def test_a_cut_off_statement_waits_and_is_read_once_whole() -> None:
    """A statement cut by the end of the input so far is completed by the next chunk, then read in one pass."""
    splitter = DumpSplitter()
    splitter.read_tuples_with(lambda table, columns: PATTERNS.get((table, columns)))
    statement = MERGED.split(b"\n", 1)[1].split(b";\n", 1)[0] + b";"
    cut = statement.index(b"'x;") + 2
    assert splitter.feed(statement[:cut]) == []
    (item,) = splitter.feed(statement[cut:])
    assert isinstance(item, InsertRows)
    assert item.insert.checked_by is not None
    assert re.fullmatch(rb"\(1, 'x;y', true\),\n\t.*NULL, false\)", item.insert.values, re.DOTALL)


HOSTS = b"INSERT INTO public.hosts (hostkey, name, site, seen, online) VALUES\n\t"
HOST_ROW = "('SHA={n}', 'host {n} '' ; ), (''{n}'' \n\t-- /* $$', {site}, '2024-05-01 00:{m:02d}:00+00', {online})"
HOSTS_DIGEST = "hostkey || coalesce(name, '~') || coalesce(site, '~') || seen::text || coalesce(online::text, '~')"


def merged_hosts_dump(statements: int, rows: int) -> bytes:
    """A merged inserts-mode dump of hosts, of several stream blocks (1 MiB). Every fifth statement has an E''
    literal, which only the INSERT path takes."""
    out = [b"SET client_encoding = 'UTF8';\nSET standard_conforming_strings = on;\n\n"]
    for s in range(statements):
        values = [
            HOST_ROW.format(n=s * rows + r, m=r % 60, site="NULL" if r % 3 else "'x'", online=("true", "NULL")[r % 2])
            for r in range(rows)
        ]
        if s % 5 == 4:
            values[-1] = values[-1].replace("'x'", "E'x\\\\'").replace("NULL, '2024", "E'\\\\', '2024", 1)
        out.append(HOSTS + ",\n\t".join(values).encode() + b";\n\n")
    return b"".join(out)


async def test_a_merged_dump_loads_in_one_pass_as_psql_loads_it(federation: Federation) -> None:
    """Through the whole sync: the statements without an E'' literal are read in one pass and loaded by COPY, the
    others by INSERT, and the rows equal those psql loads from the same INSERTs."""
    dump = merged_hosts_dump(statements=30, rows=1200)
    assert len(dump) > 3 * MAX_BLOCK_BYTES
    path = federation.tmp / "merged.bin"
    path.write_bytes(crafted_stream(dump, mode="inserts"))
    script = write_script(federation.tmp / "merged.sh", f"cat {path}\n")
    config = federation.config(agent_command=[script], exclude_tables=["public.contexts"], dump_mode="inserts")
    in_process = config.superhub.model_copy(update={"worker_processes": 0})  # where the test reads the log events
    with structlog.testing.capture_logs() as logs:
        (run,) = await sync(config.model_copy(update={"superhub": in_process}), "hub1")
    assert run.outcome == Outcome.SUCCESS, run.error
    (loaded,) = [e for e in logs if e["event"] == "import.table_loaded" and e.get("mode") == "inserts"]
    assert loaded["rows"] == 30 * 1200
    assert loaded["statements_read_once"] == 24  # all but those with an E'' literal
    assert loaded["rows_by_copy"] == 24 * 1200
    reference = new_database(federation.cluster, "psql_loaded", SCHEMA)
    federation.cluster.psql(dump.decode(), dbname=reference)
    assert federation.digest(federation.superhub, "hosts", HOSTS_DIGEST, "WHERE hub_id = 1") == federation.digest(
        reference, "hosts", HOSTS_DIGEST
    )
