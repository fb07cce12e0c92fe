"""The run history of every feeder of a sync goes through one shared connection, which cancellation never spoils."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from fedload.config import Config
from fedload.results import FeederRun, Outcome
from fedload.service.sync import sync_feeders
from fedload.superhub.bookkeeping.connection import Bookkeeping
from fedload.superhub.job import feeder_job, superhub_target
from fedload.superhub.pipeline import sync_feeder
from tests.support.federation import AGENT, Federation, prepare, write_script
from tests.support.mid_copy import mid_copy_agent, rows_in_flight_soon

_FEDLOAD_CONNECTIONS = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'fedload%' AND datname = current_database()"
)


def _with_parallel(config: Config, feeders: int) -> Config:
    return config.model_copy(update={"superhub": config.superhub.model_copy(update={"max_parallel_feeders": feeders})})


async def _peak_connections(federation: Federation, work: asyncio.Task[list[FeederRun]]) -> int:
    """The most fedload connections on the superhub at once while `work` runs (polled every 20 ms)."""
    conn = await asyncpg.connect(federation.cluster.dsn(federation.superhub))
    peak = 0
    try:
        while not work.done():
            peak = max(peak, await conn.fetchval(_FEDLOAD_CONNECTIONS))
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
    return peak


async def test_a_sync_holds_one_bookkeeping_connection(federation: Federation) -> None:
    """Three feeders synced together hold 3 load sessions and 1 history session, not 6; each run is recorded."""
    slow = write_script(federation.tmp / "slow.sh", f'sleep 2; exec {AGENT} "$@"\n')
    config = _with_parallel(federation.config(agent_command=[slow]), 3)

    work = asyncio.create_task(sync_feeders(config, list(config.feeders)))
    peak = await _peak_connections(federation, work)
    runs = await work
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 3, [r.error for r in runs]
    assert peak == 3 + 1
    recorded = federation.superhub_sql(
        "SELECT json_agg(json_build_object('feeder', feeder, 'outcome', outcome, 'error', error, 'rows', rows) "
        "ORDER BY feeder) FROM fedload.runs"
    )
    assert json.loads(recorded) == [
        {"feeder": r.feeder, "outcome": Outcome.SUCCESS, "error": None, "rows": r.rows} for r in runs
    ]


async def test_a_cancelled_run_leaves_the_shared_connection_usable(federation: Federation) -> None:
    """A run cancelled mid-load (its COPY has rows in flight) records its outcome; the next feeder's run records
    through the same connection."""
    slow = mid_copy_agent(federation)
    config = federation.config()

    await prepare(config)
    history = Bookkeeping()
    try:
        task = asyncio.create_task(
            sync_feeder(feeder_job(federation.config(agent_command=[slow]), "hub1"), history=history)
        )
        await rows_in_flight_soon(federation)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        run = await sync_feeder(feeder_job(config, "hub2"), history=history)
    finally:
        await history.close()
    assert run.outcome == Outcome.SUCCESS, run.error
    recorded = federation.superhub_sql(
        "SELECT string_agg(feeder || ':' || outcome || ':' || error, ',') FROM fedload.runs"
    )
    assert recorded.startswith("hub1:failed:the run was cancelled")
    assert Outcome(federation.superhub_sql("SELECT outcome FROM fedload.runs WHERE feeder = 'hub2'")) == Outcome.SUCCESS


async def test_a_write_cancelled_in_flight_ends_on_the_connection(federation: Federation) -> None:
    """Cancelling the caller of a write under way lets the write finish; the next write uses the same session."""
    config = federation.config()
    finished: list[int] = []

    async def slow(conn: asyncpg.Connection) -> int:
        await conn.execute("SELECT pg_sleep(0.5)")
        finished.append(conn.get_server_pid())
        return conn.get_server_pid()

    history = Bookkeeping()
    try:
        first = asyncio.create_task(history.write(superhub_target(config), slow))
        await asyncio.sleep(0.1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        pid: int = await history.write(superhub_target(config), lambda conn: conn.fetchval("SELECT pg_backend_pid()"))
    finally:
        await history.close()
    assert finished == [pid]  # the cancelled caller's write ran to its end, on the session the next write used
