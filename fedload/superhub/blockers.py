"""Cancel the queries that block a waiting swap, from a connection of its own, as pg_repack does.

The swap's connection waits in LOCK (or another statement) for its locks; a watcher on a second connection asks
`pg_blocking_pids()` who holds them and cancels their running queries with `pg_cancel_backend` (never
`pg_terminate_backend`), logging and counting each. Sessions of a never-cancel role or application are spared:
the watcher then cancels the swap's own wait instead, so that readers do not queue behind a lock that will not
come. Other fedload sessions and idle transactions (which a cancel cannot reach) are waited for.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

import asyncpg

from fedload.log import get_logger

__all__ = ["Action", "Blocker", "BlockerWatch", "CancelRules", "decide", "watch_blockers"]

log = get_logger()

_BLOCKERS = """
SELECT pid, usename, application_name, query_start, state, left(query, 200) AS query
FROM pg_stat_activity WHERE pid = ANY(pg_blocking_pids($1)) ORDER BY pid
"""
_STATEMENT_TIMEOUT_S = 5.0
_FEDLOAD_APPLICATION = "fedload"  # connect_superhub() names fedload's sessions "fedload <purpose>"
_CANCEL = "SELECT pg_cancel_backend($1)"  # a name of its own: a test's negative control swaps in a terminate


@dataclass(frozen=True, slots=True)
class Blocker:
    """A session that holds (or queues ahead for) a lock the swap waits for."""

    pid: int
    user: str | None
    application: str | None
    query_start: datetime | None
    state: str | None
    query: str | None


@dataclass(frozen=True, slots=True)
class CancelRules:
    """Roles and application names whose queries are never cancelled."""

    roles: frozenset[str] = frozenset()
    applications: frozenset[str] = frozenset()


class Action(Enum):
    """What the watcher does about one blocker."""

    CANCEL = "cancel"
    SPARE = "spare"  # protected: stop the swap's wait rather than queue readers behind it
    WAIT = "wait"  # another fedload session (done in ms) or an idle transaction (a cancel cannot reach it)


@dataclass(slots=True)
class BlockerWatch:
    """What the watcher did: queries cancelled, and the protected session that made it give up, if any."""

    cancelled: int = 0
    spared: Blocker | None = None
    _seen: set[tuple[int, datetime | None]] = field(default_factory=set)


def decide(blocker: Blocker, rules: CancelRules) -> Action:
    """Cancel a blocker's query unless its role or application is protected, or it is fedload's or idle."""
    if blocker.user in rules.roles or blocker.application in rules.applications:
        return Action.SPARE
    application = blocker.application or ""
    if application == _FEDLOAD_APPLICATION or application.startswith(f"{_FEDLOAD_APPLICATION} "):
        return Action.WAIT
    if blocker.state != "active":
        return Action.WAIT
    return Action.CANCEL


async def watch_blockers(
    conn: asyncpg.Connection, swap_pid: int, rules: CancelRules, watch: BlockerWatch, *, poll_s: float = 0.1
) -> None:
    """Until the caller cancels it: cancel the queries blocking backend `swap_pid`, or stop its wait if a protected
    session blocks it (then return). A failing watcher logs and returns: the swap's own lock timeout still ends it."""
    try:
        while watch.spared is None:
            for blocker in await _blockers(conn, swap_pid):
                await _handle(conn, swap_pid, blocker, rules, watch)
            await asyncio.sleep(poll_s)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError, TimeoutError) as exc:
        log.warning("swap.watch_failed", swap_pid=swap_pid, error=str(exc) or type(exc).__name__)
    except Exception as exc:  # a bug: logged with its traceback; the swap's own lock timeout still ends it
        log.error("swap.watch_failed", swap_pid=swap_pid, error=str(exc) or type(exc).__name__, exc_info=exc)


async def _blockers(conn: asyncpg.Connection, swap_pid: int) -> list[Blocker]:
    rows = await conn.fetch(_BLOCKERS, swap_pid, timeout=_STATEMENT_TIMEOUT_S)
    return [
        Blocker(r["pid"], r["usename"], r["application_name"], r["query_start"], r["state"], r["query"]) for r in rows
    ]


async def _handle(
    conn: asyncpg.Connection, swap_pid: int, blocker: Blocker, rules: CancelRules, watch: BlockerWatch
) -> None:
    """Act on a blocker once per query (a pid and its query's start)."""
    if (blocker.pid, blocker.query_start) in watch._seen:
        return
    watch._seen.add((blocker.pid, blocker.query_start))
    action = decide(blocker, rules)
    fields = _fields(blocker)
    if action is Action.CANCEL:
        try:
            sent = await conn.fetchval(_CANCEL, blocker.pid, timeout=_STATEMENT_TIMEOUT_S)
        except asyncpg.InsufficientPrivilegeError as exc:  # another role's query, and no pg_signal_backend
            log.warning("swap.cancel_refused", swap_pid=swap_pid, error=str(exc), **fields)
            return
        if sent:
            watch.cancelled += 1
            log.warning("swap.blocker_cancelled", swap_pid=swap_pid, **fields)
    elif action is Action.SPARE:
        watch.spared = blocker
        log.warning("swap.blocker_spared", swap_pid=swap_pid, **fields)
        await conn.fetchval("SELECT pg_cancel_backend($1)", swap_pid, timeout=_STATEMENT_TIMEOUT_S)
    else:
        log.info("swap.blocker_awaited", swap_pid=swap_pid, **fields)


def _fields(blocker: Blocker) -> dict[str, object]:
    return {
        "pid": blocker.pid,
        "user": blocker.user,
        "application_name": blocker.application,
        "query_start": blocker.query_start.isoformat() if blocker.query_start else None,
        "state": blocker.state,
        "query": blocker.query,
    }
