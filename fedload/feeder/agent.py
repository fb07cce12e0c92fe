"""`fedload agent dump`, on the feeder: pg_dump, through the transformer and a compressor, as a fedload stream.

Deliberately synchronous and light: no asyncio, no database driver. pg_dump's stdout is read in chunks, so
memory stays bounded; a slow reader on the other end of stdout (the SSH channel) slows pg_dump down.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any, BinaryIO

import transforms  # its names load on first use: binary mode never transforms (the patterns take ~30 ms to compile)
from fedload import __version__
from fedload._tail import Tail
from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.compress import choose_compressor
from fedload.feeder.errors import AgentError, AgentUsageError
from fedload.feeder.logs import get_logger
from fedload.feeder.passwords import without_passwords
from fedload.feeder.pipes import PipeReader
from fedload.feeder.wire import DIGEST_PROTOCOL, PROTOCOL_VERSION, Header, StreamEncoder, dump_failure
from transforms.errors import TransformError

if TYPE_CHECKING:
    from fedload.feeder.snapshot_dump import SnapshotPlan

__all__ = [
    "STATISTICS_SINCE_MAJOR",
    "UNWRITTEN_OPTIONS",
    "AgentOptions",
    "VersionProbe",
    "pg_dump_argv",
    "run_agent",
    "run_pg_dump",
]

_READ_BYTES = 1 << 20
_VERSION_TIMEOUT_S = 30.0
_EXIT_TIMEOUT_S = 60.0
_WATCHER_EXIT_TIMEOUT_S = 5.0
_PG_DUMP_VERSION = re.compile(r"\(PostgreSQL\) (\S+)")  # "pg_dump (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"
_LEADING_NUMBER = re.compile(r"\d+")
_SERVER_VERSION = re.compile(rb"^-- Dumped from database version (\S+)", re.MULTILINE)

log = get_logger()


# Objects a data-only dump never writes, whose catalogs pg_dump would still read unless told not to: comments
# (pg_description, the largest of its catalog queries on a small database), security labels, publications and
# subscriptions. About 40% of the feeder server's time per dump of a small database; the output is the same.
UNWRITTEN_OPTIONS = ("--no-comments", "--no-security-labels", "--no-publications", "--no-subscriptions")
_UNWRITTEN_SINCE_MAJOR = 11  # --no-comments is the newest of them
_ROWS_PER_INSERT_SINCE_MAJOR = 12
# --statistics and --statistics-only; with --statistics, --no-schema says "data only" (--data-only excludes them)
STATISTICS_SINCE_MAJOR = 18


def pg_dump_argv(options: AgentOptions, pg_dump_major: int | None = None) -> list[str]:
    """The pg_dump command line: data only, plain format, the configured tables; with pg_dump's major version
    known (11 or later), also the flags that spare it reading catalogs a data-only dump never writes; asked for
    statistics and pg_dump 18 or later, the tables' statistics too."""
    major = pg_dump_major or 0
    mode = _inserts_options(options, major) if options.dump_mode == "inserts" else []
    skipped = UNWRITTEN_OPTIONS if major >= _UNWRITTEN_SINCE_MAJOR else ()
    tables = [f"--table={pattern}" for pattern in options.tables]
    data = ["--no-schema", "--statistics"] if options.statistics and major >= STATISTICS_SINCE_MAJOR else []
    return [
        options.pg_dump,
        *(data or ["--data-only"]),
        "--no-password",
        "--encoding=UTF8",
        *skipped,
        *mode,
        *tables,
        *options.pg_dump_args,
        f"--dbname={options.database}",
    ]


def _inserts_options(options: AgentOptions, major: int) -> list[str]:
    """Inserts mode's flags: INSERTs naming their columns, and from pg_dump 12 on, as many rows per statement as
    the transformer merges, so pg_dump writes the merged statements (a third fewer bytes) and the transformer
    passes them on as written (transforms.batch.InsertBatcher.is_whole)."""
    rows = [f"--rows-per-insert={options.rows_per_statement}"] if major >= _ROWS_PER_INSERT_SINCE_MAJOR else []
    return ["--column-inserts", *rows]


def _major(version: str) -> int | None:
    """15 for "15.20", 9 for "9.6.24", 18 for "18beta1", None for what does not start with a number."""
    found = _LEADING_NUMBER.match(version)
    return int(found[0]) if found else None


# The versions of pg_dump binaries, asked once by a process that forks agents (fedload.transport.zygote) and
# inherited by each child: a run saves a pg_dump start (~5 ms of CPU). Keyed by the resolved file's identity, so a
# binary replaced in place (an upgrade) is asked again; a script (Debian's pg_wrapper picks a version per cluster
# and environment) is never kept.
_known_versions: dict[tuple[str, int, int, int, int], str] = {}
_ELF_MAGIC = b"\x7fELF"


def remember_pg_dump_version(pg_dump: str) -> None:
    """Ask `pg_dump` for its version now, and keep it for this process and the agents it forks, if it is a binary."""
    identity = _binary_identity(pg_dump)
    if identity is not None and identity not in _known_versions:
        _known_versions[identity] = _ask_version(pg_dump)


def _pg_dump_version(pg_dump: str) -> str:
    """The kept version where a forking parent asked this binary already; else pg_dump is asked now (an exec'd
    agent, which has nothing kept, does not even look at the file)."""
    return VersionProbe(pg_dump).version()


def _known_version(pg_dump: str) -> str | None:
    identity = _binary_identity(pg_dump) if _known_versions else None
    return _known_versions.get(identity) if identity is not None else None


class VersionProbe:
    """`pg_dump --version` started now and read by `version()`, so that it runs while the agent starts something
    else (binary mode: psql and its connection); the kept version where there is one (`_pg_dump_version`), then
    nothing runs. AgentError, as `_pg_dump_version`, if pg_dump cannot run or fails."""

    def __init__(self, pg_dump: str) -> None:
        self._known = _known_version(pg_dump)
        self._asked = _VersionAsked(pg_dump) if self._known is None else None

    def version(self) -> str:
        """pg_dump's version ("15.20"), once it has answered."""
        if self._asked is not None:
            asked, self._asked = self._asked, None
            self._known = asked.answer()
        assert self._known is not None
        return self._known

    def abandon(self) -> None:
        """Stop pg_dump if it still runs (the agent fails before it needs the version)."""
        if self._asked is not None:
            self._asked.abandon()
            self._asked = None


class _VersionAsked:
    """`program --version`, started now; `answer()` waits for its version. AgentError if it cannot run or fails."""

    def __init__(self, program: str) -> None:
        self._program = program
        try:
            self._process: subprocess.Popen[str] = subprocess.Popen(
                [program, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        except OSError as exc:
            raise self._error(str(exc)) from exc

    def answer(self) -> str:
        """The version ("15.20"), once the program has answered (bounded by _VERSION_TIMEOUT_S)."""
        try:
            stdout, _ = self._process.communicate(timeout=_VERSION_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            _stop(self._process)
            raise self._error(str(exc)) from exc
        if self._process.returncode != 0:
            raise self._error(f"it exited with status {self._process.returncode}")
        return _parsed_version(stdout)

    def abandon(self) -> None:
        _stop(self._process)

    def _error(self, why: str) -> AgentError:
        return AgentError(f"cannot run {self._program} --version on the feeder: {why}")


def _stop(process: subprocess.Popen[str]) -> None:
    process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # killed, yet not gone: the agent goes on all the same
        process.communicate(timeout=_EXIT_TIMEOUT_S)


def _binary_identity(pg_dump: str) -> tuple[str, int, int, int, int] | None:
    """The file `pg_dump` runs (PATH searched as exec does), as (path, device, inode, mtime, size); None if it is not
    an ELF binary or cannot be read."""
    path = _on_path(pg_dump)
    try:
        with open(path, "rb") as binary:
            if binary.read(len(_ELF_MAGIC)) != _ELF_MAGIC:
                return None
            found = os.fstat(binary.fileno())
    except OSError:
        return None
    return os.path.realpath(path), found.st_dev, found.st_ino, found.st_mtime_ns, found.st_size


def _on_path(program: str) -> str:
    """`program` as exec finds it on PATH: shutil.which's search, without importing shutil (bz2, lzma) at every
    agent's start."""
    if os.sep in program:
        return program
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return program


def _ask_version(program: str) -> str:
    """`program --version`'s version, asked now."""
    return _VersionAsked(program).answer()


def _parsed_version(stdout: str) -> str:
    """ "15.20" from "pg_dump (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"; the last word of anything else."""
    found = _PG_DUMP_VERSION.search(stdout)
    return found[1] if found else stdout.strip().rsplit(" ", 1)[-1]


class _StderrTail:
    """Keeps the last few KB of a pipe, read by a daemon thread so the child never blocks on it."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._tail = Tail()
        self._thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self._thread.start()

    def _drain(self, pipe: IO[bytes]) -> None:
        for line in pipe:
            self._tail.append(line)

    def text(self) -> str:
        """The tail, once the pipe has closed (waits briefly for it)."""
        self._thread.join(timeout=5.0)
        return self._tail.text()


def run_agent(options: AgentOptions, out: BinaryIO) -> int:
    """Write the fedload stream of one dump to `out`: 0 when the dump is complete, else AgentError saying why.

    The stream's trailer says the same, so the superhub reports the same line.
    """
    if options.dump_mode == "binary":
        from fedload.feeder.binary_dump import run_binary_dump  # noqa: PLC0415 - its own session, no pg_dump

        return run_binary_dump(options, out)
    if options.columns:  # the superhub asks for digests: unchanged tables are not dumped
        from fedload.feeder.snapshot_dump import run_snapshot_dump  # noqa: PLC0415 - a psql session first

        return run_snapshot_dump(options, out)
    return run_pg_dump(options, out)


def run_pg_dump(options: AgentOptions, out: BinaryIO, plan: SnapshotPlan | None = None) -> int:
    """Run pg_dump and write its stream to `out` (`run_agent`); with `plan` (fedload/feeder/snapshot_dump.py), in its
    exported snapshot, only the tables it dumps, the others listed in the trailer as unchanged (protocol 5)."""
    transform = _transform_options(options)
    compressor = choose_compressor(options.compression, options.zstd)
    version = _pg_dump_version(options.pg_dump)
    protocol = DIGEST_PROTOCOL if plan is not None else PROTOCOL_VERSION
    header = Header(
        compressor.compression, options.dump_mode, __version__, version, list(options.tables), protocol=protocol
    )
    encoder = StreamEncoder(header, compressor.compress)
    if plan is not None and not plan.dumped:  # every table unchanged: pg_dump would dump the whole database
        trailer = encoder.finish(pg_dump_exit_status=0, server_version=plan.server_version, **_contents({}, [], plan))
        _write(out, encoder.start() + trailer)
        log.info("agent.dump_finished", bytes=0, rows=0, unchanged=len(plan.digested))
        return 0
    argv = pg_dump_argv(plan.pg_dump_options(options) if plan is not None else options, _major(version))
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
        with _killed_when_reader_leaves(process, out):
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


@contextlib.contextmanager
def _killed_when_reader_leaves(process: subprocess.Popen[bytes], out: BinaryIO) -> Iterator[None]:
    """Kill pg_dump as soon as the reader of `out` goes away (the superhub gave up and closed the channel), even
    while pg_dump sends nothing, say waiting for a lock on the feeder: it would otherwise hold its snapshot and
    locks until its next write failed, and every retry would add one more.

    The watcher sleeps in poll() without a timeout and is woken by closing a pipe when the dump ends, so the agent
    exits as soon as its dump does (a polling watcher cost its timeout at every exit)."""
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's buffer): nobody to watch
        yield
        return
    wake_read, wake_write = os.pipe()
    watcher = threading.Thread(target=_watch_reader, args=(fd, wake_read, process), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        os.close(wake_write)  # the watcher's end of the pipe reports POLLHUP: the dump is over
        watcher.join(timeout=_WATCHER_EXIT_TIMEOUT_S)


def _watch_reader(fd: int, wake: int, process: subprocess.Popen[bytes]) -> None:
    """Wait for the reader of `fd` to go away (kill pg_dump) or for `wake` to be closed (return); owns `wake`."""
    poller = select.poll()
    poller.register(fd, select.POLLERR | select.POLLHUP)  # reported for a pipe or socket whose reader has gone
    poller.register(wake, select.POLLIN | select.POLLHUP)
    try:
        events = poller.poll()  # bounded by the dump: its end closes the other end of `wake`
        if any(ready == fd for ready, _ in events) and process.poll() is None:
            log.warning("agent.reader_gone", pid=process.pid)
            process.kill()
    finally:
        os.close(wake)


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
    stderr = _StderrTail(process.stderr)
    server_version = ""
    error = ""
    out.write(encoder.start())
    dump = PipeReader(process.stdout.fileno(), _READ_BYTES)
    try:
        while chunk := dump.read():
            if not server_version and (found := _SERVER_VERSION.search(chunk)):
                server_version = found[1].decode("ascii", errors="replace")
            _write(out, encoder.data(b"".join(transformer.feed(chunk))))
        _write(out, encoder.data(b"".join(transformer.close())))
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
    _write(out, trailer)
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


def _write(out: BinaryIO, frames: bytes) -> None:
    if frames:
        out.write(frames)
        with contextlib.suppress(AttributeError):
            out.flush()


# What the binary mode's dump (fedload/feeder/binary_dump.py) shares with pg_dump's.
StderrTail = _StderrTail
ask_version = _ask_version
killed_when_reader_leaves = _killed_when_reader_leaves
write_frames = _write
