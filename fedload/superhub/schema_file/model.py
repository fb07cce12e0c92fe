"""What fedload keeps of a schema file: parse-tree nodes with the line each came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from pglast import ast

from fedload.names import DEFAULT_SCHEMA

__all__ = ["Extension", "LeftOut", "Placed", "Problem", "SchemaFile", "Table"]

N = TypeVar("N", bound=ast.Node)


@dataclass(slots=True)
class Placed(Generic[N]):
    """A node and the line of the file it starts on."""

    node: N
    line: int


@dataclass(slots=True)
class Table:
    """A table of the file: its columns, constraints (in CREATE TABLE, then added by ALTER TABLE) and indexes."""

    schema: str
    name: str
    line: int
    columns: list[Placed[ast.ColumnDef]] = field(default_factory=list)
    constraints: list[Placed[ast.Constraint]] = field(default_factory=list)
    added: list[Placed[ast.Constraint]] = field(default_factory=list)
    indexes: list[Placed[ast.IndexStmt]] = field(default_factory=list)
    extensions: list[str] = field(default_factory=list)  # found when its statements are built

    @property
    def key(self) -> tuple[str, str]:
        return self.schema, self.name

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.name}"

    def column(self, name: str) -> ast.ColumnDef | None:
        return next((c.node for c in self.columns if c.node.colname == name), None)


@dataclass(frozen=True, slots=True)
class Extension:
    """CREATE EXTENSION in the file, and the schema it puts its objects in (None: the superhub's default)."""

    node: ast.CreateExtensionStmt
    line: int
    schema: str | None


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A statement fedload does not carry over to the superhub."""

    kind: str
    name: str
    line: int


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong in the file: `fatal` ones stop a run when `table` is None or wanted."""

    line: int
    message: str
    table: tuple[str, str] | None = None
    fatal: bool = True


@dataclass(slots=True)
class SchemaFile:
    """What fedload read from a schema file."""

    path: Path
    enums: list[Placed[ast.CreateEnumStmt]] = field(default_factory=list)
    domains: list[Placed[ast.CreateDomainStmt]] = field(default_factory=list)
    sequences: dict[tuple[str, str], Placed[ast.CreateSeqStmt]] = field(default_factory=dict)
    extensions: dict[str, Extension] = field(default_factory=dict)
    tables: dict[tuple[str, str], Table] = field(default_factory=dict)
    others: dict[tuple[str, str], str] = field(default_factory=dict)  # views, materialized views...: their kind
    left_out: list[LeftOut] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def where(self, line: int) -> str:
        return f"{self.path.name}:{line}"

    def types(self) -> set[tuple[str, str]]:
        """The enums and domains the file creates."""
        enums = {names(e.node.typeName) for e in self.enums}
        return enums | {names(d.node.domainname) for d in self.domains}


def names(parts: tuple[ast.Node, ...] | None) -> tuple[str, str]:
    """A possibly qualified name list (String nodes) as (schema, name), the default schema when unqualified."""
    strings = [p.sval for p in parts or () if isinstance(p, ast.String) and p.sval is not None]
    if len(strings) == 1:
        return DEFAULT_SCHEMA, strings[0]
    return strings[-2], strings[-1]
