"""psql-style `schema.table` patterns as regular expressions: the one reading of `superhub.tables`, of
`exclude_tables` (through `fedload.names.TablePattern`) and of the tables a feeder's forced command allows.

PostgreSQL and pg_dump fold only ASCII letters to lower case (Python's `str.lower()` folds U+212A KELVIN SIGN to
`k`, among others), and pass any other character outside double quotes through as it is: so characters outside
ASCII are refused there (quote the name), and folding here is ASCII only.

Standard library only: it also runs in the agent's zipapp on the feeder's own Python (3.9 and later).
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable

__all__ = ["NotAsciiError", "exact_name", "translate"]

_PLAIN = re.compile(r"[a-z0-9_$]")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


class NotAsciiError(ValueError):
    """A character outside ASCII and outside double quotes, which this module and pg_dump could fold differently."""


def translate(text: str) -> list[str]:
    """The pattern's dot-separated parts as regular expressions; ValueError for what cannot match as written."""
    return _parts(text, re.escape, _unquoted_regex)


def _parts(text: str, quoted: Callable[[str], str], unquoted: Callable[[str, int], tuple[str, int]]) -> list[str]:
    """Split `text` at dots outside double quotes ("" inside quotes is one "): each quoted character becomes
    `quoted(char)`, each unquoted one `unquoted(text, i)`, which gives its piece and the index it ended at."""
    parts: list[str] = []
    current: list[str] = []
    inside, i = False, 0
    while i < len(text):
        char = text[i]
        if char == '"':
            if inside and text[i + 1 : i + 2] == '"':
                current.append('"')
                i += 1
            else:
                inside = not inside
        elif inside:
            current.append(quoted(char))
        elif char == ".":
            parts.append("".join(current))
            current = []
        else:
            piece, i = unquoted(text, i)
            current.append(piece)
        i += 1
    if inside:
        raise ValueError(f"{text!r} has an unclosed double quote")
    return [*parts, "".join(current)]


def _unquoted_regex(text: str, i: int) -> tuple[str, int]:
    char = text[i]
    if char in "*?":
        return (".*" if char == "*" else "."), i
    if char == "[":
        end = text.find("]", i + 1)
        if end < 0:
            raise ValueError(f"{text!r} has a '[' without its ']'")
        return "[" + _class_body(text, text[i + 1 : end]) + "]", end
    return _plain(text, char), i


def _class_body(text: str, body: str) -> str:
    if not body or not all(_PLAIN.fullmatch(c) or c in "-^" for c in body):
        raise ValueError(f"{text!r}: a [...] class may hold only lower-case letters, digits, _, $, - and ^")
    return body.replace("$", "\\$")


def _plain(text: str, char: str) -> str:
    _refuse_non_ascii(text, char)
    if char.isupper():
        lower = _folded(text)
        raise ValueError(
            f"{text!r} has upper-case letters outside double quotes, which PostgreSQL folds to lower case: "
            f"write {lower!r} for the lower-case table, or quote the name to keep its case "
            f"(e.g. {_quoted_suggestion(text)!r})"
        )
    if not _PLAIN.fullmatch(char):
        raise ValueError(
            f"{text!r}: {char!r} may appear only inside double quotes (unquoted: letters, digits, _, $, * ? [...])"
        )
    return re.escape(char)


def _refuse_non_ascii(text: str, char: str) -> None:
    if char.isascii():
        return
    example = "" if any(c in text for c in '"*?[') else f" (e.g. {_all_quoted(_folded(text))!r})"
    raise NotAsciiError(
        f"{text!r} has {char!r} (U+{ord(char):04X}) outside double quotes, where pg_dump and this check could read "
        f"it differently: write names with characters beyond ASCII in double quotes, exactly as stored{example}"
    )


def _all_quoted(text: str) -> str:
    return ".".join('"' + part + '"' for part in text.split("."))


def _folded(text: str) -> str:
    """`text` with the ASCII letters outside double quotes in lower case, as pg_dump reads it."""
    pieces = text.split('"')  # even pieces are outside quotes ("" inside quotes leaves an empty even piece)
    return '"'.join(piece.translate(_ASCII_LOWER) if k % 2 == 0 else piece for k, piece in enumerate(pieces))


def _quoted_suggestion(text: str) -> str:
    schema, _, table = text.partition(".")
    return f'{schema}."{table}"' if table else f'"{text}"'


def exact_name(text: str) -> list[str]:
    """The dot-separated parts of a pattern that names exactly one thing (no wildcard, no class), as pg_dump reads
    them: unquoted ASCII letters folded to lower case, quoted text as it is; ValueError for a pattern that is not
    exact (NotAsciiError for a character beyond ASCII outside double quotes)."""
    return _parts(text, str, _unquoted_exact)


def _unquoted_exact(text: str, i: int) -> tuple[str, int]:
    char = text[i]
    _refuse_non_ascii(text, char)
    folded = char.translate(_ASCII_LOWER)
    if not _PLAIN.fullmatch(folded):
        raise ValueError(f"{text!r} is a pattern ({char!r} outside double quotes), not one table's name")
    return folded, i
