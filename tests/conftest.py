"""The tests' shared fixtures, and the tally of the fault and adversarial tests.

Fixtures: `cluster` (a PostgreSQL cluster per module), `federation` (a superhub and three feeder databases on it),
`start_daemon` (`fedload daemon` processes, killed at the end), `sshd` (a real SSH server on loopback: each test
runs against OpenSSH's sshd, skipped where it is not installed unless FEDLOAD_REQUIRE_SSHD=1, and against
asyncssh's server, which needs no system package).

Tally: each fault or adversarial test names its category; the summary prints tried / survived.

A test asks for the `category` fixture and calls it with a name such as "fault:superhub-restart"; fuzz tests
may also count the inputs they tried with `category.inputs(n)`. A test "survived" when none of its phases failed;
a skipped test (say, a mount that is not allowed here) is not tried, and its category says how many were skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fedload.localpg import LocalCluster, PgInstall, find_installs, search_installs
from tests.support.federation import DaemonProcess, Federation, make_federation
from tests.support.sshd import SERVERS, SshServer, start_server


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """One PostgreSQL 15 (or the lowest available) cluster for the module."""
    installs = find_installs()
    if not installs:
        pytest.fail("no PostgreSQL server binaries found")
    install = installs.get(15) or installs[min(installs)]
    running = LocalCluster(install, name="pipeline").start()
    yield running
    running.stop()


REQUIRE_MAJORS_ENV = "FEDLOAD_REQUIRE_MAJORS"  # .ci/run lists every major: there a missing one fails


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked `pg_major(N, ...)` that uses `pg_major` (or `pg_install`, `major_cluster`) runs once per
    major, as its module-scoped `pg_major` parameter: the tests of one major share that major's module fixtures."""
    marker = metafunc.definition.get_closest_marker("pg_major")
    if marker is None or "pg_major" not in metafunc.fixturenames:
        return
    majors = [int(major) for major in marker.args]
    metafunc.parametrize("pg_major", majors, ids=[f"pg{major}" for major in majors], scope="module")


def needed_majors(item: pytest.Item) -> list[int]:
    """The PostgreSQL majors `item` needs: its `pg_major` parameter (from the marker, or parametrized by the test
    itself where its majors go with other parameters), else every major its `pg_major` markers name."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "pg_major" in callspec.params:
        return [int(callspec.params["pg_major"])]
    return [int(major) for marker in item.iter_markers("pg_major") for major in marker.args]


def require_major(major: int) -> None:
    """Fail (in CI, where FEDLOAD_REQUIRE_MAJORS lists it) or skip when a PostgreSQL major is not installed."""
    if major in find_installs():
        return
    required = {int(m) for m in os.environ.get(REQUIRE_MAJORS_ENV, "").split(",") if m}
    if major in required:
        problems = search_installs().problems
        pytest.fail(f"PostgreSQL {major} binaries are required here but not found (or not usable: {problems})")
    pytest.skip(f"PostgreSQL {major} binaries not installed")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture starts a cluster: a test whose PostgreSQL major is not installed is skipped, or fails
    where FEDLOAD_REQUIRE_MAJORS lists that major."""
    for major in needed_majors(item):
        require_major(major)


@pytest.fixture(scope="module")
def pg_major(request: pytest.FixtureRequest) -> int:
    """The PostgreSQL major of the test, which its `pg_major(N, ...)` marker parametrizes (the marker is missing
    when this runs)."""
    pytest.fail(f"{request.node.nodeid} uses pg_major without a pg_major(N) marker or parameter")


@pytest.fixture(scope="module")
def pg_install(pg_major: int) -> PgInstall:
    """The install of the test's PostgreSQL major (installed: `pytest_runtest_setup` has seen to it)."""
    return find_installs()[pg_major]


@pytest.fixture(scope="module")
def major_cluster(pg_major: int, cluster: LocalCluster) -> Iterator[LocalCluster]:
    """A cluster of the test's PostgreSQL major for the module: `cluster` itself if it is of that major."""
    if cluster.install.major == pg_major:
        yield cluster
        return
    running = LocalCluster(find_installs()[pg_major], name=f"pg{pg_major}").start()
    yield running
    running.stop()


@pytest.fixture
def federation(cluster: LocalCluster, tmp_path: Path) -> Federation:
    """A fresh superhub database and three feeder databases with 300, 200 and 100 hosts."""
    return make_federation(cluster, tmp_path)


@pytest.fixture
def start_daemon(federation: Federation) -> Iterator[Callable[..., DaemonProcess]]:
    """Start daemons with a given config text (and environment); kill leftovers at the end."""
    started: list[DaemonProcess] = []

    def start(text: str, env: dict[str, str] | None = None) -> DaemonProcess:
        path = federation.tmp / "fedload.toml"
        path.write_text(text)
        daemon = DaemonProcess(path, federation.tmp / f"daemon{len(started)}.log", env)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait(timeout=30)
        daemon.close_log()


@pytest.fixture(params=SERVERS)
def sshd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SshServer]:
    """A running SSH server, OpenSSH's or asyncssh's, allowing any command for the test key."""
    directory = tmp_path / "sshd"
    directory.mkdir()
    server = start_server(request.param, directory)
    yield server
    server.stop()


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
