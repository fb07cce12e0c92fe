"""What a snapshot session decided before pg_dump (fedload/feeder/snapshot_dump.py): the exported snapshot, the
tables pg_dump dumps in it, each asked table's digest, and how they shape pg_dump's options and the trailer."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fedload.feeder.agent_options import AgentOptions

__all__ = ["DigestedTable", "SnapshotPlan"]

# pg_dump's wait for its ACCESS SHARE locks, which the session holds already: only a lock queued in between (an
# ALTER TABLE waiting for the session) makes it wait, and the session waits for pg_dump (as in statistics_dump.py).
_LOCK_WAIT = "60s"

Table = tuple[str, str]


@dataclass(frozen=True)
class DigestedTable:
    """A table asked about, as its snapshot showed it."""

    schema: str
    name: str
    counters: str  # its counters now
    digest: str  # "": not computed (the counters said it changed, or the superhub held none)
    digest_rows: int  # the digest's count (0 where none was computed)
    kept: bool  # its digest is the superhub's: not dumped


@dataclass(frozen=True)
class SnapshotPlan:
    """What the session decided before pg_dump: the snapshot it exported, the tables pg_dump dumps in it, and each
    asked table's digest."""

    snapshot: str
    server_version: str
    snapshot_epoch_s: float  # the feeder server's now() in the session's transaction (Unix seconds)
    dumped: tuple[str, ...]  # the request's --table arguments of the tables the feeder has, not kept
    digested: tuple[DigestedTable, ...]

    def pg_dump_options(self, options: AgentOptions) -> AgentOptions:
        """`options` for pg_dump's command line: the tables not kept, in the exported snapshot."""
        arguments = (f"--snapshot={self.snapshot}", f"--lock-wait-timeout={_LOCK_WAIT}")
        return dataclasses.replace(options, tables=self.dumped, columns=(), pg_dump_args=arguments)

    def trailer(self, counts: Mapping[Table, int], tables: Iterable[Table]) -> dict[str, Any]:
        """The trailer's `rows` and `tables` (pg_dump's `counts` and `tables`, and the kept tables), `digests` and
        `unchanged` (protocol 5), and the snapshot's time."""
        digested = self.digested
        kept = [t for t in digested if t.kept]
        rows = {**counts, **{(t.schema, t.name): t.digest_rows for t in kept}}
        return {
            "rows": [(schema, name, rows[schema, name]) for schema, name in sorted(rows)],
            "tables": sorted({*tables, *((t.schema, t.name) for t in kept)}),
            "digests": [
                (t.schema, t.name, t.digest, rows.get((t.schema, t.name), 0), t.counters) for t in self.digested
            ],
            "unchanged": [(t.schema, t.name, t.digest_rows, t.digest) for t in kept],
            "snapshot_epoch_s": self.snapshot_epoch_s,
        }

    def contradiction(self, counts: Mapping[Table, int]) -> str:
        """Why pg_dump's row `counts` contradict a digest taken in the same snapshot ("" if none does)."""
        for table in self.digested:
            sent = counts.get((table.schema, table.name), 0)
            if table.digest and not table.kept and sent != table.digest_rows:
                where = f"table {table.schema}.{table.name}"
                return f"{where}: pg_dump sent {sent} rows but {table.digest_rows} were digested in its snapshot"
        return ""
