"""The framing of binary COPY data, read as it passes: the same verdict however the data is cut, rows past the bound
refused at the piece that shows it, and malformed framing refused; each with the compiled fast walk and with the
Python one, which give the same result for any bytes."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedload.errors import DumpError
from fedload.names import TableName
from fedload.superhub import binary_framing
from fedload.superhub.binary_framing import SIGNATURE, BinaryFraming, python_rows
from tests.support.compiled_walk import compiled_rows

HEADER = SIGNATURE + struct.pack("!ii", 0, 0)
TRAILER = b"\xff\xff"
BOUND = 100
Row = Sequence[bytes | None]


def tuple_bytes(row: Row) -> bytes:
    """One row in binary COPY's framing: its field count, then each field's length and value (-1: NULL)."""
    fields = (struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value for value in row)
    return struct.pack("!h", len(row)) + b"".join(fields)


def copy_data(rows: Sequence[Row], header: bytes = HEADER) -> bytes:
    return header + b"".join(map(tuple_bytes, rows)) + TRAILER


def scanned(
    pieces: Sequence[bytes | memoryview], columns: int, bound: int = BOUND, widths: tuple[int, ...] = ()
) -> None:
    """Every piece scanned, then the end: DumpError if the framing is wrong or a row is past `bound`."""
    table = TableName("public", "hosts")
    framing = BinaryFraming(columns=columns, max_row_bytes=bound, feeder="hub1", table=table, widths=widths)
    for piece in pieces:
        framing.scan(piece)
    framing.close()


def cut_at(data: bytes, *cuts: int) -> list[bytes | memoryview]:
    """`data` cut at `cuts` (in order), the pieces alternately bytes and views, as the receiver passes them on."""
    bounds = [0, *cuts, len(data)]
    view = memoryview(data)
    return [view[a:b] if i % 2 else data[a:b] for i, (a, b) in enumerate(itertools.pairwise(bounds))]


@pytest.fixture(autouse=True, params=["compiled", "python"])
def walk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> binary_framing.RowsWalk:
    """Each test with either fast walk in the framing check."""
    chosen = compiled_rows() if request.param == "compiled" else python_rows
    monkeypatch.setattr(binary_framing, "walk_rows", chosen)
    return chosen


ROWS: list[Row] = [[b"1", b"alpha"], [None, b""], [b"x" * 50, None], [b"", b"y" * 50]]  # the last: exactly BOUND


def verdict(
    pieces: Sequence[bytes | memoryview], columns: int, bound: int = BOUND, widths: tuple[int, ...] = ()
) -> str:
    try:
        scanned(pieces, columns, bound, widths)
    except DumpError as exc:
        return str(exc)
    return "ok"


def test_good_data_passes_however_it_is_cut() -> None:
    """Rows with NULLs, empty values and a row of exactly the bound pass, cut anywhere once or twice."""
    data = copy_data(ROWS)
    for first in range(len(data) + 1):
        assert verdict(cut_at(data, first), 2) == "ok", first
        for second in range(first, min(first + 9, len(data) + 1)):
            assert verdict(cut_at(data, first, second), 2) == "ok", (first, second)
    assert verdict([data[i : i + 1] for i in range(len(data))], 2) == "ok"


def test_a_row_past_the_bound_fails_at_the_piece_that_shows_it() -> None:
    """A row one byte past the bound fails at the piece holding the last byte of the length that passes it, however
    the data is cut, naming the feeder, the table and the size: its value is never needed."""
    rows: list[Row] = [[b"1", b"2"], [b"x" * 60, b"y" * 41], [b"3", b"4"]]
    data = copy_data(rows)
    shown = len(HEADER) + len(tuple_bytes(rows[0])) + 2 + 4 + 60 + 4  # the end of the length word of b"y" * 41
    for cut in range(len(data) + 1):
        framing = BinaryFraming(columns=2, max_row_bytes=BOUND, feeder="hub1", table=TableName("public", "hosts"))
        first, second = cut_at(data, cut)
        if cut < shown:
            framing.scan(first)
            first = second[: shown - cut]
        with pytest.raises(DumpError) as caught:
            framing.scan(first)
        assert "feeder hub1, table public.hosts" in str(caught.value)
        assert "row of at least 101 bytes, more than superhub.max_statement_bytes (100)" in str(caught.value)


def test_a_huge_field_fails_before_its_value_comes() -> None:
    """A field claiming 2 GiB fails as its length is read, without its value."""
    data = HEADER + struct.pack("!hi", 1, 2**31 - 1)
    assert "row of at least 2147483647 bytes" in verdict([data], 1)
    assert "row of at least 2147483647 bytes" in verdict(cut_at(data, len(data) - 2), 1)


@pytest.mark.parametrize(
    ("data", "columns", "error"),
    [
        (b"PGCOPY\n\xff\r\n\x01" + HEADER[11:] + TRAILER, 2, "does not begin with binary COPY's header"),
        (SIGNATURE + struct.pack("!ii", 1 << 16, 0) + TRAILER, 2, "does not begin with binary COPY's header"),
        (SIGNATURE + struct.pack("!ii", 0, -1) + TRAILER, 2, "does not begin with binary COPY's header"),
        (HEADER[:10], 2, "ends before its trailer"),
        (copy_data([[b"1", b"2"]]), 3, "has a row of 2 fields, not the 3 announced"),
        (copy_data([[b"1", b"2", b"3"]]), 2, "has a row of 3 fields, not the 2 announced"),
        (copy_data([[b"1"], []]), 1, "has a row of 0 fields, not the 1 announced"),
        (HEADER + struct.pack("!hii", 2, 1, -2) + TRAILER, 2, "has a field of length -2"),
        (HEADER + struct.pack("!hi", 1, -(2**31)) + TRAILER, 1, "has a field of length -2147483648"),
        (copy_data([[b"1"]]) + b"\x00", 1, "goes on after its trailer"),
        (copy_data([[b"1"]]) + TRAILER, 1, "goes on after its trailer"),
        (copy_data([[b"1"]])[:-2], 1, "ends before its trailer"),
        (copy_data([[b"1"]])[:-3], 1, "ends before its trailer"),
        (copy_data([[b"12"]])[:-3], 1, "ends before its trailer"),
        (HEADER, 1, "ends before its trailer"),
        (b"", 1, "ends before its trailer"),
    ],
)
def test_malformed_framing_is_refused_however_it_is_cut(data: bytes, columns: int, error: str) -> None:
    """A wrong header, a row of another field count, a length below -1, bytes after the trailer, no trailer: a
    DumpError, cut anywhere."""
    for cut in range(len(data) + 1):
        assert error in verdict(cut_at(data, cut), columns), cut


def test_a_header_extension_is_skipped() -> None:
    """The header's extension area (its length, then that many bytes) is skipped, cut anywhere."""
    data = SIGNATURE + struct.pack("!ii", 0, 5) + b"\xff" * 5 + tuple_bytes([b"1"]) + TRAILER
    for cut in range(len(data) + 1):
        assert verdict(cut_at(data, cut), 1) == "ok", cut


def test_nothing_may_follow_the_trailer_in_a_later_piece() -> None:
    """A piece after the trailer's is refused; an empty one is nothing."""
    data = copy_data([[b"1"]])
    assert verdict([data, b""], 1) == "ok"
    assert "goes on after its trailer" in verdict([data, b"\x00"], 1)


@st.composite
def tables(draw: st.DrawFn) -> tuple[tuple[int, ...], list[Row], list[int]]:
    """A table's column widths (0: variable), its rows (mostly values of their column's width, some NULLs, some
    of another length) and cuts of its binary COPY data."""
    widths = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 4, 8, 16]), max_size=6)))
    fixed = st.one_of(*(st.binary(min_size=w, max_size=w) for w in widths if w)) if any(widths) else st.nothing()
    values = st.one_of(st.none(), st.binary(max_size=40), fixed)
    rows: list[Row] = draw(st.lists(st.lists(values, min_size=len(widths), max_size=len(widths)), max_size=40))
    size = len(copy_data(rows))
    cuts = sorted(draw(st.lists(st.integers(0, size), max_size=6)))
    return widths, rows, cuts


@settings(max_examples=400, deadline=None)
@given(tables(), st.integers(0, 160))
def test_the_verdict_is_the_rows_sizes_however_the_data_is_cut(
    table: tuple[tuple[int, ...], list[Row], list[int]], bound: int
) -> None:
    """For generated tables and cuts: a failure exactly when a row's values sum past the bound; the same with the
    columns' fixed widths known (the fast path for tables all of fixed width) as without."""
    widths, rows, cuts = table
    sizes = [sum(len(v) for v in row if v is not None) for row in rows]
    pieces = cut_at(copy_data(rows), *cuts)
    result = verdict(pieces, len(widths), bound)
    if all(size <= bound for size in sizes):
        assert result == "ok"
    else:
        assert "more than superhub.max_statement_bytes" in result
    assert verdict(pieces, len(widths), bound, widths) == result


def test_rows_of_fixed_width_pass_with_nulls_and_cuts() -> None:
    """A table all of fixed width: rows without NULLs (read a piece at a time), with NULLs and with a value of
    another width pass, cut anywhere; a row of another field count fails."""
    widths = (8, 4, 1)
    rows: list[Row] = [[b"a" * 8, b"b" * 4, b"c"]] * 30 + [[None, b"b" * 4, b"c"], [b"", b"bb", b"cc"]]
    data = copy_data([*rows, *rows[:30]])
    for cut in range(len(data) + 1):
        assert verdict(cut_at(data, cut), 3, BOUND, widths) == "ok", cut
    wrong = copy_data([*rows[:30], [b"a" * 8, b"b" * 4], *rows[:30]])
    assert "has a row of 2 fields, not the 3 announced" in verdict([wrong], 3, BOUND, widths)
