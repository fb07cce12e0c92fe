"""A table's content digest, computed by the agent in the dump's own snapshot (the binary mode's psql session), so a
table whose digest the superhub already holds need not be sent again (issue #46; docs/stream-format.md, "Unchanged
tables").

The digest covers what the superhub's load depends on from the feeder's side: the feeder's columns (names, types,
order), the columns sent, and every row's exact text: `md5(ROW(col, ...)::text)` per row, where a record's text
tells NULL (nothing) from '' (`""`) and 1 from 1.0. The rows' 128-bit hashes are summed as two 64-bit halves into
exact numerics: the sum does not depend on the rows' order (a seq scan may start anywhere: synchronize_seqscans).
Count, sums and columns are then hashed into one SHA-256 hex string.

Pure apart from the statement's text: no process, no database. Standard library only (the zipapp).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from fedload.feeder.binary_plan import FeederColumn, TablePlan, quote_ident

__all__ = ["DIGEST_VERSION", "TableDigest", "digest_query", "parse_digest"]

DIGEST_VERSION = 1  # what `digest_query` hashes and how: a change makes every stored digest differ


@dataclass(frozen=True)
class TableDigest:
    """A table's content in the snapshot: its rows, and the digest of them and of its columns."""

    rows: int
    digest: str


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
