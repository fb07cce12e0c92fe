"""Per-table column remapping: rename, drop, add a constant, reorder; for INSERT tuples and COPY rows.

The remap file is TOML::

    [tables."public.hosts"]
    rename = { hostname = "name" }          # dump column -> new name
    drop = ["obsolete"]                     # dump columns to leave out
    add = { site = "'eu-west'", tier = "2" } # new column -> SQL literal (NULL, true/false, number, 'text')
    columns = ["hostkey", "name", "site"]   # optional: the exact target column order

Steps apply in that order. Names are as PostgreSQL stores them (unquoted, case as is); a table name without
schema means `public`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from transforms.errors import RemapError
from transforms.lexical import DEFAULT_SCHEMA

if TYPE_CHECKING:
    from pathlib import Path  # open() takes it: pathlib stays out of the agent's start (#36)

__all__ = ["ColumnPlan", "Remap", "TableRemap", "load_remap", "parse_remap", "quote_identifier"]

_LITERAL = re.compile(r"NULL|TRUE|FALSE|[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|'(?:[^']|'')*'", re.IGNORECASE)
_COPY_ESCAPES = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}
_TABLE_KEYS = frozenset({"rename", "drop", "add", "columns"})


def quote_identifier(name: str) -> bytes:
    """`name` as an always-quoted SQL identifier."""
    return ('"' + name.replace('"', '""') + '"').encode()


def _copy_text(literal: str) -> bytes:
    """The COPY text-format field for a validated SQL literal."""
    upper = literal.upper()
    if upper == "NULL":
        return b"\\N"
    if upper in ("TRUE", "FALSE"):
        return upper[0].lower().encode()
    if literal.startswith("'"):
        return literal[1:-1].replace("''", "'").translate(_COPY_ESCAPES).encode()
    return literal.encode()


@dataclass(frozen=True)
class ColumnPlan:
    """How to build the output columns from one dump column list: an index into the input, or a constant."""

    input_width: int
    columns: tuple[bytes, ...]
    sources: tuple[int | bytes, ...]
    copy_constants: tuple[bytes | None, ...]

    def apply_values(self, values: list[bytes]) -> list[bytes]:
        """Output SQL values from input SQL values."""
        return [values[s] if isinstance(s, int) else s for s in self.sources]

    def apply_copy_fields(self, fields: list[bytes]) -> list[bytes]:
        """Output COPY fields from input COPY fields."""
        return [
            fields[s] if isinstance(s, int) else c or b""
            for s, c in zip(self.sources, self.copy_constants)  # built together, of one length
        ]


@dataclass(frozen=True)
class TableRemap:
    """The remap rules of one table."""

    table: str
    rename: Mapping[str, str]
    drop: frozenset[str]
    add: Mapping[str, str]
    order: tuple[str, ...] | None

    def plan(self, dump_columns: list[str], written: tuple[bytes, ...]) -> ColumnPlan:
        """The output columns for a dump column list; RemapError if the rules do not fit it."""
        for name in (*self.rename, *self.drop):
            if name not in dump_columns:
                raise RemapError(
                    f"remap of table {self.table}: column {name!r} is not in the dump's columns "
                    f"({', '.join(dump_columns)})"
                )
        kept = [(self.rename.get(name, name), i) for i, name in enumerate(dump_columns) if name not in self.drop]
        names = [name for name, _ in kept]
        for name in self.add:
            if name in names:
                raise RemapError(f"remap of table {self.table}: column {name!r} to add is already in the dump")
        by_name: dict[str, int | str] = {**dict(kept), **self.add}
        order = list(self.order) if self.order is not None else list(by_name)
        if sorted(order) != sorted(by_name):
            raise RemapError(
                f"remap of table {self.table}: 'columns' must list exactly the columns "
                f"{', '.join(sorted(by_name))}, not {', '.join(order)}"
            )
        return self._build(order, by_name, dump_columns, written)

    def _build(
        self,
        order: list[str],
        by_name: dict[str, int | str],
        dump_columns: list[str],
        written: tuple[bytes, ...],
    ) -> ColumnPlan:
        columns, sources, constants = [], [], []
        for name in order:
            source = by_name[name]
            unchanged = isinstance(source, int) and dump_columns[source] == name
            columns.append(written[source] if unchanged and isinstance(source, int) else quote_identifier(name))
            sources.append(source if isinstance(source, int) else source.encode())
            constants.append(None if isinstance(source, int) else _copy_text(source))
        return ColumnPlan(len(dump_columns), tuple(columns), tuple(sources), tuple(constants))


@dataclass(frozen=True)
class Remap:
    """Remap rules by table (`schema.name`)."""

    tables: Mapping[str, TableRemap]

    def for_table(self, table: str) -> TableRemap | None:
        """The rules for a table named `schema.name`, if any."""
        return self.tables.get(table)


def load_remap(path: Path) -> Remap:
    """Read and validate a remap file."""
    toml = _toml_parser()
    if toml is None:
        version = ".".join(map(str, sys.version_info[:3]))
        raise RemapError(
            f"cannot read remap file {path}: Python {version} has no TOML parser (tomllib comes with 3.11): "
            "install tomli, or run with Python 3.11 or newer"
        )
    try:
        with open(path, "rb") as file:  # open(), not Path.open(): no pathlib to import
            document = toml.load(file)
    except (OSError, ValueError) as exc:  # ValueError: TOMLDecodeError, and UnicodeDecodeError
        raise RemapError(f"cannot read remap file {path}: {exc}") from exc
    return parse_remap(document, source=str(path))


def _toml_parser() -> Any:  # the module tomllib, or tomli with the same API
    """The standard library's tomllib (3.11+); before, tomli if installed (the parser tomllib was made from),
    else None. Imported when a remap file is read: the transformer itself needs neither."""
    if sys.version_info >= (3, 11):
        import tomllib  # noqa: PLC0415

        return tomllib
    try:
        import tomli  # type: ignore[import-not-found]  # noqa: PLC0415
    except ImportError:
        return None
    return tomli


def parse_remap(document: Mapping[str, object], source: str = "remap") -> Remap:
    """Validate a parsed remap document."""
    tables = document.get("tables")
    unknown = set(document) - {"tables"}
    if unknown or not isinstance(tables, dict):
        raise RemapError(f'{source}: expected only a [tables."schema.name"] section per table')
    parsed = {}
    for key, rules in tables.items():
        name = key if "." in key else f"{DEFAULT_SCHEMA}.{key}"
        parsed[name] = _parse_table(name, rules, f"{source}: tables.{key}")
    return Remap(parsed)


def _parse_table(table: str, rules: object, where: str) -> TableRemap:
    if not isinstance(rules, dict) or not rules or set(rules) - _TABLE_KEYS:
        raise RemapError(f"{where}: expected some of the keys {', '.join(sorted(_TABLE_KEYS))}")
    rename = _string_map(rules.get("rename", {}), f"{where}.rename")
    add = _string_map(rules.get("add", {}), f"{where}.add")
    for column, literal in add.items():
        if not _LITERAL.fullmatch(literal):
            raise RemapError(f"{where}.add.{column}: {literal!r} is not an SQL literal (NULL, true, 42, 'text')")
    drop = _string_list(rules.get("drop", []), f"{where}.drop")
    if overlap := set(rename) & set(drop):
        raise RemapError(f"{where}: columns {', '.join(sorted(overlap))} are both renamed and dropped")
    order = rules.get("columns")
    columns = tuple(_string_list(order, f"{where}.columns")) if order is not None else None
    return TableRemap(table, rename, frozenset(drop), add, columns)


def _string_map(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) and v for v in value.values()):
        raise RemapError(f'{where}: expected a table of column = "string" pairs')
    return dict(value)


def _string_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RemapError(f"{where}: expected a list of column names")
    if len(set(value)) != len(value):
        raise RemapError(f"{where}: a column is listed twice")
    return list(value)
