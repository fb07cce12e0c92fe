"""Served agents (fedload.transport.served) over OpenSSH's sshd on loopback: a feeder's runs on a kept connection
share one `agent serve`, through the forced command's allowlist; an agent that does not serve is asked once per
connection and its runs start their own sessions; a dump given up half-way closes its agent and connection."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from fedload.errors import FeederCommandError
from fedload.feeder.agent_options import AgentOptions
from fedload.stream import StreamDecoder
from fedload.transport.kept_ssh import SERVE_REFUSED, SshKeeper
from fedload.transport.served import ServedAgent, ServedDump, serve_argv
from tests.feeder.zipapp import build
from tests.support.federation import Federation, write_script
from tests.support.interpreters import python_named
from tests.support.sshd import OpenSshServer, require_openssh
from tests.transport.test_kept_ssh import events, keeper, opened, relayed, run
from tests.transport.test_ssh import read_all

pytestmark = pytest.mark.timeout(120)
__all__ = ["keeper"]  # the fixture, shared with test_kept_ssh


def _forced_command(federation: Federation, zipapp: Path | None = None) -> str:
    """The installed agent's ssh-command allowing hub1's hosts, or the zipapp's under Debian's own Python."""
    allowlist = [
        f"--database={federation.cluster.conninfo(federation.feeders['hub1'])}",
        "--allow-table=public.hosts",
        f"--pg-dump={federation.cluster.install.tool('pg_dump')}",
    ]
    if zipapp is not None:
        return shlex.join([str(python_named("system")), "-I", str(zipapp), "ssh-command", *allowlist])
    return shlex.join([sys.executable, "-m", "fedload", "agent", "ssh-command", *allowlist])


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's zipapp, built once for the module."""
    return build(tmp_path_factory.mktemp("zipapp"))


def _server(tmp_path: Path, command: str) -> OpenSshServer:
    require_openssh()
    directory = tmp_path / "sshd"
    directory.mkdir()
    return OpenSshServer(directory, forced_command=command.replace('"', '\\"'))


@pytest.fixture(params=["installed", "zipapp"])
def forced(
    request: pytest.FixtureRequest, federation: Federation, tmp_path: Path, zipapp: Path
) -> Iterator[OpenSshServer]:
    """sshd whose only command for the test key is the agent's ssh-command (installed, or the zipapp's),
    allowing hub1's hosts."""
    server = _server(tmp_path, _forced_command(federation, zipapp if request.param == "zipapp" else None))
    yield server
    server.stop()


@pytest.fixture
def old_agent(federation: Federation, tmp_path: Path) -> Iterator[OpenSshServer]:
    """As `forced`, but the forced command refuses `serve` as an agent from before it does."""
    script = write_script(
        tmp_path / "old-agent",
        'case "$SSH_ORIGINAL_COMMAND" in *" serve") echo "fedload: error: refused" >&2; exit 2;; esac\n'
        f"exec {_forced_command(federation)}\n",
    )
    server = _server(tmp_path, script)
    yield server
    server.stop()


def _dump_argv(federation: Federation, table: str = "public.hosts") -> list[str]:
    database = federation.cluster.conninfo(federation.feeders["hub1"])
    return ["fedload", *AgentOptions(database, [table], quiet=True).to_argv()]


def _verified(stream: bytes) -> int:
    """The rows a complete, verified stream says it holds."""
    decoder = StreamDecoder("hub1")
    decoder.feed(stream)
    rows = decoder.close().rows
    assert isinstance(rows, list)  # protocol 3 and later: [schema, name, rows]
    return sum(count for _, _, count in rows)


def _kept_agent(keeper: SshKeeper, forced: OpenSshServer, config: object) -> object:
    """The agent kept with hub1's connection (taken and given back)."""
    lease = keeper.lease("hub1", config)  # type: ignore[arg-type]
    kept = keeper.take(lease)
    assert kept is not None
    keeper.give_back(lease, kept.conn, kept.agent)
    return kept.agent


def test_serve_argv() -> None:
    """The served command of an installed agent's dump, the zipapp's; none for another command, or for a dump whose
    words hold a newline."""
    assert serve_argv(["env", "X=1", "python3", "-m", "fedload", "agent", "dump", "--database=d"]) == [
        *["env", "X=1", "python3", "-m", "fedload", "agent", "serve"]
    ]
    assert serve_argv(["python3", "-I", "agent.pyz", "dump", "--table=t"]) == ["python3", "-I", "agent.pyz", "serve"]
    assert serve_argv(["echo", "hello"]) is None
    wrapped = ["python3", "-c", "import sys\nrun(sys.argv[1:])", "fedload", "agent", "dump", "--database=d"]
    assert serve_argv(wrapped) is None  # a newline in a word: no request line carries it, the run starts its own


async def test_runs_of_a_feeder_share_one_served_agent(
    forced: OpenSshServer, federation: Federation, tmp_path: Path, keeper: SshKeeper
) -> None:
    """Three runs on the kept connection: one served agent answers all, each a whole stream with status 0; a
    request the allowlist refuses is its run's failure (status 2, the reason) and leaves the agent serving."""
    async with relayed(forced, tmp_path) as (relay, config):
        with capture_logs() as logs:
            stream, status = await run(config, "hub1", _dump_argv(federation))
            assert (status, _verified(stream)) == (0, 300)
            agent = _kept_agent(keeper, forced, config)
            assert isinstance(agent, ServedAgent)
            async with opened(config, "hub1", _dump_argv(federation, "public.secrets"), ahead=True) as refused:
                assert isinstance(refused, ServedDump)
                assert await read_all(refused) == b""
                assert await refused.wait() == 2
                assert "is not within this key's allowed tables" in refused.stderr_tail
            stream, status = await run(config, "hub1", _dump_argv(federation))
            assert (status, _verified(stream)) == (0, 300)
            assert _kept_agent(keeper, forced, config) is agent
        assert len(events(logs, "transport.served")) == 3
        assert events(logs, "transport.serve_refused") == []
        assert relay.accepted == 1


async def test_a_dump_given_up_closes_its_agent_and_connection(
    forced: OpenSshServer, federation: Federation, tmp_path: Path, keeper: SshKeeper
) -> None:
    """A run that stops reading before the end frame keeps nothing; the next run connects and serves anew."""
    async with relayed(forced, tmp_path) as (relay, config):
        async with opened(config, "hub1", _dump_argv(federation)) as dump:
            assert isinstance(dump, ServedDump)
            assert await dump.read(16)
        assert len(keeper) == 0
        await relay.wait_open(0)
        stream, status = await run(config, "hub1", _dump_argv(federation))
        assert (status, _verified(stream)) == (0, 300)
        assert relay.accepted == 2


async def test_an_agent_that_does_not_serve_is_asked_once_per_connection(
    old_agent: OpenSshServer, federation: Federation, tmp_path: Path, keeper: SshKeeper
) -> None:
    """An agent from before serve: each run starts its own session and loads whole; serve is asked once."""
    async with relayed(old_agent, tmp_path) as (relay, config):
        with capture_logs() as logs:
            for _ in range(2):
                stream, status = await run(config, "hub1", _dump_argv(federation))
                assert (status, _verified(stream)) == (0, 300)
        assert _kept_agent(keeper, old_agent, config) == SERVE_REFUSED
        assert len(events(logs, "transport.serve_refused")) == 1
        assert events(logs, "transport.served") == []
        assert relay.accepted == 1


_HOSTILE_AGENT = """\
import sys
from fedload.feeder.serve import FRAME_HEAD, HELLO_FRAME
sys.stdin.buffer.readline()
frames = {
    "kind": FRAME_HEAD.pack(b"Z", 1) + b"x",
    "end": FRAME_HEAD.pack(b"E", 1 << 30),
    "json": FRAME_HEAD.pack(b"E", 2) + b"[]",
}
sys.stdout.buffer.write(HELLO_FRAME + FRAME_HEAD.pack(b"D", 3) + b"abc" + frames[sys.argv[1]])
sys.stdout.buffer.flush()
sys.stdin.buffer.read()
"""


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        ("kind", "sent a frame of kind b'Z', 1 bytes"),
        ("end", "sent a frame of kind b'E', 1073741824 bytes"),
        ("json", "sent an end frame that is not one"),
    ],
)
async def test_a_hostile_served_frame_fails_the_run(
    tmp_path: Path, keeper: SshKeeper, federation: Federation, frame: str, error: str
) -> None:
    """An agent that sends a frame of another kind, an end frame of 1 GiB, or an end frame that is no status: the
    run fails in one line naming what came, and its connection is not kept."""
    script = tmp_path / "hostile.py"
    script.write_text(_HOSTILE_AGENT)
    server = _server(tmp_path, shlex.join([sys.executable, str(script), frame]))
    try:
        async with relayed(server, tmp_path) as (relay, config):
            with pytest.raises(FeederCommandError, match=re.escape(error)):
                await run(config, "hub1", _dump_argv(federation))
            assert len(keeper) == 0
            await relay.wait_open(0)
    finally:
        server.stop()
