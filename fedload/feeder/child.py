"""What the agent's dumps share in running a child process (pg_dump, psql): its stderr's tail, read aside; the
child killed as soon as the reader of the stream goes away; frames written and flushed."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, BinaryIO, Protocol

from fedload._tail import Tail
from fedload.feeder.logs import get_logger

__all__ = ["Borrowed", "Killable", "StderrTail", "killed_when_reader_leaves", "write_frames"]

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

    def text(self, *, wait: bool = True) -> str:
        """The tail, once the pipe has closed (waits briefly for it); or where not `wait`, as it is now (a kept psql
        keeps its stderr open)."""
        if wait:
            self._thread.join(timeout=5.0)
        return self._tail.text()


class Killable(Protocol):
    """A child process as the watcher sees it: a subprocess.Popen, or a `Borrowed` one."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


@dataclass(frozen=True)
class Borrowed:
    """A process of the parent's that a forked child uses (the served agent's kept psql): not the child's own, so
    it cannot be waited for (subprocess would take ECHILD for an exit, and never kill it after). Its parent reaps
    it only once the child has exited, so its pid is not reused meanwhile."""

    pid: int

    def poll(self) -> int | None:
        """None while the process exists (a zombie too: its end shows on its pipes)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return -signal.SIGKILL
        return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


@contextlib.contextmanager
def killed_when_reader_leaves(process: Killable, out: BinaryIO) -> Iterator[None]:
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


def _watch_reader(fd: int, wake: int, process: Killable) -> None:
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
