"""Unchanged tables (#46): a table whose content digest, computed in the dump's snapshot, equals the one the superhub
holds is not sent and its partition stays; any change to it, or to the superhub's side of its load, sends it again.

Each test runs in binary mode (the digests in the psql session that copies the tables) and, where the mode matters
and the test is cheap, in copy and inserts modes (the digests in a psql session whose exported snapshot pg_dump
reads); tests of the superhub's side alone run in binary mode only."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedload.commands.admin import remove_feeder
from fedload.commands.status import read_status
from fedload.config import Config, parse_config
from fedload.errors import ErrorKind
from fedload.localpg import LocalCluster
from fedload.names import TablePattern
from fedload.results import FeederRun, Outcome
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import sync_feeder
from tests.support.federation import write_script

FEEDER_SCHEMA = """
CREATE TABLE t (id int NOT NULL, v text, n numeric, big text);
CREATE TABLE u (id int NOT NULL, v text);
INSERT INTO u SELECT i, 'u' || i FROM generate_series(1, 50) AS i;
"""
SUPERHUB_SCHEMA = """
CREATE TABLE t (hub_id int NOT NULL, id int NOT NULL, v text, n numeric, big text) PARTITION BY LIST (hub_id);
CREATE TABLE u (hub_id int NOT NULL, id int NOT NULL, v text) PARTITION BY LIST (hub_id);
"""
# Row 0 holds v NULL or '' and n 1 or 1.0 (the changes toggle them); row 1 a large TOASTed value.
BIG = "(SELECT string_agg(md5(i::text || '{seed}'), '') FROM generate_series(1, 4000) AS i)"
REFILL = f"""
INSERT INTO t VALUES (0, NULL, 1, NULL), (1, 'one', 2.5, {BIG});
INSERT INTO t SELECT i, 'r{{seed}}-' || i, i * 1.5, NULL FROM generate_series(2, 6) AS i;
"""
CONTENT = {"t": "id, v, n, big", "u": "id, v"}
TYPES = ("text", "character varying(50)", "character varying(60)")
_seeds = itertools.count()


MODES = ("binary", "copy", "inserts")
BINARY_ONLY = pytest.mark.parametrize("pair", ["binary"], indirect=True)  # the superhub's side: the same in every mode
PG_DUMP_MODES = pytest.mark.parametrize("pair", ["copy", "inserts"], indirect=True)


@dataclass
class Pair:
    """A feeder database and a superhub database on one cluster, and the configuration that syncs them."""

    cluster: LocalCluster
    feeder_db: str
    superhub_db: str
    settings: dict[str, Any]

    def config(self, *, superhub_settings: dict[str, Any] | None = None, **more: Any) -> Config:
        """The feeder `f` (key 1) in the pair's dump mode, with `more` settings (and the superhub's)."""
        feeder = {**self.settings, **more}
        superhub = {"dsn": self.cluster.dsn(self.superhub_db), "tables": ["public.t", "public.u"]}
        superhub |= superhub_settings or {}
        return parse_config({"superhub": superhub, "feeders": {"f": feeder}})

    def feeder(self, sql: str) -> str:
        return self.cluster.psql(sql, dbname=self.feeder_db)

    def superhub(self, sql: str) -> str:
        return self.cluster.psql(sql, dbname=self.superhub_db)

    def sync(self, *, but: str = "true", **more: Any) -> FeederRun:
        """One run of feeder `f`, succeeded, its superhub content equal to the feeder's rows where `but` holds."""
        run = asyncio.run(sync_feeder(feeder_job(self.config(**more), "f")))
        assert run.outcome == Outcome.SUCCESS, run.error
        for table, columns in CONTENT.items():
            rows = f"SELECT md5(coalesce(string_agg(ROW({columns})::text, E'\\n' ORDER BY id), '-')) FROM {table}"
            assert self.superhub(rows + " WHERE hub_id = 1") == self.feeder(f"{rows} WHERE {but}"), table
        return run


@pytest.fixture(scope="module", params=MODES)
def pair(cluster: LocalCluster, request: pytest.FixtureRequest) -> Pair:
    """The module's pair of databases for a dump mode, table t filled, synced once; the feeder's tables not
    counted."""
    return make_pair(cluster, request.param)


def make_pair(cluster: LocalCluster, mode: str, suffix: str = "") -> Pair:
    """A pair of databases on `cluster` for a dump mode (named with `suffix` too), table t filled, synced once; the
    feeder's tables not counted."""
    feeder_db, superhub_db = f"unchangedfeeder_{mode}{suffix}", f"unchangedhub_{mode}{suffix}"
    cluster.psql(f"CREATE DATABASE {feeder_db}")
    cluster.psql(f"CREATE DATABASE {superhub_db}")
    cluster.psql(FEEDER_SCHEMA + REFILL.format(seed=next(_seeds)), dbname=feeder_db)
    cluster.psql(SUPERHUB_SCHEMA, dbname=superhub_db)
    # The table's counters, which may say "changed for sure", stand still: the digest alone decides (a test below
    # turns them on).
    cluster.psql(f"ALTER DATABASE {feeder_db} SET track_counts = off")
    settings_ = {
        "key": 1,
        "transport": "local",
        "database": cluster.conninfo(feeder_db),
        "pg_dump": cluster.install.tool("pg_dump"),
        "dump_mode": mode,
        "skip_unchanged_min_rows": 0,  # the tables are small: digests asked for all the same (a test below: not)
    }
    made = Pair(cluster, feeder_db, superhub_db, settings_)
    made.sync()
    return made


def kept(run: FeederRun) -> set[str]:
    return set(run.unchanged_tables)


# Each makes one change to table t (u is never touched); `{pos}` is a position in row 1's large value, `{seed}` a
# new seed, `{type}` a type for column v other than its present one.
CHANGES = {
    "insert": "INSERT INTO t SELECT max(id) + 1, 'new', 7, NULL FROM t",
    "update": "UPDATE t SET v = v || 'x' WHERE id = (SELECT max(id) FROM t)",
    "null to ''": "UPDATE t SET v = CASE WHEN v IS NULL THEN '' ELSE NULL END WHERE id = 0",
    "1 to 1.0": "UPDATE t SET n = CASE WHEN n::text = '1' THEN 1.0 ELSE 1 END WHERE id = 0",
    "inside a TOASTed value": (
        "UPDATE t SET big = overlay(big PLACING CASE WHEN substr(big, {pos}, 1) = 'x' THEN 'y' ELSE 'x' END "
        "FROM {pos} FOR 1) WHERE id = 1"
    ),
    "delete": "DELETE FROM t WHERE id = (SELECT max(id) FROM t WHERE id > 1)",
    "truncate and refill": "TRUNCATE t; " + REFILL,
    "alter a column": "ALTER TABLE t ALTER COLUMN v TYPE {type}",
    "none": "",
}
# The agent, its digest forced to one value whatever the table holds: the sabotage test's `agent_command`.
LIAR = """
import sys
from fedload.__main__ import main
from fedload.feeder import digest
from fedload.feeder import delta_plan
parse_digest = digest.parse_digest
digest.parse_digest = lambda *args: digest.TableDigest(parse_digest(*args).rows, "0" * 64)
delta_plan.dirty_buckets = lambda *counted, **how: []  # and counted against its delta state, no bucket changed
sys.exit(main())
"""
# The agent, writing to both tables once it has exported its snapshot, before pg_dump starts: the concurrent writer
# of the one-snapshot test, made deterministic (`{psql}`, `{dsn}`: the feeder's).
WRITER = """
import subprocess
import sys
from fedload.__main__ import main
from fedload.feeder.snapshot import SnapshotSession
export = SnapshotSession.export
def export_then_write(session):
    snapshot = export(session)
    sql = "INSERT INTO t VALUES (1000, 'late', 1, NULL); INSERT INTO u VALUES (1000, 'late')"
    subprocess.run([{psql!r}, "-X", "-q", "-d", {dsn!r}, "-c", sql], check=True)
    return snapshot
SnapshotSession.export = export_then_write
sys.exit(main())
"""
V_TYPE = "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 't'::regclass AND attname = 'v'"


def one_round(pair: Pair, change: str, pos: int, **more: Any) -> None:
    """Make `change` to t on the feeder, sync: t is sent unless nothing changed, u is kept; the content is equal."""
    if change == "delete" and pair.feeder("SELECT count(*) FROM t WHERE id > 1").strip() == "0":
        pair.feeder(CHANGES["insert"])  # a row to delete, synced first
        pair.sync(**more)
    other = TYPES[(TYPES.index(pair.feeder(V_TYPE).strip()) + 1) % len(TYPES)]  # varchar(50) to (60): typmod only
    if sql := CHANGES[change].format(pos=pos, seed=next(_seeds), type=other):
        pair.feeder(sql)
    else:  # a change the table's file node showed (TRUNCATE, a rewrite) sent it without a digest: one round to get it
        pair.sync(**more)
    run = pair.sync(**more)
    expected = {"public.t", "public.u"} if change == "none" else {"public.u"}
    assert kept(run) == expected, change


@settings(max_examples=1, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.permutations(list(CHANGES)), pos=st.integers(1, 4000 * 32))
def test_any_single_change_sends_the_table_and_none_keeps_it(pair: Pair, changes: list[str], pos: int) -> None:
    """Every kind of single change to a table, in any order, makes the next round send it (its content then equal
    on both sides); a round without a change keeps it; the untouched table is kept throughout."""
    pair.sync()  # the round before: digests of the present content stored
    for change in changes:
        one_round(pair, change, pos)


def test_the_suite_notices_a_digest_forced_equal(pair: Pair, tmp_path: Path) -> None:
    """Sabotage: an agent whose digest is the same whatever the content (and, where it counts a table against its
    delta state, finds no bucket changed) keeps a changed table, and the round's check (superhub content equal to
    the feeder's) fails; an honest agent's next round repairs it."""
    (tmp_path / "liar.py").write_text(LIAR)
    liar = write_script(tmp_path / "liar", f'exec {sys.executable} {tmp_path / "liar.py"} "$@"\n')
    pair.sync(agent_command=[liar])  # the liar's digest stored
    with pytest.raises(AssertionError):
        one_round(pair, "update", 1, agent_command=[liar])
    assert "public.t" not in kept(pair.sync())


@BINARY_ONLY
def test_a_change_on_the_superhub_side_voids_the_skip(pair: Pair) -> None:
    """A change of table u's parent on the superhub sends u again (t, whose parent did not change, stays kept), and
    so does the change back."""
    pair.sync()
    pair.superhub("ALTER TABLE u ALTER COLUMN v SET DEFAULT 'd'")
    try:
        assert kept(pair.sync()) == {"public.t"}
    finally:
        pair.superhub("ALTER TABLE u ALTER COLUMN v DROP DEFAULT")
    assert kept(pair.sync()) == {"public.t"}
    assert kept(pair.sync(skip_unchanged=False)) == set()


@BINARY_ONLY
def test_a_kept_partition_must_hold_the_digests_rows(pair: Pair) -> None:
    """A partition that lost a row on the superhub is not kept as unchanged: the run fails saying so, the digest is
    forgotten, and the next round sends the table."""
    pair.sync()
    pair.superhub("DELETE FROM t WHERE hub_id = 1 AND id = (SELECT max(id) FROM t WHERE hub_id = 1)")
    run = asyncio.run(sync_feeder(feeder_job(pair.config(), "f")))
    assert run.outcome == Outcome.FAILED
    assert "is unchanged with" in (run.error or "")
    assert "its digest is forgotten and the next run sends it" in (run.error or "")
    assert kept(pair.sync()) == {"public.u"}


@BINARY_ONLY
def test_a_failed_swap_records_no_digest(pair: Pair) -> None:
    """A run whose swap fails (a reader holds the parent past swap_max_wait_s) stores none of its digests: they are
    written in the swap's transaction. The next round sends the changed table again, then keeps it."""
    pair.sync()
    digests = "SELECT string_agg(digest || fingerprint, ',' ORDER BY table_name) FROM fedload.digests"
    before = pair.superhub(digests)
    pair.feeder(CHANGES["insert"])
    psql = [pair.cluster.install.tool("psql"), "-X", "-q", "-d", pair.cluster.conninfo(pair.superhub_db)]
    with subprocess.Popen(psql, stdin=subprocess.PIPE, text=True) as reader:
        assert reader.stdin is not None
        reader.stdin.write("BEGIN; LOCK TABLE t IN ACCESS SHARE MODE; SELECT pg_sleep(3);\n")
        reader.stdin.close()  # psql ends, and its lock with it, once the sleep is over
        time.sleep(0.5)
        hurried = {"swap_max_wait_s": 1.0, "swap_lock_timeout_s": 0.2}
        run = asyncio.run(sync_feeder(feeder_job(pair.config(superhub_settings=hurried), "f")))
    assert run.outcome == Outcome.FAILED
    assert pair.superhub(digests) == before
    assert kept(pair.sync()) == {"public.u"}
    assert kept(pair.sync()) == {"public.t", "public.u"}


@BINARY_ONLY
def test_a_failed_run_records_no_digest(pair: Pair) -> None:
    """A run that fails after the load (a row the superhub's CHECK refuses) changes no stored digest, and the next
    round sends the table."""
    pair.sync()
    digests = "SELECT string_agg(digest || fingerprint, ',' ORDER BY table_name) FROM fedload.digests"
    before = pair.superhub(digests)
    pair.superhub("ALTER TABLE t ADD CONSTRAINT small_n CHECK (n < 1000)")
    pair.feeder("INSERT INTO t VALUES (999, 'big n', 5000, NULL)")
    try:
        run = asyncio.run(sync_feeder(feeder_job(pair.config(), "f")))
        assert run.outcome == Outcome.FAILED
        assert pair.superhub(digests) == before
    finally:
        pair.feeder("DELETE FROM t WHERE id = 999")
        pair.superhub("ALTER TABLE t DROP CONSTRAINT small_n")
    assert kept(pair.sync()) == {"public.t", "public.u"}  # the digests before the failed run, still valid


def test_a_round_without_changes_sends_nothing(pair: Pair) -> None:
    """Nothing changed: both tables are kept, listed in the run's history and counted by status, their rows still
    reported."""
    pair.sync()  # the digests of the current content are stored
    run = pair.sync()
    assert kept(run) == {"public.t", "public.u"}
    assert run.rows == {"public.t": int(pair.feeder("SELECT count(*) FROM t")), "public.u": 50}  # held, not sent
    history = pair.superhub("SELECT unchanged_tables FROM fedload.runs ORDER BY id DESC LIMIT 1")
    assert history.strip() == '["public.t", "public.u"]'
    (status,) = asyncio.run(read_status(pair.config()))
    assert status.unchanged_tables == 2


def test_counters_that_moved_spare_the_content_digest(pair: Pair) -> None:
    """With track_counts on, a table that gets the content digest (a money column: its text follows lc_monetary)
    and whose counters moved is sent without computing it (stored empty); the next round computes it (counters
    still), and the one after keeps the table. Table u, proven by its tuples' identities, is kept throughout."""
    digest_of_t = "SELECT digest <> '' FROM fedload.digests WHERE table_name = 't'"
    pair.feeder("ALTER TABLE t ADD COLUMN cash money")
    pair.superhub("ALTER TABLE t ADD COLUMN cash money")
    pair.cluster.psql(f"ALTER DATABASE {pair.feeder_db} SET track_counts = on")
    try:
        rounds = [kept(pair.sync()) for _ in range(3)]  # the parent changed: counters, then the digest, then kept
        assert rounds == [{"public.u"}, {"public.u"}, {"public.t", "public.u"}], rounds
        pair.feeder(CHANGES["insert"])
        assert kept(pair.sync()) == {"public.u"}
        assert pair.superhub(digest_of_t).strip() == "f"
        assert kept(pair.sync()) == {"public.u"}
        assert pair.superhub(digest_of_t).strip() == "t"
        assert kept(pair.sync()) == {"public.t", "public.u"}
    finally:
        pair.cluster.psql(f"ALTER DATABASE {pair.feeder_db} SET track_counts = off")
        pair.feeder("ALTER TABLE t DROP COLUMN cash")
        pair.superhub("ALTER TABLE t DROP COLUMN cash")


def test_a_first_load_computes_the_identity_proof(pair: Pair) -> None:
    """A table the superhub holds no digest of (a new feeder or table, digests forgotten) gets its identity proof
    at its first load, which costs a fraction of its dump: the next round keeps it."""
    pair.superhub("DELETE FROM fedload.digests")
    digests = "SELECT string_agg(table_name || '=' || digest, ',' ORDER BY table_name) FROM fedload.digests"
    assert kept(pair.sync()) == set()
    computed = pair.superhub(digests).strip()
    assert "=," not in computed
    assert not computed.endswith("=")
    assert kept(pair.sync()) == {"public.t", "public.u"}


def test_a_renamed_enum_label_sends_the_table(cluster: LocalCluster) -> None:
    """End to end: a table whose enum column's label is renamed (no tuple written) is sent, with the new label,
    and the untouched table is kept; the next round keeps both."""
    made = make_pair(cluster, "binary", "_enum")
    made.feeder("CREATE TYPE mood AS ENUM ('calm', 'glad'); ALTER TABLE u ADD COLUMN m mood DEFAULT 'glad'")
    made.superhub("ALTER TABLE u ADD COLUMN m text")
    made.sync()
    assert kept(made.sync()) == {"public.t", "public.u"}
    made.feeder("ALTER TYPE mood RENAME VALUE 'glad' TO 'happy'")
    assert kept(made.sync()) == {"public.t"}
    assert made.superhub("SELECT DISTINCT m FROM u").strip() == "happy"
    assert kept(made.sync()) == {"public.t", "public.u"}


@PG_DUMP_MODES
def test_a_write_after_the_digests_reaches_no_table(pair: Pair, tmp_path: Path) -> None:
    """Rows committed between the digests and pg_dump's start reach neither the table kept (u) nor the one dumped
    (t, changed before the run): pg_dump reads the digests' snapshot. The next round sends both, with those rows."""
    pair.sync()
    (tmp_path / "writer.py").write_text(
        WRITER.format(psql=pair.cluster.install.tool("psql"), dsn=pair.settings["database"])
    )
    writer = write_script(tmp_path / "writer", f'exec {sys.executable} {tmp_path / "writer.py"} "$@"\n')
    pair.feeder(CHANGES["update"])
    try:
        assert kept(pair.sync(but="id <> 1000", agent_command=[writer])) == {"public.u"}
        assert kept(pair.sync()) == set()
    finally:
        pair.feeder("DELETE FROM t WHERE id = 1000; DELETE FROM u WHERE id = 1000")
    pair.sync()
    assert kept(pair.sync()) == {"public.t", "public.u"}


@BINARY_ONLY
def test_a_change_of_dump_mode_voids_the_skip(pair: Pair) -> None:
    """Digests stored in one dump mode are not asked about in another (the superhub loads other input: text,
    INSERTs or binary), either way; three rounds in a mode keep the tables again."""
    pair.sync()
    assert kept(pair.sync()) == {"public.t", "public.u"}
    assert kept(pair.sync(dump_mode="copy")) == set()
    assert kept(pair.sync()) == set()
    pair.sync()
    assert kept(pair.sync()) == {"public.t", "public.u"}


# The superhub's staging tables, as they are created: an event trigger logs each CREATE TABLE in fedload_stage.
STAGES_LOGGED = """
CREATE TABLE stages_created (name text);
CREATE FUNCTION log_stage() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO stages_created SELECT object_identity FROM pg_event_trigger_ddl_commands()
    WHERE schema_name = 'fedload_stage';
END $$;
CREATE EVENT TRIGGER stage_created ON ddl_command_end WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION log_stage();
"""
STAGES_UNLOGGED = "DROP EVENT TRIGGER stage_created; DROP FUNCTION log_stage(); DROP TABLE stages_created"


@pytest.mark.parametrize("pair", ["binary", "copy"], indirect=True)
def test_a_kept_table_gets_no_staging_table(pair: Pair) -> None:
    """Only the tables sent get a staging table: a round that keeps both tables creates none, one that sends the
    changed table and keeps the other creates one."""
    pair.sync()
    pair.sync()
    pair.superhub(STAGES_LOGGED)
    created = "SELECT count(*) FROM stages_created"
    try:
        assert kept(pair.sync()) == {"public.t", "public.u"}
        assert pair.superhub(created).strip() == "0"
        pair.feeder(CHANGES["insert"])
        assert kept(pair.sync()) == {"public.u"}
        assert pair.superhub(created).strip() == "1"
    finally:
        pair.superhub(STAGES_UNLOGGED)


@pytest.mark.pg_major(17, 18)
def test_pg_dump_of_each_major_reads_the_digests_snapshot(major_cluster: LocalCluster, pg_major: int) -> None:
    """In copy mode pg_dump 17 and 18 (with the statistics a superhub on 18 asks for, in the same snapshot) dump
    only the changed table, in the digests' snapshot; the unchanged one is kept."""
    made = make_pair(major_cluster, "copy", f"_pg{pg_major}")
    made.sync()
    assert kept(made.sync()) == {"public.t", "public.u"}
    made.feeder(CHANGES["insert"])
    assert kept(made.sync()) == {"public.u"}


# An agent older than copy mode's digests: it refuses --columns before writing any stream (argparse's exit 2).
OLD_AGENT = """case "$*" in
*--columns=*) echo "fedload agent dump: error: unrecognized arguments: --columns" >&2; exit 2;;
esac
echo "no dump here" >&2; exit 3
"""


@pytest.mark.parametrize("pair", ["copy"], indirect=True)
def test_an_agent_refusing_digests_is_told_apart(pair: Pair, tmp_path: Path) -> None:
    """A run whose agent refuses the digests' --columns fails saying to upgrade it or set skip_unchanged = false
    (the feeder's digests forgotten: an upgraded agent's first round sends every table); with skip_unchanged = false
    no --columns is sent."""
    pair.sync()
    old = write_script(tmp_path / "old-agent", OLD_AGENT)
    refused = asyncio.run(sync_feeder(feeder_job(pair.config(agent_command=[old]), "f")))
    assert refused.outcome == Outcome.FAILED
    assert "feeders.f.skip_unchanged = false" in (refused.error or "")
    assert "forgot the digests it held of feeder f" in (refused.error or "")
    plain = asyncio.run(sync_feeder(feeder_job(pair.config(agent_command=[old], skip_unchanged=False), "f")))
    assert "no dump here" in (plain.error or "")
    assert "skip_unchanged" not in (plain.error or "")
    rounds = [kept(pair.sync()) for _ in range(2)]  # none stored, then the identity proofs computed at once: kept
    assert rounds == [set(), {"public.t", "public.u"}], rounds


def test_a_feeder_below_the_floor_asks_no_digests(pair: Pair) -> None:
    """A feeder whose last load held fewer rows than skip_unchanged_min_rows asks for no digests (nothing is kept,
    however many rounds); at the floor it asks again, and a feeder whose last run kept a table keeps asking."""
    pair.sync()
    assert kept(pair.sync()) == {"public.t", "public.u"}  # kept a table: asks though below the floor
    rows = sum(int(pair.feeder(f"SELECT count(*) FROM {t}")) for t in ("t", "u"))
    assert kept(pair.sync(skip_unchanged_min_rows=rows + 1, skip_unchanged=False)) == set()  # a full load
    for _ in range(3):
        assert kept(pair.sync(skip_unchanged_min_rows=rows + 1)) == set()
    rounds = [kept(pair.sync(skip_unchanged_min_rows=rows)) for _ in range(3)]  # counters, digests, kept
    assert rounds[-1] == {"public.t", "public.u"}, rounds


# A hostile agent: fedload's own, its trailer's digests ([schema, name, digest, rows, counters] per table) replaced
# by `{plant}`, a Python expression over `digests` (the honest list), `t(field, change)` (the list, `change` applied
# to field `field` of table t's entry) and `fake` (a well-formed digest); copy and inserts modes' list of tables not
# dumped ([schema, name, rows, digest]) by `{kept}`, an expression over `unchanged` (the honest list).
PLANTER = """
import sys
from fedload.__main__ import main
from fedload.feeder import wire
finish = wire.StreamEncoder.finish
fake = "0" * 64
def planted(self, **trailer):
    digests = [tuple(d) for d in trailer.get("digests", [])]
    def t(field, change):
        return [d[:field] + (change(d[field]),) + d[field + 1 :] if d[1] == "t" else d for d in digests]
    trailer["digests"] = {plant}
    unchanged = [tuple(u) for u in trailer.get("unchanged", [])]
    trailer["unchanged"] = {kept}
    return finish(self, **trailer)
wire.StreamEncoder.finish = planted
sys.exit(main())
"""
# What each plant makes of the digests, and the words the refusal must hold.
PLANTS = {
    "digest not hex": ('t(2, lambda d: "not a digest")', "digest"),
    "digest in upper case": ("t(2, str.upper)", "digest"),
    "digest too long": ('t(2, lambda d: d + "0")', "digest"),
    "counters not numbers": ('t(4, lambda c: "1; 2")', "counters"),
    "counters too long": ('t(4, lambda c: " ".join(["1"] * 9))', "counters"),
    "rows negative": ("t(3, lambda r: -1)", "rows"),
    "rows past bigint": ("t(3, lambda r: 2**63)", "rows"),
    "a table not asked": ('digests + [("public", "nosuch", fake, 0, "")]', "public.nosuch"),
    "a table twice": ('digests + [d for d in digests if d[1] == "t"]', "twice"),
}
DIGESTS = (
    "SELECT string_agg(concat_ws('|', table_name, digest, rows, fingerprint, counters), ',' ORDER BY 1) "
    "FROM fedload.digests"
)


def hostile(tmp_path: Path, plant: str = "digests", kept: str = "unchanged") -> str:
    """The planting agent's command (`PLANTER`)."""
    (tmp_path / "planter.py").write_text(PLANTER.replace("{plant}", plant).replace("{kept}", kept))
    return write_script(tmp_path / "planter", f'exec {sys.executable} {tmp_path / "planter.py"} "$@"\n')


def failed_run(pair: Pair, **more: Any) -> FeederRun:
    """One run of feeder `f` that fails."""
    run = asyncio.run(sync_feeder(feeder_job(pair.config(**more), "f")))
    assert run.outcome == Outcome.FAILED, run
    return run


@pytest.mark.parametrize("plant", list(PLANTS))
@pytest.mark.parametrize("pair", ["binary", "copy"], indirect=True)
def test_a_planted_digest_is_refused_and_stores_nothing(pair: Pair, tmp_path: Path, plant: str) -> None:
    """Issue 54, item 5: a trailer's digest that is not the agent's format, counters or rows out of bounds, a table
    the superhub did not ask about or one listed twice are refused as a dump error naming feeder and table, nothing
    is stored, and the honest agent's next round runs as before (its digests still valid: both tables kept)."""
    pair.sync()
    before = pair.superhub(DIGESTS)
    expression, named = PLANTS[plant]
    run = failed_run(pair, agent_command=[hostile(tmp_path, expression)])
    assert run.error_kind is ErrorKind.DUMP, run.error
    assert "feeder f" in (run.error or "")
    assert named in (run.error or "")
    assert "public.nosuch" in (run.error or "") or "public.t" in (run.error or "")
    assert pair.superhub(DIGESTS) == before
    assert kept(pair.sync()) == {"public.t", "public.u"}


STORED_PLANTS = {
    "digest not hex": "digest = 'not a digest'",
    "digest in upper case": "digest = upper(digest)",
    "counters not numbers": "counters = '1; 2'",
}


@pytest.mark.parametrize("plant", list(STORED_PLANTS))
@pytest.mark.parametrize("pair", ["binary", "copy"], indirect=True)
def test_a_stored_invalid_digest_is_not_sent(pair: Pair, plant: str) -> None:
    """A digest stored before digests were checked on receipt, not in the agent's format, is not sent (the agent
    would refuse the request, and every later run with it): the next round sends the table, the one after that
    stores its digest, and the one after keeps it."""
    pair.sync()
    pair.superhub(f"UPDATE fedload.digests SET {STORED_PLANTS[plant]} WHERE table_name = 't'")
    assert kept(pair.sync()) == {"public.u"}
    assert "not a digest" not in pair.superhub(DIGESTS)
    assert "1; 2" not in pair.superhub(DIGESTS)
    rounds = [kept(pair.sync()) for _ in range(2)]
    assert rounds[-1] == {"public.t", "public.u"}, rounds


# An agent stricter than this superhub: it refuses any request holding a digest, as a usage error (exit 2), before
# writing any stream.
STRICT_AGENT = """case "$*" in
*'"digest": "'*) echo "fedload agent dump: error: --columns: digest must be a digest" >&2; exit 2;;
esac
exec {agent} "$@"
"""


@pytest.mark.parametrize("pair", ["binary", "copy"], indirect=True)
def test_digests_the_agent_refuses_are_forgotten(pair: Pair, tmp_path: Path) -> None:
    """An agent that refuses the request the superhub's stored digests make (exit 2, no stream) fails the run,
    and the feeder's digests are forgotten: the next round sends every table and succeeds."""
    pair.sync()
    agent = [sys.executable, "-m", "fedload"]
    strict = write_script(tmp_path / "strict", STRICT_AGENT.format(agent=" ".join(agent)))
    run = failed_run(pair, agent_command=[strict])
    assert "forgot the digests it held of feeder f" in (run.error or ""), run.error
    assert pair.superhub("SELECT count(*) FROM fedload.digests WHERE digest <> ''").strip() == "0"
    assert kept(pair.sync(agent_command=[strict])) == set()


def test_a_table_removed_is_sent_again(pair: Pair) -> None:
    """Issue 54, item 9: `feeder remove f --table public.t`, then a round: it succeeds, t sent and loaded again
    (no digest asked for a table without a partition here), u kept; the round after keeps both."""
    pair.sync()
    assert kept(pair.sync()) == {"public.t", "public.u"}
    assert remove_feeder(pair.config(), "f", [TablePattern("public.t")], yes=True) == 0
    assert pair.superhub("SELECT count(*) FROM fedload.digests WHERE table_name = 't'").strip() == "0"
    assert kept(pair.sync()) == {"public.u"}
    rounds = [kept(pair.sync()) for _ in range(2)]
    assert rounds[-1] == {"public.t", "public.u"}, rounds


DROP_T = (
    "DO $$ BEGIN EXECUTE format('DROP TABLE %s', (SELECT inhrelid::regclass FROM pg_inherits "
    "WHERE inhparent = 't'::regclass)); END $$"
)


@BINARY_ONLY
def test_a_partition_dropped_by_hand_is_sent_again(pair: Pair) -> None:
    """A partition dropped outside fedload (its digest still stored): the round asks no digest of it, sends the
    table and succeeds."""
    pair.sync()
    assert kept(pair.sync()) == {"public.t", "public.u"}
    pair.superhub(DROP_T)
    assert kept(pair.sync()) == {"public.u"}


@PG_DUMP_MODES
def test_an_unchanged_table_not_asked_about_is_refused(pair: Pair, tmp_path: Path) -> None:
    """A trailer that lists as unchanged a table the superhub did not ask for (one excluded for the feeder) is
    refused as a dump error naming feeder and table, rather than skipped: nothing of it is kept."""
    pair.sync()
    planter = hostile(tmp_path, kept='unchanged + [("public", "u", 50, fake)]')
    run = failed_run(pair, agent_command=[planter], exclude_tables=["public.u"])
    assert run.error_kind is ErrorKind.DUMP, run.error
    assert "feeder f says table public.u is unchanged" in (run.error or "")
    assert kept(pair.sync()) == {"public.t", "public.u"}


@BINARY_ONLY
def test_digests_not_asked_for_are_refused(pair: Pair, tmp_path: Path) -> None:
    """A trailer with digests where the run asked for none (skip_unchanged = false) is refused as a dump error
    naming feeder and table; nothing is stored."""
    pair.sync()
    before = pair.superhub(DIGESTS)
    planter = hostile(tmp_path, plant='[("public", "t", fake, 7, "")]')
    run = failed_run(pair, agent_command=[planter], skip_unchanged=False)
    assert run.error_kind is ErrorKind.DUMP, run.error
    assert "feeder f sent a digest of table public.t, but this superhub asked for none" in (run.error or "")
    assert pair.superhub(DIGESTS) == before
    assert kept(pair.sync()) == {"public.t", "public.u"}
