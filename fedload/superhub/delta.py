"""Changed rows only (issue #55; docs/unchanged.md, "Changed rows only"): in binary mode, a changed table whose
parent has a key of fixed-text types (its primary key, or its NOT NULL columns) is asked as buckets
(fedload/feeder/delta.py); where the agent sends only the changed buckets, the swap's transaction replaces the
feeder's rows of those buckets in its partition, in place, and the partition then holds exactly the feeder's rows,
or the run fails.

What the agent says is checked before it is believed: a delta only where one was asked, counted against the very
state this superhub sent, its bucket count the one asked, its counts and bitmap of exactly that many buckets, the
rows sent those its counts give the dirty buckets. In the swap the superhub checks what it holds against its own
stored counts (the partition's rows, and the rows of the dirty buckets it deletes), that every row sent falls in a
dirty bucket by its own hash, and that the partition ends with the feeder's rows: a dump error otherwise, the
run's transaction rolled back and the table's state forgotten (the next run sends it whole). A feeder can only ever
touch its own partition this way, as with any other data it sends.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import asyncpg

from fedload.errors import DumpError
from fedload.feeder.delta import (
    KEY_TYPE_OIDS,
    MAX_BUCKETS,
    MIN_BUCKETS,
    PROBE_QUERY,
    DeltaRequest,
    DeltaState,
    bitmap,
    bucket_sql,
    decode_bits,
    parse_state,
)
from fedload.log import get_logger
from fedload.names import TableName
from fedload.superhub.schema import ParentTable, ident

__all__ = [
    "MAX_REQUEST_STATES_CHARS",
    "MAX_STATE_CHARS",
    "DeltaHead",
    "DeltaRefusedError",
    "StagedDelta",
    "apply_delta",
    "buckets_for",
    "checked_delta",
    "delta_key",
    "probe_here",
    "stored_state",
]

MAX_STATE_CHARS = 24_000  # a state past this (its counts' text) is not sent back: the command line has its bounds
# All the states of one request: Linux takes one argument (sshd's `sh -c COMMAND`, or SSH_ORIGINAL_COMMAND) of at
# most 128 KiB; the rest of the request needs room too.
MAX_REQUEST_STATES_CHARS = 64_000
_ROWS_PER_BUCKET = 4  # a new state's buckets: about this many rows each, within MIN_BUCKETS..MAX_BUCKETS
_PLAIN_KEY = re.compile(r"PRIMARY KEY \(([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*)\)")
_MAX_ROWS = 2**63 - 1
log = get_logger()


@dataclass(frozen=True, slots=True)
class DeltaHead:
    """A binary section's `delta`, checked: the state to keep, and where only some buckets came, which."""

    state: DeltaState
    rows: int  # the table's rows on the feeder
    dirty: frozenset[int] | None  # None: the section holds the whole table
    sent: int  # rows the section holds
    appended: frozenset[int] = frozenset()  # buckets that only gained rows: the section holds those rows alone


def delta_key(parent: ParentTable, feeder_key: str) -> tuple[str, ...] | None:
    """The columns a parent's rows are bucketed by, each of a type whose text is the same on every server
    (KEY_TYPE_OIDS): its primary key less the feeder key, or without one its NOT NULL columns of such types (a
    bucket needs no unique key: it is all the rows whose key hashes to it); None where there is none such."""
    spelled = next((i.constraint_sql for i in parent.indexes if (i.constraint_sql or "").startswith("PRIMARY")), None)
    if spelled is not None:
        found = _PLAIN_KEY.fullmatch(spelled)
        key = tuple(n for n in found[1].split(", ") if n != feeder_key) if found is not None else ()
        columns = [parent.column(name) for name in key]
        fixed = all(c is not None and c.generated_sql is None and c.binary_type_oid in KEY_TYPE_OIDS for c in columns)
        return key if key and fixed else None
    chosen = tuple(
        c.name
        for c in parent.columns
        if c.not_null and c.generated_sql is None and c.binary_type_oid in KEY_TYPE_OIDS and c.name != feeder_key
    )
    return chosen or None


def buckets_for(rows: int) -> int:
    """A new state's bucket count for a table of `rows` rows: a power of two near rows / _ROWS_PER_BUCKET."""
    want = max(MIN_BUCKETS, min(MAX_BUCKETS, rows // _ROWS_PER_BUCKET))
    return 1 << (want - 1).bit_length()


async def probe_here(conn: asyncpg.Connection) -> str | None:
    """This superhub's bucket hashes of the fixed values: a state is sent back only where the feeder's are the
    same; None on a server without them (before PostgreSQL 11: no delta is asked)."""
    try:
        return str(await conn.fetchval(PROBE_QUERY.rstrip(";")))
    except asyncpg.UndefinedFunctionError:
        return None


def stored_state(text: str, key: tuple[str, ...], rows: int, probe: str) -> DeltaRequest:
    """The request for a table whose stored state is `text` ("" for none), `rows` rows when last loaded: the state
    sent back where it is sound, of this superhub's probe and not too long; a new state asked otherwise."""
    if text and len(text) <= MAX_STATE_CHARS:
        try:
            found = json.loads(text)
            buckets = found.get("buckets") if isinstance(found, dict) else None
            state = parse_state(found, buckets if type(buckets) is int else 0)
        except ValueError:
            state = None
        if state is not None and state.probe == probe:
            return DeltaRequest(key, state.buckets, state, append=True)
    return DeltaRequest(key, buckets_for(rows), append=True)


def checked_delta(head: Any, asked: DeltaRequest | None, *, table: TableName, feeder: str) -> DeltaHead | None:
    """A section head's `delta` (None: none sent), held to what this superhub asked; DumpError naming the feeder
    and the table otherwise."""
    if head is None:
        return None
    try:
        return _checked(head, asked)
    except ValueError as exc:
        raise DumpError(f"table {table}: feeder {feeder} sent a delta that is refused: {exc}") from None


def _checked(head: Any, asked: DeltaRequest | None) -> DeltaHead:
    if asked is None:
        raise ValueError("this superhub asked for none")
    if not isinstance(head, dict):
        raise ValueError("it is not a JSON object")  # noqa: TRY004 - the feeder's data is wrong, not a type
    state = parse_state(head.get("state"), asked.buckets)
    rows = head.get("rows")
    if type(rows) is not int or rows != sum(state.counts) or not 0 <= rows <= _MAX_ROWS:
        raise ValueError("its rows are not the sum of its counts")
    if head.get("dirty") is None:
        return DeltaHead(state, rows, None, rows)
    if asked.state is None or head.get("since") != asked.state.basis:
        raise ValueError("its changed buckets are not counted against the state this superhub sent")
    dirty = head["dirty"]
    if not isinstance(dirty, str):
        raise ValueError("its changed buckets are not a bitmap")  # noqa: TRY004 - as above
    buckets = decode_bits(dirty, asked.buckets)
    appended = _appended(head.get("appended"), asked, state, buckets)
    gained = sum(state.counts[b] - asked.state.counts[b] for b in appended)
    sent = head.get("sent")
    if type(sent) is not int or sent != sum(state.counts[b] for b in buckets) + gained:
        raise ValueError("the rows it sends are not those of its changed buckets")
    return DeltaHead(state, rows, buckets, sent, appended)


def _appended(found: object, asked: DeltaRequest, state: DeltaState, dirty: frozenset[int]) -> frozenset[int]:
    """A delta's `appended` buckets, checked: asked for, none of them dirty, each holding more rows than the state
    this superhub sent gives it (what the section holds of it are those rows alone)."""
    if found is None:
        return frozenset()
    if not asked.append or not isinstance(found, str):
        raise ValueError("its appended buckets are not a bitmap asked for")
    appended = decode_bits(found, asked.buckets)
    assert asked.state is not None  # _checked: changed buckets come only against the state sent
    if appended & dirty or any(state.counts[b] <= asked.state.counts[b] for b in appended):
        raise ValueError("its appended buckets are changed ones, or gained no rows")
    return appended


@dataclass(frozen=True, slots=True)
class StagedDelta:
    """A staged table that holds a delta: its parent, staging table, key and checked head, and the rows its
    partition held when this superhub stored the state the delta is counted against."""

    parent: ParentTable
    stage_sql: str
    key: tuple[tuple[str, int], ...]  # (name, type OID) here: how its rows are bucketed
    head: DeltaHead
    stored_rows: int
    stored_counts: tuple[int, ...]  # rows per bucket of the state the delta is counted against


async def apply_delta(conn: asyncpg.Connection, table: StagedDelta, partition: str) -> None:
    """Replace the partition's rows of the delta's dirty buckets by the staging table's (in the swap's
    transaction), checked: DumpError where a row sent is not in a dirty bucket, the partition does not hold what
    this superhub stored, or it would not hold the feeder's rows."""
    delta = table.head
    assert delta.dirty is not None
    bucket = bucket_sql(table.key, delta.state.buckets)
    await _check_sent(conn, table, bucket)
    held = await conn.fetchval(f"SELECT count(*) FROM {partition}")  # noqa: S608 - catalog name
    if held != table.stored_rows:
        raise _refused(table, f"its partition holds {held} rows, not the {table.stored_rows} this superhub stored")
    deleted = await _delete_dirty(conn, partition, bucket, delta) if delta.dirty else 0  # appended only: no scan
    if deleted != (stored := sum(table.stored_counts[b] for b in delta.dirty)):
        raise _refused(table, f"its changed buckets held {deleted} rows here, not the {stored} stored")
    inserted = await _insert_sent(conn, table, partition)
    if (after := held - deleted + inserted) != delta.rows:
        raise _refused(table, f"its partition would hold {after} rows, the feeder has {delta.rows}")
    name, buckets, appended = table.parent.qualified_name, len(delta.dirty), len(delta.appended)
    log.info("swap.changed_rows", table=name, deleted=deleted, inserted=inserted, buckets=buckets, appended=appended)


async def _delete_dirty(conn: asyncpg.Connection, partition: str, bucket: str, delta: DeltaHead) -> int:
    """Delete the partition's rows of the delta's dirty buckets (each row's bucket hashed); how many."""
    assert delta.dirty is not None
    mask = bitmap(delta.dirty, delta.state.buckets)
    where = f"pg_catalog.get_bit($1::bytea, {bucket}) = 1"
    status = await conn.execute(f"DELETE FROM {partition} AS r WHERE {where}", mask)  # noqa: S608 - built here
    return int(status.rsplit(" ", 1)[1])


async def _check_sent(conn: asyncpg.Connection, table: StagedDelta, bucket: str) -> None:
    """DumpError unless every row sent is in a bucket the delta changed or appended to by this superhub's own
    hash, and each such bucket holds the rows the feeder's counts give it: all of a changed bucket's, the rows an
    appended one gained."""
    delta = table.head
    assert delta.dirty is not None
    counts, stored = delta.state.counts, table.stored_counts
    expected = {b: counts[b] for b in delta.dirty} | {b: counts[b] - stored[b] for b in delta.appended}
    rows = await conn.fetch(f"SELECT {bucket}, count(*) FROM {table.stage_sql} AS r GROUP BY 1")  # noqa: S608
    found: dict[int, int] = {row[0]: row[1] for row in rows}
    if outside := sum(n for b, n in found.items() if b not in expected):
        raise _refused(table, f"{outside} row(s) sent are not in a changed bucket by this superhub's hash")
    wrong = next((b for b, n in expected.items() if found.get(b, 0) != n), None)
    if wrong is not None:
        got = found.get(wrong, 0)
        raise _refused(table, f"bucket {wrong} holds {got} row(s) sent, not the {expected[wrong]} its counts give it")


async def _insert_sent(conn: asyncpg.Connection, table: StagedDelta, partition: str) -> int:
    """Insert the staging table's rows into the partition and drop it; the rows inserted. DumpError where they
    break a constraint (a key twice): the feeder's rows, as in a whole load."""
    columns = ", ".join(ident(c.name) for c in table.parent.columns if c.generated_sql is None)
    try:
        status = await conn.execute(
            f"INSERT INTO {partition} ({columns}) SELECT {columns} FROM {table.stage_sql}"  # noqa: S608 - built here
        )
    except asyncpg.IntegrityConstraintViolationError as exc:
        raise DumpError(
            f"table {table.parent.qualified_name}: the feeder's changed rows break a constraint: {exc}"
        ) from None
    await conn.execute(f"DROP TABLE {table.stage_sql}")
    return int(status.rsplit(" ", 1)[1])


class DeltaRefusedError(DumpError):
    """A delta that does not add up here: the table's state is forgotten, and the next run sends it whole."""

    def __init__(self, message: str, table: TableName) -> None:
        super().__init__(message)
        self.table = table


def _refused(table: StagedDelta, why: str) -> DeltaRefusedError:
    return DeltaRefusedError(
        f"table {table.parent.qualified_name}: the changed rows the feeder sent do not add up here: {why}; "
        "its delta state is forgotten and the next run sends it whole",
        table.parent.table,
    )
