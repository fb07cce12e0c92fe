"""The framing of a binary section's COPY data, read as it passes to PostgreSQL (docs/trust.md, "Binary mode"):
the header, each row's field count and field lengths, the trailer; never the values, which the server checks.

PostgreSQL's binary COPY input bounds no row: a row of six 100 MiB text fields (some KiB of zstd on the wire)
took a superhub backend to 1.3 GB. `BinaryFraming.scan` holds each row to `superhub.max_statement_bytes` before its
bytes are passed on, in place (no copy of the data), keeping a few bytes of state from one piece to the next.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import cast

from fedload.errors import DumpError
from fedload.names import TableName

__all__ = ["FIXED_WIDTHS", "BinaryFraming", "RowsWalk", "python_rows", "walk_rows"]

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER = struct.Struct("!11sii")  # signature, flags, header extension length
_COUNT = struct.Struct("!h").unpack_from
_LENGTH = struct.Struct("!i").unpack_from
_COUNT_AND_LENGTH = struct.Struct("!hi").unpack_from  # a row's field count and its first field's length
_INVALID = 1 << 62  # a fast walk's step past any piece and bound: a length below -1
_CRITICAL_FLAGS = 0xFFFF0000  # bits 16-31: PostgreSQL refuses any it does not know (bit 16, OIDs, since 12)
_MAX_COLUMNS = 0x7FFF  # a row's field count is an int16
_HEAD = 8  # bytes of a piece joined with a word the piece before cut (a word is at most 4)
# The binary width of built-in fixed-width types, by OID: bool, char, int8, int2, int4, oid, float4, float8, money,
# date, time, timestamp, timestamptz, interval, timetz, uuid, macaddr, point.
FIXED_WIDTHS = {
    16: 1, 18: 1, 20: 8, 21: 2, 23: 4, 26: 4, 700: 4, 701: 8, 790: 8, 1082: 4, 1083: 8, 1114: 8, 1184: 8,
    1186: 16, 1266: 12, 2950: 16, 829: 6, 600: 16,
}  # fmt: skip


class BinaryFraming:
    """`scan` every piece of one section's binary COPY data in order, then `close`; DumpError at the first row that
    breaks the framing or sums more than `max_row_bytes` bytes of field values."""

    def __init__(
        self, *, columns: int, max_row_bytes: int, feeder: str, table: TableName, widths: tuple[int, ...] = ()
    ) -> None:
        self._columns = columns  # fields per row: the section head's columns
        self._fixed = _FixedRows.of(columns, widths) if 0 < sum(widths) <= max_row_bytes else None
        self._max_row_bytes = max_row_bytes
        self._where = f"feeder {feeder}, table {table}: the binary COPY data"
        self._header: bytes | None = b""  # the header's first bytes while they come; None once it is read
        self._cut = b""  # a field count or length the last piece cut (at most 3 bytes)
        self._skip = 0  # bytes of a field value (or of the header extension) the last piece did not hold
        self._left = 0  # fields of the current row still to come; 0 between rows
        self._row = 0  # bytes of the current row's values so far
        self._ended = False  # the trailer came

    def scan(self, piece: bytes | memoryview) -> None:
        """The framing in `piece`, the data's next bytes, checked."""
        end = len(piece)
        if self._ended:
            if end:
                raise DumpError(f"{self._where} goes on after its trailer")
            return
        if self._header is not None:
            pos = self._read_header(piece, end)
        elif self._cut:
            if (pos := self._join_cut(piece)) < 0:
                return
        else:
            pos = self._skip
        if pos < end and self._left:
            pos = self._walk(piece, pos, end, to_row_end=True)
        if pos < end and not self._left and not self._ended:  # at a row's start (else a word is cut)
            if self._fixed is not None:
                pos = self._fixed.skip(piece, pos, end)
            pos = self._walk(piece, self._rows(piece, pos), end, to_row_end=False)
        if self._ended and pos != end:
            raise DumpError(f"{self._where} goes on after its trailer")
        self._skip, self._cut = (pos - end, b"") if pos >= end else (0, bytes(piece[pos:end]))

    def close(self) -> None:
        """The data is complete: DumpError if it ends before its trailer."""
        if not self._ended:
            raise DumpError(f"{self._where} ends before its trailer (cut short)")

    def _read_header(self, piece: bytes | memoryview, end: int) -> int:
        """Where the rows begin in `piece` (past its end: a skip), once the header is complete; `end` until then."""
        assert self._header is not None
        taken = min(end, _HEADER.size - len(self._header))
        header = self._header + bytes(piece[:taken])
        if len(header) < _HEADER.size:
            self._header = header
            return end
        signature, flags, extension = cast("tuple[bytes, int, int]", _HEADER.unpack(header))
        if signature != SIGNATURE or flags & _CRITICAL_FLAGS or extension < 0:
            raise DumpError(f"{self._where} does not begin with binary COPY's header: {header!r}")
        self._header = None
        return taken + extension

    def _join_cut(self, piece: bytes | memoryview) -> int:
        """Where the walk goes on in `piece`, once the word the last piece cut is read from its first bytes; -1 if
        `piece` is too short to complete it (then the word is still cut)."""
        cut, self._cut = self._cut, b""
        joined = cut + bytes(piece[:_HEAD])
        pos = self._walk(joined, 0, len(joined), to_row_end=False)
        if pos < len(cut):
            self._cut = joined
            return -1
        return pos - len(cut)

    def _rows(self, data: bytes | memoryview, pos: int) -> int:
        """The fast walk (`python_rows`, or its compiled twin) from a row's start at `pos`: where it stopped."""
        columns = self._columns
        if not columns:
            return pos
        # More columns than a row's int16 count can say never come from a staging table (1,600 at most), and the
        # compiled walk refuses them: no row can match that count, which the Python walk finds at once.
        walk = walk_rows if columns <= _MAX_COLUMNS else python_rows
        return walk(data, pos, columns, self._max_row_bytes + 2 + 4 * columns)

    def _walk(self, data: bytes | memoryview, pos: int, end: int, *, to_row_end: bool) -> int:
        """The careful walk, field by field from `pos`, to `end` or (`to_row_end`) the current row's end: where it
        stopped (past `end`: inside a value; before it: a word `end` cuts)."""
        count_of, length_of, columns, bound = _COUNT, _LENGTH, self._columns, self._max_row_bytes
        left, row = self._left, self._row
        try:
            while True:
                if not left:
                    if to_row_end or end - pos < 2:
                        return pos
                    count = count_of(data, pos)[0]
                    pos += 2
                    if count == -1:
                        self._ended = True
                        return pos
                    if count != columns:
                        raise DumpError(f"{self._where} has a row of {count} fields, not the {columns} announced")
                    left, row = columns, 0
                    continue  # a row of no fields (a table of no columns) ends here
                if end - pos < 4:
                    return pos
                length = length_of(data, pos)[0]
                pos, left = pos + 4, left - 1
                if length < -1:
                    raise DumpError(f"{self._where} has a field of length {length}")
                if length > 0:
                    pos, row = pos + length, row + length
                    if row > bound:
                        raise DumpError(
                            f"{self._where} has a row of at least {row} bytes, more than superhub.max_statement_bytes "
                            f"({bound})"
                        )
        finally:
            self._left, self._row = left, row


RowsWalk = Callable[[bytes | memoryview, int, int, int], int]  # python_rows or its compiled twin


def python_rows(data: bytes | memoryview, pos: int, columns: int, bound: int) -> int:
    """The fast walk, whole rows of `columns` fields at a time from a row's start at `pos`, without bounds checks:
    where a row begins that `data` does not hold whole (struct.error), or that `_walk` must read (the trailer, a
    wrong field count, a length below -1, more than `bound` bytes with its framing). A row's size is checked at its
    end, before the piece goes on: its values are the bytes between its length words. A length below -1 takes
    `pos` so far that one or the other sends the row to `_walk`, which names it. Past the end of `data` if the last
    row's lengths are all in it but its last value goes on."""
    count_and_length, length_of = _COUNT_AND_LENGTH, _LENGTH
    rest = range(columns - 1)
    start = pos
    try:
        while True:
            start = pos
            count, length = count_and_length(data, pos)
            if count != columns:
                return start
            pos += length + 6 if length >= 0 else 6 if length == -1 else _INVALID
            for _ in rest:
                length = length_of(data, pos)[0]
                pos += length + 4 if length >= 0 else 4 if length == -1 else _INVALID
            if pos - start > bound:
                return start
    except struct.error:  # the row goes on in the next piece
        return start


def _compiled_or_python() -> RowsWalk:
    """The compiled walk (fedload/superhub/_binary_rows.c) where the build made it, else `python_rows`."""
    try:
        from fedload.superhub._binary_rows import rows  # noqa: PLC0415
    except ImportError:  # built without a C compiler or Python's headers
        return python_rows
    return rows


walk_rows = _compiled_or_python()


class _FixedRows:
    """Rows of a table whose columns are all of fixed width, when none is NULL: every row is the same framing, read
    for a whole piece in one call (`struct.iter_unpack` over a view: no copy, no Python code per row)."""

    def __init__(self, layout: struct.Struct, expected: tuple[int, ...]) -> None:
        self._layout = layout
        self._expected = {expected}

    @classmethod
    def of(cls, columns: int, widths: tuple[int, ...]) -> _FixedRows | None:
        """For `columns` fields of `widths` bytes each; None if there are others."""
        if len(widths) != columns or not all(widths):
            return None
        layout = struct.Struct("!h" + "".join(f"i{width}x" for width in widths))
        return cls(layout, (columns, *widths))

    def skip(self, data: bytes | memoryview, pos: int, end: int) -> int:
        """Past the rows from a row's start at `pos` that `data` holds whole, if they are all of this framing;
        else (a NULL, the trailer) `pos`, for the field-by-field walk."""
        size = self._layout.size
        rows = (end - pos) // size
        if not rows:
            return pos
        with memoryview(data) as view, view[pos : pos + rows * size] as whole:
            if set(self._layout.iter_unpack(whole)) == self._expected:
                return pos + rows * size
        return pos
