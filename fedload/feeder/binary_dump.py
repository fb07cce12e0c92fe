"""`fedload agent dump --mode=binary`: every requested table from one snapshot of the feeder (one psql session,
fedload/feeder/snapshot.py), each as PostgreSQL's binary COPY where that is exact and as text COPY elsewhere
(fedload/feeder/binary_plan.py), in one section per table (fedload/feeder/sections.py) of the usual stream.

The superhub's request is data (tables, columns, type OIDs); the agent checks it against the feeder's catalog in
the snapshot and writes every identifier itself. Row counts come from psql's `COPY n`.
"""

from __future__ import annotations

import functools
import subprocess
from typing import BinaryIO

from fedload import __version__
from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.binary_plan import FeederColumn, TablePlan, TableRequest, copy_command, plan_table, quote_ident
from fedload.feeder.binary_plan import read_requests as _read_requests
from fedload.feeder.child import StderrTail, killed_when_reader_leaves, write_frames
from fedload.feeder.compress import choose_compressor
from fedload.feeder.delta import PROBE_QUERY, changed_rows_where, state_digest
from fedload.feeder.delta_plan import TableDelta, counted_against_state, counted_buckets, delta_head, table_delta
from fedload.feeder.digest import TableDigest, durable, table_digest, unchanged
from fedload.feeder.errors import AgentError, AgentUsageError, one_line
from fedload.feeder.logs import get_logger
from fedload.feeder.pg_dump import VersionProbe, ask_version
from fedload.feeder.proof import ProofKind
from fedload.feeder.sections import PART, SECTION_END, chunk_head, section_head
from fedload.feeder.snapshot import SessionEnded, SnapshotSession, SnapshotTables, psql_beside, read_tables
from fedload.feeder.statistics_dump import CarriedStatistics, StatisticsDumpError, asked_statistics
from fedload.feeder.wire import DIGEST_PROTOCOL, MAX_BLOCK_BYTES, PROTOCOL_VERSION, Header, StreamEncoder, dump_failure

__all__ = ["run_binary_dump"]

_EXIT_TIMEOUT_S = 60.0
log = get_logger()


def read_requests(options: AgentOptions) -> list[TableRequest]:
    """The tables and columns a binary dump is asked for; AgentUsageError if the request does not hold together."""
    if options.pg_dump_args:
        raise AgentUsageError("binary mode connects with --database alone: it takes no pg_dump arguments")
    if options.remap is not None:
        raise AgentUsageError("binary mode takes no --remap on the feeder: the superhub applies its remap")
    return _read_requests(options.tables, options.columns)


def run_binary_dump(options: AgentOptions, out: BinaryIO, kept: SnapshotSession | None = None) -> int:
    """Write the binary-mode stream of one dump to `out`: 0 when complete, else AgentError saying why. `kept`: the
    served agent's idle session on the feeder's database, borrowed (fedload/feeder/kept_session.py), used where it
    still answers; else, or without one, a session of the dump's own."""
    requests = read_requests(options)
    compressor = choose_compressor(options.compression, options.zstd)
    psql = psql_beside(options.pg_dump)
    probe = VersionProbe(options.pg_dump) if options.statistics else None  # runs while psql starts and connects
    session, version = _answering(kept, out)
    if session is None:
        session = _own_session(psql, options.database, probe)
    statistics = None
    try:
        if not version:
            with killed_when_reader_leaves(session.killable, out):  # psql may wait for its server
                version = _psql_version(session, psql)
        statistics = _statistics(options, probe)
        protocol = DIGEST_PROTOCOL if any(r.wants_digest for r in requests) else PROTOCOL_VERSION
        header = Header(compressor.compression, "binary", __version__, version, list(options.tables), protocol=protocol)
        failure = _stream(session, requests, StreamEncoder(header, compressor.compress), out, statistics)
    finally:
        if not session.borrowed:  # a kept psql is its parent's to reap
            _reap(session.process)
        if statistics is not None:
            statistics.reap()
        if not session.borrowed:
            session.close()
    if failure:
        raise AgentError(failure)
    return 0


def _answering(kept: SnapshotSession | None, out: BinaryIO) -> tuple[SnapshotSession | None, str]:
    """The kept session in the dump's transaction, and its psql's version, where it answers; else (None, ""), and
    its psql killed: its server ended the connection while it was idle (a restart, `idle_session_timeout`), and
    the served agent starts another for the next dump."""
    if kept is None:
        return None, ""
    try:
        with killed_when_reader_leaves(kept.killable, out):
            kept.begin()
            return kept, kept.client_version()
    except (SessionEnded, ValueError):
        kept.killable.kill()
        log.info("agent.kept_session_gone", pid=kept.process.pid)
        return None, ""


def _own_session(psql: str, database: str, probe: VersionProbe | None) -> SnapshotSession:
    """A psql session of the dump's own, in its transaction; AgentError if psql cannot start."""
    try:
        return SnapshotSession.start(psql, database)
    except OSError as exc:
        if probe is not None:
            probe.abandon()
        raise AgentError(f"cannot start {psql}: {exc}") from exc


def _psql_version(session: SnapshotSession, psql: str) -> str:
    """psql's version from the session itself (no `psql --version` to run); where the session ended before saying
    it (psql could not connect: the stream's trailer then says why), from `psql --version`."""
    try:
        return session.client_version()
    except (SessionEnded, ValueError):
        return ask_version(psql)


def _statistics(options: AgentOptions, probe: VersionProbe | None) -> CarriedStatistics | None:
    """The tables' statistics too, where asked (`--statistics`, `probe` asking pg_dump's version) and pg_dump is 18
    or later (fedload/feeder/statistics_dump.py)."""
    if probe is None:
        return None
    return asked_statistics(options.pg_dump, options.database, probe.version())


def _stream(
    session: SnapshotSession,
    requests: list[TableRequest],
    encoder: StreamEncoder,
    out: BinaryIO,
    statistics: CarriedStatistics | None = None,
) -> str:
    """Send every table's section (and the statistics section, where asked) and the trailer; why the dump failed
    as one line, or "" if it is complete."""
    assert session.process.stderr is not None
    stderr = StderrTail(session.process.stderr)
    sent = _Sent()
    server_version, error = "", ""
    out.write(encoder.start())
    try:
        with killed_when_reader_leaves(session.killable, out):
            server_version = _tables(session, requests, encoder, out, sent, statistics=statistics)
            session.finish(keep=session.borrowed)
    except SessionEnded as exc:
        error = str(exc)
    except (ValueError, StatisticsDumpError) as exc:  # a name \copy cannot take, a catalog answer that is not one
        error = str(exc)
        session.killable.kill()
    status, tail = _ended(session, stderr, error)
    if session.borrowed and error and tail.strip():  # no exit status to tell psql's own failure: its words
        error = f"{error}: {one_line(tail)}"
    rows = sent.rows
    tables = [(schema, name) for schema, name, _ in rows]
    trailer = encoder.finish(
        pg_dump_exit_status=status,
        rows=rows,
        tables=tables,
        server_version=server_version,
        error=error,
        stderr_tail=tail,
        dump_program="psql",
        snapshot_epoch_s=sent.snapshot_epoch_s,
        **({"digests": sent.digests} if sent.digests else {}),
    )
    write_frames(out, trailer)
    failure = dump_failure(status, error, tail, "psql")
    if not failure:
        total = sum(n for _, _, n in rows)
        unchanged = sent.unchanged
        log.info("agent.dump_finished", bytes=encoder.payload_bytes, rows=total, mode="binary", unchanged=unchanged)
    return failure


class _Sent:
    """What the dump said of its tables so far: rows, digests, how many were unchanged, and its snapshot's time."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, int]] = []
        self.digests: list[tuple[str, str, str, int, str]] = []
        self.unchanged = 0
        self.fresh: list[int] = []  # the indices in `digests` of identity digests of tables sent: stored if durable
        self.snapshot_epoch_s: float | None = None  # the server's now() in the snapshot, once the catalog is read
        self._probe: str | None = None

    def probe(self, session: SnapshotSession) -> str:
        """The feeder's bucket hashes of fixed values (fedload/feeder/delta.py), asked once."""
        if self._probe is None:
            self._probe = session.query(PROBE_QUERY).decode("ascii").strip()
        return self._probe


def _tables(
    session: SnapshotSession,
    requests: list[TableRequest],
    encoder: StreamEncoder,
    out: BinaryIO,
    sent: _Sent,
    *,
    statistics: CarriedStatistics | None = None,
) -> str:
    """Check the request against the catalog in the snapshot, lock what is there, send each table (or say it is
    unchanged); the server's version. A table the feeder lacks is not sent (the superhub then refuses to replace its
    data with nothing)."""
    seen = read_tables(session, requests)
    sent.snapshot_epoch_s = seen.snapshot_epoch_s
    if statistics is not None:
        statistics.start(session, [f"{quote_ident(r.schema)}.{quote_ident(r.name)}" for r in seen.present])
    for request in seen.present:
        table = (request.schema, request.name)
        now = seen.counters.get(table, "")
        _table(session, request, seen, encoder=encoder, out=out, sent=sent, counters=now)
    if sent.fresh and seen.context is not None and not durable(seen.context, session.query):
        log.info("agent.digests_not_durable", tables=len(sent.fresh), wal_insert_lsn=seen.context.wal_insert_lsn)
        for at in sent.fresh:  # sent without a digest: the next round computes it
            sent.digests[at] = (*sent.digests[at][:2], "", *sent.digests[at][3:])
    if statistics is not None:
        statistics.send(encoder, out)
    return seen.server_version


def _table(
    session: SnapshotSession,
    request: TableRequest,
    seen: SnapshotTables,
    *,
    encoder: StreamEncoder,
    out: BinaryIO,
    sent: _Sent,
    counters: str,
) -> None:
    """One table's section: its data, or, where its digest is the one the superhub holds, that it is unchanged. The
    content digest is not computed where the table's counters say it changed for sure (fedload/feeder/digest.py)."""
    table = (request.schema, request.name)
    feeder = seen.catalog[table]
    plan = plan_table(request, feeder)
    digest, kept, delta = _against_state(session, request, plan, feeder, seen, sent=sent, counters=counters)
    if digest is None:
        digest = table_digest(request, plan, feeder, counters, context=seen.context, query=session.query)
        kept = unchanged(digest, request)
        if kept is None and seen.context is not None:
            counted = counted_buckets(request, plan, feeder, context=seen.context, query=session.query)
            if counted is not None:
                delta = table_delta(request, plan, counted, context=seen.context, probe=sent.probe(session))
    head = section_head(
        table,
        plan.columns,
        binary=plan.binary,
        reason=plan.reason,
        unsent=plan.unsent,
        unchanged=kept,
        delta=delta_head(delta),
    )
    write_frames(out, encoder.data(head))
    if kept is not None:
        copied = kept[0]
        sent.unchanged += 1
    else:
        copied = _copy(session, plan, delta, _Parts(encoder, out))
    write_frames(out, encoder.data(SECTION_END))
    if digest is not None and copied != digest.rows:  # one snapshot: cannot differ, unless the session is not one
        raise ValueError(f"table {plan.schema}.{plan.name}: {copied} rows copied but {digest.rows} digested")
    sent.rows.append((plan.schema, plan.name, copied))
    if request.wants_digest:
        if kept is None and digest is not None and digest.kind is ProofKind.IDENTITY:
            sent.fresh.append(len(sent.digests))
        sent.digests.append((plan.schema, plan.name, digest.digest if digest else "", copied, counters))


def _against_state(
    session: SnapshotSession,
    request: TableRequest,
    plan: TablePlan,
    feeder: list[FeederColumn],
    seen: SnapshotTables,
    *,
    sent: _Sent,
    counters: str,
) -> tuple[TableDigest | None, tuple[int, str] | None, TableDelta | None]:
    """Where the superhub sent a delta state the snapshot's rows can be counted against (fedload/feeder/
    delta_plan.py's `counted_against_state`): the table's digest, and either that it is unchanged (with the digest
    the superhub holds) or its delta, whose state's token is the digest to store (`state_digest`). No identity
    proof is computed. (None, None, None) elsewhere."""
    if seen.context is None:
        return None, None, None
    probe = functools.partial(sent.probe, session)  # asked once a dump, where a table needs it
    counted = counted_against_state(
        request, plan, feeder, counters, context=seen.context, query=session.query, probe=probe
    )
    if counted is None:
        return None, None, None
    delta = table_delta(request, plan, counted, context=seen.context, probe=probe())
    if delta.unchanged:
        return TableDigest(delta.rows, request.digest, ProofKind.IDENTITY), (delta.rows, request.digest), None
    return TableDigest(delta.rows, state_digest(delta.state), ProofKind.IDENTITY), None, delta


def _copy(session: SnapshotSession, plan: TablePlan, delta: TableDelta | None, parts: _Parts) -> int:
    """Send the table's data (where `delta` says so, only its changed buckets' rows); the table's rows."""
    if delta is None or delta.dirty is None:
        copied = session.copy(copy_command(plan), parts.add)
        parts.flush()
        return copied
    # the key is sent: in plan.columns
    where = changed_rows_where(delta.key, delta.dirty, delta.state.buckets, delta.appended, delta.new)
    copied = session.copy(copy_command(plan, where), parts.add)
    parts.flush()
    if copied != delta.sent:  # one snapshot: cannot differ
        raise ValueError(f"table {plan.schema}.{plan.name}: {copied} rows copied but {delta.sent} counted in buckets")
    return delta.rows


class _Parts:
    """A table's COPY data as parts that end where the stream's blocks do, not one per read of psql's pipe: a block
    is then compressed as it was gathered, without a copy, and the superhub hands its server a block's data in one
    piece."""

    def __init__(self, encoder: StreamEncoder, out: BinaryIO) -> None:
        self._encoder = encoder
        self._out = out
        self._pieces: list[bytes | memoryview] = []
        self._bytes = 0

    def add(self, data: bytes) -> None:
        """Data psql wrote; sent once it completes the encoder's block."""
        self._pieces.append(data)
        self._bytes += len(data)
        while self._bytes >= (fill := self._fill()):
            self._send(fill)

    def flush(self) -> None:
        """Send what has come as one part (nothing if nothing came)."""
        if self._bytes:
            self._send(self._bytes)

    def _fill(self) -> int:
        """The data after a part's head that completes the encoder's block (the next one where the head does)."""
        return (self._encoder.room - PART.size - 1) % MAX_BLOCK_BYTES + 1

    def _send(self, length: int) -> None:
        """Send the first `length` bytes that came as one part."""
        frames = [self._encoder.data(chunk_head(length))]
        while length:
            piece = self._pieces.pop(0)
            if len(piece) > length:  # the rest goes in the next part
                view = memoryview(piece)
                piece, rest = view[:length], view[length:]
                self._pieces.insert(0, rest)
            frames.append(self._encoder.data(piece))
            length -= len(piece)
            self._bytes -= len(piece)
        write_frames(self._out, b"".join(frames))


def _ended(session: SnapshotSession, stderr: StderrTail, error: str) -> tuple[int, str]:
    """psql's exit status and stderr's tail once the dump's part is over. A borrowed psql is not waited for: kept
    idle (no error), its stderr stays open; after an error it is killed (its parent starts another)."""
    if session.borrowed:
        if error:
            session.killable.kill()
        return 0, stderr.text(wait=bool(error))
    return session.process.wait(timeout=_EXIT_TIMEOUT_S), stderr.text()


def _reap(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    try:
        process.wait(timeout=_EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.warning("agent.psql_not_reaped", pid=process.pid, waited_s=_EXIT_TIMEOUT_S)
