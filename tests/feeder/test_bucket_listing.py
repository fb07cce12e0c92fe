"""A changed table's buckets counted against the stored state's counts (fedload/feeder/delta.py, `buckets_query`
given `held`, `differing_buckets`), on real servers: the buckets it lists, the others taken as holding their stored
rows, give the same dirty buckets and the same counts as every bucket listed, whatever the stored counts: equal,
off by a few, 255 and more (a byte's worth); where a bucket that held rows holds none now, it says it cannot."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedload.feeder.delta import bucket_sql, buckets_query, differing_buckets, dirty_buckets, parse_buckets
from fedload.localpg import LocalCluster

pytestmark = pytest.mark.pg_major(15, 17, 18)

# (table, its rows, buckets): few rows in many buckets (most empty), many rows in few (past 255 a bucket).
TABLES = {"sparse": (40, 64), "dense": (2000, 4), "even": (1000, 128)}
OLD = "r.id % 7 <> 0"  # which rows count as old: any SQL true for some rows and false for others


@pytest.fixture(scope="module")
def cluster(major_cluster: LocalCluster) -> Iterator[LocalCluster]:
    major_cluster.psql("CREATE DATABASE bucket_listing")
    for name, (rows, _) in TABLES.items():
        sql = f"CREATE TABLE {name} (id int PRIMARY KEY); INSERT INTO {name} SELECT generate_series(1, {rows})"
        major_cluster.psql(sql, dbname="bucket_listing")
    yield major_cluster
    major_cluster.psql("DROP DATABASE bucket_listing")


def _every(cluster: LocalCluster, name: str) -> dict[int, tuple[int, int]]:
    buckets = TABLES[name][1]
    query = buckets_query(("public", name), [("id", 23)], buckets, OLD)
    return parse_buckets(cluster.psql(query, dbname="bucket_listing").encode(), buckets)


def _differing(cluster: LocalCluster, table: str, held: list[int], old: str = OLD) -> dict[int, tuple[int, int]] | None:
    query = buckets_query(("public", table), [("id", 23)], len(held), old, held)
    return differing_buckets(cluster.psql(query, dbname="bucket_listing").encode(), held)


def _counts(held: list[int], found: dict[int, tuple[int, int]], *, listed_all: bool) -> list[int]:
    counts = [0] * len(held) if listed_all else list(held)
    for bucket, (old, new) in found.items():
        counts[bucket] = old + new
    return counts


@st.composite
def stored_counts(draw: st.DrawFn, truth: list[int]) -> list[int]:
    """Counts a state may hold against the table's true ones: most equal, some off, some 0, some large."""
    change = st.sampled_from(["same", "same", "same", "one more", "one less", "zero", "large"])
    held = []
    for count in truth:
        how = draw(change)
        held.append(
            {
                "same": count,
                "one more": count + 1,
                "one less": max(count - 1, 0),
                "zero": 0,
                "large": draw(st.integers(250, 600)),
            }[how]
        )
    return held


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_buckets_listed_against_the_state_give_every_buckets_answer(
    cluster: LocalCluster, data: st.DataObject
) -> None:
    name = data.draw(st.sampled_from(sorted(TABLES)))
    everything = _every(cluster, name)
    truth = _counts([0] * TABLES[name][1], everything, listed_all=True)
    held = data.draw(stored_counts(truth))
    against = _differing(cluster, name, held)
    emptied = any(h and not t for h, t in zip(held, truth, strict=True))
    assert (against is None) == emptied
    if against is None:
        return
    dirty = dirty_buckets(held, everything)
    assert dirty_buckets(held, against, listed_all=False) == dirty
    assert _counts(held, against, listed_all=False) == truth
    assert set(against) <= set(dirty) | {b for b, h in enumerate(held) if h >= 255}  # no more than may differ


def test_a_state_equal_to_the_rows_lists_only_the_buckets_with_new_rows(cluster: LocalCluster) -> None:
    """Nothing but the buckets that hold new rows is printed where the stored counts are the old rows'."""
    everything = _every(cluster, "even")
    held = [0] * TABLES["even"][1]
    for bucket, (old, _) in everything.items():
        held[bucket] = old
    against = _differing(cluster, "even", held)
    assert against is not None
    assert sorted(against) == sorted(b for b, (_, new) in everything.items() if new)
    assert len(against) < len(everything)


def test_a_bucket_that_held_255_rows_or_more_is_listed_whatever_it_holds(cluster: LocalCluster) -> None:
    """A stored count past a byte is sent as 255: a bucket holding exactly 255 rows against a state of 300 is
    listed (and dirty), not taken as unchanged."""
    rows = f"SELECT id FROM exact AS r WHERE {bucket_sql([('id', 23)], 2)} = 0 ORDER BY id OFFSET 255"
    cluster.psql(
        f"CREATE TABLE exact (id int); INSERT INTO exact SELECT generate_series(1, 1000); "
        f"DELETE FROM exact WHERE id IN ({rows})",
        dbname="bucket_listing",
    )
    against = _differing(cluster, "exact", [300, 0], old="true")
    assert against is not None
    assert against[0] == (255, 0)
    assert dirty_buckets([300, 0], against, listed_all=False)[0] == 0
