"""`fedload agent serve`: one agent process for a feeder's dumps on the superhub's kept SSH connection.

An agent started per run spends ~0.1 s of the feeder's CPU on sshd's session, Python's start and the agent's imports
before pg_dump runs, at every run, which repeats every few seconds where data is kept fresh (issue 55). Served, the
agent starts once per kept connection: it imports the dumps' modules, then forks a child per request (~2 ms).

The protocol, on the session's stdin and stdout:

    requests (stdin): one per line, the command the superhub would send as an SSH command (`fedload agent dump
                      ...`), at most MAX_REQUEST_BYTES; the next only after the previous one's end frame
    replies (stdout): frames of a kind byte, a 4-byte big-endian length, then that many bytes:
                      H  once, first: HELLO (the protocol's version)
                      D  a piece of the current dump's stream, as `agent dump` writes it
                      E  the dump's end: JSON {"status": N, "stderr": "..."}: its exit status and its stderr's tail

Each request runs in a forked child set up as an sshd session's agent would be: its own session (killing its
process group reaches pg_dump), /dev/null as stdin, its stderr a pipe this process keeps the tail of, stdout the
session's, written in D frames. A request the allowlist refuses gets only its end frame (status 2 and the reason).
The server ends at the end of stdin (the superhub closed the channel or the connection), a dump under way killed
first; a request while a dump runs, or a line that is too long, ends it with status 2: the superhub broke protocol.

Standard library only, like all of fedload/feeder/: it runs in the zipapp on the feeder's own Python, 3.9 and later.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from fedload._tail import Tail
from fedload.feeder.errors import EXIT_USAGE, AgentError

__all__ = [
    "DATA",
    "END",
    "FRAME_HEAD",
    "HELLO",
    "HELLO_FRAME",
    "MAX_REQUEST_BYTES",
    "FrameWriter",
    "serve",
]

HELLO = b"fedload-serve 1"
FRAME_HEAD = struct.Struct(">cI")
DATA, END, _HELLO_KIND = b"D", b"E", b"H"
HELLO_FRAME = FRAME_HEAD.pack(_HELLO_KIND, len(HELLO)) + HELLO
MAX_REQUEST_BYTES = 1 << 20  # a dump's words, its tables and its stored states: far below this
_READ_BYTES = 1 << 16
_KILL_WAIT_S = 10.0  # a killed dump's exit, before its process group gets SIGKILL
_KILL_POLL_S = 0.05

Accept = Callable[[str], Callable[[], int]]  # a request line -> the dump to run in the child; AgentError if refused


class FrameWriter:
    """The binary stream a dump writes, passed on as D frames on `fd` (blocking): `write`, `flush`, `fileno`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: bytes | bytearray | memoryview) -> int:
        size = len(data)
        if size:
            _write_all(self._fd, [FRAME_HEAD.pack(DATA, size), data])
        return size

    def flush(self) -> None:
        """Nothing is buffered here."""

    def fileno(self) -> int:
        return self._fd


def _write_all(fd: int, pieces: list[bytes | bytearray | memoryview]) -> None:
    views = [memoryview(piece).cast("B") for piece in pieces]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views.pop(0))
        if views:
            views[0] = views[0][written:]


def serve(accept: Accept, stdin: int = 0, stdout: int = 1, ended: Callable[[int], None] | None = None) -> int:
    """Serve requests from `stdin` until its end (0), or until the superhub breaks the protocol (2); the caller has
    imported the dumps' modules (fedload.feeder.main.preload_dumps), so that every child starts with them. `ended`
    hears each accepted dump's exit status (-SIGKILL for one killed when stdin ended or broke protocol)."""
    lines = _Lines(stdin)
    _write_all(stdout, [HELLO_FRAME])
    while True:
        try:
            line = lines.next()
        except _ProtocolError as exc:
            print(f"fedload: error: {exc}", file=sys.stderr, flush=True)
            return EXIT_USAGE
        if line is None:
            return 0
        try:
            dump = accept(line)
        except AgentError as exc:
            _end(stdout, exc.exit_status, f"fedload: error: {exc}\n")
            continue
        outcome = _Child(dump, stdin, stdout).run(lines)
        if ended is not None:
            ended(-signal.SIGKILL if outcome is None else outcome[0])
        if outcome is None:  # stdin ended or broke protocol during the dump: the dump was killed
            return lines.status
        _end(stdout, *outcome)


def _end(stdout: int, status: int, stderr: str) -> None:
    message = json.dumps({"status": status, "stderr": stderr}).encode()
    _write_all(stdout, [FRAME_HEAD.pack(END, len(message)), message])


class _ProtocolError(Exception):
    """The superhub sent what the protocol does not allow."""


class _Lines:
    """Request lines from `fd`, read as they come (os.read: nothing buffered out of sight of a selector)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self.status = 0  # the server's exit status once stdin has ended or broken protocol

    def next(self) -> str | None:
        """The next request line; None at the end of stdin; _ProtocolError for a line that is too long."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_REQUEST_BYTES:
                raise _ProtocolError(f"a request longer than {MAX_REQUEST_BYTES} bytes")
            data = os.read(self.fd, _READ_BYTES)
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode("utf-8", errors="replace")

    def came_during_dump(self) -> None:
        """Stdin became readable while a dump runs: it ended, or it brought a request too early (status 2)."""
        if os.read(self.fd, _READ_BYTES):
            print("fedload: error: a request came before the dump under way ended", file=sys.stderr, flush=True)
            self.status = EXIT_USAGE


class _Child:
    """One request's dump in a forked child, watched until it exits: its stderr's tail kept."""

    def __init__(self, dump: Callable[[], int], stdin: int, stdout: int) -> None:
        self._dump = dump
        self._stdin, self._stdout = stdin, stdout
        self._tail = Tail()

    def run(self, lines: _Lines) -> tuple[int, str] | None:
        """(exit status, stderr's tail) once the child has exited; None if stdin ended or broke protocol first (the
        child killed)."""
        wake_read, wake_write = os.pipe()
        err_read, err_write = os.pipe()
        for fd in (wake_read, wake_write):
            os.set_blocking(fd, False)
        previous = signal.signal(signal.SIGCHLD, lambda *_: None)
        old_wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        try:
            pid = os.fork()
            if pid == 0:
                os.close(wake_read)
                os.close(err_read)
                self._child(err_write)
            os.close(err_write)
            return self._watch(pid, lines, wake_read, err_read)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            signal.signal(signal.SIGCHLD, previous)
            for fd in (wake_read, wake_write, err_read):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _watch(self, pid: int, lines: _Lines, wake: int, err: int) -> tuple[int, str] | None:
        selector = selectors.DefaultSelector()
        selector.register(lines.fd, selectors.EVENT_READ, "stdin")
        selector.register(wake, selectors.EVENT_READ, "wake")
        selector.register(err, selectors.EVENT_READ, "stderr")
        with selector:
            while True:
                exited = os.waitpid(pid, os.WNOHANG)
                if exited[0] == pid:
                    self._drain(err)
                    return os.waitstatus_to_exitcode(exited[1]), self._tail.text()
                for key, _ in selector.select():
                    if key.data == "wake":
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake, _READ_BYTES)
                    elif key.data == "stderr" and not self._read_stderr(err):
                        selector.unregister(err)
                    elif key.data == "stdin":
                        lines.came_during_dump()
                        _kill(pid)
                        return None

    def _read_stderr(self, err: int) -> bool:
        data = os.read(err, _READ_BYTES)
        if data:
            self._tail.append(data)
        return bool(data)

    def _drain(self, err: int) -> None:
        """What the child wrote on stderr before it exited (its own children may hold the pipe open: not waited)."""
        os.set_blocking(err, False)
        with contextlib.suppress(BlockingIOError, OSError):
            while self._read_stderr(err):
                pass

    def _child(self, err_write: int) -> NoReturn:
        status = 1
        try:
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(err_write, 2)
            for fd in (devnull, err_write):
                os.close(fd)
            if self._stdout != 1:
                os.dup2(self._stdout, 1)
            if self._stdin != 0:
                os.close(self._stdin)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            status = self._dump()
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:  # noqa: BLE001 - the child's traceback goes to its stderr, whose tail is reported
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os._exit(status)


def _kill(pid: int) -> None:
    """End the child's dump (its process group: pg_dump, psql) and reap it, bounded."""
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + _KILL_WAIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        time.sleep(_KILL_POLL_S)
    _signal(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _signal(pid: int, signum: int) -> None:
    """Signal the child's process group, and the child itself: killed before its setsid(), it leads no group yet."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signum)
