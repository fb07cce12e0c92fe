"""One superhub connection for a process's bookkeeping (the run history, the daemon's schedule), shared by all of
its feeders' runs instead of one per running feeder.

    history = Bookkeeping()
    run_id = await history.write(target, lambda conn: start_run(conn, "hub1"))  # target: the SuperhubTarget
    ...
    await history.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import asyncpg

from fedload.superhub.bookkeeping.runs import RunRecord, finish_run, start_run
from fedload.superhub.session import SuperhubTarget, close_superhub, connect_superhub, superhub_errors

__all__ = ["Bookkeeping", "RunHistory", "ShardHistories"]

T = TypeVar("T")
_WRITE_MAX_S = 60.0  # a bookkeeping statement is tiny: the longest it may take (statement_timeout_s if lower)
_DRAIN_S = 30.0  # at close, the longest wait for writes whose callers were cancelled


class RunHistory(Protocol):
    """Where a feeder's run records its start and end (fedload.runs): the process's `Bookkeeping`, or in a worker
    process a proxy that asks its parent's."""

    async def start_run(self, superhub: SuperhubTarget, feeder: str) -> int:
        """Record a new run of `feeder` on `superhub`; its id."""
        ...

    async def finish_run(self, superhub: SuperhubTarget, run_id: int, record: RunRecord) -> None:
        """Record how run `run_id` ended."""
        ...


class Bookkeeping:
    """One connection, opened on the first write (again after a failure, or when a reload changes the superhub's
    dsn), and one write at a time on it. Each write is bounded (connect_timeout_s plus at most a minute) and runs
    to its end even when its caller is cancelled, so the connection is never left mid-statement for the next
    caller. Failures come out as fedload's errors (`superhub_errors`) and drop the connection."""

    def __init__(self, purpose: str = "history") -> None:
        self._purpose = purpose
        self._conn: asyncpg.Connection | None = None
        self._dsn = ""
        self._lock = asyncio.Lock()
        self._writes: set[asyncio.Task[object]] = set()  # writes under way, kept so that close() waits for them

    async def write(self, superhub: SuperhubTarget, step: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run `step` on the shared connection to `superhub`, after the writes queued before it; its result."""
        task: asyncio.Task[T] = asyncio.get_running_loop().create_task(self._write(superhub, step))
        self._writes.add(task)
        task.add_done_callback(self._write_done)
        return await asyncio.shield(task)

    async def start_run(self, superhub: SuperhubTarget, feeder: str) -> int:
        """Record a new run of `feeder` in fedload.runs; its id."""
        return await self.write(superhub, lambda conn: start_run(conn, feeder))

    async def finish_run(self, superhub: SuperhubTarget, run_id: int, record: RunRecord) -> None:
        """Record how run `run_id` ended."""
        await self.write(superhub, lambda conn: finish_run(conn, run_id, record))

    async def close(self) -> None:
        """Wait for the writes under way (at most half a minute), then close the connection."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=_DRAIN_S)
        async with self._lock:
            await self._drop()

    async def _write(self, superhub: SuperhubTarget, step: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        budget_s = superhub.connect_timeout_s + min(superhub.statement_timeout_s, _WRITE_MAX_S)
        async with self._lock:
            try:
                with superhub_errors(superhub.statement_timeout_s):
                    async with asyncio.timeout(budget_s):
                        return await step(await self._connection(superhub))
            except BaseException:
                self._terminate()
                raise

    def _write_done(self, task: asyncio.Task[object]) -> None:
        self._writes.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a caller cancelled before the end no longer wants it

    async def _connection(self, superhub: SuperhubTarget) -> asyncpg.Connection:
        if self._conn is not None and (self._conn.is_closed() or self._dsn != superhub.dsn):
            await self._drop()
        if self._conn is None:
            self._conn = await connect_superhub(superhub, self._purpose)
            self._dsn = superhub.dsn
        return self._conn

    def _terminate(self) -> None:
        """Drop the connection at once after a failure: it may be mid-statement or dead."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await close_superhub(conn)


class ShardHistories:
    """The bookkeeping of a process whose feeders load into several superhubs (shards, docs/scale-out.md): one
    `Bookkeeping` connection per superhub, chosen by the dsn of the superhub each call is given (the feeder's,
    `Job.superhub`). Without shards that is the one connection of old."""

    def __init__(self, purpose: str = "history") -> None:
        self._purpose = purpose
        self._by_dsn: dict[str, Bookkeeping] = {}

    def _for(self, superhub: SuperhubTarget) -> Bookkeeping:
        dsn = superhub.dsn
        if dsn not in self._by_dsn:
            self._by_dsn[dsn] = Bookkeeping(self._purpose)
        return self._by_dsn[dsn]

    async def write(self, superhub: SuperhubTarget, step: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run `step` on the connection to `superhub` (see `Bookkeeping.write`)."""
        return await self._for(superhub).write(superhub, step)

    async def start_run(self, superhub: SuperhubTarget, feeder: str) -> int:
        """Record a new run of `feeder` on its superhub; its id."""
        return await self._for(superhub).start_run(superhub, feeder)

    async def finish_run(self, superhub: SuperhubTarget, run_id: int, record: RunRecord) -> None:
        """Record how run `run_id` ended, on the superhub that recorded its start."""
        await self._for(superhub).finish_run(superhub, run_id, record)

    async def close(self) -> None:
        """Close every connection (each waits for its writes under way, see `Bookkeeping.close`)."""
        await asyncio.gather(*(history.close() for history in self._by_dsn.values()))
