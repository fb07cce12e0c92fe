"""The delta state's encodings and the choice of dirty buckets (fedload/feeder/delta.py), pure."""

from __future__ import annotations

import base64
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedload.feeder.delta import (
    MAX_BUCKETS,
    DeltaState,
    changed_rows_where,
    decode_bits,
    decode_counts,
    dirty_buckets,
    encode_bits,
    encode_counts,
    parse_buckets,
    parse_delta_request,
    parse_new_rows,
    parse_state,
    state_digest,
)

POWERS = st.sampled_from([2**n for n in range(1, 10)])  # hypothesis draws lists of a few thousand at most


@given(buckets=POWERS, data=st.data())
def test_counts_and_bitmaps_come_back_as_they_went(buckets: int, data: st.DataObject) -> None:
    counts = data.draw(st.lists(st.integers(0, 2**63 - 1), min_size=buckets, max_size=buckets))
    assert decode_counts(encode_counts(counts), buckets) == tuple(counts)


@given(buckets=POWERS, data=st.data())
def test_small_counts_come_back_as_they_went(buckets: int, data: st.DataObject) -> None:
    """Counts around 127, where a count takes one byte or two: a state of one-byte counts is encoded a byte each."""
    counts = data.draw(st.lists(st.integers(0, 130), min_size=buckets, max_size=buckets))
    assert decode_counts(encode_counts(counts), buckets) == tuple(counts)
    dirty = data.draw(st.sets(st.integers(0, buckets - 1)))
    assert decode_bits(encode_bits(dirty, buckets), buckets) == dirty


@pytest.mark.parametrize(
    "text",
    [
        "not base64!",
        base64.b64encode(b"not zlib").decode(),
        base64.b64encode(zlib.compress(b"\x01" * 5)).decode(),  # 5 counts for 4 buckets
        base64.b64encode(zlib.compress(b"\x01" * 3)).decode(),  # 3
        base64.b64encode(zlib.compress(b"\x01\x01\x01\x81")).decode(),  # the last one unfinished
        base64.b64encode(zlib.compress(b"\x00" * 10_000_000)).decode(),  # a bomb: inflated no further than needed
        base64.b64encode(zlib.compress(b"\xff" * 10 + b"\x01" + b"\x00" * 3)).decode(),  # past 64 bits
    ],
)
def test_counts_that_are_not_exactly_the_buckets_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"."):  # each its own words
        decode_counts(text, 4)


def test_a_bitmap_of_other_buckets_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than its buckets need"):
        decode_bits(encode_bits({1}, 16), 8)


def state(**more: object) -> dict[str, object]:
    return DeltaState("a" * 64, 4, 100, (1, 2, 3, 4), "-42").to_json() | more


@pytest.mark.parametrize(
    "wrong",
    [
        {"basis": "A" * 64},
        {"basis": "a" * 63},
        {"buckets": 8},
        {"xmin": -1},
        {"xmin": True},
        {"xmin": 2**63},
        {"probe": "1e5"},
        {"probe": 7},
        {"counts": 3},
    ],
)
def test_a_state_out_of_its_bounds_is_refused(wrong: dict[str, object]) -> None:
    assert parse_state(state(), 4).counts == (1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"^its "):
        parse_state(state(**wrong), 4)


@pytest.mark.parametrize("buckets", [0, 1, 3, 6, MAX_BUCKETS * 2, True, "4"])
def test_a_request_for_other_bucket_counts_is_refused(buckets: object) -> None:
    with pytest.raises(ValueError, match="power of two"):
        parse_delta_request({"key": ["id"], "buckets": buckets, "state": None})


@pytest.mark.parametrize("key", [[], "id", [1], None])
def test_a_request_without_a_key_is_refused(key: object) -> None:
    with pytest.raises(ValueError, match="list of column names"):
        parse_delta_request({"key": key, "buckets": 4})


def test_a_bucket_is_dirty_with_a_new_row_or_not_the_old_rows_it_held() -> None:
    stored = (2, 0, 3, 1, 0)
    found = {0: (2, 0), 1: (0, 1), 2: (2, 0), 3: (1, 1)}  # bucket 4: still empty
    assert dirty_buckets(stored, found) == [1, 2, 3]
    assert dirty_buckets(stored, {1: (0, 0), 2: (3, 0), 3: (1, 0)}) == [0]  # bucket 0 emptied


def test_listed_against_the_state_a_bucket_not_listed_holds_its_stored_rows() -> None:
    """Counted against the stored counts, only the buckets that may differ are listed: one not listed is as stored,
    not emptied."""
    stored = (2, 0, 3, 1, 0)
    assert dirty_buckets(stored, {1: (0, 1), 3: (0, 0)}, listed_all=False) == [1, 3]
    assert dirty_buckets(stored, {}, listed_all=False) == []
    assert dirty_buckets(stored, {2: (3, 0)}, listed_all=False) == []  # listed (255 or more held), unchanged


def test_bucket_counts_are_read_as_printed() -> None:
    assert parse_buckets(b"3|1|2\n0|4|0\n", 4) == {3: (1, 2), 0: (4, 0)}
    assert parse_buckets(b"", 2) == {}


@pytest.mark.parametrize("printed", [b"4|1|0\n", b"-1|1|0\n", b"1|1|0\n1|2|0\n", b"1|1\n", b"1|1|0|9\n", b"x|1|0\n"])
def test_bucket_counts_that_are_not_the_answer_are_refused(printed: bytes) -> None:
    """A bucket past the count or twice, lines of other widths, a field not a number."""
    with pytest.raises(ValueError, match=r"bucket|invalid literal"):
        parse_buckets(printed, 4)


def test_rows_written_since_are_read_as_printed() -> None:
    """The old rows on the line of bucket -1 (0 where none is), the new ones by bucket."""
    assert parse_new_rows(b"-1|2995\n3|2\n0|1\n", 4) == (2995, {3: 2, 0: 1})
    assert parse_new_rows(b"1|5\n", 4) == (0, {1: 5})
    assert parse_new_rows(b"", 2) == (0, {})


@pytest.mark.parametrize("printed", [b"4|1\n", b"-2|1\n", b"1|1\n1|2\n", b"-1|1\n-1|1\n", b"1|1|0\n", b"x|1\n"])
def test_rows_written_since_that_are_not_the_answer_are_refused(printed: bytes) -> None:
    with pytest.raises(ValueError, match=r"bucket|lines|invalid literal"):
        parse_new_rows(printed, 4)


def test_with_no_bucket_dirty_the_new_rows_go_by_their_age_alone() -> None:
    """Every bucket holding new rows appended, none dirty: the COPY's rows are the new ones, no key hashed."""
    key = (("name", 25),)
    assert changed_rows_where(key, (), 8, (1, 5), "NOT (old)") == "(NOT (old))"
    both = changed_rows_where(key, iter([2]), 8, (1, 5), "NOT (old)")  # an iterable, taken once
    assert "hashtextextended" in both
    assert "'04'" in both  # bucket 2's bit
    assert "NOT (old)" in both


def test_a_state_digest_is_its_states_own() -> None:
    """Of any other state (an xmin, a count apart) another digest; 64 hexadecimal digits, as stored."""
    state = DeltaState("a" * 64, 4, 900, (1, 2, 0, 5), "12")
    digest = state_digest(state)
    assert len(digest) == 64
    assert int(digest, 16) >= 0
    assert digest == state_digest(DeltaState("a" * 64, 4, 900, (1, 2, 0, 5), "12"))
    assert digest != state_digest(DeltaState("a" * 64, 4, 901, (1, 2, 0, 5), "12"))
    assert digest != state_digest(DeltaState("a" * 64, 4, 900, (1, 2, 1, 5), "12"))
