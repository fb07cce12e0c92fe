"""The agent ends as soon as its dump ends: nothing it waits for at the end (the watcher of its reader) costs time."""

from __future__ import annotations

import shlex
import subprocess
import time

from tests.federation import AGENT, Federation, write_script

DUMPS = 5
BOUND_S = 0.2


def test_the_agent_exits_as_soon_as_pg_dump_has_exited(federation: Federation) -> None:
    """Each of several dumps of a small table: the agent has exited within 0.2 s of pg_dump's exit (the time is
    taken by a wrapper of pg_dump, on the same clock); a watcher that polls the reader every 0.5 s fails this."""
    stamps = federation.tmp / "pg_dump_exits"
    pg_dump = federation.cluster.install.tool("pg_dump")
    wrapper = write_script(
        federation.tmp / "pg_dump.sh",
        f'{shlex.quote(pg_dump)} "$@"\nstatus=$?\ndate +%s.%N >> {shlex.quote(str(stamps))}\nexit $status\n',
    )
    database = federation.cluster.conninfo(federation.feeders["hub3"])
    argv = [*AGENT.split(), "agent", "dump", "--quiet", "--database", database, "--table", "public.hosts"]
    argv += ["--pg-dump", wrapper]  # --quiet as the superhub runs it: a success logs nothing
    delays = []
    for _ in range(DUMPS):
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as agent:
            stream, _ = agent.communicate(timeout=60)
            exited = time.time()
        assert agent.returncode == 0
        assert stream
        delays.append(exited - float(stamps.read_text().split()[-1]))
    assert max(delays) < BOUND_S, [round(d, 3) for d in delays]
