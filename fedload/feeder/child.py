"""What the agent's dumps share in running a child process (pg_dump, psql): its stderr's tail, read aside; the
child killed as soon as the reader of the stream goes away; frames written and flushed."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
from collections.abc import Iterator
from typing import IO, BinaryIO

from fedload._tail import Tail
from fedload.feeder.logs import get_logger

__all__ = ["StderrTail", "killed_when_reader_leaves", "write_frames"]

_WATCHER_EXIT_TIMEOUT_S = 5.0

log = get_logger()


class StderrTail:
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


@contextlib.contextmanager
def killed_when_reader_leaves(process: subprocess.Popen[bytes], out: BinaryIO) -> Iterator[None]:
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


def write_frames(out: BinaryIO, frames: bytes) -> None:
    if frames:
        out.write(frames)
        with contextlib.suppress(AttributeError):
            out.flush()
