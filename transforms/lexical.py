"""Byte-level regular expressions for the parts of SQL that pg_dump writes.

Every pattern keeps string literals (standard `'..''..'`, escape `E'..\\'..'`), quoted identifiers and comments
intact, so a `;`, `(` or newline inside them never splits a statement, tuple or value.

The patterns mean the same on every Python 3 from 3.9: no possessive quantifier or atomic group (3.11 only, and
wrong before 3.11.5: CPython gh-106052, gh-100061). Each is written so that it can match in one way only: the
alternatives of a repetition start with different characters, and a run of one character class is followed by
something that cannot start with that class (Friedl's unrolled loops, `[^']*(?:''[^']*)*`). The engine then takes
the same first path a possessive quantifier would, and backtracking, where a match fails, finds nothing else to
try: failing costs linear time, also on a truncated or hostile dump.

A repetition that can run long (the tokens of a statement, the escapes of a literal) is matched in chunks by
`possessive()` or `possessive_runs()`, because sre keeps state for every iteration of a group until the whole
match ends: ~200 bytes per iteration, 100 times the input for a statement of quote pairs. The hot paths
(`statement_end`, `tuples_span`, `find_tuples`, `find_values`, and the run scanner in transforms.inserts) use
bounded repetitions (`{0,N}`, at most ~2 MB of state) that are faster still, and fall back to the exact patterns
for what the bounded ones do not take (E'' literals, nested parentheses, more than N tokens).
"""

from __future__ import annotations

import itertools
import re

__all__ = [
    "COLUMN_LIST",
    "COPY_FROM_STDIN",
    "DEFAULT_SCHEMA",
    "FAST_TUPLE",
    "IDENTIFIER",
    "INSERT_HEAD",
    "INSERT_TAIL",
    "MORE_PLAIN_TUPLE",
    "PLAIN_TUPLE",
    "PLAIN_TUPLE_START",
    "STATEMENT",
    "TUPLE",
    "VALUE",
    "find_tuples",
    "find_values",
    "possessive",
    "split_identifiers",
    "statement_end",
    "tuples_span",
    "unquote_identifier",
]

DEFAULT_SCHEMA = "public"  # where a name without schema is, for pg_dump and fedload

_CHUNK_TOKENS = 1024  # tokens per chunk of a possessive() repetition: memory is one frame per chunk
_FAST_TOKENS = 8192  # tokens (of a statement piece, a tuple, a value) a bounded fast pattern takes at most
_FAST_ESCAPES = 32  # escapes and '' pairs of an E'' literal the fast statement pattern takes at most
_FAST_TUPLES = 16  # tuples one call of the fast tuple-list pattern takes at most
_FAST_LIST_TOKENS = 1024  # tokens of each of those tuples, at most
_group_names = itertools.count(1)


def possessive(tokens: bytes, *, at_least_one: bool = False) -> bytes:
    """`(?:tokens)*+` (`++` if at_least_one) for every Python 3: greedy, and never backtracked into.

    The alternatives of `tokens` must not match the empty string, and what follows the repetition must fail where a
    token starts (or guard itself, as `'(?!')` does). Up to _CHUNK_TOKENS tokens are matched inside a lookahead,
    which sre never backtracks into and whose state it drops once it succeeds, then consumed by a backreference
    to it: each chunk is the first, greedy path through its tokens, memory is one frame per chunk, and where the
    rest of the pattern fails, undoing a chunk only retries that rest at the start of a token, where it fails."""
    name = b"_p%d" % next(_group_names)
    chunk = rb"(?:(?=(?P<%s>(?:%s){1,%d}))(?P=%s))" % (name, tokens, _CHUNK_TOKENS, name)
    return chunk + (b"+" if at_least_one else b"*")


def possessive_runs(normal: bytes, specials: bytes) -> bytes:
    """`(?:normal+|specials)*+` for every Python 3, as `possessive()` but faster: each chunk is an unrolled loop,
    runs of the `normal` class (which no special starts with) between up to _CHUNK_TOKENS specials. A chunk that
    takes nothing ends the repetition (sre stops a repetition at an empty iteration)."""
    name = b"_p%d" % next(_group_names)
    chunk = rb"(?=(?P<%s>%s))(?P=%s)" % (name, _bounded(normal, specials, _CHUNK_TOKENS), name)
    return rb"(?:%s)*" % chunk


def _bounded(normal: bytes, specials: bytes, limit: int) -> bytes:
    """Runs of the `normal` class and up to `limit` `specials` (which never start with a `normal` character):
    Friedl's unrolled loop, fast and unambiguous, but not backtracking-free: only for bounded inputs."""
    return rb"%s*(?:(?:%s)%s*){0,%d}" % (normal, specials, normal, limit)


_IDENT_START = rb"A-Za-z_\x80-\xff"
_IDENT_CHAR = rb"A-Za-z0-9_$\x80-\xff"

# An escape literal ends at a quote that is not the first of a '' pair: `(?!')` also keeps an undone chunk of a
# possessive() repetition from closing the literal early.


def _escape_string() -> bytes:
    """An E'' literal (a new pattern each time: its named group may appear once per pattern)."""
    return rb"[Ee]'" + possessive_runs(rb"[^'\\]", rb"\\.|''") + rb"'(?!')"


_ESCAPE_STRING = re.compile(_escape_string(), re.DOTALL)
_ESCAPE_STRING_FAST = rb"[Ee]'[^'\\]*(?:(?:\\.|'')[^'\\]*){0,%d}'(?!')" % _FAST_ESCAPES
_STANDARD_STRING = rb"'[^']*'"  # '' inside a literal reads as two adjacent literals: same extent
_QUOTED_IDENT = rb'"[^"]*"'  # "" likewise
_LINE_COMMENT = rb"--[^\n]*"
_BLOCK_COMMENT = rb"/\*.*?\*/"  # the first */ ends it, as pg_dump never nests comments


def _dollar_quote() -> bytes:
    """A dollar-quoted string (a new pattern each time, as `_escape_string`)."""
    tag = b"_dq%d" % next(_group_names)
    return rb"(?<![%s])(?P<%s>\$(?:[%s][%s0-9]*)?\$).*?(?P=%s)" % (_IDENT_CHAR, tag, _IDENT_START, _IDENT_START, tag)


# A lone `$`, `/`, `-` or `E` that does not open a literal or comment. `$` is a quote opener only when it is not
# part of an identifier and is followed by `tag$`; an opener cut off by the end of the buffer is no lone `$`
# either, so a partial dollar-quoted body never yields a `;`.
_LONE_SPECIAL = rb"(?<=[" + _IDENT_CHAR + rb"])\$|\$(?![" + _IDENT_START + rb"0-9]*(?:\$|\Z))|/(?!\*)|-(?!-)|[Ee](?!')"
_STATEMENT_NORMAL = rb"[^;'\"$\-/Ee]"


def _statement_specials(escape_string: bytes) -> bytes:
    """What breaks a run of `_STATEMENT_NORMAL` characters (a new pattern each time)."""
    specials = (_STANDARD_STRING, escape_string, _QUOTED_IDENT, _LINE_COMMENT, _BLOCK_COMMENT, _dollar_quote())
    return rb"|".join((*specials, _LONE_SPECIAL))


STATEMENT = re.compile(possessive_runs(_STATEMENT_NORMAL, _statement_specials(_escape_string())) + rb";", re.DOTALL)
"""One whole SQL statement up to and including its terminating `;` (match at the statement start)."""

_STATEMENT_PIECE = re.compile(
    _bounded(_STATEMENT_NORMAL, _statement_specials(_ESCAPE_STRING_FAST), _FAST_TOKENS), re.DOTALL
)


def statement_end(buf: bytes | bytearray, pos: int) -> int | None:
    """The end of the statement at `pos` (after its `;`), as `STATEMENT` finds it; None if it is incomplete.

    Reads the statement in pieces of a bounded pattern, which never backtracks (nothing follows it). A piece stops
    at `;`, at its bound, at the end of the input, or where no token matches: at a literal or comment the input
    cuts off (the next piece would scan it again: `_cut_off` looks for its end with bytes.find instead), or at an
    E'' literal with more escapes than a piece takes, or at a dollar quote the input cuts off."""
    while True:
        piece = _STATEMENT_PIECE.match(buf, pos)
        assert piece is not None  # it matches the empty string
        end = piece.end()
        if end == len(buf) or _cut_off(buf, end):
            return None
        if buf[end] == 0x3B:  # ;
            return end + 1
        if end == pos:
            literal = _ESCAPE_STRING.match(buf, end)
            if literal is None:
                return None
            end = literal.end()
        pos = end


def _cut_off(buf: bytes | bytearray, pos: int) -> bool:
    """Whether the standard literal, quoted identifier or block comment at `pos` has no end in `buf`."""
    opener = buf[pos]
    if opener in b"'\"":
        return buf.find(opener, pos + 1) < 0
    return opener == 0x2F and buf.find(b"*/", pos + 2) < 0  # / (else a lone / would have matched)


# A quoted identifier is never empty; it ends at a quote that is not the first of a "" pair.
def _identifier() -> bytes:
    """A quoted identifier (never empty; it ends at a quote that is not the first of a "" pair) or an unquoted one
    (all of it: `tVALUES` is one name). A new pattern each time, as `_escape_string`."""
    return (
        rb'(?:"(?:[^"]|"")' + possessive_runs(rb'[^"]', rb'""') + rb'"(?!")'
        rb"|[" + _IDENT_START + rb"][" + _IDENT_CHAR + rb"]*(?![" + _IDENT_CHAR + rb"]))"
    )


def _qualified_name() -> bytes:
    return _identifier() + possessive(rb"\s*\.\s*" + _identifier())


def _columns() -> bytes:
    return rb"\s*" + _identifier() + possessive(rb"\s*,\s*" + _identifier()) + rb"\s*"


IDENTIFIER = _identifier()
COLUMN_LIST = re.compile(IDENTIFIER)
"""Finds each identifier of a comma-separated column list."""


def _nested_parens(depth: int) -> bytes:
    """A parenthesised group whose literals are opaque, allowing `depth` levels of nested parentheses."""
    group = rb"\(" + possessive_runs(rb"[^()'\"Ee]", _tuple_specials()) + rb"\)"
    for _ in range(depth):
        group = rb"\(" + possessive_runs(rb"[^()'\"Ee]", _tuple_specials() + rb"|" + group) + rb"\)"
    return group


def _tuple_specials() -> bytes:
    return rb"|".join((_STANDARD_STRING, _escape_string(), rb"[Ee](?!')", _QUOTED_IDENT))


_TUPLE = _nested_parens(3)
TUPLE = re.compile(_TUPLE, re.DOTALL)
"""One VALUES tuple `( ... )` including its parentheses."""
_MORE_TUPLE = re.compile(rb"\s*,\s*" + _TUPLE, re.DOTALL)

# The tuples pg_dump writes: no E'' literal, no parentheses outside literals, a bounded number of literals.
_FLAT_SPECIALS = rb"'[^']*'|[Ee](?!')|\"[^\"]*\""
_FAST_TUPLE = rb"\(" + _bounded(rb"[^()'\"Ee]", _FLAT_SPECIALS, _FAST_TOKENS) + rb"\)"
FAST_TUPLE = re.compile(_FAST_TUPLE, re.DOTALL)
"""A tuple as pg_dump writes them (no E'' literal, no parentheses outside literals, at most _FAST_TOKENS
literals), as `TUPLE` matches it; faster, but for the other tuples it fails."""
# Tuples of up to _FAST_LIST_TOKENS tokens, up to _FAST_TUPLES of them; `full` matches if there may be more.
_MORE_FAST_TUPLE = rb"\s*,\s*\(" + _bounded(rb"[^()'\"Ee]", _FLAT_SPECIALS, _FAST_LIST_TOKENS) + rb"\)"
_FAST_MORE_TUPLES = re.compile(
    rb"(?:%s){0,%d}(?P<full>%s)?" % (_MORE_FAST_TUPLE, _FAST_TUPLES - 1, _MORE_FAST_TUPLE), re.DOTALL
)
_MORE_TUPLE_FAST_OR_EXACT = (re.compile(rb"\s*,\s*" + _FAST_TUPLE, re.DOTALL), _MORE_TUPLE)
_FAST_TUPLES_OR_FAILURE = re.compile(_FAST_TUPLE + rb"|(?=\()", re.DOTALL)  # b"" where a tuple is not fast


# The tuples pg_dump writes, read where nothing but `statement_end` has seen them: outside literals no `;`, no
# comment opener, no `$`, no E'' literal, no parentheses; so where these match, they read the text as the statement
# pattern does (its specials are exactly these), and a `;` after them ends the statement.
_PLAIN_NORMAL = rb"[^()'\"Ee;/$\-]"
_PLAIN_SPECIALS = rb"'[^']*'|\"[^\"]*\"|[Ee](?!')|-(?!-)"
PLAIN_TUPLE_START = re.compile(rb"\(" + _bounded(_PLAIN_NORMAL, _PLAIN_SPECIALS, _FAST_TOKENS), re.DOTALL)
"""The longest start of a `PLAIN_TUPLE`: where it ends, the text before holds no `;` and `statement_end` may go on."""
PLAIN_TUPLE = re.compile(PLAIN_TUPLE_START.pattern + rb"\)", re.DOTALL)
"""A tuple as pg_dump writes it, read as `STATEMENT` reads it: no `;`, `--`, `/`, `$`, E'' literal or parentheses
outside literals, at most _FAST_TOKENS literals and minus signs. Stricter than FAST_TUPLE, which may take a `;` or a
comment opener that `statement_end` reads otherwise."""
# pg_dump's separator first: trying it before the general one measured 20% faster.
MORE_PLAIN_TUPLE = re.compile(rb"(?:,\n\t|[ \t\r\n]*,[ \t\r\n]*)" + PLAIN_TUPLE.pattern, re.DOTALL)
"""A comma and a `PLAIN_TUPLE`, with whitespace (no comment) around the comma."""


def tuples_span(buf: bytes, pos: int, endpos: int) -> tuple[int, int] | None:
    """For the comma-separated tuples `( ... ), ( ... )` at `pos`: where the first ends, and where the last ends;
    None if no tuple is there."""
    first = FAST_TUPLE.match(buf, pos, endpos) or TUPLE.match(buf, pos, endpos)
    if first is None:
        return None
    pos = first.end()
    while True:
        more = _FAST_MORE_TUPLES.match(buf, pos, endpos)
        assert more is not None  # it matches the empty string
        pos = more.end()
        if more["full"] is None:  # the end, or a tuple the list pattern does not take
            one = next(filter(None, (p.match(buf, pos, endpos) for p in _MORE_TUPLE_FAST_OR_EXACT)), None)
            if one is None:
                return first.end(), pos
            pos = one.end()


def find_tuples(text: bytes) -> list[bytes]:
    """The tuples of `text` (comma-separated tuples), as `TUPLE.finditer` finds them."""
    found = _FAST_TUPLES_OR_FAILURE.findall(text)
    return [m.group() for m in TUPLE.finditer(text)] if b"" in found else found


VALUE = re.compile(
    possessive(
        rb"[^,()'\"Ee]+|"
        + rb"|".join((_escape_string(), rb"[Ee](?!')", _STANDARD_STRING, _QUOTED_IDENT, _nested_parens(2))),
        at_least_one=True,
    ),
    re.DOTALL,
)
"""One value inside a tuple (surrounding whitespace included): everything up to the next top-level comma."""

# A whole value up to a comma or the end, or b"" where a value starts that is not that simple.
_FAST_VALUES_OR_FAILURE = re.compile(
    rb"(?=[^,])" + _bounded(rb"[^,()'\"Ee]", _FLAT_SPECIALS, _FAST_TOKENS) + rb"(?=,|\Z)|(?=[^,])", re.DOTALL
)


def find_values(text: bytes, pos: int, endpos: int) -> list[bytes]:
    """The values of text[pos:endpos], the inside of a tuple, as `VALUE.finditer` finds them."""
    found = _FAST_VALUES_OR_FAILURE.findall(text, pos, endpos)
    return [m.group() for m in VALUE.finditer(text, pos, endpos)] if b"" in found else found


INSERT_HEAD = re.compile(
    rb"INSERT\s+INTO\s+(?P<table>" + _qualified_name() + rb")\s*"
    rb"(?:\((?P<columns>" + _columns() + rb")\)\s*)?"
    rb"(?P<overriding>OVERRIDING\s+(?:SYSTEM|USER)\s+VALUE\s+)?"
    rb"VALUES\s*(?=\()",
    re.IGNORECASE,
)
"""`INSERT INTO name [(columns)] [OVERRIDING ...] VALUES `, up to the first tuple."""

INSERT_TAIL = re.compile(rb"\s*(?P<tail>ON\s+CONFLICT\s+DO\s+NOTHING\s*)?;", re.IGNORECASE)
"""What follows the tuples of an INSERT: `[ON CONFLICT DO NOTHING];`."""

COPY_FROM_STDIN = re.compile(
    rb"COPY\s+(?P<table>" + _qualified_name() + rb")\s*(?:\((?P<columns>" + _columns() + rb")\)\s*)?FROM\s+stdin\s*;",
    re.IGNORECASE,
)
"""The `COPY name (columns) FROM stdin;` header that pg_dump writes before a block of text-format rows."""


def split_identifiers(column_list: bytes) -> list[bytes]:
    """The identifiers of a comma-separated list, as written (quoted ones keep their quotes)."""
    return [m.group() for m in COLUMN_LIST.finditer(column_list)]


def unquote_identifier(identifier: bytes) -> str:
    """The name an identifier denotes: quoted ones verbatim, unquoted ones folded to lower case."""
    if identifier.startswith(b'"'):
        return identifier[1:-1].replace(b'""', b'"').decode("utf-8", errors="surrogateescape")
    return identifier.lower().decode("utf-8", errors="surrogateescape")  # PostgreSQL folds ASCII letters only
