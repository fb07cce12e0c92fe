"""The agent's snapshot session: one `psql` child on the feeder, one REPEATABLE READ READ ONLY transaction, so every
table of a dump comes from the same snapshot.

psql gets two outputs: its stdout carries only COPY data (`\\copy ... TO PSTDOUT`), and a pipe (`\\o /dev/fd/N`)
carries everything else it prints: query results, and after each `\\copy` its `COPY n` line, which psql writes
once the data is flushed. So a table's data ends where its `COPY n` arrives, and n is its row count, without
reading the data. psql stops at the first error (ON_ERROR_STOP) and says why on stderr.

`read_tables` is what every dump in such a session does first: the request checked against the catalog in the
snapshot, the tables there locked, and the counters of those asked digests of read (fedload/feeder/digest.py).
"""

from __future__ import annotations

import os
import re
import secrets
import select
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Optional

from fedload.feeder.binary_plan import FeederColumn, TableRequest, catalog_query, parse_catalog, quote_ident
from fedload.feeder.child import Borrowed, Killable
from fedload.feeder.digest import counters_query, parse_counters
from fedload.feeder.pipes import PIPE_BYTES, Pace, widen_pipe
from fedload.feeder.proof import IDENTITY_MIN_MAJOR, ProofContext, context_query, parse_context

__all__ = ["SessionEnded", "SnapshotSession", "SnapshotTables", "psql_beside", "read_tables"]

_READ_BYTES = 1 << 20
_COPIED = re.compile(rb"COPY (\d+)")
# psql's VERSION variable, "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu, compiled by ...": the
# version `psql --version` states ("psql (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"), in every psql.
_CLIENT_VERSION = re.compile(r"PostgreSQL (\S+)")
_SNAPSHOT_ID = re.compile(r"[0-9A-F]+-[0-9A-F]+-[0-9]+")  # pg_export_snapshot()'s "00000003-0000001B-1"
# pg_dump's settings for a dump: text output any server reads back exactly, no timeout, no row silently hidden.
_SETUP = """SET DateStyle = 'ISO';
SET IntervalStyle = 'postgres';
SET extra_float_digits = 3;
SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET row_security = off;
"""
_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;\n"


class SessionEnded(Exception):  # noqa: N818 - it says what happened, and psql's stderr says why
    """psql ended, or printed what the session did not ask for."""


class SnapshotSession:
    """The psql child and its two outputs; `start`, `query`, `copy` for each table, `finish`."""

    def __init__(self, process: subprocess.Popen[bytes], control: int, *, borrowed: bool = False) -> None:
        self.process = process
        self.borrowed = borrowed  # psql is the parent's (`borrow`): never waited for here
        self._control = control
        self._pending = b""  # control output not yet taken
        assert process.stdin is not None
        assert process.stdout is not None
        self._stdin: IO[bytes] = process.stdin
        self._stdout = process.stdout.fileno()
        os.set_blocking(self._stdout, False)
        self._gather = widen_pipe(self._stdout) >= PIPE_BYTES  # a narrow pipe would stall psql meanwhile

    @classmethod
    def start(cls, psql: str, database: str, *, begin: bool = True) -> SnapshotSession:
        """psql connected to `database`, in its transaction (`begin`; else idle, for `begin` later: a kept session,
        fedload/feeder/kept_session.py); OSError if it cannot start."""
        control, control_end = os.pipe()
        argv = [psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "--no-password", f"--dbname={database}"]
        env = {**os.environ, "PGCLIENTENCODING": "UTF8"}
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                pass_fds=(control_end,),
                env=env,
            )
        except OSError:
            os.close(control)
            raise
        finally:
            os.close(control_end)
        session = cls(process, control)
        session.send(f"\\o /dev/fd/{control_end}\n{_SETUP}{_BEGIN if begin else ''}")
        return session

    def borrow(self) -> SnapshotSession:
        """This session as a forked child uses it while its parent keeps it (fedload/feeder/kept_session.py)."""
        return SnapshotSession(self.process, self._control, borrowed=True)

    @property
    def killable(self) -> Killable:
        """psql, to be killed: the process itself, or by its pid where it is `borrowed`."""
        return Borrowed(self.process.pid) if self.borrowed else self.process

    def begin(self) -> None:
        """Begin the dump's transaction in a session started idle (`start(begin=False)`, or kept by `finish`)."""
        self.send(_BEGIN)

    def send(self, commands: str) -> None:
        """Give psql `commands`; SessionEnded if it has gone."""
        try:
            self._stdin.write(commands.encode())
            self._stdin.flush()
        except (BrokenPipeError, ValueError):
            raise SessionEnded("psql ended early") from None

    def query(self, statement: str) -> bytes:
        """What `statement` prints (unaligned, without headers), once it has run."""
        marker = f"fedload-{secrets.token_hex(16)}"
        self.send(f"{statement}\nSELECT '{marker}';\n")
        end = marker.encode() + b"\n"
        while True:
            at = self._pending.find(end)
            if at == 0 or (at > 0 and self._pending[at - 1 : at] == b"\n"):
                printed, self._pending = self._pending[:at], self._pending[at + len(end) :]
                return printed
            if not self._read_control():
                raise SessionEnded("psql ended before answering")

    def copy(self, command: str, sink: Callable[[bytes], None]) -> int:
        """Run a `\\copy ... TO PSTDOUT` line, giving its data to `sink` as it comes; the rows it copied."""
        self.send(f"\\set QUIET off\n{command}\\set QUIET on\n")  # quiet psql prints no COPY count
        poller = select.poll()
        poller.register(self._stdout, select.POLLIN)
        poller.register(self._control, select.POLLIN)
        pace = Pace(self._gather)  # fedload/feeder/pipes.py
        while True:
            line, _, rest = self._pending.partition(b"\n")
            if _:
                self._pending = rest
                self._drain(sink)  # psql flushed the data before printing its count
                if (copied := _COPIED.fullmatch(line)) is None:
                    raise SessionEnded(f"psql printed {line[:80]!r} instead of a COPY count")
                return int(copied[1])
            for fd, _events in poller.poll():  # bounded by the COPY; a reader gone kills psql (agent.py)
                if fd == self._stdout:
                    pace.wait()
                    if (relayed := self._relay(sink)) is None:
                        poller.unregister(self._stdout)  # closed: psql is ending, its control pipe says how
                    else:
                        pace.count(relayed)
                elif not self._read_control():
                    self._drain(sink)
                    raise SessionEnded("psql ended during a COPY")

    def export(self) -> str:
        """The id of the session's snapshot, exported: pg_dump may read it (`--snapshot`) while the session's
        transaction lasts; ValueError if psql answers anything else."""
        answer = self.query("SELECT pg_catalog.pg_export_snapshot();").decode("ascii", "replace").strip()
        if _SNAPSHOT_ID.fullmatch(answer) is None:
            raise ValueError(f"psql printed {answer[:80]!r} instead of a snapshot id")
        return answer

    def client_version(self) -> str:
        """psql's own version ("15.20", as `psql --version` says it), from its VERSION variable, once psql has
        connected and begun the transaction; ValueError if psql answers anything else."""
        answer = self.query("\\qecho :VERSION").decode("utf-8", "replace")
        if (found := _CLIENT_VERSION.match(answer)) is None:
            raise ValueError(f"psql printed {answer[:80]!r} instead of its version")
        return found[1]

    def finish(self, *, keep: bool = False) -> None:
        """End the transaction, and psql's input; or where `keep`, leave psql idle for the next dump's `begin` once
        the transaction has ended (SessionEnded if psql ends first)."""
        if keep:
            self.query("COMMIT;")
            return
        self.send("COMMIT;\n\\q\n")
        self._stdin.close()

    def close(self) -> None:
        """Release the control pipe (psql is waited for by the caller)."""
        os.close(self._control)

    def _read_control(self) -> bool:
        """Read what psql printed on the control pipe; False at its end."""
        data = os.read(self._control, _READ_BYTES)
        self._pending += data
        return bool(data)

    def _relay(self, sink: Callable[[bytes], None]) -> int | None:
        """Pass on what stdout holds now: how many bytes (0: none yet), None once it is closed."""
        try:
            data = os.read(self._stdout, _READ_BYTES)
        except BlockingIOError:
            return 0
        if not data:
            return None
        sink(data)
        return len(data)

    def _drain(self, sink: Callable[[bytes], None]) -> None:
        while self._relay(sink):
            pass


def psql_beside(pg_dump: str) -> str:
    """The psql of the same installation as `pg_dump` (its directory), or psql from PATH."""
    return os.path.join(os.path.dirname(pg_dump), "psql") if os.sep in pg_dump else "psql"


@dataclass(frozen=True)
class SnapshotTables:
    """What the snapshot holds of the requested tables."""

    server_version: str
    snapshot_epoch_s: float  # the server's now() in the session's transaction, which took the snapshot: Unix seconds
    catalog: dict[tuple[str, str], list[FeederColumn]]  # the feeder's columns of each table it has
    present: list[TableRequest]  # the requests of the tables it has, in the request's order
    counters: dict[tuple[str, str], str]  # of the tables asked digests of (fedload/feeder/digest.py)
    context: Optional[ProofContext] = None  # noqa: UP045 - what their identity proofs cover (fedload/feeder/proof.py)


def read_tables(session: SnapshotSession, requests: Sequence[TableRequest]) -> SnapshotTables:
    """Check the request against the catalog in the snapshot, lock what is there (ACCESS SHARE, as pg_dump does),
    read the counters of the tables asked digests of, and what their proofs cover (on PostgreSQL 11 and later);
    ValueError for an answer that is not one."""
    server_version, snapshot_epoch_s, catalog = parse_catalog(session.query(catalog_query(requests)))
    present = [r for r in requests if (r.schema, r.name) in catalog]
    if present:
        names = ", ".join(f"{quote_ident(r.schema)}.{quote_ident(r.name)}" for r in present)
        session.query(f"LOCK TABLE {names} IN ACCESS SHARE MODE;")
    digested = [r for r in present if r.wants_digest]
    counters = parse_counters(session.query(counters_query(digested))) if digested else {}
    context = None
    if digested and _major(server_version) >= IDENTITY_MIN_MAJOR:
        context = parse_context(session.query(context_query(digested)))
    return SnapshotTables(server_version, snapshot_epoch_s, catalog, present, counters, context)


def _major(server_version: str) -> int:
    """The major of a server_version ("15.4 (Debian ...)", "9.6.24": 9); ValueError for none."""
    found = re.match(r"\d+", server_version)
    if found is None:
        raise ValueError(f"the server's version {server_version[:40]!r} does not begin with its major")
    return int(found[0])
