"""Copy and inserts modes read pg_dump's output in large pieces (fedload/feeder/pipes.py): few reads however small
pg_dump's writes, the data whole, and the end seen."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from fedload.feeder import pipes

# pg_dump as the agent sees it: 4 KiB writes (stdio's buffer on a pipe) every ~0.1 ms, each numbered.
_PACED_PG_DUMP = """
import os, time
for i in range(2048):
    os.write(1, i.to_bytes(4, "big") * 1024)
    time.sleep(0.0001)
"""


def test_pg_dumps_output_is_read_once_half_the_pipe_has_come(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 MiB written 4 KiB at a time are read whole, each read (but the end's) once half the widened pipe has
    come or after the reader's last wait: not one read per write. How much comes per wait depends on the machine's
    pace; the rule does not."""
    events: list[int | str] = []

    def counted_read(fd: int, length: int) -> bytes:
        data = os.read(fd, length)
        events.append(len(data))
        return data

    monkeypatch.setattr(pipes, "os", SimpleNamespace(read=counted_read))

    def counted_sleep(seconds: float) -> None:
        events.append("wait")
        time.sleep(seconds)

    monkeypatch.setattr(pipes, "time", SimpleNamespace(sleep=counted_sleep))
    argv = [sys.executable, "-c", _PACED_PG_DUMP]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, bufsize=0) as process:
        assert process.stdout is not None
        reader = pipes.PipeReader(process.stdout.fileno(), 1 << 20)
        pieces = list(iter(reader.read, b""))
    assert b"".join(pieces) == b"".join(i.to_bytes(4, "big") * 1024 for i in range(2048))
    assert _early_reads(events[: _before_the_end(events)]) == []


def _before_the_end(events: list[int | str]) -> int:
    """Where the last two reads start: the pipe's rest after pg_dump closed it, and the empty read."""
    reads = [i for i, event in enumerate(events) if event != "wait"]
    return reads[-2]


def _early_reads(events: list[int | str]) -> list[int]:
    """The reads (their index in `events`) that took less than half the pipe before the reader's last wait."""
    early, waits = [], 0
    for i, event in enumerate(events):
        if event == "wait":
            waits += 1
            continue
        assert isinstance(event, int)
        if event < pipes.PIPE_BYTES // 2 and waits < pipes._GATHER_ROUNDS:
            early.append(i)
        waits = 0
    return early
