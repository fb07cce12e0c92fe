"""The rejected rows' table (`fedload.rejects`)."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

__all__ = ["RejectedRow", "forget_rejects", "record_reject"]

_RECORD = """
INSERT INTO fedload.rejects (run_id, feeder, table_name, sqlstate, error, row_text) VALUES ($1, $2, $3, $4, $5, $6)
"""


@dataclass(frozen=True, slots=True)
class RejectedRow:
    """A row the superhub refused (`bad_rows = "reject"`); each field is the `fedload.rejects` column of its name."""

    run_id: int | None
    feeder: str
    table_name: str  # the parent's qualified name
    sqlstate: str | None
    error: str
    row_text: str


async def record_reject(conn: asyncpg.Connection, row: RejectedRow) -> None:
    """Set `row` aside, on the load's own connection: in its transaction, so the row goes if the load does."""
    await conn.execute(_RECORD, row.run_id, row.feeder, row.table_name, row.sqlstate, row.error, row.row_text)


async def forget_rejects(conn: asyncpg.Connection, feeder: str, *, except_run: int | None = None) -> None:
    """Delete the rejected rows recorded for the feeder's earlier data (all, or all but `except_run`'s)."""
    await conn.execute(
        "DELETE FROM fedload.rejects WHERE feeder = $1 AND run_id IS DISTINCT FROM $2", feeder, except_run
    )
