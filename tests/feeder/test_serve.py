"""`fedload agent serve` as a process on pipes: its hello, a dump per request line in D frames ending with an E frame
that carries the status and stderr's tail, refusals as end frames, and a dump killed when stdin ends."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.serve import DATA, END, FRAME_HEAD, HELLO_FRAME
from fedload.stream import StreamDecoder
from tests.support.federation import Federation

pytestmark = pytest.mark.timeout(120)


class Served:
    """`python -m fedload agent serve` on pipes, its frames read back."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fedload", "agent", "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        self._out = self.process.stdout

    def hello(self) -> bytes:
        return self._exactly(len(HELLO_FRAME))

    def ask(self, words: list[str]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(shlex.join(words).encode() + b"\n")
        self.process.stdin.flush()

    def dump(self) -> tuple[bytes, dict[str, object]]:
        """The stream of the current dump and its end frame's fields."""
        data: list[bytes] = []
        while True:
            kind, size = FRAME_HEAD.unpack(self._exactly(FRAME_HEAD.size))
            payload = self._exactly(size)
            if kind == END:
                return b"".join(data), json.loads(payload)
            assert kind == DATA
            data.append(payload)

    def _exactly(self, size: int) -> bytes:
        parts, left = [], size
        while left:
            part = self._out.read(left)
            assert part, "the served agent's stdout ended"
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    def close(self) -> int:
        """End stdin; the agent's exit status."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout=30)


@pytest.fixture
def served() -> Iterator[Served]:
    agent = Served()
    with agent.process:  # its pipes closed, and the agent waited for, at the end
        yield agent
        if agent.process.poll() is None:
            agent.process.kill()


def _request(federation: Federation, tables: list[str], **options: object) -> list[str]:
    database = federation.cluster.conninfo(federation.feeders["hub1"])
    pg_dump = str(federation.cluster.install.tool("pg_dump"))
    return ["fedload", *AgentOptions(database, tables, pg_dump=pg_dump, quiet=True, **options).to_argv()]  # type: ignore[arg-type]


def test_two_dumps_on_one_agent(served: Served, federation: Federation) -> None:
    """The hello first, then each request's dump: a whole, verified stream, ended by status 0; stdin's end ends
    the agent with status 0."""
    assert served.hello() == HELLO_FRAME
    for tables in (["public.hosts"], ["public.hosts", "public.contexts"]):
        rows = _dumped(served, _request(federation, tables))
        assert sorted(f"{schema}.{name}" for schema, name, _ in rows) == sorted(tables)
    assert served.close() == 0


def _dumped(served: Served, request: list[str]) -> list[tuple[str, str, int]]:
    """Ask `request`'s dump; its tables' rows as its trailer states them, once its stream is whole and its end
    frame says status 0."""
    served.ask(request)
    stream, end = served.dump()
    assert end == {"status": 0, "stderr": ""}
    decoder = StreamDecoder("hub1")
    decoder.feed(stream)
    rows = decoder.close().rows
    assert isinstance(rows, list)  # protocol 3 and later: [schema, name, rows]
    return rows


def test_a_request_that_is_not_a_dump_is_refused_in_its_end_frame(served: Served, federation: Federation) -> None:
    """Another command gets an end frame with status 2 and the reason, and the agent serves the next request."""
    served.hello()
    served.ask(["cat", "/etc/passwd"])
    assert served.dump() == (b"", {"status": 2, "stderr": _refusal("cat /etc/passwd")})
    served.ask(_request(federation, ["public.hosts"]))
    assert served.dump()[1]["status"] == 0
    assert served.close() == 0


def _refusal(line: str) -> str:
    return f"fedload: error: refused `{line}`: a served session runs dumps only\n"


def test_a_failed_dump_reports_its_status_and_stderr(served: Served) -> None:
    """A dump whose database cannot be reached: status 1 and the reason in the end frame's stderr."""
    served.hello()
    served.ask(["fedload", *AgentOptions("host=/nonexistent dbname=x", ["public.t"], quiet=True).to_argv()])
    _, end = served.dump()
    assert end["status"] == 1
    assert "fedload: error:" in str(end["stderr"])
    assert served.close() == 0


@pytest.fixture
def locked_hosts(federation: Federation) -> Iterator[None]:
    """hub1's hosts table locked by another session: a dump of it waits."""
    database = federation.feeders["hub1"]
    locker = subprocess.Popen(
        [federation.cluster.install.tool("psql"), "-X", "-q", federation.cluster.conninfo(database)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    assert locker.stdin is not None
    locker.stdin.write(b"BEGIN; LOCK TABLE hosts IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(120);\n")
    locker.stdin.flush()
    with locker:
        try:
            yield
        finally:
            locker.kill()


@pytest.mark.usefixtures("locked_hosts")
def test_stdin_ending_during_a_dump_kills_it(served: Served, federation: Federation) -> None:
    """A dump waiting on a lock when the superhub goes (stdin ends): its pg_dump ends, and so does the agent."""
    served.hello()
    served.ask(_request(federation, ["public.hosts"]))
    _until(lambda: _waiting(federation) == 1)
    started = time.monotonic()
    assert served.close() == 0
    assert time.monotonic() - started < 15
    _until(lambda: _waiting(federation) == 0)


@pytest.mark.usefixtures("locked_hosts")
def test_a_request_during_a_dump_ends_the_agent(served: Served, federation: Federation) -> None:
    """The superhub sends the next request before the end frame: the dump is stopped and the agent exits with 2."""
    served.hello()
    served.ask(_request(federation, ["public.hosts"]))
    _until(lambda: _waiting(federation) == 1)
    served.ask(_request(federation, ["public.hosts"]))
    assert served.process.wait(timeout=30) == 2
    assert served.process.stderr is not None
    assert b"a request came before the dump under way ended" in served.process.stderr.read()
    _until(lambda: _waiting(federation) == 0)


def _waiting(federation: Federation) -> int:
    """Sessions of hub1's database waiting for a lock (the blocked dump's)."""
    database = federation.feeders["hub1"]
    sql = f"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = '{database}'"
    return int(federation.cluster.psql(sql).strip())


def _until(check: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _binary(federation: Federation, tables: list[str]) -> list[str]:
    """A binary-mode request of `tables`, all of the feeder's columns each."""
    columns = [json.dumps({"schema": t.split(".")[0], "name": t.split(".")[1], "columns": None}) for t in tables]
    return _request(federation, tables, dump_mode="binary", columns=columns)


def _agent_backends(federation: Federation) -> list[int]:
    """The pids of the served agent's psql backends on hub1's database (not `locked_hosts`' locker)."""
    database = federation.feeders["hub1"]
    sql = (
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'psql' AND query NOT LIKE '%pg_sleep(120)%' "
        f"AND datname = '{database}' ORDER BY 1"
    )
    return [int(pid) for pid in federation.cluster.psql(sql).split()]


def _binary_dump_rows(served: Served, federation: Federation, tables: list[str]) -> int:
    """Ask a binary dump of `tables`; its rows, once it is complete."""
    return sum(n for _, _, n in _dumped(served, _binary(federation, tables)))


def test_binary_dumps_share_one_kept_psql_session(served: Served, federation: Federation) -> None:
    """The served agent's binary dumps of one database run in one psql session, idle between them: the same
    backend, each dump complete; stdin's end ends it."""
    served.hello()
    assert _binary_dump_rows(served, federation, ["public.hosts"]) == 300
    first = _agent_backends(federation)
    assert len(first) == 1
    assert _binary_dump_rows(served, federation, ["public.hosts", "public.contexts"]) > 300
    assert _agent_backends(federation) == first
    assert served.close() == 0
    _until(lambda: _agent_backends(federation) == [])


def test_a_kept_session_its_server_ended_is_replaced(served: Served, federation: Federation) -> None:
    """The kept session's backend terminated while idle (a restart, idle_session_timeout): the next dump is
    complete all the same, in a session of its own; the one after starts a new kept session, which the next keeps."""
    served.hello()
    _binary_dump_rows(served, federation, ["public.hosts"])
    (gone,) = _agent_backends(federation)
    federation.cluster.psql(f"SELECT pg_terminate_backend({gone})")
    _until(lambda: _agent_backends(federation) == [])
    assert _binary_dump_rows(served, federation, ["public.hosts"]) == 300
    assert _agent_backends(federation) == []  # its own session ended with it; the kept one is gone
    assert _binary_dump_rows(served, federation, ["public.hosts"]) == 300
    (replaced,) = _agent_backends(federation)
    assert replaced != gone
    assert _binary_dump_rows(served, federation, ["public.hosts"]) == 300
    assert _agent_backends(federation) == [replaced]
    assert served.close() == 0


@pytest.mark.usefixtures("locked_hosts")
def test_stdin_ending_during_a_binary_dump_ends_its_kept_session(served: Served, federation: Federation) -> None:
    """A binary dump waiting on a lock in the kept session when the superhub goes: the session, in its
    transaction, ends with the agent, bounded; nothing of it is left on the feeder."""
    served.hello()
    served.ask(_binary(federation, ["public.hosts"]))
    _until(lambda: _waiting(federation) == 1)
    assert len(_agent_backends(federation)) == 1
    started = time.monotonic()
    assert served.close() == 0
    assert time.monotonic() - started < 15
    _until(lambda: _agent_backends(federation) == [])
