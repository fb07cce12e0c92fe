"""`fedload feeder move NAME --to SHARD` (docs/scale-out.md): the feeder loads on its new shard, the coordinator
switches in one transaction, the old shard drops it; a reader of the coordinator sees it once at every moment, and
a move that stops part-way leaves it served from one shard, finished by running it again."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import fedload.commands.move as move_module
from fedload.commands.admin import remove_feeder
from fedload.commands.move import MoveError, move_feeder
from fedload.commands.status import read_status
from fedload.config import Config, load_config, parse_config
from fedload.errors import ConfigError, ErrorKind, FedloadError, SuperhubError
from fedload.results import FeederRun
from fedload.scaleout.coordinator import build_coordinator, moving_feeders
from fedload.service.sync import sync_feeders
from fedload.superhub.bookkeeping import try_feeder_lock
from fedload.superhub.job import Job
from fedload.superhub.pipeline import sync_feeder
from fedload.superhub.removal import drop_feeder
from tests.support.federation import DaemonProcess, Federation, fedload, sync
from tests.support.shards import (
    COUNTS,
    config_file,
    coord_int,
    coord_sql,
    shard_int,
    shard_sql,
    sharded_toml,
    with_coordinator,
)

LAYOUT = {"s1": ["hub1", "hub2"], "s2": ["hub3"]}
BEFORE, AFTER = "1:300,2:200,3:100", "1:300,2:201,3:100"  # hub2 gains a host before each move
FILTERED = "SELECT count(*) FROM pg_foreign_table WHERE array_to_string(ftoptions, ',') LIKE '%fedload_export%'"
VIEWS = "SELECT count(*) FROM pg_views WHERE schemaname = 'fedload_export'"
AGAIN = 'run "fedload feeder move hub2 --to s2" again'  # what a stopped move of hub2 says to run


async def _moved_setup(federation: Federation, *, superhub: str = "") -> tuple[Config, Path]:
    """hub1, hub2 on s1 and hub3 on s2, synced, with a coordinator; hub2's feeder then gains a host, so that what
    the coordinator reads of hub2 tells which shard it comes from. The configuration and its file."""
    config = with_coordinator(federation, LAYOUT)
    assert all(run.succeeded for run in await sync(config))
    federation.cluster.psql("INSERT INTO hosts (hostkey) VALUES ('moved')", dbname=federation.feeders["hub2"])
    path = sharded_toml(federation, config)
    if superhub:
        path.write_text(path.read_text().replace("[superhub]\n", f"[superhub]\n{superhub}\n", 1))
    return load_config(path), path


async def _read_while(config: Config, work: Awaitable[Any]) -> tuple[Any, list[str]]:
    """`work`'s result, and what a reader of the coordinator saw, query after query, while it ran."""
    assert config.coordinator is not None
    conn = await asyncpg.connect(config.coordinator.dsn)
    seen: list[str] = []
    done = asyncio.Event()

    async def read() -> None:
        while not done.is_set():
            seen.append(await conn.fetchval(COUNTS.format(table="hosts")))

    reader = asyncio.create_task(read())
    try:
        return await work, seen
    finally:
        done.set()
        await reader
        await conn.close()


async def test_a_feeder_moved_while_readers_run(federation: Federation) -> None:
    """`fedload feeder move hub2 --to s2` (the command, in its own process): every query of a reader through the
    coordinator sees hub2 once, with its rows from s1 and then from s2; afterwards the configuration file names
    s2, s1 holds nothing of hub2 (and refuses it), and the coordinator reads both shards directly again."""
    config, path = await _moved_setup(federation)
    before = path.read_text()

    async def move() -> tuple[int, str]:
        command = [sys.executable, "-m", "fedload", "feeder", "move", "hub2", "--to", "s2", "--config", str(path)]
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output, _ = await asyncio.wait_for(process.communicate(), 120)
        return process.returncode or 0, output.decode()

    (code, output), seen = await _read_while(config, move())
    assert code == 0, output
    assert [line for line in output.splitlines() if line.startswith("feeder hub2: ")] == [
        "feeder hub2: 1/6 coordinator: reads it from where it is, and shard s2 through a filter",
        "feeder hub2: 2/6 loading on shard s2",
        "feeder hub2: 3/6 coordinator: reads it from shard s2",
        "feeder hub2: 4/6 dropped from shard s1: 2 partitions, 2,200 rows, 1 recorded run",
        f"feeder hub2: 5/6 {path} names shard s2",
        "feeder hub2: 6/6 coordinator: reads the shards directly again",
        "feeder hub2: moved to shard s2 (2,201 rows loaded there)",
    ]
    odd = [value for value in seen if value not in (BEFORE, AFTER)]
    assert (odd, len(seen) > 20, seen[0], seen[-1]) == ([], True, BEFORE, AFTER), (odd[:5], len(seen))
    assert path.read_text() == before.replace('[feeders.hub2]\nshard = "s1"', '[feeders.hub2]\nshard = "s2"')
    assert load_config(path).feeders["hub2"].shard == "s2"
    assert shard_sql(federation, "s1", COUNTS.format(table="hosts")) == "1:300"
    assert shard_sql(federation, "s2", COUNTS.format(table="contexts")) == "2:2000,3:1000"
    assert shard_sql(federation, "s1", "SELECT feeder || '>' || to_shard FROM fedload.moved") == "hub2>s2"
    assert shard_int(federation, "s2", "SELECT count(*) FROM fedload.runs WHERE feeder = 'hub2'") == 1
    views = [shard_sql(federation, shard, VIEWS) for shard in ("s1", "s2")]
    assert (coord_sql(federation, FILTERED), views) == ("0", ["0", "0"])
    plan = coord_sql(federation, "EXPLAIN (VERBOSE) SELECT hub_id, count(*) FROM hosts GROUP BY hub_id")
    assert plan.count("Async Foreign Scan") == 2, plan
    again = fedload("feeder", "move", "hub2", "--to", "s2", "--config", str(path), timeout_s=120)
    assert (again.returncode, again.stdout) == (0, "feeder hub2 is on shard s2 already\n")


async def test_a_daemon_with_the_old_configuration_is_refused_on_the_old_shard(federation: Federation) -> None:
    """After the move, a sync that still has hub2 on s1 fails hub2 with a configuration error naming the move
    and loads nothing there; its coordinator build still reads hub2 from s2, which holds it."""
    stale, path = await _moved_setup(federation)
    assert await asyncio.to_thread(move_feeder, load_config(path), path, "hub2", "s2") == 0
    runs = {run.feeder: run for run in await sync(stale)}
    assert [runs["hub1"].succeeded, runs["hub3"].succeeded, runs["hub2"].error_kind] == [True, True, ErrorKind.CONFIG]
    assert "feeder hub2 moved to shard s2 at " in (runs["hub2"].error or ""), runs["hub2"].error
    assert shard_sql(federation, "s1", COUNTS.format(table="hosts")) == "1:300"
    assert coord_sql(federation, COUNTS.format(table="hosts")) == AFTER


async def test_a_failed_load_leaves_the_feeder_served_from_its_old_shard(federation: Federation) -> None:
    """hub2's feeder refuses connections: the move stops at the load, exit 1 with one line saying hub2 is still
    served from s1; the configuration file and s1 are unchanged. Once the feeder is back, the move goes through."""
    config, path = await _moved_setup(federation)
    before = path.read_text()
    database = federation.feeders["hub2"]
    federation.cluster.psql(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
    try:
        moved = fedload("feeder", "move", "hub2", "--to", "s2", "--config", str(path), timeout_s=120)
    finally:
        federation.cluster.psql(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")
    error = [line for line in moved.stderr.splitlines() if line.startswith("fedload:")]
    assert (moved.returncode, len(error)) == (1, 1), moved.stderr
    assert error[0].startswith("fedload: error: feeder hub2: the load on shard s2 failed ("), error
    assert error[0].endswith(f"; it is still served from shard s1: {AGAIN} to finish"), error
    assert path.read_text() == before
    assert coord_sql(federation, COUNTS.format(table="hosts")) == BEFORE
    assert shard_sql(federation, "s1", COUNTS.format(table="hosts")) == "1:300,2:200"
    assert await asyncio.to_thread(move_feeder, config, path, "hub2", "s2") == 0
    assert coord_sql(federation, COUNTS.format(table="hosts")) == AFTER


async def test_a_report_holding_the_coordinator_stops_the_switch(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report through the coordinator begins while hub2 loads on s2 and holds it past swap_max_wait_s: the
    switch fails and says hub2 is loaded on s2 but served from s1, which the reader keeps seeing (never twice);
    after the report the move, run again, finishes."""
    config, path = await _moved_setup(federation, superhub="swap_max_wait_s = 1.0")
    assert config.coordinator is not None
    report: list[asyncpg.Connection] = []

    async def begin_report() -> None:
        assert config.coordinator is not None
        conn = await asyncpg.connect(config.coordinator.dsn)
        await conn.execute("BEGIN; SELECT count(*) FROM hosts")  # holds ACCESS SHARE until it ends
        report.append(conn)

    async def move_stopped_by_the_report() -> str:
        here = asyncio.get_running_loop()

        async def load_then_report(job: Job) -> FeederRun:
            run = await sync_feeder(job)
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(begin_report(), here))
            return run

        monkeypatch.setattr(move_module, "sync_feeder", load_then_report)
        try:
            with pytest.raises(MoveError) as stopped:
                await asyncio.to_thread(move_feeder, config, path, "hub2", "s2")
            return str(stopped.value)
        finally:
            monkeypatch.setattr(move_module, "sync_feeder", sync_feeder)
            for conn in report:
                await conn.close()

    stopped, seen = await _read_while(config, move_stopped_by_the_report())
    assert stopped.startswith("feeder hub2: the coordinator's build failed (the coordinator's reports held"), stopped
    assert stopped.endswith(f"it is loaded there but still served from shard s1: {AGAIN} to finish"), stopped
    assert set(seen) == {BEFORE}, set(seen)
    assert load_config(path).feeders["hub2"].shard == "s1"
    assert shard_sql(federation, "s2", COUNTS.format(table="hosts")) == "2:201,3:100"  # loaded, filtered out
    assert await asyncio.to_thread(move_feeder, config, path, "hub2", "s2") == 0
    assert coord_sql(federation, COUNTS.format(table="hosts")) == AFTER


async def test_a_configuration_that_cannot_be_written_leaves_the_feeder_served_from_the_new_shard(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file cannot be written (as root here no file is unwritable, so the write fails by a patch): the move
    stops after the drop on s1, saying hub2 is served from s2 and what to do; a coordinator built from the old
    configuration reads hub2 from s2, the only shard holding it; the move run again finishes."""
    config, path = await _moved_setup(federation)

    def unwritable(*_: Any) -> list[str]:
        raise ConfigError(f"{path}: cannot write it: Read-only file system")

    monkeypatch.setattr(move_module, "set_feeder_shard", unwritable)
    with pytest.raises(MoveError) as stopped:
        await asyncio.to_thread(move_feeder, config, path, "hub2", "s2")
    assert str(stopped.value) == (
        f"feeder hub2 is served from shard s2 and gone from s1, but {path}: cannot write it: Read-only file system; "
        'set feeders.hub2.shard = "s2" there by hand, or run the move again'
    )
    assert coord_sql(federation, COUNTS.format(table="hosts")) == AFTER
    assert shard_sql(federation, "s1", COUNTS.format(table="hosts")) == "1:300"
    runs = await sync_feeders(config, ["hub1"])  # the old configuration's build: only s2 holds hub2
    assert runs[0].succeeded
    assert coord_sql(federation, COUNTS.format(table="hosts")) == AFTER
    monkeypatch.undo()
    assert await asyncio.to_thread(move_feeder, load_config(path), path, "hub2", "s2") == 0
    _assert_moved(federation, path)


async def test_moving_the_last_feeder_off_a_shard_removes_the_shard_from_the_configuration(
    federation: Federation, capsys: pytest.CaptureFixture[str]
) -> None:
    """hub3, s2's only feeder, moved to s1: the file loses [shards.s2] (a configuration names no unused shard),
    the coordinator no longer reads s2, and every feeder is read once from s1."""
    config, path = await _moved_setup(federation)
    assert await asyncio.to_thread(move_feeder, config, path, "hub3", "s1") == 0
    assert "and no longer has [shards.s2], which has no feeders left" in capsys.readouterr().out
    after = load_config(path)
    assert (sorted(after.shards), after.feeders["hub3"].shard) == (["s1"], "s1")
    assert coord_sql(federation, COUNTS.format(table="hosts")) == BEFORE
    assert coord_int(federation, "SELECT count(*) FROM pg_foreign_table") == 2  # hosts and contexts, from s1
    assert shard_sql(federation, "s2", COUNTS.format(table="hosts")) == ""


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["hub9", "--to", "s2"], "fedload: unknown feeder hub9; configured: hub1, hub2, hub3"),
        (["hub2", "--to", "s9"], "fedload: unknown shard s9; shards: s1, s2"),
    ],
)
def test_move_usage_errors(federation: Federation, argv: list[str], error: str) -> None:
    """An unknown feeder or shard: exit 2, one line."""
    path = sharded_toml(federation, with_coordinator(federation, LAYOUT))
    moved = fedload("feeder", "move", *argv, "--config", str(path), timeout_s=120)
    assert (moved.returncode, moved.stderr) == (2, error + "\n")


async def test_other_builds_wait_for_a_move(federation: Federation) -> None:
    """While a move holds the coordinator, a build from another configuration (a daemon's, a sync's) is deferred
    and changes nothing; a second move is refused after its wait; once the move ends, builds go through."""
    config = with_coordinator(federation, LAYOUT)
    assert all(run.succeeded for run in await sync(config))

    async with moving_feeders(config):
        deferred = (await build_coordinator(config)).deferred
        with pytest.raises(SuperhubError) as refused:
            async with moving_feeders(config, wait_s=0.5):
                pass
    after = (await build_coordinator(config)).deferred
    assert (deferred, str(refused.value), after) == (
        True,
        "another feeder move or a coordinator build held the coordinator for 0.5 s",
        False,
    )


def _assert_moved(federation: Federation, path: Path) -> None:
    """hub2's move to s2 is complete: the file names s2; s1 holds nothing of it, no history, and notes the move; s2
    holds it; the coordinator reads it once, from s2, and both shards directly."""
    assert load_config(path).feeders["hub2"].shard == "s2"
    assert shard_sql(federation, "s1", COUNTS.format(table="hosts")) == "1:300"
    assert shard_int(federation, "s1", "SELECT count(*) FROM fedload.runs WHERE feeder = 'hub2'") == 0
    assert shard_sql(federation, "s1", "SELECT feeder || '>' || to_shard FROM fedload.moved") == "hub2>s2"
    assert shard_sql(federation, "s2", COUNTS.format(table="hosts")) == "2:201,3:100"
    assert coord_sql(federation, COUNTS.format(table="hosts")) == AFTER
    views = [shard_sql(federation, shard, VIEWS) for shard in ("s1", "s2")]
    assert (coord_sql(federation, FILTERED), views) == ("0", ["0", "0"])


# `python -c _CRASH MODULE NAME N ARGS...`: fedload's command line with ARGS, the process killed (no cleanup, no
# rollback but the server's) at the Nth call of MODULE.NAME, before that call does anything.
_CRASH = """
import os, sys
from importlib import import_module
from fedload.cli import main

module, name, nth = sys.argv[1], sys.argv[2], int(sys.argv[3])
target = import_module(module)
original, calls = getattr(target, name), []

def crashing(*args, **kwargs):
    calls.append(1)
    if len(calls) == nth:
        os._exit(70)
    return original(*args, **kwargs)

setattr(target, name, crashing)
sys.exit(main(sys.argv[4:]))
"""


@pytest.mark.parametrize(
    ("module", "function", "nth"),
    [
        pytest.param("fedload.commands.move", "sync_feeder", 1, id="after-1-build"),
        pytest.param("fedload.commands.move", "build_coordinator", 2, id="after-2-load"),
        pytest.param("fedload.commands.move", "drop_feeder", 1, id="after-3-switch"),
        pytest.param("fedload.superhub.removal", "forget_feeder", 1, id="inside-4-drop"),
        pytest.param("fedload.commands.move", "set_feeder_shard", 1, id="after-4-drop"),
        pytest.param("fedload.commands.move", "build_coordinator", 3, id="after-5-configuration"),
    ],
)
async def test_a_move_killed_between_two_steps_is_finished_by_running_it_again(
    federation: Federation, module: str, function: str, nth: int
) -> None:
    """The move's process is killed between two of its steps (or inside the drop on s1, between its partitions and
    its history): the coordinator still reads hub2 once, s1 holds hub2 with its history or neither, and the move
    run again finishes it: hub2 only on s2, s1 clean with the move noted, the file naming s2, the shards read
    directly."""
    _, path = await _moved_setup(federation)
    args = ["feeder", "move", "hub2", "--to", "s2", "--config", str(path)]
    _killed_at(module, function, nth, args)
    assert coord_sql(federation, COUNTS.format(table="hosts")) in (BEFORE, AFTER)
    holds = "2:" in shard_sql(federation, "s1", COUNTS.format(table="hosts"))
    history = shard_int(federation, "s1", "SELECT count(*) FROM fedload.runs WHERE feeder = 'hub2'") != 0
    noted = shard_int(federation, "s1", "SELECT count(*) FROM fedload.moved") != 0
    assert (holds, history, noted) in ((True, True, False), (False, False, True)), (holds, history, noted)
    again = fedload(*args, timeout_s=120)
    assert again.returncode == 0, again.stdout + again.stderr
    _assert_moved(federation, path)


def _killed_at(module: str, function: str, nth: int, args: list[str]) -> None:
    """Run fedload with `args`, killed at the `nth` call of `module.function` (`_CRASH`)."""
    crashed = subprocess.run(
        [sys.executable, "-c", _CRASH, module, function, str(nth), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert crashed.returncode == 70, crashed.stdout + crashed.stderr


async def test_a_move_off_a_shard_killed_before_its_drop_is_finished_by_running_it_again(
    federation: Federation,
) -> None:
    """hub3, s2's only feeder, moves to s1 and the move is killed before the drop on s2: the file still names s2
    (its section too), so the move run again drops hub3 there, and only then removes [shards.s2]."""
    _, path = await _moved_setup(federation)
    args = ["feeder", "move", "hub3", "--to", "s1", "--config", str(path)]
    _killed_at("fedload.commands.move", "drop_feeder", 1, args)
    assert coord_sql(federation, COUNTS.format(table="hosts")) == BEFORE
    again = fedload(*args, timeout_s=120)
    assert again.returncode == 0, again.stdout + again.stderr
    after = load_config(path)
    assert (sorted(after.shards), after.feeders["hub3"].shard) == (["s1"], "s1")
    assert shard_sql(federation, "s2", COUNTS.format(table="hosts")) == ""
    assert shard_sql(federation, "s2", "SELECT feeder || '>' || to_shard FROM fedload.moved") == "hub3>s1"
    assert coord_sql(federation, COUNTS.format(table="hosts")) == BEFORE
    assert coord_int(federation, "SELECT count(*) FROM pg_foreign_table") == 2


async def test_a_move_stopped_by_a_run_on_the_old_shard_is_finished_by_running_it_again(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of hub2 on s1 (an old daemon) holds its run lock past the drop's wait: the move stops with s1 still
    named in the file and holding hub2, filtered out; once the run is over, the move run again finishes it."""
    config, path = await _moved_setup(federation)
    monkeypatch.setattr(move_module, "_BUSY_WAIT_S", 0.5)

    run = await asyncpg.connect(config.shards["s1"].dsn)
    try:
        assert await try_feeder_lock(run, "hub2")
        with pytest.raises(MoveError) as stopped:
            await asyncio.to_thread(move_feeder, config, path, "hub2", "s2")
    finally:
        await run.close()
    assert str(stopped.value) == (
        f"feeder hub2 is served from shard s2, but a run of it on shard s1 held it for 0.5 s: {AGAIN} to remove it "
        "there"
    )
    assert (load_config(path).feeders["hub2"].shard, "s1" in load_config(path).shards) == ("s1", True)
    assert shard_sql(federation, "s1", COUNTS.format(table="hosts")) == "1:300,2:200"
    assert coord_sql(federation, COUNTS.format(table="hosts")) == AFTER
    assert await asyncio.to_thread(move_feeder, load_config(path), path, "hub2", "s2") == 0
    _assert_moved(federation, path)


async def test_a_move_whose_old_shard_goes_down_before_the_drop_is_finished_by_running_it_again(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """s1 refuses connections when the drop begins: the move stops saying hub2 is served from s2 and to run it
    again; the file still names s1; once s1 is back, the move run again finishes it."""
    config, path = await _moved_setup(federation)
    s1 = f"{federation.superhub}_s1"

    async def s1_down_then_drop(*args: Any, **kwargs: Any) -> Any:
        federation.cluster.psql(f"ALTER DATABASE {s1} ALLOW_CONNECTIONS false")
        return await drop_feeder(*args, **kwargs)

    monkeypatch.setattr(move_module, "drop_feeder", s1_down_then_drop)
    try:
        with pytest.raises(MoveError) as stopped:
            await asyncio.to_thread(move_feeder, config, path, "hub2", "s2")
    finally:
        federation.cluster.psql(f"ALTER DATABASE {s1} ALLOW_CONNECTIONS true")
    assert str(stopped.value).startswith("feeder hub2 is served from shard s2, but dropping it from shard s1 failed ")
    assert str(stopped.value).endswith(f": {AGAIN} to remove it there"), stopped.value
    assert load_config(path).feeders["hub2"].shard == "s1"
    assert coord_sql(federation, COUNTS.format(table="hosts")) == AFTER
    monkeypatch.undo()
    assert await asyncio.to_thread(move_feeder, load_config(path), path, "hub2", "s2") == 0
    _assert_moved(federation, path)


KEYS = {"hub1": 1, "hub2": -2, "hub3": 5_000_000_000}  # a bigint key column, and a negative key
BIGINT_SCHEMA = """
CREATE TABLE public.hosts (hub_id bigint NOT NULL, hostkey text NOT NULL, name text, site text DEFAULT 'none',
    seen timestamptz, online boolean, PRIMARY KEY (hostkey));
CREATE TABLE public.contexts (hub_id bigint NOT NULL, hostkey text NOT NULL, contextname text, tags text[],
    score integer);
"""
ROUND = (("move", "hub2", "s2"), ("move", "hub2", "s1"), ("remove", "hub1", "s1"))  # hub1 goes while hub2 swaps
ROUNDS = 2


def _daemons_config(federation: Federation) -> tuple[Config, Path]:
    """hub1, hub2 on s1 and hub3 on s2 with a coordinator, a bigint key, the daemons' interval 0.5 s; its file."""
    config = with_coordinator(federation, LAYOUT)
    schema = federation.tmp / "bigint.sql"
    schema.write_text(BIGINT_SCHEMA)
    document = config.model_dump(mode="json", exclude_none=True)
    document["superhub"] |= {"schema_file": str(schema), "worker_processes": 0}
    for name, feeder in document["feeders"].items():
        feeder |= {"key": KEYS[name], "interval_s": 0.5}
    config = parse_config(document)
    return config, config_file(federation, config)


async def _read_every_50_ms(dsn: str, done: asyncio.Event, odd: list[object]) -> list[float]:
    """The coordinator's GROUP BY every 50 ms until `done`: every read that shows a feeder twice, with rows other
    than its own, or without hub2 or hub3 (hub1 may be removed) goes to `odd`. When each read ended (monotonic)."""
    rows = {str(KEYS[name]): n for name, n in (("hub1", 300), ("hub2", 200), ("hub3", 100))}
    conn = await asyncpg.connect(dsn)
    reads: list[float] = []
    try:
        while not done.is_set():
            seen = [(key, n) for key, n in await conn.fetch("SELECT hub_id::text, count(*) FROM hosts GROUP BY 1")]
            keys = [key for key, _ in seen]
            missing = {str(KEYS["hub2"]), str(KEYS["hub3"])} - set(keys)
            if len(keys) != len(set(keys)) or any(rows.get(key) != n for key, n in seen) or missing:
                odd.append(sorted(seen))
            reads.append(time.monotonic())
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    return reads


async def _command(path: Path, verb: str, name: str, shard: str) -> str:
    """`feeder move NAME --to SHARD` or `feeder remove NAME --shard SHARD --yes` with the file as it is now; what
    failed ("" if it succeeded), then what `status` lists twice, if anything."""
    config = load_config(path)
    try:
        if verb == "move":
            await asyncio.to_thread(move_feeder, config, path, name, shard)
        else:
            await asyncio.to_thread(remove_feeder, config, name, yes=True, shard=shard)
    except FedloadError as exc:
        return f"{verb} {name} {shard}: {exc}"
    listed = [s.feeder for s in await read_status(load_config(path))]
    return "" if len(listed) == len(set(listed)) else f"after {verb} {name} {shard}, status lists {listed}"


async def test_moves_and_removals_finish_while_daemons_sync_and_a_reader_reads(federation: Federation) -> None:
    """A daemon per shard syncs its feeders every 0.5 s (never reloaded) and a reader queries the coordinator every
    50 ms while hub2 is moved to s2 and back and hub1 is removed, twice over: every command succeeds (each waits
    for the runs and swaps it meets), `status` lists each feeder once after each, and every read sees each feeder
    at most once, with all its rows."""
    config, path = _daemons_config(federation)
    assert config.coordinator is not None
    assert all(run.succeeded for run in await sync(config))
    daemons = [DaemonProcess(path, federation.tmp / f"{shard}.log", None, "--shard", shard) for shard in LAYOUT]
    odd: list[object] = []
    done = asyncio.Event()
    reader = asyncio.create_task(_read_every_50_ms(config.coordinator.dsn, done, odd))
    try:
        began = time.monotonic()
        failed = [await _command(path, *command) for _ in range(ROUNDS) for command in ROUND]
        ended = time.monotonic()
    finally:
        done.set()
        reads = await reader
        for daemon in daemons:
            daemon.stop()
            daemon.close_log()
    # The reads must overlap the commands, a read per command at least; a count of reads would depend on the load.
    during = sum(began <= at <= ended for at in reads)
    assert ([f for f in failed if f], odd[:3], during >= len(failed)) == ([], [], True), (odd[:3], during)
