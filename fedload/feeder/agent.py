"""`fedload agent dump`, on the feeder: the dispatcher to the dump of the mode asked for (docs/feeder.md).

Copy and inserts modes run pg_dump through the transformer (fedload/feeder/text_dump.py), in a snapshot whose
unchanged tables are left out when the superhub asks for digests (fedload/feeder/snapshot_dump.py); binary mode
copies the tables from a psql session of its own (fedload/feeder/binary_dump.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, BinaryIO

from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.text_dump import run_pg_dump

if TYPE_CHECKING:
    from fedload.feeder.snapshot import SnapshotSession

__all__ = ["run_agent"]


def run_agent(options: AgentOptions, out: BinaryIO, kept: SnapshotSession | None = None) -> int:
    """Write the fedload stream of one dump to `out`: 0 when the dump is complete, else AgentError saying why.
    `kept`: the served agent's psql session, borrowed, for a binary dump (fedload/feeder/kept_session.py).

    The stream's trailer says the same, so the superhub reports the same line.
    """
    if options.dump_mode == "binary":
        from fedload.feeder.binary_dump import run_binary_dump  # noqa: PLC0415 - its own session, no pg_dump

        return run_binary_dump(options, out, kept)
    if options.columns:  # the superhub asks for digests: unchanged tables are not dumped
        from fedload.feeder.snapshot_dump import run_snapshot_dump  # noqa: PLC0415 - a psql session first

        return run_snapshot_dump(options, out)
    return run_pg_dump(options, out)
