"""Unchanged tables in copy and inserts modes (issue #46; docs/stream-format.md, "Unchanged tables"): asked for
digests, the agent opens a psql session on the feeder (fedload/feeder/snapshot.py), computes the tables' digests
in its snapshot as binary mode does (fedload/feeder/digest.py), exports that snapshot, and runs pg_dump in it
(`--snapshot`) for the tables whose digest is not the one the superhub holds; the session's transaction lasts until
pg_dump has ended. The other tables are not dumped: the trailer lists them as unchanged, with the rows and digest
their partition holds.

So the tables kept and the tables sent come from one snapshot: a digest describes the very rows pg_dump sends (the
agent checks pg_dump's count of a digested table against the digest's), and no write committed after the
digests reaches the dump. Standard library only: this runs in the agent's zipapp on the feeder's own Python, 3.9
and later. Where psql cannot be started (no psql beside the configured pg_dump), the agent dumps every table
without digests, as an agent older than them would.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterable
from typing import BinaryIO

from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.binary_plan import TableRequest, plan_table, read_requests
from fedload.feeder.child import StderrTail, killed_when_reader_leaves
from fedload.feeder.digest import durable, table_digest, unchanged
from fedload.feeder.errors import AgentError, AgentUsageError
from fedload.feeder.logs import get_logger
from fedload.feeder.proof import ProofKind
from fedload.feeder.snapshot import SessionEnded, SnapshotSession, psql_beside, read_tables
from fedload.feeder.snapshot_plan import DigestedTable, SnapshotPlan
from fedload.feeder.table_patterns import exact_name
from fedload.feeder.text_dump import run_pg_dump

__all__ = ["read_digest_requests", "run_snapshot_dump"]

_EXIT_TIMEOUT_S = 60.0
log = get_logger()


def read_digest_requests(options: AgentOptions) -> list[TableRequest]:
    """The tables asked about (`--columns`, JSON as in binary mode, columns null: pg_dump sends them whole);
    AgentUsageError where the request cannot be served from one psql session's snapshot."""
    if options.pg_dump_args:
        raise AgentUsageError(
            "digests are taken in a psql session, which connects with --database alone: no pg_dump arguments"
        )
    if options.remap is not None:
        raise AgentUsageError("digests cover the feeder's tables as they are: no --remap on the feeder")
    requests = read_requests(options.tables, options.columns)
    if any(r.columns is not None for r in requests):
        raise AgentUsageError("in copy and inserts modes --columns only asks for digests: its columns must be null")
    return requests


def run_snapshot_dump(options: AgentOptions, out: BinaryIO) -> int:
    """Write the stream of one dump asked for digests to `out`: 0 when complete, else AgentError saying why."""
    requests = read_digest_requests(options)
    psql = psql_beside(options.pg_dump)
    try:
        session = SnapshotSession.start(psql, options.database)
    except OSError as exc:  # a pg_dump with no psql beside it (a wrapper script): the dump as before, every table
        log.warning("agent.digests_unavailable", psql=psql, error=str(exc))
        return run_pg_dump(options, out)
    assert session.process.stderr is not None
    stderr = StderrTail(session.process.stderr)
    try:
        plan = _planned(session, requests, options.tables, out, stderr)
        return run_pg_dump(options, out, plan)
    finally:
        _end(session)


def _planned(
    session: SnapshotSession, requests: list[TableRequest], tables: Iterable[str], out: BinaryIO, stderr: StderrTail
) -> SnapshotPlan:
    """The session's plan (`_plan`); AgentError with psql's own words if the session fails."""
    try:
        with killed_when_reader_leaves(session.process, out):
            return _plan(session, requests, tables)
    except (SessionEnded, ValueError) as exc:
        session.process.kill()
        said = stderr.text().strip()
        raise AgentError(f"the digests could not be taken: {exc}" + (f": {said}" if said else "")) from None


def _plan(session: SnapshotSession, requests: list[TableRequest], tables: Iterable[str]) -> SnapshotPlan:
    """Each present table's digest where it may pay (fedload/feeder/digest.py), the tables whose digest is the
    superhub's kept out of pg_dump's, and the snapshot exported for pg_dump."""
    seen = read_tables(session, requests)
    digested: list[DigestedTable] = []
    fresh: list[int] = []
    for request in seen.present:
        table = (request.schema, request.name)
        feeder = seen.catalog[table]
        counters = seen.counters.get(table, "")
        plan = plan_table(request, feeder)
        digest = table_digest(request, plan, feeder, counters, context=seen.context, query=session.query)
        kept = unchanged(digest, request) is not None
        rows, text = (digest.rows, digest.digest) if digest is not None else (0, "")
        if not kept and digest is not None and digest.kind is ProofKind.IDENTITY:
            fresh.append(len(digested))
        digested.append(DigestedTable(request.schema, request.name, counters, text, rows, kept))
    if fresh and seen.context is not None and not durable(seen.context, session.query):
        log.info("agent.digests_not_durable", tables=len(fresh), wal_insert_lsn=seen.context.wal_insert_lsn)
        for at in fresh:  # sent without a digest: the next round computes it
            digested[at] = dataclasses.replace(digested[at], digest="", digest_rows=0)
    sent = {(t.schema, t.name) for t in digested if not t.kept}
    dumped = tuple(t for t in tables if tuple(exact_name(t)) in sent)  # one absent is missed by the superhub
    log.debug("agent.digests_taken", tables=len(digested), kept=len(digested) - len(sent))
    return SnapshotPlan(session.export(), seen.server_version, seen.snapshot_epoch_s, dumped, tuple(digested))


def _end(session: SnapshotSession) -> None:
    """End the session's transaction once pg_dump is done with its snapshot (or the dump failed), and psql."""
    if session.process.poll() is None:
        try:
            session.finish()
        except SessionEnded:
            session.process.kill()
    try:
        session.process.wait(timeout=_EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        session.process.kill()
        log.warning("agent.psql_not_reaped", pid=session.process.pid, waited_s=_EXIT_TIMEOUT_S)
    session.close()
