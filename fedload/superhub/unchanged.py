"""Unchanged tables (issue #46): a run asks the feeder's agent for each table's content digest, sends the digest it
holds where its own side of the load is as it was, and keeps the partition of a table the agent says is unchanged
(binary mode: in its section; copy and inserts modes: in the trailer, the table left out of pg_dump's dump, which
reads the digests' snapshot); the other tables are swapped as before, in the same transaction.

The superhub's side of the load is its fingerprint: the parent's definition, the feeder's remap of the table, the
import and transform settings, the feeder's key and dump mode, and fedload's version. A digest is sent only with the
fingerprint it was stored with, so any change there voids the skip. The agent's answer is checked: it may only call
a table unchanged with the very digest the superhub sent, and the partition kept must hold the digest's rows. A
feeder that lies can only keep its own previous data.

What the agent sends to be stored is checked on receipt against what was asked and what the agent itself accepts
(`received_digests`): a table asked about, once, its digest and counters in the formats of the agent's request
(fedload/feeder/binary_plan.py), its rows a bigint; anything else fails the run as a dump error, storing nothing. A
digest is asked only where it is well formed and the feeder's partition it describes is here (`plan_skips`), and an
agent that refuses the request makes the superhub forget the feeder's digests (`forget_refused`): the next run
sends every table. docs/unchanged.md says it for people.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING

import asyncpg

from fedload import __version__
from fedload.config import DumpMode, FeederConfig
from fedload.errors import AgentRefusedError, DumpError, one_line
from fedload.feeder.binary_plan import COUNTERS_FORMAT, DIGEST_FORMAT
from fedload.feeder.delta import DeltaRequest
from fedload.feeder.digest import DIGEST_VERSION
from fedload.log import get_logger
from fedload.names import TableName
from fedload.stream import Trailer
from fedload.superhub.bookkeeping.digests import StoredDigest, forget_digests, read_digests, write_digests
from fedload.superhub.bookkeeping.runs import last_load
from fedload.superhub.delta import MAX_REQUEST_STATES_CHARS, delta_key, probe_here, stored_state
from fedload.superhub.importer import Importer
from fedload.superhub.schema import ParentTable
from fedload.superhub.staged import StagedTable
from fedload.superhub.swap import feeder_partition
from transforms import Remap

if TYPE_CHECKING:
    from fedload.superhub.job import Job

__all__ = [
    "KeptPartitionError",
    "Skips",
    "digests_to_store",
    "fingerprint",
    "forget_on_failure",
    "forget_refused",
    "keep_unchanged",
    "loaded_rows",
    "plan_skips",
    "received_digests",
    "skips_unchanged",
    "store_digests",
]

FINGERPRINT_VERSION = 2  # what `fingerprint` covers (2: the dump mode too)
MAX_ROWS = 2**63 - 1  # a table's rows as PostgreSQL counts them (bigint): fedload.digests.rows
log = get_logger()


class KeptPartitionError(DumpError):
    """A partition the feeder calls unchanged is not as its digest says here: its digests are forgotten."""

    def __init__(self, message: str, tables: list[TableName]) -> None:
        super().__init__(message)
        self.tables = tables


@dataclass(frozen=True, slots=True)
class Skips:
    """A run's digests: the fingerprint of each table's load here, the digests stored, and those sent to the agent."""

    fingerprints: dict[TableName, str]
    stored: dict[TableName, StoredDigest]
    asked: dict[TableName, str]  # the digest sent with each table's request, where one is
    counters: dict[TableName, str]  # the counters sent (the digest's, or those of a table sent without one)
    deltas: dict[TableName, DeltaRequest] = field(default_factory=dict)  # binary mode: the changed rows asked for


def fingerprint(parent: ParentTable, remap: Remap | None, job: Job) -> str:
    """The superhub's side of a table's load, as a SHA-256 hex string."""
    rules = remap.for_table(parent.qualified_name) if remap is not None else None
    content = [
        FINGERPRINT_VERSION,
        DIGEST_VERSION,
        __version__,
        parent,
        rules,
        job.imports,
        job.transform,
        job.feeder.key,
        job.feeder.dump_mode,  # the superhub loads text, INSERTs or binary values: money's text follows lc_monetary
        job.swap.method_for(parent),
    ]
    return hashlib.sha256(json.dumps(content, default=_plain, sort_keys=True).encode()).hexdigest()


def _plain(value: object) -> object:
    """`value` as JSON can hold it, the same in every process (sets sorted)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    model_dump = getattr(value, "model_dump", None)
    return model_dump(mode="json") if callable(model_dump) else str(value)


def skips_unchanged(feeder: FeederConfig) -> bool:
    """Whether `feeder`'s runs ask for digests: skip_unchanged, with the agent; in copy and inserts modes without
    pg_dump_args, as the agent's psql session, which takes the digests in the snapshot pg_dump then reads, connects
    with `database` alone."""
    if not feeder.skip_unchanged or not feeder.agent:
        return False
    return feeder.dump_mode == DumpMode.BINARY or not feeder.pg_dump_args


async def plan_skips(
    conn: asyncpg.Connection, job: Job, parents: Mapping[TableName, ParentTable], remap: Remap | None
) -> Skips | None:
    """What the run asks about: None where it does not (`skips_unchanged`)."""
    if not skips_unchanged(job.feeder) or not await _large_enough(conn, job):
        return None
    stored = await read_digests(conn, job.name)
    fingerprints = {table: fingerprint(parent, remap, job) for table, parent in parents.items()}
    valid = {t: s for t, s in stored.items() if fingerprints.get(t) == s.fingerprint and _sendable(job.name, t, s)}
    valid = {t: s for t, s in valid.items() if await _held(conn, job, t)}
    asked = {t: s.digest for t, s in valid.items() if s.digest}
    deltas = await _deltas(conn, job, parents, remap, valid)
    return Skips(fingerprints, stored, asked, {t: s.counters for t, s in valid.items() if s.counters}, deltas)


async def _deltas(
    conn: asyncpg.Connection,
    job: Job,
    parents: Mapping[TableName, ParentTable],
    remap: Remap | None,
    valid: Mapping[TableName, StoredDigest],
) -> dict[TableName, DeltaRequest]:
    """The tables asked for their changed rows (binary mode, `send_changed_rows`): those whose load here is the
    one a digest was stored with, not remapped, with a key to bucket their rows by (fedload.superhub.delta)."""
    if job.feeder.dump_mode != DumpMode.BINARY or not job.feeder.send_changed_rows or not valid:
        return {}
    if (probe := await probe_here(conn)) is None:
        return {}
    deltas = {}
    room = MAX_REQUEST_STATES_CHARS  # the request goes on the feeder's command line: the largest tables first
    for table, held in sorted(valid.items(), key=lambda item: -item[1].rows):
        parent = parents.get(table)
        if parent is None or (remap is not None and remap.for_table(parent.qualified_name) is not None):
            continue
        if (key := delta_key(parent, job.imports.feeder_key)) is not None and len(held.delta) <= room:
            deltas[table] = stored_state(held.delta, key, held.rows, probe)
            room -= len(held.delta)
    return deltas


def _sendable(feeder: str, table: TableName, stored: StoredDigest) -> bool:
    """Whether a stored digest and its counters are in the formats the agent accepts: one stored before they were
    checked on receipt may not be, and the agent would refuse every request holding it. Not sent, it is replaced
    (or forgotten) by the run's own digests."""
    if _malformed(stored.digest, stored.counters):
        log.warning("sync.digest_ignored", feeder=feeder, table=str(table), reason="not in the agent's format")
        return False
    return True


async def _held(conn: asyncpg.Connection, job: Job, table: TableName) -> bool:
    """Whether the feeder's partition of `table` is here: a digest describes it, and an agent told the table is
    unchanged would send nothing of it (a partition dropped by `fedload feeder remove --table`, or by hand)."""
    if await feeder_partition(conn, table, job.name, job.feeder.key) is not None:
        return True
    log.info("sync.digest_ignored", feeder=job.name, table=str(table), reason="no partition of the feeder here")
    return False


def _malformed(digest: str, counters: str) -> str:
    """What is wrong with a digest and its counters ("" where nothing is): each empty, or in the agent's format."""
    if digest and not DIGEST_FORMAT.fullmatch(digest):
        return "its digest is not 64 lowercase hexadecimal digits"
    if counters and not COUNTERS_FORMAT.fullmatch(counters):
        return "its counters are not one to eight numbers separated by spaces"
    return ""


async def _large_enough(conn: asyncpg.Connection, job: Job) -> bool:
    """Whether the feeder's data may be worth digests: its last successful load held at least
    `skip_unchanged_min_rows` rows or kept a table unchanged (a new feeder's first run asks nothing: its size is not
    known, and a first round stores no digest anyway). Below that, asking costs more than it can save (a psql
    session per run in copy and inserts modes, and digests that read whole tables: compare.py's 100 feeders of
    2,000 rows took 1.2x the CPU with them)."""
    floor = job.feeder.skip_unchanged_min_rows
    if not floor:
        return True
    last = await last_load(conn, job.name)
    return last is not None and (last[0] >= floor or last[1] > 0)


async def keep_unchanged(
    conn: asyncpg.Connection, importer: Importer, skips: Skips | None, *, feeder: str, key: int | str
) -> list[str]:
    """Check every table the agent called unchanged (in the load's transaction): its digest is the one asked, and
    its partition holds the digest's rows; the tables kept, as `schema.name`."""
    kept = [s for s in importer.staged.values() if s.kept is not None]
    wrong = [s.parent.qualified_name for s in kept if skips is None or skips.asked.get(s.parent.table) != _kept(s)]
    if wrong:
        raise DumpError(
            f"feeder {feeder} says table(s) {', '.join(wrong)} are unchanged, but not with the digest this superhub "
            "asked about: refused"
        )
    assert skips is not None or not kept
    for staged in kept:
        await _check_partition(conn, staged, skips, feeder, key)
    names = [s.parent.qualified_name for s in kept]
    if names:
        log.info("sync.unchanged_kept", feeder=feeder, tables=names)
    return names


def _kept(staged: StagedTable) -> str:
    assert staged.kept is not None
    return staged.kept.digest


async def _check_partition(
    conn: asyncpg.Connection, staged: StagedTable, skips: Skips | None, feeder: str, key: int | str
) -> None:
    """The partition kept exists and holds the rows of the digest (as the agent counted them, as stored)."""
    assert staged.kept is not None
    assert skips is not None
    table, rows = staged.parent.table, staged.kept.rows
    stored = skips.stored[table].rows
    partition = await feeder_partition(conn, table, feeder, key)
    holds = await conn.fetchval(f"SELECT count(*) FROM {partition}") if partition else None  # noqa: S608 - regclass
    if holds != rows or stored != rows:
        where = f"partition {partition} holds {holds} rows" if partition else "it has no partition"
        raise KeptPartitionError(
            f"feeder {feeder}: table {table} is unchanged with {rows} rows ({stored} when stored), but {where} "
            "here: its digest is forgotten and the next run sends it",
            [table],
        )


async def forget_on_failure(conn: asyncpg.Connection, feeder: str, error: KeptPartitionError) -> None:
    """After the load's transaction rolled back: forget the digests of the partitions that did not hold up."""
    await forget_digests(conn, feeder, error.tables)


def digests_to_store(
    importer: Importer, trailer: Trailer | None, skips: Skips | None, feeder: str = ""
) -> dict[TableName, StoredDigest]:
    """The digests to keep after this run: each table's, where the agent sent one whose rows are all in its
    partition (none of them set aside as bad rows). DumpError for digests the run did not ask for."""
    if trailer is None:
        return {}
    if skips is None:
        if trailer.digests:
            said = one_line(".".join(trailer.digests[0][:2]), 200)
            raise DumpError(f"feeder {feeder} sent a digest of table {said}, but this superhub asked for none: refused")
        return {}
    if not trailer.digests and importer.staged:  # an agent older than digests ignores the request's: sends all
        why = "the feeder's agent sends no digests: upgrade fedload there, or give it a psql beside its pg_dump"
        log.info("sync.unchanged_unsupported", feeder=feeder, reason=why)
    stored = {}
    for table, (digest, rows, counters) in received_digests(trailer, skips, feeder).items():
        staged = importer.staged.get(table)
        if staged is None or staged.rejected:
            continue
        if rows == loaded_rows(staged):
            delta = _delta_state(staged, skips) if digest else ""  # blank: its snapshot's WAL not yet durable
            stored[table] = StoredDigest(digest, rows, skips.fingerprints[table], counters, delta)
    return stored


def loaded_rows(staged: StagedTable) -> int:
    """The rows the feeder's partition of `staged` holds after the swap: those kept, those of the table where only
    its changes came, else those loaded."""
    if staged.kept is not None:
        return staged.kept.rows
    return changes.head.rows if (changes := staged.changes_only) is not None else staged.rows


def _delta_state(staged: StagedTable, skips: Skips) -> str:
    """The delta state to keep of `staged`: the one its section sent, or for a table kept the one stored."""
    if staged.delta is not None:
        return json.dumps(staged.delta.head.state.to_json())
    held = skips.stored.get(staged.parent.table)
    return held.delta if staged.kept is not None and held is not None else ""


async def store_digests(
    conn: asyncpg.Connection, feeder: str, run_id: int | None, digests: dict[TableName, StoredDigest]
) -> None:
    """Make `digests` the feeder's, in the swap's transaction."""
    await write_digests(conn, feeder, run_id, digests)


def received_digests(trailer: Trailer, skips: Skips, feeder: str) -> dict[TableName, tuple[str, int, str]]:
    """The trailer's digests, (digest, rows, counters) by table, each checked: for a table this run asked about,
    listed once, its digest and counters empty or in the agent's formats, its rows a bigint of 0 or more; DumpError
    naming the feeder and the table otherwise (the run fails in its transaction: nothing is stored)."""
    received: dict[TableName, tuple[str, int, str]] = {}
    for schema, name, digest, rows, counters in trailer.digests:
        table = TableName(schema, name)
        wrong = _malformed(digest, counters)
        if table not in skips.fingerprints:
            wrong = "this superhub asked for no digest of it"
        elif table in received:
            wrong = "it is listed twice"
        elif not 0 <= rows <= MAX_ROWS:
            wrong = f"its rows ({rows}) are not a count from 0 to {MAX_ROWS}"
        if wrong:
            said = one_line(str(table), 200)  # a name the feeder chose: no control characters, not a page of it
            raise DumpError(f"feeder {feeder} sent a digest of table {said} that is refused: {wrong}")
        received[table] = (digest, rows, counters)
    return received


async def forget_refused(
    conn: asyncpg.Connection, feeder: str, skips: Skips | None, error: AgentRefusedError
) -> AgentRefusedError | None:
    """After the load's transaction rolled back, the agent having refused the request: forget the feeder's digests
    where the request held any (an agent that refuses a digest or counters stored here would refuse every run's
    request), so that the next run asks none and sends every table; the error to raise then (None: `error`)."""
    if skips is None or not (skips.asked or skips.counters):
        return None
    await forget_digests(conn, feeder)
    log.warning("sync.digests_forgotten", feeder=feeder, reason="the agent refused the request holding them")
    return AgentRefusedError(
        f"{error}; this superhub forgot the digests it held of feeder {feeder}: the next run sends every table"
    )
