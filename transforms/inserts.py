"""Parse pg_dump's `INSERT ... VALUES` statements into their parts, and build them back."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from transforms.lexical import (
    DEFAULT_SCHEMA,
    FAST_TUPLE,
    INSERT_HEAD,
    INSERT_TAIL,
    MORE_PLAIN_TUPLE,
    PLAIN_TUPLE,
    PLAIN_TUPLE_START,
    TUPLE,
    find_tuples,
    find_values,
    split_identifiers,
    tuples_span,
    unquote_identifier,
)

__all__ = [
    "CheckedInserts",
    "Insert",
    "InsertRunMatcher",
    "TuplesPatterns",
    "first_insert_piece",
    "format_insert",
    "insert_piece",
    "parse_insert",
    "plain_tuples",
    "qualified_name",
    "read_plain_insert",
    "split_tuple",
]


@dataclass(frozen=True)
class Insert:
    """A single- or multi-row INSERT; identifiers and tuples are kept exactly as written.

    `values` is the text of the tuples as the statement has it (`(1, 'a'),\n\t(2, 'b')`), already proven to be
    tuples separated by commas; `tuples` splits it only when asked, as the superhub's COPY path never needs it.
    `checked_by` is the caller's pattern (`CheckedInserts`) that matched `values` whole while the statement was read,
    if one did. `statement` is the whole statement as written (`;` included) where `read_plain_insert` read it, which
    may then go on unchanged; else empty."""

    table: bytes
    columns: tuple[bytes, ...] | None
    overriding: bytes
    values: bytes
    on_conflict_do_nothing: bool
    checked_by: re.Pattern[bytes] | None = field(default=None, compare=False, repr=False)
    statement: bytes = field(default=b"", compare=False, repr=False)

    @functools.cached_property
    def tuples(self) -> list[bytes]:
        """Each tuple's text, parentheses included."""
        return find_tuples(self.values)

    @functools.cached_property
    def rows(self) -> int:
        """The number of tuples; known without splitting them where the statement was read in one pass."""
        return len(self.tuples)

    def with_tuples(self, tuples: list[bytes], columns: tuple[bytes, ...] | None) -> Insert:
        """This INSERT with other tuples and columns."""
        changed = dataclasses.replace(self, columns=columns, values=b",".join(tuples), checked_by=None, statement=b"")
        changed.__dict__["tuples"] = tuples  # where cached_property keeps its value: they are split already
        return changed

    @property
    def batch_key(self) -> tuple[bytes, tuple[bytes, ...] | None, bytes, bool]:
        """Statements with equal keys may share one multi-row INSERT."""
        return self.table, self.columns, self.overriding, self.on_conflict_do_nothing


def parse_insert(statement: bytes) -> Insert | None:
    """The parts of an `INSERT INTO t [(cols)] VALUES (...), ...;` statement; None for any other statement."""
    parts = _InsertParts.match(statement, 0, len(statement))
    return None if parts is None else parts.insert()


@dataclass(frozen=True)
class _InsertParts:
    """Where the parts of an INSERT statement are: its head up to VALUES, its tuples, its tail."""

    buf: bytes
    head: re.Match[bytes]
    first_tuple_end: int
    tuples_end: int
    tail: re.Match[bytes]

    @classmethod
    def match(cls, buf: bytes, pos: int, end: int) -> _InsertParts | None:
        """The INSERT that is all of buf[pos:end] (`;` included), or None."""
        head = INSERT_HEAD.match(buf, pos, end)
        span = tuples_span(buf, head.end(), end) if head is not None else None
        tail = INSERT_TAIL.fullmatch(buf, span[1], end) if span is not None else None
        if head is None or span is None or tail is None:
            return None
        return cls(buf, head, span[0], span[1], tail)

    @property
    def single(self) -> bool:
        """Whether the statement has one tuple."""
        return self.first_tuple_end == self.tuples_end

    def insert(self, checked_by: re.Pattern[bytes] | None = None, statement: bytes = b"") -> Insert:
        """The statement as an Insert; with one tuple, its tuples are known without splitting them again."""
        columns = self.head["columns"]
        overriding = self.head["overriding"]
        values = self.buf[self.head.end() : self.tuples_end]
        insert = Insert(
            table=self.head["table"],
            columns=tuple(split_identifiers(columns)) if columns is not None else None,
            overriding=b" ".join(overriding.upper().split()) + b" " if overriding else b"",
            values=values,
            on_conflict_do_nothing=self.tail["tail"] is not None,
            checked_by=checked_by,
            statement=statement,
        )
        if self.single:
            insert.__dict__["tuples"] = [values]  # where cached_property keeps its value
        return insert


def read_plain_insert(buf: bytes, pos: int) -> tuple[Insert, int] | int:
    """The multi-row INSERT at `pos` and its end (after the `;`), read in one pass that counts its tuples, where all
    of them are as pg_dump writes them (`PLAIN_TUPLE`: there the statement's end is where `statement_end` finds it).
    Else a position up to which the statement holds no `;` and from which its end can be searched (as
    `CheckedInserts.read` answers): a single tuple, which may start a run of like statements, another kind of
    tuple, or a statement the buffer cuts off is read the usual way. The Insert keeps the statement's text
    (`Insert.statement`) and its row count, and splits its tuples only if asked."""
    head = INSERT_HEAD.match(buf, pos)
    if head is None:
        return pos
    start = PLAIN_TUPLE_START.match(buf, head.end())  # where a tuple cut off by the buffer ends, too: read once
    if start is None or not buf.startswith(b")", start.end()):
        return start.end() if start is not None else head.end()
    first_end = start.end() + 1
    more, tuples_end, _ = plain_tuples(buf, first_end)
    tail = INSERT_TAIL.match(buf, tuples_end)
    if not more or tail is None:
        return tuples_end
    insert = _InsertParts(buf, head, first_end, tuples_end, tail).insert(statement=buf[pos : tail.end()])
    insert.__dict__["rows"] = more + 1  # where cached_property keeps its value
    return insert, tail.end()


def plain_tuples(buf: bytes, pos: int) -> tuple[int, int, int]:
    """For the `PLAIN_TUPLE`s at `pos`, each after a comma: how many, where the last ends, and where the one before
    it ends (`pos` if none)."""
    # Pattern.scanner: CPython's (and PyPy's) anchored match-after-match, as in InsertRunMatcher.extend. The last two
    # matches and their numbers are kept by a deque of two: the loop runs in C and holds no list of matches.
    scanner = MORE_PLAIN_TUPLE.scanner(buf, pos)  # type: ignore[attr-defined]
    last = deque(zip(iter(scanner.match, None), itertools.count(1)), maxlen=2)
    if not last:
        return 0, pos, pos
    return last[-1][1], last[-1][0].end(), last[0][0].end() if len(last) == 2 else pos


def first_insert_piece(buf: bytes, pos: int) -> tuple[Insert, int] | None:
    """The start of the INSERT at `pos`, which the buffer cuts off, as an Insert of its `PLAIN_TUPLE`s but the last
    (which may continue) and where they end; None if it has fewer than two. The Insert names the statement's target,
    never ON CONFLICT, which only the statement's end can tell."""
    head = INSERT_HEAD.match(buf, pos)
    first = PLAIN_TUPLE.match(buf, head.end()) if head is not None else None
    if head is None or first is None:
        return None
    more, _, before_last = plain_tuples(buf, first.end())
    if not more:
        return None
    columns, overriding = head["columns"], head["overriding"]
    target = Insert(
        table=head["table"],
        columns=tuple(split_identifiers(columns)) if columns is not None else None,
        overriding=b" ".join(overriding.upper().split()) + b" " if overriding else b"",
        values=b"",
        on_conflict_do_nothing=False,
    )
    return insert_piece(target, buf, head.end(), before_last, more), before_last


def insert_piece(target: Insert, buf: bytes, pos: int, end: int, rows: int) -> Insert:
    """The `rows` tuples of buf[pos:end] (whitespace and a comma may lead) as an INSERT into `target`'s table."""
    values = buf[buf.index(b"(", pos, end) : end]
    piece = dataclasses.replace(target, values=values, checked_by=None, statement=b"")
    piece.__dict__["rows"] = rows  # where cached_property keeps its value
    return piece


def format_insert(first: Insert, tuples: list[bytes]) -> bytes:
    """A multi-row INSERT with the target of `first` and the given tuples, in pg_dump's layout."""
    columns = b" (" + b", ".join(first.columns) + b")" if first.columns is not None else b""
    tail = b" ON CONFLICT DO NOTHING" if first.on_conflict_do_nothing else b""
    return (
        b"".join(
            (
                b"INSERT INTO ",
                first.table,
                columns,
                b" ",
                first.overriding,
                b"VALUES\n\t",
                b",\n\t".join(tuples),
                tail,
            )
        )
        + b";\n"
    )


def split_tuple(tuple_text: bytes) -> list[bytes]:
    """The values of one `( ... )` tuple, stripped of surrounding whitespace."""
    return [value.strip() for value in find_values(tuple_text, 1, len(tuple_text) - 1)]


def qualified_name(table: bytes) -> str:
    """A table name as written in a dump (`public."Hosts"`), as `schema.name` text (`public.Hosts`)."""
    return ".".join(unquote_identifier(part) for part in split_identifiers(table))


def table_key(table: bytes) -> tuple[str, str]:
    """A table name as written in a dump (`public."a.b"`), as (schema, name) (`("public", "a.b")`); a name without
    schema is in DEFAULT_SCHEMA. Unlike `schema.name` text, the pair cannot mistake a dot in a name for the
    separator."""
    parts = [unquote_identifier(part) for part in split_identifiers(table)]
    return (DEFAULT_SCHEMA, parts[0]) if len(parts) == 1 else (parts[-2], parts[-1])


class InsertRunMatcher:
    """Finds runs of consecutive single-row INSERTs that share their text up to and after the tuple.

    pg_dump's `--inserts` output is such runs. One pattern, anchored at each statement in turn (a scanner), checks
    a statement and takes its tuple in one pass, so per-row work stays in C. Runs compare bytes exactly, so a
    statement in a run parses exactly like the run's first statement.
    """

    _CACHE_LIMIT = 256

    def __init__(self) -> None:
        self._patterns: dict[tuple[bytes, bytes], re.Pattern[bytes]] = {}

    def first(self, buf: bytes, pos: int, end: int) -> tuple[Insert, tuple[bytes, bytes] | None] | None:
        """The INSERT in buf[pos:end] and, if it has a single tuple, the text before and after it, which a run of
        like statements shares; None if not an INSERT."""
        parts = _InsertParts.match(buf, pos, end)
        if parts is None:
            return None
        run = (buf[pos : parts.head.end()], buf[parts.tuples_end : end]) if parts.single else None
        return parts.insert(), run

    def extend(self, buf: bytes, pos: int, prefix: bytes, suffix: bytes) -> tuple[list[bytes], int]:
        """The tuples of the complete statements like prefix(tuple)suffix that follow at `pos`, and their end.

        The run ends before a statement whose tuple is not as pg_dump writes them (`FAST_TUPLE`): that statement
        starts the next run (parsed by `first`), as a statement cut off by the end of the buffer does."""
        # Pattern.scanner: CPython's (and PyPy's) anchored match-after-match, which re.Scanner is built on.
        scanner = self._compiled(prefix, suffix).scanner(buf, pos)  # type: ignore[attr-defined]
        matches: list[re.Match[bytes]] = list(iter(scanner.match, None))
        return [match[1] for match in matches], matches[-1].end() if matches else pos

    def _compiled(self, prefix: bytes, suffix: bytes) -> re.Pattern[bytes]:
        key = (prefix, suffix)
        pattern = self._patterns.get(key)
        if pattern is None:
            if len(self._patterns) >= self._CACHE_LIMIT:
                self._patterns.clear()
            one = rb"[ \t\r\n]*" + re.escape(prefix) + rb"(" + FAST_TUPLE.pattern + rb")" + re.escape(suffix)
            pattern = self._patterns[key] = re.compile(one, re.DOTALL)
        return pattern


TuplesPatterns = Callable[[bytes, Optional[tuple[bytes, ...]]], Optional[re.Pattern[bytes]]]
"""For an INSERT's table and column list as written, the pattern of the tuples its reader takes whole; or None."""


class CheckedInserts:
    """Reads a multi-row INSERT in one pass of a pattern its reader gives for the statement's target.

    The superhub's importer gives, per table and column list as written, the pattern that proves a statement's
    tuples fit its COPY path (fedload.superhub.literal_copy). Matching it where the tuples start finds where they
    end, so the statement needs no other scan: not the lexical one that finds its `;`, nor the one that splits its
    tuples, nor the importer's own check, which trusts `Insert.checked_by`. A pattern must match comma-separated
    tuples, each whole (parentheses included), of strings, numbers and keywords only, and nothing after the last.
    A statement the pattern does not take whole (another kind of literal, a single tuple, which may start a run of
    like statements, or the input's end) is read the usual way, from where the pattern stopped."""

    _CACHE_LIMIT = 256

    def __init__(self, patterns: TuplesPatterns) -> None:
        self._patterns = patterns
        self._known: dict[tuple[bytes, tuple[bytes, ...] | None], re.Pattern[bytes] | None] = {}

    def read(self, buf: bytes, pos: int) -> tuple[Insert, int] | int:
        """The multi-row INSERT at `pos` and its end (after the `;`), read in one pass; else a position up to which
        the statement holds no `;` and from which its end can be searched (it is outside any literal)."""
        head = INSERT_HEAD.match(buf, pos)
        if head is None:
            return pos
        pattern = self._pattern(head["table"], head["columns"])
        tuples = pattern.match(buf, head.end()) if pattern is not None else None
        if pattern is None or tuples is None:
            return pos
        tail = INSERT_TAIL.match(buf, tuples.end())
        first = FAST_TUPLE.match(buf, head.end(), tuples.end()) or TUPLE.match(buf, head.end(), tuples.end())
        if tail is None or first is None or first.end() == tuples.end():
            return tuples.end()
        parts = _InsertParts(buf, head, first.end(), tuples.end(), tail)
        return parts.insert(checked_by=pattern), tail.end()

    def _pattern(self, table: bytes, column_list: bytes | None) -> re.Pattern[bytes] | None:
        columns = tuple(split_identifiers(column_list)) if column_list is not None else None
        key = (table, columns)
        if key not in self._known:
            if len(self._known) >= self._CACHE_LIMIT:
                self._known.clear()
            self._known[key] = self._patterns(table, columns)
        return self._known[key]
