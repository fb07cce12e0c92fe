"""Where nothing may be missing (CI, FEDLOAD_NO_SKIPS=1), a skipped test fails with its reason."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

NO_SKIPS_ENV = "FEDLOAD_NO_SKIPS"  # .ci/run sets it: CI installs everything, so a skip there is a missing install


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, None]:
    """Where FEDLOAD_NO_SKIPS=1, a skipped test fails with its reason: nothing it needs may be missing there."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]  # pluggy's result object
    if os.environ.get(NO_SKIPS_ENV) == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped where nothing may be ({NO_SKIPS_ENV}=1): {reason}"
