"""Fixtures and hooks for PostgreSQL: the module's cluster, and the `pg_major` marker that picks the PostgreSQL
majors a test runs on."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from fedload.localpg import LocalCluster, PgInstall, find_installs, search_installs


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """One PostgreSQL 15 (or the lowest available) cluster for the module."""
    installs = find_installs()
    if not installs:
        pytest.fail("no PostgreSQL server binaries found")
    install = installs.get(15) or installs[min(installs)]
    running = LocalCluster(install, name="pipeline").start()
    yield running
    discard(running)


def discard(running: LocalCluster) -> None:
    """Stop the server, then remove its directory in the background: unlinking a module's hundreds of databases
    waits on their pages' writeback (42 s in a module's teardown at load 5, up to 105 s under more), which no
    test needs to wait for. `rm` runs detached (its shell exits at once) and outlives the test run if need be."""
    running.stop(remove=False)
    subprocess.run(
        ["sh", "-c", 'rm -rf -- "$1" &', "discard", str(running.dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=30,
        check=True,
    )


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
    discard(running)
