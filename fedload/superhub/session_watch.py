"""The feeder's dump, read while the run's superhub session is watched.

While the feeder sends nothing (its dump waits for a lock there, or its server is slow), the run awaits only the
feeder's stream; a superhub session lost meanwhile (the server restarted, the backend was terminated) would be
noticed at the next statement, after up to `read_timeout_s` of silence. `SessionWatched` ends the wait at once with
the SuperhubError that says so: asyncpg calls its termination listener as soon as the session's socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import asyncpg.pool

from fedload.errors import SuperhubError
from fedload.transport.base import FeederProcess

__all__ = ["SessionWatched"]


class SessionWatched:
    """`process` (the feeder's dump) read as before, each read failing with SuperhubError once `conn` is lost."""

    def __init__(self, process: FeederProcess, conn: asyncpg.Connection) -> None:
        self._process = process
        self._conn = conn
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn.add_termination_listener(self._on_lost)

    def _on_lost(self, conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> None:
        del conn
        if not self._lost.done():
            self._lost.set_result(None)

    async def read(self, max_bytes: int) -> bytes:
        """The feeder's next bytes, or SuperhubError as soon as the superhub session is lost."""
        self._check()
        read = asyncio.ensure_future(self._process.read(max_bytes))
        await asyncio.wait((read, self._lost), return_when=asyncio.FIRST_COMPLETED)
        if not read.done():
            read.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # the run fails for the superhub's sake
                await read
            self._check()
        return read.result()

    def _check(self) -> None:
        if self._lost.done():
            raise SuperhubError("the superhub connection was lost while the feeder's dump was being read")

    async def wait(self) -> int:
        """The feeder's command's exit status."""
        return await self._process.wait()

    @property
    def stderr_tail(self) -> str:
        """The feeder's command's stderr tail."""
        return self._process.stderr_tail

    async def cancel(self) -> None:
        """Stop the feeder's command; the superhub session is no longer watched."""
        self._conn.remove_termination_listener(self._on_lost)
        await self._process.cancel()
