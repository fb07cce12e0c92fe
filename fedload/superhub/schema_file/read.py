"""Reading a schema file with PostgreSQL's grammar (pglast): each statement's tree goes into the model, or is
listed as left out. Nothing here builds SQL."""

from __future__ import annotations

import copy
import re

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError

from fedload.names import DEFAULT_SCHEMA
from fedload.superhub.schema_file.model import Extension, LeftOut, Placed, Problem, SchemaFile, Table, names
from fedload.superhub.schema_file.needs import check_types
from transforms import DumpSplitter, DumpSyntaxError, MetaCommand, Statement

__all__ = ["read_statements"]

C = enums.ConstrType
AT = enums.AlterTableType


class BadStatementError(Exception):
    """A statement fedload must read does not have a shape it can keep (message without the place)."""


def read_statements(sf: SchemaFile, data: bytes) -> None:
    """Read every statement of the file into `sf`, then check the types and sequences the tables use."""
    splitter = DumpSplitter()
    try:
        items = [*splitter.feed(data), *splitter.close()]
    except DumpSyntaxError as exc:
        sf.problems.append(Problem(exc.line, str(exc).split(": ", 1)[-1]))
        return
    for item in items:
        if isinstance(item, Statement):
            _read_text(sf, item.text.decode("utf-8", errors="replace"), item.line)
        elif isinstance(item, MetaCommand):
            if not re.match(rb"\\(un)?restrict\b", item.text):
                sf.left_out.append(LeftOut("psql command", item.text.decode(errors="replace").strip(), item.line))
        elif hasattr(item, "line"):
            sf.left_out.append(LeftOut("data", "INSERT or COPY", item.line))
            sf.problems.append(Problem(item.line, "data (INSERT or COPY) is not a schema definition", fatal=False))
    check_types(sf)


def _line_at(text: str, first_line: int, offset: int | None) -> int:
    return first_line + text.count("\n", 0, max(offset or 0, 0))


def _read_text(sf: SchemaFile, text: str, first_line: int) -> None:
    try:
        statements = parse_sql(text)
    except ParseError as exc:
        offset = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], int) else 0
        message = str(exc.args[0]) if exc.args else str(exc)
        sf.problems.append(Problem(_line_at(text, first_line, offset), f"{message} (in {_snippet(text)!r})"))
        return
    for raw in statements:
        line = _line_at(text, first_line, raw.stmt_location)
        try:
            _read_node(sf, raw.stmt, line, text, first_line)
        except BadStatementError as exc:
            sf.problems.append(Problem(line, f"{exc} (in {_snippet(text)!r})"))


def _snippet(text: str) -> str:
    return " ".join(line for line in text.splitlines() if not line.lstrip().startswith("--")).strip()[:60]


def _read_node(sf: SchemaFile, node: ast.Node | None, line: int, text: str, first_line: int) -> None:
    if isinstance(node, ast.VariableSetStmt | ast.CreateSchemaStmt) or _is_set_config(node):
        return  # pg_dump's session settings; schemas are created as needed
    if isinstance(node, ast.CreateStmt) and not isinstance(node, ast.CreateForeignTableStmt):
        _read_table(sf, node, line, text, first_line)
    elif isinstance(node, ast.AlterTableStmt):
        _read_alter_table(sf, node, line)
    elif isinstance(node, ast.IndexStmt):
        _read_index(sf, node, line)
    elif isinstance(node, ast.CreateSeqStmt):
        sf.sequences[_relation(node.sequence)] = Placed(node, line)
    elif isinstance(node, ast.CreateEnumStmt):
        sf.enums.append(Placed(node, line))
    elif isinstance(node, ast.CreateDomainStmt):
        sf.domains.append(Placed(node, line))
    elif isinstance(node, ast.CreateExtensionStmt):
        _read_extension(sf, node, line)
    elif isinstance(node, ast.AlterSeqStmt) and _only_owned_by(node):
        return  # ties a sequence to its column: irrelevant on the superhub
    else:
        _left_out_statement(sf, node, line, text)


def _is_set_config(node: ast.Node | None) -> bool:
    if not isinstance(node, ast.SelectStmt) or len(node.targetList or ()) != 1 or node.fromClause:
        return False
    target = node.targetList[0] if node.targetList else None
    call = target.val if isinstance(target, ast.ResTarget) else None
    return isinstance(call, ast.FuncCall) and names(call.funcname) == ("pg_catalog", "set_config")


def _only_owned_by(node: ast.AlterSeqStmt) -> bool:
    return all(isinstance(o, ast.DefElem) and o.defname == "owned_by" for o in node.options or ())


def _relation(rangevar: ast.RangeVar | None) -> tuple[str, str]:
    if rangevar is None or rangevar.relname is None:
        raise BadStatementError("a relation name is missing")
    return rangevar.schemaname or DEFAULT_SCHEMA, rangevar.relname


def _read_extension(sf: SchemaFile, node: ast.CreateExtensionStmt, line: int) -> None:
    schema = None
    for option in node.options or ():
        if isinstance(option, ast.DefElem) and option.defname == "schema" and isinstance(option.arg, ast.String):
            schema = option.arg.sval
    sf.extensions[node.extname or "?"] = Extension(node, line, schema)


# ------------------------------------------------------------------------------------------------------- tables


def _read_table(sf: SchemaFile, node: ast.CreateStmt, line: int, text: str, first_line: int) -> None:
    key = _relation(node.relation)
    label = ".".join(key)
    if node.partbound is not None:
        sf.others[key] = "partition"
        sf.left_out.append(LeftOut("partition", label, line))
        return
    table = Table(*key, line)
    for element in node.tableElts or ():
        where = _line_at(text, first_line, getattr(element, "location", None))
        if isinstance(element, ast.ColumnDef):
            _read_column(sf, table, element, where)
        elif isinstance(element, ast.Constraint):
            _read_constraint(sf, table, element, where, added=False)
        else:
            raise BadStatementError("CREATE TABLE ... (LIKE ...) is not supported")
    for parent in node.inhRelations or ():
        if isinstance(parent, ast.RangeVar):
            sf.left_out.append(LeftOut("inheritance", f"{label} from {'.'.join(_relation(parent))}", line))
    sf.tables[key] = table  # what follows the columns (PARTITION BY, WITH, TABLESPACE...) is fedload's business


_KEYS = (C.CONSTR_PRIMARY, C.CONSTR_UNIQUE)
_ATTRIBUTES = {
    C.CONSTR_ATTR_DEFERRABLE: ("deferrable", True),
    C.CONSTR_ATTR_NOT_DEFERRABLE: ("deferrable", False),
    C.CONSTR_ATTR_DEFERRED: ("initdeferred", True),
    C.CONSTR_ATTR_IMMEDIATE: ("initdeferred", False),
}


_ATTRIBUTE_KINDS = (*_ATTRIBUTES, C.CONSTR_ATTR_ENFORCED, C.CONSTR_ATTR_NOT_ENFORCED)


def _read_column(sf: SchemaFile, table: Table, column: ast.ColumnDef, line: int) -> None:
    """A column; its keys become table constraints, its foreign key is left out.
    A clause such as DEFERRABLE or NOT ENFORCED belongs to the constraint before it and goes where that one goes."""
    kept: list[ast.Node] = []
    last: ast.Constraint | None = None  # the constraint the next attribute clause belongs to, if kept in the column
    for constraint in column.constraints or ():
        assert isinstance(constraint, ast.Constraint)
        if constraint.contype in _ATTRIBUTE_KINDS:
            if last is not None and last.contype in _KEYS and constraint.contype in _ATTRIBUTES:
                setattr(last, *_ATTRIBUTES[constraint.contype])
            elif last is not None and last.contype not in _KEYS:
                kept.append(constraint)
            continue
        last = None
        if constraint.contype in _KEYS:
            last = copy.deepcopy(constraint)
            last.keys = (ast.String(sval=column.colname),)
            table.constraints.append(Placed(last, line))
        elif constraint.contype == C.CONSTR_FOREIGN:
            what = f"{constraint.conname or (column.colname or '?') + ' REFERENCES'} on {table.label}"
            sf.left_out.append(LeftOut("foreign key", what, line))
        else:
            kept.append(last := constraint)
    column.constraints = tuple(kept) or None
    table.columns.append(Placed(column, line))


def _read_constraint(sf: SchemaFile, table: Table, constraint: ast.Constraint, line: int, *, added: bool) -> None:
    if constraint.contype == C.CONSTR_FOREIGN:
        what = f"{constraint.conname or 'unnamed'} on {table.label}"
        sf.left_out.append(LeftOut("foreign key", what, line))
    elif constraint.contype in (*_KEYS, C.CONSTR_EXCLUSION, C.CONSTR_CHECK, C.CONSTR_NOTNULL):
        (table.added if added else table.constraints).append(Placed(constraint, line))
    else:
        raise BadStatementError(f"a table constraint of kind {constraint.contype} is not one fedload reads")


def _column_clauses(sql: str) -> tuple[ast.Node, ...]:
    """Column clauses fedload writes itself (a default, NOT NULL), as the grammar reads them."""
    statement = parse_sql(f"CREATE TABLE t (c int {sql})")[0].stmt
    assert isinstance(statement, ast.CreateStmt)
    assert statement.tableElts
    column = statement.tableElts[0]
    assert isinstance(column, ast.ColumnDef)
    assert column.constraints
    return column.constraints


def _read_index(sf: SchemaFile, node: ast.IndexStmt, line: int) -> None:
    key = _relation(node.relation)
    table = sf.tables.get(key)
    if table is not None:
        table.indexes.append(Placed(node, line))
    elif key in sf.others:
        sf.left_out.append(LeftOut("index", f"{node.idxname} on {sf.others[key]} {'.'.join(key)}", line))
    else:
        raise BadStatementError(f"table {'.'.join(key)} is not created earlier in the file")


_OBJECT_KINDS = {
    enums.ObjectType.OBJECT_VIEW: "view",
    enums.ObjectType.OBJECT_MATVIEW: "materialized view",
    enums.ObjectType.OBJECT_SEQUENCE: "sequence",
    enums.ObjectType.OBJECT_FOREIGN_TABLE: "foreign table",
    enums.ObjectType.OBJECT_INDEX: "index",
    enums.ObjectType.OBJECT_TYPE: "type",
}


_SETTINGS = {AT.AT_ChangeOwner: "owner", AT.AT_ColumnDefault: "column default"}


def _read_alter_table(sf: SchemaFile, node: ast.AlterTableStmt, line: int) -> None:
    key = _relation(node.relation)
    table = sf.tables.get(key) if node.objtype == enums.ObjectType.OBJECT_TABLE else None
    if table is None:
        kind = sf.others.get(key) or (_OBJECT_KINDS.get(node.objtype) if node.objtype is not None else None)
        kind = kind or ("sequence" if key in sf.sequences else None)
        owner_only = all(getattr(cmd, "subtype", None) == AT.AT_ChangeOwner for cmd in node.cmds or ())
        kind = kind or ("relation" if owner_only else None)
        if kind is None:
            raise BadStatementError(f"table {'.'.join(key)} is not created earlier in the file")
        for cmd in node.cmds or ():
            what = _SETTINGS.get(getattr(cmd, "subtype", None), f"{kind} setting")  # type: ignore[arg-type]
            sf.left_out.append(LeftOut(what, f"{kind} {'.'.join(key)}", line))
        return
    for cmd in node.cmds or ():
        if isinstance(cmd, ast.AlterTableCmd):
            _alter_table_command(sf, table, cmd, line)


def _alter_table_command(sf: SchemaFile, table: Table, cmd: ast.AlterTableCmd, line: int) -> None:
    if cmd.subtype == AT.AT_AddConstraint and isinstance(cmd.def_, ast.Constraint):
        _read_constraint(sf, table, cmd.def_, line, added=True)
        return
    if cmd.subtype == AT.AT_ChangeOwner:
        sf.left_out.append(LeftOut("owner", f"table {table.label}", line))
        return
    if cmd.subtype not in (AT.AT_ColumnDefault, AT.AT_AddIdentity, AT.AT_SetNotNull):
        setting = cmd.subtype.name.removeprefix("AT_") if cmd.subtype else "?"
        sf.left_out.append(LeftOut("table setting", f"{table.label} {setting}", line))
        return
    column = table.column(cmd.name or "")
    if column is None:
        raise BadStatementError(f"table {table.label} has no column {cmd.name}")
    others = tuple(c for c in column.constraints or () if getattr(c, "contype", None) != C.CONSTR_DEFAULT)
    if cmd.subtype == AT.AT_ColumnDefault:
        default = _column_clauses("DEFAULT 0")
        if isinstance(default[0], ast.Constraint) and isinstance(cmd.def_, ast.Node):
            default[0].raw_expr = cmd.def_
        column.constraints = (*others, *(default if cmd.def_ is not None else ()))
    elif cmd.subtype == AT.AT_AddIdentity and isinstance(cmd.def_, ast.Constraint):
        column.constraints = (*(column.constraints or ()), cmd.def_)
    else:
        column.constraints = (*(column.constraints or ()), *_column_clauses("NOT NULL"))


# ----------------------------------------------------------------------------------------------- left out


def _left_out_statement(sf: SchemaFile, node: ast.Node | None, line: int, text: str) -> None:
    """A statement fedload does not carry over; one that pg_dump would not write is also a (non-fatal) problem."""
    kind, name = _kind_and_name(node, text)
    sf.left_out.append(LeftOut(kind, name, line))
    relation = getattr(node, "view", None) or getattr(getattr(node, "into", None), "rel", None)
    if isinstance(relation, ast.RangeVar):
        sf.others[_relation(relation)] = kind
    if isinstance(node, ast.CreateFunctionStmt):
        sf.others[names(node.funcname)] = kind
    if not _is_definition(node):
        word = (text.split(None, 1) or ["?"])[0].upper()
        sf.problems.append(Problem(line, f"{word} is not a schema definition; fedload leaves it out", fatal=False))


_DEFINITIONS = ("Create", "Alter", "Define", "Comment", "Grant", "Rule", "SecLabel", "CompositeType")
_KINDS = {
    "CreateTrigStmt": "trigger",
    "CreateEventTrigStmt": "event trigger",
    "RuleStmt": "rule",
    "CreatePolicyStmt": "policy",
    "CreateFunctionStmt": "function",
    "CreateTableAsStmt": "materialized view",
    "ViewStmt": "view",
    "CommentStmt": "comment",
    "AlterOwnerStmt": "owner",
    "CompositeTypeStmt": "type",
    "CreateRangeStmt": "type",
    "DefineStmt": "definition",
    "CreateStatsStmt": "statistics",
    "CreatePublicationStmt": "publication",
    "AlterPublicationStmt": "publication",
}


def _is_definition(node: ast.Node | None) -> bool:
    return (node is not None and type(node).__name__.startswith(_DEFINITIONS)) or isinstance(node, ast.ViewStmt)


def _kind_and_name(node: ast.Node | None, text: str) -> tuple[str, str]:
    cls = type(node).__name__
    if isinstance(node, ast.GrantStmt):
        kind = "grant" if node.is_grant else "revoke"
    elif isinstance(node, ast.CreateFunctionStmt) and node.is_procedure:
        kind = "procedure"
    else:
        kind = _KINDS.get(cls) or re.sub(r"(?<!^)([A-Z])", r" \1", cls.removesuffix("Stmt")).lower()
        kind = kind.removeprefix("create ").removeprefix("alter ") if _is_definition(node) else kind + " statement"
    return kind, _name(node, text)


def _name(node: ast.Node | None, text: str) -> str:
    """What a left-out statement is about, for the warning."""
    if (relation := _about_relation(node)) is not None:
        return relation
    if isinstance(node, ast.CreateFunctionStmt):
        return ".".join(names(node.funcname))
    if isinstance(node, ast.CreatePublicationStmt | ast.AlterPublicationStmt):
        return node.pubname or "?"
    rest = _words(text)[1]
    if isinstance(node, ast.CommentStmt):
        return rest.split(" IS ", 1)[0].removeprefix("ON ")
    return rest.split(" OWNER TO ", 1)[0] if isinstance(node, ast.AlterOwnerStmt) else rest[:80]


def _about_relation(node: ast.Node | None) -> str | None:
    """`name on schema.table` for a trigger, rule or policy; `schema.name` for a view; None otherwise."""
    for attr in ("view", "relation", "into", "table"):
        value = getattr(node, attr, None)
        value = getattr(value, "rel", value)
        if isinstance(value, ast.RangeVar) and value.relname:
            where = ".".join(_relation(value))
            named = getattr(node, "trigname", None) or getattr(node, "rulename", None)
            named = named or getattr(node, "policy_name", None)
            return f"{named} on {where}" if named else where
    return None


def _words(text: str) -> list[str]:
    """The statement's first word and the rest, comments dropped and whitespace collapsed."""
    flat = " ".join(line for line in text.splitlines() if not line.lstrip().startswith("--")).strip().rstrip(";")
    return [*" ".join(flat.split()).split(" ", 1), ""][:2]
