"""INSERT tuples as COPY rows: the fast path of inserts mode, for tuples whose meaning COPY keeps exactly.

A merged INSERT's tuples (`(1, 'it''s', NULL), (2, ...)`) are sent to the superhub as COPY data in CSV format with
`'` as the quote and escape character and `NULL` as the null marker: a SQL string literal is then, byte for byte,
a quoted CSV field with the same value, so only the whitespace around the values and the parentheses change, and
the text inside the strings is never touched. The server parses CSV instead of SQL, several times faster.

The path is taken only where COPY's reading of each value is provably the reading an INSERT would give, decided
per column from the staging table's type (`copy_rows_pattern`); anything else (E'' strings, bit strings,
DEFAULT, casts, a number for a text column, lowercase null, a negative zero for a float column, which an INSERT
turns into a positive zero) does not match, and the importer takes the INSERT path for that statement:

- a quoted string: the type's input function reads it in both cases (an INSERT's string literal has type unknown);
- NULL (upper case, as pg_dump writes it): the unquoted null marker; a quoted 'NULL' stays a string;
- an unsigned or signed integer, for smallint, integer and bigint columns: the same integer or the same error;
- any decimal number for numeric, real and double precision columns (an INSERT converts the numeric constant
  through its text, so the value is the one the type's input function reads), but no negative zero;
- true and false (lower case, as pg_dump writes them), for boolean columns.
"""

from __future__ import annotations

import functools
import re

__all__ = ["CSV_NULL", "CSV_QUOTE", "copy_rows_pattern", "csv_rows"]

CSV_QUOTE = "'"
"""The CSV quote and escape character of the COPY: a SQL string literal is then a quoted field of the same value."""
CSV_NULL = "NULL"
"""The CSV null marker of the COPY: NULL unquoted, as an INSERT writes it."""

# Repeated groups are atomic, not possessive: see importer._LITERAL (Python before 3.11.5 matched those wrongly).
_STRING = rb"'[^']*+(?>(?:''[^']*+)*)'"
_INTEGER = rb"[+-]?\d++"
_UNSIGNED_DECIMAL = rb"(?:\d++(?:\.\d*+)?|\.\d++)(?:[eE][+-]?\d++)?"
_DECIMAL = rb"(?:\+?|-(?=[0.]*+[1-9]))" + _UNSIGNED_DECIMAL  # a minus only before a non-zero mantissa
_BOOLEAN = rb"true|false"
_BY_TYPE = {
    "smallint": _INTEGER,
    "integer": _INTEGER,
    "bigint": _INTEGER,
    "numeric": _DECIMAL,
    "real": _DECIMAL,
    "double precision": _DECIMAL,
    "boolean": _BOOLEAN,
}
_WHITESPACE = b" \t\n\r\f\v"


def _value(base_type: str) -> bytes:
    """The literals a column of this type takes on the COPY path."""
    unquoted = _BY_TYPE.get(base_type)
    return rb"(?:" + _STRING + rb"|NULL" + (rb"|" + unquoted if unquoted else b"") + rb")"


@functools.lru_cache(maxsize=256)
def copy_rows_pattern(base_types: tuple[str, ...]) -> re.Pattern[bytes]:
    """Comma-separated tuples whose values, column by column, mean the same to COPY as to an INSERT."""
    values = rb"\s*+,\s*+".join(_value(t) for t in base_types)
    row = rb"\(\s*+" + values + rb"\s*+\)"
    return re.compile(row + rb"(?>(?:\s*+,\s*+" + row + rb")*)", re.DOTALL)


def csv_rows(tuples: bytes) -> bytes:
    """The CSV rows of tuples that `copy_rows_pattern` matched: whitespace between values and the parentheses
    go, a new line ends each tuple; the quoted strings are copied as they are.

    Splitting at `'` alternates between text outside strings (even parts) and inside them (odd parts); a doubled
    `''` inside a string leaves an empty even part, which nothing changes. The even parts are edited together,
    joined by a NUL (which the pattern admits only inside strings), in a few passes of C; the first tuple's `(`
    and the last one's `)` go from them too, so the rows are joined once and never copied again."""
    parts = tuples.split(b"'")
    outside = b"\0".join(parts[::2]).translate(None, _WHITESPACE).replace(b"),(", b"\n")
    parts[::2] = (outside[1:-1] + b"\n").split(b"\0")
    return b"'".join(parts)
