"""A run starts its feeder's dump before its lock and record, so the agent's start overlaps the superhub's steps;
a run that ends before loading it (busy here) stops that dump."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from fedload.results import Outcome
from fedload.superhub import pipeline
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import sync_feeder
from fedload.superhub.session import feeder_lock
from tests.support.federation import AGENT, Federation, sync, write_script

HOLD_LOCK = "SELECT pg_advisory_lock(1717920876, hashtext('hub1')); SELECT pg_sleep(60) /* holding hub1 */;"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_a_busy_run_stops_the_dump_it_started_early(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another session holds hub1's run lock, a run of hub1 has started its agent (before the lock: the
    lock is tried once the agent runs, up to 20 s) and, finding the feeder busy, ends as busy with that agent
    stopped, not left running (it would sleep 30 s)."""
    await sync(federation.config(), "hub1")
    started = federation.tmp / "agent.pid"
    original = feeder_lock

    @contextlib.asynccontextmanager
    async def lock_once_the_agent_runs(conn: asyncpg.Connection, feeder: str) -> AsyncIterator[bool]:
        for _ in range(400):  # 20 s
            if started.exists():
                break
            await asyncio.sleep(0.05)
        async with original(conn, feeder) as locked:
            yield locked

    monkeypatch.setattr(pipeline, "feeder_lock", lock_once_the_agent_runs)
    agent = write_script(federation.tmp / "agent.sh", f'echo $$ > {started}\nsleep 30\nexec {AGENT} "$@"\n')
    psql = federation.cluster.install.tool("psql")
    dsn = federation.cluster.dsn(federation.superhub)
    holder = await asyncio.create_subprocess_exec(
        psql, "-X", "-q", dsn, "-c", HOLD_LOCK, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        deadline = time.monotonic() + 30
        while federation.superhub_int(held) == 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - polls the server
            await asyncio.sleep(0.05)
        run = await sync_feeder(feeder_job(federation.config(agent_command=[agent]), "hub1"))
        assert run.outcome == Outcome.BUSY, run.error
        assert started.exists()  # the agent was started before the lock was tried
        assert not _alive(int(started.read_text()))
    finally:
        federation.superhub_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%holding hub1%' "
            "AND pid <> pg_backend_pid()"
        )
        await asyncio.wait_for(holder.wait(), 30)
    assert (await sync(federation.config(), "hub1"))[0].outcome == Outcome.SUCCESS
