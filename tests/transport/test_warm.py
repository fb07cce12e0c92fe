"""Local agents forked from the warm process (fedload.transport.warm and .zygote), against a real cluster: the same
stream and exit status as an exec'd agent, their own process group, and the exec'd agent again wherever the warm
process cannot serve."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from fedload.localpg import LocalCluster
from fedload.stream import StreamDecoder
from fedload.transport import FeederProcess
from fedload.transport.local import FEDLOAD_HERE, LocalTransport
from fedload.transport.warm import close_warm_agents, use_warm_agents
from tests.support.federation import FEEDER_DATA, SCHEMA, children_running, new_database, psql_int

ZYGOTE = "fedload.transport.zygote"


@pytest.fixture
async def warm() -> AsyncIterator[None]:
    """This process forks its local agents from a warm process, as a worker does, for the test's duration."""
    use_warm_agents()
    try:
        yield
    finally:
        await close_warm_agents()
    assert not children_running(os.getpid(), ZYGOTE)


@pytest.fixture
def feeder(cluster: LocalCluster) -> str:
    """A feeder database with fedload's test tables and a few hundred rows."""
    return new_database(cluster, "warm", SCHEMA + FEEDER_DATA.format(n=50, m=300))


def agent_argv(cluster: LocalCluster, database: str, *tables: str) -> list[str]:
    """`fedload agent dump` of `tables` as the superhub runs it for a local feeder (its command head included)."""
    argv = [*FEDLOAD_HERE, "agent", "dump", "--quiet", "--database", cluster.conninfo(database)]
    argv += ["--pg-dump", cluster.install.tool("pg_dump")]
    for table in tables or ("public.hosts", "public.contexts"):
        argv += ["--table", table]
    return argv


async def dump_text(process: FeederProcess) -> tuple[bytes, int]:
    """The dump text of a whole stream, without pg_dump's random `\\restrict` keys, and the command's exit status."""
    decoder, text = StreamDecoder("warm"), []
    while raw := await process.read(1 << 16):
        text += decoder.feed(raw)
    decoder.close()
    lines = b"".join(text).splitlines(keepends=True)
    keyless = b"".join(line for line in lines if not line.startswith((b"\\restrict ", b"\\unrestrict ")))
    return keyless, await process.wait()


def pg_dumps_of(database: str) -> list[int]:
    """The running (not zombie) pg_dump processes whose command line names `database`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            words = cmdline.read_bytes().split(b"\0")
            if words[0].endswith(b"pg_dump") and any(f"dbname={database}".encode() in w for w in words):
                found.append(int(cmdline.parent.name))
    return found


def agents_of(parent: int) -> list[int]:
    """The children of `parent` that are started agents: `... agent dump ...` as words of their command line.
    Children by their parent pid in /proc/PID/stat: /proc/PID/task/PID/children lists only the main thread's and,
    the kernel says, is not reliable for children not stopped (it missed a running agent once)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after "pid (comm)": state, ppid
            words = (stat.parent / "cmdline").read_bytes().split(b"\0")
            if ppid == parent and b"agent" in words and b"dump" in words:
                found.append(int(stat.parent.name))
    return found


def parent_of(pid: int) -> int:
    """The parent pid of `pid`, a zombie's too, from /proc/PID/stat (after "pid (comm)": state, ppid)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def test_a_warm_agent_is_a_child_of_the_zygote_and_sends_the_exec_agents_dump(
    warm: None, cluster: LocalCluster, feeder: str
) -> None:
    """With a warm process, fedload's own local agent is forked by it (no agent started by this process) and sends
    the dump an exec'd agent sends, with exit status 0."""
    argv = agent_argv(cluster, feeder)

    forked = await LocalTransport(read_timeout_s=30, warm=True).open(argv)
    (zygote,) = children_running(os.getpid(), ZYGOTE)
    assert not agents_of(os.getpid())
    warm_text, warm_status = await dump_text(forked)
    exec_text, exec_status = await dump_text(await LocalTransport(read_timeout_s=30).open(argv))

    assert (warm_status, exec_status) == (0, 0)
    assert warm_text == exec_text
    assert b"COPY public.contexts" in warm_text
    assert children_running(os.getpid(), ZYGOTE) == [zygote]  # one zygote serves the next run too


async def test_a_failing_warm_agent_reports_its_status_and_stderr(warm: None, cluster: LocalCluster) -> None:
    """An agent that fails (no such database) exits 1 with pg_dump's message on stderr, as an exec'd one does."""
    argv = agent_argv(cluster, "no_such_database")

    process = await LocalTransport(read_timeout_s=30, warm=True).open(argv)
    while await process.read(1 << 16):
        pass

    assert await process.wait() == 1
    assert "no_such_database" in process.stderr_tail
    assert children_running(os.getpid(), ZYGOTE)


async def test_cancel_kills_a_warm_agent_and_its_pg_dump(warm: None, cluster: LocalCluster, feeder: str) -> None:
    """A run cancelled while pg_dump waits for a lock kills the forked agent's whole process group, pg_dump with it,
    as with an exec'd agent."""
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_dump'"
    hold = "BEGIN; LOCK TABLE hosts IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(60) /* warm lock holder */;"
    psql = [cluster.install.tool("psql"), "-X", "-q", cluster.dsn(feeder), "-c", hold]
    holder = subprocess.Popen(psql, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
    try:
        process = await LocalTransport(read_timeout_s=30, warm=True).open(agent_argv(cluster, feeder))
        await until(lambda: psql_int(cluster, waiting) == 1)
        (pg_dump,) = pg_dumps_of(feeder)
        await process.cancel()
        await until(lambda: not pg_dumps_of(feeder), timeout_s=5)
        assert pg_dump not in pg_dumps_of(feeder)
    finally:
        holders = "query LIKE '%warm lock holder%' AND pid <> pg_backend_pid()"
        cluster.psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {holders}")
        holder.wait(timeout=30)


async def test_a_zygote_that_died_is_replaced_and_the_run_still_streams(
    warm: None, cluster: LocalCluster, feeder: str
) -> None:
    """The warm process killed between runs: the next run still gets its dump (exec'd or from a new zygote), and a
    new zygote serves the runs after it."""
    argv = agent_argv(cluster, feeder, "public.hosts")
    transport = LocalTransport(read_timeout_s=30, warm=True)
    assert (await dump_text(await transport.open(argv)))[1] == 0
    (first,) = children_running(os.getpid(), ZYGOTE)

    os.kill(first, signal.SIGKILL)
    results = [await dump_text(await transport.open(argv)) for _ in range(2)]

    assert [status for _, status in results] == [0, 0]
    assert results[0][0] == results[1][0]
    (second,) = children_running(os.getpid(), ZYGOTE)
    assert second != first


async def test_where_the_zygote_cannot_start_the_agent_is_execd(
    warm: None, cluster: LocalCluster, feeder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warm process that cannot be started (here: no interpreter at sys.executable) costs nothing but a warning:
    the agent is started as a program, as without one."""
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")

    with capture_logs() as events:
        text, status = await dump_text(
            await LocalTransport(read_timeout_s=30, warm=True).open(agent_argv(cluster, feeder))
        )

    assert status == 0
    assert b"COPY public.hosts" in text
    assert [e["event"] for e in events if e["log_level"] == "warning"] == ["transport.warm_agent_unavailable"]
    assert not children_running(os.getpid(), ZYGOTE)


async def test_without_a_warm_process_the_agent_is_execd(cluster: LocalCluster, feeder: str) -> None:
    """Outside a worker (no use_warm_agents), a warm-capable transport starts the agent itself: no zygote."""
    process = await LocalTransport(read_timeout_s=30, warm=True).open(agent_argv(cluster, feeder))
    # The agent is this process's own child, exec'd; by its pid, not its command line: a small dump may be over
    # already, its process a zombie, whose command line is empty (agents_of then found none: CI saw it once).
    agent = getattr(process, "_process", None)  # which process the transport started is what is tested
    assert isinstance(agent, asyncio.subprocess.Process)
    assert parent_of(agent.pid) == os.getpid()
    assert (await dump_text(process))[1] == 0
    assert not children_running(os.getpid(), ZYGOTE)


async def until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait until `predicate()` is true, polling every 50 ms; fail after `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 - the conditions are other processes' states
            await asyncio.sleep(0.05)


async def test_without_pidfds_the_agents_are_execd(
    cluster: LocalCluster, feeder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a kernel without pidfds (the zygote could not learn when its children exit) a worker starts no zygote,
    and its local agents are started as programs."""

    def no_pidfds(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open is not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    use_warm_agents(start_now=True)
    try:
        process = await LocalTransport(read_timeout_s=30, warm=True).open(agent_argv(cluster, feeder))
        assert agents_of(os.getpid())
        assert (await dump_text(process))[1] == 0
        assert not children_running(os.getpid(), ZYGOTE)
    finally:
        await close_warm_agents()
