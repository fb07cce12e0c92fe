"""A table's content digest, computed by the agent in the dump's own snapshot (the binary mode's psql session), so a
table whose digest the superhub already holds need not be sent again (issue #46; docs/stream-format.md, "Unchanged
tables").

The digest covers what the superhub's load depends on from the feeder's side: the feeder's columns (names, types,
order), the columns sent, and every row's exact text: `md5(ROW(col, ...)::text)` per row, where a record's text
tells NULL (nothing) from '' (`""`) and 1 from 1.0. The rows' 128-bit hashes are summed as two 64-bit halves into
exact numerics: the sum does not depend on the rows' order (a seq scan may start anywhere: synchronize_seqscans).
Count, sums and columns are then hashed into one SHA-256 hex string.

The digest reads the whole table, so it is computed only where it may save the table's dump: the table's counters
(its file node and its inserted, updated and deleted tuples, `pg_stat_get_tuples_*`) are only a hint, but one that
can only say "changed for sure": where they differ from those the superhub stored with its digest, or where it
stored none (a table's first load), the table is sent without one, so a first round costs no more than a dump.
They prove nothing the other way (PostgreSQL 15+ reports a backend's counts late; `track_counts` may be off):
where they are equal, the digest decides.

Pure apart from the statements' text and `table_digest`'s one query, run by its caller's session: no process of its
own. Standard library only (the zipapp).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedload.feeder.binary_plan import FeederColumn, TablePlan, TableRequest, quote_ident

__all__ = [
    "DIGEST_VERSION",
    "TableDigest",
    "counters_query",
    "digest_query",
    "parse_counters",
    "parse_digest",
    "table_digest",
    "unchanged",
]

DIGEST_VERSION = 1  # what `digest_query` hashes and how: a change makes every stored digest differ


@dataclass(frozen=True)
class TableDigest:
    """A table's content in the snapshot: its rows, and the digest of them and of its columns."""

    rows: int
    digest: str


def table_digest(
    request: TableRequest,
    plan: TablePlan,
    feeder: Sequence[FeederColumn],
    counters: str,
    query: Callable[[str], bytes],
) -> TableDigest | None:
    """The table's digest, computed by `query` (a statement run in the dump's snapshot) only where it may spare the
    table's dump: asked for, and the table's `counters` now are those the superhub stored; None elsewhere (the table
    is sent without one)."""
    if not (request.wants_digest and request.counters and request.counters == counters):
        return None
    return parse_digest(query(digest_query(plan)), plan, feeder)


def unchanged(digest: TableDigest | None, request: TableRequest) -> tuple[int, str] | None:
    """(rows, digest) where the table's digest is the one the superhub holds (it is not sent); None elsewhere."""
    return (digest.rows, digest.digest) if digest is not None and digest.digest == request.digest else None


def digest_query(plan: TablePlan) -> str:
    """One statement printing `count|sum of the hashes' high halves|sum of their low halves` for the plan's table and
    columns (identifiers quoted here)."""
    columns = ", ".join(map(quote_ident, plan.columns))
    source = f"{quote_ident(plan.schema)}.{quote_ident(plan.name)}"
    halves = ", ".join(f"coalesce(sum(('x' || substr(h, {start}, 16))::bit(64)::int8), 0)" for start in (1, 17))
    rows = f"SELECT md5(ROW({columns})::text) AS h FROM ONLY {source}"  # noqa: S608 - identifiers quoted here
    return f"SELECT count(*), {halves} FROM ({rows}) AS hashed;"  # noqa: S608 - built above


def parse_digest(printed: bytes, plan: TablePlan, feeder: Sequence[FeederColumn]) -> TableDigest:
    """The digest from what `digest_query` printed; ValueError if it is not its answer."""
    count, high, low = printed.decode().strip().split("|")
    content = [
        DIGEST_VERSION,
        [[c.name, c.type_oid, c.type_sql] for c in feeder],
        list(plan.columns),
        int(count),
        int(high),
        int(low),
    ]
    digest = hashlib.sha256(json.dumps(content).encode()).hexdigest()
    return TableDigest(int(count), digest)


_COUNTERS = (
    "SELECT coalesce(json_agg(json_build_array(n.nspname, c.relname, concat_ws(' ', pg_relation_filenode(c.oid), "
    "pg_stat_get_tuples_inserted(c.oid), pg_stat_get_tuples_updated(c.oid), pg_stat_get_tuples_deleted(c.oid)))), "
    "'[]') FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "JOIN json_array_elements(convert_from(decode('NAMES_HEX', 'hex'), 'UTF8')::json) r "
    "ON n.nspname = r->>0 AND c.relname = r->>1 WHERE c.relkind = 'r';"
)


def counters_query(requests: Sequence[TableRequest]) -> str:
    """One statement whose one value is a JSON list of [schema, name, counters] for the requested tables; the names
    travel hex-encoded, as in `catalog_query`."""
    names = json.dumps([[r.schema, r.name] for r in requests]).encode().hex()
    return _COUNTERS.replace("NAMES_HEX", names)


def parse_counters(printed: bytes) -> dict[tuple[str, str], str]:
    """The counters `counters_query` printed, by (schema, name); ValueError if it is not its answer."""
    return {(schema, name): str(counters) for schema, name, counters in json.loads(printed)}
