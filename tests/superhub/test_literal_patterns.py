"""The superhub's literal patterns accept the same tuples on every Python it supports: no possessive repeated group,
which Python 3.11.0-3.11.4 (Debian 12's 3.11.2) matched wrongly (CPython gh-106052). tests/install runs the same
cases on Debian's own Python."""

from __future__ import annotations

import re

import pytest

from fedload.superhub.importer import _LITERAL_TUPLE, _literal_rows
from fedload.superhub.literal_copy import copy_rows_pattern

PATTERNS = {
    "one tuple": lambda: _LITERAL_TUPLE,
    "tuples of one literal": lambda: _literal_rows(1),
    "copy rows (real)": lambda: copy_rows_pattern(("real",)),
    "copy rows (integer, text)": lambda: copy_rows_pattern(("integer", "text")),
}
# Each was accepted on Python 3.11.2 by the possessive forms: the failed half of the last iteration was kept.
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


def pattern(name: str) -> re.Pattern[bytes]:
    return PATTERNS[name]()


@pytest.mark.parametrize(("name", "text"), REFUSED)
def test_a_tuple_that_ends_inside_a_repetition_is_refused(name: str, text: bytes) -> None:
    """A comma or tuple left open after the last whole element is no match."""
    assert pattern(name).fullmatch(text) is None


@pytest.mark.parametrize(("name", "text"), ACCEPTED)
def test_whole_tuples_are_accepted(name: str, text: bytes) -> None:
    """Well-formed tuples, doubled quotes and escapes included, still match."""
    assert pattern(name).fullmatch(text) is not None
