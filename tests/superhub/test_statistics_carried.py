"""Statistics carried from the feeders (PostgreSQL 18 at both ends) instead of an ANALYZE on the superhub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from fedload.config import Config, parse_config
from fedload.localpg import LocalCluster, PgInstall, find_installs
from fedload.results import Outcome
from tests.support.federation import new_database, psql_int, sync, write_script

SCHEMA = """
CREATE TYPE public.hoststate AS ENUM ('up', 'down', 'gone');
CREATE TABLE public.__hosts (hostkey text NOT NULL, hostname text, ipaddress text, site text DEFAULT 'unknown',
    firstreporttimestamp timestamptz, lastreporttimestamp timestamptz, state hoststate, "Seen Count" bigint,
    PRIMARY KEY (hostkey));
CREATE TABLE public.__contexts (hostkey text NOT NULL, contextname text NOT NULL, metatags text[],
    changetimestamp timestamptz, score int);
"""
DATA = """
INSERT INTO __hosts SELECT 'SHA=' || md5('{hub}:' || h), 'host-' || h, '10.{hub}.0.' || (h % 250),
    (ARRAY['eu-west', 'us-east', 'ap-south'])[1 + h % 3], now() - h * interval '1 day', now() - h * interval '1 s',
    (ARRAY['up', 'up', 'down', 'gone'])[1 + h % 4]::hoststate, h % 17
FROM generate_series(1, {hosts}) h;
INSERT INTO __contexts SELECT 'SHA=' || md5('{hub}:' || h), (ARRAY['linux', 'debian_12', 'any', 'Hr12'])[1 + c % 4]
    || '_' || (c % 7), CASE WHEN c % 5 = 0 THEN NULL ELSE ARRAY['source=agent', 'tag' || (c % 3)] END,
    now() + c * interval '1 s', CASE WHEN c % 4 = 0 THEN NULL ELSE c % 50 END
FROM generate_series(1, {hosts}) h, generate_series(1, 30) c;
CREATE INDEX __contexts_lower ON __contexts (lower(contextname));  -- the feeder's own: its statistics set aside
ANALYZE;
"""
TABLES = ("__hosts", "__contexts")
STATS = (
    "null_frac, avg_width, n_distinct, most_common_vals::text, most_common_freqs::text, histogram_bounds::text, "
    "correlation, most_common_elems::text, most_common_elem_freqs::text, elem_count_histogram::text"
)
REPORTS = (  # like the bench's: a join of hosts and contexts with a filter, a count by feeder, a host's row
    "SELECT h.site, count(*) FROM __hosts h JOIN __contexts c ON c.hub_id = h.hub_id AND c.hostkey = h.hostkey "
    "WHERE c.contextname LIKE 'linux%' AND h.site = 'eu-west' GROUP BY h.site",
    "SELECT hub_id, count(*) FROM __contexts GROUP BY hub_id",
    "SELECT * FROM __hosts WHERE hub_id = 2 AND hostkey = 'SHA=' || md5('2:7')",
    "SELECT hostname FROM __hosts h WHERE site = 'us-east' AND EXISTS "
    "(SELECT FROM __contexts c WHERE c.hostkey = h.hostkey AND c.score < 3)",
)
PARTS_SIZES = (  # what the planner reads of a partition's size (all-visible pages: for index-only scans)
    "SELECT string_agg(concat_ws(' ', relname, relpages, reltuples, CASE WHEN relhasindex THEN relallvisible END), "
    "', ' ORDER BY relname) "
    "FROM pg_class WHERE relnamespace = 'fedload_parts'::regnamespace"
)
PARTS_TUPLES = "SELECT count(*), sum(reltuples) FROM pg_class WHERE relnamespace = 'fedload_parts'::regnamespace"
NO_AUTOVACUUM = """DO $$ DECLARE part regclass; BEGIN
    FOR part IN SELECT oid FROM pg_class WHERE relnamespace = 'fedload_parts'::regnamespace AND relkind = 'r' LOOP
        EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = off)', part);
    END LOOP; END $$"""


@pytest.fixture(scope="module")
def pg18(pg_install: PgInstall) -> Iterator[LocalCluster]:
    """A PostgreSQL 18 cluster for the feeders (and the superhub, unless a test brings another)."""
    cluster = LocalCluster(pg_install, name="stats18").start()
    yield cluster
    cluster.stop()


def federation(
    feeders: LocalCluster, hub: LocalCluster, tmp: Path, hub_schema: str = SCHEMA, **overrides: object
) -> tuple[Config, str]:
    """Two feeder databases on `feeders` (600 and 400 hosts, analyzed), a superhub database on `hub` (its
    parents from `hub_schema`, configured as `public.__*`, a pattern that the feeders' index names match too); the
    configuration (pg_dump of `feeders`' install) and the superhub's database."""
    superhub = new_database(hub, "stats_hub")
    schema = tmp / "schema.sql"
    schema.write_text(hub_schema)
    feeder_dbs = {
        f"hub{i}": new_database(feeders, f"stats_f{i}", SCHEMA + DATA.format(hub=i, hosts=n))
        for i, n in ((1, 600), (2, 400))
    }
    tmp.chmod(0o755)
    config = {
        "superhub": {"dsn": hub.dsn(superhub), "tables": ["public.__*"], "schema_file": str(schema)},
        "feeders": {
            name: {
                "key": i,
                "transport": "local",
                "database": feeders.conninfo(db),
                "pg_dump": feeders.install.tool("pg_dump"),
                **overrides,
            }
            for i, (name, db) in enumerate(feeder_dbs.items(), start=1)
        },
    }
    return parse_config(config), superhub


def analyzed(hub: LocalCluster, db: str, partition: str = "%") -> int:
    """How many times the feeders' partitions (those named like `partition`) have been analyzed (ANALYZE, VACUUM
    ANALYZE or autovacuum)."""
    sql = (
        "SELECT coalesce(sum(analyze_count + autoanalyze_count), 0) FROM pg_stat_user_tables "
        f"WHERE schemaname = 'fedload_parts' AND relname LIKE '{partition}'"
    )
    return psql_int(hub, sql, db)


def in_process(config: Config) -> Config:
    """`config` with its runs in this process (no workers), where the test captures their logs."""
    return config.model_copy(update={"superhub": config.superhub.model_copy(update={"worker_processes": 0})})


def feeder_database(config: Config, feeder: str) -> str:
    """The database name of a feeder (from its conninfo)."""
    return config.feeders[feeder].database.rsplit("dbname=", 1)[1]


def column_stats(cluster: LocalCluster, db: str, schema: str, table: str) -> dict[str, str]:
    """pg_stats of a table's columns, by column (psql's text of the row)."""
    rows = cluster.psql(
        f"SELECT attname, row({STATS})::text FROM pg_stats WHERE schemaname = '{schema}' AND tablename = '{table}'",
        dbname=db,
    )
    return dict(line.split("|", 1) for line in rows.splitlines())


def reloptions(hub: LocalCluster, db: str, partition: str) -> str:
    """A partition's storage parameters (psql's text; empty for none)."""
    return hub.psql(
        f"SELECT reloptions FROM pg_class WHERE oid = 'fedload_parts.\"{partition}\"'::regclass", dbname=db
    ).strip()


def partition_of(hub: LocalCluster, db: str, table: str, key: int) -> str:
    """The partition's name (in fedload_parts) of feeder key `key` of `table`."""
    sql = (
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        f"WHERE i.inhparent = 'public.{table}'::regclass "
        f"AND pg_get_expr(c.relpartbound, c.oid) = 'FOR VALUES IN ({key})'"
    )
    return hub.psql(sql, dbname=db).strip()


def plans(hub: LocalCluster, db: str) -> tuple[list[str], list[list[float]]]:
    """Each report's plan (EXPLAIN (COSTS OFF)), and the row estimates of its nodes."""
    shapes, estimates = [], []
    for query in REPORTS:
        shapes.append(hub.psql(f"EXPLAIN (COSTS OFF) {query}", dbname=db))
        plan = json.loads(hub.psql(f"EXPLAIN (FORMAT JSON) {query}", dbname=db))[0]["Plan"]
        estimates.append(list(_rows(plan)))
    return shapes, estimates


def _rows(plan: dict[str, object]) -> Iterator[float]:
    yield float(plan["Plan Rows"])  # type: ignore[arg-type]
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        yield from _rows(child)


@pytest.mark.pg_major(18)
@pytest.mark.parametrize("mode", ["copy", "inserts", "binary"])
async def test_partitions_get_the_feeders_statistics_and_the_plans_of_an_analyze(
    pg18: LocalCluster, tmp_path: Path, mode: str
) -> None:
    """On a superhub on 18 with pg_dump 18 feeders, the new partitions carry the feeders' statistics (the key's
    computed), no ANALYZE runs, and the reports plan as after an ANALYZE, with the same row estimates; in binary mode
    too (pg_dump --statistics-only in the psql session's snapshot)."""
    config, db = federation(pg18, pg18, tmp_path, dump_mode=mode)
    runs = await sync(config)
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 2, [r.error for r in runs]
    assert analyzed(pg18, db) == 0
    for key, feeder in enumerate(config.feeders, start=1):
        feeder_db = feeder_database(config, feeder)
        for table in TABLES:
            partition = partition_of(pg18, db, table, key)
            carried = column_stats(pg18, db, "fedload_parts", partition)
            rows = psql_int(pg18, f"SELECT count(*) FROM {table} WHERE hub_id = {key}", db)
            threshold = f"autovacuum_analyze_threshold={rows + 50}"
            assert reloptions(pg18, db, partition) == f"{{autovacuum_analyze_scale_factor=0,{threshold}}}"
            assert carried.pop("hub_id") == f"(0,4,1,{{{key}}},{{1}},,1,,,)"
            assert carried == column_stats(pg18, feeder_db, "public", table), (key, table)
    carried_plans, carried_sizes = plans(pg18, db), pg18.psql(PARTS_SIZES, dbname=db)
    partitions = ", ".join(f'fedload_parts."{partition_of(pg18, db, t, k)}"' for t in TABLES for k in (1, 2))
    pg18.psql(f"ANALYZE {partitions}", dbname=db)
    assert analyzed(pg18, db) == 4
    assert plans(pg18, db) == carried_plans
    assert pg18.psql(PARTS_SIZES, dbname=db) == carried_sizes


HOSTILE = {
    "another function": "SELECT * FROM pg_catalog.pg_clear_relation_stats('public', '__hosts');",
    "another function of that name": "SELECT * FROM public.pg_restore_relation_stats('schemaname', 'public', "
    "'relname', '__hosts', 'relpages', '1'::integer);",
    "a table not the feeder's": "SELECT * FROM pg_catalog.pg_restore_relation_stats('schemaname', 'fedload_parts', "
    "'relname', 'public.__hosts__hub2', 'relpages', '1'::integer, 'reltuples', '1e9'::real);",
    "a non-literal argument": "SELECT * FROM pg_catalog.pg_restore_attribute_stats('schemaname', 'public', "
    "'relname', '__hosts', 'attname', 'site', 'inherited', 'f'::boolean, 'null_frac', 0.5 + 0.5);",
    "a subquery": "SELECT * FROM pg_catalog.pg_restore_attribute_stats('schemaname', 'public', 'relname', "
    "'__hosts', 'attname', (SELECT 'site'), 'inherited', 'f'::boolean, 'null_frac', '1'::real);",
    "an argument off the allowlist": "SELECT * FROM pg_catalog.pg_restore_relation_stats('schemaname', 'public', "
    "'relname', '__hosts', 'relpages', '1'::integer, 'stakind1', '1'::integer);",
    "a relname past 63 bytes": "SELECT * FROM pg_catalog.pg_restore_relation_stats('schemaname', 'public', "
    f"'relname', '{'n' * 64}', 'relpages', '1'::integer);",  # no relation's: it would be set aside
}


@pytest.mark.pg_major(18)
@pytest.mark.parametrize(
    ("hostile", "mode"),
    [(hostile, "copy") for hostile in HOSTILE] + [("a table not the feeder's", "binary"), ("a subquery", "binary")],
)
async def test_a_hostile_statistics_call_rejects_the_dump(
    pg18: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostile: str, mode: str
) -> None:
    """A statistics call other than pg_dump's (another function or table, a non-literal or a subquery, an
    argument fedload does not know) rejects the dump: the run fails, the old data and statistics stay; in binary
    mode too, where the calls come in the stream's statistics section."""
    config, db = federation(pg18, pg18, tmp_path, dump_mode=mode)
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    pg18.psql(NO_AUTOVACUUM, dbname=db)  # its VACUUM re-estimates reltuples, which this test reads as the statistics
    before = pg18.psql(PARTS_TUPLES, dbname=db)
    rows = psql_int(pg18, "SELECT count(*) FROM __contexts", db)
    feeder_db = feeder_database(config, "hub1")
    pg18.psql("INSERT INTO __contexts (hostkey, contextname) VALUES ('new', 'new')", dbname=feeder_db)
    pg_dump = pg18.install.tool("pg_dump")
    script = write_script(
        tmp_path / "pg_dump",
        f'"{pg_dump}" "$@" || exit $?\n[ "$1" = --version ] || printf "%s\\n" "$HOSTILE"\n',
    )
    (tmp_path / "psql").symlink_to(pg18.install.tool("psql"))  # binary mode's psql: beside pg_dump
    hub1 = config.feeders["hub1"].model_copy(update={"pg_dump": script})
    config = config.model_copy(update={"feeders": {"hub1": hub1}})
    monkeypatch.setenv("HOSTILE", HOSTILE[hostile])
    (run,) = await sync(config, "hub1")
    assert run.outcome == Outcome.FAILED
    assert any(words in (run.error or "") for words in ("statistics call", "does not accept", "not its own")), run.error
    assert psql_int(pg18, "SELECT count(*) FROM __contexts", db) == rows
    assert pg18.psql(PARTS_TUPLES, dbname=db) == before


@pytest.mark.pg_major(18)
@pytest.mark.parametrize(
    ("feeder_major", "superhub_major", "mode"),
    [(18, 15, "copy"), (18, 17, "copy"), (15, 18, "copy"), (18, 15, "binary")],
)
async def test_an_older_end_analyzes_as_before(
    pg18: LocalCluster, tmp_path: Path, feeder_major: int, superhub_major: int, mode: str
) -> None:
    """A superhub on 15 or 17 does not ask the pg_dump 18 agents for statistics (in binary mode neither), and a
    pg_dump 15 agent cannot send any to an 18 superhub: the new partitions are ANALYZEd, as before."""
    older = min(feeder_major, superhub_major)
    install = find_installs().get(older)
    if install is None:
        pytest.skip(f"PostgreSQL {older} binaries not installed")
    other = LocalCluster(install, name=f"stats{older}").start()
    feeders, hub = (pg18, other) if feeder_major == 18 else (other, pg18)
    try:
        config, db = federation(feeders, hub, tmp_path, dump_mode=mode)
        with capture_logs() as logs:
            runs = await sync(in_process(config))
        assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 2, [r.error for r in runs]
        assert analyzed(hub, db) == 4
        reasons = [e.get("reason") for e in logs if str(e["event"]).startswith("statistics.")]
        assert reasons == ([] if superhub_major < 18 else ["the feeder sent none"] * 4)  # not asked; none sent
    finally:
        other.stop()


DRIFTED = SCHEMA.replace("ipaddress text,", "ip text, uptime int,")
REMAP = """
[tables."public.__hosts"]
rename = { ipaddress = "ip" }
"""


@pytest.mark.pg_major(18)
async def test_drift_and_remap_analyze_only_the_columns_without_statistics(pg18: LocalCluster, tmp_path: Path) -> None:
    """A renamed column (remap) gets the feeder's statistics under its superhub name; a column the feeders lack
    is the only one ANALYZEd (and the key column is computed, not analyzed)."""
    remap = tmp_path / "remap.toml"
    remap.write_text(REMAP)
    config, db = federation(pg18, pg18, tmp_path, DRIFTED, remap=str(remap))
    with capture_logs() as logs:
        runs = await sync(in_process(config))
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 2, [r.error for r in runs]
    done = sorted((e["table"], tuple(e["analyze_columns"])) for e in logs if e["event"] == "statistics.carried")
    assert done == [("public.__contexts", ())] * 2 + [("public.__hosts", ("uptime",))] * 2
    assert analyzed(pg18, db, "public.__contexts%") == 0
    assert analyzed(pg18, db, "public.__hosts%") == 2
    for key, feeder in enumerate(config.feeders, start=1):
        carried = column_stats(pg18, db, "fedload_parts", partition_of(pg18, db, "__hosts", key))
        assert reloptions(pg18, db, partition_of(pg18, db, "__hosts", key)) == ""  # analyzed: autovacuum as always
        sent = column_stats(pg18, feeder_database(config, feeder), "public", "__hosts")
        assert carried.pop("ip") == sent.pop("ipaddress")
        assert carried.pop("uptime") == "(1,4,0,,,,,,,)"  # analyzed here: all NULL
        assert carried.pop("hub_id") == f"(0,4,1,{{{key}}},{{1}},,1,,,)"
        assert carried == sent


@pytest.mark.pg_major(18)
async def test_statistics_older_than_the_data_are_not_carried(pg18: LocalCluster, tmp_path: Path) -> None:
    """A feeder table whose statistics count far fewer rows than its dump has (not analyzed since it grew) is
    ANALYZEd on the superhub; the other tables keep the feeder's statistics."""
    config, db = federation(pg18, pg18, tmp_path)
    pg18.psql(
        "ALTER TABLE __contexts SET (autovacuum_enabled = off); "
        "INSERT INTO __contexts (hostkey, contextname) SELECT 'new', 'new' || g FROM generate_series(1, 5000) g",
        dbname=feeder_database(config, "hub2"),
    )
    runs = await sync(config)
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 2, [r.error for r in runs]
    assert analyzed(pg18, db, partition_of(pg18, db, "__contexts", 2)) == 1
    assert analyzed(pg18, db) == 1


# `fedload sync`, recording each module a forked worker (named fedload-worker once forked) imports: after the fork.
_WORKER_IMPORTS = """
import os, sys

def _after_the_fork(event, args):
    if event == "import":
        with open("/proc/self/comm") as comm:
            if comm.read().strip() == "fedload-worker":
                with open(os.environ["WORKER_IMPORTS"], "a") as out:
                    out.write(f"{os.getpid()} {args[0]}\\n")

sys.addaudithook(_after_the_fork)
sys.argv[0] = "fedload"
from fedload.__main__ import run
run()
"""


def _sync_toml(config: Config, mode: str) -> str:
    """`config` (from `federation`) as a fedload.toml with two worker processes, its feeders in `mode`."""
    superhub = config.superhub
    lines = ["[superhub]", f"dsn = {json.dumps(superhub.dsn)}", 'tables = ["public.__*"]']
    lines += [f"schema_file = {json.dumps(str(superhub.schema_file))}", "worker_processes = 2"]
    for name, feeder in config.feeders.items():
        lines += [f"[feeders.{name}]", f"key = {feeder.key}", 'transport = "local"', f'dump_mode = "{mode}"']
        lines += [f"database = {json.dumps(feeder.database)}", f"pg_dump = {json.dumps(feeder.pg_dump)}"]
    return "\n".join(lines) + "\n"


@pytest.mark.pg_major(18)
@pytest.mark.parametrize("mode", ["copy", "binary"])
def test_forked_workers_carry_statistics_without_importing_anything(
    pg18: LocalCluster, tmp_path: Path, mode: str
) -> None:
    """`fedload sync` imports what its runs need (pglast for the statistics they carry) before it forks its
    workers: the workers carry the feeders' statistics and import no module of their own after the fork."""
    config, db = federation(pg18, pg18, tmp_path)
    path, imports = tmp_path / "fedload.toml", tmp_path / "worker-imports"
    path.write_text(_sync_toml(config, mode))
    argv = [sys.executable, "-c", _WORKER_IMPORTS, "sync", "--json", "--config", str(path)]
    env = {**os.environ, "WORKER_IMPORTS": str(imports)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [run["outcome"] for run in json.loads(done.stdout)] == ["success"] * 2
    assert analyzed(pg18, db) == 0  # the runs did carry statistics
    assert not imports.exists(), imports.read_text()[:2000]


def _hostname_call(**stats: str) -> str:
    """A pg_restore_attribute_stats call in pg_dump's shape for __hosts.hostname, with `stats` (name: value)."""
    types = {"avg_width": "integer", "most_common_vals": "text", "most_common_freqs": "real[]"}
    args = ", ".join(f"'{name}', '{value}'::{types.get(name, 'real')}" for name, value in stats.items())
    return (
        "SELECT * FROM pg_catalog.pg_restore_attribute_stats('version', '180000'::integer, 'schemaname', 'public', "
        f"'relname', '__hosts', 'attname', 'hostname', 'inherited', 'f'::boolean, {args});\n"
    )


def _huge_call() -> str:
    """The issue's: 4 million most common values (about 60 MiB), well-formed."""
    values = ",".join(f"host-{i}" for i in range(4_000_000))
    return _hostname_call(
        null_frac="0",
        avg_width="12",
        n_distinct="-1",
        most_common_vals=f"{{{values}}}",
        most_common_freqs="{" + ",".join(["0"] * 4_000_000) + "}",
    )


BEYOND_ANALYZE = {  # (call, words of the reason, the statistics target of the superhub's __hosts.hostname)
    "4 million values": (_huge_call, "longer than ANALYZE's could be", None),
    "an avg_width of 10^9": (
        lambda: _hostname_call(avg_width="1000000000", most_common_vals="{host-1}", most_common_freqs="{0.002}"),
        "avg_width 1000000000",
        None,
    ),
    "a NaN null_frac": (  # NaN is not outside [0, 1] to a comparison: `not 0 <= x <= 1` refuses it
        lambda: _hostname_call(null_frac="NaN", most_common_vals="{host-1}", most_common_freqs="{0.002}"),
        "null_frac NaN is not in [0, 1]",
        None,
    ),
    "a NaN frequency": (
        lambda: _hostname_call(null_frac="0", most_common_vals="{host-1}", most_common_freqs="{NaN}"),
        "most_common_freqs has a frequency that is not in [0, 1]",
        None,
    ),
    "frequencies past 1": (
        lambda: _hostname_call(null_frac="0", most_common_vals="{host-1,host-2}", most_common_freqs="{0.6,0.6}"),
        "add up",
        None,
    ),
    "more values than the target": (
        lambda: _hostname_call(
            most_common_vals="{" + ",".join(f"host-{i}" for i in range(1, 21)) + "}",
            most_common_freqs="{" + ",".join(["0.01"] * 20) + "}",
        ),
        "at most 10 entries",
        10,
    ),
}


def _hostile_pg_dump(tmp: Path, pg18: LocalCluster, call: str) -> str:
    """A pg_dump that writes the real one's output, then `call` (from a file: it may be too long for a variable)."""
    extra = tmp / "extra.sql"
    extra.write_text(call)
    (tmp / "psql").symlink_to(pg18.install.tool("psql"))  # binary mode's psql: beside pg_dump
    body = f'"{pg18.install.tool("pg_dump")}" "$@" || exit $?\n[ "$1" = --version ] || cat "{extra}"\n'
    return write_script(tmp / "pg_dump", body)


def _clear_hostname_statistics(feeder: LocalCluster, db: str) -> None:
    """__hosts.hostname without statistics on the feeder, and kept so: autovacuum's ANALYZE would give pg_dump
    them again, and the hostile call would then be the column's second (a refused dump)."""
    feeder.psql(
        "ALTER TABLE public.__hosts SET (autovacuum_enabled = off); "
        "SELECT pg_clear_attribute_stats('public', '__hosts', 'hostname', false)",
        dbname=db,
    )


def _hub_column(hub: LocalCluster, db: str, key: int, column: str, stats: str) -> str:
    """`stats` (pg_stats' columns) of a column of feeder `key`'s partition of __hosts."""
    partition = partition_of(hub, db, "__hosts", key)
    sql = f"SELECT {stats} FROM pg_stats WHERE schemaname = 'fedload_parts' AND tablename = '{partition}' "
    return hub.psql(sql + f"AND attname = '{column}'", dbname=db).strip()


@pytest.mark.pg_major(18)
@pytest.mark.parametrize(("beyond", "mode"), [(b, "copy") for b in BEYOND_ANALYZE] + [("frequencies past 1", "binary")])
async def test_statistics_beyond_analyze_are_dropped_and_the_table_analyzed(
    pg18: LocalCluster, tmp_path: Path, beyond: str, mode: str
) -> None:
    """A well-formed statistics call that ANALYZE could not have written on the superhub (a 4-million-entry list,
    an avg_width of 10^9, frequencies adding up past 1, more values than the column's statistics target on the
    superhub's parent, whatever the feeder's) is
    dropped: the run succeeds, the table is ANALYZEd instead, logged once naming feeder, table and reason, and no
    other feeder's partition changes."""
    make, words, target = BEYOND_ANALYZE[beyond]
    config, db = federation(pg18, pg18, tmp_path, dump_mode=mode)
    assert [r.outcome for r in await sync(config)] == [Outcome.SUCCESS] * 2
    pg18.psql(NO_AUTOVACUUM, dbname=db)
    other = column_stats(pg18, db, "fedload_parts", partition_of(pg18, db, "__hosts", 2))
    before = analyzed(pg18, db, partition_of(pg18, db, "__hosts", 1))
    feeder_db = feeder_database(config, "hub1")
    _clear_hostname_statistics(pg18, feeder_db)
    if target is not None:
        pg18.psql(f"ALTER TABLE public.__hosts ALTER COLUMN hostname SET STATISTICS {target}", dbname=db)
    hub1 = config.feeders["hub1"].model_copy(update={"pg_dump": _hostile_pg_dump(tmp_path, pg18, make())})
    config = in_process(config.model_copy(update={"feeders": {"hub1": hub1}}))
    with capture_logs() as logs:
        (run,) = await sync(config, "hub1")
    assert run.outcome == Outcome.SUCCESS, run.error
    refused = [e for e in logs if e["event"] == "statistics.refused" and e["table"] == "public.__hosts"]
    assert len(refused) == 1, refused
    assert refused[0]["feeder"] == "hub1"
    assert words in refused[0]["reason"], refused[0]["reason"]
    assert analyzed(pg18, db, partition_of(pg18, db, "__hosts", 1)) == before + 1
    values = _hub_column(pg18, db, 1, "hostname", "coalesce(cardinality(most_common_vals::text::text[]), 0), avg_width")
    count, width = map(int, values.split("|"))
    assert count <= (target or 100), values  # ANALYZE's: hostnames are all distinct, 'host-N'
    assert width < 20, values
    assert column_stats(pg18, db, "fedload_parts", partition_of(pg18, db, "__hosts", 2)) == other


@pytest.mark.pg_major(18)
async def test_carried_statistics_reach_only_the_feeders_new_partition(pg18: LocalCluster, tmp_path: Path) -> None:
    """A call within ANALYZE's bounds, for the feeder's own table, lands on that feeder's new partition only:
    fedload names the staging table in its own call, whatever relation the dump's names; no other feeder's partition
    and not the parent gain or change statistics."""
    config, db = federation(pg18, pg18, tmp_path)
    assert [r.outcome for r in await sync(config)] == [Outcome.SUCCESS] * 2
    pg18.psql(NO_AUTOVACUUM, dbname=db)
    other = column_stats(pg18, db, "fedload_parts", partition_of(pg18, db, "__hosts", 2))
    parent = column_stats(pg18, db, "public", "__hosts")
    feeder_db = feeder_database(config, "hub1")
    # autovacuum's ANALYZE of the feeder's table would give the cleared statistics back (seen under CI's load)
    pg18.psql("ALTER TABLE public.__hosts SET (autovacuum_enabled = off)", dbname=feeder_db)
    _clear_hostname_statistics(pg18, feeder_db)
    call = _hostname_call(
        null_frac="0", avg_width="9", n_distinct="-1", most_common_vals="{planted}", most_common_freqs="{0.5}"
    )
    hub1 = config.feeders["hub1"].model_copy(update={"pg_dump": _hostile_pg_dump(tmp_path, pg18, call)})
    (run,) = await sync(config.model_copy(update={"feeders": {"hub1": hub1}}), "hub1")
    assert run.outcome == Outcome.SUCCESS, run.error
    assert _hub_column(pg18, db, 1, "hostname", "most_common_vals::text") == "{planted}"
    assert column_stats(pg18, db, "fedload_parts", partition_of(pg18, db, "__hosts", 2)) == other
    assert column_stats(pg18, db, "public", "__hosts") == parent
