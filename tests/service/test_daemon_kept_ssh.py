"""The daemon's kept SSH connections, seen from OpenSSH's sshd: one connection and one authentication for many runs
of a feeder; closed when the feeder is paused, when a reload changes its SSH settings or removes it, and at the
daemon's end."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.federation import DaemonProcess, Federation, config_toml, fedload, runs_exist, successes
from tests.support.sshd import SshServer, start_server


@pytest.fixture
def openssh(tmp_path: Path) -> Iterator[SshServer]:
    """OpenSSH's sshd (what feeders run), skipped where it is not installed unless FEDLOAD_REQUIRE_SSHD=1."""
    directory = tmp_path / "sshd"
    directory.mkdir()
    server = start_server("openssh", directory)
    yield server
    server.stop()


def established(port: int) -> int:
    """TCP connections established to 127.0.0.1:`port` now, counted on the server's side (/proc/net/tcp)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if int(local.split(":")[1], 16) == port and state == "01":
            count += 1
    return count


def authentications(server: SshServer) -> int:
    """Keys sshd accepted so far (its VERBOSE log)."""
    return (server.dir / "sshd.log").read_text().count("Accepted publickey")


def ssh_toml(fed: Federation, server: SshServer, *, keepalive_s: int = 5) -> str:
    """The federation's configuration with hub1 reached over SSH (interval 0.5 s), hub2 local and rarely run, one
    worker process (two would each keep a connection of hub1 once hub2's run had sent hub1's to the other)."""
    text = config_toml(fed, interval_s=0.5).split("[feeders.hub3]")[0]
    text = text.replace("[superhub]\n", "[superhub]\nworker_processes = 1\n")
    hub1, hub2 = text.split("[feeders.hub2]")
    hub2 = "[feeders.hub2]" + hub2.replace("interval_s = 0.5", "interval_s = 3600")
    agent = f'agent_command = ["{sys.executable}", "-m", "fedload"]'
    hub1 = hub1.replace('transport = "local"', f'transport = "ssh"\n{agent}')
    ssh = server.ssh_config(keepalive_s=keepalive_s)
    hub1 += (
        f'[feeders.hub1.ssh]\nhost = "127.0.0.1"\nport = {ssh.port}\nuser = "{ssh.user}"\nidentity = "{ssh.identity}"\n'
        f'known_hosts = "{ssh.known_hosts}"\nkeepalive_s = {keepalive_s}\n'
    )
    return hub1 + hub2


def dropped(daemon: DaemonProcess, reason: str) -> bool:
    return any(
        e["event"] == "transport.kept_connection_dropped" and e["feeder"] == "hub1" and e["reason"] == reason
        for e in daemon.events()
    )


def test_the_daemon_keeps_one_connection_and_closes_it_when_the_feeder_changes(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess], openssh: SshServer
) -> None:
    """hub1 every 0.5 s over SSH: many runs on one TCP connection and one authentication. Paused: its connection
    closes; resumed: one new one. A reload that changes its keepalive closes the old one; a reload that removes
    it closes its connection; the daemon's end closes what it keeps."""
    path = federation.tmp / "fedload.toml"
    daemon = start_daemon(ssh_toml(federation, openssh))
    port = openssh.port
    daemon.wait_for("four runs of hub1", lambda: runs_exist(federation) and successes(federation, "hub1") >= 4)
    assert authentications(openssh) == 1
    assert established(port) == 1

    paused = fedload("feeder", "pause", "hub1", "--config", str(path))
    assert paused.returncode == 0, paused.stderr
    daemon.wait_for("the connection closed", lambda: dropped(daemon, "paused") and established(port) == 0)
    resumed = fedload("feeder", "resume", "hub1", "--config", str(path))
    assert resumed.returncode == 0, resumed.stderr
    before = successes(federation, "hub1")
    daemon.wait_for("three more runs", lambda: successes(federation, "hub1") >= before + 3)
    assert authentications(openssh) == 2
    assert established(port) == 1

    path.write_text(ssh_toml(federation, openssh, keepalive_s=7))
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_for("the old connection closed", lambda: dropped(daemon, "its ssh settings changed"))
    before = successes(federation, "hub1")
    daemon.wait_for("three more runs", lambda: successes(federation, "hub1") >= before + 3)
    assert authentications(openssh) == 3
    assert established(port) == 1

    text = ssh_toml(federation, openssh)
    path.write_text(text.split("[feeders.hub1]")[0] + "[feeders.hub2]" + text.split("[feeders.hub2]")[1])
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_for(
        "its connection closed", lambda: dropped(daemon, "removed from the configuration") and established(port) == 0
    )
    assert daemon.stop() == 0


def test_the_daemon_closes_its_kept_connections_at_its_end(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess], openssh: SshServer
) -> None:
    """SIGTERM: the workers close the connections they keep, saying so, before the daemon exits."""
    daemon = start_daemon(ssh_toml(federation, openssh))
    daemon.wait_for("two runs of hub1", lambda: runs_exist(federation) and successes(federation, "hub1") >= 2)
    assert daemon.stop() == 0
    assert dropped(daemon, "the worker ends")
    assert established(openssh.port) == 0
