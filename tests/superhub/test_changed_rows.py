"""Changed rows only (#55): in binary mode a changed table with a primary key goes as the buckets of its rows that
changed, applied to the feeder's partition in the swap's transaction; after every run the superhub holds exactly
the feeder's rows, whatever the changes (docs/unchanged.md, "Changed rows only")."""

from __future__ import annotations

import asyncio
import itertools
import re
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from fedload.commands.status import _rows, read_status
from fedload.config import Config, parse_config
from fedload.errors import ErrorKind
from fedload.feeder.delta import DeltaState, bucket_sql
from fedload.localpg import LocalCluster
from fedload.names import TableName
from fedload.results import FeederRun, Outcome
from fedload.superhub.delta import DeltaHead, DeltaRefusedError, StagedDelta, _check_sent
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import sync_feeder
from fedload.superhub.schema import ParentTable
from tests.support.federation import write_script

FEEDER_SCHEMA = """
CREATE TABLE k (name text PRIMARY KEY, n int NOT NULL, v text);
CREATE TABLE p (a int, b varchar(20), v text, PRIMARY KEY (a, b));
INSERT INTO k SELECT 'host-' || i, i, md5(i::text) FROM generate_series(1, 3000) AS i;
INSERT INTO p SELECT i % 100, 'b' || i, md5(i::text) FROM generate_series(1, 3000) AS i;
"""
SUPERHUB_SCHEMA = """
CREATE TABLE k (hub_id int NOT NULL, name text NOT NULL, n int NOT NULL, v text, PRIMARY KEY (hub_id, name))
    PARTITION BY LIST (hub_id);
CREATE TABLE p (hub_id int NOT NULL, a int NOT NULL, b varchar(20) NOT NULL, v text, PRIMARY KEY (hub_id, a, b))
    PARTITION BY LIST (hub_id);
"""
CONTENT = {"k": ("name", "name, n, v"), "p": ("a, b", "a, b, v")}
_names = itertools.count(10_000)


@dataclass
class Pair:
    """A feeder database and a superhub database on one cluster, and the configuration that syncs them."""

    cluster: LocalCluster
    feeder_db: str
    superhub_db: str

    def config(self, **more: Any) -> Config:
        feeder = {
            "key": 1,
            "transport": "local",
            "database": self.cluster.conninfo(self.feeder_db),
            "pg_dump": self.cluster.install.tool("pg_dump"),
            "dump_mode": "binary",
            "skip_unchanged_min_rows": 0,
        } | more
        superhub = {"dsn": self.cluster.dsn(self.superhub_db), "tables": ["public.k", "public.p"]}
        return parse_config({"superhub": superhub, "feeders": {"f": feeder}})

    def feeder(self, sql: str) -> str:
        return self.cluster.psql(sql, dbname=self.feeder_db)

    def superhub(self, sql: str) -> str:
        return self.cluster.psql(sql, dbname=self.superhub_db)

    def run(self, **more: Any) -> FeederRun:
        return asyncio.run(sync_feeder(feeder_job(self.config(**more), "f")))

    def sync(self, **more: Any) -> FeederRun:
        """One run, succeeded, the superhub's rows of both tables exactly the feeder's."""
        run = self.run(**more)
        assert run.outcome == Outcome.SUCCESS, run.error
        self.assert_equal()
        return run

    def assert_equal(self) -> None:
        for table, (order, columns) in CONTENT.items():
            rows = f"SELECT md5(coalesce(string_agg(ROW({columns})::text, E'\\n' ORDER BY {order}), '-')) FROM {table}"
            assert self.superhub(rows + " WHERE hub_id = 1") == self.feeder(rows), table

    def superhub_status_rows(self) -> str:
        """What `fedload status` shows in the feeder's rows column."""
        (feeder,) = asyncio.run(read_status(self.config()))
        return _rows(feeder)

    def states(self) -> int:
        """How many tables the superhub holds a delta state of."""
        return int(self.superhub("SELECT count(*) FROM fedload.digests WHERE delta <> ''"))

    def partition_oid(self, table: str) -> str:
        return self.superhub(
            "SELECT c.oid FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            f"WHERE i.inhparent = '{table}'::regclass"
        )


def settled(pair: Pair) -> None:
    """Synced until the superhub holds both tables' delta states (a test before may have left one without: sent
    with `send_changed_rows` off, or whole with no digest): each run after a change stores one more of them."""
    for _ in range(3):
        if pair.states() == 2:
            return
        pair.feeder(
            "UPDATE k SET n = n WHERE name IN (SELECT name FROM k LIMIT 1); "
            "UPDATE p SET v = v WHERE (a, b) IN (SELECT a, b FROM p LIMIT 1)"
        )
        pair.sync()
    assert pair.states() == 2


@pytest.fixture(scope="module")
def pair(cluster: LocalCluster) -> Pair:
    """The module's pair, synced until the superhub holds both tables' delta states."""
    cluster.psql("CREATE DATABASE changedfeeder")
    cluster.psql("CREATE DATABASE changedhub")
    made = Pair(cluster, "changedfeeder", "changedhub")
    made.feeder(FEEDER_SCHEMA)
    made.superhub(SUPERHUB_SCHEMA)
    made.sync()  # the first run asks no digest
    made.sync()  # the second stores them
    made.feeder("UPDATE k SET n = n WHERE name = 'host-1'; UPDATE p SET v = v WHERE a = 1 AND b = 'b1'")
    made.sync()  # the tables changed: sent whole, with their delta states
    assert made.states() == 2
    return made


def change_sql(kind: str, n: int) -> str:
    """One change of the feeder's tables, of `kind`, at row `n` (1..3000, where it still is)."""
    name, fresh = f"'host-{n}'", next(_names)
    return {
        "insert": f"INSERT INTO k VALUES ('new-{fresh}', {n}, 'fresh'); INSERT INTO p VALUES ({n}, 'n{fresh}', 'x')",
        "update": (
            f"UPDATE k SET v = coalesce(v, '') || 'u' WHERE name = {name}; UPDATE p SET v = 'u' WHERE a = {n % 100}"
        ),
        "update the key": f"UPDATE k SET name = 'moved-{next(_names)}' WHERE name = {name}",
        "delete": f"DELETE FROM k WHERE name = {name}; DELETE FROM p WHERE b = 'b{n}'",
        "delete and insert the same key": (
            f"DELETE FROM k WHERE name = {name}; INSERT INTO k VALUES ({name}, -1, 'again')"
        ),
        "in a subtransaction": (
            f"BEGIN; SAVEPOINT s; INSERT INTO k VALUES ('sub-{next(_names)}', {n}, 's'); RELEASE s; "
            f"UPDATE k SET n = n + 1 WHERE name = {name}; COMMIT"
        ),
        "a rolled back change": f"BEGIN; DELETE FROM k WHERE name = {name}; ROLLBACK",
        "set null": f"UPDATE k SET v = NULL WHERE name = {name}",
        "none": "",
    }[kind]


KINDS = [
    "insert",
    "update",
    "update the key",
    "delete",
    "delete and insert the same key",
    "in a subtransaction",
    "a rolled back change",
    "set null",
    "none",
]


CHANGES = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 3000), st.booleans()), max_size=6)


@settings(max_examples=6, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=st.lists(CHANGES, max_size=3))
def test_after_any_changes_the_superhub_holds_the_feeders_rows(
    pair: Pair, rounds: list[list[tuple[str, int, bool]]]
) -> None:
    """Random changes (inserts, updates of keys and values, deletes, a key deleted and inserted again, writes in a
    subtransaction, a change rolled back), several per round, some by a session that counts nothing (the table's
    counters then do not say rows went: the agent's first pass over the new rows alone must find it): after each
    run the superhub holds exactly the feeder's rows, and the partitions were changed in place (their tables are the
    same)."""
    oids = {t: pair.partition_oid(t) for t in CONTENT}
    for changes in rounds:
        for kind, n, uncounted in changes:
            if sql := change_sql(kind, n):
                pair.feeder(f"SET track_counts = off; {sql}" if uncounted else sql)
        pair.sync()
    assert pair.states() == 2
    assert {t: pair.partition_oid(t) for t in CONTENT} == oids


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "none"])
def test_each_kind_of_change_alone_is_applied_in_place(pair: Pair, kind: str) -> None:
    """Each kind of change alone, at a row that is there: the next run applies it in place and is exact."""
    pair.sync()
    oids = {t: pair.partition_oid(t) for t in CONTENT}
    pair.feeder(change_sql(kind, 1 + next(_names) % 3000))
    pair.sync()
    assert {t: pair.partition_oid(t) for t in CONTENT} == oids


def test_one_changed_row_sends_a_small_part_of_the_table(pair: Pair) -> None:
    """One row updated: the run sends a few buckets of one table, not the table (a tenth of the bytes at most)."""
    pair.sync()
    pair.feeder("TRUNCATE k; INSERT INTO k SELECT 'host-' || i, i, md5(i::text) FROM generate_series(1, 3000) AS i")
    whole = pair.sync()  # a truncated table has a new basis: sent whole
    pair.feeder("UPDATE k SET v = 'changed' WHERE name = 'host-7'")
    changed = pair.sync()
    assert changed.rows["public.k"] == 3000
    assert changed.changed_rows_tables == ("public.k",)
    assert "1 changed rows only" in pair.superhub_status_rows()
    assert changed.raw_bytes * 10 < whole.raw_bytes, (changed.raw_bytes, whole.raw_bytes)


def changed_rows_logged(pair: Pair) -> dict[str, MutableMapping[str, Any]]:
    """One run, synced and exact, and its `swap.changed_rows` events by table."""
    with capture_logs() as logs:
        pair.sync()
    return {e["table"]: e for e in logs if e["event"] == "swap.changed_rows"}


def test_rows_only_added_go_alone_not_with_their_buckets(pair: Pair) -> None:
    """Rows inserted into buckets that lost none: only those rows are sent and inserted, nothing deleted; a bucket
    that also lost a row goes whole (its rows deleted and sent again)."""
    pair.sync()
    fresh = [f"added-{next(_names)}" for _ in range(5)]
    pair.feeder("".join(f"INSERT INTO k VALUES ('{name}', 1, 'new');" for name in fresh))
    logged = changed_rows_logged(pair)["public.k"]
    assert (logged["inserted"], logged["deleted"], logged["appended"], logged["buckets"]) == (5, 0, 5, 0), logged
    pair.feeder(f"UPDATE k SET v = 'changed' WHERE name = '{fresh[0]}'")
    logged = changed_rows_logged(pair)["public.k"]
    assert logged["appended"] == 0, logged
    assert logged["buckets"] == 1, logged
    assert logged["deleted"] == logged["inserted"] >= 1, logged


# The agent, writing each statement its snapshot session runs to a file ({path!r}), one line each.
RECORDER = """
import sys
from fedload.__main__ import main
from fedload.feeder.snapshot import SnapshotSession
query, copy = SnapshotSession.query, SnapshotSession.copy
def recorded(statement):
    with open({path!r}, "a") as log:
        log.write(" ".join(statement.split()) + "\\n")
def logged_query(session, statement):
    recorded(statement)
    return query(session, statement)
def logged_copy(session, command, sink):
    recorded(command)
    return copy(session, command, sink)
SnapshotSession.query, SnapshotSession.copy = logged_query, logged_copy
sys.exit(main())
"""


def recorded_run(pair: Pair, tmp_path: Path) -> tuple[FeederRun, dict[str, list[str]]]:
    """One run by the recording agent, synced and exact; the statements its session ran that read k or p, by
    table."""
    log = tmp_path / "statements.log"
    log.unlink(missing_ok=True)
    (tmp_path / "recorder.py").write_text(RECORDER.format(path=str(log)))
    recorder = write_script(tmp_path / "recorder", f'exec {sys.executable} {tmp_path / "recorder.py"} "$@"\n')
    run = pair.sync(agent_command=[recorder])
    statements = log.read_text().splitlines()
    reads = {t: re.compile(rf'"public" ?\. ?"{t}"') for t in CONTENT}
    return run, {t: [s for s in statements if reads[t].search(s) and "LOCK" not in s] for t in CONTENT}


def test_a_table_counted_against_its_state_needs_no_identity_proof(pair: Pair, tmp_path: Path) -> None:
    """Rows only added to k, p untouched: k's rows counted by one pass that hashes the new rows' keys alone and
    sent as those rows (no key hashed in the COPY), p kept by the same pass (its old rows all there, none new); no
    identity proof, no pass hashing every row's key."""
    settled(pair)
    pair.feeder("INSERT INTO k SELECT 'more-' || i, i, 'added' FROM generate_series(1, 40) AS i")
    run, statements = recorded_run(pair, tmp_path)
    assert run.unchanged_tables == ("public.p",)
    assert run.changed_rows_tables == ("public.k",)
    for table in CONTENT:
        assert not [s for s in statements[table] if "hashtidextended" in s or "FILTER" in s], statements[table]
        assert len([s for s in statements[table] if "CASE WHEN" in s]) == 1, statements[table]
    (copy,) = [s for s in statements["k"] if "COPY" in s.upper()]
    assert "hashtextextended" not in copy, copy


def test_a_table_whose_rows_went_is_counted_by_every_rows_bucket(pair: Pair, tmp_path: Path) -> None:
    """Rows of k updated (its counters say so): its buckets counted by every row's key at once, not first by the
    pass over the new rows alone; still no identity proof."""
    settled(pair)
    pair.feeder("UPDATE k SET v = 'went' WHERE n % 500 = 7")
    run, statements = recorded_run(pair, tmp_path)
    assert run.changed_rows_tables == ("public.k",)
    assert not [s for s in statements["k"] if "CASE WHEN" in s or "hashtidextended" in s], statements["k"]
    assert len([s for s in statements["k"] if "FILTER" in s]) == 1, statements["k"]


def test_rows_that_went_unseen_by_the_counters_are_still_found(pair: Pair, tmp_path: Path) -> None:
    """A row of k deleted and one updated by a session that counts nothing (`track_counts = off`: the counters say
    no row went), rows added: the pass over the new rows finds fewer old rows than the state holds, so the buckets
    are counted again by every row's key, and the run is exact (the deleted row gone here too)."""
    settled(pair)
    pair.feeder(
        "SET track_counts = off; DELETE FROM k WHERE name = 'host-21'; UPDATE k SET v = 'unseen' WHERE name = "
        "'host-22'; INSERT INTO k VALUES ('unseen-1', 1, 'x')"
    )
    run, statements = recorded_run(pair, tmp_path)
    assert run.changed_rows_tables == ("public.k",)
    assert [("CASE WHEN" in s, "FILTER" in s) for s in statements["k"] if "count(*)" in s] == [
        (True, False),
        (False, True),
    ]


def test_a_table_rewritten_unchanged_is_kept_by_its_state(pair: Pair) -> None:
    """VACUUM FULL moves every row (new ctids, a new file node: its identity proof and counters differ) but changes
    none: counted against its delta state, the table is kept, and the next change is still sent as changed rows."""
    settled(pair)
    oid = pair.partition_oid("k")
    pair.feeder("VACUUM FULL k")
    assert set(pair.sync().unchanged_tables) == {"public.k", "public.p"}
    pair.feeder("UPDATE k SET v = 'after the rewrite' WHERE name = 'host-11'")
    assert pair.sync().changed_rows_tables == ("public.k",)
    assert pair.partition_oid("k") == oid


def test_truncate_and_refill_sends_the_table_whole(pair: Pair) -> None:
    pair.feeder("TRUNCATE p; INSERT INTO p SELECT i % 50, 'r' || i, 'refilled' FROM generate_series(1, 500) AS i")
    pair.sync()
    assert pair.feeder("SELECT count(*) FROM p") == pair.superhub("SELECT count(*) FROM p WHERE hub_id = 1")


# An agent that leaves out the first changed bucket it finds: the superhub's counts then do not add up.
LIAR = """
import sys
import fedload.feeder.delta_plan as plan
from fedload.__main__ import main
honest = plan.dirty_buckets
plan.dirty_buckets = lambda stored, found, **how: honest(stored, found, **how)[1:]
sys.exit(main())
"""


# An agent that sends the buckets that lost rows as appended (their new rows alone): the superhub's counts then
# do not add up (the partition would keep a row the feeder deleted).
APPENDER = """
import sys
import fedload.feeder.delta_plan as plan
from fedload.__main__ import main
plan._only_gained = lambda found, stored: found is not None and found[1] > 0
sys.exit(main())
"""


def test_a_bucket_that_lost_rows_sent_as_appended_is_refused(pair: Pair, tmp_path: Path) -> None:
    """A feeder that sends a bucket that lost a row (an update: one row version gone, one new) as only gaining rows:
    the run fails as a dump error naming the table, the old rows stay, and the next honest run is exact."""
    pair.sync()
    before = pair.superhub("SELECT md5(string_agg(v, ',' ORDER BY name)) FROM k")
    (tmp_path / "appender.py").write_text(APPENDER)
    appender = write_script(tmp_path / "appender", f'exec {sys.executable} {tmp_path / "appender.py"} "$@"\n')
    pair.feeder("UPDATE k SET v = 'lost and gained' WHERE name = 'host-5'")
    run = pair.run(agent_command=[appender])
    assert run.outcome == Outcome.FAILED
    assert run.error_kind == ErrorKind.DUMP, run.error
    assert "table public.k: feeder f sent a delta that is refused: its appended buckets" in (run.error or "")
    assert pair.superhub("SELECT md5(string_agg(v, ',' ORDER BY name)) FROM k") == before
    pair.sync()


async def test_sent_rows_in_the_wrong_buckets_do_not_add_up(pair: Pair) -> None:
    """The staged rows of a delta are counted by bucket with this superhub's hash: a bucket holding other than
    its counts give it (all of a changed bucket's rows, an appended bucket's gain) is refused before any change."""
    conn = await asyncpg.connect(pair.cluster.dsn(pair.superhub_db))
    try:
        await conn.execute("CREATE TEMP TABLE sent (name text)")
        await conn.execute("INSERT INTO sent SELECT 'n' || i FROM generate_series(1, 20) AS i")
        key = (("name", 25),)
        counted = await conn.fetch(f"SELECT {bucket_sql(key, 2)}, count(*) FROM sent AS r GROUP BY 1")
        buckets: dict[int, int] = {row[0]: row[1] for row in counted}
        state = DeltaState("0" * 64, 2, 1, (30, 30), "1")
        stored = (30 - buckets[0] + 1, 30 - buckets[1])  # bucket 0 gained one row less than sent
        head = DeltaHead(state, 60, frozenset(), 20, frozenset({0, 1}))
        parent = cast("ParentTable", SimpleNamespace(qualified_name="public.k", table=TableName("public", "k")))
        staged = StagedDelta(parent, "pg_temp.sent", key, head, sum(stored), stored)
        with pytest.raises(
            DeltaRefusedError, match=r"bucket 0 holds \d+ row\(s\) sent, not the \d+ its counts give it"
        ):
            await _check_sent(conn, staged, bucket_sql(key, 2))
        fair = StagedDelta(parent, "pg_temp.sent", key, head, sum(stored), (stored[0] - 1, stored[1]))
        await _check_sent(conn, fair, bucket_sql(key, 2))
    finally:
        await conn.close()


def test_a_delta_that_does_not_add_up_is_refused_and_the_next_run_sends_all(pair: Pair, tmp_path: Path) -> None:
    """A feeder that sends fewer changed rows than its counts say: the run fails as a dump error, the old rows stay,
    the table's state is forgotten, and the next (honest) run sends it whole and is exact."""
    pair.sync()
    before = pair.superhub("SELECT md5(string_agg(name, ',' ORDER BY name)) FROM k")
    (tmp_path / "liar.py").write_text(LIAR)
    liar = write_script(tmp_path / "liar", f'exec {sys.executable} {tmp_path / "liar.py"} "$@"\n')
    # rows deleted in several buckets, each sent whole: the liar leaves one out and sends the others
    pair.feeder("DELETE FROM k WHERE n % 150 = 1")
    run = pair.run(agent_command=[liar])
    assert run.outcome == Outcome.FAILED
    assert run.error_kind == ErrorKind.DUMP, run.error
    assert "do not add up" in (run.error or "")
    assert pair.superhub("SELECT md5(string_agg(name, ',' ORDER BY name)) FROM k") == before
    assert pair.states() == 1  # k's forgotten
    pair.sync()  # k whole: its digest stored
    pair.feeder("UPDATE k SET v = 'again' WHERE name = 'host-3'")
    pair.sync()  # k whole again, with its state
    assert pair.states() == 2


def test_send_changed_rows_off_sends_tables_whole(pair: Pair) -> None:
    pair.feeder("UPDATE k SET v = 'off' WHERE name = 'host-9'")
    oid = pair.partition_oid("k")
    pair.sync(send_changed_rows=False)
    assert pair.partition_oid("k") != oid


def test_a_reader_sees_the_old_rows_or_the_new_never_a_mix(pair: Pair) -> None:
    """A reader counting the feeder's rows of k (and summing a column) again and again while rounds of changes are
    applied in place sees only the states the feeder had at the rounds' snapshots: never a mix of two."""
    pair.sync()
    probe = "SELECT count(*), sum(n) FROM k"
    states = {tuple(pair.feeder(probe).strip().split("|"))}
    seen: list[tuple[str, ...]] = []

    async def rounds() -> None:
        config = pair.config()
        for i in range(4):
            pair.feeder(
                f"UPDATE k SET n = n + 1 WHERE name LIKE 'host-1%'; INSERT INTO k VALUES ('r{next(_names)}', {i}, '')"
            )
            run = await sync_feeder(feeder_job(config, "f"))
            assert run.outcome == Outcome.SUCCESS, run.error
            states.add(tuple(pair.feeder(probe).strip().split("|")))

    async def read(done: asyncio.Event) -> None:
        conn = await asyncpg.connect(pair.cluster.dsn(pair.superhub_db))
        try:
            while not done.is_set():
                row = await conn.fetchrow(probe + " WHERE hub_id = 1")
                assert row is not None
                seen.append((str(row[0]), str(row[1])))
                await asyncio.sleep(0.005)
        finally:
            await conn.close()

    async def both() -> None:
        done = asyncio.Event()
        reader = asyncio.create_task(read(done))
        try:
            await rounds()
        finally:
            done.set()
            await asyncio.wait_for(reader, 30)

    asyncio.run(both())
    assert len(seen) > 20
    assert set(seen) <= states, set(seen) - states


NOT_DURABLE = """
import sys
import fedload.feeder.binary_dump as dump
from fedload.__main__ import main
dump.durable = lambda context, query: False
sys.exit(main())
"""


def test_no_state_is_kept_from_a_snapshot_whose_wal_is_not_flushed(pair: Pair, tmp_path: Path) -> None:
    """Where the agent cannot see its snapshot's WAL flushed, it blanks the changed tables' digests, and the superhub
    keeps no delta state of them: after a crash restart their transaction IDs could be given again."""
    settled(pair)
    (tmp_path / "agent.py").write_text(NOT_DURABLE)
    agent = write_script(tmp_path / "agent", f'exec {sys.executable} {tmp_path / "agent.py"} "$@"\n')
    pair.feeder("UPDATE k SET v = 'not flushed' WHERE name = 'host-11'")
    pair.sync(agent_command=[agent])
    assert pair.states() == 1  # p, unchanged, keeps its state
    pair.feeder("UPDATE k SET v = 'flushed' WHERE name = 'host-12'")
    pair.sync()  # k sent whole, with a new state
    pair.feeder("UPDATE k SET v = 'flushed again' WHERE name = 'host-12'")
    pair.sync()
    assert pair.states() == 2


# A schema of other shapes: a uuid key, an int8 key, a composite of int2 and varchar with non-ASCII values, a table
# without a primary key (bucketed by its NOT NULL columns), and an enum column (whose table goes as text: whole).
OTHER_FEEDER = """
CREATE TYPE mood AS ENUM ('ok', 'bad');
CREATE TABLE a (id uuid PRIMARY KEY, payload jsonb, at timestamptz);
CREATE TABLE b (id bigint PRIMARY KEY, n numeric, tags text[]);
CREATE TABLE c (x smallint, y varchar(30), z bytea, PRIMARY KEY (x, y));
CREATE TABLE d (hostkey text NOT NULL, seen timestamptz, note text);
CREATE TABLE e (id int PRIMARY KEY, m mood);
INSERT INTO a SELECT md5(i::text)::uuid, jsonb_build_object('i', i), '2024-01-01'::timestamptz + i * interval '1 s'
    FROM generate_series(1, 2000) AS i;
INSERT INTO b SELECT i::bigint * 1000000007, i / 7.0, ARRAY['t' || i] FROM generate_series(1, 2000) AS i;
INSERT INTO c SELECT i % 300, 'ключ-' || i, decode(md5(i::text), 'hex') FROM generate_series(1, 2000) AS i;
INSERT INTO d SELECT 'SHA=' || (i % 500), now(), NULL FROM generate_series(1, 2000) AS i;
INSERT INTO e SELECT i, 'ok' FROM generate_series(1, 2000) AS i;
"""
OTHER_SUPERHUB = """
CREATE TYPE mood AS ENUM ('ok', 'bad');
CREATE TABLE a (hub int NOT NULL, id uuid NOT NULL, payload jsonb, at timestamptz, PRIMARY KEY (hub, id))
    PARTITION BY LIST (hub);
CREATE TABLE b (hub int NOT NULL, id bigint NOT NULL, n numeric, tags text[], PRIMARY KEY (id, hub))
    PARTITION BY LIST (hub);
CREATE TABLE c (hub int NOT NULL, x smallint NOT NULL, y varchar(30) NOT NULL, z bytea, PRIMARY KEY (hub, x, y))
    PARTITION BY LIST (hub);
CREATE TABLE d (hub int NOT NULL, hostkey text NOT NULL, seen timestamptz, note text) PARTITION BY LIST (hub);
CREATE TABLE e (hub int NOT NULL, id int NOT NULL, m mood, PRIMARY KEY (hub, id)) PARTITION BY LIST (hub);
"""
OTHER_CHANGES = """
UPDATE a SET payload = payload || '{"x": 1}' WHERE id = md5('7')::uuid;
DELETE FROM b WHERE id = 3::bigint * 1000000007;
INSERT INTO c VALUES (7, 'ключ-новый', NULL);
UPDATE d SET note = 'n' WHERE hostkey = 'SHA=3';
DELETE FROM d WHERE hostkey = 'SHA=4';
UPDATE e SET m = 'bad' WHERE id = 5;
"""
OTHER_CONTENT = {
    "a": "md5(string_agg(ROW(id, payload, at)::text, ',' ORDER BY id))",
    "b": "md5(string_agg(ROW(id, n, tags)::text, ',' ORDER BY id))",
    "c": "md5(string_agg(ROW(x, y, z)::text, ',' ORDER BY x, y))",
    "d": "md5(string_agg(ROW(hostkey, seen, note)::text, ',' ORDER BY hostkey, seen, note))",
    "e": "md5(string_agg(ROW(id, m)::text, ',' ORDER BY id))",
}


@pytest.mark.pg_major(15, 17, 18)
def test_a_schema_of_other_shapes_from_each_major_is_applied_in_place(
    major_cluster: LocalCluster, cluster: LocalCluster, pg_major: int
) -> None:
    """A feeder on PostgreSQL 15, 17 and 18, the superhub on 15 (on 18 with a feeder on 18: the feeder's statistics
    carried beside): the uuid, int8, composite and key-less tables go as their changed buckets (their partitions
    stay), the enum table whole (text), and all are exact."""
    if pg_major == 18:
        cluster = major_cluster  # the superhub on 18 too
    feeder_db, superhub_db = f"otherfeeder{pg_major}", f"otherhub{pg_major}"
    major_cluster.psql(f"CREATE DATABASE {feeder_db}")
    cluster.psql(f"CREATE DATABASE {superhub_db}")
    major_cluster.psql(OTHER_FEEDER, dbname=feeder_db)
    cluster.psql(OTHER_SUPERHUB, dbname=superhub_db)
    feeder = {
        "key": 1,
        "transport": "local",
        "database": major_cluster.conninfo(feeder_db),
        "pg_dump": major_cluster.install.tool("pg_dump"),
        "dump_mode": "binary",
        "skip_unchanged_min_rows": 0,
    }
    superhub = {"dsn": cluster.dsn(superhub_db), "tables": [f"public.{t}" for t in OTHER_CONTENT], "feeder_key": "hub"}
    config = parse_config({"superhub": superhub, "feeders": {"f": feeder}})

    def partitions() -> str:
        return cluster.psql(
            "SELECT string_agg(c.relname || '=' || c.oid, ',' ORDER BY c.relname) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid",
            dbname=superhub_db,
        )

    def sync() -> None:
        run = asyncio.run(sync_feeder(feeder_job(config, "f")))
        assert run.outcome == Outcome.SUCCESS, run.error
        for table, digest in OTHER_CONTENT.items():
            here = cluster.psql(f"SELECT {digest} FROM {table} WHERE hub = 1", dbname=superhub_db)
            assert here == major_cluster.psql(f"SELECT {digest} FROM {table}", dbname=feeder_db), table

    sync()
    sync()
    major_cluster.psql(OTHER_CHANGES, dbname=feeder_db)
    sync()  # whole, with the delta states
    states = cluster.psql(
        "SELECT string_agg(table_name, ',' ORDER BY table_name) FROM fedload.digests WHERE delta <> ''",
        dbname=superhub_db,
    )
    assert states.strip() == "a,b,c,d"
    before = partitions().strip()
    major_cluster.psql(OTHER_CHANGES.replace("'n'", "'m'").replace("новый", "новее"), dbname=feeder_db)
    sync()
    kept = {"public.a__f", "public.b__f", "public.c__f", "public.d__f"}  # changed in place; e (text) whole
    assert {p for p in before.split(",") if p.split("=")[0] in kept} == {
        p for p in partitions().strip().split(",") if p.split("=")[0] in kept
    }
    assert len(kept & {p.split("=")[0] for p in before.split(",")}) == 4
