"""Merge consecutive INSERTs into the same table and columns into multi-row statements."""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

from transforms.inserts import Insert, format_insert
from transforms.limits import DEFAULT_MAX_STATEMENT_BYTES, DEFAULT_ROWS_PER_STATEMENT

__all__ = ["DEFAULT_MAX_STATEMENT_BYTES", "DEFAULT_ROWS_PER_STATEMENT", "InsertBatcher"]

_SEPARATOR_BYTES = 3  # ",\n\t"


class InsertBatcher:
    """Collects tuples of compatible INSERTs; emits a statement when a cap is reached or the run ends.

    A statement holds at most `rows_per_statement` tuples and at most `max_statement_bytes` of tuple text,
    unless a single tuple is larger by itself.
    """

    def __init__(
        self,
        rows_per_statement: int = DEFAULT_ROWS_PER_STATEMENT,
        max_statement_bytes: int = DEFAULT_MAX_STATEMENT_BYTES,
    ) -> None:
        if rows_per_statement < 1 or max_statement_bytes < 1:
            raise ValueError("rows_per_statement and max_statement_bytes must be positive")
        self._rows_cap = rows_per_statement
        self._bytes_cap = max_statement_bytes
        self._first: Insert | None = None
        self._tuples: list[bytes] = []

    @property
    def is_empty(self) -> bool:
        """Whether no tuples are waiting."""
        return not self._tuples

    def add(self, insert: Insert) -> list[bytes]:
        """Take the tuples of `insert`; return the statements completed meanwhile."""
        out = [] if self._first is None or self._first.batch_key == insert.batch_key else self.flush()
        if self._first is None:
            self._first = insert
        self._tuples.extend(insert.tuples)
        while len(self._tuples) > self._rows_cap or self._over_bytes_cap():
            out.append(self._cut())
        return out

    def is_whole(self, insert: Insert) -> bool:
        """Whether `insert` is a statement this batcher would make of its tuples alone: exactly `rows_per_statement`
        of them within the byte cap, as pg_dump's `--rows-per-insert` writes them, so it may go on as written."""
        return insert.rows == self._rows_cap and len(insert.values) + _SEPARATOR_BYTES <= self._bytes_cap

    def flush(self) -> list[bytes]:
        """Emit what is collected (nothing if empty) and start afresh."""
        out = [format_insert(self._first, self._tuples)] if self._first is not None and self._tuples else []
        self._first, self._tuples = None, []
        return out

    def _over_bytes_cap(self) -> bool:
        # Cheap upper bound first: most batches of small rows are far below the cap.
        return len(self._tuples) > 1 and sum(map(len, self._tuples)) + _SEPARATOR_BYTES * len(self._tuples) > (
            self._bytes_cap
        )

    def _cut(self) -> bytes:
        """Emit the longest leading batch within both caps (at least one tuple)."""
        assert self._first is not None
        sizes = accumulate(len(t) + _SEPARATOR_BYTES for t in self._tuples[: self._rows_cap])
        count = max(1, min(self._rows_cap, bisect_right(list(sizes), self._bytes_cap)))
        statement = format_insert(self._first, self._tuples[:count])
        del self._tuples[:count]
        return statement
