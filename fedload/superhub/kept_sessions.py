"""Superhub connections kept from one feeder run to the next, in a worker process.

A run's connection costs a backend start, authentication, cold catalog caches and the driver's type
introspection (~20 ms of a slot per run: a round of 100 small feeders ran ~18% faster with kept connections,
bench/README.md). A worker runs one feeder at a time, so it keeps the
connection of a run that ended cleanly (no exception, no transaction open) and gives it to its next run, reset
to a new session's state (`asyncpg.Connection.reset`: transaction rolled back, settings back to the connection's
startup values, advisory locks released) and renamed for the feeder (`application_name`). A kept connection that
fails its reset (the server restarted, an administrator ended it) is dropped and a new one made. One idle for
`IDLE_S` is closed, and every kept one when the worker ends, so a daemon's idle workers hold no sessions.

    keep_sessions()  # once, in the worker process
    async with reused_session(target, "hub1") as conn:  # as superhub_session, elsewhere too
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg

from fedload.log import get_logger
from fedload.superhub.session import (
    SuperhubTarget,
    application_name,
    close_superhub,
    connect_superhub,
    superhub_errors,
    superhub_session,
)

__all__ = ["IDLE_S", "close_kept", "keep_sessions", "reused_session"]

log = get_logger()

IDLE_S = 60.0


class _Keeper:
    """At most one idle connection, with the superhub it was made for (dsn and timeouts) and its idle timer."""

    def __init__(self) -> None:
        self.conn: asyncpg.Connection | None = None
        self.made_for: SuperhubTarget | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def keep(self, conn: asyncpg.Connection, made_for: SuperhubTarget) -> None:
        self._discard()  # one at a time, as a worker runs one feeder at a time
        self.conn, self.made_for = conn, made_for
        self._timer = asyncio.get_running_loop().call_later(IDLE_S, self._discard)

    def take(self, made_for: SuperhubTarget) -> asyncpg.Connection | None:
        """The kept connection if it was made for the same superhub and settings and is open (else it is closed)."""
        if self.made_for != made_for or (self.conn is not None and self.conn.is_closed()):
            self._discard()
        return self._pop()

    async def close(self) -> None:
        """Close the kept connection, and wait for every close under way."""
        self._discard()
        await asyncio.gather(*self._closing)

    def _pop(self) -> asyncpg.Connection | None:
        conn, self.conn = self.conn, None
        if self._timer is not None:
            self._timer.cancel()
        return conn

    def _discard(self) -> None:
        if (conn := self._pop()) is not None:
            task = asyncio.get_running_loop().create_task(close_superhub(conn))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)


_keeper: _Keeper | None = None


def keep_sessions() -> None:
    """From now on, in this process, `reused_session` keeps cleanly ended connections for the next session."""
    global _keeper  # noqa: PLW0603 - one keeper per worker process, set once at its start
    _keeper = _Keeper()


async def close_kept() -> None:
    """Close the kept connection, if any (at the end of the worker)."""
    if _keeper is not None:
        await _keeper.close()


@contextlib.asynccontextmanager
async def reused_session(superhub: SuperhubTarget, purpose: str) -> AsyncIterator[asyncpg.Connection]:
    """`superhub_session`, but on the connection the last clean session left, if this process keeps them."""
    if _keeper is None:
        async with superhub_session(superhub, purpose) as conn:
            yield conn
        return
    keeper = _keeper
    with superhub_errors(superhub.statement_timeout_s):
        conn = await _reset(keeper.take(superhub), superhub, purpose) or await _connect(superhub, purpose)
        clean = False
        try:
            yield conn
            clean = not conn.is_closed() and not conn.is_in_transaction()
        finally:
            if clean:
                keeper.keep(conn, superhub)
            else:
                await asyncio.shield(close_superhub(conn))


async def _connect(superhub: SuperhubTarget, purpose: str) -> asyncpg.Connection:
    conn = await connect_superhub(superhub, purpose)
    log.debug("superhub.session_started", feeder=purpose, pid=conn.get_server_pid())
    return conn


async def _reset(conn: asyncpg.Connection | None, superhub: SuperhubTarget, purpose: str) -> asyncpg.Connection | None:
    """A kept connection as a new session for `purpose`; None (it is dropped) if it does not answer."""
    if conn is None:
        return None
    try:
        async with asyncio.timeout(superhub.connect_timeout_s):
            await conn.reset()
            await conn.execute("SELECT set_config('application_name', $1, false)", application_name(purpose))
    except Exception as exc:  # noqa: BLE001 - whatever fails (a connection the server ended mid-idle can leave
        # asyncpg's protocol in a state it reports as InternalClientError), the kept connection is not usable
        log.info("superhub.kept_session_dropped", feeder=purpose, error=str(exc) or type(exc).__name__)
        conn.terminate()
        return None
    log.debug("superhub.session_reused", feeder=purpose, pid=conn.get_server_pid())
    return conn
