"""Reading an install's PostgreSQL major from `postgres --version`."""

from __future__ import annotations

import pytest

from fedload.localpg.installs import _major


@pytest.mark.parametrize(
    ("version", "major"),
    [
        ("postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)", 15),
        ("postgres (PostgreSQL) 9.6.24", 9),
        ("postgres (PostgreSQL) 18beta1", 18),
        ("postgres (PostgreSQL) 19devel", 19),
        ("postgres (PostgreSQL) unknown", None),
        ("", None),
    ],
)
def test_the_major_is_the_leading_number_of_the_version(version: str, major: int | None) -> None:
    """A release, an old two-part release and a pre-release give their major; no number gives None, not a crash."""
    assert _major(version) == major
