"""Tuples the superhub's literal patterns must refuse or accept on every Python it supports, also as a script:
`python literal_cases.py` checks them with the fedload that python imports (tests/install runs it on the fedload
installed on Debian's own Python) and exits 1 naming each wrong answer.

Python 3.11.0-3.11.4 (Debian 12's 3.11.2) matched a possessive repeated group wrongly (CPython gh-106052): the
failed half of its last iteration was kept, and each REFUSED tuple was taken."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from fedload.superhub.importer import _LITERAL_TUPLE, _literal_rows
from fedload.superhub.literal_copy import copy_rows_pattern

PATTERNS: dict[str, Callable[[], re.Pattern[bytes]]] = {
    "one tuple": lambda: _LITERAL_TUPLE,
    "tuples of one literal": lambda: _literal_rows(1),
    "copy rows (real)": lambda: copy_rows_pattern(("real",)),
    "copy rows (integer, text)": lambda: copy_rows_pattern(("integer", "text")),
}
REFUSED = (
    ("one tuple", b"(1,)"),
    ("one tuple", b"(true, -0.0, )"),
    ("one tuple", b"(null\n,)"),
    ("tuples of one literal", b"(-0),(1"),
    ("tuples of one literal", b"(NULL),("),
    ("copy rows (real)", b"(+2) ,(1"),
    ("copy rows (real)", b"(1.e-3),(.5),(.5"),
    ("copy rows (integer, text)", b"(1, '),(1, '),(1, ')"),
)
ACCEPTED = (
    ("one tuple", b"(1, 'it''s', NULL, E'a\\'b''c', true)"),
    ("tuples of one literal", b"(-0),(1),('),(')"),
    ("copy rows (real)", b"(+2) ,(1.e-3), (.5)"),
    ("copy rows (integer, text)", b"(1, '),(1, ''') , (2, 'x')"),
)


def matches(name: str, text: bytes) -> bool:
    return PATTERNS[name]().fullmatch(text) is not None


def wrong_answers() -> list[str]:
    """One line per case answered wrongly by the fedload imported here."""
    cases = [(name, text, False) for name, text in REFUSED] + [(name, text, True) for name, text in ACCEPTED]
    wrong = [(name, text, want) for name, text, want in cases if matches(name, text) != want]
    return [f"{name}: {text!r} {'refused' if want else 'taken'}" for name, text, want in wrong]


if __name__ == "__main__":
    wrong = wrong_answers()
    print("\n".join(wrong) or f"all {len(REFUSED) + len(ACCEPTED)} cases right on Python {sys.version.split()[0]}")
    sys.exit(1 if wrong else 0)
