"""Copy and inserts modes read pg_dump's output in large pieces (fedload/feeder/pipes.py): few reads however small
pg_dump's writes, the data whole, and the end seen."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_pg_dumps_output_comes_in_few_large_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 MiB written 4 KiB at a time are read whole in a few dozen reads of the pipe, not ~2,000."""
    reads: list[int] = []

    def counted_read(fd: int, length: int) -> bytes:
        data = os.read(fd, length)
        reads.append(len(data))
        return data

    monkeypatch.setattr(pipes, "os", SimpleNamespace(read=counted_read))
    argv = [sys.executable, "-c", _PACED_PG_DUMP]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, bufsize=0) as process:
        assert process.stdout is not None
        reader = pipes.PipeReader(process.stdout.fileno(), 1 << 20)
        pieces = list(iter(reader.read, b""))
    assert b"".join(pieces) == b"".join(i.to_bytes(4, "big") * 1024 for i in range(2048))
    assert len(reads) <= 64
