"""Tables for people: drawn by rich on a terminal; to a pipe or a file, tab-separated lines with whole values.

A piped table is a `# title` line, a header line and one line per row, each value complete on its line (rich
would cut it to 80 columns), so `grep`, `cut -f` and `less` see everything. Cells are plain strings or rich
`Text` (styled, never parsed as markup, so a `[` in an error message stays as written).
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["print_table"]


def print_table(table: Table, console: Console) -> None:
    """Draw `table` on a terminal; otherwise write it as tab-separated lines."""
    if console.is_terminal:
        console.print(table)
        return
    lines = [f"# {_plain(table.title)}"] if table.title else []
    lines.append("\t".join(_plain(column.header) for column in table.columns))
    lines += ["\t".join(map(_plain, row)) for row in zip(*(column.cells for column in table.columns), strict=True)]
    print("\n".join(lines), file=console.file, flush=True)


def _plain(cell: RenderableType | None) -> str:
    text = cell.plain if isinstance(cell, Text) else str(cell or "")
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")
