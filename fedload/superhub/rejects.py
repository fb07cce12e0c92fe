"""`bad_rows = "reject"`: rows the superhub refuses go to `fedload.rejects` instead of failing the feeder's run.

COPY data first lands in a temporary all-text table (nothing in it can be refused), then moves to the staging
table in one `INSERT ... SELECT` with casts. Only if that fails does the move split the rows in halves under
savepoints until each refused row is alone; it is recorded with the error and its text. INSERT batches are tried
whole under a savepoint and, when refused, row by row. Either way the fast path costs one savepoint.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass

import asyncpg

from fedload.log import get_logger
from fedload.superhub.bookkeeping import RejectedRow, record_reject
from fedload.superhub.schema import ParentTable, ident

__all__ = ["RejectWriter", "is_bad_row"]

_BAD_ROW_CLASSES = ("22", "23")  # data exceptions, integrity constraint violations: the row's fault
_BAD_ROW_STATES = ("54000",)  # program_limit_exceeded: a value beyond a limit, e.g. more than 6 array dimensions
log = get_logger()


def is_bad_row(exc: BaseException) -> bool:
    """Whether the superhub refused a row because of the row itself (SQLSTATE class 22 or 23, or a value limit)."""
    state = getattr(exc, "sqlstate", None) or ""
    return isinstance(exc, asyncpg.PostgresError) and (state[:2] in _BAD_ROW_CLASSES or state in _BAD_ROW_STATES)


@dataclass(slots=True)
class _Move:
    """SQL to move rows `n` in [$1, $2) from the raw table to the staging table, and to show one raw row."""

    insert: str
    row_text: str
    create_index: str
    indexed: bool = False


class RejectWriter:
    """Loads rows while setting aside the ones the superhub refuses, for one feeder's run."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        *,
        feeder: str,
        run_id: int | None,
        fatal: Callable[[asyncpg.PostgresError], bool] = lambda _: False,
    ) -> None:
        self._conn = conn
        self._feeder = feeder
        self._run_id = run_id
        self._fatal = fatal  # refusals that condemn the whole dump, not one row
        self._raw_tables = 0

    async def copy(
        self, parent: ParentTable, stage_sql: str, columns: list[str], source: AsyncIterable[bytes]
    ) -> tuple[int, int]:
        """COPY `source` via a raw text table into `stage_sql`; (rows loaded, rows rejected).

        The raw table's columns are named by position (c1, c2, ...), so no user column can clash with `n`."""
        self._raw_tables += 1
        raw = f"fedload_raw_{self._raw_tables}"
        raw_columns = _raw_columns(columns)
        text_columns = ", ".join(f"{c} text" for c in raw_columns)
        await self._conn.execute(
            f"CREATE TEMP TABLE {_temp(raw)} (n bigint GENERATED ALWAYS AS IDENTITY, {text_columns}) ON COMMIT DROP"
        )
        status = await self._conn.copy_to_table(raw, schema_name="pg_temp", columns=raw_columns, source=source)
        total = int(status.rsplit(" ", 1)[1])
        rejected = await self._move(parent, _move_sql(parent, stage_sql, raw, columns), 1, total + 1)
        await self._conn.execute(f"DROP TABLE {_temp(raw)}")
        return total - rejected, rejected

    async def insert(self, parent: ParentTable, head: str, tuples: list[str]) -> tuple[int, int]:
        """`head` + VALUES `tuples`, whole or else row by row; (rows loaded, rows rejected)."""
        if await self._attempt(head + ",".join(tuples)) is None:
            return len(tuples), 0
        rejected = 0
        for row in tuples:
            error = await self._attempt(head + row)
            if error is not None:
                await self._record(parent, error, row)
                rejected += 1
        return len(tuples) - rejected, rejected

    async def _attempt(self, sql: str, *args: object) -> asyncpg.PostgresError | None:
        """Run `sql` under a savepoint; the error if the superhub refused a row (other errors raise)."""
        try:
            async with self._conn.transaction():
                await self._conn.execute(sql, *args)
        except asyncpg.PostgresError as exc:
            if not is_bad_row(exc) or self._fatal(exc):
                raise
            return exc
        return None

    async def _move(self, parent: ParentTable, move: _Move, low: int, high: int) -> int:
        """Move raw rows [low, high); the number refused, found by halving the range under savepoints."""
        if high <= low:
            return 0
        error = await self._attempt(move.insert, low, high)
        if error is None:
            return 0
        if high - low == 1:
            await self._record(parent, error, await self._conn.fetchval(move.row_text, low))
            return 1
        if not move.indexed:
            await self._conn.execute(move.create_index)
            move.indexed = True
        middle = (low + high) // 2
        return await self._move(parent, move, low, middle) + await self._move(parent, move, middle, high)

    async def _record(self, parent: ParentTable, exc: asyncpg.PostgresError, row_text: str) -> None:
        state = getattr(exc, "sqlstate", None)
        row = RejectedRow(self._run_id, self._feeder, parent.qualified_name, state, str(exc), row_text)
        await record_reject(self._conn, row)
        log.warning("import.row_rejected", feeder=self._feeder, table=parent.qualified_name, sqlstate=state)


def _raw_columns(columns: list[str]) -> list[str]:
    return [f"c{i}" for i in range(1, len(columns) + 1)]


def _move_sql(parent: ParentTable, stage_sql: str, raw: str, columns: list[str]) -> _Move:
    casts = []
    for name, raw_name in zip(columns, _raw_columns(columns), strict=True):
        column = parent.column(name)
        assert column is not None  # the importer's column plan keeps only the parent's columns
        casts.append(f"CAST({raw_name} AS {column.base_type_sql})")
    names = ", ".join(ident(c) for c in columns)
    raw_names = ", ".join(_raw_columns(columns))
    return _Move(
        insert=f"INSERT INTO {stage_sql} ({names}) SELECT {', '.join(casts)} "  # noqa: S608 - quoted names
        f"FROM {_temp(raw)} WHERE n >= $1 AND n < $2",
        row_text=f"SELECT ROW({raw_names})::text FROM {_temp(raw)} WHERE n = $1",  # noqa: S608 - fedload's names
        create_index=f"CREATE INDEX ON {_temp(raw)} (n)",
    )


def _temp(name: str) -> str:
    return f"pg_temp.{ident(name)}"
