"""Split a pg_dump plain-format byte stream into statements, COPY blocks and pass-through text.

Push-style so that blocking filters and asyncio consumers share it: `feed()` bytes as they arrive, `close()` at
the end of input; both return the items completed so far. Memory holds the current statement (or a bounded slice
of a COPY block) plus one input chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from transforms.errors import DumpSyntaxError, TooLargeError, printable
from transforms.inserts import (
    CheckedInserts,
    Insert,
    InsertRunMatcher,
    TuplesPatterns,
    first_insert_piece,
    insert_piece,
    plain_tuples,
    read_plain_insert,
)
from transforms.lexical import COPY_FROM_STDIN, INSERT_HEAD, INSERT_TAIL, possessive, statement_end

__all__ = [
    "MAX_STATEMENT_BYTES_IN",
    "CopyEnd",
    "CopyRows",
    "CopyStart",
    "DumpSplitter",
    "InsertRows",
    "Item",
    "MetaCommand",
    "Statement",
    "Verbatim",
]

MAX_STATEMENT_BYTES_IN = 1 << 30
"""The default bound of an item held without its end (PostgreSQL's own limit): a guard against unbounded memory
on garbage without `;`. The superhub sets its own (`superhub.max_statement_bytes`)."""

# The first word of every SQL command PostgreSQL knows; anything else where a statement starts is garbage.
_COMMAND_WORDS = frozenset(
    b"ABORT ALTER ANALYZE BEGIN CALL CHECKPOINT CLOSE CLUSTER COMMENT COMMIT COPY CREATE DEALLOCATE DECLARE "
    b"DELETE DISCARD DO DROP END EXECUTE EXPLAIN FETCH GRANT IMPORT INSERT LISTEN LOAD LOCK MERGE MOVE NOTIFY "
    b"PREPARE REASSIGN REFRESH REINDEX RELEASE RESET REVOKE ROLLBACK SAVEPOINT SECURITY SELECT SET SHOW START "
    b"TABLE TRUNCATE UNLISTEN UPDATE VACUUM VALUES WITH".split()
)
_FILLER = re.compile(possessive(rb"[ \t\r\n\f]+|--[^\n]*\n", at_least_one=True))
_FIRST_WORD = re.compile(rb"(?:/\*.*?\*/\s*)*([A-Za-z]*)(.?)", re.DOTALL)  # never fails: no backtracking
_WORD_WINDOW = 4096
_REST_OF_LINE = re.compile(rb"[ \t\r]*\n")
_HOLD_BYTES = 1 << 20  # an item incomplete at this length waits for its end in a bytearray that grows in place
# A line starting with `\.` inside COPY data: the end marker, or an error. A regex, not bytes.find: sre's literal
# search measured 1-2x faster than bytes.find(b"\n\\.") on COPY text, never slower (bench/bench_receive.py).
_COPY_END_CANDIDATE = re.compile(rb"\n\\\.")


@dataclass(frozen=True)
class Verbatim:
    """Whitespace and `--` comments between statements."""

    text: bytes


@dataclass(frozen=True)
class MetaCommand:
    """A psql backslash command line, such as pg_dump's `\\restrict KEY` (newline included)."""

    text: bytes
    line: int  # 0: not counted (after COPY data, see DumpSplitter)
    offset: int


@dataclass(frozen=True)
class Statement:
    """One SQL statement, `;` included."""

    text: bytes
    line: int  # 0: not counted (after COPY data, see DumpSplitter)
    offset: int


@dataclass(frozen=True)
class InsertRows:
    """One INSERT statement, or a run of consecutive ones with the same target, parsed; `line` is the first's."""

    insert: Insert
    line: int
    offset: int


@dataclass(frozen=True)
class CopyStart:
    """A `COPY name (columns) FROM stdin;` line (newline included); CopyRows and a CopyEnd follow."""

    text: bytes
    line: int  # 0: not counted (after COPY data, see DumpSplitter)
    offset: int
    table: bytes
    columns: bytes | None


@dataclass(frozen=True)
class CopyRows:
    """Whole lines of COPY text-format data."""

    data: bytes


@dataclass(frozen=True)
class CopyEnd:
    """The `\\.` line that ends a COPY block."""

    text: bytes


Item = Union[Verbatim, MetaCommand, Statement, InsertRows, CopyStart, CopyRows, CopyEnd]


class DumpSplitter:
    """Incremental splitter; see the module docstring. A statement, COPY row, comment or psql command line of which
    more than `max_item_bytes` have arrived without its end raises TooLargeError. Until then an item that long
    waits in a bytearray that grows in place, so memory holds about its length (up to an eighth more) and one
    input chunk, not twice that as joining bytes would.

    With `count_copy_lines=False` the newlines of COPY data are not counted (a pass over every byte, which only
    error messages need): items after the first COPY data then have line 0, and errors name the byte offset.

    With `insert_pieces_after` (the transformer's), a multi-row INSERT whose tuples are as pg_dump writes them
    (`PLAIN_TUPLE`) and of which more than that many bytes have arrived without its end is handed on in pieces, an
    InsertRows of the tuples so far each: memory then holds about that many bytes, not the statement (pg_dump's
    `--rows-per-insert` writes statements of any size). Its end must then be as pg_dump writes it too: a tuple of
    another kind after the first piece, or ON CONFLICT DO NOTHING (which the pieces before did not say), is a
    DumpSyntaxError."""

    def __init__(
        self,
        max_item_bytes: int = MAX_STATEMENT_BYTES_IN,
        *,
        count_copy_lines: bool = True,
        insert_pieces_after: int | None = None,
    ) -> None:
        self._max_item_bytes = max_item_bytes
        self._count_copy_lines = count_copy_lines
        self._pieces_after = insert_pieces_after
        self._open_insert: Insert | None = None  # the target of an INSERT handed on in pieces, until its end
        self._buf = b""
        self._held: bytearray | None = None  # an incomplete item of _HOLD_BYTES or more, while _buf is empty
        self._waiting_for = ""  # what the incomplete item is, for TooLargeError
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._wanted_bytes = 0
        self._mark = 0  # position in _buf up to which items have been produced
        self._offset = 0  # absolute input offset of _mark
        self._line = 1  # line number at _mark; 0 once COPY data went by uncounted
        self._copy: CopyStart | None = None
        self._inserts = InsertRunMatcher()
        self._checked_inserts: CheckedInserts | None = None

    @property
    def in_copy(self) -> bool:
        """Whether the input so far ends inside a COPY block."""
        return self._copy is not None

    def read_tuples_with(self, patterns: TuplesPatterns) -> None:
        """Read each multi-row INSERT in one pass of the pattern `patterns` gives for its target, which marks those
        it takes whole (`Insert.checked_by`); see transforms.inserts.CheckedInserts."""
        self._checked_inserts = CheckedInserts(patterns)

    def feed(self, data: bytes) -> list[Item]:
        """Add input; return the items it completes."""
        if self._held is not None:
            return self._feed_held(self._held, data)
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes < self._wanted_bytes:
            return []  # an incomplete statement waits for enough input to be worth scanning again
        return self._drain(eof=False)

    def close(self) -> list[Item]:
        """Signal the end of input; return the last items or raise DumpSyntaxError for a cut-off dump."""
        if self._held is not None:
            self._buf, self._held = bytes(self._held), None
        return self._drain(eof=True)

    def _feed_held(self, held: bytearray, data: bytes) -> list[Item]:
        """Grow the held item; once it ends, split as usual (a copy, once, of an item within the bound)."""
        held += data
        if len(held) < self._wanted_bytes:
            return []
        if not self._ends(held):
            if len(held) > self._max_item_bytes:
                raise self._too_large(held, 0, self._waiting_for)
            self._wanted_bytes = min(2 * len(held), self._max_item_bytes + 1)  # rescan by the time it is too big
            return []
        self._buf, self._held = bytes(held), None
        return self._drain(eof=False)

    def _ends(self, held: bytearray) -> bool:
        """Whether the item at the start of `held` ends in it: a COPY row, comment or psql command line at its
        newline, a statement at its `;`."""
        if self._open_insert is not None or self._may_cut(held):
            return True  # the next piece, or the end, is there (the held item doubled since it was last scanned)
        if self._copy is not None or held.startswith((b"--", b"\\")):
            return held.find(b"\n") >= 0
        return held.find(b";") >= 0 and statement_end(held, 0) is not None  # find: C speed, a regex is slower

    def _may_cut(self, held: bytearray) -> bool:
        """Whether the held item is an INSERT long enough to be handed on in pieces."""
        return self._pieces_after is not None and len(held) > self._pieces_after and held[:6].upper() == b"INSERT"

    def _take_pending(self) -> None:
        """Append the input fed since the last drain to the buffer."""
        if len(self._pending) == 1 and not self._buf:
            self._buf = self._pending[0]  # not copied: a block of whole COPY rows then goes on as it came
        elif self._pending:
            self._buf = b"".join([self._buf, *self._pending])
        self._pending.clear()
        self._pending_bytes = 0

    def _drain(self, *, eof: bool) -> list[Item]:
        self._take_pending()
        items: list[Item] = []
        pos = 0
        self._wanted_bytes = 0  # a step that needs more input sets it
        while pos < len(self._buf):
            if self._copy:
                step = self._copy_step(pos, eof)
            else:
                step = self._insert_piece_step(pos, eof) if self._open_insert else self._top_step(pos, eof)
            if step is None:
                break
            item, end = step
            items.append(item)
            self._advance(pos, end, counted=self._count_copy_lines or not isinstance(item, CopyRows))
            pos = end
        self._buf = self._buf[pos:]
        self._mark = 0
        if eof:
            self._check_complete()
        elif len(self._buf) >= _HOLD_BYTES:  # then an item is incomplete, and _wanted_bytes counts further input
            self._held, self._buf = bytearray(self._buf), b""
            self._wanted_bytes += len(self._held)
        return items

    def _advance(self, start: int, end: int, *, counted: bool) -> None:
        if not counted:
            self._line = 0
        elif self._line:
            self._line += self._buf.count(b"\n", start, end)
        self._offset += end - start
        self._mark = end

    def _where(self, pos: int) -> tuple[int, int]:
        """(line, absolute input offset) of a position at or after the mark in the current buffer; line 0 if
        uncounted COPY data came before."""
        line = self._line + self._buf.count(b"\n", self._mark, pos) if self._line else 0
        return line, self._offset + pos - self._mark

    def _error(self, message: str, pos: int) -> DumpSyntaxError:
        line, offset = self._where(pos)
        return DumpSyntaxError(message, line=line, offset=offset)

    def _top_step(self, pos: int, eof: bool) -> tuple[Item, int] | None:
        buf = self._buf
        filler = _FILLER.match(buf, pos)
        if filler:
            return Verbatim(buf[pos : filler.end()]), filler.end()
        if buf.startswith(b"--", pos) or buf.startswith(b"\\", pos):
            return self._line_item(pos, eof)
        if buf.endswith(b"-") and pos == len(buf) - 1 and not eof:
            return None  # perhaps the start of a comment
        return self._statement(pos, eof)

    def _line_item(self, pos: int, eof: bool) -> tuple[Item, int] | None:
        """A comment or psql meta-command line: wait for its newline unless the input has ended."""
        newline = self._buf.find(b"\n", pos)
        if newline < 0 and not eof:
            self._wait_for_more(pos, "a comment or psql command line")
            return None
        end = len(self._buf) if newline < 0 else newline + 1
        text = self._buf[pos:end]
        if text.startswith(b"--"):
            return Verbatim(text), end
        return MetaCommand(text, *self._where(pos)), end

    def _statement(self, pos: int, eof: bool) -> tuple[Item, int] | None:
        buf = self._buf
        self._check_command_word(pos, eof)
        insert = buf[pos : pos + 6].upper() == b"INSERT"
        scanned = pos  # the statement has no `;` before, and a literal or comment never spans it
        if insert and not eof and self._surely_cut_off(pos):
            self._incomplete_statement(pos, eof)
            return None
        if insert:
            read = self._insert_in_one_pass(pos)
            if not isinstance(read, int):
                return read
            scanned = read
        end = statement_end(buf, scanned)
        if end is None and insert:
            return self._first_insert_piece(pos, scanned, eof)
        if end is None:
            self._incomplete_statement(pos, eof)
            return None
        return self._insert_run(pos, end) if insert else self._other_statement(pos, end, eof)

    def _other_statement(self, pos: int, end: int, eof: bool) -> tuple[Item, int] | None:
        """The statement buf[pos:end], not an INSERT: a COPY header (once its line ends) or any other."""
        buf = self._buf
        copy = COPY_FROM_STDIN.fullmatch(buf, pos, end)
        if copy is None:
            return Statement(buf[pos:end], *self._where(pos)), end
        line_end = _REST_OF_LINE.match(buf, end)
        if line_end is None:
            self._copy_header_without_newline(pos, end, eof)
            return None
        line, offset = self._where(pos)
        start = CopyStart(buf[pos : line_end.end()], line, offset, copy["table"], copy["columns"])
        self._copy = start
        return start, line_end.end()

    def _surely_cut_off(self, pos: int) -> bool:
        """Whether the INSERT at `pos` is surely cut off, without reading it: no `;` follows (bytes.find, at C
        speed), and it is too short to be handed on in pieces. Reading it in one pass and then the usual way, at
        each arrival of more input, cost a value of megabytes twice the scans it cost before."""
        return self._buf.find(b";", pos) < 0 and (
            self._pieces_after is None or len(self._buf) - pos <= self._pieces_after
        )

    def _insert_in_one_pass(self, pos: int) -> tuple[Item, int] | int:
        """The multi-row INSERT at `pos` and its end, where one pass reads it: with the reader's patterns
        (`read_tuples_with`), else where its tuples are as pg_dump writes them; else how far it holds no `;`."""
        if self._checked_inserts is not None:
            read = self._checked_inserts.read(self._buf, pos)
        else:
            read = read_plain_insert(self._buf, pos)
        if isinstance(read, int):
            return read
        return InsertRows(read[0], *self._where(pos)), read[1]

    def _first_insert_piece(self, pos: int, scanned: int, eof: bool) -> tuple[Item, int] | None:
        """The first piece of the INSERT at `pos`, which the input cuts off after `scanned`, where it is handed on
        in pieces; else None, waiting for more input."""
        long = self._pieces_after is not None and scanned - pos > self._pieces_after
        piece = first_insert_piece(self._buf, pos) if long and not eof and self._checked_inserts is None else None
        if piece is None:
            self._incomplete_statement(pos, eof)
            return None
        self._open_insert = piece[0]
        return InsertRows(piece[0], *self._where(pos)), piece[1]

    def _insert_piece_step(self, pos: int, eof: bool) -> tuple[Item, int] | None:
        """The next piece of the INSERT handed on in pieces: at `pos` the last tuple of the piece before (which may
        have continued) and what follows."""
        assert self._open_insert is not None
        buf = self._buf
        rows, end, before_last = plain_tuples(buf, pos)
        tail = INSERT_TAIL.match(buf, end) if rows else None
        if tail is not None and tail["tail"] is None:
            item = InsertRows(insert_piece(self._open_insert, buf, pos, end, rows), *self._where(pos))
            self._open_insert = None
            return item, tail.end()
        if tail is None and rows >= 2:
            return InsertRows(insert_piece(self._open_insert, buf, pos, before_last, rows - 1), *self._where(pos)), (
                before_last
            )
        if tail is None and statement_end(buf, end) is None:
            self._incomplete_statement(pos, eof)
            return None
        raise self._error(
            f"an INSERT handed on in pieces (more than {self._pieces_after} bytes) must go on with tuples as pg_dump "
            "writes them and end with ';': this one holds another kind of tuple or ends with ON CONFLICT",
            pos,
        )

    def _insert_run(self, pos: int, end: int) -> tuple[Item, int]:
        first = self._inserts.first(self._buf, pos, end)
        if first is None:
            return Statement(self._buf[pos:end], *self._where(pos)), end
        insert, run = first
        if run is not None:
            more, end = self._inserts.extend(self._buf, end, *run)
            if more:
                insert = insert.with_tuples([*insert.tuples, *more], insert.columns)
        return InsertRows(insert, *self._where(pos)), end

    def _copy_header_without_newline(self, pos: int, end: int, eof: bool) -> None:
        if eof or len(self._buf) - end > 64:
            raise self._error("a COPY ... FROM stdin statement must end its line", pos)
        self._wanted_bytes = 1

    def _check_command_word(self, pos: int, eof: bool) -> None:
        word = _FIRST_WORD.match(self._buf, pos, pos + _WORD_WINDOW)
        assert word is not None  # every part of the pattern may be empty
        decided = eof or len(self._buf) - pos >= _WORD_WINDOW
        if not decided and word[2] in (b"", b"/"):
            return  # the word, or a comment before it, may continue in the next chunk
        if word[1].upper() not in _COMMAND_WORDS:
            snippet = printable(self._buf[pos : pos + 40].split(b"\n")[0])
            raise self._error(f"unexpected text '{snippet}' where an SQL statement should start", pos)

    def _incomplete_statement(self, pos: int, eof: bool) -> None:
        """Wait for the rest of the statement at `pos`, or raise DumpSyntaxError at the end of the input."""
        if eof:
            raise self._error("the input ends inside this statement (unterminated literal or missing ';')", pos)
        self._wait_for_more(pos, "a statement")

    def _wait_for_more(self, pos: int, what: str) -> None:
        """The item from `pos` is incomplete: rescan only once the buffer has doubled (linear time for huge items),
        and refuse an item once more than max_item_bytes of it are held (bounded memory)."""
        pending, bound = len(self._buf) - pos, self._max_item_bytes
        if pending > bound:
            raise self._too_large(self._buf, pos, what)
        self._wanted_bytes = min(pending, bound + 1 - pending)  # rescan by the time it is too big
        self._waiting_for = what

    def _too_large(self, buf: bytes | bytearray, pos: int, what: str) -> TooLargeError:
        """The error for the item at `pos` of `buf` (the mark's position), longer than the bound, naming its table
        where it is COPY data or an INSERT."""
        if self._copy is not None:
            table: bytes | None = self._copy.table
        elif self._open_insert is not None:
            table = self._open_insert.table
        else:
            head = INSERT_HEAD.match(buf, pos, pos + _WORD_WINDOW)
            table = bytes(head["table"]) if head is not None else None
        line, offset = self._where(pos)
        return TooLargeError(what, table=table, limit=self._max_item_bytes, line=line, offset=offset)

    def _copy_step(self, pos: int, eof: bool) -> tuple[Item, int] | None:
        buf = self._buf
        if buf.startswith(b"\\.", pos):
            return self._copy_end(pos, eof)
        marker = _COPY_END_CANDIDATE.search(buf, pos)
        if marker is not None:
            return CopyRows(buf[pos : marker.start() + 1]), marker.start() + 1
        last_newline = buf.rfind(b"\n", pos)
        if last_newline >= 0:
            return CopyRows(buf[pos : last_newline + 1]), last_newline + 1
        if eof:
            raise self._copy_error("the input ends inside a COPY data row", pos)
        self._wait_for_more(pos, "a COPY data row")
        return None

    def _copy_end(self, pos: int, eof: bool) -> tuple[Item, int] | None:
        line_end = _REST_OF_LINE.match(self._buf, pos + 2)
        if line_end is not None:
            end = line_end.end()
        elif eof and self._buf[pos + 2 :].strip() == b"":
            end = len(self._buf)
        elif len(self._buf) - pos < 64 and not eof:
            return None
        else:
            raise self._error("a line starting with \\. inside COPY data must be the end marker alone", pos)
        self._copy = None
        return CopyEnd(self._buf[pos:end]), end

    def _copy_error(self, message: str, pos: int) -> DumpSyntaxError:
        assert self._copy is not None
        table = self._copy.table.decode("utf-8", errors="replace")
        start = f"line {self._copy.line}" if self._copy.line else f"byte {self._copy.offset}"
        return self._error(f"{message} (COPY of {table} from {start})", pos)

    def _check_complete(self) -> None:
        if self._copy is not None:
            raise self._copy_error("the input ends before the COPY data's \\. end marker", len(self._buf))
        if self._buf.strip() or self._open_insert is not None:
            raise self._error("the input ends inside this statement", 0)
