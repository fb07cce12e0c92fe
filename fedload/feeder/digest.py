"""A table's digest, computed by the agent in the dump's own snapshot (the binary mode's psql session, or the one
whose snapshot pg_dump reads), so a table whose digest the superhub already holds need not be sent again (issues #46,
#55; docs/unchanged.md, "How a table is proven unchanged", says why each proof is safe).

Two proofs, told apart in what is hashed (`ProofKind`, fedload/feeder/proof.py decides):

- the tuple identities: the count and two exact sums of a 64-bit hash (two seeds) of every row version's
  (xmin as a 64-bit transaction ID, ctid), with the server, the output settings, the columns as stored and the
  labels of the enums they use. It reads no values: a table is asked it whenever the superhub asks for a digest;
- the content, where a column's output could change with no tuple written (reg* types, money, types not built in)
  or the identities prove nothing (a standby, a table access method other than heap, a server older than 11):
  every row's exact text, `md5(ROW(col, ...)::text)` (a record's text tells NULL from '' and 1 from 1.0), its
  halves summed into exact numerics (the sums do not depend on the rows' order). It reads the whole table, so it is
  computed only where the table's counters (its file node and inserted, updated and deleted tuples,
  `pg_stat_get_tuples_*`) are those the superhub stored with its digest: they can only say "changed for sure".

Count, sums and what else the proof covers are hashed into one SHA-256 hex string, tagged with the proof and
DIGEST_VERSION: a digest of an older agent never equals one of these (the first round after an upgrade sends the
table). An identity digest is stored only once the WAL of every transaction its snapshot sees is flushed
(`durable`): a commit lost in a crash would let its transaction ID be given again.

Pure apart from the statements' text and the queries run by its caller's session: no process of its own. Standard
library only (the zipapp).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from fedload.feeder.binary_plan import FeederColumn, TablePlan, TableRequest, quote_ident
from fedload.feeder.proof import ProofContext, ProofKind, enum_labels, proof_kind
from fedload.feeder.sql_text import serially

__all__ = [
    "DIGEST_VERSION",
    "FIRST_NORMAL_XID",
    "XID_WRAP",
    "TableDigest",
    "content_query",
    "counters_query",
    "covered",
    "durable",
    "full_xmin",
    "identity_query",
    "parse_counters",
    "parse_digest",
    "table_digest",
    "unchanged",
    "widened_xmin",
]

DIGEST_VERSION = 2  # what the proofs hash and how: a change makes every stored digest differ
_TAG = "fedload table digest"  # first of what is hashed; version 1 hashed a list that began with the number 1
_SEEDS = (0x5EED_F00D, 0x0DDB_A11)  # hashtextextended's seeds: two independent 64-bit hashes of an identity
XID_WRAP = 1 << 32  # 32-bit transaction IDs wrap
FIRST_NORMAL_XID = 3  # 0 to 2: invalid, bootstrap, frozen, whose age() is INT_MAX
_INT_MAX = 2**31 - 1  # age() of a special xid
_HASHTID_MAJOR = 13  # hashtidextended
_LSN = re.compile("[0-9A-F]{1,8}/[0-9A-F]{1,8}")
_DURABLE_WAIT_S = 1.0  # the WAL writer flushes an asynchronous commit within 3 x wal_writer_delay (200 ms)
_DURABLE_POLL_S = 0.1


@dataclass(frozen=True)
class TableDigest:
    """A table's proof in the snapshot: its rows, the digest, and which proof it is."""

    rows: int
    digest: str
    kind: ProofKind = ProofKind.CONTENT


def table_digest(
    request: TableRequest,
    plan: TablePlan,
    feeder: Sequence[FeederColumn],
    counters: str,
    *,
    context: Optional[ProofContext],  # noqa: UP045 - the zipapp runs on Python 3.9
    query: Callable[[str], bytes],
) -> TableDigest | None:
    """The table's digest, computed by `query` (a statement run in the dump's snapshot) where it is asked for: the
    identity proof always, the content digest only where the table's `counters` now are those the superhub stored;
    None elsewhere (the table is sent without one)."""
    if not request.wants_digest:
        return None
    facts = context.tables.get((plan.schema, plan.name)) if context is not None else None
    if context is not None and facts is not None and proof_kind(facts, context, plan.columns)[0] is ProofKind.IDENTITY:
        return parse_digest(query(identity_query(plan, context.snapshot_xmax, context.major)), plan, feeder, context)
    if not (request.counters and request.counters == counters):
        return None
    return parse_digest(query(content_query(plan)), plan, feeder)


def unchanged(digest: TableDigest | None, request: TableRequest) -> tuple[int, str] | None:
    """(rows, digest) where the table's digest is the one the superhub holds (it is not sent); None elsewhere."""
    return (digest.rows, digest.digest) if digest is not None and digest.digest == request.digest else None


def _source(plan: TablePlan) -> str:
    return f"ONLY {quote_ident(plan.schema)}.{quote_ident(plan.name)} AS r"


def identity_query(plan: TablePlan, snapshot_xmax: int, major: int) -> str:
    """One statement printing `count|sum of one hash|sum of the other` of the table's row versions' identities:
    xmin as the 64-bit transaction ID it is in the snapshot (`full_xmin`), and ctid. From PostgreSQL 13
    `hashtidextended` hashes the ctid seeded by the ID; before, `hashtextextended` their text."""
    full = full_xmin(snapshot_xmax)
    if major >= _HASHTID_MAJOR:
        ids, hashed = f"r.ctid, {full} AS x", "pg_catalog.hashtidextended(ids.ctid, ids.x # {seed})"
    else:
        ids, hashed = f"{full}::text || r.ctid::text AS i", "pg_catalog.hashtextextended(ids.i, {seed})"
    sums = ", ".join(f"coalesce(sum({hashed.format(seed=seed)}), 0)" for seed in _SEEDS)
    # OFFSET 0 keeps the subquery apart: flattened, its identity would be computed once per hash.
    rows = f"SELECT {ids} FROM {_source(plan)} OFFSET 0"  # noqa: S608 - identifiers quoted
    return serially(f"SELECT count(*), {sums} FROM ({rows}) AS ids;")  # noqa: S608 - built above


def full_xmin(snapshot_xmax: int, alias: str = "r") -> str:
    """SQL of a row version's xmin as the 64-bit transaction ID it is, in a snapshot whose xmax is `snapshot_xmax`:
    the ID `age()` counts from, less the row's age. age() counts from the next ID when the statement's
    transaction first asked (at or past the snapshot's xmax, and the same through the transaction) and costs a row a
    subtraction, where the xmin's text (xidout, then int8in) cost a third of a scan. Exact for every tuple less
    than 2^31 transactions old, so for every tuple not frozen (the server freezes them before); one frozen longer
    ago shows the ID with its 32 bits within 2^31 of the next, which moves once past 2^31 more. A special xid
    (bootstrap; frozen by a release before 9.4: 2), whose age is INT_MAX, is its 32 bits."""
    low = snapshot_xmax % XID_WRAP
    known = FIRST_NORMAL_XID  # an xid whose age gives the ID age() counts from
    ahead = f"((pg_catalog.age('{known}'::xid)::int8 + {known} - {low}) % {XID_WRAP} + {XID_WRAP}) % {XID_WRAP}"
    counted_from = f"(SELECT {snapshot_xmax} + {ahead})"  # once per statement
    age = f"NULLIF(pg_catalog.age({alias}.xmin), {_INT_MAX})"
    return f"coalesce({counted_from} - {age}, {alias}.xmin::text::int8)"


def widened_xmin(snapshot_xmax: int, alias: str = "r") -> str:
    """SQL of a row version's xmin as the 64-bit transaction ID it is in a snapshot whose xmax is `snapshot_xmax`:
    the latest ID below that xmax with those 32 bits, never older than the true one (a tuple frozen long ago may
    show a later one). Through the xmin's text: where `full_xmin`'s age cannot count (a stored xmin far behind)."""
    last = snapshot_xmax - 1
    return f"({last} - (({last} - {alias}.xmin::text::int8) % {XID_WRAP} + {XID_WRAP}) % {XID_WRAP})"


def covered(plan: TablePlan, context: ProofContext) -> list[Any]:
    """What an identity proof of the plan's table covers besides its rows: the server, the output settings, the
    table's OID, its columns as stored and the labels of the enums they use."""
    facts = context.tables[plan.schema, plan.name]
    labels = enum_labels(facts, context.types)
    stored = [list(c) for c in facts.columns]
    return [list(context.server), list(context.settings), facts.oid, stored, labels]


def content_query(plan: TablePlan) -> str:
    """One statement printing `count|sum of the hashes' high halves|sum of their low halves` of the rows' text for
    the plan's table and columns (identifiers quoted here)."""
    columns = ", ".join(f"r.{quote_ident(c)}" for c in plan.columns)
    halves = ", ".join(f"coalesce(sum(('x' || substr(h, {start}, 16))::bit(64)::int8), 0)" for start in (1, 17))
    rows = f"SELECT md5(ROW({columns})::text) AS h FROM {_source(plan)}"  # noqa: S608 - identifiers quoted here
    return f"SELECT count(*), {halves} FROM ({rows}) AS hashed;"  # noqa: S608 - built above


def parse_digest(
    printed: bytes,
    plan: TablePlan,
    feeder: Sequence[FeederColumn],
    context: Optional[ProofContext] = None,  # noqa: UP045 - the zipapp runs on Python 3.9
) -> TableDigest:
    """The digest from what `identity_query` (with the `context` it was run in) or `content_query` (without)
    printed; ValueError if it is not its answer."""
    count, first, second = (int(n) for n in printed.decode().strip().split("|"))
    kind = ProofKind.CONTENT if context is None else ProofKind.IDENTITY
    covering: list[Any] = [[c.name, c.type_oid, c.type_sql] for c in feeder]
    if context is not None:
        covering = covered(plan, context)
    content = [_TAG, DIGEST_VERSION, kind.value, covering, list(plan.columns), count, first, second]
    digest = hashlib.sha256(json.dumps(content).encode()).hexdigest()
    return TableDigest(count, digest, kind)


def durable(context: ProofContext, query: Callable[[str], bytes]) -> bool:
    """Whether the WAL up to the snapshot's insert position is flushed (waiting up to `_DURABLE_WAIT_S`), so no
    transaction the snapshot sees can be lost in a crash and its ID given again; False in recovery."""
    lsn = context.wal_insert_lsn
    if not _LSN.fullmatch(lsn):
        return False
    # The insert position may lie just past a page header that nothing flushed yet: the records end before it.
    at = f"(pg_catalog.pg_lsn '{lsn}' - pg_catalog.pg_lsn '0/0')"
    header = f"({at} % pg_catalog.current_setting('wal_block_size')::numeric)"
    flushed = "(pg_catalog.pg_current_wal_flush_lsn() - pg_catalog.pg_lsn '0/0')"
    statement = f"SELECT {flushed} >= {at} - CASE WHEN {header} <= 40 THEN {header} ELSE 0 END;"
    for _ in range(round(_DURABLE_WAIT_S / _DURABLE_POLL_S)):
        if query(statement).strip() == b"t":
            return True
        query(f"SELECT pg_catalog.pg_sleep({_DURABLE_POLL_S});")
    return query(statement).strip() == b"t"


_COUNTERS = (
    "SELECT coalesce(json_agg(json_build_array(n.nspname, c.relname, concat_ws(' ', pg_relation_filenode(c.oid), "
    "pg_stat_get_tuples_inserted(c.oid), pg_stat_get_tuples_updated(c.oid), pg_stat_get_tuples_deleted(c.oid)))), "
    "'[]') FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "JOIN json_array_elements(convert_from(decode('NAMES_HEX', 'hex'), 'UTF8')::json) r "
    "ON n.nspname = r->>0 AND c.relname = r->>1 WHERE c.relkind = 'r';"
)


def counters_query(requests: Sequence[TableRequest]) -> str:
    """One statement whose one value is a JSON list of [schema, name, counters] for the requested tables; the names
    travel hex-encoded, as in `catalog_query`."""
    names = json.dumps([[r.schema, r.name] for r in requests]).encode().hex()
    return _COUNTERS.replace("NAMES_HEX", names)


def parse_counters(printed: bytes) -> dict[tuple[str, str], str]:
    """The counters `counters_query` printed, by (schema, name); ValueError if it is not its answer."""
    return {(schema, name): str(counters) for schema, name, counters in json.loads(printed)}
