"""A real OpenSSH server on 127.0.0.1 for the tests: temporary host key, client key, authorized_keys, config."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from fedload.config import SshConfig

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def keygen(path: Path) -> str:
    """Generate an ed25519 key pair at `path`; the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30)
    return Path(f"{path}.pub").read_text().strip()


class SshServer:
    """sshd in the foreground on a free loopback port; `kill()` takes down the listener and its sessions."""

    def __init__(self, directory: Path, forced_command: str | None = None) -> None:
        self.dir = directory
        self.port = _free_port()
        self.host_key = directory / "host_key"
        self.client_key = directory / "client_key"
        self.known_hosts = directory / "known_hosts"
        host_public = keygen(self.host_key)
        client_public = keygen(self.client_key)
        prefix = f'command="{forced_command}",restrict ' if forced_command else "restrict "
        (directory / "authorized_keys").write_text(prefix + client_public + "\n")
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_public}\n")
        config = directory / "sshd_config"
        config.write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {self.host_key}\n"
            f"AuthorizedKeysFile {directory}/authorized_keys\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
            f"PidFile {directory}/sshd.pid\nLogLevel VERBOSE\nMaxStartups 50\n"
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self._log = (directory / "sshd.log").open("wb")
        self._frozen: list[int] = []
        self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=self._log, start_new_session=True)
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"sshd exited: {(self.dir / 'sshd.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                time.sleep(0.05)
            else:
                return
        pytest.fail("sshd did not start listening within 20 s")

    def ssh_config(self, **overrides: object) -> SshConfig:
        """Client settings for this server (user root, the test key, the test known_hosts)."""
        settings: dict[str, object] = {
            "host": "127.0.0.1",
            "port": self.port,
            "user": "root",
            "identity": self.client_key,
            "known_hosts": self.known_hosts,
            "connect_timeout_s": 10,
            "read_timeout_s": 30,
            "keepalive_s": 2,
        }
        settings.update(overrides)
        return SshConfig.model_validate(settings)

    def kill(self) -> None:
        """SIGKILL sshd and every per-connection child (its process group and any session children)."""
        for pid in self._session_pids():
            with contextlib.suppress(ProcessLookupError):  # gone with its parent
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def freeze(self) -> None:
        """SIGSTOP sshd and its sessions: the link goes silent without closing, like a cable pulled mid-stream."""
        self._frozen = self._session_pids()
        for pid in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def _session_pids(self) -> list[int]:
        """sshd's descendants: its per-connection processes and the commands they run (nothing else's)."""
        found: list[int] = []
        parents = [self.process.pid]
        while parents:
            children = subprocess.run(
                ["pgrep", "-P", ",".join(map(str, parents))], capture_output=True, text=True, check=False, timeout=10
            )
            parents = [int(pid) for pid in children.stdout.split()]
            found += parents
        return found

    def stop(self) -> None:
        """Terminate sshd (and the sessions `freeze()` stopped) and close its log."""
        for pid in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        self._log.close()
