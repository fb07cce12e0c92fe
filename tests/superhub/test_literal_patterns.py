"""The superhub's literal patterns accept the same tuples on every Python it supports: no possessive repeated group,
which Python 3.11.0-3.11.4 (Debian 12's 3.11.2) matched wrongly (CPython gh-106052). tests/install runs the same
cases (tests/superhub/literal_cases.py) on the fedload installed on Debian's own Python."""

from __future__ import annotations

import pytest

from tests.superhub.literal_cases import ACCEPTED, REFUSED, matches


@pytest.mark.parametrize(("name", "text"), REFUSED)
def test_a_tuple_that_ends_inside_a_repetition_is_refused(name: str, text: bytes) -> None:
    """A comma or tuple left open after the last whole element is no match."""
    assert not matches(name, text)


@pytest.mark.parametrize(("name", "text"), ACCEPTED)
def test_whole_tuples_are_accepted(name: str, text: bytes) -> None:
    """Well-formed tuples, doubled quotes and escapes included, still match."""
    assert matches(name, text)
