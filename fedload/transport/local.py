"""A feeder on the superhub's own host: the dump command runs as a local subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping

from fedload._tail import Tail
from fedload.errors import FeederCommandError, FeederTimeoutError
from fedload.log import get_logger, without_passwords
from fedload.transport.warm import WarmAgent, ZygoteGoneError, start_agent

__all__ = ["FEDLOAD_HERE", "LocalProcess", "LocalTransport"]

FEDLOAD_HERE = (sys.executable, "-m", "fedload")  # fedload as this process runs it: a local agent's command

_WAIT_TIMEOUT_S = 30.0
_DRAIN_TIMEOUT_S = 5.0
log = get_logger()


class LocalProcess:
    """A running local dump command (its own process group, so cancel() reaches pg_dump too)."""

    def __init__(self, process: asyncio.subprocess.Process | WarmAgent, read_timeout_s: float) -> None:
        self._process = process
        self._read_timeout_s = read_timeout_s
        self._stderr = Tail()
        self._stderr_task = asyncio.create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        assert self._process.stderr is not None
        while line := await self._process.stderr.read(1024):
            self._stderr.append(line)

    async def read(self, max_bytes: int) -> bytes:
        """Up to `max_bytes` of stdout; FeederTimeoutError if silent for the read timeout."""
        assert self._process.stdout is not None
        try:
            async with asyncio.timeout(self._read_timeout_s):
                return await self._process.stdout.read(max_bytes)
        except TimeoutError:
            raise FeederTimeoutError(f"the local dump command sent nothing for {self._read_timeout_s:g} s") from None

    async def wait(self) -> int:
        """The exit status (negative: killed by that signal)."""
        try:
            async with asyncio.timeout(_WAIT_TIMEOUT_S):
                status = await self._process.wait()
                await self._stderr_task
        except TimeoutError:
            raise FeederCommandError(f"the local dump command did not exit within {_WAIT_TIMEOUT_S:g} s") from None
        except ZygoteGoneError as exc:
            raise FeederCommandError(f"the exit status of the local agent is unknown: {exc}") from exc
        return status

    @property
    def stderr_tail(self) -> str:
        """The last few KB of stderr."""
        return self._stderr.text()

    async def cancel(self) -> None:
        """Kill the process group and reap it; idempotent. Its stdout is read to its end first: asyncio's wait()
        returns only once the pipes are closed, which a reader that stopped mid-stream (a refused dump) left
        paused, so waiting first cost the whole wait timeout."""
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
        await self._drain_stdout()
        with contextlib.suppress(TimeoutError, ProcessLookupError, ZygoteGoneError):
            async with asyncio.timeout(_WAIT_TIMEOUT_S):
                await self._process.wait()
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # its own failure must not hide the run's
            await self._stderr_task

    async def _drain_stdout(self) -> None:
        """Read what the killed command left in its stdout pipe, to its end (bounded): asyncio closes the pipe, and
        the process's transport, only at end of file, and a reader that stopped mid-stream left reading paused,
        so a run cancelled mid-COPY would leak the pipe."""
        assert self._process.stdout is not None
        with contextlib.suppress(TimeoutError, OSError, RuntimeError):  # RuntimeError: another reader waits
            async with asyncio.timeout(_DRAIN_TIMEOUT_S):
                while await self._process.stdout.read(1 << 16):
                    pass


class LocalTransport:
    """Runs the dump command on this host; with `warm`, fedload's own agent (`FEDLOAD_HERE agent ...`) is forked
    from a warm process where this process has one (a worker's: `fedload.transport.warm`), else started."""

    def __init__(
        self, read_timeout_s: float = 300.0, env: Mapping[str, str] | None = None, *, warm: bool = False
    ) -> None:
        self._read_timeout_s = read_timeout_s
        self._env = dict(env) if env is not None else None
        self._warm = warm

    async def open(self, argv: list[str]) -> LocalProcess:
        """Start `argv`; FeederCommandError if it cannot start."""
        if self._warm and tuple(argv[: len(FEDLOAD_HERE)]) == FEDLOAD_HERE:
            agent = await start_agent(argv[len(FEDLOAD_HERE) :], self._env)
            if agent is not None:
                log.debug("transport.local_forked", argv=[without_passwords(a) for a in argv], pid=agent.pid)
                return LocalProcess(agent, self._read_timeout_s)
        return await self._start(argv)

    def connect_ahead(self) -> None:
        """Nothing to reach ahead: the command starts at `open`."""

    async def close(self) -> None:
        """Nothing started ahead to release."""

    async def _start(self, argv: list[str]) -> LocalProcess:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                env=self._env,
            )
        except OSError as exc:
            raise FeederCommandError(f"cannot start the local dump command {argv[0]}: {exc.strerror or exc}") from exc
        log.debug("transport.local_started", argv=[without_passwords(a) for a in argv], pid=process.pid)
        return LocalProcess(process, self._read_timeout_s)
