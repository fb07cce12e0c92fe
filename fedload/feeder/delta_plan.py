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
    dirty_buckets,
    encode_bits,
    parse_buckets,
)
from fedload.feeder.digest import covered, widened_xmin
from fedload.feeder.proof import ProofContext, ProofKind, proof_kind

__all__ = ["TableDelta", "delta_head", "table_delta"]


@dataclass(frozen=True)
class TableDelta:
    """A changed table's delta in the snapshot: the state it leaves, and the buckets sent (None: all of it)."""

    state: DeltaState
    key: tuple[tuple[str, int], ...]  # (name, type OID) on the feeder: how its rows are bucketed
    dirty: Optional[tuple[int, ...]]  # noqa: UP045 - Python 3.9 evaluates dataclass fields' types
    since: str  # the basis of the state the dirty buckets are counted against ("" where all goes)
    rows: int  # the table's rows in the snapshot
    sent: int  # of them, those in the dirty buckets (all where all goes)


def table_delta(
    request: TableRequest,
    plan: TablePlan,
    feeder: Sequence[FeederColumn],
    *,
    context: Optional[ProofContext],  # noqa: UP045 - the zipapp runs on Python 3.9
    probe: str,
    query: Callable[[str], bytes],
) -> TableDelta | None:
    """The table's delta where the superhub asks for one and the table can have one (`_why_not`); None elsewhere
    (the table goes whole, and the superhub keeps no state of it)."""
    ask = request.delta
    types = {c.name: c.type_oid for c in feeder}
    if ask is None or context is None or _why_not(ask, plan, types, context):
        return None
    stored = ask.state
    older_than = stored.xmin if stored is not None else 0
    table = (plan.schema, plan.name)
    key = tuple((name, types[name]) for name in ask.key)
    widened = widened_xmin(context.snapshot_xmax)
    found = parse_buckets(query(buckets_query(table, key, ask.buckets, widened, older_than)), ask.buckets)
    counts = tuple(sum(found.get(b, (0, 0))) for b in range(ask.buckets))
    basis = delta_basis(covered(plan, context), plan.columns, ask.key, ask.buckets)
    state = DeltaState(basis, ask.buckets, context.snapshot_xmin, counts, probe)
    rows = sum(counts)
    if stored is None or stored.basis != basis or stored.probe != probe:
        return TableDelta(state, key, None, "", rows, rows)
    dirty = dirty_buckets(stored.counts, found)
    if len(dirty) > MAX_SENT_SHARE * ask.buckets:
        return TableDelta(state, key, None, "", rows, rows)
    return TableDelta(state, key, tuple(dirty), stored.basis, rows, sum(counts[b] for b in dirty))


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
    return head
