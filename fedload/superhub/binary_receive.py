"""The superhub's reader of a binary-mode stream's dump text (fedload/feeder/sections.py): one section per table,
as items for the importer.

A binary section becomes BinaryStart, BinaryRows (COPY data in PostgreSQL's binary format, passed on as it came,
never parsed here: the server checks it) and BinaryEnd. A text section becomes the items of a pg_dump COPY block
(CopyStart naming the table and its columns, CopyRows of whole lines, CopyEnd), which the importer maps exactly
as in copy mode; its reason is logged once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fedload.config import DEFAULT_RECEIVED_STATEMENT_BYTES
from fedload.errors import DumpError, one_line
from fedload.feeder.sections import CHUNK, END, HEAD, PART
from fedload.log import get_logger
from fedload.names import TableName, columns_refusal
from fedload.superhub.schema import ident
from fedload.superhub.statistics_section import StatisticsSection, is_statistics_head
from transforms import CopyEnd, CopyRows, CopyStart, MetaCommand, Statement, TooLargeError, Verbatim

__all__ = ["BinaryEnd", "BinaryRows", "BinaryStart", "SectionItem", "SectionSplitter", "UnchangedTable"]

_MAX_HEAD_BYTES = 1 << 20
_MAX_REASON_CHARS = 200
# A piece of binary data at least this long goes on as a view of its block; shorter ones (psql's writes, a few KiB)
# are joined with their neighbours: an item each would cost more than its bytes.
_VIEW_BYTES = 1 << 16
log = get_logger()


@dataclass(frozen=True, slots=True)
class BinaryStart:
    """A table's binary section begins: its data holds `columns`, in this order; `unsent`: the feeder's other
    columns (which the superhub did not ask for: it lacks them)."""

    table: TableName
    columns: tuple[str, ...]
    unsent: tuple[str, ...]
    section: int  # 1 for the stream's first
    delta: object = None  # the head's `delta` as sent: checked by the importer (fedload.superhub.delta)


@dataclass(frozen=True, slots=True)
class BinaryRows:
    """A piece of the section's binary COPY data (not cut at rows), from one block of the stream: a chunk's data of
    at least `_VIEW_BYTES` as a view of the inflated block (the usual case: the agent sends block-sized chunks, so a
    block holds one or two), which asyncpg copies into its CopyData message, so it is not copied once more here;
    shorter chunks' data joined."""

    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class BinaryEnd:
    """The section's data is complete."""


@dataclass(frozen=True, slots=True)
class UnchangedTable:
    """The feeder did not send the table: its digest is the one the superhub asked with (protocol 5); `rows` and
    `digest` as the feeder computed them in the dump's snapshot."""

    table: TableName
    rows: int
    digest: str


# The statistics section's statements too (fedload.superhub.statistics_section).
SectionItem = (
    BinaryStart
    | BinaryRows
    | BinaryEnd
    | CopyStart
    | CopyRows
    | CopyEnd
    | UnchangedTable
    | Statement
    | MetaCommand
    | Verbatim
)


class SectionSplitter:
    """`feed()` dump text, get items; `close()` at the end (DumpError if it ends inside a section)."""

    def __init__(self, feeder: str = "", max_line_bytes: int = DEFAULT_RECEIVED_STATEMENT_BYTES) -> None:
        self._feeder = feeder
        self._max_line_bytes = max_line_bytes  # a text section's longest row (TooLargeError past it)
        self._buf = b""  # an incomplete part head, or section head
        self._left = 0  # bytes of the current chunk still to come
        self._binary: bool | None = None  # the open section's format; None between sections
        self._unchanged = False  # the open section says its table is unchanged: it holds no data
        self._table: TableName | None = None
        self._line = b""  # a text section's incomplete last line
        self._sections = 0
        self._statistics: StatisticsSection | None = None  # the statistics section, while it is open

    def feed(self, text: bytes) -> list[SectionItem]:
        """The items that `text` completes: the data of a section's chunks in `text` as one item (the agent's
        chunks are what psql wrote at a time, often a few KiB: an item each would cost more than its bytes)."""
        if self._buf:
            text, self._buf = self._buf + text, b""
        out: list[SectionItem] = []
        pieces: list[memoryview] = []  # the open section's data in `text`, not yet passed on
        pos, end = 0, len(text)
        with memoryview(text) as view:
            while pos < end:
                if self._left:
                    take = min(self._left, end - pos)
                    pieces.append(view[pos : pos + take])
                    pos, self._left = pos + take, self._left - take
                    continue
                if end - pos < PART.size:
                    break
                kind, length = PART.unpack_from(text, pos)
                if kind == CHUNK and self._binary is not None and not self._unchanged:
                    pos, self._left = pos + PART.size, length
                elif kind == HEAD and self._binary is None:
                    if length > _MAX_HEAD_BYTES:
                        raise DumpError(f"a section head of the binary stream claims {length} bytes")
                    if end - pos - PART.size < length:
                        break
                    if (item := self._start(text[pos + PART.size : pos + PART.size + length])) is not None:
                        out.append(item)
                    pos += PART.size + length
                elif kind == END and self._binary is not None and length == 0:
                    self._pass_on(pieces, out)
                    out.extend(self._ended())
                    pos += PART.size
                else:
                    raise DumpError(f"the binary stream has an unexpected part {kind!r} at this point")
            self._pass_on(pieces, out)
        self._buf = text[pos:]
        return out

    def _pass_on(self, pieces: list[memoryview], out: list[SectionItem]) -> None:
        """The open section's data from `pieces` as items; `pieces` emptied. Binary data: each piece of at least
        `_VIEW_BYTES` as a view of the immutable block (alive as long as its item: asyncpg copies it into its
        CopyData message, so the block is not copied here), runs of shorter ones joined; a text or statistics
        section's data joined into one (one copy)."""
        if not (self._binary and self._statistics is None):
            if pieces:
                self._data(_joined(pieces), out)
            return
        short: list[memoryview] = []
        for piece in pieces:
            if len(piece) < _VIEW_BYTES:
                short.append(piece)
                continue
            if short:
                out.append(BinaryRows(_joined(short)))
            out.append(BinaryRows(piece))
        if short:
            out.append(BinaryRows(_joined(short)))
        pieces.clear()

    def close(self) -> list[SectionItem]:
        """Nothing more (DumpSplitter's `close` may have items); DumpError if the dump text ends inside a section."""
        if self._binary is not None or self._buf:
            raise DumpError(f"the binary stream ends inside the section of table {self._table}")
        return []

    def _data(self, data: bytes, out: list[SectionItem]) -> None:
        if self._statistics is not None:
            out.extend(self._statistics.feed(data))
            return
        if self._binary:
            out.append(BinaryRows(data))
            return
        data = self._line + data
        cut = data.rfind(b"\n") + 1
        self._line = data[cut:]
        if len(self._line) > self._max_line_bytes:
            assert self._table is not None  # a text section is open
            table = self._table.sql.encode()
            raise TooLargeError(
                "a COPY data row", table=table, limit=self._max_line_bytes, line=self._sections, offset=0
            )
        if cut:
            out.append(CopyRows(data[:cut] if cut < len(data) else data))

    def _end(self) -> SectionItem | None:
        binary, self._binary = self._binary, None
        if self._unchanged:
            self._unchanged = False
            return None
        if binary:
            return BinaryEnd()
        if self._line:
            raise DumpError(f"the text section of table {self._table} ends inside a line")
        return CopyEnd(b"\\.\n")

    def _ended(self) -> list[SectionItem]:
        """The items the open section's end completes (none for an unchanged table)."""
        if self._statistics is not None:
            return self._end_statistics()
        return [] if (ended := self._end()) is None else [ended]

    def _end_statistics(self) -> list[SectionItem]:
        assert self._statistics is not None
        statistics, self._statistics, self._binary = self._statistics, None, None
        return list(statistics.close())

    def _start(self, body: bytes) -> SectionItem | None:
        if is_statistics_head(body):  # sent only when asked (fedload.superhub.statistics_section)
            self._statistics, self._binary = StatisticsSection(self._max_line_bytes), False
            return None
        head = _head(body)
        self._sections += 1
        self._table = table = TableName(head["schema"], head["name"])
        columns = tuple(head["columns"])
        self._binary = head["format"] == "binary"
        if (unchanged := head.get("unchanged")) is not None:
            self._unchanged = True
            return UnchangedTable(table, unchanged["rows"], unchanged["digest"])
        if self._binary:
            return BinaryStart(table, columns, tuple(head["unsent"]), self._sections, head.get("delta"))
        reason = one_line(head["reason"], _MAX_REASON_CHARS)  # the agent's words: a line, not a page of the head
        log.info("import.text_fallback", feeder=self._feeder, table=str(table), reason=reason)
        written = ", ".join(map(ident, columns)).encode()
        return CopyStart(b"", self._sections, 0, table.sql.encode(), written)


def _joined(pieces: list[memoryview]) -> bytes:
    """The pieces' bytes in one (one copy); the pieces released and `pieces` emptied."""
    data = pieces[0].tobytes() if len(pieces) == 1 else b"".join(pieces)
    for piece in pieces:
        piece.release()
    pieces.clear()
    return data


def _head(body: bytes) -> dict[str, Any]:
    """A section head's JSON, checked: DumpError if it is not one."""
    try:
        head = json.loads(body)
    except (ValueError, RecursionError):
        head = None
    strings = ("schema", "name", "reason")
    lists = ("columns", "unsent")
    valid = (
        isinstance(head, dict)
        and all(isinstance(head.get(key), str) for key in strings)
        and all(isinstance(head.get(key), list) and all(isinstance(c, str) for c in head[key]) for key in lists)
        and head.get("format") in ("binary", "text")
        and _valid_unchanged(head.get("unchanged"))
    )
    if not valid:
        raise DumpError(f"a section head of the binary stream is not valid: {body[:80]!r}")
    try:
        TableName.claimed(head["schema"], head["name"])
    except ValueError as exc:
        raise DumpError(f"a section head of the binary stream names no table: {exc}") from None
    for key in lists:
        if (wrong := columns_refusal(head[key])) is not None:
            raise DumpError(f"a section head of the binary stream lists {key} that are refused: {wrong}")
    return dict(head)


def _valid_unchanged(unchanged: object) -> bool:
    """A head's `unchanged` (protocol 5) is absent, or rows (an integer, 0 or more) and a digest (a string)."""
    if unchanged is None:
        return True
    return (
        isinstance(unchanged, dict)
        and type(unchanged.get("rows")) is int
        and unchanged["rows"] >= 0
        and isinstance(unchanged.get("digest"), str)
    )
