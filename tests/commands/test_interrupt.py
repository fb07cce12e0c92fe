"""Ctrl-C reaches `fedload sync`'s event loop whichever of its threads the kernel hands the signal to.

A process-directed SIGINT may land on any thread that does not block it; the default executor's idle threads (a
getaddrinfo leaves them) are such threads. asyncio.run's own handler then runs only once the main thread runs
Python code, which a loop waiting on a silent feeder (nothing ready, no timer due) may never do: `fedload sync`
went on after Ctrl-C in 1 of 1241 tests of a loaded run. `run_interruptibly` takes the signal through the loop's
wakeup fd, which the receiving thread writes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)

# A loop with an idle executor thread, waiting on nothing for 60 s: as a sync whose feeder has gone silent.
_WAITING = """
import asyncio, os, sys
from fedload.commands.sync import run_interruptibly

async def main():
    await asyncio.get_running_loop().run_in_executor(None, lambda: None)
    print("ready", flush=True)
    await asyncio.sleep(60)

try:
    run_interruptibly(main())
    print("slept out")
except KeyboardInterrupt:
    print("interrupted")
"""


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send `sig` to one thread of another process (Python has no tgkill)."""
    assert _SYS_TGKILL is not None
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_TGKILL, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


@pytest.mark.skipif(sys.platform != "linux" or _SYS_TGKILL is None, reason="tgkill: Linux on x86_64 or aarch64")
def test_ctrl_c_delivered_to_another_thread_ends_the_run_at_once(tmp_path: Path) -> None:
    """SIGINT sent to the executor's thread, not the main one, while the loop waits: cancelled within seconds
    (asyncio.run alone slept the 60 s out), KeyboardInterrupt raised once it has ended."""
    out = tmp_path / "out"
    with out.open("w") as stdout:
        process = subprocess.Popen([sys.executable, "-c", _WAITING], stdout=stdout, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while "ready" not in out.read_text():
            assert time.monotonic() < deadline, "the loop never got ready"
            time.sleep(0.05)
        others = [int(t) for t in os.listdir(f"/proc/{process.pid}/task") if int(t) != process.pid]
        assert others, "no thread but the main one"
        _tgkill(process.pid, others[0], signal.SIGINT)
        process.wait(timeout=10)
    finally:
        process.kill()
        process.wait(timeout=10)
    lines = out.read_text().splitlines()  # and the sync.interrupted event between them
    assert (lines[0], lines[-1]) == ("ready", "interrupted"), lines
