"""A cluster's lifecycle: one throwaway cluster in a temporary directory, initdb, start, halt, resume, stop, remove."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from fedload.errors import ConfigError
from fedload.localpg.account import TIMEOUT_S, closed_to, run_as, server_user
from fedload.localpg.installs import PgInstall

__all__ = ["LocalCluster"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LocalCluster:
    """One throwaway cluster in a temporary directory; `start()`, then `stop()` removes everything."""

    def __init__(
        self, install: PgInstall, *, name: str = "pg", base_dir: Path | None = None, crash_safe: bool = False
    ) -> None:
        """`crash_safe`: a commit survives the server's crash (`halt(mode="immediate")`), as on a real server; else
        commits are acknowledged before their WAL is written (`synchronous_commit = off`), and the last ones may be
        lost in a crash. Neither syncs to disk (`fsync = off`): a crashed server is what tests play, not a crashed
        machine."""
        self.install = install
        self._crash_safe = crash_safe
        self.dir = Path(tempfile.mkdtemp(prefix=f"fedload-{name}-", dir=base_dir))
        self.data = self.dir / "data"
        self.port = _free_port()  # only names the socket file: the server listens on no TCP port
        self._user = server_user()

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
            "-c fsync=off -c full_page_writes=off -c max_connections=50"
        )
        if not self._crash_safe:
            options += " -c synchronous_commit=off"
        pg_ctl = ["pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-o", options, "-w"]
        try:
            self._run([*pg_ctl, "-t", str(int(TIMEOUT_S)), "start"])
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
            run_as(self._user, command, cwd=self.dir)
        except subprocess.CalledProcessError as exc:
            raise ConfigError(f"{argv[0]} failed: {(exc.stderr or exc.stdout).strip()[-800:]}{self._hint()}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"{argv[0]} failed: {exc}{self._hint()}") from exc

    def _hint(self) -> str:
        """Why the server's user may have failed: a directory above the cluster's it cannot enter."""
        user = self._user
        blocked = closed_to(user, self.dir.parent) if user else None
        if user is None or blocked is None:
            return ""
        return (
            f"; the '{user.pw_name}' user that runs PostgreSQL cannot enter {blocked}, which holds the "
            "cluster's directory: set TMPDIR to a directory it can enter, such as /tmp"
        )
