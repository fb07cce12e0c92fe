"""Binary mode's psql session on the feeder (fedload/feeder/snapshot.py): psql's version from the session itself,
and COPY data read in large pieces, not one per write of psql's."""

from __future__ import annotations

import bisect
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fedload.feeder.agent import ask_version
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


# psql as the agent sees it during a COPY: 4 KiB writes (stdio's buffer on a pipe) every ~0.1 ms, then its count on
# the control pipe (its fd as argv[1]).
_PACED_PSQL = """
import os, sys, time
for _ in range(2048):
    os.write(1, b"x" * 4096)
    time.sleep(0.0001)
os.write(int(sys.argv[1]), b"COPY 2048\\n")
"""
_FIRST_BYTES = 1 << 20  # read as they come (a small table does not wait at its end)


def test_copy_data_comes_in_large_reads() -> None:
    """COPY data that psql writes 4 KiB at a time, slower than the agent reads, reaches the sink whole, past its
    first MiB in pieces averaging at least 16 KiB (one read per write of psql's averages 4-8 KiB)."""
    control, control_end = os.pipe()
    argv = [sys.executable, "-c", _PACED_PSQL, str(control_end)]
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, pass_fds=(control_end,))
    os.close(control_end)
    session = SnapshotSession(process, control)
    pieces: list[bytes] = []
    with process:
        copied = session.copy("\\copy t TO PSTDOUT\n", pieces.append)
        process.stdin.close()  # type: ignore[union-attr] # a pipe
    session.close()
    assert copied == 2048
    assert b"".join(pieces) == b"x" * 4096 * 2048
    sizes = list(itertools.accumulate(map(len, pieces)))
    later = len(pieces) - bisect.bisect_left(sizes, _FIRST_BYTES)
    assert (sizes[-1] - _FIRST_BYTES) / later >= 16 << 10
