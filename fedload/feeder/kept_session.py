"""The served agent's psql session on the feeder, kept idle between its binary dumps (issue 55).

A dump's own psql costs the feeder ~17 ms at every run (psql's start, a new backend, its catalog caches filled
again), which repeats every few seconds where data is kept fresh. `fedload agent serve` (fedload/feeder/serve.py)
instead keeps one psql, started idle (its settings made, no transaction) and lent to each binary dump's forked child
in turn: the child borrows it (`SnapshotSession.borrow`: psql is not the child's, so it is killed by its pid and
never waited for), begins the dump's REPEATABLE READ transaction, and leaves psql idle again once the transaction has
ended. A dump that failed may have left it anywhere: it is then killed, and the next dump gets a new one. One is kept
at a time (a served agent's dumps run one after another), for one database; it is replaced after MAX_USES dumps or
MAX_AGE_S seconds, so whatever a long-lived backend gathers stays bounded, and its server's ending it while idle (a
restart, `idle_session_timeout`) costs the next dump no more than its own session (fedload/feeder/binary_dump.py).

It runs in the served agent's own process, whose stdout carries the frames: it logs nothing. Standard library only,
like all of fedload/feeder/.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time

from fedload.feeder.snapshot import SnapshotSession

__all__ = ["MAX_AGE_S", "MAX_USES", "KeptSession"]

MAX_USES = 1000
MAX_AGE_S = 3600.0
_QUIT_TIMEOUT_S = 5.0  # an idle psql ends at the end of its input, an interrupted one once its backend answers


class KeptSession:
    """At most one idle psql session, lent to one dump at a time: `lend`, then `ended` once its child exited."""

    def __init__(self) -> None:
        self._session: SnapshotSession | None = None
        self._on: tuple[str, str] = ("", "")  # (psql, database)
        self._uses = 0
        self._started = 0.0
        self._lent = False

    def lend(self, psql: str, database: str) -> SnapshotSession | None:
        """The idle session of `psql` on `database`, started where there is none that can serve; None where psql
        cannot start (the dump then starts its own, and says why)."""
        if self._session is not None and not self._serves(psql, database):
            self._discard(kill=False)  # idle, or already ended
        if self._session is None:
            try:
                self._session = SnapshotSession.start(psql, database, begin=False)
            except OSError:
                return None
            self._on, self._uses, self._started = (psql, database), 0, time.monotonic()
        self._uses += 1
        self._lent = True
        return self._session

    def ended(self, status: int) -> None:
        """The dump lent the session (if any) ended with exit `status`: a failed one may have left it anywhere, in
        a transaction or a COPY, so it goes."""
        lent, self._lent = self._lent, False
        if lent and status != 0:
            self._discard(kill=True)

    def close(self) -> None:
        """End the kept session (the served agent's end)."""
        self._discard(kill=self._lent)

    def _serves(self, psql: str, database: str) -> bool:
        assert self._session is not None
        fresh = self._uses < MAX_USES and time.monotonic() - self._started < MAX_AGE_S
        return fresh and self._on == (psql, database) and self._session.process.poll() is None

    def _discard(self, *, kill: bool) -> None:
        """End psql: at the end of its input where it is idle, else (`kill`) interrupted: SIGINT makes psql cancel
        what its backend runs (a wait for a lock too, which a killed client would leave waiting) and end; waited
        for, then killed, bounded."""
        session, self._session = self._session, None
        if session is None:
            return
        process = session.process
        if kill:
            process.send_signal(signal.SIGINT)
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        try:
            process.wait(timeout=_QUIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=_QUIT_TIMEOUT_S)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        session.close()
