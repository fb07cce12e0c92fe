"""Local agents forked from a warm process (`fedload.transport.zygote`) instead of started as new interpreters.

A worker process calls `use_warm_agents()` once (as it calls `keep_sessions()`); from then on `start_agent` hands
`fedload agent dump ...` to the worker's zygote, started at the first such run, and returns a `WarmAgent` that
`LocalProcess` reads like the asyncio Process of an exec'd agent: stdout and stderr pipes, a pid that leads its
own process group, an exit status. Where the zygote cannot start, answers with an error or has gone,
`start_agent` returns None and the caller execs the agent as before (logged once per cause); a zygote that has
gone is started again at the next run. `close_warm_agents()` at the worker's end closes the socket, which ends
the zygote.

Elsewhere (a process that never called `use_warm_agents`, such as `fedload check-config`'s probe or a test's own
event loop) `start_agent` returns None: the zygote's lifetime is the worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from fedload.log import get_logger
from fedload.pidfds import pidfds_work
from fedload.transport.zygote import MAX_MESSAGE_BYTES

__all__ = ["ZYGOTE_MODULE", "WarmAgent", "close_warm_agents", "start_agent", "use_warm_agents"]

ZYGOTE_MODULE = "fedload.transport.zygote"  # also a worker's preload: then its zygote starts with it

log = get_logger()

_START_TIMEOUT_S = 30.0  # the zygote's answer to a request: its start and imports, at the first one
_CLOSE_TIMEOUT_S = 5.0


class ZygoteGoneError(Exception):
    """The zygote did not answer (it could not start, or it has exited)."""


class WarmAgent:
    """A forked agent as `LocalProcess` uses an asyncio Process: `pid`, `stdout`, `stderr`, `returncode`, `wait()`."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader, exited: Any) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self._exited: asyncio.Future[int] = exited

    @property
    def returncode(self) -> int | None:
        """The exit status once the zygote has reported it (-signal if killed), else None."""
        if not self._exited.done() or self._exited.cancelled() or self._exited.exception() is not None:
            return None
        return self._exited.result()

    async def wait(self) -> int:
        """The exit status; ZygoteGoneError if the zygote ended before it could say (the agent may still run)."""
        return await asyncio.shield(self._exited)


class _Zygote:
    """The zygote process and this side of its socket: requests out, answers dispatched to their futures."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self._process = process
        self._sock = sock
        self._ids = itertools.count(1)
        self._started: dict[int, asyncio.Future[int]] = {}
        self._exited: dict[int, asyncio.Future[int]] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read_answers())

    @classmethod
    def start(cls) -> _Zygote:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", ZYGOTE_MODULE, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C on the terminal is the sync's to handle, not the zygote's
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        log.debug("transport.zygote_started", pid=process.pid)
        return cls(process, ours)

    @property
    def alive(self) -> bool:
        return not self._reader.done()

    async def fork(self, words: list[str], env: Mapping[str, str] | None) -> WarmAgent:
        """A child of the zygote running `words`; ZygoteGoneError if the zygote cannot fork it."""
        loop = asyncio.get_running_loop()
        request_id = next(self._ids)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        started, exited = loop.create_future(), loop.create_future()
        self._started[request_id], self._exited[request_id] = started, exited
        try:
            message = json.dumps({"id": request_id, "words": words, "env": None if env is None else dict(env)})
            socket.send_fds(self._sock, [message.encode()], [out_w, err_w])
            async with asyncio.timeout(_START_TIMEOUT_S):
                pid = await started
        except BaseException:
            self._exited.pop(request_id, None)
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            self._started.pop(request_id, None)
            for fd in (out_w, err_w):
                os.close(fd)
        return WarmAgent(pid, await _reader_of(out_r), await _reader_of(err_r), exited)

    async def _read_answers(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while message := await loop.sock_recv(self._sock, MAX_MESSAGE_BYTES):
                self._dispatch(json.loads(message))
        except (OSError, ValueError) as exc:
            log.warning("transport.zygote_unreadable", error=str(exc))
        finally:
            for future in (*self._started.values(), *self._exited.values()):
                if not future.done():
                    future.set_exception(ZygoteGoneError("the warm agent process has exited"))
                    future.exception()  # retrieved: an agent nobody waits for any more is no error to log
            self._started.clear()
            self._exited.clear()

    def _dispatch(self, answer: dict[str, Any]) -> None:
        request_id = int(answer.get("id", -1))
        if "status" in answer and (exited := self._exited.pop(request_id, None)) is not None:
            exited.set_result(int(answer["status"]))
        elif (started := self._started.get(request_id)) is not None and not started.done():
            if "pid" in answer:
                started.set_result(int(answer["pid"]))
            else:
                started.set_exception(ZygoteGoneError(str(answer.get("error", "no pid in its answer"))))

    async def close(self) -> None:
        """Close the socket (the zygote ends at its end of file) and reap the zygote, killed if it lingers."""
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        self._sock.close()
        try:
            await asyncio.to_thread(self._process.wait, _CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            await asyncio.to_thread(self._process.wait, _CLOSE_TIMEOUT_S)


async def _reader_of(fd: int) -> asyncio.StreamReader:
    """An asyncio StreamReader over the read end of a pipe (which it then owns)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(fd, "rb", 0))
    return reader


class _WarmAgents:
    """This worker's zygote, started at the first run that needs it and again after it has gone."""

    def __init__(self) -> None:
        self._zygote: _Zygote | None = None

    async def start_agent(self, words: list[str], env: Mapping[str, str] | None) -> WarmAgent | None:
        try:
            if self._zygote is None or not self._zygote.alive:
                await self._retire()
                self._zygote = _Zygote.start()
            return await self._zygote.fork(words, env)
        except (OSError, TimeoutError, ZygoteGoneError) as exc:
            log.warning("transport.warm_agent_unavailable", error=str(exc) or type(exc).__name__)
            await self._retire()
            return None

    def start_now(self) -> None:
        """Start the zygote now, before the first run asks for it (its imports overlap the superhub's setup)."""
        if self._zygote is None or not self._zygote.alive:
            try:
                self._zygote = _Zygote.start()
            except OSError as exc:
                log.warning("transport.warm_agent_unavailable", error=str(exc) or type(exc).__name__)

    async def _retire(self) -> None:
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            await zygote.close()

    async def close(self) -> None:
        await self._retire()


_agents: _WarmAgents | None = None


def use_warm_agents(*, start_now: bool = False) -> None:
    """From now on, in this process, local agents are forked from a warm process (once, in a worker); `start_now`:
    its zygote starts at once rather than at the first local run."""
    global _agents  # noqa: PLW0603 - one zygote per worker process, set once at its start
    if not pidfds_work():  # the zygote learns of its children's exits through pidfds (Linux 5.3)
        log.info("transport.warm_agents_unsupported", reason="no pidfds on this kernel")
        return
    _agents = _WarmAgents()
    if start_now:
        _agents.start_now()


async def close_warm_agents() -> None:
    """End this process's zygote, if any (at the end of the worker); local agents are started as programs again."""
    global _agents
    agents, _agents = _agents, None
    if agents is not None:
        await agents.close()


async def start_agent(words: list[str], env: Mapping[str, str] | None) -> WarmAgent | None:
    """`fedload agent` with `words` as a child of the warm process; None where there is none (exec it instead)."""
    return None if _agents is None else await _agents.start_agent(words, env)
