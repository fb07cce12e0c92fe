"""The superhub's schema file: read a feeder's `pg_dump --schema-only` output and build partitioned parents from it.

The file is parsed, never run: every statement executed is built here, with names quoted through `ident()` /
`qualified()`. Expressions (defaults, CHECKs, generated columns, index elements and predicates) are kept as
written but rebuilt from lexed tokens (comments dropped, parentheses balanced) and wrapped in parentheses, so
they cannot leave their place in the statement. Created: enums, domains, the sequences that defaults use,
and each wanted table partitioned BY LIST on the feeder key, with its NOT NULLs, defaults, collations, generated
columns, CHECKs, primary key and unique constraints (widened by the key) and indexes. Everything else (foreign
keys, triggers, functions, views, grants, owners, comments...) is left out and listed in one warning.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from fedload.errors import ConfigError
from fedload.log import get_logger
from fedload.names import DEFAULT_SCHEMA
from fedload.schema import ident, key_literal, qualified
from transforms import DumpSplitter, DumpSyntaxError, MetaCommand, Statement

__all__ = ["SchemaFile", "check_schema_file", "create_parents_from_file", "read_schema_file"]

log = get_logger()

# ---------------------------------------------------------------------------------------------------------- lexing

_TOKEN = re.compile(
    r"""(?P<space>\s+|--[^\n]*|/\*.*?\*/)
    |(?P<string>[Ee]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*')
    |(?P<dollar>\$(?P<tag>[A-Za-z_][A-Za-z_0-9]*)?\$.*?\$(?P=tag)?\$)
    |(?P<quoted>"(?:[^"]|"")+")
    |(?P<word>[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_$\x80-\U0010ffff]*)
    |(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<param>\$\d+)
    |(?P<open>\()|(?P<close>\))
    |(?P<op>::|[,.;\[\]]|[-+*/<>=~!@\#%^&|`?]+)""",
    re.VERBOSE | re.DOTALL,
)


class _BadStatementError(Exception):
    """A statement fedload must read does not have the shape it expects (message without the place)."""


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # word | quoted | string | dollar | number | param | open | close | op
    text: str
    spaced: bool  # whitespace or a comment came before it

    @property
    def word(self) -> str:
        """The keyword this token may be, upper case; "" for anything but a plain word."""
        return self.text.upper() if self.kind == "word" else ""


def _lex(text: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos, spaced = 0, False
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise _BadStatementError(f"unexpected character {text[pos]!r}")
        kind = match.lastgroup if match.lastgroup != "tag" else "dollar"
        assert kind is not None
        if kind == "space":
            spaced = True
        else:
            tokens.append(_Tok(kind, match.group(), spaced))
            spaced = False
        pos = match.end()
    return tokens


def _text(tokens: list[_Tok]) -> str:
    """Tokens back as SQL text, comments gone, one space where the source had space; parentheses must balance."""
    depth = 0
    for token in tokens:
        depth += {"open": 1, "close": -1}.get(token.kind, 0)
        if depth < 0 or token.text == ";":
            raise _BadStatementError("an expression has unbalanced parentheses or a ';'")
    if depth:
        raise _BadStatementError("an expression has unbalanced parentheses")
    return "".join((" " if t.spaced and i else "") + t.text for i, t in enumerate(tokens))


def _expr(tokens: list[_Tok]) -> str:
    """An expression, parenthesised so that it stays one expression wherever it is put."""
    if not tokens:
        raise _BadStatementError("an expression is missing")
    return f"({_text(tokens)})"


def _name_of(token: _Tok) -> str:
    """An identifier's value as PostgreSQL stores it."""
    if token.kind == "quoted":
        return token.text[1:-1].replace('""', '"')
    if token.kind == "word":
        return token.text.lower()
    raise _BadStatementError(f"expected a name, found {token.text!r}")


class _Cursor:
    """Reads a statement's tokens front to back."""

    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens
        self.pos = 0

    def done(self) -> bool:
        return self.pos >= len(self.tokens)

    def peek(self, offset: int = 0) -> _Tok | None:
        index = self.pos + offset
        return self.tokens[index] if index < len(self.tokens) else None

    def at(self, *words: str) -> bool:
        return all((t := self.peek(i)) is not None and t.word == w for i, w in enumerate(words))

    def take(self, *words: str) -> bool:
        if self.at(*words):
            self.pos += len(words)
            return True
        return False

    def expect(self, *words: str) -> None:
        if not self.take(*words):
            found = self.peek()
            raise _BadStatementError(f"expected {' '.join(words)}, found {found.text if found else 'the end'!r}")

    def next(self) -> _Tok:
        token = self.peek()
        if token is None:
            raise _BadStatementError("the statement ends too early")
        self.pos += 1
        return token

    def name(self) -> str:
        return _name_of(self.next())

    def qualified(self) -> tuple[str, str]:
        """`schema.name`, or `name` in the default schema."""
        first = self.name()
        if (dot := self.peek()) is not None and dot.text == ".":
            self.pos += 1
            return first, self.name()
        return DEFAULT_SCHEMA, first

    def group(self) -> list[_Tok]:
        """The tokens inside the parentheses that come next."""
        if self.next().kind != "open":
            raise _BadStatementError("expected '('")
        start, depth = self.pos, 1
        while depth:
            depth += {"open": 1, "close": -1}.get(self.next().kind, 0)
        return self.tokens[start : self.pos - 1]

    def until(self, stop: frozenset[str]) -> list[_Tok]:
        """Tokens up to a stop keyword outside parentheses, or the end."""
        start, depth = self.pos, 0
        while (token := self.peek()) is not None and (depth or token.word not in stop):
            depth += {"open": 1, "close": -1}.get(token.kind, 0)
            self.pos += 1
        return self.tokens[start : self.pos]

    def rest(self) -> list[_Tok]:
        return self.until(frozenset())


def _split_commas(tokens: list[_Tok]) -> list[list[_Tok]]:
    parts: list[list[_Tok]] = [[]]
    depth = 0
    for token in tokens:
        depth += {"open": 1, "close": -1}.get(token.kind, 0)
        if token.text == "," and depth == 0:
            parts.append([])
        else:
            parts[-1].append(token)
    return parts if parts != [[]] else []


def _names(tokens: list[_Tok]) -> list[str]:
    names = []
    for part in _split_commas(tokens):
        if len(part) != 1:
            raise _BadStatementError("expected a list of column names")
        names.append(_name_of(part[0]))
    return names


# ----------------------------------------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class TypeRef:
    """A column or domain type: its name for the checks, its SQL rebuilt from validated pieces."""

    schema: str | None
    name: str
    base_sql: str
    suffix: str = ""  # modifiers, array brackets, "with time zone"...

    @property
    def sql(self) -> str:
        """The type in SQL."""
        return self.base_sql + self.suffix


@dataclass(slots=True)
class Enum:
    schema: str
    name: str
    labels: list[str]  # string literal tokens, as lexed
    line: int


@dataclass(slots=True)
class Domain:
    schema: str
    name: str
    type: TypeRef
    clauses: list[str]
    line: int


@dataclass(slots=True)
class Sequence:
    schema: str
    name: str
    options: list[str]
    line: int


@dataclass(slots=True)
class ColumnDef:
    name: str
    type: TypeRef
    collation: str | None = None
    default: str | None = None
    clauses: list[str] = field(default_factory=list)  # NOT NULL, CHECK, GENERATED, rebuilt

    def sql(self) -> str:
        """The column's definition in CREATE TABLE."""
        default = f"DEFAULT {self.default}" if self.default else None
        parts = [ident(self.name), self.type.sql, self.collation, default, *self.clauses]
        return " ".join(p for p in parts if p)


@dataclass(slots=True)
class Key:
    name: str | None
    primary: bool
    columns: list[str]
    include: list[str]
    nulls_not_distinct: bool


@dataclass(slots=True)
class Index:
    name: str
    unique: bool
    method: str
    elements: list[str]
    plain_columns: set[str]  # elements that are just a column name
    include: list[str]
    nulls_not_distinct: bool
    where: str | None
    line: int


@dataclass(slots=True)
class Table:
    schema: str
    name: str
    columns: list[ColumnDef]
    checks: list[str]
    keys: list[Key]
    line: int
    indexes: list[Index] = field(default_factory=list)

    def column(self, name: str) -> ColumnDef | None:
        return next((c for c in self.columns if c.name == name), None)


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
    enums: list[Enum] = field(default_factory=list)
    domains: list[Domain] = field(default_factory=list)
    sequences: dict[tuple[str, str], Sequence] = field(default_factory=dict)
    tables: dict[tuple[str, str], Table] = field(default_factory=dict)
    left_out: list[LeftOut] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def where(self, line: int) -> str:
        return f"{self.path.name}:{line}"


# ------------------------------------------------------------------------------------------------ types and parts

_TYPE_WORDS = frozenset(
    [
        "VARYING",
        "PRECISION",
        "WITH",
        "WITHOUT",
        "TIME",
        "ZONE",
        "YEAR",
        "MONTH",
        "DAY",
        "HOUR",
        "MINUTE",
        "SECOND",
        "TO",
    ]
)
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


def _type(cur: _Cursor) -> TypeRef:
    """A type name with modifiers and array brackets, rebuilt: user types quoted, built-in keywords as words."""
    first = cur.next()
    schema, name = None, _name_of(first)
    if (dot := cur.peek()) is not None and dot.text == ".":
        cur.pos += 1
        schema, first = name, cur.next()
        name = _name_of(first)
    if schema is not None:
        parts = [f"pg_catalog.{ident(name)}" if schema == "pg_catalog" else qualified(schema, name)]
    else:
        parts = [ident(name) if first.kind == "quoted" else name]
    while (token := cur.peek()) is not None:
        if token.word in _TYPE_WORDS:
            parts.append(" " + token.word.lower())
            cur.pos += 1
        elif token.kind == "open":
            parts.append(f"({', '.join(str(_int(part)) for part in _split_commas(cur.group()))})")
        elif token.text == "[":
            cur.pos += 1
            if (size := cur.peek()) is not None and size.kind == "number":
                cur.pos += 1
            if cur.next().text != "]":
                raise _BadStatementError("expected ']' in an array type")
            parts.append("[]")
        else:
            break
    return TypeRef(schema, name, parts[0], "".join(parts[1:]))


def _int(tokens: list[_Tok]) -> int:
    text = "".join(t.text for t in tokens)
    if not re.fullmatch(r"-?\d+", text):
        raise _BadStatementError(f"expected an integer, found {text!r}")
    return int(text)


def _take_int(cur: _Cursor) -> int:
    sign = [cur.next()] if (token := cur.peek()) is not None and token.text == "-" else []
    return _int([*sign, cur.next()])


def _collation(cur: _Cursor) -> str:
    schema_or_name = cur.next()
    if (dot := cur.peek()) is not None and dot.text == ".":
        cur.pos += 1
        return f"COLLATE {qualified(_name_of(schema_or_name), cur.name())}"
    return f"COLLATE {ident(_name_of(schema_or_name))}"


_SEQUENCE_WORDS = frozenset(
    ["AS", "START", "INCREMENT", "NO", "MINVALUE", "MAXVALUE", "CACHE", "CYCLE", "OWNED", "SEQUENCE"]
)


def _sequence_options(cur: _Cursor) -> tuple[tuple[str, str] | None, list[str]]:
    """CREATE SEQUENCE / identity options, rebuilt; the SEQUENCE NAME if given. OWNED BY is dropped."""
    name, options = None, []
    while not cur.done():
        if cur.take("SEQUENCE", "NAME"):
            name = cur.qualified()
        elif cur.take("AS"):
            options.append(f"AS {_type(cur).sql}")
        elif cur.take("START"):
            cur.take("WITH")
            options.append(f"START WITH {_take_int(cur)}")
        elif cur.take("INCREMENT"):
            cur.take("BY")
            options.append(f"INCREMENT BY {_take_int(cur)}")
        elif cur.at("NO") and (option := cur.peek(1)) is not None and option.word in ("MINVALUE", "MAXVALUE", "CYCLE"):
            cur.pos += 2
            options.append(f"NO {option.word}")
        elif (option := cur.peek()) is not None and option.word in ("MINVALUE", "MAXVALUE", "CACHE"):
            cur.pos += 1
            options.append(f"{option.word} {_take_int(cur)}")
        elif cur.take("CYCLE"):
            options.append("CYCLE")
        elif cur.take("OWNED", "BY"):
            cur.until(_SEQUENCE_WORDS)
        else:
            raise _BadStatementError(f"unexpected sequence option {cur.next().text!r}")
    return name, options


# ---------------------------------------------------------------------------------------------- table definitions

_COLUMN_WORDS = frozenset(
    ["CONSTRAINT", "NOT", "NULL", "DEFAULT", "COLLATE", "CHECK", "GENERATED", "PRIMARY", "UNIQUE", "REFERENCES"]
)
_TABLE_CONSTRAINT_WORDS = frozenset(["CONSTRAINT", "CHECK", "PRIMARY", "UNIQUE", "FOREIGN", "EXCLUDE"])


@dataclass(slots=True)
class _ColumnParts:
    """A column as read, with what belongs to the table: keys and an identity's sequence."""

    column: ColumnDef
    keys: list[Key] = field(default_factory=list)
    identity: tuple[tuple[str, str] | None, list[str]] | None = None
    left_out: list[str] = field(default_factory=list)


def _column(cur: _Cursor) -> _ColumnParts:
    parts = _ColumnParts(ColumnDef(cur.name(), _type(cur)))
    constraint: str | None = None
    while not cur.done():
        if cur.take("CONSTRAINT"):
            constraint = cur.name()
            continue
        _column_clause(cur, parts, constraint)
        constraint = None
    return parts


def _column_clause(cur: _Cursor, parts: _ColumnParts, constraint: str | None) -> None:
    column, named = parts.column, f"CONSTRAINT {ident(constraint)} " if constraint else ""
    if cur.take("NOT", "NULL"):
        column.clauses.append("NOT NULL")
    elif cur.take("NULL"):
        pass
    elif cur.take("DEFAULT"):
        column.default = _expr([cur.next(), *cur.until(_COLUMN_WORDS)])
    elif cur.take("COLLATE"):
        column.collation = _collation(cur)
    elif cur.take("CHECK"):
        column.clauses.append(f"{named}CHECK {_expr(cur.group())}")
        cur.take("NO", "INHERIT")
    elif cur.take("GENERATED"):
        _generated(cur, parts)
    elif cur.take("PRIMARY", "KEY") or cur.take("UNIQUE"):
        primary = cur.tokens[cur.pos - 1].word == "KEY"
        parts.keys.append(Key(constraint, primary, [column.name], [], False))
    elif cur.take("REFERENCES"):
        cur.until(_COLUMN_WORDS - {"NULL"})
        parts.left_out.append(constraint or f"{column.name} REFERENCES")
    else:
        raise _BadStatementError(f"unexpected {cur.next().text!r} in the definition of column {column.name}")


def _generated(cur: _Cursor, parts: _ColumnParts) -> None:
    if cur.take("ALWAYS", "AS", "IDENTITY") or cur.take("BY", "DEFAULT", "AS", "IDENTITY"):
        token = cur.peek()
        parts.identity = _sequence_options(_Cursor(cur.group())) if token and token.kind == "open" else (None, [])
        return
    cur.expect("ALWAYS", "AS")
    parts.column.clauses.append(f"GENERATED ALWAYS AS {_expr(cur.group())} STORED")
    cur.expect("STORED")


def _table_constraint(cur: _Cursor) -> Key | str | tuple[str, str]:
    """A key; a CHECK as its SQL; or ("kind", "name") for a constraint left out."""
    name = cur.name() if cur.take("CONSTRAINT") else None
    if cur.take("CHECK"):
        check = f"CHECK {_expr(cur.group())}"
        cur.take("NO", "INHERIT")
        cur.take("NOT", "VALID")
        return f"CONSTRAINT {ident(name)} {check}" if name else check
    if cur.take("PRIMARY", "KEY") or cur.take("UNIQUE"):
        primary = cur.tokens[cur.pos - 1].word == "KEY"
        nulls_not_distinct = cur.take("NULLS", "NOT", "DISTINCT")
        cur.take("NULLS", "DISTINCT")
        key = Key(name, primary, _names(cur.group()), [], nulls_not_distinct)
        if cur.take("INCLUDE"):
            key.include = _names(cur.group())
        _deferrable(cur)
        return key
    if cur.take("FOREIGN", "KEY"):
        cur.rest()
        return "foreign key", name or "unnamed"
    if cur.take("EXCLUDE"):
        cur.rest()
        return "exclusion constraint", name or "unnamed"
    raise _BadStatementError(f"unexpected {cur.next().text!r} in a table constraint")


def _deferrable(cur: _Cursor) -> None:
    cur.take("NOT", "DEFERRABLE")
    cur.take("DEFERRABLE")
    if cur.take("INITIALLY"):
        cur.next()
    if not cur.done():
        raise _BadStatementError(f"unexpected {cur.next().text!r} after a key")


# ------------------------------------------------------------------------------------------------------ statements

_CREATE_KINDS = (
    "OR REPLACE",
    "MATERIALIZED VIEW",
    "EVENT TRIGGER",
    "CONSTRAINT TRIGGER",
    "FOREIGN TABLE",
    "FOREIGN DATA WRAPPER",
    "USER MAPPING",
    "ACCESS METHOD",
    "OPERATOR CLASS",
    "OPERATOR FAMILY",
    "TEXT SEARCH CONFIGURATION",
    "TEXT SEARCH DICTIONARY",
    "TEXT SEARCH PARSER",
    "TEXT SEARCH TEMPLATE",
    "DEFAULT CONVERSION",
)
# Kinds of statement pg_dump --schema-only writes that fedload leaves out; anything else is worth a problem.
_DUMP_KINDS = frozenset(
    [
        "access method",
        "aggregate",
        "cast",
        "collation",
        "conversion",
        "default conversion",
        "event trigger",
        "extension",
        "foreign data wrapper",
        "foreign table",
        "function",
        "language",
        "materialized view",
        "operator",
        "operator class",
        "operator family",
        "policy",
        "procedure",
        "publication",
        "rule",
        "server",
        "statistics",
        "subscription",
        "text search configuration",
        "text search dictionary",
        "text search parser",
        "text search template",
        "transform",
        "trigger",
        "constraint trigger",
        "type",
        "user mapping",
        "view",
    ]
)


def _read_statement(sf: SchemaFile, text: str, line: int) -> None:
    tokens = _lex(text)
    cur = _Cursor(tokens[:-1] if tokens and tokens[-1].text == ";" else tokens)
    if cur.at("SET") or cur.at("CREATE", "SCHEMA") or _is_set_config(cur):
        return  # pg_dump's session settings; schemas are created as needed
    if cur.take("CREATE"):
        _read_create(sf, cur, line)
    elif cur.take("ALTER", "TABLE"):
        _read_alter_table(sf, cur, line)
    elif cur.at("ALTER", "SEQUENCE") and "OWNED BY" in " ".join(_words(cur.tokens)):
        return  # ties a sequence to its column: irrelevant on the superhub
    elif cur.at("ALTER") and _words(cur.tokens)[-3:-1] == ["OWNER", "TO"]:
        sf.left_out.append(LeftOut("owner", f"{cur.tokens[1].text.lower()} {_text(cur.tokens[2:-3])}", line))
    elif cur.at("COMMENT", "ON"):
        sf.left_out.append(LeftOut("comment", _text(cur.tokens[2:]).split(" IS ", 1)[0], line))
    elif cur.at("GRANT") or cur.at("REVOKE"):
        sf.left_out.append(LeftOut(cur.tokens[0].word.lower(), _text(cur.tokens[1:]), line))
    else:
        _left_out_statement(sf, cur, line)


def _words(tokens: list[_Tok]) -> list[str]:
    return [t.word for t in tokens]


def _is_set_config(cur: _Cursor) -> bool:
    return "".join(t.text for t in cur.tokens[:5]).lower() == "selectpg_catalog.set_config("


def _left_out_statement(sf: SchemaFile, cur: _Cursor, line: int) -> None:
    words = [w for w in _words(cur.tokens[:3]) if w]
    kind = f"{words[0]} {words[1]}" if words[:1] == ["ALTER"] and len(words) > 1 else (words or ["?"])[0]
    sf.left_out.append(LeftOut(kind.lower() + " statement", _text(cur.tokens)[:80], line))
    sf.problems.append(Problem(line, f"{kind} is not a schema definition; fedload leaves it out", fatal=False))


def _read_create(sf: SchemaFile, cur: _Cursor, line: int) -> None:
    cur.take("UNLOGGED")
    if cur.take("TABLE"):
        _read_table(sf, cur, line)
    elif cur.take("UNIQUE", "INDEX") or cur.take("INDEX"):
        _read_index(sf, cur, line, unique=cur.tokens[cur.pos - 2].word == "UNIQUE")
    elif cur.take("SEQUENCE"):
        cur.take("IF", "NOT", "EXISTS")
        schema, name = cur.qualified()
        sf.sequences[schema, name] = Sequence(schema, name, _sequence_options(cur)[1], line)
    elif cur.take("DOMAIN"):
        _read_domain(sf, cur, line)
    elif cur.take("TYPE") and _read_enum(sf, cur, line):
        return
    else:
        cur.pos = 1
        _left_out_create(sf, cur, line)


def _read_enum(sf: SchemaFile, cur: _Cursor, line: int) -> bool:
    """An enum type; False (having read some of it) for another kind of type."""
    schema, name = cur.qualified()
    if not cur.take("AS", "ENUM"):
        return False
    sf.enums.append(Enum(schema, name, [_label(part) for part in _split_commas(cur.group())], line))
    return True


def _label(tokens: list[_Tok]) -> str:
    if len(tokens) != 1 or tokens[0].kind != "string":
        raise _BadStatementError("an enum label is not a string literal")
    return tokens[0].text


def _left_out_create(sf: SchemaFile, cur: _Cursor, line: int) -> None:
    kind = []
    while True:
        step = next((k for k in _CREATE_KINDS if cur.at(*k.split())), None)
        if step is None:
            break
        if step != "OR REPLACE":
            kind.append(step)
        cur.take(*step.split())
    if not kind:
        kind.append(cur.next().word or "?")
    cur.take("IF", "NOT", "EXISTS")
    name = ".".join(cur.qualified()) if (t := cur.peek()) is not None and t.kind in ("word", "quoted") else "?"
    sf.left_out.append(LeftOut(kind[0].lower(), name, line))
    if kind[0].lower() not in _DUMP_KINDS:
        sf.problems.append(Problem(line, f"CREATE {kind[0]} is not a schema definition fedload reads", fatal=False))


def _read_domain(sf: SchemaFile, cur: _Cursor, line: int) -> None:
    schema, name = cur.qualified()
    cur.take("AS")
    domain = Domain(schema, name, _type(cur), [], line)
    constraint = ""
    while not cur.done():
        if cur.take("CONSTRAINT"):
            constraint = f"CONSTRAINT {ident(cur.name())} "
            continue
        if cur.take("COLLATE"):
            domain.clauses.append(_collation(cur))
        elif cur.take("DEFAULT"):
            domain.clauses.append(f"DEFAULT {_expr([cur.next(), *cur.until(_COLUMN_WORDS)])}")
        elif cur.take("NOT", "NULL"):
            domain.clauses.append(f"{constraint}NOT NULL")
        elif cur.take("NULL"):
            pass
        elif cur.take("CHECK"):
            domain.clauses.append(f"{constraint}CHECK {_expr(cur.group())}")
            cur.take("NOT", "VALID")
        else:
            raise _BadStatementError(f"unexpected {cur.next().text!r} in a domain")
        constraint = ""
    sf.domains.append(domain)


def _read_table(sf: SchemaFile, cur: _Cursor, line: int) -> None:
    cur.take("IF", "NOT", "EXISTS")
    schema, name = cur.qualified()
    if (token := cur.peek()) is None or token.kind != "open":
        sf.left_out.append(LeftOut("partition" if cur.at("PARTITION", "OF") else "table", f"{schema}.{name}", line))
        return
    table = Table(schema, name, [], [], [], line)
    for element in _split_commas(cur.group()):
        _table_element(sf, table, _Cursor(element), line)
    sf.tables[schema, name] = table  # what follows the columns (PARTITION BY, WITH, TABLESPACE...) is dropped


def _table_element(sf: SchemaFile, table: Table, cur: _Cursor, line: int) -> None:
    if (token := cur.peek()) is not None and token.word in _TABLE_CONSTRAINT_WORDS:
        _add_constraint(sf, table, _table_constraint(cur), line)
        return
    if cur.at("LIKE"):
        raise _BadStatementError("CREATE TABLE ... (LIKE ...) is not supported")
    parts = _column(cur)
    table.columns.append(parts.column)
    table.keys.extend(parts.keys)
    sf.left_out.extend(LeftOut("foreign key", f"{table.schema}.{table.name} {n}", line) for n in parts.left_out)
    if parts.identity is not None:
        _add_identity(sf, table, parts.column, parts.identity, line)


def _add_constraint(sf: SchemaFile, table: Table, constraint: Key | str | tuple[str, str], line: int) -> None:
    if isinstance(constraint, Key):
        table.keys.append(constraint)
    elif isinstance(constraint, str):
        table.checks.append(constraint)
    else:
        sf.left_out.append(LeftOut(constraint[0], f"{constraint[1]} on {table.schema}.{table.name}", line))


def _add_identity(
    sf: SchemaFile, table: Table, column: ColumnDef, identity: tuple[tuple[str, str] | None, list[str]], line: int
) -> None:
    """An identity column becomes a sequence and a default: loads write the feeders' values into it."""
    name, options = identity
    schema, sequence = name or (table.schema, f"{table.name}_{column.name}_seq")
    sf.sequences[schema, sequence] = Sequence(schema, sequence, options, line)
    column.default = f"(nextval({key_literal(qualified(schema, sequence))}::regclass))"
    if "NOT NULL" not in column.clauses:
        column.clauses.append("NOT NULL")


def _table_for(sf: SchemaFile, cur: _Cursor) -> Table:
    schema, name = cur.qualified()
    table = sf.tables.get((schema, name))
    if table is None:
        raise _BadStatementError(f"table {schema}.{name} is not created earlier in the file")
    return table


def _read_index(sf: SchemaFile, cur: _Cursor, line: int, *, unique: bool) -> None:
    cur.take("CONCURRENTLY")
    cur.take("IF", "NOT", "EXISTS")
    name = cur.name()
    cur.expect("ON")
    cur.take("ONLY")
    table = _table_for(sf, cur)
    method = cur.name() if cur.take("USING") else "btree"
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", method):
        raise _BadStatementError(f"index method {method!r} is not a plain name")
    parts = _split_commas(cur.group())
    index = Index(name, unique, method, [_text(p) for p in parts], _plain_columns(parts), [], False, None, line)
    if cur.take("INCLUDE"):
        index.include = _names(cur.group())
    index.nulls_not_distinct = cur.take("NULLS", "NOT", "DISTINCT")
    cur.take("NULLS", "DISTINCT")
    if cur.take("WITH"):
        cur.group()  # storage parameters are the superhub's business
    if cur.take("TABLESPACE"):
        cur.name()
    if cur.take("WHERE"):
        index.where = _expr(cur.rest())
    if not cur.done() or not index.elements:
        raise _BadStatementError("unexpected text in an index definition")
    table.indexes.append(index)


def _plain_columns(parts: list[list[_Tok]]) -> set[str]:
    return {_name_of(p[0]) for p in parts if len(p) == 1 and p[0].kind in ("word", "quoted")}


def _read_alter_table(sf: SchemaFile, cur: _Cursor, line: int) -> None:
    cur.take("IF", "EXISTS")
    cur.take("ONLY")
    start = cur.pos
    schema, name = cur.qualified()
    if cur.take("ADD", "CONSTRAINT") or cur.take("ADD"):
        cur.pos -= 1 if cur.tokens[cur.pos - 1].word == "CONSTRAINT" else 0
        _add_constraint(sf, _table_for(sf, _Cursor(cur.tokens[start:])), _table_constraint(cur), line)
    elif cur.take("ALTER", "COLUMN") or cur.take("ALTER"):
        _alter_column(sf, _table_for(sf, _Cursor(cur.tokens[start:])), cur, line)
    elif cur.take("OWNER", "TO"):
        sf.left_out.append(LeftOut("owner", f"table {schema}.{name}", line))
    else:
        what = " ".join(t.text for t in cur.tokens[cur.pos : cur.pos + 2])
        sf.left_out.append(LeftOut("table setting", f"{schema}.{name} {what}", line))


def _alter_column(sf: SchemaFile, table: Table, cur: _Cursor, line: int) -> None:
    column = table.column(name := cur.name())
    if column is None:
        raise _BadStatementError(f"table {table.schema}.{table.name} has no column {name}")
    if cur.take("SET", "DEFAULT"):
        column.default = _expr(cur.rest())
    elif cur.take("ADD", "GENERATED"):
        parts = _ColumnParts(column)
        _generated(cur, parts)
        if parts.identity is None or not cur.done():
            raise _BadStatementError("expected ADD GENERATED ... AS IDENTITY")
        _add_identity(sf, table, column, parts.identity, line)
    else:
        sf.left_out.append(LeftOut("column setting", f"{table.schema}.{table.name}", line))


# ---------------------------------------------------------------------------------------------------------- checks

_NEXTVAL = re.compile(r"nextval\s*\(\s*('(?:[^']|'')*')", re.IGNORECASE)


def _sequences_used(table: Table) -> Iterator[tuple[str, str]]:
    """The sequences `nextval('...')` in the table's defaults names."""
    for column in table.columns:
        for literal in _NEXTVAL.findall(column.default or ""):
            yield _Cursor(_lex(literal[1:-1].replace("''", "'"))).qualified()


def _check(sf: SchemaFile) -> None:
    types = {(e.schema, e.name) for e in sf.enums} | {(d.schema, d.name) for d in sf.domains}
    for domain in sf.domains:
        if (problem := _type_problem(domain.type, types)) is not None:
            sf.problems.append(Problem(domain.line, f"domain {domain.schema}.{domain.name} {problem}"))
    for table in sf.tables.values():
        _check_table(sf, table, types)


def _check_table(sf: SchemaFile, table: Table, types: set[tuple[str, str]]) -> None:
    where = (table.schema, table.name)
    for column in table.columns:
        if (problem := _type_problem(column.type, types)) is not None:
            message = f"column {column.name} of table {table.schema}.{table.name} {problem}"
            sf.problems.append(Problem(table.line, message, where))
        elif column.type.schema is None and (DEFAULT_SCHEMA, column.type.name) in types:
            name = column.type.name
            column.type = TypeRef(DEFAULT_SCHEMA, name, qualified(DEFAULT_SCHEMA, name), column.type.suffix)
    for schema, name in _sequences_used(table):
        if (schema, name) not in sf.sequences:
            message = f"table {table.schema}.{table.name} uses sequence {schema}.{name}, which the file does not create"
            sf.problems.append(Problem(table.line, message, where))


def _type_problem(type_ref: TypeRef, types: set[tuple[str, str]]) -> str | None:
    schema, name = type_ref.schema, type_ref.name
    if schema == "pg_catalog" or (schema is None and name in BUILTIN_TYPES):
        return None
    if (schema or DEFAULT_SCHEMA, name) in types:
        return None
    shown = f"{schema}.{name}" if schema else name
    return f"uses type {shown}, which the file does not define (as an enum or domain) and is not built in"


# ------------------------------------------------------------------------------------------------------ reading


def read_schema_file(path: Path) -> SchemaFile:
    """Read and check a schema file; its problems are in the result, never raised."""
    sf = SchemaFile(path)
    try:
        statements = _statements(sf, path.read_bytes())
    except OSError as exc:
        sf.problems.append(Problem(0, f"cannot be read: {exc.strerror or exc}"))
        return sf
    for line, text in statements:
        try:
            _read_statement(sf, text, line)
        except _BadStatementError as exc:
            sf.problems.append(Problem(line, f"{exc} (in {' '.join(text.split())[:60]!r})"))
    _check(sf)
    return sf


def _statements(sf: SchemaFile, data: bytes) -> list[tuple[int, str]]:
    """(line, text) of each statement; psql lines other than pg_dump's \\restrict pair are left out."""
    splitter = DumpSplitter()
    try:
        items = [*splitter.feed(data), *splitter.close()]
    except DumpSyntaxError as exc:
        sf.problems.append(Problem(exc.line, str(exc).split(": ", 1)[-1]))
        return []
    statements = []
    for item in items:
        if isinstance(item, Statement):
            statements.append((item.line, item.text.decode("utf-8", errors="replace")))
        elif isinstance(item, MetaCommand) and not re.match(rb"\\(un)?restrict\b", item.text):
            sf.left_out.append(LeftOut("psql command", item.text.decode(errors="replace").strip(), item.line))
        elif hasattr(item, "line") and not isinstance(item, MetaCommand):
            sf.left_out.append(LeftOut("data", "INSERT or COPY", item.line))
            sf.problems.append(Problem(item.line, "data (INSERT or COPY) is not a schema definition", fatal=False))
    return statements


# -------------------------------------------------------------------------------------------------------- building


def _table_ddl(table: Table, feeder_key: str, key_type: str) -> list[str]:
    """CREATE TABLE ... PARTITION BY LIST (key) and CREATE INDEX statements for one parent."""
    key = [] if table.column(feeder_key) else [f"{ident(feeder_key)} {key_type} NOT NULL"]
    definitions = [*key, *(c.sql() for c in table.columns), *table.checks]
    definitions += [_key_sql(k, feeder_key) for k in table.keys]
    name = qualified(table.schema, table.name)
    create = f"CREATE TABLE {name} ({', '.join(definitions)}) PARTITION BY LIST ({ident(feeder_key)})"
    return [create, *(_index_sql(name, i, feeder_key) for i in table.indexes)]


def _key_sql(key: Key, feeder_key: str) -> str:
    """A primary key or unique constraint, with the feeder key first (partitioning demands it)."""
    columns = ", ".join(ident(c) for c in [feeder_key, *(c for c in key.columns if c != feeder_key)])
    parts = [f"CONSTRAINT {ident(key.name)}" if key.name else "", "PRIMARY KEY" if key.primary else "UNIQUE"]
    parts += ["NULLS NOT DISTINCT" if key.nulls_not_distinct else "", f"({columns})"]
    parts += [f"INCLUDE ({', '.join(ident(c) for c in key.include)})" if key.include else ""]
    return " ".join(p for p in parts if p)


def _index_sql(table_sql: str, index: Index, feeder_key: str) -> str:
    elements = index.elements
    if index.unique and feeder_key not in index.plain_columns:
        elements = [ident(feeder_key), *elements]
    parts = [f"CREATE {'UNIQUE ' if index.unique else ''}INDEX {ident(index.name)} ON {table_sql}"]
    parts.append(f"USING {index.method} ({', '.join(elements)})")
    parts += [f"INCLUDE ({', '.join(ident(c) for c in index.include)})"] if index.include else []
    parts += ["NULLS NOT DISTINCT"] if index.nulls_not_distinct else []
    parts += [f"WHERE {index.where}"] if index.where else []
    return " ".join(parts)


def _enum_sql(enum: Enum) -> str:
    return f"CREATE TYPE {qualified(enum.schema, enum.name)} AS ENUM ({', '.join(enum.labels)})"


def _domain_sql(domain: Domain) -> str:
    return " ".join([f"CREATE DOMAIN {qualified(domain.schema, domain.name)} AS {domain.type.sql}", *domain.clauses])


def _sequence_sql(sequence: Sequence) -> str:
    return " ".join([f"CREATE SEQUENCE IF NOT EXISTS {qualified(sequence.schema, sequence.name)}", *sequence.options])


@dataclass(frozen=True, slots=True)
class _Step:
    line: int
    what: str
    sql: str


def _plan(
    sf: SchemaFile, tables: list[Table], types: set[tuple[str, str]], feeder_key: str, key_type: str
) -> list[_Step]:
    """Every statement that creates `tables` with the types and sequences they need, in order."""
    enums = [e for e in sf.enums if (e.schema, e.name) not in types]
    domains = [d for d in sf.domains if (d.schema, d.name) not in types]
    sequences = {s: sf.sequences[s] for t in tables for s in _sequences_used(t) if s in sf.sequences}
    owners: list[Enum | Domain | Sequence | Table] = [*enums, *domains, *sequences.values(), *tables]
    schemas = sorted({o.schema for o in owners})
    steps = [_Step(0, f"schema {s}", f"CREATE SCHEMA IF NOT EXISTS {ident(s)}") for s in schemas]
    steps += [_Step(e.line, f"enum {e.schema}.{e.name}", _enum_sql(e)) for e in enums]
    steps += [_Step(d.line, f"domain {d.schema}.{d.name}", _domain_sql(d)) for d in domains]
    steps += [_Step(s.line, f"sequence {s.schema}.{s.name}", _sequence_sql(s)) for s in sequences.values()]
    for table in tables:
        what = f"table {table.schema}.{table.name}"
        steps += [_Step(table.line, what, sql) for sql in _table_ddl(table, feeder_key, key_type)]
    return steps


# ------------------------------------------------------------------------------------------------------ public API


def check_schema_file(path: Path, feeder_key: str) -> list[str]:
    """Problems of a schema file, without a database: "file:LINE: ..." each; empty when fine."""
    sf = read_schema_file(path)
    for table in sf.tables.values():
        try:
            _table_ddl(table, feeder_key, "integer")
        except _BadStatementError as exc:
            sf.problems.append(Problem(table.line, str(exc), (table.schema, table.name)))
    return [f"{sf.where(p.line)}: {p.message}" for p in sorted(sf.problems, key=lambda p: p.line)]


_RELATIONS = """
SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p')
"""
_TYPES = "SELECT n.nspname, t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"


async def create_parents_from_file(
    conn: asyncpg.Connection,
    schema_file: Path,
    feeder_key: str,
    key_type: str,
    wanted: Callable[[str, str], bool],
) -> list[str]:
    """Create the missing parents of the wanted tables in `schema_file`, in one transaction; their `schema.name`."""
    sf = await asyncio.to_thread(read_schema_file, schema_file)
    tables = [t for t in sf.tables.values() if wanted(t.schema, t.name)]
    names = {(t.schema, t.name) for t in tables}
    fatal = [p for p in sf.problems if p.fatal and (p.table is None or p.table in names)]
    if fatal:
        raise ConfigError([f"{sf.where(p.line)}: {p.message}" for p in fatal])
    existing = {(s, n) for s, n in await conn.fetch(_RELATIONS)}
    missing = [t for t in tables if (t.schema, t.name) not in existing]
    if not missing:
        return []
    async with conn.transaction():
        types = {(s, n) for s, n in await conn.fetch(_TYPES)}
        for step in _plan(sf, missing, types, feeder_key, key_type):
            await _execute(conn, sf, step)
    _warn_left_out(sf)
    return [f"{t.schema}.{t.name}" for t in missing]


async def _execute(conn: asyncpg.Connection, sf: SchemaFile, step: _Step) -> None:
    try:
        await conn.execute(step.sql)
    except asyncpg.PostgresError as exc:
        place = sf.where(step.line) if step.line else sf.path.name
        message = " ".join(str(exc).split())
        raise ConfigError(f"{place}: the superhub refused to create {step.what}: {message}") from exc


def _warn_left_out(sf: SchemaFile) -> None:
    items = list(dict.fromkeys(f"{o.kind} {o.name}" for o in sf.left_out))
    if items:
        log.warning("schema_file.left_out", file=str(sf.path), count=len(items), items=items)
