"""A feeder whose binary COPY data claims one row of 100 MiB fields (a few KiB of zstd on the wire): the superhub
refuses the dump at the field that takes the row past `superhub.max_statement_bytes` (old data kept), and the
superhub backend that loads it stays near its usual memory (without the bound it took 1.3 GB: issue 54, item 2)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fedload.config import DEFAULT_RECEIVED_STATEMENT_BYTES
from fedload.errors import ErrorKind
from fedload.results import Outcome
from tests.scenarios.test_statement_bound import bounded
from tests.support.federation import HOST_COLS, Federation, staging_leftovers, sync

MIB = 1 << 20
FIELD_BYTES = 100 * MIB
COLUMNS = ["hostkey", "name", "site", "seen", "online"]
# An agent_command writing a binary-mode stream whose hosts section holds one row of five 100 MiB fields, made as
# it is written (the stream encoder takes it a block at a time), until it ends or the pipe closes.
AGENT_SCRIPT = """#!{python}
import struct
import sys
from fedload.feeder.sections import SECTION_END, chunk_head, section_head
from fedload.stream import Header, StreamEncoder
columns, field = {columns!r}, {field}
data_bytes = 19 + 2 + len(columns) * (4 + field) + 2
encoder = StreamEncoder(Header("zstd", "binary", "evil", "15", ["public.*"]))
out = sys.stdout.buffer
out.write(encoder.start())
head = section_head(("public", "hosts"), columns, binary=True, reason="", unsent=[])
out.write(encoder.data(head + chunk_head(data_bytes) + b"PGCOPY\\n\\xff\\r\\n\\x00" + bytes(8) + struct.pack("!h", 5)))
value = b"x" * (1 << 20)
for _ in columns:
    out.write(encoder.data(struct.pack("!i", field)))
    for _ in range(field >> 20):
        out.write(encoder.data(value))
out.write(encoder.data(b"\\xff\\xff" + SECTION_END))
out.write(encoder.finish(pg_dump_exit_status=0, rows={{}}))
"""


def hostile_agent(fed: Federation) -> str:
    script = fed.tmp / "hostile-binary-row"
    script.write_text(AGENT_SCRIPT.format(python=sys.executable, columns=COLUMNS, field=FIELD_BYTES))
    script.chmod(0o755)
    return str(script)


def _vm_hwm_mib(pid: int) -> float:
    """A process's peak resident set (VmHWM), MiB; 0 once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    line = next((line for line in status.splitlines() if line.startswith("VmHWM:")), "VmHWM: 0 kB")
    return int(line.split()[1]) / 1024


def _backends(postmaster: int, db: str) -> list[int]:
    """The postmaster's children connected to `db` (their process titles name it)."""
    try:
        children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    except OSError:
        return []
    pids = []
    for pid in map(int, children):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f" {db} ".encode() in title:
            pids.append(pid)
    return pids


@contextmanager
def backend_peak(fed: Federation) -> Iterator[list[float]]:
    """The largest peak resident set (MiB) of the superhub database's backends while the block runs, sampled
    every 5 ms (a peak is kept by the kernel until the backend exits), as the one item of the list yielded."""
    postmaster = int((fed.cluster.data / "postmaster.pid").read_text().split()[0])
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max([peak[0], *(_vm_hwm_mib(pid) for pid in _backends(postmaster, fed.superhub))])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join(timeout=10)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bound_mib", [16, DEFAULT_RECEIVED_STATEMENT_BYTES // MIB])
async def test_a_row_of_huge_fields_is_refused_and_the_backend_stays_small(
    federation: Federation, bound_mib: int
) -> None:
    """The run fails as a bad dump naming the feeder, the table and the size, at the field that takes the row past
    the bound, before that field reaches PostgreSQL; hub1's old data stays. Under a 16 MiB bound no value reaches
    the backend (its peak stays within 32 MiB of a usual binary load's); under the default 128 MiB one 100 MiB
    field does (the backend holds it twice: read, then as text), and the backend stays under 400 MiB."""
    fed = federation
    config = bounded(fed.config(dump_mode="binary", exclude_tables=["public.contexts"]), bound_mib * MIB)
    with backend_peak(fed) as usual:
        assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    before = fed.digest(fed.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1")
    hostile = bounded(
        fed.config(dump_mode="binary", exclude_tables=["public.contexts"], agent_command=[hostile_agent(fed)]),
        bound_mib * MIB,
    )
    with backend_peak(fed) as peak:
        (run,) = await sync(hostile, "hub1")
    print(f"bound {bound_mib} MiB: backend peak {peak[0]:.0f} MiB, usual {usual[0]:.0f} MiB")
    assert run.outcome == Outcome.FAILED
    assert peak[0] < (usual[0] + 32 if bound_mib < 100 else 400), f"{peak[0]:.0f} MiB, usual {usual[0]:.0f} MiB"
    assert run.error_kind is ErrorKind.DUMP, run.error
    size = FIELD_BYTES if bound_mib < 100 else 2 * FIELD_BYTES
    assert run.error == (
        f"feeder hub1, table public.hosts: the binary COPY data has a row of at least {size} bytes, more than "
        f"superhub.max_statement_bytes ({bound_mib * MIB})"
    )
    assert fed.digest(fed.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1") == before
    assert staging_leftovers(fed) == 0
