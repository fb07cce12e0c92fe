"""A row's transaction ID as the agent's queries take it, by `age()`, on real servers of each major: the identity
proof's 64-bit xmin (fedload/feeder/digest.py, `full_xmin`) is each row's transaction ID, frozen or not; the rows a
changed-rows pass counts as old (fedload/feeder/delta_plan.py, `old_rows_sql`) are those truly older than the
stored xmin, as by the xmin widened through its text, for thresholds at, before and past every row's
transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fedload.feeder.delta_plan import old_rows_sql
from fedload.feeder.digest import full_xmin, widened_xmin
from fedload.localpg import LocalCluster

pytestmark = pytest.mark.pg_major(15, 17, 18)

WRITES = 12  # transactions, each writing one row, with transaction IDs used up between them


@pytest.fixture(scope="module")
def rows(major_cluster: LocalCluster) -> Iterator[tuple[LocalCluster, list[int]]]:
    """A table t of rows from transactions apart, some frozen; each row's 64-bit xmin, in order."""
    major_cluster.psql("CREATE DATABASE old_rows")
    major_cluster.psql("CREATE TABLE t (id int)", dbname="old_rows")
    written = []
    for i in range(WRITES):
        for _ in range(i % 3):
            major_cluster.psql("SELECT txid_current()", dbname="old_rows")
        done = major_cluster.psql(f"INSERT INTO t VALUES ({i}) RETURNING txid_current()", dbname="old_rows")
        written.append(int(done.split()[0]))
        if i == WRITES // 2:
            major_cluster.psql("VACUUM FREEZE t", dbname="old_rows")
    yield major_cluster, written
    major_cluster.psql("DROP DATABASE old_rows")


def classified(cluster: LocalCluster, older_than: int) -> dict[int, tuple[bool, bool]]:
    """Each row's id: (old by old_rows_sql, old by the widened xmin), in one statement."""
    xmax = int(cluster.psql("SELECT txid_snapshot_xmax(txid_current_snapshot())", dbname="old_rows"))
    fast, widened = old_rows_sql(older_than, xmax), f"{widened_xmin(xmax)} < {older_than}"
    assert "age(" in fast
    printed = cluster.psql(f"SELECT r.id, {fast}, {widened} FROM t AS r", dbname="old_rows")
    found = {}
    for line in printed.split():
        row, by_age, by_text = line.split("|")
        found[int(row)] = (by_age == "t", by_text == "t")
    return found


def test_old_rows_by_age_are_those_by_the_widened_xmin(rows: tuple[LocalCluster, list[int]]) -> None:
    cluster, written = rows
    for xid in written:
        for older_than in (xid - 1, xid, xid + 1):
            found = classified(cluster, older_than)
            truly = {i: written[i] < older_than for i in range(WRITES)}
            assert {i: by_age for i, (by_age, _) in found.items()} == truly, older_than
            assert {i: by_text for i, (_, by_text) in found.items()} == truly, older_than


def test_the_identity_proofs_xmin_is_each_rows_transaction_id(rows: tuple[LocalCluster, list[int]]) -> None:
    """Rows frozen (their xmin kept) and not, in one statement and across two transactions."""
    cluster, written = rows
    for _ in range(2):
        xmax = int(cluster.psql("SELECT txid_snapshot_xmax(txid_current_snapshot())", dbname="old_rows"))
        printed = cluster.psql(f"SELECT r.id, {full_xmin(xmax)} FROM t AS r", dbname="old_rows")
        found = {int(row): int(xid) for row, xid in (line.split("|") for line in printed.split())}
        assert found == dict(enumerate(written))
        cluster.psql("SELECT txid_current()", dbname="old_rows")


def test_a_stored_xmin_far_behind_or_special_is_taken_through_the_widened_xmin() -> None:
    """No state: no row is old; a threshold 2^30 transactions or more behind, past the snapshot, or whose 32 bits
    are not a normal transaction ID: the widened xmin, exact there."""
    assert old_rows_sql(0, 1000) == "false"
    for older_than, xmax in ((5, 5 + 2**30), (2000, 1000), (2**32 + 1, 2**32 + 100)):
        assert old_rows_sql(older_than, xmax) == f"{widened_xmin(xmax)} < {older_than}"
    assert "age(" in old_rows_sql(2**32 + 3, 2**32 + 100)
