"""Which buckets of a changed table the agent sends (fedload/feeder/delta.py says what a bucket and a delta state
are): the table's buckets counted in the dump's snapshot, compared with the state the superhub sent, and the state
the superhub keeps after this run. Pure apart from the statements' text, run by the caller's session. Standard
library only (the zipapp).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from fedload.feeder.binary_plan import FeederColumn, TablePlan, TableRequest
from fedload.feeder.delta import (
    KEY_TYPE_OIDS,
    MAX_SENT_SHARE,
    DeltaRequest,
    DeltaState,
    buckets_query,
    delta_basis,
    differing_buckets,
    dirty_buckets,
    encode_bits,
    parse_buckets,
    parse_new_rows,
    written_since_query,
)
from fedload.feeder.digest import FIRST_NORMAL_XID, XID_WRAP, covered, widened_xmin
from fedload.feeder.proof import ProofContext, ProofKind, proof_kind

__all__ = [
    "CountedBuckets",
    "TableDelta",
    "counted_against_state",
    "counted_buckets",
    "delta_head",
    "old_rows_sql",
    "table_delta",
]

_AGE_EXACT = 1 << 30  # far below 2^31, where age() wraps: the transactions begun since the snapshot count too


@dataclass(frozen=True)
class TableDelta:
    """A changed table's delta in the snapshot: the state it leaves, and the buckets sent (None: all of it)."""

    state: DeltaState
    key: tuple[tuple[str, int], ...]  # (name, type OID) on the feeder: how its rows are bucketed
    dirty: Optional[tuple[int, ...]]  # noqa: UP045 - Python 3.9 evaluates dataclass fields' types
    since: str  # the basis of the state the dirty buckets are counted against ("" where all goes)
    rows: int  # the table's rows in the snapshot
    sent: int  # of them, those sent: the dirty buckets' and the appended buckets' new ones (all where all goes)
    appended: tuple[int, ...] = ()  # buckets that only gained rows since the state: their new rows alone are sent
    new: str = "false"  # SQL true for a row (as `r`) written since the stored state: the appended buckets' rows

    @property
    def unchanged(self) -> bool:
        """Whether the table holds exactly the rows of the stored state: no bucket dirty, none appended to."""
        return self.dirty == () and not self.appended


@dataclass(frozen=True)
class CountedBuckets:
    """A table's rows counted by bucket in the snapshot, old and new against the stored state's xmin."""

    key: tuple[tuple[str, int], ...]  # (name, type OID) on the feeder: how its rows are bucketed
    found: dict[int, tuple[int, int]]  # (old, new) by bucket holding rows
    old: str = "false"  # the SQL that told old rows from new (`old_rows_sql`)
    # Whether `found` lists every bucket holding rows; else (counted against the stored state's counts) only those
    # that may differ from it: each of the others holds its stored rows (delta.py's `buckets_query`).
    listed_all: bool = True
    # Where every row of the stored state is still there (counted_against_state's first pass), the rows each bucket
    # gained instead of `found` (empty then): its other rows are the state's. The bookkeeping then costs the buckets
    # that gained, not every bucket.
    gained: Optional[dict[int, int]] = None  # noqa: UP045 - Python 3.9 evaluates dataclass fields' types


def counted_buckets(
    request: TableRequest,
    plan: TablePlan,
    feeder: Sequence[FeederColumn],
    *,
    context: ProofContext,
    query: Callable[[str], bytes],
) -> CountedBuckets | None:
    """The table's buckets counted, where the superhub asks for a delta and the table can have one (`_why_not`);
    None elsewhere (the table goes whole, and the superhub keeps no state of it)."""
    ask = request.delta
    types = {c.name: c.type_oid for c in feeder}
    if ask is None or _why_not(ask, plan, types, context):
        return None
    older_than = ask.state.xmin if ask.state is not None else 0
    key = tuple((name, types[name]) for name in ask.key)
    old = old_rows_sql(older_than, context.snapshot_xmax)
    found = parse_buckets(query(buckets_query((plan.schema, plan.name), key, ask.buckets, old)), ask.buckets)
    return CountedBuckets(key, found, old)


def counted_against_state(
    request: TableRequest,
    plan: TablePlan,
    feeder: Sequence[FeederColumn],
    counters: str,
    *,
    context: ProofContext,
    query: Callable[[str], bytes],
    probe: Callable[[], str],
) -> CountedBuckets | None:
    """The table's buckets counted against the state the superhub sent, where the snapshot's rows can be: the
    table can have a delta, the superhub holds its digest, and the state's basis and probe are this snapshot's. The
    rows then say by themselves whether the table changed (no identity proof is needed: `table_delta` finds no
    dirty bucket where none did). Where the table's `counters` do not say rows were updated or deleted since those
    stored, first by one pass that hashes the keys of the rows written since the state alone
    (`written_since_query`): where the old rows are as many as the state holds, they are the state's rows (each
    was in it), so a bucket holds its stored rows and its new ones. Elsewhere by every row's bucket, listing only
    the buckets that may differ from the stored counts (`buckets_query` given them), or every bucket where one that
    held rows holds none now. None where the rows cannot be counted against the state (`counted_buckets` then)."""
    ask = request.delta
    types = {c.name: c.type_oid for c in feeder}
    if ask is None or ask.state is None or not request.digest or _why_not(ask, plan, types, context):
        return None
    stored = ask.state
    basis = delta_basis(covered(plan, context), plan.columns, ask.key, ask.buckets)
    if stored.basis != basis or stored.probe != probe():
        return None
    key = tuple((name, types[name]) for name in ask.key)
    old = old_rows_sql(stored.xmin, context.snapshot_xmax)
    table = (plan.schema, plan.name)
    if not _rows_went(request.counters, counters):
        old_rows, new = parse_new_rows(query(written_since_query(table, key, ask.buckets, old)), ask.buckets)
        if old_rows == sum(stored.counts):
            return CountedBuckets(key, {}, old, gained=new)
    differing = differing_buckets(query(buckets_query(table, key, ask.buckets, old, stored.counts)), stored.counts)
    if differing is not None:
        return CountedBuckets(key, differing, old, listed_all=False)
    return CountedBuckets(key, parse_buckets(query(buckets_query(table, key, ask.buckets, old)), ask.buckets), old)


def _rows_went(stored: str, now: str) -> bool:
    """Whether the table's counters (fedload/feeder/digest.py: its file node, and its inserted, updated and deleted
    tuples) say it was rewritten or rows were updated or deleted since the `stored` ones: which pass to count its
    buckets by first, a hint, never trusted (PostgreSQL 15 and later report counts late, `track_counts` may be
    off: the pass itself tells)."""
    then, later = stored.split(), now.split()
    return len(then) == len(later) == 4 and (then[0] != later[0] or then[2:] != later[2:])


def old_rows_sql(older_than: int, snapshot_xmax: int) -> str:
    """SQL true for a row version (as `r`) written by a transaction older than `older_than` (64-bit; 0: none is
    old), in a snapshot whose xmax is `snapshot_xmax`. Where the stored xmin is less than 2^30 transactions behind,
    by `age()`, which costs a row a subtraction, against the xmin widened through its text: a row is new where its
    age is from 1 to the stored xmin's (a transaction since), old past it, and old where its 32-bit age wraps
    negative or is 0 (2^31 transactions or more ago: only a frozen tuple, older than any stored xmin). A tuple
    frozen more than 2^32 transactions ago may look new, as with the widened xmin: its bucket is sent, no more."""
    if older_than <= 0:
        return "false"
    low = older_than % XID_WRAP
    if low < FIRST_NORMAL_XID or not 0 <= snapshot_xmax - older_than < _AGE_EXACT:
        return f"{widened_xmin(snapshot_xmax)} < {older_than}"
    # The threshold's age, once per statement: age() counts from the same transaction ID through the statement.
    threshold = f"(SELECT pg_catalog.age('{low}'::xid)::int8)"
    return f"(pg_catalog.age(r.xmin)::int8 + {XID_WRAP - 1}) % {XID_WRAP} >= {threshold}"


def table_delta(
    request: TableRequest,
    plan: TablePlan,
    counted: CountedBuckets,
    *,
    context: ProofContext,
    probe: str,
) -> TableDelta:
    """The table's delta from its `counted` buckets: the state it leaves, and the dirty buckets to send, counted
    against the state the superhub holds (all of the table where there is none, or it is not comparable, or too
    much changed)."""
    ask = request.delta
    assert ask is not None  # counted_buckets counts only where a delta is asked
    stored = ask.state
    counts = _counts(counted, stored, ask.buckets)
    basis = delta_basis(covered(plan, context), plan.columns, ask.key, ask.buckets)
    state = DeltaState(basis, ask.buckets, context.snapshot_xmin, counts, probe)
    rows = sum(counts)
    if stored is None or stored.basis != basis or stored.probe != probe:
        return TableDelta(state, counted.key, None, "", rows, rows)
    if counted.gained is not None:  # every stored row is there: a bucket that gained only gained
        gains = counted.gained
        dirty = sorted(gains)
        appended = tuple(dirty) if ask.append else ()
    else:
        dirty = dirty_buckets(stored.counts, counted.found, listed_all=counted.listed_all)
        appended = tuple(b for b in dirty if ask.append and _only_gained(counted.found.get(b), stored.counts[b]))
        gains = {b: counted.found[b][1] for b in appended}
    if len(dirty) > MAX_SENT_SHARE * ask.buckets:
        return TableDelta(state, counted.key, None, "", rows, rows)
    whole = tuple(sorted(set(dirty) - set(appended)))
    sent = sum(counts[b] for b in whole) + sum(gains[b] for b in appended)
    written_since = f"NOT ({counted.old})"
    return TableDelta(state, counted.key, whole, stored.basis, rows, sent, appended, written_since)


def _counts(counted: CountedBuckets, stored: DeltaState | None, buckets: int) -> tuple[int, ...]:
    """Each bucket's rows in the snapshot: the stored counts and the gains, or the counted old and new rows (of
    the buckets listed, the others' stored counts where not every bucket is)."""
    if counted.gained is not None:
        assert stored is not None  # counted_against_state counts gains only against a state
        counts = list(stored.counts)
        for bucket, gain in counted.gained.items():
            counts[bucket] += gain
        return tuple(counts)
    if not counted.listed_all:
        assert stored is not None  # counted_against_state lists the differing buckets only against a state
        counts = list(stored.counts)
    else:
        counts = [0] * buckets
    for bucket, (old, new) in counted.found.items():
        counts[bucket] = old + new
    return tuple(counts)


def _only_gained(found: tuple[int, int] | None, stored: int) -> bool:
    """Whether a bucket holds every row it held at the stored state, and more: its old rows (written before that
    state's snapshot, so in it, and unchanged since) are as many as it held, so they are those rows; the others
    are new."""
    return found is not None and found[0] == stored and found[1] > 0


def _why_not(ask: DeltaRequest, plan: TablePlan, types: dict[str, int], context: ProofContext) -> str:
    """Why the table can have no delta ("" where it can): its rows' identities must prove them (the identity
    proof's conditions), the key must be sent, of types whose text is the same everywhere."""
    if not plan.binary:
        return "it goes as text"
    facts = context.tables.get((plan.schema, plan.name))
    if facts is None or context.snapshot_xmin <= 0:
        return "the snapshot's facts are missing"
    kind, why = proof_kind(facts, context, plan.columns)
    if kind is not ProofKind.IDENTITY:
        return why
    for name in ask.key:
        if name not in plan.columns or types.get(name) not in KEY_TYPE_OIDS:
            return f"key column {name} is not sent, or not of a type whose text is fixed"
    return ""


def delta_head(delta: TableDelta | None) -> dict[str, Any] | None:
    """The section head's `delta`: the state to keep, and where only some buckets are sent, which ones, counted
    against which state, and the rows of the table and of the data sent."""
    if delta is None:
        return None
    head: dict[str, Any] = {"state": delta.state.to_json(), "rows": delta.rows}
    if delta.dirty is not None:
        head.update(since=delta.since, dirty=encode_bits(delta.dirty, delta.state.buckets), sent=delta.sent)
        if delta.appended:
            head["appended"] = encode_bits(delta.appended, delta.state.buckets)
    return head
