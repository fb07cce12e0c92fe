"""Merging and remapping on whole dumps, without a database."""

from __future__ import annotations

import re
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transforms.inserts
import transforms.split
from tests.transforms.test_interpreters import STATEMENT, TABLES, TEXT, VALUE, standard_literal
from transforms import (
    DEFAULT_MAX_STATEMENT_BYTES,
    DumpSplitter,
    DumpSyntaxError,
    InsertRows,
    RemapError,
    Transformer,
    TransformError,
    TransformOptions,
    Verbatim,
    parse_remap,
)

COLUMN_INSERTS = b"".join(
    b"INSERT INTO public.hosts (hostkey, name, seen) VALUES ('SHA=%d', 'host;%d''s\n', %d);\n" % (i, i, i)
    for i in range(10)
)


def transform(data: bytes, options: TransformOptions | None = None, chunk: int = 7) -> bytes:
    """Run the transformer over `data` cut into chunks."""
    transformer = Transformer(options)
    out: list[bytes] = []
    for start in range(0, len(data), chunk):
        out += transformer.feed(data[start : start + chunk])
    return b"".join(out + transformer.close())


def test_consecutive_inserts_merge_within_the_row_cap() -> None:
    """Ten single-row INSERTs with rows_per_statement=4 become statements of 4, 4 and 2 rows."""
    out = transform(COLUMN_INSERTS, TransformOptions(rows_per_statement=4))
    statements = out.split(b";\n")[:-1]
    assert len(statements) == 3
    assert [s.count(b"('SHA=") for s in statements] == [4, 4, 2]
    assert statements[0].startswith(b"INSERT INTO public.hosts (hostkey, name, seen) VALUES\n\t('SHA=0', ")
    assert b"'host;9''s\n', 9)" in statements[2]


def test_byte_cap_splits_but_a_single_large_row_passes() -> None:
    """max_statement_bytes bounds merged statements; a row larger than the cap is a statement alone."""
    big = b"INSERT INTO t (a) VALUES ('" + b"x" * 5000 + b"');\n"
    small = b"INSERT INTO t (a) VALUES ('y');\n"
    out = transform(small * 3 + big + small * 3, TransformOptions(max_statement_bytes=1024))
    assert [s.count(b"\t(") for s in out.split(b";\n")[:-1]] == [3, 1, 3]


def test_multi_row_input_is_rebatched() -> None:
    """pg_dump --rows-per-insert output is split and joined to the configured size."""
    dump = b"INSERT INTO t VALUES\n\t(1),\n\t(2),\n\t(3);\nINSERT INTO t VALUES\n\t(4),\n\t(5),\n\t(6);\n"
    out = transform(dump, TransformOptions(rows_per_statement=4))
    assert out == b"INSERT INTO t VALUES\n\t(1),\n\t(2),\n\t(3),\n\t(4);\nINSERT INTO t VALUES\n\t(5),\n\t(6);\n"


ROWS_PER_INSERT_3 = (
    b"INSERT INTO public.t (a, b) VALUES\n\t(1, 'x;y''z\n'),\n\t(-2, NULL),\n\t(3, '--');\n"
    b"INSERT INTO public.t (a, b) VALUES\n\t(4, '/* $$'),\n\t(5, e),\n\t(6, \"q\");\n"
    b"INSERT INTO public.t (a, b) VALUES\n\t(7, '');\n"
)


@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_statements_pg_dump_merged_pass_unchanged_without_splitting_their_tuples(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """pg_dump --rows-per-insert statements of exactly rows_per_statement rows go on as written and are counted,
    at any chunking, without splitting their tuples (which the one counting pass makes needless)."""
    transform(ROWS_PER_INSERT_3, TransformOptions(rows_per_statement=3))  # compiles what is compiled lazily
    monkeypatch.setattr(transforms.inserts, "find_tuples", _no_split)
    transformer = Transformer(TransformOptions(rows_per_statement=3))
    out: list[bytes] = []
    whole = ROWS_PER_INSERT_3[: ROWS_PER_INSERT_3.rindex(b"INSERT")]  # the last statement is short: batched
    for start in range(0, len(whole), chunk):
        out += transformer.feed(whole[start : start + chunk])
    assert b"".join(out + transformer.close()) == whole
    assert transformer.stats.rows == {("public", "t"): 6}


def _no_split(text: bytes) -> list[bytes]:
    raise AssertionError(f"tuples split: {text[:40]!r}")


@pytest.mark.parametrize(
    "tuple_text",
    [b"(2 -- );\n)", b"(2 /* ); */)", b"(E'\\'', 2)", b"(2, $$);$$)", b"((2), 3)"],
    ids=["line comment", "block comment", "escape literal", "dollar quote", "nested parentheses"],
)
def test_a_tuple_pg_dump_never_writes_is_read_as_the_server_reads_it(tuple_text: bytes) -> None:
    """A comment, E'' literal, dollar quote or parentheses in a tuple (a `;` or `)` inside them ends nothing) leave
    the one-pass read to the exact patterns: the statement and the next come out as the usual path makes them."""
    dump = b"INSERT INTO t (a) VALUES\n\t(1),\n\t" + tuple_text + b";\nINSERT INTO t (a) VALUES\n\t(3),\n\t(4);\n"
    options = TransformOptions(rows_per_statement=2)
    assert transform(dump, options) == _usual_way(lambda: transform(dump, options))


def _usual_way(work: object) -> object:
    """What `work` gives with every INSERT read the usual way (the way before the one-pass read and pieces)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transforms.split, "read_plain_insert", lambda _buf, pos: pos)
        patch.setattr(transforms.split, "first_insert_piece", lambda _buf, _pos: None)
        return work()  # type: ignore[operator]


PIECES_REFUSED = "an INSERT handed on in pieces"


def _statement_of(rows: int, width: int = 1000) -> bytes:
    return b"INSERT INTO public.t (a, b) VALUES\n\t" + b",\n\t".join(
        b"(%d, '%s')" % (i, b"x" * width) for i in range(rows)
    )


def test_a_long_statement_is_handed_on_in_pieces_in_bounded_memory() -> None:
    """A 32 MiB pg_dump statement, with a 1 MiB statement cap: every row counted and in the output, while the
    transformer holds a few MiB, not the statement (held whole, it holds several times its size)."""
    dump = _statement_of(32 * 1024) + b";\n"
    transformer = Transformer(TransformOptions(max_statement_bytes=1 << 20))
    tracemalloc.start()
    try:
        out = [piece for start in range(0, len(dump), 1 << 20) for piece in _counts(transformer, dump, start)]
        out += [_count(b"".join(transformer.close()))]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert transformer.stats.rows == {("public", "t"): 32 * 1024}
    assert sum(tuples for tuples, _ in out) == 32 * 1024  # each tuple after "\n\t", in pg_dump's layout and ours
    assert sum(statements for _, statements in out) >= 32  # each within the cap
    assert peak < 16 << 20, f"held {peak >> 20} MiB"


def _counts(transformer: Transformer, dump: bytes, start: int) -> list[tuple[int, int]]:
    return [_count(b"".join(transformer.feed(dump[start : start + (1 << 20)])))]


def _count(out: bytes) -> tuple[int, int]:
    """Tuples and statements of the output (not kept: the memory measured is the transformer's)."""
    return out.count(b"\n\t("), out.count(b"INSERT INTO")


@pytest.mark.parametrize(
    ("end", "message"),
    [
        (b",\n\t(1, E'x');\n", PIECES_REFUSED),
        (b",\n\t(1, 'x') -- ;\n;\n", PIECES_REFUSED),
        (b" ON CONFLICT DO NOTHING;\n", PIECES_REFUSED),
        (b",\n\t(1, 'x", "the input ends inside this statement"),
    ],
    ids=["escape literal", "comment", "on conflict", "cut off"],
)
@pytest.mark.parametrize("chunk", [1000, 50_000])  # less than the statement: it arrives cut off
def test_a_statement_in_pieces_that_ends_otherwise_than_pg_dump_s_is_an_error(
    end: bytes, message: str, chunk: int
) -> None:
    """Once the first piece is on its way, the statement must go on and end as pg_dump writes it; else one
    DumpSyntaxError, not rows of another meaning."""
    with pytest.raises(DumpSyntaxError, match=message):
        transform(_statement_of(300) + end, TransformOptions(max_statement_bytes=10_000), chunk)


PLAIN_VALUE = st.one_of(
    st.integers(-(10**6), 10**6).map(str), st.sampled_from(["NULL", "true", "-0.5", "1e5"]), TEXT.map(standard_literal)
)


@st.composite
def multi_row_insert(draw: st.DrawFn) -> str:
    """A multi-row INSERT as pg_dump --rows-per-insert writes it (sometimes laid out otherwise), its values as pg_dump
    writes them but now and then one it never writes (an E'' literal, nested parentheses)."""
    value = st.one_of(PLAIN_VALUE, PLAIN_VALUE, PLAIN_VALUE, VALUE) if draw(st.booleans()) else PLAIN_VALUE
    count = draw(st.sampled_from([1, 2, 3, 3, 3, 4, 8]))  # 3 often: the test's rows_per_statement, mostly
    rows = draw(st.lists(st.lists(value, min_size=2, max_size=2).map(", ".join), min_size=count, max_size=count))
    table = draw(st.sampled_from(TABLES))
    columns = " (a, b)" if table == "public.r" or draw(st.booleans()) else ""
    separator = draw(st.sampled_from([",\n\t", ",\n\t", ", ", ","]))
    tail = " ON CONFLICT DO NOTHING" if draw(st.integers(0, 5)) == 0 else ""
    return f"INSERT INTO {table}{columns} VALUES\n\t(" + f"){separator}(".join(rows) + f"){tail};\n"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(STATEMENT, multi_row_insert(), multi_row_insert()), min_size=1, max_size=12),
    st.sampled_from([1, 3, 17, 1 << 20]),
    st.sampled_from([1, 2, 3, 3]),
    st.sampled_from([DEFAULT_MAX_STATEMENT_BYTES, DEFAULT_MAX_STATEMENT_BYTES, 8, 30]),
)
def test_the_one_pass_read_transforms_as_the_usual_way(
    statements: list[str], chunk: int, rows: int, max_bytes: int
) -> None:
    """For any dump of the interpreters' corpus: the same rows into the same targets in the same order between the
    same other statements, the same counts, or the same error, whether INSERTs are read in one pass (and in pieces,
    with a small statement cap) or not; but for a statement in pieces that goes on otherwise than pg_dump's, which
    is refused."""
    dump = "".join(statements).encode()
    options = TransformOptions(rows_per_statement=rows, max_statement_bytes=max_bytes)
    outcome = _outcome(dump, options, chunk)
    if not (isinstance(outcome, tuple) and PIECES_REFUSED in str(outcome[1])):
        assert outcome == _usual_way(lambda: _outcome(dump, options, chunk))


def _outcome(dump: bytes, options: TransformOptions, chunk: int) -> object:
    """The transform's error, or its rows per table and what its output holds: each tuple with its INSERT's
    target, and every other item, in order (statement boundaries aside: a statement passed whole is not cut as
    the batcher would cut a run of smaller ones)."""
    transformer = Transformer(options)
    out: list[bytes] = []
    try:
        for start in range(0, len(dump), chunk):
            out += transformer.feed(dump[start : start + chunk])
        out += transformer.close()
    except TransformError as exc:
        return type(exc).__name__, str(exc)
    return sorted(transformer.stats.rows.items()), sorted(transformer.stats.tables), _contents(b"".join(out))


def _contents(text: bytes) -> list[object]:
    splitter = DumpSplitter()
    contents: list[object] = []
    for item in splitter.feed(text) + splitter.close():
        if isinstance(item, InsertRows):
            insert = item.insert
            target = (insert.table, insert.columns, insert.overriding, insert.on_conflict_do_nothing)
            contents += [(target, row) for row in insert.tuples]
        elif not isinstance(item, Verbatim):
            contents.append((type(item).__name__, getattr(item, "text", getattr(item, "data", b""))))
    return contents


def test_different_targets_and_other_statements_are_not_merged() -> None:
    """A change of table, column list or an unrelated statement ends a batch; order is kept."""
    dump = (
        b"INSERT INTO a (x) VALUES (1);\nINSERT INTO a (y) VALUES (2);\nSET x = 1;\n"
        b"INSERT INTO b (x) VALUES (3);\nINSERT INTO b (x) VALUES (4);\n"
    )
    out = transform(dump)
    assert re.findall(rb"INSERT INTO (\w+ \(\w\))", out) == [b"a (x)", b"a (y)", b"b (x)"]
    assert out.index(b"SET x = 1;") < out.index(b"INSERT INTO b")


def test_everything_else_passes_through_unchanged() -> None:
    """A dump without INSERTs comes out byte for byte."""
    dump = b"--\n-- c\n\\restrict k\nSET a = 1;\nCOPY t (a) FROM stdin;\n1\n\\.\n\n\\unrestrict k\n"
    assert transform(dump, chunk=3) == dump


def test_row_counts_per_table() -> None:
    """Stats count rows of INSERTs and COPY blocks per schema-qualified table."""
    transformer = Transformer()
    transformer.feed(COLUMN_INSERTS + b'COPY "Other"."T" (a) FROM stdin;\n1\n2\n\\.\n')
    transformer.feed(b'COPY "a"."b.c" (a) FROM stdin;\n1\n\\.\nCOPY "a.b"."c" (a) FROM stdin;\n1\n2\n3\n\\.\n')
    transformer.close()
    expected = {("public", "hosts"): 10, ("Other", "T"): 2, ("a", "b.c"): 1, ("a.b", "c"): 3}
    assert transformer.stats.rows == expected
    assert transformer.stats.tables == set(expected)  # a dot in a name never reads as the separator


REMAP = parse_remap(
    {
        "tables": {
            "hosts": {
                "rename": {"name": "hostname"},
                "drop": ["seen"],
                "add": {"site": "'eu''west'", "tier": "2", "gone": "NULL"},
                "columns": ["site", "hostname", "hostkey", "tier", "gone"],
            }
        }
    }
)


def test_remap_edits_insert_columns_and_tuples() -> None:
    """Rename, drop, add and reorder apply to the column list and every tuple."""
    out = transform(COLUMN_INSERTS[: COLUMN_INSERTS.index(b"\n", 80) + 1], TransformOptions(remap=REMAP))
    assert out == (
        b'INSERT INTO public.hosts ("site", "hostname", hostkey, "tier", "gone") VALUES\n'
        b"\t('eu''west', 'host;0''s\n', 'SHA=0', 2, NULL);\n"
    )


def test_remap_edits_copy_header_and_rows() -> None:
    """The same rules apply to COPY blocks, with constants in COPY text form."""
    dump = b"COPY public.hosts (hostkey, name, seen) FROM stdin;\nk1\tn\\t1\t5\nk2\t\\N\t6\n\\.\n"
    out = transform(dump, TransformOptions(remap=REMAP))
    assert out == (
        b'COPY public.hosts ("site", "hostname", hostkey, "tier", "gone") FROM stdin;\n'
        b"eu'west\tn\\t1\tk1\t2\t\\N\neu'west\t\\N\tk2\t2\t\\N\n\\.\n"
    )


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"rename": {"nope": "x"}}, "column 'nope' is not in the dump's columns"),
        ({"drop": ["nope"]}, "column 'nope' is not in the dump's columns"),
        ({"add": {"name": "1"}}, "column 'name' to add is already in the dump"),
        ({"columns": ["hostkey"]}, "'columns' must list exactly the columns"),
    ],
)
def test_remap_that_does_not_fit_the_dump_is_an_error(rules: dict[str, object], message: str) -> None:
    """Rules naming unknown columns, or an incomplete order, raise RemapError."""
    with pytest.raises(RemapError, match=message):
        transform(COLUMN_INSERTS, TransformOptions(remap=parse_remap({"tables": {"hosts": rules}})))


def test_remap_of_a_table_missing_from_the_dump_is_an_error() -> None:
    """A remapped table that never appears in the dump is reported at the end."""
    remap = parse_remap({"tables": {"public.nothere": {"drop": ["x"]}}})
    with pytest.raises(RemapError, match=r"not in the dump: public\.nothere"):
        transform(COLUMN_INSERTS, TransformOptions(remap=remap))


def test_remap_of_an_empty_table_named_in_a_data_comment_is_fine() -> None:
    """pg_dump's 'Data for Name' comment marks a table as present even with no rows."""
    remap = parse_remap({"tables": {"public.empty": {"drop": ["x"]}}})
    dump = b"--\n-- Data for Name: empty; Type: TABLE DATA; Schema: public; Owner: -\n--\n\n"
    assert transform(dump, TransformOptions(remap=remap)) == dump


def test_remap_without_column_names_is_an_error() -> None:
    """Plain --inserts output cannot be remapped: it names no columns."""
    remap = parse_remap({"tables": {"t": {"drop": ["x"]}}})
    with pytest.raises(RemapError, match="--column-inserts"):
        transform(b"INSERT INTO public.t VALUES (1);\n", TransformOptions(remap=remap))


def test_row_with_wrong_value_count_is_an_error_with_its_line() -> None:
    """A tuple whose value count differs from the column list is reported, not silently remapped."""
    remap = parse_remap({"tables": {"t": {"drop": ["b"]}}})
    with pytest.raises(DumpSyntaxError, match=r"line 2 .*has 3 values for 2 columns"):
        transform(b"SET a = 1;\nINSERT INTO t (a, b) VALUES (1, 2, 3);\n", TransformOptions(remap=remap))


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"tables": {"t": {"add": {"c": "now()"}}}}, "is not an SQL literal"),
        ({"tables": {"t": {"rename": {"a": "b"}, "drop": ["a"]}}}, "both renamed and dropped"),
        ({"tables": {"t": {"colums": ["a"]}}}, "expected some of the keys"),
        ({"table": {}}, "expected only a"),
        ({"tables": {"t": {"drop": ["a", "a"]}}}, "listed twice"),
    ],
)
def test_invalid_remap_files_are_rejected(document: dict[str, object], message: str) -> None:
    """Remap documents with bad structure or literals raise RemapError when parsed."""
    with pytest.raises(RemapError, match=message):
        parse_remap(document)
