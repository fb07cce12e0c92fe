"""Binary mode's psql session on the feeder (fedload/feeder/snapshot.py): psql's version from the session itself,
and COPY data read in large pieces, not one per write of psql's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fedload.feeder.pg_dump import ask_version
from fedload.feeder.snapshot import SnapshotSession
from fedload.localpg import LocalCluster


@pytest.fixture
def session(cluster: LocalCluster) -> Iterator[SnapshotSession]:
    """A session on the module's cluster, ended after the test."""
    started = SnapshotSession.start(cluster.install.tool("psql"), cluster.conninfo())
    with started.process:  # its pipes closed and psql waited for
        yield started
        started.finish()
    started.close()


def test_psqls_version_comes_from_the_session_as_psql_version_states_it(
    session: SnapshotSession, cluster: LocalCluster
) -> None:
    """The session's psql says its version as `psql --version` does ("15.20"), without a second psql."""
    version = session.client_version()
    assert version == ask_version(cluster.install.tool("psql"))
    assert version.split(".")[0] == str(cluster.install.major)


# psql as the agent sees it during a COPY: 4 KiB writes (stdio's buffer on a pipe), then its count on the control
# pipe (its fd as argv[1]). Past the first MiB it waits twice until the agent has read everything, after a single
# write: the agent's read just before the second wait took 4 KiB, far from a full pipe, whatever the machine's pace.
_PACED_PSQL = """
import array, fcntl, os, sys, termios, time
def held():
    count = array.array("i", [0])
    fcntl.ioctl(1, termios.FIONREAD, count)
    return count[0]
for i in range(2048):
    os.write(1, b"x" * 4096)
    if i in (256, 257):
        while held():
            time.sleep(0.0005)
    time.sleep(0.0001)
os.write(int(sys.argv[1]), b"COPY 2048\\n")
"""
_FIRST_BYTES = 1 << 20  # read as they come (a small table does not wait at its end)
_FAR_FROM_FULL = 1 << 16  # a read that found less than this: the next waits (fedload/feeder/pipes.py)


def test_copy_data_waits_for_more_after_a_small_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """COPY data that psql writes 4 KiB at a time reaches the sink whole; past the table's first MiB, every read
    that follows a read far from a full pipe waits first (psql writes meanwhile, so reads are few and large), at
    least once here. Which reads are small depends on the machine's pace; the rule does not."""
    events: list[int | str] = []
    pieces: list[bytes] = []
    real_sleep = time.sleep

    def waiting(seconds: float) -> None:
        events.append("wait")
        real_sleep(seconds)

    def sink(piece: bytes) -> None:
        pieces.append(piece)
        events.append(len(piece))

    monkeypatch.setattr(time, "sleep", waiting)  # fedload/feeder/pipes.py's waits
    control, control_end = os.pipe()
    argv = [sys.executable, "-c", _PACED_PSQL, str(control_end)]
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, pass_fds=(control_end,))
    os.close(control_end)
    session = SnapshotSession(process, control)
    with process:
        copied = session.copy("\\copy t TO PSTDOUT\n", sink)
        process.stdin.close()  # type: ignore[union-attr] # a pipe
    session.close()
    assert copied == 2048
    assert b"".join(pieces) == b"x" * 4096 * 2048
    assert _reads_without_their_wait(events) == []
    assert "wait" in events


def _reads_without_their_wait(events: list[int | str]) -> list[int]:
    """The reads (their index in `events`) past the first MiB that followed a small read without a wait between."""
    missing, copied, last, waited = [], 0, 0, False
    for i, event in enumerate(events):
        if event == "wait":
            waited = True
            continue
        assert isinstance(event, int)
        if copied >= _FIRST_BYTES and last < _FAR_FROM_FULL and not waited:
            missing.append(i)
        copied, last, waited = copied + event, event, False
    return missing
