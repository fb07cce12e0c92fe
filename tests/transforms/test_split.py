"""The splitter keeps literals, identifiers, comments and COPY data intact, at any chunking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transforms import (
    CopyEnd,
    CopyRows,
    CopyStart,
    DumpSplitter,
    DumpSyntaxError,
    InsertRows,
    Item,
    Statement,
    TooLargeError,
)

TRICKY_DUMP = b'''--
-- PostgreSQL database dump ; with 'a quote
--
\\restrict Xy12

SET statement_timeout = 0;
SET transaction_timeout = 0;
SELECT pg_catalog.set_config('search_path', '', false);
INSERT INTO public."we;ird ""t""" ("a;b", c) VALUES (1, 'x;y''z
INSERT INTO public.t VALUES (1);
new line);');
INSERT INTO public."we;ird ""t""" ("a;b", c) VALUES (2, E'it\\'s;\\\\');
INSERT INTO public.t (a) VALUES ($$ a dollar-quoted ; value $$);
CREATE FUNCTION f() RETURNS int AS $_$ select 1; select ';'; $_$ LANGUAGE sql;
/* block ; comment */ SELECT 1;
COPY public.t (a, b) FROM stdin;
1\tfoo;bar
2\tline\\nbreak
\\.

\\unrestrict Xy12
'''


def split(data: bytes, chunk: int) -> list[Item]:
    """Feed `data` in chunks of `chunk` bytes."""
    splitter = DumpSplitter()
    items: list[Item] = []
    for start in range(0, len(data), chunk):
        items += splitter.feed(data[start : start + chunk])
    return items + splitter.close()


def text_of(item: Item) -> bytes:
    """The bytes an item stands for, where it keeps them verbatim."""
    if isinstance(item, CopyRows):
        return item.data
    if isinstance(item, InsertRows):
        return b""
    return item.text


def statements(items: list[Item]) -> list[bytes]:
    """The statement texts among the items."""
    return [i.text for i in items if isinstance(i, Statement | CopyStart)]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_tricky_dump_splits_the_same_at_any_chunk_size(chunk: int) -> None:
    """Chunk boundaries anywhere, even inside literals, give the same statements and rows."""
    items = split(TRICKY_DUMP, chunk)
    rows = [(i.insert.table, row) for i in items if isinstance(i, InsertRows) for row in i.insert.tuples]
    assert rows == [
        (b'public."we;ird ""t"""', b"(1, 'x;y''z\nINSERT INTO public.t VALUES (1);\nnew line);')"),
        (b'public."we;ird ""t"""', b"(2, E'it\\'s;\\\\')"),
        (b"public.t", b"($$ a dollar-quoted ; value $$)"),
    ]
    assert statements(items)[3] == b"CREATE FUNCTION f() RETURNS int AS $_$ select 1; select ';'; $_$ LANGUAGE sql;"
    copy_rows = b"".join(i.data for i in items if isinstance(i, CopyRows))
    assert copy_rows == b"1\tfoo;bar\n2\tline\\nbreak\n"
    assert sum(isinstance(i, CopyEnd) for i in items) == 1


def test_items_report_their_line_and_offset() -> None:
    """Each statement knows the line and byte offset where it starts."""
    items = split(TRICKY_DUMP, 5)
    first_set = next(i for i in items if isinstance(i, Statement))
    assert (first_set.line, first_set.offset) == (6, TRICKY_DUMP.index(b"SET statement_timeout"))


def canonical(items: list[Item]) -> list[tuple[str, bytes]]:
    """Items as (kind, bytes): one entry per INSERT row, adjacent pass-through text and COPY data joined."""
    entries: list[tuple[str, bytes]] = []
    for item in items:
        if isinstance(item, InsertRows):
            entries += [("row", item.insert.table + b" " + row) for row in item.insert.tuples]
            continue
        entry = (type(item).__name__, text_of(item))
        if entries and entry[0] in ("Verbatim", "CopyRows") and entries[-1][0] == entry[0]:
            entry = (entry[0], entries.pop()[1] + entry[1])
        entries.append(entry)
    # Line breaks between the INSERTs of a run are absorbed into the run when it arrives in one chunk.
    return [(kind, b" ".join(text.split()) if kind == "Verbatim" else text) for kind, text in entries if text.strip()]


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=60))
def test_any_chunking_gives_identical_items(chunk_sizes: list[int]) -> None:
    """The items do not depend on how the input is cut into chunks."""
    splitter = DumpSplitter()
    items: list[Item] = []
    pos = 0
    for size in chunk_sizes:
        items += splitter.feed(TRICKY_DUMP[pos : pos + size])
        pos += size
    items += splitter.feed(TRICKY_DUMP[pos:]) + splitter.close()
    assert canonical(items) == canonical(split(TRICKY_DUMP, 1 << 20))


@pytest.mark.parametrize(
    ("dump", "message", "line"),
    [
        (b"SET a = 1;\nINSERT INTO t VALUES ('open\n", "ends inside this statement", 2),
        (b"SET a = 1;\nhello world;\n", "where an SQL statement should start", 2),
        (b"\xff\xfe garbage", "where an SQL statement should start", 1),
        (b"COPY t (a) FROM stdin;\n1\n2\n", r"before the COPY data's \\\. end marker", 4),
        (b"COPY t (a) FROM stdin;\n1\n2", "inside a COPY data row", 3),
        (b"COPY t (a) FROM stdin;\n1\n\\.x\n", "must be the end marker alone", 3),
        (b"SELECT $f$ body;", "ends inside this statement", 1),
        (b'INSERT INTO "t VALUES (1);', "ends inside this statement", 1),
    ],
)
def test_malformed_dumps_are_reported_with_their_line(dump: bytes, message: str, line: int) -> None:
    """A cut-off or garbage dump raises DumpSyntaxError naming the line."""
    with pytest.raises(DumpSyntaxError, match=message) as caught:
        split(dump, 3)
    assert caught.value.line == line


def uncounted(data: bytes, chunk: int) -> list[Item]:
    """Feed `data` in chunks of `chunk` bytes to a splitter that counts no COPY lines."""
    splitter = DumpSplitter(count_copy_lines=False)
    items = [item for start in range(0, len(data), chunk) for item in splitter.feed(data[start : start + chunk])]
    return items + splitter.close()


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_uncounted_copy_lines_give_byte_offsets_after_copy_data(chunk: int) -> None:
    """With count_copy_lines=False (the superhub's receiver: counting the newlines of all COPY data costs a pass
    over it), items and errors before the first COPY data keep their line; after it, line 0 and the byte offset,
    exact at any chunking."""
    dump = b"SET a = 1;\nCOPY t (a) FROM stdin;\n1\n2\n\\.\nCOPY u (b) FROM stdin;\n3\n\\.\n"
    starts = [(i.line, i.offset) for i in uncounted(dump, chunk) if isinstance(i, Statement | CopyStart)]
    assert starts == [(1, 0), (2, 11), (0, dump.index(b"COPY u"))]
    with pytest.raises(DumpSyntaxError) as caught:
        uncounted(dump + b"hello;\n", chunk)
    assert (caught.value.line, caught.value.offset) == (0, len(dump))
    assert str(caught.value).startswith(f"byte {len(dump)}: unexpected text 'hello;'")
    with pytest.raises(DumpSyntaxError, match=r"^line 9 \(byte \d+\): unexpected text"):
        split(dump + b"hello;\n", chunk)  # counted by default


def test_statement_without_trailing_newline_at_end_is_complete() -> None:
    """The last statement needs no newline after its semicolon; a trailing comment needs none either."""
    items = split(b"SELECT 1;\n-- end", 4)
    assert statements(items) == [b"SELECT 1;"]


HUGE = 32 * 1024 * 1024
HUGE_ITEMS = {
    "copy row": b"COPY public.t (a) FROM stdin;\n" + b"x" * HUGE + b"\n\\.\n",
    "statement": b"INSERT INTO public.t (a) VALUES ('" + b"x" * HUGE + b"');\n",
    "comment line": b"-- " + b"x" * HUGE + b"\nSELECT 1;\n",
}


@pytest.mark.parametrize("kind", list(HUGE_ITEMS))
def test_a_huge_item_is_rescanned_only_when_the_buffer_doubles(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Waiting for the end of a 32 MiB item fed in 64 KiB chunks costs a handful of rescans, not one per chunk
    (which made a 100 MiB value take minutes: linear work per chunk, quadratic in all)."""
    scans = 0
    real_drain = DumpSplitter._drain

    def counting_drain(self: DumpSplitter, *, eof: bool) -> list[Item]:
        nonlocal scans
        scans += 1
        return real_drain(self, eof=eof)

    monkeypatch.setattr(DumpSplitter, "_drain", counting_drain)
    dump = HUGE_ITEMS[kind]
    splitter = DumpSplitter()
    items = [item for i in range(0, len(dump), 1 << 16) for item in splitter.feed(dump[i : i + (1 << 16)])]
    items += splitter.close()
    assert len(dump) >> 16 > 500
    assert scans < 40, scans
    assert max(len(content(item)) for item in items) >= HUGE  # the item arrived whole


def content(item: Item) -> bytes:
    """An item's payload: its tuples, rows or text."""
    if isinstance(item, InsertRows):
        return b",".join(item.insert.tuples)
    return item.data if isinstance(item, CopyRows) else item.text


BOUND = 3 * 1024 * 1024  # past _HOLD_BYTES, so that the item waits in the held bytearray before it is refused
ENDLESS = {  # an item that never ends: what comes before it, its start, what the error calls it, its table and line
    "statement": (b"SET a = 1;\n", b'INSERT INTO public."T" (a) VALUES (\'', "a statement", b'public."T"', 2),
    "statement with semicolons": (b"", b"SELECT ';", "a statement", None, 1),
    "copy row": (b"COPY public.t (a) FROM stdin;\n1\n", b"", "a COPY data row", b"public.t", 3),
    "comment line": (b"", b"-- ", "a comment or psql command line", None, 1),
}


def held_when_refused(splitter: DumpSplitter, before: bytes, opening: bytes, filler: bytes, chunk: int) -> int:
    """Feed `before`, then an item: `opening` and `filler` for ever, `chunk` bytes at a time; how much of the item
    had arrived when the splitter refused it."""
    splitter.feed(before + opening)
    held = len(opening)
    while held < 4 * BOUND:
        held += chunk
        try:
            splitter.feed(filler * (chunk // len(filler)))
        except TooLargeError:
            return held
    return held


@pytest.mark.parametrize("chunk", [1 << 16, 1 << 20])
@pytest.mark.parametrize("kind", list(ENDLESS))
def test_an_item_past_the_bound_is_refused_once_the_bound_is_passed(kind: str, chunk: int) -> None:
    """An item that never ends raises TooLargeError, naming it and its table, as soon as more than the bound of it
    has arrived: not one chunk later."""
    before, opening, what, table, line = ENDLESS[kind]
    splitter = DumpSplitter(BOUND)
    held = held_when_refused(splitter, before, opening, b"x;" if b";" in opening else b"x", chunk)
    assert BOUND < held <= BOUND + chunk
    with pytest.raises(TooLargeError) as caught:
        splitter.feed(b"x")  # the splitter stays refused
    error = caught.value
    assert (error.what, error.table, error.limit, error.line) == (what, table, BOUND, line)
    assert str(error).endswith(f"{what} is larger than {BOUND} bytes")


@pytest.mark.parametrize("chunk", [1000, 1 << 16, 1 << 20])
def test_items_up_to_the_bound_split_as_in_one_piece(chunk: int) -> None:
    """Items of almost the bound, held while they arrive, give the same items as the whole dump in one feed."""
    value = b"v" * (BOUND - 100)
    dump = (
        b"INSERT INTO public.t (a) VALUES ('" + value + b"');\nSELECT 1;\n"
        b"COPY public.t (a) FROM stdin;\n" + value + b"\n2\n\\.\n" + TRICKY_DUMP + b"-- " + value + b"\nSELECT 2;\n"
    )
    whole = DumpSplitter(BOUND)
    expected = whole.feed(dump) + whole.close()
    splitter = DumpSplitter(BOUND)
    items = [item for i in range(0, len(dump), chunk) for item in splitter.feed(dump[i : i + chunk])]
    assert canonical(items + splitter.close()) == canonical(expected)
    assert all(type(getattr(item, "text", b"")) is bytes for item in items)  # never the held bytearray
