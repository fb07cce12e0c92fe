"""Transports against real SSH servers on loopback (OpenSSH, asyncssh) and local processes: bytes, exit status,
backpressure, faults."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fedload.config import SshConfig
from fedload.errors import (
    FeederAuthError,
    FeederConnectionLostError,
    FeederHostKeyError,
    FeederTimeoutError,
    FeederUnreachableError,
)
from fedload.localpg import LocalCluster
from fedload.results import Outcome
from fedload.transport import FeederProcess, Transport
from fedload.transport.local import LocalTransport
from fedload.transport.ssh import SshTransport
from tests.support.federation import (
    CONTEXT_COLS,
    DIGEST,
    FEEDER_DATA,
    HOST_COLS,
    SCHEMA,
    Federation,
    new_database,
    sync,
)
from tests.support.fix_tally import Category
from tests.support.relay import pipe
from tests.support.sshd import AsyncsshServer, OpenSshServer, SshServer, keygen, require_openssh


async def read_all(process: FeederProcess, chunk: int = 1 << 16) -> bytes:
    """Everything the process writes to stdout."""
    parts = []
    while data := await process.read(chunk):
        parts.append(data)
    return b"".join(parts)


async def drain(process: FeederProcess) -> int:
    """Read stdout to its end, then the exit status."""
    await read_all(process)
    return await process.wait()


def transports(server: SshServer) -> list[Transport]:
    """The SSH and the local transport."""
    return [SshTransport(server.ssh_config()), LocalTransport(read_timeout_s=30)]


async def test_both_transports_deliver_exact_bytes_and_status(sshd: SshServer, tmp_path: Path) -> None:
    """A 5 MB random file arrives byte for byte, exit status 0; a failing command reports its status and stderr."""
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(5_000_000))

    async def check(transport: Transport) -> None:
        process = await transport.open(["cat", str(payload)])
        data = await read_all(process)
        assert hashlib.sha256(data).digest() == hashlib.sha256(payload.read_bytes()).digest()
        assert await process.wait() == 0
        await process.cancel()
        failing = await transport.open(["sh", "-c", "echo 'pg_dump: error: no such database' >&2; exit 3"])
        assert await read_all(failing) == b""
        assert await failing.wait() == 3
        assert "no such database" in failing.stderr_tail
        await failing.cancel()

    for transport in transports(sshd):
        await check(transport)


async def test_slow_reader_throttles_the_remote_writer(sshd: SshServer, tmp_path: Path) -> None:
    """While the superhub does not read, the feeder's writer stays blocked: memory and buffers stay bounded; once
    the superhub cancels, the writer is gone."""
    counter, pid_file = tmp_path / "count", tmp_path / "pid"
    writer = f"echo $$ > {pid_file}; i=0; while head -c 65536 /dev/zero; do i=$((i+1)); echo $i > {counter}; done"

    process = await SshTransport(sshd.ssh_config()).open(["sh", "-c", writer])
    await process.read(1024)
    await asyncio.sleep(2)
    stalled = int(counter.read_text() or 0)
    await asyncio.sleep(1)
    still = int(counter.read_text() or 0)
    for _ in range(200):
        await process.read(1 << 16)
    await process.cancel()
    assert stalled * 65536 < 16 * 1024 * 1024  # channel window + pipe buffers, not the 100s of MB of a free run
    assert still == stalled
    assert await gone(int(pid_file.read_text()), within_s=10)


async def gone(pid: int, within_s: float) -> bool:
    """Whether process `pid` has ended (and been reaped by its parent) within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("transport_name", ["ssh", "local"])
async def test_silent_feeder_times_out(sshd: SshServer, transport_name: str) -> None:
    """A command that sends nothing is given up after the read timeout."""
    transport: Transport = (
        SshTransport(sshd.ssh_config(read_timeout_s=1)) if transport_name == "ssh" else LocalTransport(read_timeout_s=1)
    )

    process = await transport.open(["sleep", "30"])
    try:
        async with asyncio.timeout(10):
            with pytest.raises(FeederTimeoutError, match="sent nothing for 1 s"):
                await process.read(1024)
    finally:
        await process.cancel()


async def test_sshd_killed_mid_stream_is_a_lost_connection(sshd: SshServer, category: Category) -> None:
    """Killing the server and its session while data flows is reported as a lost connection within seconds."""
    category("fault:network cut mid-stream")

    process = await SshTransport(sshd.ssh_config(keepalive_s=1)).open(
        ["sh", "-c", "while head -c 65536 /dev/urandom; do sleep 0.05; done"]
    )
    await process.read(1 << 16)
    sshd.kill()
    started = time.monotonic()
    async with asyncio.timeout(20):
        with pytest.raises(FeederConnectionLostError):
            await drain(process)
    assert time.monotonic() - started < 15
    await process.cancel()


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ("host_key", FeederHostKeyError, "host key"),
        ("client_key", FeederAuthError, "refused the key"),
        ("port", FeederUnreachableError, "refused the connection"),
        ("dns", FeederUnreachableError, "cannot resolve"),
    ],
)
async def test_connection_failures_map_to_clear_errors(
    sshd: SshServer, tmp_path: Path, change: str, error: type[Exception], message: str
) -> None:
    """Wrong host key, unknown client key, closed port and unknown host name each raise their own error class.

    The closed port is one this test holds bound without listening, so the kernel refuses every connection to it:
    a port freed by stopping the server could be taken meanwhile by a server of a test running in parallel, which
    accepted the connection and reset it ("Connection reset by peer" instead of a refusal)."""
    overrides: dict[str, object] = {}
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        if change == "host_key":
            impostor = keygen(tmp_path / "impostor").split()[:2]
            other = tmp_path / "other_known_hosts"
            other.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(impostor)}\n")
            overrides["known_hosts"] = other
        elif change == "client_key":
            keygen(tmp_path / "stranger")
            overrides["identity"] = tmp_path / "stranger"
        elif change == "port":
            overrides["port"] = closed.getsockname()[1]
        else:
            overrides["host"] = "no-such-feeder.invalid"

        async with asyncio.timeout(30):
            with pytest.raises(error, match=message):
                await SshTransport(sshd.ssh_config(**overrides)).open(["true"])


def test_a_server_that_fails_to_start_leaves_nothing_open(tmp_path: Path) -> None:
    """A server that exits at once fails the test that started it, its log closed: no warning in a later test."""

    class Broken(AsyncsshServer):
        def _start(self) -> subprocess.Popen[bytes]:
            return subprocess.Popen([sys.executable, "-c", "raise SystemExit('no such option')"], stderr=self._log)

    with pytest.raises(pytest.fail.Exception, match="asyncssh exited: no such option"):
        Broken(tmp_path)
    gc.collect()  # an open log would warn here, and warnings are errors in this suite


async def test_forced_command_is_all_the_key_can_run(tmp_path: Path) -> None:
    """With command="..." in authorized_keys, whatever the client asks for, only the forced command runs."""
    require_openssh()  # what feeders run (deploy/authorized_keys.example); asyncssh's server is not the one to trust
    directory = tmp_path / "forced"
    directory.mkdir()
    server = OpenSshServer(directory, forced_command="echo forced")
    try:
        process = await SshTransport(server.ssh_config()).open(["cat", "/etc/shadow"])
        data = await read_all(process)
        await process.cancel()
    finally:
        server.stop()
    assert data == b"forced\n"


@pytest.mark.parametrize(
    ("pg_major", "agent", "mode"), [(15, True, "copy"), (18, True, "inserts"), (18, False, "copy")], scope="module"
)
async def test_sync_over_ssh_from_feeders_of_several_majors(
    sshd: SshServer, federation: Federation, major_cluster: LocalCluster, agent: bool, mode: str
) -> None:
    """Feeders reached over SSH, with the agent or plain pg_dump | gzip, on PostgreSQL 15 and 18, load exactly."""
    feeder = major_cluster
    if feeder is federation.cluster:
        feeder_db = federation.feeders["hub1"]
    else:
        feeder_db = new_database(feeder, "cfdb", SCHEMA + FEEDER_DATA.format(n=150, m=700))
    ssh = sshd.ssh_config().model_dump()
    config = federation.config(
        transport="ssh", ssh=ssh, agent=agent, dump_mode=mode, agent_command=[sys.executable, "-m", "fedload"]
    )
    hub1 = config.feeders["hub1"].model_copy(
        update={"database": feeder.conninfo(feeder_db), "pg_dump": feeder.install.tool("pg_dump")}
    )
    config = config.model_copy(update={"feeders": {"hub1": hub1}})
    (run,) = await sync(config, "hub1")
    assert run.outcome == Outcome.SUCCESS, run.error
    for table, cols in (("hosts", HOST_COLS), ("contexts", CONTEXT_COLS)):
        expected = feeder.psql(DIGEST.format(cols=cols, table=table), dbname=feeder_db).strip()
        assert federation.digest(federation.superhub, table, cols, "WHERE hub_id = 1") == expected


@contextlib.asynccontextmanager
async def one_connection_relay(port: int) -> AsyncIterator[tuple[int, asyncio.Event, asyncio.Event]]:
    """A TCP relay to 127.0.0.1:`port` that accepts one connection and then no other (its listener closed): its
    port, and events set once it has accepted that connection and once the connection has ended."""
    accepted, ended = asyncio.Event(), asyncio.Event()
    relays: list[asyncio.Task[None]] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.close()
        relays.append(asyncio.current_task())  # type: ignore[arg-type]
        accepted.set()
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))
        ended.set()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted, ended
    finally:
        server.close()
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)


def through_relay(server: SshServer, port: int, tmp_path: Path) -> SshConfig:
    """`server`'s client settings, reaching it through a relay on `port` (its host key known there)."""
    known_hosts = tmp_path / "relay_known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {server.host_public}\n")
    return server.ssh_config(port=port, known_hosts=known_hosts)


async def test_open_takes_the_connection_made_ahead(sshd: SshServer, tmp_path: Path) -> None:
    """`connect_ahead` connects at once, in the background; `open` then starts its command on that connection,
    with no handshake of its own (the relay between them accepts one connection only)."""
    async with one_connection_relay(sshd.port) as (port, accepted, _), asyncio.timeout(30):
        transport = SshTransport(through_relay(sshd, port, tmp_path))
        transport.connect_ahead()
        await accepted.wait()
        process = await transport.open(["echo", "ahead"])
        assert await read_all(process) == b"ahead\n"
        assert await process.wait() == 0
        await process.cancel()
        await transport.close()


@pytest.mark.parametrize("wait_s", [0.0, 1.0], ids=["handshaking", "connected"])
async def test_a_connection_made_ahead_that_no_open_took_is_closed(
    sshd: SshServer, tmp_path: Path, wait_s: float
) -> None:
    """A run that ends before its dump closes the connection `connect_ahead` made, or stops its handshake: the
    relay sees it end."""
    async with one_connection_relay(sshd.port) as (port, accepted, ended), asyncio.timeout(30):
        transport = SshTransport(through_relay(sshd, port, tmp_path))
        transport.connect_ahead()
        await accepted.wait()
        await asyncio.sleep(wait_s)
        await transport.close()
        await asyncio.wait_for(ended.wait(), 10)
        await transport.close()  # again: nothing left to close


async def test_a_failed_connection_ahead_is_raised_by_open(sshd: SshServer) -> None:
    """A connection made ahead that fails is the failure `open` raises, as if `open` had connected; a transport
    closed after that has nothing to close."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        transport = SshTransport(sshd.ssh_config(port=closed.getsockname()[1]))
        transport.connect_ahead()
        async with asyncio.timeout(30):
            with pytest.raises(FeederUnreachableError, match="refused the connection"):
                await transport.open(["true"])
            await transport.close()
        transport.connect_ahead()
        await asyncio.sleep(0.5)  # failed by now, and never opened: close() must take its failure quietly
        await transport.close()
