"""Parse pg_dump's `INSERT ... VALUES` statements into their parts, and build them back."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

from transforms.lexical import (
    DEFAULT_SCHEMA,
    INSERT_STATEMENT,
    TUPLE,
    VALUE,
    split_identifiers,
    unquote_identifier,
)

__all__ = ["Insert", "InsertRunMatcher", "format_insert", "parse_insert", "qualified_name", "split_tuple"]


@dataclass(frozen=True)
class Insert:
    """A single- or multi-row INSERT; identifiers and tuples are kept exactly as written.

    `values` is the text of the tuples as the statement has it (`(1, 'a'),\n\t(2, 'b')`), already proven to be
    tuples separated by commas; `tuples` splits it only when asked, as the superhub's COPY path never needs it."""

    table: bytes
    columns: tuple[bytes, ...] | None
    overriding: bytes
    values: bytes
    on_conflict_do_nothing: bool

    @functools.cached_property
    def tuples(self) -> list[bytes]:
        """Each tuple's text, parentheses included."""
        return TUPLE.findall(self.values)

    def with_tuples(self, tuples: list[bytes], columns: tuple[bytes, ...] | None) -> Insert:
        """This INSERT with other tuples and columns."""
        changed = dataclasses.replace(self, columns=columns, values=b",".join(tuples))
        changed.__dict__["tuples"] = tuples  # where cached_property keeps its value: they are split already
        return changed

    @property
    def batch_key(self) -> tuple[bytes, tuple[bytes, ...] | None, bytes, bool]:
        """Statements with equal keys may share one multi-row INSERT."""
        return self.table, self.columns, self.overriding, self.on_conflict_do_nothing


def parse_insert(statement: bytes) -> Insert | None:
    """The parts of an `INSERT INTO t [(cols)] VALUES (...), ...;` statement; None for any other statement."""
    match = INSERT_STATEMENT.fullmatch(statement)
    return None if match is None else _from_match(match)


def _from_match(match: re.Match[bytes]) -> Insert:
    columns = match["columns"]
    overriding = match["overriding"]
    return Insert(
        table=match["table"],
        columns=tuple(split_identifiers(columns)) if columns is not None else None,
        overriding=b" ".join(overriding.upper().split()) + b" " if overriding else b"",
        values=match["tuples"],
        on_conflict_do_nothing=match["tail"] is not None,
    )


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
    return [value.strip() for value in VALUE.findall(tuple_text, 1, len(tuple_text) - 1)]


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

    pg_dump's `--inserts` output is such runs. One regex call finds where a run ends and one `findall` takes
    its tuples, so per-row work stays in C. Runs compare bytes exactly, so a statement in a run parses exactly
    like the run's first statement.
    """

    _CACHE_LIMIT = 256

    def __init__(self) -> None:
        self._patterns: dict[tuple[bytes, bytes], tuple[re.Pattern[bytes], re.Pattern[bytes]]] = {}

    def first(self, buf: bytes, pos: int, end: int) -> tuple[Insert, tuple[bytes, bytes] | None] | None:
        """The INSERT in buf[pos:end] and, if it has a single tuple, the text before and after it, which a run of
        like statements shares; None if not an INSERT."""
        match = INSERT_STATEMENT.fullmatch(buf, pos, end)
        if match is None:
            return None
        single = match.start("more") == match.end("more")
        run = (buf[pos : match.start("tuples")], buf[match.end("tuples") : end]) if single else None
        return _from_match(match), run

    def extend(self, buf: bytes, pos: int, prefix: bytes, suffix: bytes) -> tuple[list[bytes], int]:
        """The tuples of the complete statements like prefix(tuple)suffix that follow at `pos`, and their end."""
        run, rows = self._compiled(prefix, suffix)
        match = run.match(buf, pos)
        assert match is not None  # the pattern matches the empty string
        if match.end() == pos:
            return [], pos
        return rows.findall(buf, pos, match.end()), match.end()

    def _compiled(self, prefix: bytes, suffix: bytes) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
        key = (prefix, suffix)
        patterns = self._patterns.get(key)
        if patterns is None:
            if len(self._patterns) >= self._CACHE_LIMIT:
                self._patterns.clear()
            one = rb"[ \t\r\n]*+" + re.escape(prefix) + rb"(" + TUPLE.pattern + rb")" + re.escape(suffix)
            patterns = self._patterns[key] = (
                re.compile(rb"(?:" + one + rb")*+", re.DOTALL),
                re.compile(one, re.DOTALL),
            )
        return patterns
