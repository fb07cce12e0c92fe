"""Byte-level regular expressions for the parts of SQL that pg_dump writes.

Every pattern keeps string literals (standard `'..''..'`, escape `E'..\\'..'`), quoted identifiers and comments
intact, so a `;`, `(` or newline inside them never splits a statement, tuple or value. Possessive quantifiers
(Python 3.11) keep the engine from backtracking into them, and make an unterminated literal a plain non-match:
the caller then reads more input or reports the literal as unterminated.
"""

from __future__ import annotations

import re

__all__ = [
    "COLUMN_LIST",
    "COPY_FROM_STDIN",
    "DEFAULT_SCHEMA",
    "IDENTIFIER",
    "INSERT_STATEMENT",
    "STATEMENT",
    "TUPLE",
    "VALUE",
    "split_identifiers",
    "unquote_identifier",
]

DEFAULT_SCHEMA = "public"  # where a name without schema is, for pg_dump and fedload

_IDENT_START = rb"A-Za-z_\x80-\xff"
_IDENT_CHAR = rb"A-Za-z0-9_$\x80-\xff"

_ESCAPE_STRING = rb"[Ee]'(?:[^'\\]++|\\.|'')*+'"
_STANDARD_STRING = rb"'[^']*+'"  # '' inside a literal reads as two adjacent literals: same extent
_QUOTED_IDENT = rb'"[^"]*+"'  # "" likewise
_LINE_COMMENT = rb"--[^\n]*+"
_BLOCK_COMMENT = rb"/\*(?:[^*]++|\*(?!/))*+\*/"
_DOLLAR_QUOTE = (
    rb"(?<![" + _IDENT_CHAR + rb"])(?P<dq>\$(?:[" + _IDENT_START + rb"][" + _IDENT_START + rb"0-9]*+)?\$)"
    rb".*?(?P=dq)"
)
# A lone `$`, `/`, `-` or `E` that does not open a literal or comment. `$` is a quote opener only when it is not
# part of an identifier and is followed by `tag$`; an opener cut off by the end of the buffer is no lone `$`
# either, so a partial dollar-quoted body never yields a `;`.
_LONE_SPECIAL = rb"(?<=[" + _IDENT_CHAR + rb"])\$|\$(?![" + _IDENT_START + rb"0-9]*+(?:\$|\Z))|/(?!\*)|-(?!-)|[Ee](?!')"

_STATEMENT_BODY = (
    rb"(?:[^;'\"$\-/Ee]++|"
    + rb"|".join(
        (
            _ESCAPE_STRING,
            _STANDARD_STRING,
            _QUOTED_IDENT,
            _LINE_COMMENT,
            _BLOCK_COMMENT,
            _DOLLAR_QUOTE,
            _LONE_SPECIAL,
        )
    )
    + rb")*+"
)

STATEMENT = re.compile(_STATEMENT_BODY + rb";", re.DOTALL)
"""One whole SQL statement up to and including its terminating `;` (match at the statement start)."""

IDENTIFIER = rb'(?:"(?:[^"]|"")+"|[' + _IDENT_START + rb"][" + _IDENT_CHAR + rb"]*+)"
_QUALIFIED_NAME = IDENTIFIER + rb"(?:\s*+\.\s*+" + IDENTIFIER + rb")*+"
COLUMN_LIST = re.compile(IDENTIFIER)
"""Finds each identifier of a comma-separated column list."""


def _nested_parens(depth: int) -> bytes:
    """A parenthesised group whose literals are opaque, allowing `depth` levels of nested parentheses."""
    inner = rb"|".join((_ESCAPE_STRING, rb"[Ee](?!')", _STANDARD_STRING, _QUOTED_IDENT))
    group = rb"\((?:[^()'\"Ee]++|" + inner + rb")*+\)"
    for _ in range(depth):
        group = rb"\((?:[^()'\"Ee]++|" + inner + rb"|" + group + rb")*+\)"
    return group


_TUPLE = _nested_parens(3)
TUPLE = re.compile(_TUPLE, re.DOTALL)
"""One VALUES tuple `( ... )` including its parentheses."""

VALUE = re.compile(
    rb"(?:[^,()'\"Ee]++|"
    + rb"|".join((_ESCAPE_STRING, rb"[Ee](?!')", _STANDARD_STRING, _QUOTED_IDENT, _nested_parens(2)))
    + rb")++",
    re.DOTALL,
)
"""One value inside a tuple (surrounding whitespace included): everything up to the next top-level comma."""

INSERT_STATEMENT = re.compile(
    rb"INSERT\s++INTO\s++(?P<table>" + _QUALIFIED_NAME + rb")\s*+"
    rb"(?:\((?P<columns>\s*+" + IDENTIFIER + rb"(?:\s*+,\s*+" + IDENTIFIER + rb")*+\s*+)\)\s*+)?"
    rb"(?P<overriding>OVERRIDING\s++(?:SYSTEM|USER)\s++VALUE\s++)?"
    rb"VALUES\s*+(?P<tuples>" + _TUPLE + rb"(?P<more>(?:\s*+,\s*+" + _TUPLE + rb")*+))"
    rb"\s*+(?P<tail>ON\s++CONFLICT\s++DO\s++NOTHING\s*+)?;",
    re.DOTALL | re.IGNORECASE,
)
"""An `INSERT INTO name [(columns)] [OVERRIDING ...] VALUES (..), ... [ON CONFLICT DO NOTHING];` statement."""

COPY_FROM_STDIN = re.compile(
    rb"COPY\s++(?P<table>" + _QUALIFIED_NAME + rb")\s*+"
    rb"(?:\((?P<columns>\s*+" + IDENTIFIER + rb"(?:\s*+,\s*+" + IDENTIFIER + rb")*+\s*+)\)\s*+)?"
    rb"FROM\s++stdin\s*+;",
    re.IGNORECASE,
)
"""The `COPY name (columns) FROM stdin;` header that pg_dump writes before a block of text-format rows."""


def split_identifiers(column_list: bytes) -> list[bytes]:
    """The identifiers of a comma-separated list, as written (quoted ones keep their quotes)."""
    return COLUMN_LIST.findall(column_list)


def unquote_identifier(identifier: bytes) -> str:
    """The name an identifier denotes: quoted ones verbatim, unquoted ones folded to lower case."""
    if identifier.startswith(b'"'):
        return identifier[1:-1].replace(b'""', b'"').decode("utf-8", errors="surrogateescape")
    return identifier.lower().decode("utf-8", errors="surrogateescape")  # PostgreSQL folds ASCII letters only
