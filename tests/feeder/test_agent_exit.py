"""The agent ends as soon as its dump ends: nothing it waits for at the end (the watcher of its reader) costs time."""

from __future__ import annotations

import os
import shlex
import threading
import time

import pytest

from fedload.feeder.agent import run_agent
from fedload.feeder.agent_options import AgentOptions
from tests.support.federation import Federation, write_script

DUMPS = 5
BOUND_S = 0.2


def _dump_returns_after_pg_dump_s(options: AgentOptions, stamps: str) -> float:
    """Run `fedload agent dump`'s function into a pipe (read by a thread, as the superhub would); the seconds from
    pg_dump's exit (the last stamp its wrapper wrote) to the function's return."""
    read_end, write_end = os.pipe()
    drained = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(read_end, 1 << 16), b"")])
    drained.start()
    try:
        with open(write_end, "wb", buffering=0) as out:
            assert run_agent(options, out) == 0
            returned = time.time()
    finally:
        drained.join(timeout=30)
        os.close(read_end)
    with open(stamps) as lines:
        return returned - float(lines.read().split()[-1])


# run_agent leaves pg_dump's pipes to the garbage collector (the command's process ends right after it): in a test
# process that is a ResourceWarning, not the subject here.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_agent_returns_as_soon_as_pg_dump_has_exited(federation: Federation) -> None:
    """`fedload agent dump` of a small table into a pipe (so its reader watcher runs): the dump returns within
    0.2 s of pg_dump's exit, each of 5 times (the time taken by a wrapper of pg_dump, on the same clock). Measured
    inside the process, so a loaded machine's slow interpreter start and exit do not count; a watcher that polls
    the reader every 0.5 s and is joined at the end fails this (it returned 0.3-0.5 s after pg_dump)."""
    stamps = federation.tmp / "pg_dump_exits"
    pg_dump = federation.cluster.install.tool("pg_dump")
    wrapper = write_script(
        federation.tmp / "pg_dump.sh",
        f'{shlex.quote(pg_dump)} "$@"\nstatus=$?\ndate +%s.%N >> {shlex.quote(str(stamps))}\nexit $status\n',
    )
    database = federation.cluster.conninfo(federation.feeders["hub3"])
    options = AgentOptions(database=database, tables=["public.hosts"], pg_dump=wrapper, quiet=True)
    delays = [_dump_returns_after_pg_dump_s(options, str(stamps)) for _ in range(DUMPS)]
    assert max(delays) < BOUND_S, [round(d, 3) for d in delays]
