"""Feeder runs in worker processes (fedload.service.workers): the same data as in-process, one process per core, reused;
a worker that dies fails only its run; cancelling a run cancels it in its worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import asyncpg
import pytest
import structlog

from fedload.config import Config, SshConfig, parse_config
from fedload.errors import ConfigError
from fedload.results import Outcome
from fedload.service import workers
from fedload.service._pipe import Cancel, Cancelled, Crashed, Done, Run, frame
from fedload.service.sync import sync_feeders
from fedload.service.worker import PROCESS_NAME
from fedload.service.workers import CANCEL_WAIT_S, WorkerPool, _Worker, worker_modules
from fedload.superhub import kept_sessions
from fedload.superhub.bookkeeping.connection import Bookkeeping
from fedload.superhub.job import feeder_job, superhub_target
from fedload.transport.command import transport_modules
from tests.support.federation import (
    Federation,
    assert_feeders_equal_partitions,
    children_running,
    config_toml,
    end_process,
    prepare,
    staging_leftovers,
    sync,
    write_script,
)
from tests.support.mid_copy import feeder_rows, mid_copy_agent, rows_in_flight_soon

WAIT_S = 30.0


def worker_pids() -> list[int]:
    """This process's worker processes."""
    return children_running(os.getpid(), "fedload.service.worker")


def started_workers(logs: list[MutableMapping[str, Any]]) -> list[object]:
    return [e["pid"] for e in logs if e["event"] == "worker.started"]


def with_workers(fed: Federation, count: int, **overrides: object) -> Config:
    config = fed.config(**overrides)
    superhub = config.superhub.model_copy(update={"worker_processes": count})
    return config.model_copy(update={"superhub": superhub})


async def test_runs_in_workers_load_the_same_data_outside_the_main_process(federation: Federation) -> None:
    """Two workers run three feeders: the data is exact, the loading happens in the workers, not in this process."""
    with structlog.testing.capture_logs() as logs:
        runs = await sync_feeders(with_workers(federation, 2), ["hub1", "hub2", "hub3"])
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 3, [r.error for r in runs]
    assert runs[0].rows == {"public.contexts": 3000, "public.hosts": 300}
    assert_feeders_equal_partitions(federation)
    pids = started_workers(logs)
    assert len(set(pids)) == len(pids) == 2
    assert os.getpid() not in pids
    assert not [e for e in logs if e["event"] == "import.table_loaded"]  # logged by the workers, not here
    assert federation.superhub_int("SELECT count(*) FROM fedload.runs WHERE outcome = 'success'") == 3
    assert worker_pids() == []  # the pool is closed with the sync


async def test_one_worker_runs_every_feeder_in_turn(federation: Federation) -> None:
    """A worker is started once and reused: no interpreter start per run."""
    with structlog.testing.capture_logs() as logs:
        runs = await sync_feeders(with_workers(federation, 1), ["hub1", "hub2", "hub3"])
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 3, [r.error for r in runs]
    assert len(started_workers(logs)) == 1


async def test_no_workers_runs_in_process(federation: Federation) -> None:
    with structlog.testing.capture_logs() as logs:
        runs = await sync_feeders(with_workers(federation, 0), ["hub1"])
    assert runs[0].outcome == Outcome.SUCCESS, runs[0].error
    assert started_workers(logs) == []
    assert [e for e in logs if e["event"] == "import.table_loaded"]


async def wait_for(fed: Federation, sql: str, want: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while await asyncio.to_thread(fed.superhub_int, sql) != want:
        assert time.monotonic() < deadline, f"{sql} never gave {want}"
        await asyncio.sleep(0.1)


async def test_a_worker_killed_mid_load_fails_only_its_run(federation: Federation) -> None:
    """SIGKILL of the worker loading hub1, mid-COPY with rows in flight: hub1's run fails saying so, its old data
    and record stay right, hub2 in the other worker succeeds, and the next run of hub1 gets a new worker and
    succeeds."""
    config = federation.config()
    assert [r.outcome for r in await sync(config)] == [Outcome.SUCCESS] * 3
    before = feeder_rows(federation)
    slow = with_workers(federation, 2)
    slow.feeders["hub1"] = slow.feeders["hub1"].model_copy(update={"agent_command": [mid_copy_agent(federation)]})

    syncing = asyncio.create_task(sync_feeders(slow, ["hub1", "hub2"]))
    await wait_for(federation, "SELECT count(*) FROM fedload.runs WHERE outcome = 'success'", 4)  # hub2
    await rows_in_flight_soon(federation)
    (pid,) = [pid for pid in worker_pids() if children(pid)]  # hub1's: its agent hangs; hub2's is idle
    os.kill(pid, signal.SIGKILL)
    run, other = await asyncio.wait_for(syncing, WAIT_S)
    assert other.outcome == Outcome.SUCCESS, other.error
    assert run.outcome == Outcome.FAILED
    assert "the worker process" in (run.error or ""), run.error
    assert "killed by signal SIGKILL" in (run.error or ""), run.error
    assert feeder_rows(federation) == before
    assert staging_leftovers(federation) == 0
    last = federation.superhub_sql(
        "SELECT outcome || ': ' || error FROM fedload.runs WHERE feeder = 'hub1' ORDER BY id DESC LIMIT 1"
    )
    assert last.startswith("failed: the worker process"), last
    assert "SIGKILL" in last
    runs = await sync_feeders(with_workers(federation, 2), ["hub1", "hub2"])
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 2, [r.error for r in runs]
    assert_feeders_equal_partitions(federation, {"hub1": 1, "hub2": 2})


async def test_cancelling_a_run_cancels_it_in_its_worker(federation: Federation) -> None:
    """The caller's cancellation reaches the worker: the run's transaction rolls back, its record says
    cancelled, the worker survives for the next run."""
    assert [r.outcome for r in await sync(federation.config())] == [Outcome.SUCCESS] * 3
    before = feeder_rows(federation)
    slow = with_workers(federation, 1)
    slow.feeders["hub1"] = slow.feeders["hub1"].model_copy(update={"agent_command": [mid_copy_agent(federation)]})
    fast = with_workers(federation, 1)

    pool, history = WorkerPool(1), Bookkeeping()
    try:
        task = asyncio.create_task(pool.run(feeder_job(slow, "hub1"), history=history))
        await rows_in_flight_soon(federation)
        first = worker_pids()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_S)
        run = await pool.run(feeder_job(fast, "hub2"), history=history)
        after = worker_pids()
    finally:
        await pool.close()
        await history.close()
    assert run.outcome == Outcome.SUCCESS, run.error
    assert len(first) == 1
    assert first == after  # the same worker ran the next feeder
    assert feeder_rows(federation) == before
    assert staging_leftovers(federation) == 0
    outcome = federation.superhub_sql(
        "SELECT outcome || ': ' || error FROM fedload.runs WHERE feeder = 'hub1' ORDER BY id DESC LIMIT 1"
    )
    assert outcome == "failed: the run was cancelled", outcome


async def test_a_run_cancelled_before_it_starts_in_its_worker_is_still_answered(federation: Federation) -> None:
    """`Run` and `Cancel` read in one go, so that the run's task is cancelled before its first step: the worker
    still answers `Cancelled` at once (it used to answer nothing, and the parent waited CANCEL_WAIT_S to kill it,
    which made a daemon stopped just after a run began take over 30 s)."""
    worker = await _Worker.start()
    try:
        job = feeder_job(federation.config(), "hub1")
        run, cancel = frame(Run(job, False)), frame(Cancel())
        worker._writer.write(run + cancel)  # one write: the worker reads both before the run's task has a step
        answer = await asyncio.wait_for(worker.inbox.get(), 10)
        worker.send(Run(job, True))  # and it serves the next run (a dry one)
        while not isinstance(after := await asyncio.wait_for(worker.inbox.get(), WAIT_S), Done | Crashed):
            pass
    finally:
        await worker.close()
    assert answer == Cancelled()
    assert (after.result.outcome if isinstance(after, Done) else after) == Outcome.SUCCESS


async def test_a_run_cancelled_while_its_worker_starts_leaves_no_process(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that has not reported ready when its run is cancelled (SIGTERM during start-up) is killed."""
    never_ready = write_script(
        federation.tmp / "never-ready", f'exec {sys.executable} -c "import time; time.sleep(60)" "$@"\n'
    )
    monkeypatch.setattr(sys, "executable", never_ready)

    pool, history = WorkerPool(1), Bookkeeping()
    try:
        task = asyncio.create_task(pool.run(feeder_job(federation.config(), "hub1"), history=history))
        async with asyncio.timeout(WAIT_S):
            while not (starting := worker_pids()):  # noqa: ASYNC110 - a process appearing: nothing to await
                await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_S)
        after = worker_pids()
    finally:
        await pool.close()
        await history.close()
    assert len(starting) == 1
    assert after == []


def worker_argv(pid: int) -> list[str]:
    return (Path(f"/proc/{pid}") / "cmdline").read_bytes().decode().split("\0")


async def test_workers_started_ahead_serve_the_first_runs(federation: Federation) -> None:
    """`start_ahead` starts the pool's workers (never more than its size) with their preloaded modules before
    any run asks for one; the first runs use them and start no other."""
    config = with_workers(federation, 2)

    await prepare(config)
    with structlog.testing.capture_logs() as logs:
        pool, history = WorkerPool(2, preload=("fedload.transport.ssh",)), Bookkeeping()
        try:
            pool.start_ahead(5)
            async with asyncio.timeout(WAIT_S):
                while len(ahead := worker_pids()) < 2:  # noqa: ASYNC110 - processes appearing: nothing to await
                    await asyncio.sleep(0.01)
            assert all("fedload.transport.ssh" in worker_argv(pid) for pid in ahead)
            runs = await asyncio.gather(
                *(pool.run(feeder_job(config, n), history=history) for n in ("hub1", "hub2", "hub3"))
            )
        finally:
            await pool.close()
            await history.close()
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 3, [r.error for r in runs]
    assert sorted(started_workers(logs)) == sorted(ahead)  # type: ignore[type-var]
    assert worker_pids() == []


async def test_closing_a_pool_while_its_workers_start_ahead_leaves_no_process(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers started ahead that have not reported ready when the pool closes are killed, at once."""
    never_ready = write_script(
        federation.tmp / "never-ready", f'exec {sys.executable} -c "import time; time.sleep(60)" "$@"\n'
    )
    monkeypatch.setattr(sys, "executable", never_ready)

    pool = WorkerPool(2)
    pool.start_ahead(2)
    async with asyncio.timeout(WAIT_S):
        while len(starting := worker_pids()) < 2:  # noqa: ASYNC110 - processes appearing: nothing to await
            await asyncio.sleep(0.01)
    started = time.monotonic()
    await pool.close()
    closing_s = time.monotonic() - started
    assert len(starting) == 2
    assert worker_pids() == []
    assert closing_s < 10, closing_s


def test_workers_preload_the_ssh_transport_and_the_warm_agents_only_where_a_feeder_uses_them(
    federation: Federation,
) -> None:
    """asyncssh only where a feeder is reached over SSH; the warm agents' zygote (which a worker then starts at
    once) only where a local feeder runs fedload's own agent."""
    local = federation.config()
    assert transport_modules(local.feeders.values()) == ("fedload.transport.zygote",)
    ssh = SshConfig(host="feeder.example")
    all_ssh = {name: f.model_copy(update={"transport": "ssh", "ssh": ssh}) for name, f in local.feeders.items()}
    assert transport_modules(all_ssh.values()) == ("fedload.transport.ssh",)
    mixed = {**local.feeders, "hub1": all_ssh["hub1"]}
    assert transport_modules(mixed.values()) == ("fedload.transport.ssh", "fedload.transport.zygote")
    own_agents = {name: f.model_copy(update={"agent_command": ["/opt/agent"]}) for name, f in local.feeders.items()}
    assert transport_modules(own_agents.values()) == ()


def test_workers_preload_the_statistics_parser_only_where_a_feeder_may_carry_statistics(
    federation: Federation,
) -> None:
    """pglast (which reads the statistics a run carries) beside the transports, where a feeder's agent may send
    them: whether the superhub is on PostgreSQL 18 is not known before the workers fork."""
    local = federation.config()
    assert worker_modules(local.feeders.values()) == ("fedload.transport.zygote", "pglast")
    kept = {name: f.model_copy(update={"carry_statistics": False}) for name, f in local.feeders.items()}
    assert worker_modules(kept.values()) == ("fedload.transport.zygote",)
    no_agent = {name: f.model_copy(update={"agent": False}) for name, f in local.feeders.items()}
    assert worker_modules(no_agent.values()) == ()
    assert worker_modules({**kept, "hub1": local.feeders["hub1"]}.values()) == ("fedload.transport.zygote", "pglast")


def test_worker_processes_default_and_validation(federation: Federation) -> None:
    config = federation.config()
    assert config.superhub.workers == config.superhub.max_parallel_feeders
    raw = {"superhub": {"dsn": "postgresql://x/y", "tables": ["public.*"], "worker_processes": -1}, "feeders": {}}
    with pytest.raises(ConfigError, match="worker_processes"):
        parse_config(raw)


def forked_workers(parent: int) -> list[int]:
    """The workers that process `parent` forked (named fedload-worker)."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
        if fields.get("PPid") == str(parent) and fields.get("Name") == PROCESS_NAME.decode():
            pids.append(int(status.parent.name))
    return pids


def children(pid: int) -> list[str]:
    """The child processes of `pid`, but its warm agent process (a worker keeps that one between runs)."""
    return [child for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split() if not _zygote(child)]


def _zygote(pid: str) -> bool:
    try:
        return b"fedload.transport.zygote" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone already
        return False


def cli_config(fed: Federation, agent_command: str = "") -> Path:
    """A configuration file with two feeders at a time, two workers and debug logging (worker.* events)."""
    text = config_toml(fed, agent_command=agent_command).replace('log_level = "info"', 'log_level = "debug"')
    path = fed.tmp / "workers.toml"
    path.write_text(text.replace("[superhub]\n", "[superhub]\nmax_parallel_feeders = 2\nworker_processes = 2\n"))
    return path


def fedload_sync(config: Path, *feeders: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "fedload", "--log-format", "json", "sync", "--json", "--config", str(config)]
    return subprocess.Popen([*argv, *feeders], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_fedload_sync_forks_its_workers_instead_of_starting_interpreters(federation: Federation) -> None:
    """`fedload sync` forks its two workers before its event loop starts; they run every feeder, no worker and no
    local agent is started as a new interpreter (the agents are forked by the workers' warm processes), the data is
    exact."""
    with fedload_sync(cli_config(federation)) as sync_process:
        stdout, stderr = sync_process.communicate(timeout=120)
    assert sync_process.returncode == 0, stderr
    assert [run["outcome"] for run in json.loads(stdout)] == ["success"] * 3  # `sync --json`: a contract
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    (forked,) = [e["pids"] for e in events if e["event"] == "worker.forked"]
    assert len(forked) == 2
    assert sorted(e["pid"] for e in events if e["event"] == "worker.started") == sorted(forked)
    assert not [e for e in events if e["event"] == "worker.close_timeout"]  # each exits when its socket closes
    loaded_by = {e["feeder"] for e in events if e["event"] == "import.table_loaded"}
    assert loaded_by == {"hub1", "hub2", "hub3"}
    started = {e["pid"] for e in events if e["event"] == "superhub.session_started"}
    reused = [e["pid"] for e in events if e["event"] == "superhub.session_reused"]
    assert len(started) + len(reused) == 3  # three runs on two workers: one connection reused
    assert reused
    forked_agents = [e["pid"] for e in events if e["event"] == "transport.local_forked"]
    assert len(forked_agents) == 3  # each local agent forked by its worker's warm process, none started as a program
    assert not [e for e in events if e["event"] in ("transport.local_started", "transport.warm_agent_unavailable")]
    assert 1 <= len([e for e in events if e["event"] == "transport.zygote_started"]) <= 2  # one per worker at most
    assert set(reused) <= started
    assert_feeders_equal_partitions(federation)


async def test_a_forked_worker_killed_mid_load_fails_only_its_run(federation: Federation) -> None:
    """SIGKILL of the forked worker loading hub1: its run fails saying how the worker died, its old data and no
    staging table stay, hub2 succeeds in the other worker, and `fedload sync` exits 1."""
    assert [r.outcome for r in await sync(federation.config())] == [Outcome.SUCCESS] * 3
    before = feeder_rows(federation)
    hub1_running = "SELECT count(*) FROM fedload.runs WHERE feeder = 'hub1' AND outcome = 'running'"
    hub2_done = "SELECT count(*) FROM fedload.runs WHERE feeder = 'hub2' AND outcome = 'success'"
    with fedload_sync(cli_config(federation, mid_copy_agent(federation)), "hub1", "hub2") as sync_process:
        try:
            deadline = time.monotonic() + WAIT_S
            while federation.superhub_int(hub1_running) != 1 or federation.superhub_int(hub2_done) != 2:
                assert time.monotonic() < deadline, "hub1 never started, or hub2 never finished"
                await asyncio.sleep(0.1)
            await rows_in_flight_soon(federation)  # hub1's COPY has rows in flight
            workers = forked_workers(sync_process.pid)
            (hub1_worker,) = [pid for pid in workers if children(pid)]  # its agent hangs; hub2's worker is idle
            os.kill(hub1_worker, signal.SIGKILL)
            stdout, stderr = sync_process.communicate(timeout=WAIT_S)
        finally:
            sync_process.kill()
    runs = {run["feeder"]: run for run in json.loads(stdout)}
    assert sync_process.returncode == 1, stderr
    assert runs["hub2"]["outcome"] == "success", runs["hub2"]  # the JSON of `sync --json`: a contract, in its words
    assert runs["hub1"]["outcome"] == "failed"
    assert "killed by signal SIGKILL" in runs["hub1"]["error"], runs["hub1"]
    assert feeder_rows(federation) == before
    assert staging_leftovers(federation) == 0


async def test_ctrl_c_of_fedload_sync_cancels_the_runs_in_its_workers(federation: Federation) -> None:
    """Ctrl-C on a terminal (SIGINT to the whole process group, workers included) while hub1 loads: the workers
    leave it to the sync, which cancels the run; its record says cancelled, the old data stays, no traceback, no
    worker or agent left behind."""
    assert [r.outcome for r in await sync(federation.config())] == [Outcome.SUCCESS] * 3
    before = feeder_rows(federation)
    hub1_running = "SELECT count(*) FROM fedload.runs WHERE feeder = 'hub1' AND outcome = 'running'"
    config = cli_config(federation, mid_copy_agent(federation))
    argv = [sys.executable, "-m", "fedload", "sync", "--config", str(config), "hub1"]
    stderr_path = federation.tmp / "ctrl-c.stderr"
    with stderr_path.open("wb") as stderr_file:  # a file, not a pipe: a worker left behind holds no pipe of this loop
        sync_process = await asyncio.create_subprocess_exec(
            *argv, stdout=subprocess.DEVNULL, stderr=stderr_file, start_new_session=True
        )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while federation.superhub_int(hub1_running) != 1:
            assert time.monotonic() < deadline, "hub1 never started"
            await asyncio.sleep(0.1)
        await rows_in_flight_soon(federation)
        workers = forked_workers(sync_process.pid)
        os.killpg(sync_process.pid, signal.SIGINT)
        interrupted = time.monotonic()
        await asyncio.wait_for(sync_process.wait(), CANCEL_WAIT_S + 15)
        # before: the worker hung until the sync killed it, CANCEL_WAIT_S later (0.02-0.06 s with two CPU burners)
        assert time.monotonic() - interrupted < CANCEL_WAIT_S
        await _gone(stderr_path)  # workers, warm agent, agents: all that inherited the sync's stderr
    finally:
        await _end_everything(sync_process, stderr_path)
    stderr = stderr_path.read_text()
    assert "Traceback" not in stderr, stderr
    assert "sync.interrupted" in stderr, stderr
    assert sync_process.returncode != 0
    assert feeder_rows(federation) == before
    assert staging_leftovers(federation) == 0
    last = federation.superhub_sql("SELECT outcome || ': ' || error FROM fedload.runs ORDER BY id DESC LIMIT 1")
    assert last == "failed: the run was cancelled", last
    assert workers
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]  # noqa: ASYNC240 - /proc, no disk


def _holders(path: Path) -> list[int]:
    """The processes that have `path` open."""
    target = str(path)
    pids = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == target for fd in fd_dir.iterdir()):
                pids.append(int(fd_dir.parent.name))
        except OSError:
            continue
    return pids


async def _gone(inherited: Path, timeout_s: float = 10) -> None:
    """Wait until no process holds `inherited` open: every process a command started has ended with it."""
    deadline = time.monotonic() + timeout_s
    while held := _holders(inherited):
        assert time.monotonic() < deadline, f"left behind: {[_command_line(pid) for pid in held]}"
        await asyncio.sleep(0.1)


def _command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return str(pid)


async def _end_everything(process: asyncio.subprocess.Process, inherited: Path) -> None:
    """Kill `process`'s group and every process that holds `inherited` open (a warm agent in a session of its own
    too), then wait for `process`: a failed test leaves nothing behind."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in _holders(inherited):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    await end_process(process)


async def test_a_kept_superhub_session_is_reset_renamed_and_dropped_when_dead(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a process that keeps sessions, the next session gets the last clean one reset (settings, advisory locks)
    and renamed; one ended by the server is replaced; one whose block failed is closed, not kept."""
    monkeypatch.setattr(kept_sessions, "_keeper", None)
    config = federation.config()

    kept_sessions.keep_sessions()
    seen: dict[str, Any] = {}
    try:
        async with kept_sessions.reused_session(superhub_target(config), "hub1") as conn:
            seen["first"] = conn.get_server_pid()
            await conn.execute("SET lock_timeout = '7s'; SELECT pg_advisory_lock(7)")
        async with kept_sessions.reused_session(superhub_target(config), "hub2") as conn:
            seen["second"] = conn.get_server_pid()
            seen["name"] = await conn.fetchval("SELECT current_setting('application_name')")
            seen["lock_timeout"] = await conn.fetchval("SELECT current_setting('lock_timeout')")
            seen["locks"] = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            )
        await asyncio.to_thread(federation.superhub_sql, f"SELECT pg_terminate_backend({seen['second']})")
        async with kept_sessions.reused_session(superhub_target(config), "hub3") as conn:
            seen["third"] = conn.get_server_pid()
        with pytest.raises(RuntimeError):
            async with kept_sessions.reused_session(superhub_target(config), "hub1") as conn:
                raise RuntimeError
        seen["failed_closed"] = conn.is_closed()
        async with kept_sessions.reused_session(superhub_target(config), "hub1") as conn:
            seen["fourth"] = conn.get_server_pid()
    finally:
        await kept_sessions.close_kept()
    assert seen["second"] == seen["first"]
    assert seen["name"] == "fedload hub2"
    assert seen["lock_timeout"] == "0"
    assert seen["locks"] == 0
    assert seen["third"] != seen["second"]
    assert seen["failed_closed"]
    assert seen["fourth"] != seen["third"]


def test_forked_workers_of_a_sync_that_cannot_start_do_not_outlive_it(federation: Federation) -> None:
    """`fedload sync` whose superhub cannot be reached: the workers it forked, never used, exit with it, at once."""
    config = cli_config(federation)
    config.write_text(config.read_text().replace(f"host={federation.cluster.dir}", "host=/nonexistent"))
    started = time.monotonic()
    with fedload_sync(config) as sync_process:
        stdout, stderr = sync_process.communicate(timeout=60)
    assert sync_process.returncode == 1, stderr
    assert "cannot connect to the superhub" in json.loads(stdout)["error"]
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    (forked,) = [e["pids"] for e in events if e["event"] == "worker.forked"]
    assert len(forked) == 2
    assert not [pid for pid in forked if Path(f"/proc/{pid}").exists()]
    assert time.monotonic() - started < 15


REAP_UNUSED = """
import json, time
from fedload.service.workers import fork_workers, reap_forked
forked = fork_workers(2)
pids = [process.pid for process, _ in forked]
started = time.monotonic()
reap_forked(forked)
print(json.dumps([pids, [process.returncode for process, _ in forked], time.monotonic() - started]))
"""


def test_forked_workers_that_no_pool_took_exit_when_reaped() -> None:
    """Workers forked but never taken by a pool exit by themselves as soon as `reap_forked` closes their sockets:
    status 0, not killed after the 5 s wait, and reaped (no zombie left)."""
    argv = [sys.executable, "-c", REAP_UNUSED]
    result = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    pids, statuses, seconds = json.loads(result.stdout.splitlines()[-1])  # after structlog's default output
    assert len(pids) == 2
    assert statuses == [0, 0]
    assert seconds < 3
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]


async def test_a_kept_session_whose_reset_fails_in_any_way_is_replaced(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept connection that the server ended while it was idle can fail its reset with asyncpg's
    InternalClientError (a protocol state, seen in CI), not only with a connection error: the next session still
    gets a working connection, a new one. The race cannot be forced, so the reset is made to fail that way."""
    monkeypatch.setattr(kept_sessions, "_keeper", None)
    config = federation.config()

    async def broken_reset(*_args: object, **_kwargs: object) -> None:
        raise asyncpg.InternalClientError("cannot switch to state 15; another operation (2) is in progress")

    kept_sessions.keep_sessions()
    try:
        async with kept_sessions.reused_session(superhub_target(config), "hub1") as conn:
            first = conn.get_server_pid()
        with monkeypatch.context() as patched:
            patched.setattr(asyncpg.Connection, "reset", broken_reset)
            async with kept_sessions.reused_session(superhub_target(config), "hub2") as conn:
                second, answer = conn.get_server_pid(), await conn.fetchval("SELECT 42")
    finally:
        await kept_sessions.close_kept()
    assert second != first
    assert answer == 42


_CTRL_C_WHILE_A_WORKER_STARTS = """
import asyncio, os, signal
signal.signal(signal.SIGINT, lambda *_: None)
from fedload.service._pipe import Cancel, Cancelled, Crashed, Done, Run, frame
from fedload.service import workers
from fedload.service.workers import WorkerPool, _Worker

async def main() -> None:
    pool = WorkerPool(1)
    pool.start_ahead(1)
    await asyncio.sleep(0.05)  # the worker is importing fedload, before it could install any handler
    os.killpg(0, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground process group
    await asyncio.sleep(1.5)
    await pool.close()

asyncio.run(main())
"""


def test_ctrl_c_while_a_started_worker_imports_prints_no_traceback() -> None:
    """Ctrl-C while a started worker is still importing: it is the parent's to handle; the worker, in a process
    group of its own, prints no KeyboardInterrupt traceback."""
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_WHILE_A_WORKER_STARTS],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "KeyboardInterrupt" not in done.stderr


def process_gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie counts as ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


async def cancel_a_stopped_worker(fed: Federation, monkeypatch: pytest.MonkeyPatch) -> tuple[float, bool, list[Any]]:
    """CANCEL_WAIT_S = 2; hub1 mid-COPY in a worker, which is then SIGSTOPped (it cannot answer), and the run
    cancelled: the seconds until the cancel returned, whether the worker had ended then, the log events."""
    monkeypatch.setattr(workers, "CANCEL_WAIT_S", 2.0)
    slow = with_workers(fed, 1)
    slow.feeders["hub1"] = slow.feeders["hub1"].model_copy(update={"agent_command": [mid_copy_agent(fed)]})

    with structlog.testing.capture_logs() as logs:
        pool, history, pid = WorkerPool(1), Bookkeeping(), 0
        try:
            task = asyncio.create_task(pool.run(feeder_job(slow, "hub1"), history=history))
            await rows_in_flight_soon(fed)
            (pid,) = worker_pids()
            os.kill(pid, signal.SIGSTOP)
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, WAIT_S)
            seconds, gone = time.monotonic() - started, process_gone(pid)
        finally:
            if pid and not process_gone(pid):
                os.kill(pid, signal.SIGKILL)  # left by a sabotaged kill: the pool must not wait for it
            await pool.close()
            await history.close()
    return seconds, gone, logs


def assert_killed_after_the_wait(seconds: float, gone: bool, logs: list[Any]) -> None:
    """The unanswered cancel ended with the worker killed once CANCEL_WAIT_S (2 s) had passed, not before."""
    assert gone, "the worker was still there when the cancel returned"
    assert [e["waited_s"] for e in logs if e["event"] == "worker.killed"] == [2.0]
    assert 2.0 <= seconds < 2.0 + 10.0, seconds


async def test_a_worker_that_does_not_answer_a_cancel_is_killed_after_the_wait(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that cannot answer a cancel (stopped) is killed CANCEL_WAIT_S after it (made 2 s here; 30 s in
    fedload): measured; its run's transaction ends with its session: old data kept, no staging left."""
    assert (await sync(federation.config(), "hub1"))[0].outcome == Outcome.SUCCESS
    before = feeder_rows(federation)
    seconds, gone, logs = await cancel_a_stopped_worker(federation, monkeypatch)
    assert_killed_after_the_wait(seconds, gone, logs)
    assert feeder_rows(federation) == before
    deadline = time.monotonic() + WAIT_S
    while staging_leftovers(federation) != 0:  # the killed worker's session ends when the server notices
        assert time.monotonic() < deadline, "staging left by the killed worker"
        await asyncio.sleep(0.1)


async def test_negative_control_a_worker_left_alive_after_the_wait_is_seen(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control of the kill after an unanswered cancel: with the kill sabotaged (a no-op), the check of
    the worker's end fails."""

    async def spared(self: Any) -> None:
        return None

    monkeypatch.setattr(_Worker, "kill", spared)
    assert (await sync(federation.config(), "hub1"))[0].outcome == Outcome.SUCCESS
    seconds, gone, logs = await cancel_a_stopped_worker(federation, monkeypatch)
    with pytest.raises(AssertionError):
        assert_killed_after_the_wait(seconds, gone, logs)


def test_a_feeder_runs_on_the_idle_worker_that_ran_it_last() -> None:
    """The pool gives a feeder's run to the idle worker that ran the feeder most recently (its SSH connection is
    kept there), else to the worker idle the shortest, as before."""

    def idle(*recent: list[str]) -> list[_Worker]:
        return [cast(_Worker, SimpleNamespace(recent=r)) for r in recent]

    assert workers._affine(idle(["hub1", "hub2"], ["hub3"], ["hub4"]), "hub1") == 0
    assert workers._affine(idle(["hub1", "hub2"], ["hub2", "hub1"], ["hub4"]), "hub1") == 1
    assert workers._affine(idle(["hub1"], ["hub2"]), "hub5") == -1
    assert workers._affine([], "hub1") == -1
