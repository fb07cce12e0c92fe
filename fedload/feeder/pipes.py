"""Reading a child's output pipe in large pieces: psql (binary mode) and pg_dump (copy and inserts modes) write
through stdio, 4 KiB at a time on a pipe, and a reader woken by each write reads ~10 KB per wake-up: thousands of
reads (and as many switches between the two on one core) per 60 MB. Given a wide pipe (1 MiB, `widen_pipe`), the
agent lets the child write for a while before it reads what came.

Standard library only: this runs in the agent's zipapp on the feeder's own Python, 3.9 and later.
"""

from __future__ import annotations

import array
import fcntl
import os
import select
import termios
import time

__all__ = ["PIPE_BYTES", "Pace", "PipeReader", "widen_pipe"]

PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ is in Python 3.10 and later only
GATHER_S = 0.001  # the child's time to write more before a read (~100 KB at psql's or pg_dump's pace)
_GATHER_AFTER_BYTES = 1 << 20  # a small table is read as it comes: no wait at its end
_GATHERED_BYTES = 1 << 16  # a read that found this much is behind the child: the next reads at once
_GATHER_ROUNDS = 20  # a child that writes slowly is read after 20 ms of waits, however little came


def widen_pipe(fd: int) -> int:
    """Let the pipe `fd` hold 1 MiB instead of 64 KiB; its capacity in bytes (0: unknown). Linux; elsewhere, or
    past /proc/sys/fs/pipe-max-size or the user's pipe quota, the pipe stays as it is."""
    try:
        return fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", _F_SETPIPE_SZ), PIPE_BYTES)
    except OSError:
        return 0


class Pace:
    """Whether the next read of a table's COPY data (binary mode's psql) waits for psql to write more first."""

    def __init__(self, wide: bool) -> None:
        self._wide = wide  # the pipe holds what psql writes meanwhile
        self._copied = 0
        self._last = 0

    def wait(self) -> None:
        """Before a read: wait if the table is past its first bytes and the last read found the pipe far from full."""
        if self._wide and self._copied >= _GATHER_AFTER_BYTES and self._last < _GATHERED_BYTES:
            time.sleep(GATHER_S)

    def count(self, read: int) -> None:
        """After a read of `read` bytes."""
        self._copied += read
        self._last = read


class PipeReader:
    """pg_dump's output in pieces of about half its widened pipe (the transformer then sees few statements cut at a
    piece's end), read once that much has come, the pipe has closed, or 20 ms after data came; as `read` of a 1 MiB
    buffer where the pipe cannot be widened."""

    def __init__(self, fd: int, read_bytes: int) -> None:
        self._fd = fd
        self._read_bytes = read_bytes
        capacity = widen_pipe(fd)
        self._enough = min(capacity // 2, read_bytes) if capacity >= PIPE_BYTES else 0
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)  # POLLHUP and POLLERR are always reported
        self._available = array.array("i", [0])

    def read(self) -> bytes:
        """The next piece; b"" at the end."""
        if not self._enough:
            return self._read_all()
        self._poller.poll()  # bounded by pg_dump: its exit closes the pipe, a reader gone kills it (agent.py)
        for _ in range(_GATHER_ROUNDS):
            if self._ended() or self._held() >= self._enough:
                break
            time.sleep(GATHER_S)
        return os.read(self._fd, self._read_bytes)

    def _read_all(self) -> bytes:
        """Up to `read_bytes`, fewer only at the end (a narrow pipe: a raw read would return ~10 KB)."""
        pieces, wanted = [], self._read_bytes
        while wanted and (piece := os.read(self._fd, wanted)):
            pieces.append(piece)
            wanted -= len(piece)
        return b"".join(pieces)

    def _held(self) -> int:
        fcntl.ioctl(self._fd, termios.FIONREAD, self._available)
        return self._available[0]

    def _ended(self) -> bool:
        return any(events & (select.POLLHUP | select.POLLERR) for _, events in self._poller.poll(0))
