"""Pure streaming transformer for pg_dump plain-format output: bytes in, bytes out, no database.

`Transformer` merges consecutive single-row INSERTs into multi-row ones and applies a column remap;
`DumpSplitter` splits a dump into statements and COPY blocks for other consumers (the superhub importer).
"""

from __future__ import annotations

from transforms.batch import DEFAULT_MAX_STATEMENT_BYTES, DEFAULT_ROWS_PER_STATEMENT, InsertBatcher
from transforms.errors import DumpSyntaxError, RemapError, TooLargeError, TransformError
from transforms.inserts import Insert, format_insert, parse_insert, qualified_name, split_tuple
from transforms.remap import Remap, TableRemap, load_remap, parse_remap
from transforms.split import (
    CopyEnd,
    CopyRows,
    CopyStart,
    DumpSplitter,
    InsertRows,
    Item,
    MetaCommand,
    Statement,
    Verbatim,
)
from transforms.transform import Transformer, TransformOptions, TransformStats, announced_tables, transform_stream

__all__ = [
    "DEFAULT_MAX_STATEMENT_BYTES",
    "DEFAULT_ROWS_PER_STATEMENT",
    "CopyEnd",
    "CopyRows",
    "CopyStart",
    "DumpSplitter",
    "DumpSyntaxError",
    "Insert",
    "InsertBatcher",
    "InsertRows",
    "Item",
    "MetaCommand",
    "Remap",
    "RemapError",
    "Statement",
    "TableRemap",
    "TooLargeError",
    "TransformError",
    "TransformOptions",
    "TransformStats",
    "Transformer",
    "Verbatim",
    "announced_tables",
    "format_insert",
    "load_remap",
    "parse_insert",
    "parse_remap",
    "qualified_name",
    "split_tuple",
    "transform_stream",
]
