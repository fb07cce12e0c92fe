"""What a table of the schema file needs: types and sequences the file defines or PostgreSQL has built in, the
extensions that provide the rest (operator classes, types, functions, operators), and the PostgreSQL version its
clauses need."""

from __future__ import annotations

from collections.abc import Iterator

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError

from fedload.names import DEFAULT_SCHEMA
from fedload.superhub.schema_file.model import Problem, SchemaFile, Table, names

__all__ = ["check_types", "clauses", "extensions_used", "sequences_used", "types_used", "walk"]

C = enums.ConstrType

BUILTIN_TYPES = frozenset(
    [
        "bigint",
        "bigserial",
        "bit",
        "bool",
        "boolean",
        "box",
        "bpchar",
        "bytea",
        "char",
        "character",
        "cidr",
        "circle",
        "date",
        "datemultirange",
        "daterange",
        "decimal",
        "double",
        "float",
        "float4",
        "float8",
        "gtsvector",
        "inet",
        "int",
        "int2",
        "int4",
        "int4multirange",
        "int4range",
        "int8",
        "int8multirange",
        "int8range",
        "integer",
        "interval",
        "json",
        "jsonb",
        "jsonpath",
        "line",
        "lseg",
        "macaddr",
        "macaddr8",
        "money",
        "name",
        "numeric",
        "nummultirange",
        "numrange",
        "oid",
        "path",
        "pg_lsn",
        "pg_snapshot",
        "point",
        "polygon",
        "real",
        "regclass",
        "regcollation",
        "regconfig",
        "regdictionary",
        "regnamespace",
        "regoper",
        "regoperator",
        "regproc",
        "regprocedure",
        "regrole",
        "regtype",
        "serial",
        "serial2",
        "serial4",
        "serial8",
        "smallint",
        "smallserial",
        "text",
        "tid",
        "time",
        "timestamp",
        "timestamptz",
        "timetz",
        "tsmultirange",
        "tsquery",
        "tsrange",
        "tstzmultirange",
        "tstzrange",
        "tsvector",
        "txid_snapshot",
        "uuid",
        "varbit",
        "varchar",
        "xid",
        "xid8",
        "xml",
    ]
)
_SYSTEM_SCHEMAS = frozenset(["pg_catalog", "information_schema"])

# Names that tell which of several extensions in one schema provides an object (types, operator classes, functions).
_MEMBERS = {
    "pg_trgm": ("gin_trgm_ops", "gist_trgm_ops", "similarity", "word_similarity", "strict_word_similarity"),
    "btree_gist": ("gist_", "gbt", "gbtreekey"),
    "citext": ("citext",),
    "hstore": ("hstore", "gin_hstore_ops", "gist_hstore_ops", "btree_hstore_ops", "hash_hstore_ops"),
    "ltree": ("ltree", "lquery", "ltxtquery", "gist_ltree_ops"),
    "cube": ("cube",),
    "isn": ("isbn", "isbn13", "ean13", "ismn", "ismn13", "issn", "issn13", "upc"),
    "intarray": ("gin__int_ops", "gist__int_ops", "gist__intbig_ops"),
    "uuid-ossp": ("uuid_generate_", "uuid_nil", "uuid_ns_"),
    "pgcrypto": ("crypt", "gen_salt", "digest", "hmac", "gen_random_bytes", "pgp_"),
    "postgis": ("geometry", "geography", "box2d", "box3d", "st_"),
    "unaccent": ("unaccent",),
}


def walk(value: object) -> Iterator[ast.Node]:
    """Every node in `value` (a node or a tuple of them), depth first."""
    if isinstance(value, ast.Node):
        yield value
        for attribute in value:
            yield from walk(getattr(value, attribute))
    elif isinstance(value, tuple):
        for item in value:
            yield from walk(item)


def _table_nodes(table: Table) -> Iterator[ast.Node]:
    for column in table.columns:
        yield from walk(column.node)
    for constraint in [*table.constraints, *table.added]:
        yield from walk(constraint.node)
    for index in table.indexes:
        yield from walk(index.node)


def check_types(sf: SchemaFile) -> None:
    """Problems for types that are neither built in, defined by the file, nor possibly an extension's; sequences
    that defaults use but the file does not create. An unqualified type the file defines is qualified."""
    types = sf.types()
    for domain in sf.domains:
        if (problem := _type_problem(sf, domain.node.typeName, types)) is not None:
            sf.problems.append(Problem(domain.line, f"domain {'.'.join(names(domain.node.domainname))} {problem}"))
    for table in sf.tables.values():
        for column in table.columns:
            type_name = column.node.typeName
            if (problem := _type_problem(sf, type_name, types)) is not None:
                message = f"column {column.node.colname} of table {table.label} {problem}"
                sf.problems.append(Problem(column.line, message, table.key))
            elif type_name is not None and len(type_name.names or ()) == 1 and names(type_name.names) in types:
                type_name.names = (ast.String(sval=DEFAULT_SCHEMA), *(type_name.names or ()))
        for schema, name in sequences_used(table):
            if (schema, name) not in sf.sequences:
                message = f"table {table.label} uses sequence {schema}.{name}, which the file does not create"
                sf.problems.append(Problem(table.line, message, table.key))


def _type_problem(sf: SchemaFile, type_name: ast.TypeName | None, types: set[tuple[str, str]]) -> str | None:
    parts = [p.sval for p in (type_name.names if type_name else None) or () if isinstance(p, ast.String)]
    if not parts or parts[0] == "pg_catalog" or (len(parts) == 1 and parts[0] in BUILTIN_TYPES):
        return None
    schema, name = names(type_name.names if type_name else None)
    if (schema, name) in types or _extension_schemas(sf) & {schema}:
        return None
    shown = ".".join(str(p) for p in parts)
    return f"uses type {shown}, which the file does not define (as an enum or domain or with an extension)"


def _extension_schemas(sf: SchemaFile) -> set[str]:
    return {e.schema or DEFAULT_SCHEMA for e in sf.extensions.values()}


def sequences_used(table: Table) -> Iterator[tuple[str, str]]:
    """The sequences `nextval('...')` in the table's defaults names."""
    for column in table.columns:
        for node in walk(column.node.constraints):
            if isinstance(node, ast.FuncCall) and names(node.funcname)[1] == "nextval" and node.args:
                argument = node.args[0]
                argument = argument.arg if isinstance(argument, ast.TypeCast) else argument
                value = argument.val if isinstance(argument, ast.A_Const) else None
                literal = value.sval if isinstance(value, ast.String) else None
                if literal is not None and (found := _sequence_name(literal)) is not None:
                    yield found


def _sequence_name(text: str) -> tuple[str, str] | None:
    """A regclass literal's (schema, name), read by the grammar (the text is never run)."""
    try:
        statement = parse_sql(f"SELECT FROM {text}")[0].stmt
    except (ParseError, IndexError):
        return None
    source = statement.fromClause[0] if isinstance(statement, ast.SelectStmt) and statement.fromClause else None
    if not isinstance(source, ast.RangeVar) or source.relname is None:
        return None
    return source.schemaname or DEFAULT_SCHEMA, source.relname


# ------------------------------------------------------------------------------------------------- extensions


def types_used(sf: SchemaFile, tables: list[Table]) -> set[tuple[str, str]]:
    """The file's enums and domains the tables use, and those the domains they use are based on."""
    domains = {names(d.node.domainname): d.node for d in sf.domains}
    found: set[tuple[str, str]] = set()
    pending = [node for table in tables for node in _table_nodes(table)]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.TypeName) and (used := names(node.names)) not in found and used in sf.types():
            found.add(used)
            pending.extend(walk(domains.get(used)))
    return found


def _references(sf: SchemaFile, table: Table) -> Iterator[tuple[str, str]]:
    """(schema, name) of the types, functions, operators and operator classes the table's definition names,
    including those of the domains it uses."""
    domains = [d.node for d in sf.domains if names(d.node.domainname) in types_used(sf, [table])]
    for node in [*_table_nodes(table), *walk(tuple(domains))]:
        if isinstance(node, ast.TypeName) and node.names:
            yield names(node.names) if len(node.names) > 1 else ("", names(node.names)[1])
        elif isinstance(node, ast.FuncCall) and node.funcname and len(node.funcname) > 1:
            yield names(node.funcname)
        elif isinstance(node, ast.IndexElem) and node.opclass and len(node.opclass) > 1:
            yield names(node.opclass)
        elif isinstance(node, ast.A_Expr) and isinstance(node.name, tuple) and len(node.name) > 1:
            yield names(node.name)
        elif isinstance(node, ast.Constraint) and node.contype == C.CONSTR_EXCLUSION:
            for _element, operator in node.exclusions or ():
                if isinstance(operator, tuple) and len(operator) > 1:
                    yield names(operator)


def extensions_used(sf: SchemaFile, table: Table, *, gist_key: bool) -> list[str]:
    """The file's extensions the table needs: those providing what it names in their schema (when several share
    a schema and the name does not tell which, all of them), and btree_gist when the feeder key joins a GiST
    constraint (`gist_key`)."""
    defined = sf.types() | set(sf.others) | set(sf.sequences)
    found: dict[str, None] = {"btree_gist": None} if gist_key else {}
    for schema, name in _references(sf, table):
        if schema in _SYSTEM_SCHEMAS or (schema or DEFAULT_SCHEMA, name) in defined:
            continue
        if not schema and name in BUILTIN_TYPES:
            continue
        candidates = [e for e, x in sf.extensions.items() if (x.schema or DEFAULT_SCHEMA) == (schema or DEFAULT_SCHEMA)]
        known = [e for e in candidates if name.startswith(_MEMBERS.get(e, ("\0",)))]
        found.update(dict.fromkeys(known or candidates))
    return list(found)


# --------------------------------------------------------------------------------------------------- versions


def clauses(table: Table) -> Iterator[tuple[str, int, int]]:
    """(clause, the PostgreSQL major that introduced it on a partitioned table, line) for each such clause."""
    for column in table.columns:
        for node in column.node.constraints or ():
            if isinstance(node, ast.Constraint):
                yield from _clause(node, column.line, f"column {column.node.colname}")
    for placed in [*table.constraints, *table.added]:
        if placed.node.contype == C.CONSTR_NOTNULL:
            yield f"NOT NULL as a table constraint ({placed.node.conname or '(unnamed)'})", 18, placed.line
        else:
            yield from _clause(placed.node, placed.line, f"constraint {placed.node.conname or '(unnamed)'}")


def _clause(node: ast.Constraint, line: int, where: str) -> Iterator[tuple[str, int, int]]:
    if node.contype == C.CONSTR_GENERATED and node.generated_kind == "v":
        yield f"VIRTUAL generated {where}", 18, line
    if node.contype == C.CONSTR_ATTR_NOT_ENFORCED or (node.contype == C.CONSTR_CHECK and not node.is_enforced):
        yield f"NOT ENFORCED ({where})", 18, line
    if node.contype == C.CONSTR_NOTNULL and node.conname:
        yield f"named NOT NULL constraint {node.conname} ({where})", 18, line
    if node.contype in (C.CONSTR_PRIMARY, C.CONSTR_UNIQUE) and node.without_overlaps:
        yield f"WITHOUT OVERLAPS ({where})", 18, line
    if node.contype == C.CONSTR_EXCLUSION:
        yield f"EXCLUDE on a partitioned table ({where})", 17, line
