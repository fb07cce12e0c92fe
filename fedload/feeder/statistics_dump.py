"""Binary mode's planner statistics (`agent dump --mode=binary --statistics`): `pg_dump --statistics-only` of the
same tables, in the psql session's snapshot, sent as one more section of the stream (docs/stream-format.md).

The psql session exports its snapshot (`pg_export_snapshot()`) once it holds its locks, and pg_dump starts at once
with `--snapshot`, so it reads the statistics as the tables' data are read; its output waits in its pipe (pg_dump
blocks when the pipe is full) until the tables are sent, then goes out as the statistics section, and pg_dump is
waited for before the session ends (the exported snapshot lives as long as the session's transaction). Only with
pg_dump 18 or later, as in copy mode; with an older one the section is not sent and the superhub ANALYZEs.
Standard library only: this runs in the agent's zipapp on the feeder's own Python, 3.9 and later.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Sequence
from typing import BinaryIO

from fedload.feeder.child import StderrTail, write_frames
from fedload.feeder.logs import get_logger
from fedload.feeder.pg_dump import STATISTICS_SINCE_MAJOR, UNWRITTEN_OPTIONS
from fedload.feeder.pipes import widen_pipe
from fedload.feeder.sections import SECTION_END, chunk, statistics_head
from fedload.feeder.snapshot import SnapshotSession
from fedload.feeder.wire import MAX_BLOCK_BYTES, StreamEncoder, dump_failure

__all__ = [
    "CarriedStatistics",
    "StatisticsDump",
    "StatisticsDumpError",
    "asked_statistics",
    "statistics_argv",
]

log = get_logger()

# pg_dump's wait for its ACCESS SHARE locks, which the session holds already: only a lock queued in between (an
# ALTER TABLE waiting for the session) makes it wait, and the session would then wait for pg_dump for ever.
_LOCK_WAIT = "60s"
_EXIT_TIMEOUT_S = 60.0


class StatisticsDumpError(Exception):
    """The statistics could not be dumped (the dump fails: psql is stopped)."""


def statistics_argv(pg_dump: str, database: str, tables: Sequence[str], snapshot: str) -> list[str]:
    """pg_dump's command line for the statistics of `tables` (exact quoted names) in the exported `snapshot`."""
    return [
        pg_dump,
        "--statistics-only",
        "--no-password",
        "--encoding=UTF8",
        f"--snapshot={snapshot}",
        f"--lock-wait-timeout={_LOCK_WAIT}",
        *UNWRITTEN_OPTIONS,  # never written by a statistics-only dump either
        *(f"--table={table}" for table in tables),
        f"--dbname={database}",
    ]


class StatisticsDump:
    """pg_dump --statistics-only, started in the session's snapshot; `send` its output as the statistics section
    once the tables are sent; `reap` in any case."""

    def __init__(self, process: subprocess.Popen[bytes], program: str) -> None:
        self.process = process
        self._program = program
        assert process.stderr is not None
        self._stderr = StderrTail(process.stderr)

    @classmethod
    def start(cls, session: SnapshotSession, pg_dump: str, database: str, tables: Sequence[str]) -> StatisticsDump:
        """pg_dump running on the session's snapshot; StatisticsDumpError if it cannot start (ValueError if psql
        exports no snapshot)."""
        argv = statistics_argv(pg_dump, database, tables, session.export())
        env = {**os.environ, "PGCLIENTENCODING": "UTF8"}
        try:
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, env=env)
        except OSError as exc:
            raise StatisticsDumpError(f"cannot start {pg_dump}: {exc}") from exc
        assert process.stdout is not None
        widen_pipe(process.stdout.fileno())  # pg_dump writes up to 1 MiB of statistics while the tables are sent
        return cls(process, os.path.basename(pg_dump))

    def send(self, encoder: StreamEncoder, out: BinaryIO) -> None:
        """pg_dump's output as the statistics section, then its exit; StatisticsDumpError saying why if it failed."""
        assert self.process.stdout is not None
        write_frames(out, encoder.data(statistics_head()))
        sent = 0
        while data := self.process.stdout.read(MAX_BLOCK_BYTES):
            write_frames(out, encoder.data(chunk(data)))
            sent += len(data)
        status = self.process.wait(timeout=_EXIT_TIMEOUT_S)
        failure = dump_failure(status, "", self._stderr.text(), f"{self._program} --statistics-only")
        if failure:
            raise StatisticsDumpError(failure)
        write_frames(out, encoder.data(SECTION_END))
        log.debug("agent.statistics_sent", bytes=sent)

    def reap(self) -> None:
        """Stop pg_dump if it still runs (the dump failed before its section), and wait for it."""
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # killed, yet not gone: the agent exits all the same
            self.process.wait(timeout=_EXIT_TIMEOUT_S)


class CarriedStatistics:
    """The statistics a dump was asked for: `start` once the session holds its locks, `send` after the tables,
    `reap` in any case."""

    def __init__(self, pg_dump: str, database: str) -> None:
        self._pg_dump = pg_dump
        self._database = database
        self._dump: StatisticsDump | None = None

    def start(self, session: SnapshotSession, tables: Sequence[str]) -> None:
        """pg_dump of the statistics of `tables` (exact quoted names; none: nothing to do) in the session's snapshot."""
        if tables:
            self._dump = StatisticsDump.start(session, self._pg_dump, self._database, tables)

    def send(self, encoder: StreamEncoder, out: BinaryIO) -> None:
        """The statistics section, if pg_dump was started."""
        if self._dump is not None:
            self._dump.send(encoder, out)

    def reap(self) -> None:
        """pg_dump stopped if it still runs, and waited for."""
        if self._dump is not None:
            self._dump.reap()


def asked_statistics(pg_dump: str, database: str, version: str) -> CarriedStatistics | None:
    """The statistics to send, where pg_dump (of `version`) writes them: 18 or later, as
    in copy mode (an older pg_dump: none, the superhub ANALYZEs)."""
    found = re.match(r"\d+", version)
    if found is None or int(found[0]) < STATISTICS_SINCE_MAJOR:
        return None
    return CarriedStatistics(pg_dump, database)
