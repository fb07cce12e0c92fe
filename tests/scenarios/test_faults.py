"""Faults mid-run: the network, the feeder's PostgreSQL, the superhub's PostgreSQL, the daemon, the disk, a rival sync.

Each case checks what an operator relies on: the feeder's old data intact (or the new data complete), nothing lost,
no staging leftovers, and one clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedload.config import Config
from fedload.errors import ErrorKind
from fedload.localpg import LocalCluster
from fedload.results import Outcome
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import FeederRun, sync_feeder
from tests.support.federation import (
    AGENT,
    CONTEXT_COLS,
    DIGEST,
    FEEDER_DATA,
    HOST_COLS,
    SCHEMA,
    DaemonProcess,
    Federation,
    assert_feeders_equal_partitions,
    config_toml,
    end_process,
    last_outcome,
    staging_leftovers,
    sync,
    write_script,
)
from tests.support.fix_tally import Category
from tests.support.mid_copy import HALF_STREAM_BYTES, grow, wait_rows_in_flight
from tests.support.sshd import SshServer

GROWTH = (
    "INSERT INTO contexts (hostkey, contextname) SELECT 'SHA=' || g, md5(g::text) || md5(random()::text) "
    "FROM generate_series(1, {rows}) g"
)

OUTCOMES = "SELECT string_agg(outcome, ',' ORDER BY id) FROM fedload.runs WHERE feeder = 'hub1'"
RUNNING = "SELECT string_agg(feeder, ',' ORDER BY feeder) FROM fedload.runs WHERE outcome = 'running'"


@dataclass
class Gate:
    """A dump command that stops after `after_bytes` of the stream until the test opens the gate."""

    command: str
    ready: Path
    go: Path

    @classmethod
    def around(cls, tmp: Path, agent: str = AGENT, after_bytes: int = 65536) -> Gate:
        ready, go = tmp / "gate.ready", tmp / "gate.go"
        body = (
            f'{agent} "$@" | {{ head -c {after_bytes}; touch {ready}; '
            f"while [ ! -e {go} ]; do sleep 0.05; done; exec cat; }}\n"
        )
        return cls(write_script(tmp / "gated.sh", body), ready, go)

    async def reached(self, timeout_s: float = 60) -> None:
        """Wait until the stream has stopped at the gate."""
        async with asyncio.timeout(timeout_s):
            while not self.ready.exists():  # noqa: ASYNC110 - another process makes the file: nothing to await
                await asyncio.sleep(0.05)

    def open(self) -> None:
        """Let the rest of the stream through."""
        self.go.touch()

    async def sync_with_fault(self, config: Config, fault: Callable[[], object], timeout_s: float = 60) -> FeederRun:
        """Sync hub1 through the gate; once the stream stops there, run `fault` (in a thread), open the gate."""

        gated = with_feeder(config, "hub1", agent_command=[self.command])
        task = asyncio.create_task(sync_feeder(feeder_job(gated, "hub1")))
        try:
            await self.reached()
            await asyncio.to_thread(fault)
        finally:
            self.open()  # never leave the gated command polling
        async with asyncio.timeout(timeout_s):
            return await task


def with_feeder(config: Config, name: str, **changes: object) -> Config:
    """`config` with one feeder's settings changed."""
    feeder = config.feeders[name].model_copy(update=changes)
    return config.model_copy(update={"feeders": {**config.feeders, name: feeder}})


def hub1_digest(fed: Federation) -> tuple[str, str]:
    """hub1's rows of every table on the superhub (the faults below grow `contexts`, the changes touch `hosts`)."""
    where = "WHERE hub_id = 1"
    return fed.digest(fed.superhub, "hosts", HOST_COLS, where), fed.digest(
        fed.superhub, "contexts", CONTEXT_COLS, where
    )


def feeder_digest(cluster: LocalCluster, db: str) -> tuple[str, str]:
    """A feeder's rows of every table, as `hub1_digest` reads them on the superhub."""
    hosts = cluster.psql(DIGEST.format(cols=HOST_COLS, table="hosts"), dbname=db).strip()
    return hosts, cluster.psql(DIGEST.format(cols=CONTEXT_COLS, table="contexts"), dbname=db).strip()


NEW_HOSTS = "INSERT INTO hosts (hostkey) SELECT 'new' || g FROM generate_series(1, 10) g"


def changed_on_feeder(fed: Federation) -> None:
    """Give hub1 new rows, so its next data differs from the old."""
    fed.cluster.psql(NEW_HOSTS, dbname=fed.feeders["hub1"])


def assert_old_data_kept(fed: Federation, before: tuple[str, str], run: FeederRun, *phrases: str) -> None:
    """The run failed with an error naming one of `phrases`; hub1 still has its old data; no staging is left."""
    assert run.outcome == Outcome.FAILED, run
    assert any(p in (run.error or "") for p in phrases), run.error
    assert "\n" not in (run.error or "")
    assert hub1_digest(fed) == before
    assert staging_leftovers(fed) == 0


@pytest.mark.parametrize("cut", ["killed", "frozen"])
async def test_network_cut_mid_stream(sshd: SshServer, federation: Federation, category: Category, cut: str) -> None:
    """sshd killed (the connection resets) or frozen (the link goes silent) mid-stream: old data kept, clear error."""
    category("fault:network cut mid-stream")
    ssh = sshd.ssh_config(keepalive_s=1, read_timeout_s=4).model_dump()
    config = federation.config(transport="ssh", ssh=ssh, agent_command=[sys.executable, "-m", "fedload"])
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    before = hub1_digest(federation)
    changed_on_feeder(federation)
    grow(federation)
    gate = Gate.around(federation.tmp, after_bytes=HALF_STREAM_BYTES)

    cut_at: list[float] = []

    def cut_mid_copy() -> None:
        wait_rows_in_flight(federation)  # the load's COPY has rows in flight
        (sshd.kill if cut == "killed" else sshd.freeze)()
        cut_at.append(time.monotonic())

    run = await gate.sync_with_fault(config, cut_mid_copy, timeout_s=60)
    assert time.monotonic() - cut_at[0] < 20  # read_timeout_s = 4, keepalives every second
    assert_old_data_kept(federation, before, run, "connection", "sent nothing")
    assert last_outcome(federation) == Outcome.FAILED


@pytest.fixture
def feeder_cluster(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """A feeder on a PostgreSQL cluster of its own, so it can be stopped."""
    own = LocalCluster(cluster.install, name="feeder").start()
    try:
        own.psql("CREATE DATABASE cfdb")
        own.psql(SCHEMA + FEEDER_DATA.format(n=100, m=300), dbname="cfdb")
        yield own
    finally:
        own.stop()


async def test_feeder_postgres_stopped_mid_dump(
    federation: Federation, feeder_cluster: LocalCluster, category: Category
) -> None:
    """The feeder's server goes down while pg_dump streams a table: pg_dump's failure reaches the superhub."""
    category("fault:feeder PostgreSQL stopped mid-dump")
    config = with_feeder(federation.config(), "hub1", database=feeder_cluster.conninfo("cfdb"))
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    before = hub1_digest(federation)
    feeder_cluster.psql(GROWTH.format(rows=400_000), dbname="cfdb")  # more than every buffer on the way holds
    gate = Gate.around(federation.tmp)

    run = await gate.sync_with_fault(config, lambda: feeder_cluster.halt(mode="immediate"))
    assert_old_data_kept(federation, before, run, "pg_dump failed on the feeder")
    federation.superhub_sql("DELETE FROM contexts WHERE ctid = (SELECT min(ctid) FROM contexts WHERE hub_id = 1)")
    with pytest.raises(AssertionError):  # negative control: one row of the grown table lost is seen
        assert_old_data_kept(federation, before, run, "pg_dump failed on the feeder")
    feeder_cluster.resume()
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    assert hub1_digest(federation) == feeder_digest(feeder_cluster, "cfdb")


@pytest.fixture
def own_superhub(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """A superhub on a PostgreSQL cluster of its own, so it can crash; what it committed survives the crash, as on a
    real server (the runs' history the test reads back included)."""
    own = LocalCluster(cluster.install, name="superhub", crash_safe=True).start()
    try:
        own.psql("CREATE DATABASE superhub")
        yield own
    finally:
        own.stop()


async def test_superhub_crash_mid_load(federation: Federation, own_superhub: LocalCluster, category: Category) -> None:
    """The superhub's server crashes and recovers while a feeder loads: the run fails, the old data survives."""
    category("fault:superhub PostgreSQL restarted mid-load")
    base = federation.config()
    config = base.model_copy(
        update={"superhub": base.superhub.model_copy(update={"dsn": own_superhub.dsn("superhub")})}
    )
    assert [r.outcome for r in await sync(config)] == [Outcome.SUCCESS] * 3
    superhub = Federation(own_superhub, "superhub", {}, federation.tmp)  # digests of the superhub's side
    before = hub1_digest(superhub)
    changed_on_feeder(federation)
    grow(federation)
    gate = Gate.around(federation.tmp, after_bytes=HALF_STREAM_BYTES)

    def crash_and_recover() -> None:
        wait_rows_in_flight(superhub)  # the load's COPY has rows in flight
        own_superhub.halt(mode="immediate")
        own_superhub.resume()

    run = await gate.sync_with_fault(config, crash_and_recover)
    assert_old_data_kept(superhub, before, run, "the superhub")
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    assert hub1_digest(superhub) == feeder_digest(federation.cluster, federation.feeders["hub1"])
    outcomes = superhub.superhub_sql(
        "SELECT string_agg(outcome, ',' ORDER BY id) FROM fedload.runs WHERE feeder = 'hub1'"
    )
    assert outcomes in ("success,failed,success", "success,abandoned,success")


async def test_superhub_session_lost_while_the_feeder_is_silent(federation: Federation, category: Category) -> None:
    """The run's superhub session is terminated while the feeder's stream has stopped (read_timeout_s = 300): the
    run fails at once as the superhub's failure, the old data stays, nothing is left in staging."""
    category("fault:superhub session lost while the feeder is silent")
    config = federation.config()
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    before = hub1_digest(federation)
    changed_on_feeder(federation)
    gate = Gate.around(federation.tmp, after_bytes=2000)
    gated = with_feeder(config, "hub1", agent_command=[gate.command], read_timeout_s=300.0)
    syncing = asyncio.create_task(sync_feeder(feeder_job(gated, "hub1")))
    try:
        await gate.reached()
        ended = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
        assert federation.superhub_sql(f"{ended} WHERE application_name = 'fedload hub1'") == "1"
        terminated = time.monotonic()
        async with asyncio.timeout(60):
            run = await syncing
        assert time.monotonic() - terminated < 10
    finally:
        gate.open()
    assert_old_data_kept(federation, before, run, "the superhub connection was lost")
    assert run.error_kind == ErrorKind.SUPERHUB


async def test_two_syncs_of_one_feeder_at_once(federation: Federation, category: Category) -> None:
    """A second sync of a feeder that is being synced says it is busy and leaves the first to finish."""
    category("fault:two syncs of the same feeder at once")
    config = federation.config()
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    changed_on_feeder(federation)
    gate = Gate.around(federation.tmp, after_bytes=2000)
    gated = with_feeder(config, "hub1", agent_command=[gate.command])

    syncing = asyncio.create_task(sync_feeder(feeder_job(gated, "hub1")))
    await gate.reached()
    second = await asyncio.wait_for(sync_feeder(feeder_job(config, "hub1")), 30)
    gate.open()
    first = await asyncio.wait_for(syncing, 60)
    assert (first.outcome, second.outcome) == (Outcome.SUCCESS, Outcome.BUSY), (first.error, second.error)
    assert "being synced by another fedload process" in (second.error or "")
    assert_feeders_equal_partitions(federation, {"hub1": 1})
    assert federation.superhub_sql(OUTCOMES) == "success,success"


SWAP_WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE%' "
    "AND application_name LIKE 'fedload %'"
)


def superhub_digests(fed: Federation) -> list[str]:
    """Every feeder's rows on the superhub."""
    return [fed.digest(fed.superhub, "hosts", HOST_COLS), fed.digest(fed.superhub, "contexts", CONTEXT_COLS)]


async def test_daemon_killed_mid_swap_then_restarted(
    federation: Federation, start_daemon: Callable[[str], DaemonProcess], category: Category
) -> None:
    """SIGKILL while swaps wait for their locks: old data stays; the restarted daemon swaps in the new data."""
    category("fault:daemon SIGKILLed mid-swap")
    assert [r.outcome for r in await sync(federation.config())] == [Outcome.SUCCESS] * 3
    before = superhub_digests(federation)
    for db in federation.feeders.values():
        federation.cluster.psql(
            "INSERT INTO hosts (hostkey) SELECT 'new' || g FROM generate_series(1, 10) g", dbname=db
        )
    psql = [federation.cluster.install.tool("psql"), "-X", "-q", "-d", federation.cluster.conninfo(federation.superhub)]
    reader = await asyncio.create_subprocess_exec(*psql, stdin=asyncio.subprocess.PIPE)
    assert reader.stdin is not None
    reader.stdin.write(b"BEGIN; SELECT count(*) FROM hosts;\n")  # a report holding its lock: every swap waits
    await reader.stdin.drain()
    try:
        daemon = start_daemon(config_toml(federation, interval_s=3600))
        daemon.wait_for("a swap waiting for its lock", lambda: federation.superhub_int(SWAP_WAITING) != 0)
        killed = federation.superhub_sql(RUNNING).split(",")
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(timeout=10)
        assert superhub_digests(federation) == before
    finally:
        try:
            await asyncio.wait_for(reader.communicate(b"COMMIT;\n"), 30)
        finally:
            await end_process(reader)
    deadline = time.monotonic() + 30
    while staging_leftovers(federation) != 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - polls the server
        await asyncio.sleep(0.2)  # the killed daemon's sessions end when the server notices
    assert staging_leftovers(federation) == 0
    assert superhub_digests(federation) == before
    restarted = start_daemon(config_toml(federation, interval_s=3600))
    restarted.wait_for(
        "every feeder swapped in by the restarted daemon",
        lambda: federation.superhub_int("SELECT count(*) FROM fedload.runs WHERE outcome = 'success'") == 6,
    )
    assert restarted.stop() == 0
    assert_feeders_equal_partitions(federation)
    for feeder in killed:
        outcomes = federation.superhub_sql(OUTCOMES.replace("hub1", feeder))
        assert outcomes == "success,abandoned,success", feeder
    assert staging_leftovers(federation) == 0


@contextlib.contextmanager
def tiny_tablespace(fed: Federation, size: str = "4m") -> Iterator[str]:
    """A tablespace on a small tmpfs, made the superhub database's default; skips where mounting is not allowed."""
    mount = Path(tempfile.mkdtemp(prefix="fedload-tiny-"))  # the server user must reach it: not under pytest's tmp
    owner = fed.cluster.dir.stat()
    result = subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size={size},mode=0700,uid={owner.st_uid},gid={owner.st_gid}",
            "tmpfs",
            str(mount),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        mount.rmdir()
        why = f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}"
        if os.environ.get("FEDLOAD_REQUIRE_DISK_FULL") == "1":  # CI runs as root: there it must run
            pytest.fail(f"{why} (FEDLOAD_REQUIRE_DISK_FULL=1)")
        pytest.skip(why)
    try:
        fed.superhub_sql(f"CREATE TABLESPACE tiny_{fed.superhub} LOCATION '{mount}'")
        fed.superhub_sql(f"ALTER DATABASE {fed.superhub} SET default_tablespace = tiny_{fed.superhub}")
        try:
            yield f"tiny_{fed.superhub}"
        finally:
            fed.superhub_sql(f"ALTER DATABASE {fed.superhub} RESET default_tablespace")
            fed.superhub_sql(f"DROP TABLESPACE tiny_{fed.superhub}")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=30)
        mount.rmdir()


async def test_superhub_disk_full_while_staging(federation: Federation, category: Category) -> None:
    """Staging tables fill their tablespace: the run fails with the server's words, and the old data stays."""
    category("fault:superhub disk full")
    config = federation.config()
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    before = hub1_digest(federation)
    federation.cluster.psql(GROWTH.format(rows=100_000), dbname=federation.feeders["hub1"])
    with tiny_tablespace(federation):
        (run,) = await sync(config, "hub1")
        assert_old_data_kept(federation, before, run, "No space left on device")
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    assert_feeders_equal_partitions(federation, {"hub1": 1})
