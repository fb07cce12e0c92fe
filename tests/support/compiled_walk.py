"""The compiled fast walk of binary COPY's framing, for the tests that run it beside the Python one."""

from __future__ import annotations

import pytest

from fedload.superhub.binary_framing import RowsWalk


def compiled_rows() -> RowsWalk:
    """fedload/superhub/_binary_rows.c's walk; skipped (failed in CI) where the build could not make it."""
    try:
        from fedload.superhub._binary_rows import rows  # noqa: PLC0415
    except ImportError:
        pytest.skip("fedload/superhub/_binary_rows.c is not built here: the build found no C compiler or headers")
    return rows
