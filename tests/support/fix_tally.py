"""The tally of the fault and adversarial tests: each names its category; the summary prints tried / survived.

A test asks for the `category` fixture and calls it with a name such as "fault:superhub-restart"; fuzz tests
may also count the inputs they tried with `category.inputs(n)`. A test "survived" when none of its phases failed;
a skipped test (say, a mount that is not allowed here) is not tried, and its category says how many were skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest


@dataclass(slots=True)
class Tally:
    """What happened in one category."""

    tried: int = 0
    survived: int = 0
    inputs: int = 0
    skipped: int = 0


@dataclass(slots=True)
class _Registry:
    tallies: dict[str, Tally] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)  # test ids with a failed phase
    skipped: set[str] = field(default_factory=set)  # test ids skipped: they tried nothing

    def settle(self, report: pytest.TestReport) -> None:
        """Count the test's categories, which it recorded as user properties (so that they travel with its
        reports from a pytest-xdist worker to the process that prints the tally)."""
        passed = report.nodeid not in self.failed
        self.failed.discard(report.nodeid)
        skipped = report.nodeid in self.skipped
        self.skipped.discard(report.nodeid)
        properties = report.user_properties
        inputs = sum(int(str(value)) for key, value in properties if key == _INPUTS)
        for name in dict.fromkeys(str(value) for key, value in properties if key == _CATEGORY):
            tally = self.tallies.setdefault(name, Tally())
            if skipped:
                tally.skipped += 1
                continue
            tally.tried += 1
            tally.survived += passed
            tally.inputs += inputs


_REGISTRY = _Registry()
_CATEGORY, _INPUTS = "fedload_category", "fedload_inputs"


class Category:
    """Registers the running test under fault/adversarial categories."""

    def __init__(self, node: pytest.Item) -> None:
        self._properties = node.user_properties

    def __call__(self, name: str) -> None:
        """Count this test as one try of category `name`."""
        self._properties.append((_CATEGORY, name))

    def inputs(self, count: int = 1) -> None:
        """Add `count` inputs (fuzz examples, corpus entries) tried by this test."""
        self._properties.append((_INPUTS, count))


@pytest.fixture
def category(request: pytest.FixtureRequest) -> Category:
    """Name the test's fault or adversarial category (or several) for the end-of-run tally."""
    assert isinstance(request.node, pytest.Item)
    return Category(request.node)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Settle a test's categories after its teardown: survived if no phase failed; a skipped test is not counted."""
    if report.skipped:
        _REGISTRY.skipped.add(report.nodeid)
    elif report.failed:
        _REGISTRY.failed.add(report.nodeid)
    if report.when == "teardown":
        _REGISTRY.settle(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per category: tests tried, tests survived, and inputs tried where counted."""
    if not _REGISTRY.tallies:
        return
    terminalreporter.write_sep("=", "fault and adversarial categories (tried / survived)")
    width = max(map(len, _REGISTRY.tallies))
    for name, tally in sorted(_REGISTRY.tallies.items()):
        inputs = f"  ({tally.inputs} inputs)" if tally.inputs else ""
        flag = "" if tally.survived == tally.tried else "  <- not all survived"
        flag += f"  <- {tally.skipped} skipped" if tally.skipped else ""
        counts = f"{tally.tried:>3} tried  {tally.survived:>3} survived"
        terminalreporter.write_line(f"{name:<{width}}  {counts}{inputs}{flag}")
