"""What a binary-mode dump sends of each table, decided on the feeder from the superhub's request and the feeder's
own catalog (pure: no process, no database).

The request is data: per table, the columns the superhub wants in its order, each with the OID of its type on the
superhub (0: the superhub takes it only as text), or no columns at all (the table goes whole, as text, as pg_dump
would send it). A table goes in PostgreSQL's binary COPY format only where that is exact: every column it sends has
a built-in type (OID below 16384, the same on every server), the same on both sides, with binary output on the
feeder. Identifiers are quoted here, never taken as SQL from the request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from fedload.feeder.delta import DeltaRequest, parse_delta_request
from fedload.feeder.errors import AgentUsageError
from fedload.feeder.sql_text import quote_ident
from fedload.feeder.table_patterns import exact_name

__all__ = [
    "COUNTERS_FORMAT",
    "DIGEST_FORMAT",
    "FIRST_USER_OID",
    "FeederColumn",
    "TablePlan",
    "TableRequest",
    "catalog_query",
    "copy_command",
    "parse_catalog",
    "plan_table",
    "quote_ident",
    "read_requests",
]

# The only digests and counters a request may hold (fullmatch): the superhub checks what it receives and stores
# against the same patterns (fedload.superhub.unchanged), so that it never sends what an agent refuses.
DIGEST_FORMAT = re.compile("[0-9a-f]{64}")
COUNTERS_FORMAT = re.compile("[0-9]{1,20}(?: [0-9]{1,20}){0,7}")
FIRST_USER_OID = 16384  # FirstNormalObjectId: below it, built-in objects, whose OIDs every server shares


@dataclass(frozen=True)
class TableRequest:
    """One table the superhub asks for; `columns` None: all of the feeder's, as text."""

    schema: str
    name: str
    columns: Optional[tuple[tuple[str, int], ...]]  # noqa: UP045 - Python 3.9 evaluates dataclass fields' types
    # The table's content digest is wanted (fedload/feeder/digest.py): the superhub skips unchanged tables. `digest`
    # is the one it holds ("" for none): a table whose digest equals it is not sent.
    wants_digest: bool = False
    digest: str = ""
    counters: str = ""  # the table's counters when that digest was computed ("": none): others mean changed for sure
    # Its changed rows only, by buckets (fedload/feeder/delta.py): a DeltaRequest, where the superhub asks for them.
    delta: Optional[DeltaRequest] = None  # noqa: UP045


@dataclass(frozen=True)
class FeederColumn:
    """A column of the table on the feeder."""

    name: str
    type_oid: int
    type_name: str
    has_send: bool  # its type has binary output (typsend)
    type_sql: str = ""  # its type with modifiers (varchar(20)): what a content digest covers


@dataclass(frozen=True)
class TablePlan:
    """What the dump sends of one table."""

    schema: str
    name: str
    columns: tuple[str, ...]
    binary: bool
    reason: str  # why it goes as text; "" when binary
    unsent: tuple[str, ...]  # the feeder's columns not sent


def read_requests(tables: Sequence[str], columns: Sequence[str]) -> list[TableRequest]:
    """The request's tables (`--table`, exact names) with their `--columns` (JSON objects
    `{"schema": ..., "name": ..., "columns": [[name, type OID], ...] | null}`), one for each table;
    AgentUsageError for anything else."""
    wanted = []
    for table in tables:
        try:
            parts = exact_name(table)
        except ValueError as exc:
            raise AgentUsageError(f"--table {exc}") from None
        if len(parts) != 2:
            raise AgentUsageError(f"--table {table!r} is not schema.table, as binary mode needs")
        wanted.append((parts[0], parts[1]))
    requests = {(r.schema, r.name): r for r in map(_request, columns)}
    if len(requests) != len(columns) or sorted(requests) != sorted(set(wanted)):
        raise AgentUsageError("binary mode needs exactly one --columns for each --table, and no other")
    return [requests[table] for table in dict.fromkeys(wanted)]


def _request(text: str) -> TableRequest:
    try:
        found: Any = json.loads(text)
    except ValueError:
        found = None
    named = isinstance(found, dict) and isinstance(found.get("schema"), str) and isinstance(found.get("name"), str)
    if not named:
        raise AgentUsageError(f"--columns {text[:80]!r} is not a JSON object naming a table's schema and name")
    columns = found.get("columns")
    wants_digest, digest, counters = "digest" in found, found.get("digest") or "", found.get("counters") or ""
    if not isinstance(digest, str) or (digest and not DIGEST_FORMAT.fullmatch(digest)):
        raise AgentUsageError(f"--columns of {found['name']!r}: digest must be 64 hexadecimal digits or null")
    if not isinstance(counters, str) or (counters and not COUNTERS_FORMAT.fullmatch(counters)):
        raise AgentUsageError(f"--columns of {found['name']!r}: counters must be numbers separated by spaces")
    delta = _delta(found)
    if columns is None:
        return TableRequest(found["schema"], found["name"], None, wants_digest, digest, counters, delta)
    if not isinstance(columns, list) or not all(_is_column(column) for column in columns):
        raise AgentUsageError(f"--columns of {found['name']!r}: columns must be a list of [name, type OID] pairs")
    pairs = tuple((name, oid) for name, oid in columns)
    return TableRequest(found["schema"], found["name"], pairs, wants_digest, digest, counters, delta)


def _delta(found: dict[str, Any]) -> DeltaRequest | None:
    """The request's DeltaRequest (fedload/feeder/delta.py), None where it asks none."""
    if found.get("delta") is None:
        return None
    try:
        return parse_delta_request(found["delta"])
    except ValueError as exc:
        raise AgentUsageError(f"--columns of {found['name']!r}: {exc}") from None


def _is_column(column: object) -> bool:
    return (
        isinstance(column, list)
        and len(column) == 2
        and isinstance(column[0], str)
        and type(column[1]) is int
        and column[1] >= 0
    )


# Columns of pg_class c; attgenerated exists from PostgreSQL 12, hence to_json.
_CATALOG_COLUMNS = (
    "SELECT coalesce(json_agg(json_build_array(a.attname, a.atttypid::int8, format_type(a.atttypid, NULL), "
    "t.typsend::oid <> 0, format_type(a.atttypid, a.atttypmod)) ORDER BY a.attnum), '[]') "
    "FROM pg_catalog.pg_attribute a "
    "JOIN pg_catalog.pg_type t ON t.oid = a.atttypid WHERE a.attrelid = c.oid AND a.attnum > 0 "
    "AND NOT a.attisdropped AND coalesce(to_json(a)->>'attgenerated', '') = ''"
)
_CATALOG_TABLES = (
    "SELECT json_agg(json_build_array(n.nspname, c.relname, (" + _CATALOG_COLUMNS + "))) "
    "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "JOIN json_array_elements(convert_from(decode('NAMES_HEX', 'hex'), 'UTF8')::json) r "
    "ON n.nspname = r->>0 AND c.relname = r->>1 WHERE c.relkind = 'r'"
)


_CATALOG_HEAD = (
    "'server_version', current_setting('server_version'), 'snapshot_epoch_s', extract(epoch FROM pg_catalog.now())"
)


def catalog_query(requests: Sequence[TableRequest]) -> str:
    """One statement whose one value is a JSON object: the server's version, its clock at the transaction's start
    (`now()`, Unix seconds: no later than the snapshot, which this first statement of the transaction takes), and
    for each requested table that exists on the feeder as a plain table, its columns (name, type OID, type, binary
    output, type with modifiers) in their order, not the generated ones (pg_dump leaves those out). The names travel
    hex-encoded: nothing of them is SQL."""
    names = json.dumps([[r.schema, r.name] for r in requests]).encode().hex()
    tables = _CATALOG_TABLES.replace("NAMES_HEX", names)
    return f"SELECT json_build_object({_CATALOG_HEAD}, 'tables', ({tables}));"


def parse_catalog(text: bytes) -> tuple[str, float, dict[tuple[str, str], list[FeederColumn]]]:
    """The server's version, its clock at the snapshot (Unix seconds) and the tables `catalog_query` found;
    ValueError if `text` is not its answer."""
    found = json.loads(text)
    tables = {}
    for schema, name, columns in found["tables"] or ():
        tables[schema, name] = [FeederColumn(c[0], int(c[1]), c[2], bool(c[3]), c[4]) for c in columns]
    return str(found["server_version"]), float(found["snapshot_epoch_s"]), tables


def plan_table(request: TableRequest, feeder: Sequence[FeederColumn]) -> TablePlan:
    """The columns to send, in the superhub's order (those the feeder lacks are left to the superhub's defaults), and
    whether binary is exact for them."""
    if request.columns is None:
        names = tuple(c.name for c in feeder)
        return TablePlan(request.schema, request.name, names, False, "the superhub asked for this table as text", ())
    by_name = {c.name: c for c in feeder}
    sent = [(by_name[name], oid) for name, oid in request.columns if name in by_name]
    wanted = {name for name, _ in request.columns}
    unsent = tuple(c.name for c in feeder if c.name not in wanted)
    reason = next((why for column, oid in sent if (why := _not_binary(column, oid))), "")
    return TablePlan(request.schema, request.name, tuple(c.name for c, _ in sent), not reason, reason, unsent)


def _not_binary(column: FeederColumn, superhub_oid: int) -> str:
    """Why `column` cannot go in binary to a superhub column of type `superhub_oid`; "" if it can."""
    if superhub_oid == 0:
        return f"column {column.name}: the superhub takes its type only as text"
    if column.type_oid >= FIRST_USER_OID:
        return f"column {column.name}: its type {column.type_name} is not built in (an enum, domain or user type)"
    if column.type_oid != superhub_oid:
        return (
            f"column {column.name}: its type is {column.type_name} (OID {column.type_oid}) on the feeder, "
            f"OID {superhub_oid} on the superhub"
        )
    if not column.has_send:
        return f"column {column.name}: its type {column.type_name} has no binary output"
    return ""


def copy_command(plan: TablePlan, where: str = "") -> str:
    """psql's `\\copy` of the plan's columns to psql's stdout (one line: psql reads a meta-command to its end), of
    the rows `where` holds for (SQL on the table as `r`; "": all); ValueError for a name with a line break, which
    that line cannot hold."""
    if any("\n" in name or "\r" in name for name in (plan.schema, plan.name, *plan.columns)):
        where = f"table {plan.schema}.{plan.name}"
        raise ValueError(f"{where} has a name with a line break, which psql's \\copy cannot take")
    columns = ", ".join(map(quote_ident, plan.columns))
    source = f"{quote_ident(plan.schema)}.{quote_ident(plan.name)}"
    options = " (FORMAT binary)" if plan.binary else ""
    rows = f"ONLY {source}" + (f" AS r WHERE {where}" if where else "")
    return f"\\copy (SELECT {columns} FROM {rows}) TO PSTDOUT{options}\n"  # noqa: S608 - quoted here
