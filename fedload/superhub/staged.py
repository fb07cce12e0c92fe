"""A parent's staging table of one run, and what the importer put into it: what the importer, the statistics, the
unchanged tables' checks and the swap share (docs/how-it-works.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedload.superhub.binary_receive import UnchangedTable
from fedload.superhub.delta import StagedDelta
from fedload.superhub.schema import STAGE_SCHEMA, ParentTable, qualified

__all__ = ["StagedTable"]


@dataclass(slots=True)
class StagedTable:
    """A parent's staging table of this run, and what went into it."""

    parent: ParentTable
    stage_name: str
    columns: list[str] = field(default_factory=list)
    dropped_columns: list[str] = field(default_factory=list)
    from_dump: dict[str, str] = field(default_factory=dict)  # dump column -> the column it loads (after remap)
    rows: int = 0
    rows_by_copy: int = 0  # of `rows`, INSERT tuples loaded as COPY rows (fedload.superhub.literal_copy)
    read_once: int = 0  # INSERT statements the splitter read in one pass (Importer.tuples_pattern)
    inserted: bool = False  # its data came as INSERTs
    rejected: int = 0
    present: bool = False  # the dump announced or carried the table: present and empty is fine, absent is not
    loaded: bool = False  # its data arrived (a second time rejects the dump)
    kept: UnchangedTable | None = None  # the feeder says it is unchanged: its partition stays (no staging table)
    created: bool = False  # its staging table exists: created at the table's first data, or at the dump's end
    delta: StagedDelta | None = None  # the section sent a delta state (fedload.superhub.delta), and maybe changes only

    @property
    def changes_only(self) -> StagedDelta | None:
        """Its delta where it holds the rows of the table's changed buckets only (the swap applies them to its
        partition); None where it holds the whole table."""
        return self.delta if self.delta is not None and self.delta.head.dirty is not None else None

    @property
    def stage_sql(self) -> str:
        """The quoted name of the staging table."""
        return qualified(STAGE_SCHEMA, self.stage_name)
