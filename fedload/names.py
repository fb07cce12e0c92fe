"""Table names and table patterns by PostgreSQL's identifier rules, in one place.

A `TableName` is a schema and a name exactly as PostgreSQL stores them (case kept, no quotes). A `TablePattern` is
what an operator writes in `superhub.tables` or `feeders.NAME.exclude_tables`, read as psql and pg_dump read
`\\d` and `--table` patterns: `schema.table`, unquoted letters fold to lower case, double quotes keep case and make
every character literal (`""` is a quote), `*` and `?` are wildcards and `[...]` a character class outside quotes.
The superhub matches its parents with these patterns and sends pg_dump only exact, quoted names, so the two can
never disagree about which tables a pattern means.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from fedload.feeder.table_patterns import translate
from transforms.errors import printable
from transforms.lexical import DEFAULT_SCHEMA, split_identifiers, unquote_identifier

__all__ = [
    "DEFAULT_SCHEMA",
    "MAX_COLUMNS",
    "MAX_IDENTIFIER_BYTES",
    "TableName",
    "TablePattern",
    "columns_refusal",
    "identifier_refusal",
    "quote_ident",
]

MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: PostgreSQL stores no longer name
MAX_COLUMNS = 1600  # MaxHeapAttributeNumber: no table has more columns


def quote_ident(name: str) -> str:
    """`name` as an always-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def identifier_refusal(name: str) -> str | None:
    """Why `name`, a feeder's claim, names nothing PostgreSQL could hold (None if it could): empty, a NUL, or more
    than MAX_IDENTIFIER_BYTES bytes in UTF-8, the agent's dump encoding (bytes as written: a name read from a dump
    with `surrogateescape` counts each invalid byte once). The reason shows the name's start, printable."""
    try:
        size = len(name.encode("utf-8", errors="surrogateescape"))
    except UnicodeEncodeError:  # a lone surrogate from JSON's \ud800: three bytes as written
        size = len(name.encode("utf-8", errors="surrogatepass"))
    if 0 < size <= MAX_IDENTIFIER_BYTES and "\0" not in name:
        return None
    shown = printable(name[:MAX_IDENTIFIER_BYTES]) + ("..." if len(name) > MAX_IDENTIFIER_BYTES else "")
    return f"the name '{shown}' ({size} bytes) is no PostgreSQL identifier (1 to {MAX_IDENTIFIER_BYTES} bytes, no NUL)"


def columns_refusal(names: Sequence[str]) -> str | None:
    """Why a feeder's list of a table's columns names no columns a PostgreSQL table could have (None if it could):
    more than MAX_COLUMNS, or a name that is no identifier."""
    if len(names) > MAX_COLUMNS:
        return f"{len(names)} columns, more than a PostgreSQL table can have ({MAX_COLUMNS})"
    return next(filter(None, map(identifier_refusal, names)), None)


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    """A table's schema and name as PostgreSQL stores them."""

    schema: str
    name: str

    @classmethod
    def from_dump(cls, written: bytes) -> TableName:
        """The table a dump names (`public."Hosts"`, `hosts`); without schema, in DEFAULT_SCHEMA."""
        parts = [unquote_identifier(part) for part in split_identifiers(written)]
        if (wrong := next(filter(None, map(identifier_refusal, parts)), None)) is not None:
            raise ValueError(wrong)
        if len(parts) == 1:
            return cls(DEFAULT_SCHEMA, parts[0])
        if len(parts) != 2:
            raise ValueError(f"{written.decode(errors='replace')!r} is not a table name")
        return cls(parts[0], parts[1])

    @classmethod
    def claimed(cls, schema: str, name: str) -> TableName:
        """A table a feeder names in its stream (a section head, the trailer): ValueError if either part is no
        identifier (`identifier_refusal`)."""
        if (wrong := identifier_refusal(schema) or identifier_refusal(name)) is not None:
            raise ValueError(wrong)
        return cls(schema, name)

    @property
    def sql(self) -> str:
        """The quoted `"schema"."name"` for SQL; also a pg_dump `--table` pattern that matches only this table."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    def __str__(self) -> str:
        """`schema.name` unquoted, as messages, run history and the agent's trailer name tables."""
        return f"{self.schema}.{self.name}"


class TablePattern:
    """A psql-style `schema.table` pattern; see the module docstring. `str()` gives it back as written."""

    __slots__ = ("_name", "_schema", "text")

    def __init__(self, text: str) -> None:
        parts = translate(text)
        if len(parts) != 2:
            raise ValueError(f"{text!r} is not schema.table (write the schema, e.g. {DEFAULT_SCHEMA}.{text})")
        if not all(parts):
            raise ValueError(f"{text!r} has an empty schema or table part")
        self.text = text
        self._schema, self._name = (re.compile(part, re.DOTALL) for part in parts)

    def matches(self, table: TableName) -> bool:
        """Whether the pattern matches the table (names as stored, case kept)."""
        return self._schema.fullmatch(table.schema) is not None and self._name.fullmatch(table.name) is not None

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"TablePattern({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TablePattern) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """Configuration files hold patterns as strings; the model holds TablePatterns."""
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )
