"""Pure streaming transformer for pg_dump plain-format output: bytes in, bytes out, no database.

`Transformer` merges consecutive single-row INSERTs into multi-row ones and applies a column remap;
`DumpSplitter` splits a dump into statements and COPY blocks for other consumers (the superhub importer).

Each name is imported from its module when first used (PEP 562): `import transforms.cli` or `transforms.errors` alone
does not compile the transformer's patterns (~30 ms at every start of an agent that does not transform).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transforms.batch import InsertBatcher
    from transforms.errors import DumpSyntaxError, RemapError, TooLargeError, TransformError
    from transforms.inserts import Insert, format_insert, parse_insert, qualified_name, split_tuple
    from transforms.limits import DEFAULT_MAX_STATEMENT_BYTES, DEFAULT_ROWS_PER_STATEMENT
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

_HOMES = {
    "CopyEnd": "transforms.split",
    "CopyRows": "transforms.split",
    "CopyStart": "transforms.split",
    "DEFAULT_MAX_STATEMENT_BYTES": "transforms.limits",
    "DEFAULT_ROWS_PER_STATEMENT": "transforms.limits",
    "DumpSplitter": "transforms.split",
    "DumpSyntaxError": "transforms.errors",
    "Insert": "transforms.inserts",
    "InsertBatcher": "transforms.batch",
    "InsertRows": "transforms.split",
    "Item": "transforms.split",
    "MetaCommand": "transforms.split",
    "Remap": "transforms.remap",
    "RemapError": "transforms.errors",
    "Statement": "transforms.split",
    "TableRemap": "transforms.remap",
    "TooLargeError": "transforms.errors",
    "TransformError": "transforms.errors",
    "TransformOptions": "transforms.transform",
    "TransformStats": "transforms.transform",
    "Transformer": "transforms.transform",
    "Verbatim": "transforms.split",
    "announced_tables": "transforms.transform",
    "format_insert": "transforms.inserts",
    "load_remap": "transforms.remap",
    "parse_insert": "transforms.inserts",
    "parse_remap": "transforms.remap",
    "qualified_name": "transforms.inserts",
    "split_tuple": "transforms.inserts",
    "transform_stream": "transforms.transform",
}


def __getattr__(name: str) -> Any:
    """`name` from its module, imported now."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'transforms' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
