"""The statistics section of a binary-mode stream (docs/stream-format.md): `pg_dump --statistics-only` SQL text,
split into statements exactly as a copy-mode dump is (each bounded by `superhub.max_statement_bytes`), for the
importer, which hands the statistics calls to the same collector as in copy mode (fedload.superhub.statistics) and
refuses anything else it does not allow in a dump. Nothing in it is ever run as sent.
"""

from __future__ import annotations

import json

from fedload.errors import DumpError
from transforms import DumpSplitter, Item, MetaCommand, Statement, Verbatim

StatisticsItem = Statement | MetaCommand | Verbatim

__all__ = ["StatisticsItem", "StatisticsSection", "is_statistics_head"]

_STATISTICS_HEAD = {"format": "statistics"}


def is_statistics_head(body: bytes) -> bool:
    """Whether a section head opens the statistics section (exactly `{"format": "statistics"}`)."""
    try:
        return bool(json.loads(body) == _STATISTICS_HEAD)
    except (ValueError, RecursionError):
        return False


class StatisticsSection:
    """`feed()` the section's data, get its statements; `close()` at the section's end."""

    def __init__(self, max_statement_bytes: int) -> None:
        self._splitter = DumpSplitter(max_statement_bytes, count_copy_lines=False)

    def feed(self, data: bytes) -> list[StatisticsItem]:
        """The items `data` completes; DumpError for one that statistics never are (data, INSERTs)."""
        return _checked(self._splitter.feed(data))

    def close(self) -> list[StatisticsItem]:
        """The section's last items; DumpError if it ends inside a statement."""
        return _checked(self._splitter.close())


def _checked(items: list[Item]) -> list[StatisticsItem]:
    """`items`, each a statement, meta-command or comment; DumpError naming the first that is not."""
    out: list[StatisticsItem] = []
    for item in items:
        if not isinstance(item, Statement | MetaCommand | Verbatim):
            raise DumpError(f"the statistics section of the binary stream holds {type(item).__name__}, not statements")
        out.append(item)
    return out
