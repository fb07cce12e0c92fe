"""`fedload feeder remove` as an operator runs it: unknown names, confirmation, --yes, --table, status after; its
locks taken in the swaps' order, waited for and retried as a swap does, and one line when it gives up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from fedload.results import Outcome
from fedload.superhub.bookkeeping import try_feeder_lock, unlock_feeder
from tests.support.federation import Federation, config_toml, fedload, sync


async def _synced(fed: Federation) -> Path:
    """The federation synced once; its configuration file."""
    path = fed.tmp / "fedload.toml"
    path.write_text(config_toml(fed))
    assert all(run.outcome == Outcome.SUCCESS for run in await sync(fed.config()))
    return path


def _on_terminal(args: list[str], answer: bytes) -> tuple[int, str]:
    """Run fedload with a pseudo-terminal as stdin and stdout, answer its question; exit status and output."""
    primary, secondary = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "fedload", *args], stdin=secondary, stdout=secondary, stderr=secondary
    ) as child:
        os.close(secondary)
        output = b""
        deadline = time.monotonic() + 60
        while b"[y/N]" not in output and time.monotonic() < deadline:
            output += os.read(primary, 4096)
        os.write(primary, answer)
        with contextlib.suppress(OSError):  # EIO once the child has closed the terminal
            while chunk := os.read(primary, 4096):
                output += chunk
        status = child.wait(timeout=60)
    os.close(primary)
    return status, output.decode().replace("\r\n", "\n")


def _partitions(fed: Federation, key: int) -> str:
    return fed.superhub_sql(
        "SELECT string_agg(inhparent::regclass::text, ',' ORDER BY 1) FROM pg_inherits i JOIN pg_class c "
        f"ON c.oid = i.inhrelid WHERE pg_get_expr(c.relpartbound, c.oid) = 'FOR VALUES IN ({key})'"
    )


async def test_unknown_feeder_is_an_error_naming_the_known_ones(federation: Federation) -> None:
    """A name neither configured nor known to the superhub: exit 2, one line naming the known feeders."""
    config = await _synced(federation)
    result = fedload("feeder", "remove", "nosuch", "--yes", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr == (
        "fedload: feeder nosuch is not configured and the superhub holds no partitions or run history of it; "
        "known feeders: hub1, hub2, hub3\n"
    )
    assert result.stdout == ""


async def test_without_terminal_or_yes_nothing_is_dropped(federation: Federation) -> None:
    """stdin not a terminal and no --yes: a one-line error saying to pass --yes; the partitions stay."""
    config = await _synced(federation)
    result = fedload("feeder", "remove", "hub2", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr == "fedload: feeder remove hub2 asks for confirmation on a terminal; pass --yes to remove it\n"
    assert _partitions(federation, 2) == "contexts,hosts"


async def test_terminal_shows_tables_and_rows_and_asks(federation: Federation) -> None:
    """On a terminal the tables and row counts are shown; "n" keeps everything (exit 1), "y" drops them."""
    config = await _synced(federation)
    status, output = _on_terminal(["feeder", "remove", "hub2", "--config", str(config)], b"n\n")
    assert status == 1
    assert "  public.contexts: 2,000 rows\n  public.hosts: 200 rows\n  run history: 1 recorded run\n" in output
    assert "feeder hub2: nothing removed" in output
    assert _partitions(federation, 2) == "contexts,hosts"
    status, output = _on_terminal(["feeder", "remove", "hub2", "--config", str(config)], b"y\n")
    assert status == 0, output
    assert "feeder hub2: dropped 2 partitions" in output
    assert _partitions(federation, 2) == ""


async def test_removed_feeder_leaves_status(federation: Federation) -> None:
    """After removing an unconfigured feeder, status no longer lists it; a second removal is an unknown name."""
    config = await _synced(federation)
    config.write_text(config_toml(federation).split("[feeders.hub3]")[0])
    result = fedload("feeder", "remove", "hub3", "--yes", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "feeder hub3: dropped 2 partitions\n  public.contexts: 1,000 rows\n  public.hosts: 100 rows\n"
        "feeder hub3: forgot its run history (1 run)\n"
    )
    status = json.loads(fedload("status", "--json", "--config", str(config)).stdout)
    assert [s["feeder"] for s in status] == ["hub1", "hub2"]
    assert fedload("feeder", "remove", "hub3", "--yes", "--config", str(config)).returncode == 2


async def test_table_option_drops_only_those_tables_and_keeps_history(federation: Federation) -> None:
    """--table drops only the matching tables' partitions; the run history stays; a pattern matching nothing is
    an error."""
    config = await _synced(federation)
    result = fedload("feeder", "remove", "hub1", "--table", "public.contexts", "--yes", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "feeder hub1: dropped 1 partition",
        "  public.contexts: 3,000 rows",
        "public.contexts not in feeders.hub1.exclude_tables: the next sync of hub1 brings their data back",
    ]
    assert _partitions(federation, 1) == "hosts"
    assert federation.superhub_int("SELECT count(*) FROM fedload.runs WHERE feeder = 'hub1'") == 1
    nothing = fedload("feeder", "remove", "hub1", "--table", "public.nosuch", "--yes", "--config", str(config))
    assert nothing.returncode == 2
    assert "--table public.nosuch matches none of the superhub's tables" in nothing.stderr


_WAITING = (  # the removal's session waiting for a lock (fedload names its sessions "fedload ...")
    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name LIKE 'fedload%'"
)
_TRIED_RUN_LOCK = (  # the removal's session has tried a run lock
    "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'fedload%' AND query LIKE '%pg_try_advisory_lock%'"
)
_HELD_UNDER_HOSTS = """
SELECT count(*) FROM pg_locks l JOIN pg_inherits i ON i.inhrelid = l.relation
WHERE l.pid = $1 AND l.granted AND i.inhparent = 'public.hosts'::regclass
"""


async def _removal(path: Path, *args: str) -> asyncio.subprocess.Process:
    """`fedload feeder remove ARGS --yes` started in its own process."""
    return await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "fedload", "feeder", "remove", *args, "--yes", "--config", str(path)],
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _finished(process: asyncio.subprocess.Process) -> tuple[int, str]:
    """The exit status and stderr of a process, waited for 60 s at most."""
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, stderr.decode()


async def _session_of(fed: Federation, removal: asyncio.subprocess.Process, sql: str, what: str) -> int:
    """The pid of the removal's session once `sql` finds it (30 s at most; the test fails, saying `what` never
    happened, if the removal ends first). Asked on a connection of its own: a transaction sees pg_stat_activity as
    of its first look."""
    conn = await asyncpg.connect(fed.cluster.dsn(fed.superhub))
    try:
        deadline = time.monotonic() + 30
        while (pid := await conn.fetchval(sql)) is None:
            if removal.returncode is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                    removal.kill()
                code, stderr = await _finished(removal)
                pytest.fail(f"the removal never {what}: exit {code}, {stderr}")
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    return int(pid)


async def test_a_removal_locks_the_parents_before_any_partition(federation: Federation) -> None:
    """A report holds public.hosts (not its partitions): the removal waits for it holding no partition of hosts, as
    a swap does (parents first, in one order, then partitions; a removal that counted or locked a partition before
    its parent could deadlock with a swap of another feeder), and finishes once the report ends."""
    path = await _synced(federation)
    report = await asyncpg.connect(federation.cluster.dsn(federation.superhub))
    try:
        transaction = report.transaction()
        await transaction.start()
        await report.execute("LOCK TABLE ONLY public.hosts IN ACCESS SHARE MODE")
        removal = await _removal(path, "hub2")
        held = await report.fetchval(_HELD_UNDER_HOSTS, await _session_of(federation, removal, _WAITING, "waited"))
        await transaction.rollback()
        code, stderr = await _finished(removal)
    finally:
        await report.close()
    assert (held, code, _partitions(federation, 2)) == (0, 0, ""), stderr


async def test_a_removal_and_a_report_locking_in_another_order_do_not_deadlock(federation: Federation) -> None:
    """A report reads hosts, the removal then waits for it, and the report reads contexts in the same
    transaction (the other order): the removal gives way (its short lock timeout, below deadlock_timeout) instead
    of failing with "deadlock detected", and succeeds once the report ends; the report is never disturbed."""
    path = await _synced(federation)
    report = await asyncpg.connect(federation.cluster.dsn(federation.superhub))
    try:
        async with report.transaction():
            assert await report.fetchval("SELECT count(*) FROM hosts") == 600
            removal = await _removal(path, "hub2")
            await _session_of(federation, removal, _WAITING, "waited")
            assert await report.fetchval("SELECT count(*) FROM contexts", timeout=30) == 6000
        code, stderr = await _finished(removal)
    finally:
        await report.close()
    assert (code, _partitions(federation, 2)) == (0, ""), stderr


async def test_a_removal_gives_up_after_swap_max_wait_s_saying_what_is_left(federation: Federation) -> None:
    """A report holds hosts past swap_max_wait_s: the removal gives up with one line (nothing removed, where the
    feeder is, what to run), exit 1, the partitions and history kept; run again after the report, it finishes."""
    path = await _synced(federation)
    path.write_text(path.read_text().replace("[superhub]\n", "[superhub]\nswap_max_wait_s = 1.0\n", 1))
    report = await asyncpg.connect(federation.cluster.dsn(federation.superhub))
    try:
        async with report.transaction():
            await report.execute("LOCK TABLE public.hosts IN ACCESS SHARE MODE")
            started = time.monotonic()
            code, stderr = await _finished(await _removal(path, "hub2"))
            seconds = time.monotonic() - started
    finally:
        await report.close()
    error = [line for line in stderr.splitlines() if line.startswith("fedload:")]
    assert (code, len(error), _partitions(federation, 2)) == (1, 1, "contexts,hosts"), stderr
    assert error[0].startswith(
        "fedload: error: feeder hub2: nothing removed (other sessions held public.contexts, public.hosts for "
        "swap_max_wait_s = 1 s ("
    ), error
    assert error[0].endswith('; the superhub still holds all of it: run "fedload feeder remove hub2" again to finish')
    assert seconds < 15, seconds
    assert federation.superhub_int("SELECT count(*) FROM fedload.runs WHERE feeder = 'hub2'") == 1
    assert fedload("feeder", "remove", "hub2", "--yes", "--config", str(path)).returncode == 0


async def test_a_removal_waits_for_a_run_of_the_feeder(federation: Federation) -> None:
    """A run of hub2 holds its run lock when the removal tries it, and 1 s more: the removal waits for it instead of
    failing, then removes."""
    path = await _synced(federation)
    run = await asyncpg.connect(federation.cluster.dsn(federation.superhub))
    try:
        assert await try_feeder_lock(run, "hub2")
        removal = await _removal(path, "hub2")
        await _session_of(federation, removal, _TRIED_RUN_LOCK, "tried the run lock")
        await asyncio.sleep(1.0)
        assert removal.returncode is None
        await unlock_feeder(run, "hub2")
        code, stderr = await _finished(removal)
    finally:
        await run.close()
    assert (code, _partitions(federation, 2)) == (0, ""), stderr
