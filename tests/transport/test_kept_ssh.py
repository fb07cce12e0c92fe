"""Kept SSH connections (fedload.transport.kept_ssh) against real SSH servers on loopback, reached through a relay
that counts the TCP connections and can cut them or let them go silent: reuse, re-made on failure, never kept
after a failed run, bounded, forgotten."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from structlog.testing import capture_logs

from fedload.config import SshConfig
from fedload.errors import FeederCommandError
from fedload.transport.base import FeederProcess
from fedload.transport.kept_ssh import SshKeeper, keep_ssh
from fedload.transport.ssh import SshTransport
from tests.support.relay import pipe
from tests.support.sshd import OpenSshServer, SshServer
from tests.transport.test_ssh import read_all, through_relay


class Relay:
    """A TCP relay on loopback to an SSH server's port: counts the connections it accepted and those still open;
    `cut()` ends those open now, `silence()` stops forwarding on them (a network gone quiet), new ones unaffected."""

    def __init__(self, port: int) -> None:
        self._port = port
        self.accepted = 0
        self._open: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter, asyncio.Event]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def open(self) -> int:
        """Connections open now (neither side has ended them)."""
        return sum(1 for client, _, _ in self._open if not client.is_closing())

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        silent = asyncio.Event()
        entry = (writer, up_writer, silent)
        self._open.append(entry)
        try:
            await asyncio.gather(pipe(reader, up_writer, silent), pipe(up_reader, writer, silent))
        finally:
            self._open.remove(entry)
            self._tasks.discard(task)

    def cut(self) -> None:
        """End every open connection (both sides see it close)."""
        for client, upstream, _ in self._open:
            client.close()
            upstream.close()

    def silence(self) -> None:
        """Forward nothing more on the open connections, and close none of them."""
        for _, _, silent in self._open:
            silent.set()

    async def wait_open(self, count: int, timeout_s: float = 15) -> None:
        """Until exactly `count` connections are open."""
        async with asyncio.timeout(timeout_s):
            while self.open != count:  # noqa: ASYNC110 - a count of sockets, no event to wait on
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        if self._tasks:  # each ends once both its sides have closed
            _, stuck = await asyncio.wait(set(self._tasks), timeout=10)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)


@contextlib.asynccontextmanager
async def relayed(server: SshServer, tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[Relay, SshConfig]]:
    """A relay to `server` and the client settings that reach the server through it."""
    relay = Relay(server.port)
    port = await relay.start()
    try:
        yield relay, through_relay(server, port, tmp_path).model_copy(update=overrides)
    finally:
        await relay.stop()


@pytest.fixture
def keeper() -> Iterator[SshKeeper]:
    """This process keeps SSH connections, as a worker does, for the test."""
    kept = SshKeeper()
    keep_ssh(kept)
    yield kept
    keep_ssh(None)


@contextlib.asynccontextmanager
async def opened(
    config: SshConfig, feeder: str, argv: list[str], *, ahead: bool = False
) -> AsyncIterator[FeederProcess]:
    """`argv` started on a transport of `feeder`'s own (connected ahead first if `ahead`), all within 30 s; at the
    end the process cancelled and the transport closed, as the pipeline ends a run."""
    transport = SshTransport(config, feeder)
    if ahead:
        transport.connect_ahead()
    async with asyncio.timeout(30):
        process = await transport.open(argv)
        try:
            yield process
        finally:
            await process.cancel()
            await transport.close()


async def run(config: SshConfig, feeder: str, argv: list[str] | None = None) -> tuple[bytes, int]:
    """One run's use of the transport, as the pipeline's: connect ahead, open, read all, wait, close."""
    async with opened(config, feeder, argv or ["echo", "hello"], ahead=True) as process:
        return await read_all(process), await process.wait()


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


def authentications(server: SshServer) -> int | None:
    """How many keys OpenSSH's sshd accepted so far (its VERBOSE log); None for asyncssh's server."""
    if not isinstance(server, OpenSshServer):
        return None
    return (server.dir / "sshd.log").read_text().count("Accepted publickey")


async def test_a_second_run_reuses_the_connection(sshd: SshServer, tmp_path: Path, keeper: SshKeeper) -> None:
    """Two runs of a feeder: one TCP connection and one authentication, two commands, each with its output."""
    async with relayed(sshd, tmp_path) as (relay, config):
        with capture_logs() as logs:
            assert await run(config, "hub1", ["echo", "one"]) == (b"one\n", 0)
            assert await run(config, "hub1", ["echo", "two"]) == (b"two\n", 0)
        assert relay.accepted == 1
        assert relay.open == 1  # kept for a third
        assert authentications(sshd) in (1, None)
        assert [e["feeder"] for e in events(logs, "transport.connection_reused")] == ["hub1"]
        await keeper.close()
        await relay.wait_open(0)


async def test_without_a_keeper_each_run_connects(sshd: SshServer, tmp_path: Path) -> None:
    """Outside a worker (nothing kept) each run makes its connection and closes it."""
    async with relayed(sshd, tmp_path) as (relay, config):
        assert await run(config, "hub1") == (b"hello\n", 0)
        assert await run(config, "hub1") == (b"hello\n", 0)
        assert relay.accepted == 2
        await relay.wait_open(0)


async def test_a_connection_cut_while_idle_is_made_anew(sshd: SshServer, tmp_path: Path, keeper: SshKeeper) -> None:
    """A kept connection the network ended while idle is dropped; the next run connects again and succeeds."""
    async with relayed(sshd, tmp_path) as (relay, config):
        assert await run(config, "hub1") == (b"hello\n", 0)
        relay.cut()
        await relay.wait_open(0)
        await asyncio.sleep(0.2)  # asyncssh sees the end
        with capture_logs() as logs:
            assert await run(config, "hub1") == (b"hello\n", 0)
        assert relay.accepted == 2
        dropped = events(logs, "transport.kept_connection_dropped")
        assert [(e["feeder"], e["reason"]) for e in dropped] == [("hub1", "closed while idle")]
        assert not events(logs, "transport.connection_reused")


async def test_a_connection_gone_silent_while_idle_is_made_anew(
    sshd: SshServer, tmp_path: Path, keeper: SshKeeper
) -> None:
    """A kept connection that went silent while idle (no keepalive has noticed yet) cannot open the next command's
    channel: it is dropped, and the command starts on a new connection, once; the run succeeds."""
    async with relayed(sshd, tmp_path, connect_timeout_s=1, keepalive_s=600) as (relay, config):
        assert await run(config, "hub1") == (b"hello\n", 0)
        relay.silence()
        with capture_logs() as logs:
            assert await run(config, "hub1") == (b"hello\n", 0)
        assert relay.accepted == 2
        dropped = events(logs, "transport.kept_connection_dropped")
        assert [e["feeder"] for e in dropped] == ["hub1"]
        assert "did not start the dump command within 1 s" in dropped[0]["reason"]


@pytest.mark.parametrize("how", ["mid-stream", "exit status 3"])
async def test_a_failed_run_keeps_nothing(sshd: SshServer, tmp_path: Path, keeper: SshKeeper, how: str) -> None:
    """A run that stops reading mid-stream, or whose command fails, closes its connection: nothing is kept."""
    async with relayed(sshd, tmp_path) as (relay, config):
        if how == "mid-stream":
            async with opened(config, "hub1", ["sh", "-c", "head -c 10000000 /dev/zero"]) as process:
                assert await process.read(1024)
        else:
            async with opened(config, "hub1", ["sh", "-c", "echo out; exit 3"]) as process:
                assert await read_all(process) == b"out\n"
                assert await process.wait() == 3
        assert len(keeper) == 0
        await relay.wait_open(0)
        assert await run(config, "hub1") == (b"hello\n", 0)
        assert relay.accepted == 2


async def test_kept_connections_are_bounded(sshd: SshServer, tmp_path: Path) -> None:
    """At most `max_idle` connections are kept (the least recently used closed), each for `idle_s` at most."""
    keeper = SshKeeper(max_idle=2, idle_s=3.0)
    keep_ssh(keeper)
    try:
        async with relayed(sshd, tmp_path) as (relay, config):
            with capture_logs() as logs:
                for feeder in ("hub1", "hub2", "hub3"):
                    assert await run(config, feeder) == (b"hello\n", 0)
                await relay.wait_open(2)
                assert len(keeper) == 2
                await relay.wait_open(0, timeout_s=10)  # idle for 3 s
            dropped = [(e["feeder"], e["reason"]) for e in events(logs, "transport.kept_connection_dropped")]
            assert dropped[0] == ("hub1", "more than 2 kept")
            assert sorted(dropped[1:]) == [("hub2", "idle for 3 s"), ("hub3", "idle for 3 s")]
    finally:
        keep_ssh(None)


async def test_other_settings_are_another_connection(sshd: SshServer, tmp_path: Path, keeper: SshKeeper) -> None:
    """A run of the feeder with other SSH settings gets a new connection; the kept one is closed."""
    async with relayed(sshd, tmp_path) as (relay, config):
        assert await run(config, "hub1") == (b"hello\n", 0)
        with capture_logs() as logs:
            assert await run(config.model_copy(update={"keepalive_s": 7}), "hub1") == (b"hello\n", 0)
        assert relay.accepted == 2
        await relay.wait_open(1)
        dropped = events(logs, "transport.kept_connection_dropped")
        assert [e["reason"] for e in dropped] == ["made with other ssh settings"]


async def test_a_forgotten_feeder_keeps_nothing(sshd: SshServer, tmp_path: Path, keeper: SshKeeper) -> None:
    """`forget` closes the feeder's kept connection at once, and refuses the connection of its run under way."""
    async with relayed(sshd, tmp_path) as (relay, config):
        assert await run(config, "hub1") == (b"hello\n", 0)
        keeper.forget("hub1", "paused")
        await relay.wait_open(0)
        async with opened(config, "hub1", ["echo", "during"]) as process:
            keeper.forget("hub1", "its ssh settings changed")  # while the run goes on
            assert await read_all(process) == b"during\n"
            assert await process.wait() == 0
        assert len(keeper) == 0
        await relay.wait_open(0)


async def test_a_connection_made_ahead_that_no_open_took_is_kept(
    sshd: SshServer, tmp_path: Path, keeper: SshKeeper
) -> None:
    """A run that ended before its dump (busy) leaves its connection, on which nothing ran, for the next run."""
    async with relayed(sshd, tmp_path) as (relay, config):
        transport = SshTransport(config, "hub1")
        transport.connect_ahead()
        assert transport._ahead is not None
        await asyncio.wait({transport._ahead}, timeout=15)  # connected
        await transport.close()
        assert len(keeper) == 1
        assert await run(config, "hub1") == (b"hello\n", 0)
        assert relay.accepted == 1


class _FailingConnection:
    """A kept connection whose next command fails to start, before or after its channel opened."""

    def __init__(self, *, channel_opened: bool) -> None:
        self._opened = channel_opened
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    async def create_session(self, session: Callable[[], object], command: str, **_: object) -> None:
        if self._opened:
            session()  # asyncssh makes the session once the channel is open, then asks for the command
        raise asyncssh.ConnectionLost("the feeder went away")

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None


@pytest.mark.parametrize("channel_opened", [False, True], ids=["before its channel", "after its channel opened"])
async def test_a_command_is_started_again_only_if_nothing_of_it_ran(
    sshd: SshServer, tmp_path: Path, keeper: SshKeeper, channel_opened: bool
) -> None:
    """A kept connection that fails before the command's channel opens is replaced and the command started anew;
    once the channel has opened (the command may have run), the run fails instead, on no other connection."""
    async with relayed(sshd, tmp_path) as (relay, config):
        failing = _FailingConnection(channel_opened=channel_opened)
        keeper.give_back(keeper.lease("hub1", config), failing)
        if channel_opened:
            with pytest.raises(FeederCommandError, match=r"cannot start the dump command.*went away"):
                await run(config, "hub1")
            assert relay.accepted == 0
        else:
            assert await run(config, "hub1") == (b"hello\n", 0)
            assert relay.accepted == 1
        assert failing.closed
