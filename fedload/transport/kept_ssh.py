"""SSH connections kept from one run of a feeder to the next, in a worker process (docs/how-it-works.md, "Kept
SSH connections").

A run's SSH connection costs a TCP and SSH handshake and a key authentication, most of a small feeder's fixed cost
on the superhub (bench/README.md). A worker keeps the connection of a run whose command ended cleanly (its stdout
read to the end, exit status 0, the connection open) and gives it to the next run of the same feeder made with the
same settings (`SshConfig`, compared whole: host, port, user, key, known_hosts, bastion, timeouts, keepalives);
each run still opens its own channel on it, or asks the served agent (fedload.transport.served) kept with it.
Bounded: at most `MAX_IDLE` idle connections per worker (the least
recently used closed beyond that), each closed after `IDLE_S` unused, all when the worker ends. `forget` closes a
feeder's kept connection at once (paused, removed or reconfigured in the daemon) and refuses the connection of a
run under way at that moment.

    keep_ssh(SshKeeper())  # once, in the worker process
    keeper = kept_ssh()  # the transport's, or None: then nothing is kept
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fedload.config import SshConfig
from fedload.log import get_logger

__all__ = [
    "IDLE_S",
    "MAX_IDLE",
    "SERVE_REFUSED",
    "Kept",
    "Lease",
    "SshKeeper",
    "close_kept_ssh",
    "forget_kept_ssh",
    "keep_ssh",
    "kept_ssh",
]

log = get_logger()

IDLE_S = 60.0  # as the superhub's kept sessions: a feeder run every minute or more often keeps its connection
MAX_IDLE = 8  # per worker: with the pool's feeder affinity, ten feeders run every second on four workers find their
# connection kept in 95% of their runs (bench/README.md)
_CLOSE_TIMEOUT_S = 10.0
SERVE_REFUSED = "serve refused"  # a kept connection's agent: its feeder's agent does not serve (started per run)


@dataclass(frozen=True, slots=True)
class Lease:
    """What a run took from the keeper: the feeder, the settings its connection is made with, and the feeder's
    generation then (a `forget` since refuses the connection back)."""

    feeder: str
    config: SshConfig
    generation: int


class Kept(NamedTuple):
    """A kept connection, and the served agent on it: a ServedAgent, SERVE_REFUSED, or None (not asked yet)."""

    conn: Any  # asyncssh.SSHClientConnection: this module never imports asyncssh (the worker always imports it)
    agent: Any = None


@dataclass(slots=True)
class _Idle:
    conn: Any
    config: SshConfig
    since: float
    agent: Any = None
    timer: asyncio.TimerHandle | None = field(default=None)


class SshKeeper:
    """The idle SSH connections of one worker process, by feeder, least recently used first."""

    def __init__(self, *, max_idle: int = MAX_IDLE, idle_s: float = IDLE_S) -> None:
        self._max_idle, self._idle_s = max_idle, idle_s
        self._idle: OrderedDict[str, _Idle] = OrderedDict()
        self._generations: dict[str, int] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._idle)

    def lease(self, feeder: str, config: SshConfig) -> Lease:
        """The lease of a run of `feeder` with `config`: what `give_back` needs."""
        return Lease(feeder, config, self._generations.get(feeder, 0))

    def take(self, lease: Lease) -> Kept | None:
        """The feeder's kept connection (and agent) if it was made with the same settings and is still open; else
        None (a kept one that does not fit is closed)."""
        idle = self._idle.pop(lease.feeder, None)
        if idle is None:
            return None
        self._stop_timer(idle)
        if idle.config != lease.config:
            self._close(lease.feeder, idle.conn, "made with other ssh settings")
            return None
        if idle.conn.is_closed():
            self._close(lease.feeder, idle.conn, "closed while idle")
            return None
        log.debug("transport.connection_reused", feeder=lease.feeder, idle_s=round(time.monotonic() - idle.since, 3))
        return Kept(idle.conn, idle.agent)

    def give_back(self, lease: Lease, conn: Any, agent: Any = None) -> None:
        """Keep `conn` (and the served `agent` on it), which a run of the lease's feeder ended cleanly on, for the
        feeder's next run; closed instead if the feeder was forgotten since the lease, or the connection has
        closed."""
        if self._generations.get(lease.feeder, 0) != lease.generation:
            self._close(lease.feeder, conn, "forgotten during the run")
            return
        if conn.is_closed():
            return
        if (previous := self._idle.pop(lease.feeder, None)) is not None:  # two runs of one feeder: one is enough
            self._stop_timer(previous)
            self._close(lease.feeder, previous.conn, "another connection kept")
        idle = _Idle(conn, lease.config, time.monotonic(), agent)
        idle.timer = asyncio.get_running_loop().call_later(self._idle_s, self._expire, lease.feeder, idle)
        self._idle[lease.feeder] = idle
        while len(self._idle) > self._max_idle:
            oldest, evicted = self._idle.popitem(last=False)
            self._stop_timer(evicted)
            self._close(oldest, evicted.conn, f"more than {self._max_idle} kept")

    def forget(self, feeder: str, reason: str) -> None:
        """Close the feeder's kept connection now, and refuse the one of its run under way (paused, removed,
        reconfigured)."""
        self._generations[feeder] = self._generations.get(feeder, 0) + 1
        if (idle := self._idle.pop(feeder, None)) is not None:
            self._stop_timer(idle)
            self._close(feeder, idle.conn, reason)

    async def close(self) -> None:
        """Close every kept connection, and wait (bounded) for every close under way."""
        while self._idle:
            feeder, idle = self._idle.popitem(last=False)
            self._stop_timer(idle)
            self._close(feeder, idle.conn, "the worker ends")
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=_CLOSE_TIMEOUT_S)

    def _expire(self, feeder: str, idle: _Idle) -> None:
        if self._idle.get(feeder) is idle:
            del self._idle[feeder]
            self._close(feeder, idle.conn, f"idle for {self._idle_s:g} s")

    @staticmethod
    def _stop_timer(idle: _Idle) -> None:
        if idle.timer is not None:
            idle.timer.cancel()

    def _close(self, feeder: str, conn: Any, reason: str) -> None:
        log.info("transport.kept_connection_dropped", feeder=feeder, reason=reason)
        task = asyncio.get_running_loop().create_task(close_connection(conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


async def close_connection(conn: Any) -> None:
    """Close an SSH connection (and its bastion's) and wait for it, at most `_CLOSE_TIMEOUT_S`; never raises."""
    with contextlib.suppress(Exception):
        conn.close()
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_CLOSE_TIMEOUT_S):
            await conn.wait_closed()


_keeper: SshKeeper | None = None


def keep_ssh(keeper: SshKeeper | None) -> None:
    """From now on, in this process, SSH transports keep cleanly ended connections in `keeper` for the next run
    (a worker sets its keeper once at its start); None: nothing is kept."""
    global _keeper  # noqa: PLW0603 - one keeper per worker process, set once at its start
    _keeper = keeper


def kept_ssh() -> SshKeeper | None:
    """This process's keeper, or None where nothing is kept (outside a worker)."""
    return _keeper


def forget_kept_ssh(feeder: str, reason: str) -> None:
    """Close the feeder's kept connection in this process, if it keeps any (the parent asked)."""
    if _keeper is not None:
        _keeper.forget(feeder, reason)


async def close_kept_ssh() -> None:
    """Close every kept connection of this process (at the end of the worker); from then on nothing is kept."""
    global _keeper
    keeper, _keeper = _keeper, None
    if keeper is not None:
        await keeper.close()
