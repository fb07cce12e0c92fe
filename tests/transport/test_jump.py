"""`[feeders.X.ssh] jump`: a feeder reached only through a bastion, both real OpenSSH servers on loopback.

The feeder's sshd listens on 127.0.0.2, the bastion's on 127.0.0.3; the bastion's log counts the connections it
forwarded to the feeder, so a test knows the tunnel was used (loopback would also let the superhub straight in).
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedload import __version__
from fedload.commands.probe import probe_feeder
from fedload.config import FeederConfig, SshConfig
from fedload.errors import FeederAuthError, FeederHostKeyError, FeederUnreachableError
from fedload.results import Outcome
from fedload.transport.ssh import SshTransport
from tests.support.federation import CONTEXT_COLS, DIGEST, HOST_COLS, Federation, sync
from tests.support.sshd import SSHD, OpenSshServer, require_openssh

FEEDER_ADDRESS, BASTION_ADDRESS = "127.0.0.2", "127.0.0.3"


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        port: int = probe.getsockname()[1]
        return port


class LoopbackSshd(OpenSshServer):
    """OpenSSH's sshd on one loopback address, with extra sshd_config lines and its keys' options."""

    def __init__(self, directory: Path, address: str, *, key_options: str = "restrict", extra: str = "") -> None:
        self.address, self._extra = address, extra
        super().__init__(directory)
        (directory / "authorized_keys").write_text(f"{key_options} {Path(f'{self.client_key}.pub').read_text()}")
        self.known_hosts.write_text(self.known_hosts_line)

    @property
    def known_hosts_line(self) -> str:
        """This server's host key as known_hosts lists it."""
        return f"[{self.address}]:{self.port} {self.host_public}\n"

    def _start(self) -> subprocess.Popen[bytes]:
        self._port = _free_port(self.address)
        config = self.dir / "sshd_config"
        config.write_text(
            f"ListenAddress {self.address}\nPort {self._port}\nHostKey {self.dir}/host_key\n"
            f"AuthorizedKeysFile {self.dir}/authorized_keys\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
            f"PidFile {self.dir}/sshd.pid\nLogLevel DEBUG1\nMaxStartups 50\n{self._extra}"
        )
        with contextlib.suppress(PermissionError):
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        return subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=self._log, start_new_session=True)

    def _listening_port(self) -> int | None:
        try:
            socket.create_connection((self.address, self._port), timeout=1).close()
        except OSError:
            return None
        return self._port

    def log(self) -> str:
        """What sshd has logged so far."""
        return (self.dir / f"{self.name}.log").read_text(errors="replace")


@pytest.fixture
def feeder_sshd(tmp_path: Path) -> Iterator[LoopbackSshd]:
    """The feeder's sshd on 127.0.0.2."""
    require_openssh()
    (tmp_path / "feeder").mkdir()
    server = LoopbackSshd(tmp_path / "feeder", FEEDER_ADDRESS)
    yield server
    server.stop()


def bastion_for(feeder: LoopbackSshd, directory: Path, *, forwarding: bool = True) -> LoopbackSshd:
    """A bastion on 127.0.0.3 that lets the feeder's key in and forwards to the feeder's sshd only (or, with
    `forwarding` False, to nowhere: `AllowTcpForwarding no`)."""
    directory.mkdir()
    allowed = f'restrict,port-forwarding,permitopen="{feeder.address}:{feeder.port}"'
    bastion = LoopbackSshd(directory, BASTION_ADDRESS, extra="" if forwarding else "AllowTcpForwarding no\n")
    (directory / "authorized_keys").write_text(f"{allowed} {Path(f'{feeder.client_key}.pub').read_text()}")
    feeder.known_hosts.write_text(feeder.known_hosts_line + bastion.known_hosts_line)
    return bastion


def forwarded(bastion: LoopbackSshd) -> int:
    """How many connections the bastion has forwarded (direct-tcpip channels it opened)."""
    return len(re.findall(r"server_request_direct_tcpip: .*originator", bastion.log()))


def logins(server: LoopbackSshd) -> int:
    """How many logins the server has accepted."""
    return server.log().count("Accepted publickey for ")


def through(bastion: LoopbackSshd, feeder: LoopbackSshd, **overrides: object) -> SshConfig:
    """Client settings for the feeder through the bastion (one key and one known_hosts file for both)."""
    jump = f"{bastion.user}@{bastion.address}:{bastion.port}"
    return feeder.ssh_config(host=feeder.address, jump=jump, **overrides)


async def run(config: SshConfig, argv: list[str]) -> bytes:
    """`argv`'s output on the feeder, read to its end; the connection closed after."""
    process = await SshTransport(config).open(argv)
    try:
        data = b""
        while chunk := await process.read(1 << 16):
            data += chunk
        assert await process.wait() == 0
        return data
    finally:
        await process.cancel()


async def test_a_command_runs_through_the_bastion_and_both_connections_close(
    feeder_sshd: LoopbackSshd, tmp_path: Path
) -> None:
    """The feeder's only login comes through the bastion's tunnel; closing the feeder's connection closes the
    bastion's."""
    bastion = bastion_for(feeder_sshd, tmp_path / "bastion")
    try:
        assert (await run(through(bastion, feeder_sshd), ["echo", "hello"])) == b"hello\n"
        assert (logins(bastion), forwarded(bastion), logins(feeder_sshd)) == (1, 1, 1)
        assert wait_for(lambda: "Disconnected from user" in bastion.log(), within_s=10)
    finally:
        bastion.stop()


def wait_for(condition: object, within_s: float) -> bool:
    """Whether `condition()` becomes true within `within_s` seconds."""
    assert callable(condition)
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def test_sync_through_a_bastion_loads_the_feeder(feeder_sshd: LoopbackSshd, federation: Federation) -> None:
    """A feeder behind a bastion syncs into a real superhub (agent over the tunnel): rows as on the feeder; every
    login at the feeder was forwarded by the bastion."""
    bastion = bastion_for(feeder_sshd, federation.tmp / "bastion")
    try:
        ssh = through(bastion, feeder_sshd).model_dump()
        config = federation.config(
            transport="ssh", ssh=ssh, agent=True, agent_command=[sys.executable, "-m", "fedload"]
        )
        config = config.model_copy(update={"feeders": {"hub1": config.feeders["hub1"]}})
        (run_,) = await sync(config, "hub1")
        assert run_.outcome == Outcome.SUCCESS, run_.error
        feeder_db = federation.feeders["hub1"]
        for table, cols in (("hosts", HOST_COLS), ("contexts", CONTEXT_COLS)):
            expected = federation.cluster.psql(DIGEST.format(cols=cols, table=table), dbname=feeder_db).strip()
            assert federation.digest(federation.superhub, table, cols, "WHERE hub_id = 1") == expected
        assert logins(feeder_sshd) == forwarded(bastion) >= 1
    finally:
        bastion.stop()


async def test_check_config_connect_names_the_bastion(feeder_sshd: LoopbackSshd, tmp_path: Path) -> None:
    """check-config --connect's connection line says which bastion the feeder was reached through, and the probes
    get their answers through it."""
    bastion = bastion_for(feeder_sshd, tmp_path / "bastion")
    try:
        pg_dump = "/usr/lib/postgresql/15/bin/pg_dump"
        ssh = through(bastion, feeder_sshd)
        feeder = FeederConfig(key=1, ssh=ssh, agent_command=[sys.executable, "-m", "fedload"], pg_dump=pg_dump)
        probes = [probe.line() for probe in await probe_feeder("ap1", feeder)]
        assert probes[0] == (
            f"feeder ap1 connection: OK (ssh {feeder_sshd.user}@{FEEDER_ADDRESS}:{feeder_sshd.port} "
            f"via bastion {BASTION_ADDRESS}:{bastion.port})"
        )
        assert probes[1] == f"feeder ap1 agent: OK (fedload {__version__})"
        assert probes[2].startswith("feeder ap1 pg_dump: OK (pg_dump (PostgreSQL) 15.")
        assert logins(feeder_sshd) == forwarded(bastion) >= 1
    finally:
        bastion.stop()


async def test_a_bastion_that_refuses_forwarding_is_named(feeder_sshd: LoopbackSshd, tmp_path: Path) -> None:
    """`AllowTcpForwarding no` on the bastion: one line, the bastion named, the feeder never reached."""
    bastion = bastion_for(feeder_sshd, tmp_path / "bastion", forwarding=False)
    try:
        with pytest.raises(FeederUnreachableError) as failed:
            await run(through(bastion, feeder_sshd), ["true"])
        message = str(failed.value)
        assert message.startswith(
            f"bastion {BASTION_ADDRESS}:{bastion.port} did not forward the connection to feeder "
            f"{FEEDER_ADDRESS}:{feeder_sshd.port}: "
        )
        assert "\n" not in message
        assert logins(feeder_sshd) == 0
    finally:
        bastion.stop()


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ("host_key", FeederHostKeyError, "the host key of bastion {bastion} is not in known_hosts"),
        ("key", FeederAuthError, "bastion {bastion} refused the key of user 'nobody'"),
        ("down", FeederUnreachableError, "bastion {bastion} refused the connection"),
    ],
)
async def test_a_failing_bastion_is_named(
    feeder_sshd: LoopbackSshd, tmp_path: Path, change: str, error: type[Exception], message: str
) -> None:
    """The bastion's unknown host key, a user it refuses, or no bastion at all: the error names the bastion."""
    bastion = bastion_for(feeder_sshd, tmp_path / "bastion")
    address = f"{BASTION_ADDRESS}:{bastion.port}"
    config = through(bastion, feeder_sshd)
    with contextlib.ExitStack() as stack:
        stack.callback(bastion.stop)
        if change == "host_key":
            feeder_sshd.known_hosts.write_text(feeder_sshd.known_hosts_line)
        elif change == "key":
            config = config.model_copy(update={"jump": f"nobody@{address}"})
        else:
            bastion.stop()
            # The port held, bound but not listening: refused, and no other test's server can take it meanwhile
            # (one did, under two suites at once: "connection reset by peer").
            stack.enter_context(held_port(BASTION_ADDRESS, bastion.port))
        with pytest.raises(error, match="^" + re.escape(message.format(bastion=address))):
            await run(config, ["true"])
        assert logins(feeder_sshd) == 0


@contextlib.contextmanager
def held_port(address: str, port: int, timeout_s: float = 10.0) -> Iterator[socket.socket]:
    """A socket bound to the port, not listening (SO_REUSEADDR: past the probes' TIME_WAIT): connections are refused
    and no other server takes it. Bound once the stopped server's listener is gone: its process may still be ending
    (CI saw EADDRINUSE once); within `timeout_s`."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                held.bind((address, port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield held


@pytest.mark.parametrize("frozen", ["bastion", "feeder"])
async def test_a_silent_bastion_or_feeder_is_given_up_within_the_connect_timeout(
    feeder_sshd: LoopbackSshd, tmp_path: Path, frozen: str
) -> None:
    """A bastion, or a feeder behind it, that accepts the connection and says nothing: given up after about the
    feeder's connect timeout, naming the one that was silent."""
    bastion = bastion_for(feeder_sshd, tmp_path / "bastion")
    try:
        (bastion if frozen == "bastion" else feeder_sshd).freeze()
        silent = (
            f"bastion {BASTION_ADDRESS}:{bastion.port}"
            if frozen == "bastion"
            else f"feeder {FEEDER_ADDRESS}:{feeder_sshd.port} via bastion {BASTION_ADDRESS}:{bastion.port}"
        )
        started = time.monotonic()
        with pytest.raises(FeederUnreachableError, match=f"^{re.escape(silent)} did not answer in time"):
            await run(through(bastion, feeder_sshd, connect_timeout_s=2), ["true"])
        assert time.monotonic() - started < 2 + 5 + 2
    finally:
        bastion.stop()
