"""Real SSH servers on 127.0.0.1 for the tests: temporary host key, client key, authorized_keys, known_hosts.

Two servers: OpenSSH's sshd (what feeders run; needs the openssh-server package) and asyncssh's server in a
subprocess of its own (tests/support/asyncssh_server.py; needs nothing but the Python dependencies). Both run each
command as a real process of the current user, send its exit status, and can be killed or frozen mid-stream.
"""

from __future__ import annotations

import abc
import contextlib
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import asyncssh
import pytest

from fedload.config import SshConfig

SSHD = "/usr/sbin/sshd"
SERVERS = ("openssh", "asyncssh")
_START_TIMEOUT_S = 20


def require_openssh() -> None:
    """Skip without an OpenSSH server here; fail instead where FEDLOAD_REQUIRE_SSHD=1 (CI)."""
    if Path(SSHD).exists():
        return
    if os.environ.get("FEDLOAD_REQUIRE_SSHD") == "1":
        pytest.fail(f"OpenSSH server ({SSHD}) is required here (FEDLOAD_REQUIRE_SSHD=1) but not installed")
    pytest.skip(f"OpenSSH server not installed ({SSHD}; Debian: apt-get install openssh-server)")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _parent_pids() -> dict[int, int]:
    """Each running process's parent, from /proc (no procps needed)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # ended meanwhile
            fields = stat.read_text().rpartition(")")[2].split()  # after "pid (command)": state, ppid, ...
            parents[int(stat.parent.name)] = int(fields[1])
    return parents


def keygen(path: Path) -> str:
    """Write a new ed25519 key pair at `path` and `path`.pub (OpenSSH formats); the public key line."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    path.chmod(0o600)  # sshd refuses a host key others can read
    key.write_public_key(f"{path}.pub")
    return Path(f"{path}.pub").read_text().strip()


class SshServer(abc.ABC):
    """An SSH server on loopback for the current user; `kill()` takes down the listener and its sessions.

    A server that fails to start has already closed its log and stopped its process when the error is raised.
    """

    name = ""

    def __init__(self, directory: Path, forced_command: str | None = None) -> None:
        self.dir = directory
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.client_key = directory / "client_key"
        self.known_hosts = directory / "known_hosts"
        self.host_public = keygen(directory / "host_key")
        prefix = f'command="{forced_command}",restrict ' if forced_command else "restrict "
        (directory / "authorized_keys").write_text(prefix + keygen(self.client_key) + "\n")
        self._frozen: list[int] = []
        self._cleanup = contextlib.ExitStack()
        try:
            self._log = self._cleanup.enter_context((directory / f"{self.name}.log").open("wb"))
            self.process = self._start()
            self._cleanup.callback(self._terminate)
            self.port = self._wait_listening()
        except BaseException:
            self._cleanup.close()
            raise
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self.host_public}\n")

    @abc.abstractmethod
    def _start(self) -> subprocess.Popen[bytes]:
        """Start the server process, its output to `self._log`."""

    @abc.abstractmethod
    def _listening_port(self) -> int | None:
        """The port once the server accepts connections, else None."""

    def _wait_listening(self) -> int:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited: {(self.dir / f'{self.name}.log').read_text()[-2000:]}")
            if (port := self._listening_port()) is not None:
                return port
            time.sleep(0.05)
        pytest.fail(f"{self.name} did not start listening within {_START_TIMEOUT_S} s")

    def ssh_config(self, **overrides: object) -> SshConfig:
        """Client settings for this server (the current user, the test key, the test known_hosts)."""
        settings: dict[str, object] = {
            "host": "127.0.0.1",
            "port": self.port,
            "user": self.user,
            "identity": self.client_key,
            "known_hosts": self.known_hosts,
            "connect_timeout_s": 10,
            "read_timeout_s": 30,
            "keepalive_s": 2,
        }
        settings.update(overrides)
        return SshConfig.model_validate(settings)

    def kill(self) -> None:
        """SIGKILL the server and every per-connection child (its process group and any session children).

        The server goes first: killed after its session's command, a server that handles its connections itself
        (asyncssh's) could still see the command die and close the channel cleanly, with an exit status, which is
        not the lost connection this stands for. Its descendants are found before, while they are still its."""
        sessions = self._session_pids()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        for pid in sessions:
            with contextlib.suppress(ProcessLookupError):  # gone with its parent
                os.kill(pid, signal.SIGKILL)

    def freeze(self) -> None:
        """SIGSTOP the server and its sessions: the link goes silent without closing, like a cable pulled mid-stream."""
        self._frozen = [self.process.pid, *self._session_pids()]
        for pid in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def _session_pids(self) -> list[int]:
        """The server's descendants: its per-connection processes and the commands they run (nothing else's)."""
        found: list[int] = []
        parents = {self.process.pid}
        while parents:
            parents = {pid for pid, parent in _parent_pids().items() if parent in parents}
            found += parents
        return found

    def _terminate(self) -> None:
        """SIGKILL what `freeze()` stopped; SIGTERM the server's process group; wait for it."""
        for pid in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """Terminate the server (and the sessions `freeze()` stopped) and close its log; idempotent."""
        self._cleanup.close()


class OpenSshServer(SshServer):
    """OpenSSH's sshd in the foreground on a free loopback port."""

    name = "sshd"

    def _start(self) -> subprocess.Popen[bytes]:
        self._port = _free_port()
        config = self.dir / "sshd_config"
        config.write_text(
            f"ListenAddress 127.0.0.1\nPort {self._port}\nHostKey {self.dir}/host_key\n"
            f"AuthorizedKeysFile {self.dir}/authorized_keys\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
            f"PidFile {self.dir}/sshd.pid\nLogLevel VERBOSE\nMaxStartups 50\n"
        )
        with contextlib.suppress(PermissionError):  # sshd's privilege separation directory; made by root once
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        return subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=self._log, start_new_session=True)

    def _listening_port(self) -> int | None:
        try:
            socket.create_connection(("127.0.0.1", self._port), timeout=1).close()
        except OSError:
            return None
        return self._port


class AsyncsshServer(SshServer):
    """asyncssh's server (tests/support/asyncssh_server.py) in a subprocess on a free loopback port."""

    name = "asyncssh"

    def _start(self) -> subprocess.Popen[bytes]:
        script = Path(__file__).with_name("asyncssh_server.py")
        return subprocess.Popen(
            [sys.executable, str(script), str(self.dir)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,
        )

    def _listening_port(self) -> int | None:
        port_file = self.dir / "port"
        return int(port_file.read_text()) if port_file.exists() else None


def start_server(kind: str, directory: Path, forced_command: str | None = None) -> SshServer:
    """A running server of `kind` ("openssh" or "asyncssh") in `directory`; OpenSSH is required or skipped."""
    if kind == "openssh":
        require_openssh()
        return OpenSshServer(directory, forced_command)
    return AsyncsshServer(directory, forced_command)
