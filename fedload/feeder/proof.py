"""What a table's digest depends on besides its rows, read in the dump's snapshot: the server (whose transaction IDs
the tuple-identity proof relies on), the session's output settings, each table's columns as stored and the types
they use, the labels of the enums among them (docs/unchanged.md, "How a table is proven unchanged").

`proof_kind` decides from it which proof a table gets: the tuple identities (cheap: reads no values) where every
column's text and binary output is fixed by what is hashed here, the rows' content elsewhere. Pure apart from the
statement's text, run by its caller's session. Standard library only (the zipapp).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from fedload.feeder.binary_plan import FIRST_USER_OID, TableRequest

__all__ = [
    "IDENTITY_MIN_MAJOR",
    "ProofContext",
    "ProofKind",
    "TableFacts",
    "TypeFacts",
    "context_query",
    "enum_labels",
    "parse_context",
    "proof_kind",
]

IDENTITY_MIN_MAJOR = 11  # hashtextextended and attmissingval: older servers get the content digest


class ProofKind(str, enum.Enum):
    """How a table is proven unchanged."""

    IDENTITY = "identity"  # the count and hash sums of its row versions' (xmin, ctid)
    CONTENT = "content"  # the count and hash sums of its rows' text, md5(ROW(columns)::text)


# Built-in types whose output is not a function of the stored value alone: reg* types print names (and follow
# search_path), money follows lc_monetary, aclitem prints role names.
_NAME_PRINTING = ("money", "aclitem")


@dataclass(frozen=True)
class TypeFacts:
    """A type a column uses, directly or through a domain or an array: what decides whether its output is fixed."""

    oid: int
    name: str
    kind: str  # typtype: b(ase), d(omain), e(num), c(omposite), r(ange), m(ultirange), p(seudo)
    base: int  # typbasetype (domains)
    element: int  # typelem
    output: str  # typoutput, as regproc text
    labels: tuple[tuple[int, str], ...]  # an enum's (OID, label) pairs in their order


@dataclass(frozen=True)
class TableFacts:
    """A table as stored: its OID, access method and columns (attnum, name, type OID, type with modifiers, the
    value rows written before the column was added show, `attmissingval`), the dropped ones left out."""

    oid: int
    access_method: str
    columns: tuple[tuple[int, str, int, str, Optional[str]], ...]  # noqa: UP045 - Python 3.9 evaluates it


@dataclass(frozen=True)
class ProofContext:
    """The server and the asked tables as the snapshot shows them."""

    server: tuple[str, ...]  # system identifier, postmaster start, database OID: whose transaction IDs
    settings: tuple[str, ...]  # the session's settings that shape text output
    in_recovery: bool  # a standby: its transaction IDs are its primary's, whose history it does not see
    snapshot_xmax: int  # the snapshot's first unassigned transaction ID (64-bit)
    wal_insert_lsn: str  # the WAL insert position at the snapshot ("" in recovery): durability is checked against it
    tables: dict[tuple[str, str], TableFacts]
    types: dict[int, TypeFacts]
    major: int = IDENTITY_MIN_MAJOR  # the server's
    snapshot_xmin: int = 0  # the snapshot's oldest transaction ID still running (64-bit): all below it had ended


_SETTINGS = (
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "extra_float_digits",
    "bytea_output",
    "standard_conforming_strings",
    "client_encoding",
    "server_encoding",
)
_SERVER = (
    "SELECT json_build_object('server', json_build_array((SELECT system_identifier::text FROM "
    "pg_catalog.pg_control_system()), extract(epoch FROM pg_catalog.pg_postmaster_start_time())::text, "
    "(SELECT oid::int8 FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())), "
    "'settings', json_build_array(SETTINGS), 'in_recovery', pg_catalog.pg_is_in_recovery(), "
    "'version_num', pg_catalog.current_setting('server_version_num')::int, "
    "'xmax', pg_catalog.txid_snapshot_xmax(pg_catalog.txid_current_snapshot()), "
    "'xmin', pg_catalog.txid_snapshot_xmin(pg_catalog.txid_current_snapshot()), "
    "'wal', CASE WHEN pg_catalog.pg_is_in_recovery() THEN '' "
    "ELSE pg_catalog.pg_current_wal_insert_lsn()::text END, 'tables', (TABLES), 'types', (TYPES));"
)
_TABLES = (
    "SELECT coalesce(json_agg(json_build_array(n.nspname, c.relname, c.oid::int8, coalesce(am.amname, 'heap'), "
    "(SELECT coalesce(json_agg(json_build_array(a.attnum, a.attname, a.atttypid::int8, "
    "pg_catalog.format_type(a.atttypid, a.atttypmod), to_json(a)->>'attmissingval') ORDER BY a.attnum), '[]') "
    "FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped))), '[]') "
    "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "LEFT JOIN pg_catalog.pg_am am ON am.oid = c.relam "
    "JOIN json_array_elements(convert_from(decode('NAMES_HEX', 'hex'), 'UTF8')::json) r "
    "ON n.nspname = r->>0 AND c.relname = r->>1 WHERE c.relkind = 'r'"
)
# Every type the tables' columns reach through domains and arrays, with an enum's labels.
_TYPES = (
    "WITH RECURSIVE used(oid) AS (SELECT a.atttypid FROM pg_catalog.pg_attribute a "
    "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "JOIN json_array_elements(convert_from(decode('NAMES_HEX', 'hex'), 'UTF8')::json) r "
    "ON n.nspname = r->>0 AND c.relname = r->>1 WHERE c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped "
    "UNION SELECT x.oid FROM used JOIN pg_catalog.pg_type t ON t.oid = used.oid, "
    "LATERAL (VALUES (t.typbasetype), (t.typelem)) AS x(oid) WHERE x.oid <> 0) "
    "SELECT coalesce(json_agg(json_build_array(t.oid::int8, t.typname, t.typtype, t.typbasetype::int8, "
    "t.typelem::int8, t.typoutput::text, (SELECT coalesce(json_agg(json_build_array(e.oid::int8, e.enumlabel) "
    "ORDER BY e.enumsortorder), '[]') FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid)) ORDER BY t.oid), '[]') "
    "FROM used JOIN pg_catalog.pg_type t ON t.oid = used.oid"
)


def context_query(requests: Sequence[TableRequest]) -> str:
    """One statement whose one value is a JSON object: the server, the settings, the snapshot's xmax and WAL
    position, the requested tables' facts and the types their columns use; the names travel hex-encoded."""
    names = json.dumps([[r.schema, r.name] for r in requests]).encode().hex()
    settings = ", ".join(f"pg_catalog.current_setting('{name}')" for name in _SETTINGS)
    statement = _SERVER.replace("SETTINGS", settings).replace("TABLES", _TABLES).replace("TYPES", _TYPES)
    return statement.replace("NAMES_HEX", names)


def parse_context(printed: bytes) -> ProofContext:
    """The context `context_query` printed; ValueError if it is not its answer."""
    found: Any = json.loads(printed)
    tables = {
        (schema, name): TableFacts(int(oid), str(am), tuple((int(c[0]), c[1], int(c[2]), c[3], c[4]) for c in cols))
        for schema, name, oid, am, cols in found["tables"]
    }
    types = {
        int(t[0]): TypeFacts(int(t[0]), t[1], t[2], int(t[3]), int(t[4]), t[5], tuple((int(o), lb) for o, lb in t[6]))
        for t in found["types"]
    }
    return ProofContext(
        server=tuple(str(s) for s in found["server"]),
        settings=tuple(str(s) for s in found["settings"]),
        in_recovery=bool(found["in_recovery"]),
        snapshot_xmax=int(found["xmax"]),
        wal_insert_lsn=str(found["wal"]),
        tables=tables,
        types=types,
        major=int(found["version_num"]) // 10000,
        snapshot_xmin=int(found.get("xmin", 0)),
    )


def proof_kind(facts: TableFacts, context: ProofContext, sent: Sequence[str]) -> tuple[ProofKind, str]:
    """The proof a table gets when its columns `sent` are sent, and why it is the content digest ("" for the
    identity proof). A column not sent does not shape the dump: whatever its type, it needs no content digest."""
    if context.in_recovery:
        return ProofKind.CONTENT, "the feeder is a standby"
    if facts.access_method != "heap":
        return ProofKind.CONTENT, f"its access method is {facts.access_method}, not heap"
    for _, name, type_oid, _, _ in facts.columns:
        if name in sent and (why := _not_fixed(type_oid, context.types, 0)):
            return ProofKind.CONTENT, f"column {name}: {why}"
    return ProofKind.IDENTITY, ""


def _not_fixed(oid: int, types: dict[int, TypeFacts], depth: int) -> str:
    """Why values of type `oid` may print differently with nothing stored changed ("" if they cannot, beyond the
    settings and enum labels the identity proof hashes)."""
    found = types.get(oid)
    if found is None or depth > 32:
        return f"its type {oid} is not known"
    through = found.base if found.kind == "d" else found.element if found.output == "array_out" else 0
    if through:  # a domain prints as its base type, an array as its elements
        return _not_fixed(through, types, depth + 1)
    if found.kind == "e":
        return ""
    if found.oid >= FIRST_USER_OID or found.kind not in ("b", "r", "m"):
        return f"its type {found.name} is not built in"
    if found.name.startswith("reg") or found.name in _NAME_PRINTING:
        return f"its type {found.name} prints names or settings, not only what is stored"
    return ""


def enum_labels(facts: TableFacts, types: dict[int, TypeFacts]) -> list[list[Any]]:
    """The (OID, label) pairs of every enum the table's columns reach, by enum OID: a label renamed changes both
    outputs of the rows that hold it, and no tuple."""
    reached: dict[int, TypeFacts] = {}
    pending = [type_oid for _, _, type_oid, _, _ in facts.columns]
    while pending:
        found = types.get(pending.pop())
        if found is None or found.oid in reached:
            continue
        reached[found.oid] = found
        pending.extend(oid for oid in (found.base, found.element) if oid)
    return [[oid, [list(pair) for pair in t.labels]] for oid, t in sorted(reached.items()) if t.kind == "e"]
