"""No run can hang: an exception fedload does not expect, at any stage of one feeder's run, in a forked worker or
in the sync's own process, ends that run as failed (recorded, with its kind, its traceback logged once), leaves
the feeder's old data and no staging, and the other feeders succeed; a worker that stops answering is killed
after its bound and replaced; the daemon goes on running the feeder."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from fedload.errors import SuperhubError
from fedload.results import Outcome
from fedload.service import workers
from fedload.service.workers import WorkerPool
from fedload.superhub import kept_sessions
from fedload.superhub.bookkeeping.connection import Bookkeeping
from fedload.superhub.job import feeder_job, superhub_target
from fedload.superhub.kept_sessions import reused_session
from tests.support.fault_injection import Fault, fault_environment
from tests.support.federation import (
    AGENT,
    HOST_COLS,
    DaemonProcess,
    Federation,
    children_running,
    config_toml,
    prepare,
    psql_int,
    staging_leftovers,
    sync,
    write_script,
)

# (stage, the exception raised there, the run's error kind, words of its error)
CASES = [
    ("connect", "InternalClientError", "superhub", "the superhub driver failed (InternalClientError)"),
    ("load", "InternalClientError", "superhub", "another operation is in progress"),
    ("swap", "RuntimeError", "internal", "internal error: RuntimeError: injected fault at swap"),
    ("analyze", "RuntimeError", "internal", "internal error: RuntimeError: injected fault at analyze"),
    ("history", "RuntimeError", "internal", "internal error: RuntimeError: injected fault at history"),
]


def cli_config(fed: Federation, workers: int) -> Path:
    """Two feeders at a time, `workers` worker processes (forked by `fedload sync`; 0: in its own process)."""
    settings = f"[superhub]\nmax_parallel_feeders = 2\nworker_processes = {workers}\n"
    text = config_toml(fed).replace("[superhub]\n", settings)
    path = fed.tmp / f"no_hang_{workers}.toml"
    path.write_text(text)
    return path


def events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def last_run(fed: Federation, feeder: str) -> tuple[Outcome, str, str]:
    """The outcome, error kind and error of `feeder`'s last recorded run."""
    row = fed.superhub_sql(
        f"SELECT concat_ws('|', outcome, error_kind, error) FROM fedload.runs WHERE feeder = '{feeder}' "
        "ORDER BY id DESC LIMIT 1"
    )
    outcome, kind, error = ([*row.split("|", 2), "", ""])[:3]
    return Outcome(outcome), kind, error


@pytest.mark.parametrize("workers_count", [2, 0], ids=["forked-workers", "in-process"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_an_unexpected_exception_fails_only_its_run(
    federation: Federation, workers_count: int, case: tuple[str, str, str, str]
) -> None:
    """`fedload sync --json` with the fault in hub1's run: it ends within seconds, exit 1, JSON on stdout; hub1
    failed with its kind and the error, recorded; its old data and no staging left; hub2 and hub3 succeed."""
    stage, error, kind, words = case
    assert [r.outcome for r in await sync(federation.config())] == [Outcome.SUCCESS] * 3
    before = federation.digest(federation.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1")
    federation.cluster.psql("INSERT INTO hosts (hostkey) VALUES ('new')", dbname=federation.feeders["hub1"])
    env = fault_environment(Fault(stage, "hub1", error), federation.tmp)
    argv = [sys.executable, "-m", "fedload", "--log-format", "json", "sync", "--json"]
    started = time.monotonic()
    done = await asyncio.to_thread(
        subprocess.run,
        [*argv, "--config", str(cli_config(federation, workers_count))],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert time.monotonic() - started < 60
    assert done.returncode == 1, done.stderr[-3000:]
    runs = {run["feeder"]: run for run in json.loads(done.stdout)}
    outcomes = [runs[f]["outcome"] for f in ("hub1", "hub2", "hub3")]
    assert outcomes == ["failed", "success", "success"]  # the JSON of `sync --json`: a contract, in its own words
    assert runs["hub1"]["error_kind"] == kind
    assert words in runs["hub1"]["error"], runs["hub1"]["error"]
    assert "Traceback" not in done.stdout
    if kind == "internal":  # the traceback logged once, as an error event with the exception
        logged = [e for e in events(done.stderr) if e["level"] == "error" and "Traceback" in str(e.get("exception"))]
        assert len(logged) == 1, [e["event"] for e in logged]
    assert staging_leftovers(federation) == 0
    after = federation.digest(federation.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1")
    if stage == "analyze":  # after the commit: the new data is in, the run still says it failed
        assert after != before
        assert "the new data had been swapped in before" in runs["hub1"]["error"]
    else:
        assert after == before
    if stage in ("connect", "history"):  # before the run's record could be started: none is left running
        assert federation.superhub_int("SELECT count(*) FROM fedload.runs WHERE outcome = 'running'") == 0
    else:
        assert last_run(federation, "hub1")[:2] == (Outcome.FAILED, kind)
        assert words in last_run(federation, "hub1")[2]


async def test_a_driver_client_error_discards_the_session_it_happened_on(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncpg's InternalClientError inside a kept session reads as a superhub failure, and that connection is
    closed, never kept for the next run."""
    monkeypatch.setattr(kept_sessions, "_keeper", None)
    config = federation.config()

    used: list[asyncpg.Connection] = []

    async def session_failing_inside() -> None:
        async with reused_session(superhub_target(config), "hub1") as conn:
            used.append(conn)
            raise asyncpg.InternalClientError("cannot perform operation: another operation is in progress")

    kept_sessions.keep_sessions()
    with pytest.raises(SuperhubError, match="InternalClientError"):
        await session_failing_inside()
    (conn,) = used
    await asyncio.sleep(0.1)
    assert kept_sessions._keeper is not None
    kept = kept_sessions._keeper.conn
    await kept_sessions.close_kept()
    assert conn.is_closed()
    assert kept is None


async def test_a_worker_that_stops_answering_is_failed_killed_and_replaced(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP of the worker loading hub1: past run_timeout_s plus the margin the run fails ("went silent"), the
    worker is killed, the record says failed, no staging stays, and the pool's next run gets a new worker."""
    monkeypatch.setattr(workers, "SILENT_MARGIN_S", 2.0)
    config = federation.config()
    config = config.model_copy(
        update={"superhub": config.superhub.model_copy(update={"worker_processes": 1, "run_timeout_s": 4.0})}
    )
    hanging = write_script(federation.tmp / "hang.sh", f'{AGENT} "$@" > {federation.tmp}/h.bin\nsleep 60\n')
    stuck = config.model_copy(deep=True)
    stuck.feeders["hub1"] = stuck.feeders["hub1"].model_copy(update={"agent_command": [hanging]})

    await prepare(config)
    history, pool = Bookkeeping(), WorkerPool(1)
    try:
        running = asyncio.create_task(pool.run(feeder_job(stuck, "hub1"), history=history))
        pid = await _worker_when_running(federation)
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        silent = await asyncio.wait_for(running, 30)
        waited = time.monotonic() - started
        assert _state(pid) in ("gone", "Z")
        again = await asyncio.wait_for(pool.run(feeder_job(config, "hub1"), history=history), 60)
    finally:
        await pool.close()
        await history.close()
    assert silent.outcome == Outcome.FAILED
    assert silent.error_kind == "internal"
    assert "went silent" in (silent.error or ""), silent.error
    assert waited < 10
    assert again.outcome == Outcome.SUCCESS, again.error
    assert last_run(federation, "hub1")[0] == Outcome.SUCCESS
    failed = federation.superhub_sql("SELECT error FROM fedload.runs WHERE feeder = 'hub1' ORDER BY id DESC OFFSET 1")
    assert f"(pid {pid})" in failed
    assert "went silent" in failed
    _wait_until(lambda: staging_leftovers(federation) == 0)


async def _worker_when_running(fed: Federation) -> int:
    """The pid of this process's one worker, once its run is recorded as running."""
    deadline = time.monotonic() + 30
    running = "SELECT count(*) FROM fedload.runs WHERE outcome = 'running'"
    while await asyncio.to_thread(fed.superhub_int, running) != 1:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    (pid,) = children_running(os.getpid(), "fedload.service.worker")
    return pid


def _state(pid: int) -> str:
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("State:"))
    except (OSError, StopIteration):
        return "gone"
    return line.split()[1]


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_daemon_goes_on_running_a_feeder_whose_runs_crash(
    federation: Federation, start_daemon: Callable[..., DaemonProcess]
) -> None:
    """A daemon whose worker processes raise RuntimeError in hub1's swap: hub1 fails again and again, each run
    recorded as an internal error, while hub2 and hub3 keep succeeding and the daemon keeps running."""
    env = fault_environment(Fault("swap", "hub1", "RuntimeError"), federation.tmp)
    daemon = start_daemon(config_toml(federation, interval_s=0.5), env)

    def counts() -> dict[str, int]:
        rows = federation.superhub_sql(
            "SELECT string_agg(feeder || '=' || outcome || '/' || coalesce(error_kind, ''), ',') FROM fedload.runs"
        )
        tally: dict[str, int] = {}
        for item in filter(None, rows.split(",")):
            tally[item] = tally.get(item, 0) + 1
        return tally

    def enough() -> bool:
        if federation.superhub_bool("SELECT to_regclass('fedload.runs') IS NULL"):
            return False
        tally = counts()
        ok = ("hub2=success/", "hub3=success/")
        return tally.get("hub1=failed/internal", 0) >= 2 and all(tally.get(k, 0) >= 2 for k in ok)

    daemon.wait_for("hub1 to fail twice while hub2 and hub3 succeed", enough, timeout_s=90)
    assert daemon.process.poll() is None
    assert "hub1=success/" not in counts()
    assert daemon.stop() == 0
    failed = [e for e in daemon.events() if e["event"] == "daemon.feeder_failed" and e["feeder"] == "hub1"]
    assert failed
    assert failed[0]["error_kind"] == "internal"


@pytest.mark.parametrize(("mode", "program"), [("copy", "pg_dump"), ("binary", "psql")])
def test_the_agent_kills_pg_dump_when_its_reader_goes_away(federation: Federation, mode: str, program: str) -> None:
    """pg_dump (binary mode: the snapshot session's psql) waiting for a lock on the feeder sends nothing; when the
    superhub gives up and closes the stream, the agent kills it at once instead of leaving it (and its snapshot)
    behind until the lock is released."""
    feeder = federation.feeders["hub1"]
    pg_dump = federation.cluster.install.tool("pg_dump")
    argv = [*AGENT.split(), "agent", "dump", "--database", federation.cluster.conninfo(feeder)]
    argv += ["--table", "public.hosts", "--pg-dump", pg_dump, f"--mode={mode}"]
    argv += ['--columns={"schema": "public", "name": "hosts", "columns": null}'] if mode == "binary" else []
    waiting = f"SELECT count(*) FROM pg_stat_activity WHERE application_name = '{program}' AND wait_event_type = 'Lock'"

    hold = "BEGIN; LOCK TABLE hosts IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(120) /* lock holder */;"
    psql = federation.cluster.install.tool("psql")
    holder = subprocess.Popen([psql, "-X", "-q", federation.cluster.dsn(feeder), "-c", hold], stdout=subprocess.DEVNULL)
    try:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as agent:
            _wait_until(lambda: psql_int(federation.cluster, waiting, feeder) == 1)
            (pg_dump_pid,) = children_running(agent.pid, program)
            assert agent.stdout is not None
            agent.stdout.close()  # the superhub's end of the stream goes away
            _wait_until(lambda: _state(pg_dump_pid) in ("gone", "Z"), timeout_s=10)
            assert agent.wait(timeout=10) != 0
    finally:
        federation.cluster.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%lock holder%' "
            "AND pid <> pg_backend_pid()",
            feeder,
        )
        holder.wait(timeout=30)


async def test_a_run_whose_parent_side_fails_never_hands_its_worker_to_the_next_run(federation: Federation) -> None:
    """The parent's side of a worker's run raises (a progress display with a bug): the worker, whose run may still
    be going, is killed, so the pool's next run gets a new worker and its own result, not the old run's."""
    config = federation.config()
    config = config.model_copy(update={"superhub": config.superhub.model_copy(update={"worker_processes": 1})})

    def broken_display(_: object) -> None:
        raise RuntimeError("a bug in the display")

    await prepare(config)
    history, pool = Bookkeeping(), WorkerPool(1)
    try:
        with pytest.raises(RuntimeError, match="a bug in the display"):
            await asyncio.wait_for(pool.run(feeder_job(config, "hub1"), history=history, progress=broken_display), 60)
        first = children_running(os.getpid(), "fedload.service.worker")
        run = await asyncio.wait_for(pool.run(feeder_job(config, "hub2"), history=history), 60)
        workers_seen = [*first, *children_running(os.getpid(), "fedload.service.worker")]
    finally:
        await pool.close()
        await history.close()
    assert run.feeder == "hub2"
    assert run.outcome == Outcome.SUCCESS, run.error
    assert len(workers_seen) == 1  # the first worker was gone before the second run started one
