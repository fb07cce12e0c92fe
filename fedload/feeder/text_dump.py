"""Copy and inserts modes' dump: pg_dump, through the transformer and a compressor, as a fedload stream
(docs/stream-format.md); with a `SnapshotPlan`, in its snapshot and for the tables it dumps (docs/unchanged.md).

Deliberately synchronous and light: no asyncio, no database driver. pg_dump's stdout is read in chunks, so
memory stays bounded; a slow reader on the other end of stdout (the SSH channel) slows pg_dump down.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterable, Mapping
from typing import Any, BinaryIO

import transforms  # its names load on first use: binary mode never transforms (the patterns take ~30 ms to compile)
from fedload import __version__
from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.child import StderrTail, killed_when_reader_leaves, write_frames
from fedload.feeder.compress import choose_compressor
from fedload.feeder.errors import AgentError, AgentUsageError
from fedload.feeder.logs import get_logger
from fedload.feeder.passwords import without_passwords
from fedload.feeder.pg_dump import major_version, pg_dump_argv, pg_dump_version
from fedload.feeder.pipes import PipeReader
from fedload.feeder.snapshot_plan import SnapshotPlan
from fedload.feeder.wire import DIGEST_PROTOCOL, PROTOCOL_VERSION, Header, StreamEncoder, dump_failure
from transforms.errors import TransformError

__all__ = ["run_pg_dump"]

_READ_BYTES = 1 << 20
_EXIT_TIMEOUT_S = 60.0
_SERVER_VERSION = re.compile(rb"^-- Dumped from database version (\S+)", re.MULTILINE)

log = get_logger()


def run_pg_dump(options: AgentOptions, out: BinaryIO, plan: SnapshotPlan | None = None) -> int:
    """Run pg_dump and write its stream to `out` (`run_agent`); with `plan` (fedload/feeder/snapshot_dump.py), in its
    exported snapshot, only the tables it dumps, the others listed in the trailer as unchanged (protocol 5)."""
    transform = _transform_options(options)
    compressor = choose_compressor(options.compression, options.zstd)
    version = pg_dump_version(options.pg_dump)
    protocol = DIGEST_PROTOCOL if plan is not None else PROTOCOL_VERSION
    header = Header(
        compressor.compression, options.dump_mode, __version__, version, list(options.tables), protocol=protocol
    )
    encoder = StreamEncoder(header, compressor.compress)
    if plan is not None and not plan.dumped:  # every table unchanged: pg_dump would dump the whole database
        trailer = encoder.finish(pg_dump_exit_status=0, server_version=plan.server_version, **_contents({}, [], plan))
        write_frames(out, encoder.start() + trailer)
        log.info("agent.dump_finished", bytes=0, rows=0, unchanged=len(plan.digested))
        return 0
    argv = pg_dump_argv(plan.pg_dump_options(options) if plan is not None else options, major_version(version))
    log.debug("agent.dump_started", argv=[without_passwords(a) for a in argv], compressor=compressor.implementation)
    started_s = time.time()  # without a session of its own, the dump's data is no older than pg_dump's start
    try:
        # Read in large pieces (PipeReader), not as a raw pipe's read returns what one write of pg_dump left in it,
        # ~10 kB: the transformer then scanned a statement cut off at the end of each such piece again at the next
        # (twice the work in inserts mode), and every piece cost a pass through the transformer and the encoder.
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    except OSError as exc:
        raise AgentError(f"cannot start {options.pg_dump}: {exc}") from exc
    try:
        with killed_when_reader_leaves(process, out):
            failure = _stream(process, transforms.Transformer(transform), encoder, out, plan=plan, started_s=started_s)
    finally:
        if process.poll() is None:
            process.kill()
        try:
            process.wait(timeout=_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # killed, yet not gone (stuck in the kernel): say so, keep the error
            log.warning("agent.pg_dump_not_reaped", pid=process.pid, waited_s=_EXIT_TIMEOUT_S)
    if failure:
        raise AgentError(failure)
    return 0


def _transform_options(options: AgentOptions) -> transforms.TransformOptions:
    try:
        remap = transforms.load_remap(options.remap) if options.remap else None
    except TransformError as exc:
        raise AgentUsageError(str(exc)) from exc
    return transforms.TransformOptions(options.rows_per_statement, options.max_statement_bytes, remap)


def _stream(
    process: subprocess.Popen[bytes],
    transformer: transforms.Transformer,
    encoder: StreamEncoder,
    out: BinaryIO,
    *,
    plan: SnapshotPlan | None = None,
    started_s: float | None = None,
) -> str:
    """Send the dump and its trailer; why it failed as one line, or "" if it is complete. The trailer's snapshot time
    is the plan's session's, else `started_s`, the agent's clock as pg_dump started."""
    assert process.stdout is not None
    assert process.stderr is not None
    stderr = StderrTail(process.stderr)
    server_version = ""
    error = ""
    out.write(encoder.start())
    dump = PipeReader(process.stdout.fileno(), _READ_BYTES)
    try:
        while chunk := dump.read():
            if not server_version and (found := _SERVER_VERSION.search(chunk)):
                server_version = found[1].decode("ascii", errors="replace")
            write_frames(out, encoder.data(b"".join(transformer.feed(chunk))))
        write_frames(out, encoder.data(b"".join(transformer.close())))
    except TransformError as exc:
        error = f"the dump could not be transformed: {exc}"
        process.kill()
    status = process.wait(timeout=_EXIT_TIMEOUT_S)
    tail = stderr.text()
    counts = transformer.stats.rows
    if plan is not None and status == 0 and not error:
        error = plan.contradiction(counts)
    trailer = encoder.finish(
        pg_dump_exit_status=status,
        server_version=server_version,
        error=error,
        stderr_tail=tail,
        **_contents(counts, transformer.stats.tables, plan, started_s),
    )
    write_frames(out, trailer)
    failure = dump_failure(status, error, tail)
    if not failure:
        unchanged = sum(t.kept for t in plan.digested) if plan is not None else 0
        log.info("agent.dump_finished", bytes=encoder.payload_bytes, rows=sum(counts.values()), unchanged=unchanged)
    return failure


def _contents(
    counts: Mapping[tuple[str, str], int],
    tables: Iterable[tuple[str, str]],
    plan: SnapshotPlan | None,
    started_s: float | None = None,
) -> dict[str, Any]:
    """The trailer's `rows` and `tables` of what pg_dump sent and its snapshot time (`started_s`); with `plan`, the
    unchanged tables' too, the digests (protocol 5), and the time of the plan's snapshot."""
    if plan is not None:
        return plan.trailer(counts, tables)
    rows = [(schema, name, counts[schema, name]) for schema, name in sorted(counts)]
    return {"rows": rows, "tables": sorted(tables), "snapshot_epoch_s": started_s}  # (schema, name): protocol 3
