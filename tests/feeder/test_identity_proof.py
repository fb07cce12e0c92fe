"""The agent's proof that a table did not change (fedload/feeder/digest.py, docs/unchanged.md "How a table is proven
unchanged"), taken as the agent takes it (its snapshot session, `read_tables`, `table_digest`) on real servers of
each major: whenever two snapshots' digests are equal, the table's COPY text in them holds the same lines.

The lines are compared sorted: a seq scan's order is not a table's content (it may start anywhere,
synchronize_seqscans), and the superhub loads a set of rows, as the content digest always covered it."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedload.errors import ConfigError
from fedload.feeder import digest
from fedload.feeder.binary_plan import TableRequest, copy_command, plan_table
from fedload.feeder.digest import durable, table_digest
from fedload.feeder.proof import ProofKind
from fedload.feeder.snapshot import SnapshotSession, read_tables
from fedload.localpg import LocalCluster

pytestmark = pytest.mark.pg_major(15, 17, 18)

SCHEMA = """
DROP TABLE IF EXISTS p, named;
DROP TYPE IF EXISTS mood, glad;
CREATE TYPE mood AS ENUM ('calm', 'glad', 'angry');
CREATE TABLE p (id int, k text, m mood, n numeric, at timestamptz);
INSERT INTO p SELECT i, 'k' || i, (ARRAY['calm', 'glad', 'angry'])[1 + i % 3]::mood, i * 1.5,
       '2026-01-01 12:00+00'::timestamptz + i * interval '1 hour'
FROM generate_series(1, 12) AS i;
"""
ROW = "({id}, 'k{id}', 'calm', 1.5, '2026-01-01 12:00+00')"
# Each a change to table p; `{id}` an id from 1 to 12, `{d}` a default of 1 or 2.
CHANGES = {
    "insert": "INSERT INTO p VALUES " + ROW,
    "update a value": "UPDATE p SET n = n + 1 WHERE id = {id}",
    "update a key": "UPDATE p SET id = id + 100 WHERE id = {id}",
    "update to the same": "UPDATE p SET n = n WHERE id = {id}",
    "delete": "DELETE FROM p WHERE id = {id}",
    "delete and reinsert": (
        "BEGIN; CREATE TEMP TABLE gone AS SELECT * FROM p WHERE id = {id}; DELETE FROM p WHERE id = {id}; "
        "INSERT INTO p SELECT * FROM gone; COMMIT"
    ),
    "truncate and refill": (
        "BEGIN; CREATE TEMP TABLE was AS SELECT * FROM p; TRUNCATE p; INSERT INTO p SELECT * FROM was; COMMIT"
    ),
    "vacuum": "VACUUM p",
    "vacuum full": "VACUUM FULL p",
    "vacuum freeze": "VACUUM FREEZE p",
    "add a column": "ALTER TABLE p ADD COLUMN IF NOT EXISTS extra int DEFAULT {d}",
    "drop a column": "ALTER TABLE p DROP COLUMN IF EXISTS extra",
    "rename an enum label": (  # and back, the next time
        "DO $$ BEGIN IF EXISTS (SELECT FROM pg_enum WHERE enumlabel = 'glad') THEN "
        "ALTER TYPE mood RENAME VALUE 'glad' TO 'happy'; ELSE ALTER TYPE mood RENAME VALUE 'happy' TO 'glad'; "
        "END IF; END $$"
    ),
    "time zone": (  # the database's, which the next session takes; and back, the next time
        "DO $$ BEGIN IF current_setting('TimeZone') = 'Asia/Kathmandu' THEN "
        "EXECUTE 'ALTER DATABASE ' || current_database() || ' RESET TimeZone'; ELSE "
        "EXECUTE 'ALTER DATABASE ' || current_database() || ' SET TimeZone = ''Asia/Kathmandu'''; END IF; END $$"
    ),
    "begin concurrent": "",  # a transaction that writes, open across the next observations
    "commit concurrent": "",
    "nothing": "",
}


@dataclass(frozen=True)
class Seen:
    """A table in one snapshot: its digest, which proof, and its COPY text's lines sorted."""

    digest: str
    kind: ProofKind | None
    lines: tuple[bytes, ...]


def observe(cluster: LocalCluster, db: str, table: str = "p") -> Seen:
    """The table's digest and COPY text in one snapshot of the agent's session, asked as the superhub asks (all
    columns, as text; the counters the content digest waits for given as they are)."""
    session = SnapshotSession.start(cluster.install.tool("psql"), cluster.conninfo(db))
    with session.process:
        request = TableRequest("public", table, None, wants_digest=True)
        seen = read_tables(session, [request])
        feeder = seen.catalog["public", table]
        request = dataclasses.replace(request, counters=seen.counters["public", table])
        plan = plan_table(request, feeder)
        digest = table_digest(request, plan, feeder, request.counters, context=seen.context, query=session.query)
        data: list[bytes] = []
        session.copy(copy_command(plan), data.append)
        session.finish()
    session.close()
    assert digest is not None
    return Seen(digest.digest, digest.kind, tuple(sorted(b"".join(data).splitlines())))


class Concurrent:
    """A psql whose transaction writes to p and stays open until `commit`."""

    def __init__(self, cluster: LocalCluster, db: str) -> None:
        argv = [
            cluster.install.tool("psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            cluster.conninfo(db),
        ]
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.say(
            "BEGIN; UPDATE p SET n = n + 7 WHERE id = (SELECT min(id) FROM p); INSERT INTO p VALUES "
            + ROW.format(id=77)
        )

    def say(self, sql: str) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(f"{sql}; SELECT 'done';\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "done"

    def commit(self) -> None:
        self.say("COMMIT")
        self.end()

    def end(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def feeder(major_cluster: LocalCluster) -> Iterator[tuple[LocalCluster, str]]:
    """A database of the major's cluster for the proofs."""
    major_cluster.psql("CREATE DATABASE proofs")
    yield major_cluster, "proofs"
    major_cluster.psql("DROP DATABASE proofs")


def run_steps(cluster: LocalCluster, db: str, steps: list[tuple[str, int, int]]) -> list[Seen]:
    """Make each change in turn from a fresh table p, observing p before the first and after each."""
    cluster.psql(SCHEMA + f"ALTER DATABASE {db} RESET TimeZone", dbname=db)
    seen = [observe(cluster, db)]
    concurrent: Concurrent | None = None
    try:
        for change, row, default in steps:
            if change == "begin concurrent" and concurrent is None:
                concurrent = Concurrent(cluster, db)
            elif change == "commit concurrent" and concurrent is not None:
                concurrent.commit()
                concurrent = None
            elif sql := CHANGES[change].format(id=row, d=default):
                change_unless_locked(cluster, db, sql, waits=concurrent is not None)
            seen.append(observe(cluster, db))
    finally:
        if concurrent is not None:
            concurrent.end()
    return seen


def change_unless_locked(cluster: LocalCluster, db: str, sql: str, *, waits: bool) -> None:
    """Run `sql`; where the concurrent transaction holds what it needs (`waits`), give up after a moment."""
    try:
        cluster.psql(("SET lock_timeout = '200ms';\n" if waits else "") + sql, dbname=db)
    except ConfigError as exc:
        if not (waits and "lock timeout" in str(exc)):
            raise


def assert_equal_digests_mean_equal_text(seen: list[Seen]) -> None:
    for earlier, later in ((a, b) for i, a in enumerate(seen) for b in seen[i + 1 :]):
        if earlier.digest == later.digest:
            assert earlier.lines == later.lines


STEPS = st.lists(st.tuples(st.sampled_from(list(CHANGES)), st.integers(1, 12), st.integers(1, 2)), max_size=10)


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
def test_an_equal_identity_proof_means_the_same_copy_text(
    feeder: tuple[LocalCluster, str], steps: list[tuple[str, int, int]]
) -> None:
    """For any sequence of changes (writes, VACUUMs, DDL that rewrites nothing, a concurrent transaction across
    snapshots), two snapshots whose digests are equal show the same COPY text; every proof is the identity one."""
    seen = run_steps(*feeder, steps)
    assert {s.kind for s in seen} == {ProofKind.IDENTITY}
    assert_equal_digests_mean_equal_text(seen)


def test_a_table_nothing_touched_keeps_its_digest(feeder: tuple[LocalCluster, str]) -> None:
    """No change, VACUUM, VACUUM FREEZE (xmin kept as it was on 15, 17, 18) and a transaction still open: the same
    digest (the proof is not vacuous)."""
    steps = [("nothing", 1, 1), ("vacuum", 1, 1), ("vacuum freeze", 1, 1), ("begin concurrent", 1, 1)]
    seen = run_steps(*feeder, steps)
    assert len({s.digest for s in seen}) == 1
    assert_equal_digests_mean_equal_text(seen)


# Each change alone, against the snapshot before it: the digest differs exactly where the text does, or for a
# resend of the same text that the proof cannot tell (a new tuple, a moved one).
SINGLE = [
    (["insert"], True),
    (["update a value"], True),
    (["update to the same"], False),
    (["delete and reinsert"], False),
    (["truncate and refill"], False),
    (["delete"], True),
    (["add a column"], True),
    (["rename an enum label"], True),
    (["time zone"], True),
]


@pytest.mark.parametrize(("changes", "text_differs"), SINGLE, ids=[" then ".join(c) for c, _ in SINGLE])
def test_each_change_alone_changes_the_digest(
    feeder: tuple[LocalCluster, str], changes: list[str], text_differs: bool
) -> None:
    """A change that alters the COPY text changes the digest, and so does one that writes new tuples with the
    same text (a harmless resend)."""
    seen = run_steps(*feeder, [(c, 3, 1) for c in changes])
    first, last = seen[0], seen[-1]
    assert (first.lines != last.lines) == text_differs
    assert first.digest != last.digest


def test_a_column_added_again_with_another_default_changes_the_digest(feeder: tuple[LocalCluster, str]) -> None:
    """A column dropped and added again, the same name and type, another default: the rows show the new default
    with no tuple written, and the digest (its attnum, its missing value) changes."""
    seen = run_steps(*feeder, [("add a column", 3, 1), ("drop a column", 3, 1), ("add a column", 3, 2)])
    assert seen[1].lines != seen[3].lines
    assert seen[1].digest != seen[3].digest


def test_a_concurrent_transaction_committed_after_the_snapshot_changes_the_digest(
    feeder: tuple[LocalCluster, str],
) -> None:
    """A transaction that wrote before the first snapshot and commits after it: the snapshot after the commit has
    another digest and other text."""
    seen = run_steps(*feeder, [("begin concurrent", 1, 1), ("commit concurrent", 1, 1)])
    assert seen[0].digest == seen[1].digest
    assert seen[1].lines != seen[2].lines
    assert seen[1].digest != seen[2].digest


NAMED = """
DROP TABLE IF EXISTS named, target, cash;
CREATE TABLE target ();
CREATE TABLE named (id int, rel regclass);
INSERT INTO named VALUES (1, 'target');
CREATE TABLE cash (id int, amount money);
INSERT INTO cash VALUES (1, 12.5);
"""


def test_a_regclass_column_gets_the_content_digest(feeder: tuple[LocalCluster, str]) -> None:
    """A regclass column: the table gets the content digest, which a rename of the table the value names changes
    with the COPY text, though no tuple of it was written. A money column (its text follows lc_monetary) gets the
    content digest too."""
    cluster, db = feeder
    cluster.psql(NAMED, dbname=db)
    before = observe(cluster, db, "named")
    cluster.psql("ALTER TABLE target RENAME TO renamed", dbname=db)
    after = observe(cluster, db, "named")
    assert before.lines != after.lines
    assert before.digest != after.digest
    assert before.kind is ProofKind.CONTENT
    assert observe(cluster, db, "cash").kind is ProofKind.CONTENT


def test_a_digest_is_durable_once_its_snapshots_wal_is_flushed(feeder: tuple[LocalCluster, str]) -> None:
    """The WAL up to the snapshot's insert position is flushed (at once, or within the wait): durable; a position
    past anything flushed is not, so an identity digest taken there would not be stored."""
    cluster, db = feeder
    cluster.psql(SCHEMA, dbname=db)
    session = SnapshotSession.start(cluster.install.tool("psql"), cluster.conninfo(db))
    with session.process:
        seen = read_tables(session, [TableRequest("public", "p", None, wants_digest=True)])
        assert seen.context is not None
        assert durable(seen.context, session.query)
        ahead = dataclasses.replace(seen.context, wal_insert_lsn="FFFFFFFF/0")
        assert not durable(ahead, session.query)
        session.finish()
    session.close()


def test_servers_before_13_hash_the_identities_text(
    feeder: tuple[LocalCluster, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proof as PostgreSQL 11 and 12 take it (no hashtidextended: hashtextextended of the identities' text):
    nothing changed, the same digest; a value updated, another."""
    monkeypatch.setattr(digest, "_HASHTID_MAJOR", 99)
    seen = run_steps(*feeder, [("nothing", 3, 1), ("update a value", 3, 1)])
    assert seen[0].digest == seen[1].digest
    assert seen[1].digest != seen[2].digest
    assert seen[2].kind is ProofKind.IDENTITY
