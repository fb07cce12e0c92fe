"""The statements that create the superhub's parents, built from the schema file's parse trees and written back by
pglast's deparser. Each one must parse back to the very tree it was written from: a clause the deparser would
drop or change is a problem of the file, never a silent change. Names fedload adds (the feeder key, the table in
ALTER TABLE and CREATE INDEX) come from small statements fedload writes with quoted identifiers and parses."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError
from pglast.stream import RawStream

from fedload.superhub.schema import ident, qualified
from fedload.superhub.schema_file.model import Placed, Problem, SchemaFile, Table, names
from fedload.superhub.schema_file.needs import clauses, extensions_used, sequences_used, types_used

__all__ = ["Step", "plan_tables", "superhub_problems", "table_steps"]

C = enums.ConstrType


@dataclass(frozen=True, slots=True)
class Step:
    """One statement to run, the line of the file it comes from (0: none) and what it creates."""

    line: int
    what: str
    sql: str


class UnfaithfulError(Exception):
    """pglast's deparser writes a statement that does not parse back to the tree it was given."""


def render(node: ast.Node) -> str:
    """The statement for `node`, checked to parse back to the same tree."""
    sql = RawStream()(node)
    try:
        back = parse_sql(sql)
    except ParseError:
        back = ()
    if len(back) != 1 or back[0].stmt != node:
        raise UnfaithfulError(sql)
    return sql


def _parse(sql: str) -> ast.Node:
    """A statement fedload writes itself (names quoted by `ident`), as a tree to complete."""
    statement = parse_sql(sql)[0].stmt
    assert statement is not None
    return statement


def table_steps(sf: SchemaFile, table: Table, feeder_key: str, key_type: str) -> list[Step]:
    """The statements for one parent; a statement that cannot be written back as read is a problem of `sf`."""
    try:
        steps = _table_steps(table, feeder_key, key_type)
    except UnfaithfulError as exc:
        message = f"table {table.label} cannot be written back as the file has it (pglast wrote {str(exc)[:200]!r})"
        sf.problems.append(Problem(table.line, message, table.key))
        return []
    table.extensions = extensions_used(sf, table, gist_key=any(_gist(c.node) for c in _constraints(table)))
    return steps


def _constraints(table: Table) -> list[Placed[ast.Constraint]]:
    return [*table.constraints, *table.added]


def _gist(constraint: ast.Constraint) -> bool:
    """Does the feeder key join a GiST index (exclusion or WITHOUT OVERLAPS), which needs btree_gist for it?"""
    exclusion = constraint.contype == C.CONSTR_EXCLUSION and constraint.access_method in (None, "gist")
    return exclusion or bool(constraint.contype in (C.CONSTR_PRIMARY, C.CONSTR_UNIQUE) and constraint.without_overlaps)


def _table_steps(table: Table, feeder_key: str, key_type: str) -> list[Step]:
    what, name = f"table {table.label}", qualified(table.schema, table.name)
    key = ident(feeder_key)
    create = _parse(f"CREATE TABLE {name} ({key} {key_type} NOT NULL) PARTITION BY LIST ({key})")
    assert isinstance(create, ast.CreateStmt)
    key_column = () if table.column(feeder_key) else create.tableElts or ()
    columns = tuple(c.node for c in table.columns)
    create.tableElts = (*key_column, *columns, *(_widened(c.node, feeder_key) for c in table.constraints))
    steps = [Step(table.line, what, render(create))]
    for placed in table.added:
        alter = _parse(f"ALTER TABLE {name} ADD CHECK (true)")
        assert isinstance(alter, ast.AlterTableStmt)
        assert alter.cmds
        assert isinstance(alter.cmds[0], ast.AlterTableCmd)
        alter.cmds[0].def_ = _widened(placed.node, feeder_key)
        steps.append(Step(placed.line, what, render(alter)))
    for index in table.indexes:
        built = _index(index.node, create.relation, feeder_key)
        steps.append(Step(index.line, f"index {index.node.idxname} of {what}", render(built)))
    return steps


def _key_element(feeder_key: str) -> ast.IndexElem:
    index = _parse(f"CREATE INDEX ON t ({ident(feeder_key)})")
    assert isinstance(index, ast.IndexStmt)
    assert index.indexParams
    element = index.indexParams[0]
    assert isinstance(element, ast.IndexElem)
    return element


def _widened(constraint: ast.Constraint, feeder_key: str) -> ast.Constraint:
    """A key or exclusion constraint with the feeder key first (partitioning demands it); others as they are."""
    if constraint.contype in (C.CONSTR_PRIMARY, C.CONSTR_UNIQUE):
        widened = copy.deepcopy(constraint)
        others = [k for k in constraint.keys or () if not (isinstance(k, ast.String) and k.sval == feeder_key)]
        widened.keys = (ast.String(sval=feeder_key), *others)
        return widened
    if constraint.contype == C.CONSTR_EXCLUSION:
        keyed = [e for e, op in constraint.exclusions or () if e.name == feeder_key and names(op)[1] == "="]
        if keyed:
            return constraint
        widened = copy.deepcopy(constraint)
        widened.exclusions = ((_key_element(feeder_key), (ast.String(sval="="),)), *(constraint.exclusions or ()))
        return widened
    return constraint


def _index(index: ast.IndexStmt, relation: ast.RangeVar | None, feeder_key: str) -> ast.IndexStmt:
    """The file's index on the parent; a unique one leads with the feeder key. Storage parameters, tablespace and
    CONCURRENTLY are the superhub's business."""
    built = copy.deepcopy(index)
    built.relation = copy.deepcopy(relation)
    built.tableSpace = built.options = None
    built.concurrent = built.if_not_exists = False
    plain = {e.name for e in index.indexParams or () if isinstance(e, ast.IndexElem) and e.name}
    if index.unique and feeder_key not in plain:
        built.indexParams = (_key_element(feeder_key), *(built.indexParams or ()))
    return built


# ---------------------------------------------------------------------------------------------------- planning


def superhub_problems(sf: SchemaFile, tables: list[Table], major: int, extensions: dict[str, bool]) -> list[str]:
    """Why the superhub cannot hold `tables` as the file has them: a clause its PostgreSQL lacks, an extension it
    does not have. One sentence each, naming the line."""
    found = []
    for table in tables:
        for clause, needs, line in clauses(table):
            if major < needs:
                found.append(
                    f"{sf.where(line)}: {clause} of table {table.label} needs PostgreSQL {needs} or later; "
                    f"the superhub runs PostgreSQL {major}"
                )
        for name in table.extensions:
            if name not in extensions:
                line = sf.extensions[name].line if name in sf.extensions else table.line
                found.append(
                    f"{sf.where(line)}: table {table.label} needs extension {name}, which the superhub does not "
                    "have (it is not in pg_available_extensions)"
                )
    return found


def plan_tables(
    sf: SchemaFile,
    tables: list[Table],
    steps: dict[tuple[str, str], list[Step]],
    types: set[tuple[str, str]],
    installed: dict[str, bool],
) -> list[Step]:
    """Every statement that creates `tables` with the extensions, types and sequences they need, in order."""
    needed = [e for e in dict.fromkeys(e for t in tables for e in t.extensions) if not installed.get(e)]
    used = types_used(sf, tables) - types
    enums_ = [e for e in sf.enums if names(e.node.typeName) in used]
    domains = [d for d in sf.domains if names(d.node.domainname) in used]
    sequences = {s: sf.sequences[s] for t in tables for s in sequences_used(t) if s in sf.sequences}
    schemas = {names(e.node.typeName)[0] for e in enums_} | {names(d.node.domainname)[0] for d in domains}
    schemas |= {s for s, _ in sequences} | {t.schema for t in tables}
    schemas |= {x.schema for e in needed if (x := sf.extensions.get(e)) is not None and x.schema}
    plan = [Step(0, f"schema {s}", render(_parse(f"CREATE SCHEMA IF NOT EXISTS {ident(s)}"))) for s in sorted(schemas)]
    plan += [_extension_step(sf, name) for name in needed]
    plan += [Step(e.line, f"enum {'.'.join(names(e.node.typeName))}", render(e.node)) for e in enums_]
    plan += [Step(d.line, f"domain {'.'.join(names(d.node.domainname))}", render(d.node)) for d in domains]
    plan += [Step(s.line, f"sequence {'.'.join(key)}", render(_sequence(s.node))) for key, s in sequences.items()]
    for table in tables:
        plan += steps[table.key]
    return plan


def _extension_step(sf: SchemaFile, name: str) -> Step:
    found = sf.extensions.get(name)
    node = copy.deepcopy(found.node) if found else _parse(f"CREATE EXTENSION IF NOT EXISTS {ident(name)}")
    assert isinstance(node, ast.CreateExtensionStmt)
    node.if_not_exists = True
    return Step(found.line if found else 0, f"extension {name}", render(node))


def _sequence(sequence: ast.CreateSeqStmt) -> ast.CreateSeqStmt:
    built = copy.deepcopy(sequence)
    built.if_not_exists = True
    options = tuple(o for o in sequence.options or () if not (isinstance(o, ast.DefElem) and o.defname == "owned_by"))
    built.options = options or None
    return built
