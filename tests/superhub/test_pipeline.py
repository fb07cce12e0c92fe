"""End-to-end syncs against real PostgreSQL: drift, atomic swap, failures and hostile dumps leave old data intact."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from fedload import __version__
from fedload.errors import ErrorKind
from fedload.names import TablePattern
from fedload.results import Outcome
from fedload.service.sync import sync_feeders
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import sync_feeder
from fedload.superhub.schema import read_parents
from tests.support.federation import (
    AGENT,
    CONTEXT_COLS,
    Federation,
    assert_feeders_equal_partitions,
    config_toml,
    crafted_stream,
    end_process,
    failing_after_first_sync,
    prepare,
    staging_leftovers,
    sync,
    write_script,
)
from tests.support.fix_tally import Category
from tests.support.mid_copy import feeder_rows, mid_copy_agent, rows_in_flight_soon


@pytest.mark.parametrize("mode", ["copy", "inserts", "binary"])
async def test_three_feeders_load_and_resync(federation: Federation, mode: str) -> None:
    """Three feeders load into their partitions exactly; a second sync swaps in their changed data."""
    config = federation.config(dump_mode=mode)
    runs = await sync(config)
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 3, [r.error for r in runs]
    assert runs[0].rows == {"public.contexts": 3000, "public.hosts": 300}
    assert_feeders_equal_partitions(federation)
    federation.cluster.psql("DELETE FROM hosts WHERE hostkey LIKE 'SHA=1%'", dbname=federation.feeders["hub1"])
    assert [r.outcome for r in await sync(config, "hub1")] == [Outcome.SUCCESS]
    assert_feeders_equal_partitions(federation)
    assert staging_leftovers(federation) == 0
    assert federation.superhub_int("SELECT count(*) FROM fedload.runs WHERE outcome = 'success'") == 4


@pytest.mark.parametrize("mode", ["copy", "binary"])
async def test_schema_drift_defaults_and_dropped_columns(federation: Federation, mode: str) -> None:
    """A missing column takes the superhub default; an extra feeder column is dropped; column order is free."""
    db = federation.feeders["hub2"]
    federation.cluster.psql(
        "ALTER TABLE hosts DROP COLUMN site; ALTER TABLE hosts ADD COLUMN uptime bigint DEFAULT 7;"
        "CREATE TABLE h2 AS SELECT seen, uptime, online, name, hostkey FROM hosts; DROP TABLE hosts;"
        "ALTER TABLE h2 RENAME TO hosts;",
        dbname=db,
    )
    runs = await sync(federation.config(dump_mode=mode))
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 3, [r.error for r in runs]
    assert_feeders_equal_partitions(federation)
    assert federation.superhub_sql("SELECT DISTINCT site FROM hosts WHERE hub_id = 2") == "none"


@pytest.mark.parametrize("mode", ["copy", "binary"])
async def test_extra_columns_can_be_an_error(federation: Federation, mode: str) -> None:
    """With extra_columns = "error", a feeder column the superhub lacks fails that feeder only."""
    federation.cluster.psql("ALTER TABLE hosts ADD COLUMN surprise int", dbname=federation.feeders["hub3"])
    config = federation.config(dump_mode=mode)
    config = config.model_copy(update={"superhub": config.superhub.model_copy(update={"extra_columns": "error"})})
    runs = await sync(config)
    assert [r.outcome for r in runs] == [Outcome.SUCCESS, Outcome.SUCCESS, Outcome.FAILED]
    assert "columns the superhub lacks: surprise" in (runs[2].error or "")


async def test_truncated_stream_keeps_old_data(federation: Federation, category: Category) -> None:
    """A stream cut short is rejected as truncated; the feeder's previous data stays."""
    category("fault:stream truncated")
    run = await failing_after_first_sync(federation, f'{AGENT} "$@" | head -c 3000\n')
    assert run.outcome == Outcome.FAILED
    assert "truncated" in (run.error or "")


async def test_pg_dump_failing_half_way_keeps_old_data(federation: Federation, category: Category) -> None:
    """pg_dump that prints part of a dump and then fails is detected from the trailer."""
    category("fault:pg_dump failed half-way")
    real = federation.config().feeders["hub1"].pg_dump
    fake = write_script(
        federation.tmp / "pg_dump",
        f'case "$1" in --version) exec {real} --version;; esac\n'
        f'{real} "$@" | head -c 20000; echo "pg_dump: error: connection lost" >&2; exit 1\n',
    )
    run = await failing_after_first_sync(federation, pg_dump=fake)
    assert "pg_dump failed on the feeder with exit status 1: pg_dump: error: connection lost" in (run.error or "")


async def test_bad_row_fails_the_run_and_keeps_old_data(federation: Federation, category: Category) -> None:
    """A row the superhub cannot store rejects the dump (bad_rows = "fail")."""
    category("fault:bad row")
    federation.cluster.psql("ALTER TABLE contexts ALTER score TYPE text", dbname=federation.feeders["hub1"])
    run = await failing_after_first_sync(
        federation,
        f"psql -q -c \"UPDATE contexts SET score = 'not a number' WHERE score = '5'\" "
        f"'{federation.cluster.conninfo(federation.feeders['hub1'])}'\nexec {AGENT} \"$@\"\n",
    )
    assert "table public.contexts: the superhub refused the data of feeder hub1 (SQLSTATE 22P02)" in (run.error or "")
    assert "not a number" in (run.error or "")
    assert run.error_kind is ErrorKind.DUMP


HOSTILE_DUMPS = {
    "drop table": b"DROP TABLE public.hosts;\n",
    "copy to program": b"COPY public.hosts TO PROGRAM 'touch /tmp/fedload-pwned';\n",
    "injected tuple": b"INSERT INTO public.hosts (hostkey) VALUES ('a'); DELETE FROM public.hosts; --');\n",
    "tuple with expression": b"INSERT INTO public.hosts (hostkey, name) VALUES ('a', (SELECT current_user));\n",
    "shell meta-command": b"\\! touch /tmp/fedload-pwned\n",
    "unconfigured table": b"COPY evil.t (a) FROM stdin;\nx\n\\.\n",
    "other schema": b"INSERT INTO fedload.runs (feeder) VALUES ('x');\n",
    "set role": b"SET role = postgres;\n",
    "function": b"CREATE FUNCTION public.f() RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql;\n",
}


@pytest.mark.parametrize("attack", list(HOSTILE_DUMPS))
async def test_hostile_dumps_are_rejected_and_change_nothing(
    federation: Federation, category: Category, attack: str
) -> None:
    """Statements other than data for the feeder's own tables reject the dump; the superhub is unchanged."""
    category("adversarial:statements other than data")
    evil = federation.tmp / "evil.bin"
    prefix = b"SET statement_timeout = 0;\nINSERT INTO public.hosts (hostkey) VALUES ('ok');\n"
    evil.write_bytes(crafted_stream(prefix + HOSTILE_DUMPS[attack]))
    run = await failing_after_first_sync(federation, f"cat {evil}\n")
    assert run.outcome == Outcome.FAILED
    assert "dump line" in (run.error or ""), run.error
    assert federation.superhub_int("SELECT count(*) FROM pg_proc WHERE proname = 'f'") == 0
    assert not Path("/tmp/fedload-pwned").exists()  # noqa: ASYNC240 - one stat of a local path


async def test_row_counts_must_match_the_trailer(federation: Federation, category: Category) -> None:
    """A stream whose trailer states other row counts than arrived is rejected."""
    category("adversarial:lying trailer")
    evil = federation.tmp / "liar.bin"
    dump = b"COPY public.hosts (hostkey) FROM stdin;\nk1\nk2\n\\.\nCOPY public.contexts (hostkey) FROM stdin;\n\\.\n"
    evil.write_bytes(crafted_stream(dump, rows={"public.hosts": 3}))
    run = await failing_after_first_sync(federation, f"cat {evil}\n")
    assert "the feeder sent 3 rows but 2 were loaded" in (run.error or "")


async def test_cancel_mid_load_keeps_old_data(federation: Federation, category: Category) -> None:
    """Cancelling a run while rows stream in (its COPY has rows in flight) rolls everything back; the next run
    succeeds."""
    category("fault:run cancelled mid-load")
    config = federation.config()
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    before = feeder_rows(federation)
    script = mid_copy_agent(federation)

    task = asyncio.create_task(sync_feeder(feeder_job(federation.config(agent_command=[script]), "hub1")))
    await rows_in_flight_soon(federation)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gc.collect()  # a dump command's pipe left open by the cancel shows here, as an unraisable ResourceWarning
    assert feeder_rows(federation) == before
    assert staging_leftovers(federation) == 0
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    assert_feeders_equal_partitions(federation, {"hub1": 1})


async def test_readers_never_see_a_mixed_or_empty_feeder(federation: Federation) -> None:
    """While syncs repeat with changing data, readers see each feeder's old or new state, never anything else."""
    config = federation.config()
    await prepare(config)
    assert [r.outcome for r in await sync(config)] == [Outcome.SUCCESS] * 3
    feeder_db = federation.feeders["hub1"]
    states = {
        federation.superhub_sql(
            "SELECT count(*) || '/' || (SELECT count(*) FROM contexts WHERE hub_id = 1) FROM hosts WHERE hub_id = 1"
        )
    }

    async def reader(stop: asyncio.Event, seen: set[str]) -> int:
        conn = await asyncpg.connect(federation.cluster.dsn(federation.superhub))
        reads = 0
        try:
            while not stop.is_set():
                async with conn.transaction(isolation="repeatable_read"):
                    hosts = await conn.fetchval("SELECT count(*) FROM hosts WHERE hub_id = 1")
                    contexts = await conn.fetchval("SELECT count(*) FROM contexts WHERE hub_id = 1")
                seen.add(f"{hosts}/{contexts}")
                reads += 1
        finally:
            await conn.close()
        return reads

    stop, seen = asyncio.Event(), set[str]()
    reading = asyncio.create_task(reader(stop, seen))
    for round_ in range(4):
        federation.cluster.psql(
            f"INSERT INTO hosts (hostkey) SELECT 'r{round_}-' || g FROM generate_series(1, 10) g;"
            f"INSERT INTO contexts (hostkey, contextname) "
            f"SELECT 'r{round_}', 'c' || g FROM generate_series(1, 5) g",
            dbname=feeder_db,
        )
        states.add(
            federation.digest(feeder_db, "hosts", "hostkey").split(":")[0]
            + "/"
            + federation.digest(feeder_db, "contexts", "hostkey").split(":")[0]
        )
        run = await sync_feeder(feeder_job(config, "hub1"))
        assert run.outcome == Outcome.SUCCESS, run.error
    stop.set()
    reads = await reading
    assert reads > 20
    assert seen <= states, seen - states  # only complete states of the feeder, never empty, never mixed


async def test_dry_run_reports_and_changes_nothing(federation: Federation) -> None:
    """A dry run reads and checks every dump and says what a sync would do, without changing the superhub."""
    config = federation.config()
    first = await sync_feeders(config, list(config.feeders), dry_run=True)
    assert [r.outcome for r in first] == [Outcome.SUCCESS] * 3, [r.error for r in first]
    assert first[0].plan == (
        "public.contexts: attach a new partition of 3,000 rows",
        "public.hosts: attach a new partition of 300 rows",
    )
    assert federation.superhub_int("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'fedload%'") == 0
    assert [r.outcome for r in await sync(config)] == [Outcome.SUCCESS] * 3
    federation.cluster.psql("DELETE FROM hosts WHERE hostkey LIKE 'SHA=1%'", dbname=federation.feeders["hub1"])
    federation.cluster.psql("ALTER TABLE hosts ADD COLUMN extra int", dbname=federation.feeders["hub2"])
    again = await sync_feeders(config, ["hub1", "hub2"], dry_run=True)
    assert again[0].plan[1] == "public.hosts: replace 300 rows by 189"
    assert again[1].plan[1] == "public.hosts: replace 200 rows by 200 (feeder columns dropped: extra)"
    assert federation.superhub_int("SELECT count(*) FROM hosts WHERE hub_id = 1") == 300
    assert federation.superhub_int("SELECT count(*) FROM fedload.runs") == 3
    assert staging_leftovers(federation) == 0


def test_dry_run_reports_a_rejected_dump(federation: Federation) -> None:
    """A dry run of a hostile dump fails that feeder with the dump's error, and the command exits 1."""
    evil = federation.tmp / "evil.bin"
    evil.write_bytes(crafted_stream(HOSTILE_DUMPS["drop table"]))
    config_file = federation.tmp / "fedload.toml"
    config_file.write_text(
        config_toml(federation, agent_command=write_script(federation.tmp / "d.sh", f"cat {evil}\n"))
    )
    result = subprocess.run(
        [sys.executable, "-m", "fedload", "sync", "--dry-run", "--config", str(config_file), "hub1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "nothing was changed" in result.stdout
    assert "DROP TABLE" in result.stdout


@pytest.mark.parametrize("mode", ["copy", "inserts", "binary"])
async def test_rejected_rows_are_set_aside_with_their_error(federation: Federation, mode: str) -> None:
    """With bad_rows = "reject", rows the superhub refuses go to fedload.rejects; the rest load and swap in."""
    db = federation.feeders["hub1"]
    federation.cluster.psql(
        "ALTER TABLE contexts ALTER score TYPE text;"
        "UPDATE contexts SET score = 'not a number' WHERE score IN ('5', '1500');"
        "UPDATE contexts SET score = '99999999999' WHERE score = '2999';",
        dbname=db,
    )
    config = federation.config(dump_mode=mode)
    config = config.model_copy(update={"superhub": config.superhub.model_copy(update={"bad_rows": "reject"})})
    runs = await sync(config)
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 3, [r.error for r in runs]
    assert runs[0].rejected == {"public.contexts": 3}
    assert runs[0].rows["public.contexts"] == 2997
    good = "WHERE score NOT IN ('not a number', '99999999999')"
    assert federation.digest(federation.superhub, "contexts", CONTEXT_COLS, "WHERE hub_id = 1") == federation.digest(
        db, "contexts", CONTEXT_COLS, good
    )
    rejects = federation.superhub_sql(
        "SELECT string_agg(sqlstate || ' ' || (row_text LIKE '%not a number%')::text, ',' ORDER BY sqlstate, id) "
        "FROM fedload.rejects WHERE feeder = 'hub1' AND table_name = 'public.contexts'"
    )
    assert rejects == "22003 false,22P02 true,22P02 true"
    federation.cluster.psql("DELETE FROM contexts WHERE score !~ '^[0-9]{1,9}$'", dbname=db)
    assert (await sync(config, "hub1"))[0].rejected == {}
    assert federation.superhub_int("SELECT count(*) FROM fedload.rejects") == 0


async def test_a_run_records_the_agents_version(federation: Federation) -> None:
    """fedload.runs says which agent sent each dump (none without the agent)."""
    await sync(federation.config(), "hub1")
    await sync(federation.config(agent=False), "hub2")
    versions = federation.superhub_sql(
        "SELECT string_agg(feeder || '=' || coalesce(agent_version, '-'), ',' ORDER BY feeder) FROM fedload.runs"
    )
    assert versions == f"hub1={__version__},hub2=-"


async def test_reading_the_parents_leaves_the_search_path_alone(federation: Federation) -> None:
    """read_parents() reads the catalog with an empty search_path but gives the session back as it was."""

    await sync(federation.config(), "hub1")
    conn = await asyncpg.connect(federation.cluster.dsn(federation.superhub))
    try:
        await conn.execute("SET search_path = public, pg_temp")
        parents = await read_parents(conn, [TablePattern("public.*")], "hub_id")
        assert sorted(map(str, parents)) == ["public.contexts", "public.hosts"]
        assert await conn.fetchval("SHOW search_path") == "public, pg_temp"
    finally:
        await conn.close()


async def test_a_long_report_on_the_run_history_does_not_hold_up_runs(federation: Federation) -> None:
    """Once fedload's tables are current, a run does not lock fedload.runs: a long report reading it (which
    would make an ALTER TABLE wait) delays no sync."""
    await sync(federation.config(), "hub1")
    cluster = federation.cluster
    report = "BEGIN; SELECT count(*) FROM fedload.runs; SELECT pg_sleep(30); COMMIT;"
    argv = [cluster.install.tool("psql"), "-X", "-h", cluster.host, "-p", str(cluster.port), "-U", "postgres"]
    reader = await asyncio.create_subprocess_exec(
        *argv, "-d", federation.superhub, "-c", report, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        holding = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(30)%' AND pid <> pg_backend_pid()"
        deadline = time.monotonic() + 10
        while federation.superhub_int(holding) == 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - polls the server
            await asyncio.sleep(0.05)
        started = time.monotonic()
        assert [r.outcome for r in await sync(federation.config(), "hub1", "hub2")] == [Outcome.SUCCESS] * 2
        assert time.monotonic() - started < 20  # generous: the report runs for 30 s
        assert reader.returncode is None  # the report was still running all along
    finally:
        await end_process(reader)


_ANALYZED = (
    "SELECT string_agg(DISTINCT tablename, ',' ORDER BY tablename) FROM pg_stats WHERE schemaname = 'fedload_parts'"
)


@pytest.mark.parametrize("analyze", ["after_swap", "autovacuum"])
async def test_analyze_after_the_swap_or_leave_it_to_autovacuum(federation: Federation, analyze: str) -> None:
    """By default a run gathers its new partitions' statistics after the swap; `analyze = "autovacuum"` skips the
    phase and leaves them to autovacuum."""
    config = federation.config()
    config = config.model_copy(update={"superhub": config.superhub.model_copy(update={"analyze": analyze})})
    phases: set[str] = set()
    runs = await sync_feeders(config, ["hub1"], lambda progress: phases.add(progress.phase))
    assert [r.outcome for r in runs] == [Outcome.SUCCESS], [r.error for r in runs]
    analyzed = federation.superhub_sql(_ANALYZED)
    if analyze == "after_swap":
        assert "analyze" in phases
        assert analyzed == "public.contexts__hub1,public.hosts__hub1"
    else:
        assert "analyze" not in phases
        counts = "SELECT sum(analyze_count) FROM pg_stat_user_tables WHERE schemaname = 'fedload_parts'"
        assert federation.superhub_int(counts) == 0


async def test_partitions_take_the_parents_statistics_targets(federation: Federation) -> None:
    """A parent column's statistics target (ALTER COLUMN ... SET STATISTICS) holds for the partitions fedload makes,
    which PostgreSQL would not pass on: 0 leaves the column out of their ANALYZE."""
    assert [r.outcome for r in await sync(federation.config(), "hub1")] == [Outcome.SUCCESS]  # the parents exist
    federation.superhub_sql(
        "ALTER TABLE public.contexts ALTER COLUMN tags SET STATISTICS 0, ALTER COLUMN contextname SET STATISTICS 7"
    )
    assert [r.outcome for r in await sync(federation.config(), "hub1")] == [Outcome.SUCCESS]
    targets = (
        "SELECT string_agg(attname || '=' || attstattarget, ',' ORDER BY attname) FROM pg_attribute "
        "WHERE attrelid = 'fedload_parts.\"public.contexts__hub1\"'::regclass AND attname IN ('tags', 'contextname')"
    )
    assert federation.superhub_sql(targets) == "contextname=7,tags=0"
    analyzed = "SELECT string_agg(attname, ',' ORDER BY attname) FROM pg_stats WHERE tablename = '{}'"
    assert federation.superhub_sql(analyzed.format("public.contexts__hub1")) == "contextname,hostkey,hub_id,score"
