"""A served agent (`fedload agent serve`, fedload.feeder.serve) on a kept SSH connection: one agent process for a
feeder's runs, each dump a request line on its stdin and a stream of frames on its stdout.

A run on a kept connection whose command is an agent dump asks the agent kept with it, or starts one: it writes the
request at once (no round trip waits for the agent's hello) and reads the hello before the first frame. An agent
that sends no hello (one from before serve, or a forced command that refuses it) is closed, remembered with the
connection, and the run's command is started as its own session as before. A dump is `ServedDump`, read as an
`SshProcess`; its end frame carries its exit status and stderr's tail. Only a dump whose end frame came leaves the
agent for the next run; any other end (a read given up, a broken frame, a timeout) closes the connection with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
from collections.abc import Awaitable, Callable
from typing import Any

from fedload.config import SshConfig
from fedload.errors import FeederCommandError, FeederConnectionLostError, FeederTimeoutError, one_line
from fedload.feeder.serve import DATA, END, FRAME_HEAD, HELLO_FRAME, MAX_REQUEST_BYTES
from fedload.log import get_logger
from fedload.transport._asyncssh import asyncssh

__all__ = ["ServedAgent", "ServedDump", "serve_argv"]

log = get_logger()

_MAX_END_BYTES = 1 << 20  # an end frame: a status and a few KB of stderr
_CLOSE_TIMEOUT_S = 10.0


def serve_argv(argv: list[str]) -> list[str] | None:
    """The command that serves `argv`'s dumps (`... agent dump ...` -> `... agent serve`, the zipapp's `... dump
    ...` -> `... serve`); None for a command that is not an agent dump, or one no request line can carry: too long,
    or with a newline in a word (a wrapper's `python -c` script, say: the line would end inside it)."""
    if len(_request_line(argv)) > MAX_REQUEST_BYTES or any("\n" in word for word in argv):
        return None
    for i in range(1, len(argv)):
        if argv[i - 1 : i + 1] == ["agent", "dump"]:
            return [*argv[: i - 1], "agent", "serve"]
    if "dump" in argv[1:]:
        return [*argv[: argv.index("dump", 1)], "serve"]
    return None


def _request_line(argv: list[str]) -> bytes:
    return shlex.join(argv).encode() + b"\n"


class ServedAgent:
    """`agent serve` running in one session of a kept connection, between two dumps or in one."""

    def __init__(self, process: Any, config: SshConfig, where: str) -> None:
        self._process = process
        self._config = config
        self._where = where
        self._greeted = False

    @classmethod
    async def start(cls, conn: Any, argv: list[str], config: SshConfig, where: str) -> ServedAgent:
        """Start `argv` (serve_argv's) on `conn`; FeederCommandError if its session cannot be opened."""
        try:
            async with asyncio.timeout(config.connect_timeout_s):
                process = await conn.create_process(shlex.join(argv), encoding=None)
        except (TimeoutError, asyncssh.Error, OSError) as exc:
            raise FeederCommandError(f"cannot start the served agent on {where}: {exc}") from exc
        return cls(process, config, where)

    @property
    def usable(self) -> bool:
        """Whether the session is still open (the agent may take another request)."""
        return not self._process.is_closing() and self._process.exit_status is None

    async def dump(self, argv: list[str], on_end: Callable[[bool], Awaitable[None]]) -> ServedDump | None:
        """Send `argv`'s request (serve_argv's for it must not be None); its dump once the agent is known to serve;
        None if it does not (it sent no hello: closed here). `on_end(clean)` is awaited once, when the dump is
        cancelled."""
        try:
            async with asyncio.timeout(self._config.connect_timeout_s):
                self._process.stdin.write(_request_line(argv))
                await self._process.stdin.drain()
                if not self._greeted:
                    self._greeted = await self._process.stdout.readexactly(len(HELLO_FRAME)) == HELLO_FRAME
        except (TimeoutError, asyncssh.Error, OSError, asyncio.IncompleteReadError) as exc:
            reason = str(exc) or type(exc).__name__
            if self._greeted:
                raise FeederConnectionLostError(f"the served agent on {self._where} went away: {reason}") from exc
            await self._refused(reason)
            return None
        if not self._greeted:
            await self._refused("its first frame was not the hello")
            return None
        return ServedDump(self._process, self._config, self._where, on_end)

    async def _refused(self, reason: str) -> None:
        stderr = b""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                stderr = await self._process.stderr.read(4096)
        tail = one_line(stderr.decode(errors="replace"))
        log.info("transport.serve_refused", feeder=self._where, reason=reason, stderr=tail)
        await self.close()

    async def close(self) -> None:
        """End the session (the agent ends at its stdin's end); bounded, never raises."""
        with contextlib.suppress(Exception):
            self._process.close()
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await self._process.wait_closed()


class ServedDump:
    """One dump of a served agent, read as an SshProcess: its D frames' bytes, then its end frame's status."""

    def __init__(self, process: Any, config: SshConfig, where: str, on_end: Callable[[bool], Awaitable[None]]) -> None:
        self._process = process
        self._config = config
        self._where = where
        self._on_end: Callable[[bool], Awaitable[None]] | None = on_end
        self._left = 0  # bytes of the current D frame not yet read
        self._status: int | None = None  # from the end frame
        self._stderr = ""

    async def read(self, max_bytes: int) -> bytes:
        """Up to `max_bytes` of the dump's stream; b"" once its end frame came."""
        try:
            async with asyncio.timeout(self._config.read_timeout_s):
                while not self._left:
                    if self._status is not None or not await self._next_frame():
                        return b""
                data: bytes = await self._process.stdout.read(min(max_bytes, self._left))
        except TimeoutError:
            raise FeederTimeoutError(
                f"{self._where} sent nothing for {self._config.read_timeout_s:g} s (read_timeout_s)"
            ) from None
        except (asyncssh.Error, OSError, asyncio.IncompleteReadError) as exc:
            raise FeederConnectionLostError(f"the connection to {self._where} broke during the dump: {exc}") from exc
        if not data:
            raise FeederConnectionLostError(f"the served agent on {self._where} ended before its dump did")
        self._left -= len(data)
        return data

    async def _next_frame(self) -> bool:
        """Read the next frame's head (and an end frame whole): False at the end frame."""
        kind, size = FRAME_HEAD.unpack(await self._process.stdout.readexactly(FRAME_HEAD.size))
        if kind == DATA:
            self._left = size
            return True
        if kind != END or size > _MAX_END_BYTES:
            raise FeederCommandError(f"the served agent on {self._where} sent a frame of kind {kind!r}, {size} bytes")
        payload = await self._process.stdout.readexactly(size)
        try:
            end = json.loads(payload)
            self._status, self._stderr = int(end["status"]), str(end.get("stderr", ""))
        except (ValueError, TypeError, KeyError) as exc:
            raise FeederCommandError(f"the served agent on {self._where} sent an end frame that is not one") from exc
        return False

    async def wait(self) -> int:
        """The dump's exit status from its end frame; FeederCommandError if the stream was not read to it."""
        if self._status is None:
            raise FeederCommandError(f"the served agent on {self._where} has not ended its dump")
        return self._status

    @property
    def stderr_tail(self) -> str:
        """The dump's stderr's tail, from its end frame."""
        return self._stderr

    async def cancel(self) -> None:
        """Hand the agent back (its end frame came) or have it closed with its connection; idempotent."""
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            await on_end(self._status is not None and not self._left)
