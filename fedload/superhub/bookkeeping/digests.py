"""The tables' content digests (`fedload.digests`): per feeder and table, the digest the feeder's agent computed in
the snapshot of the data the superhub holds, its rows, and the fingerprint of the superhub's side of the load
(fedload.superhub.unchanged). Written in the swap's transaction: a failed run records none."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg

from fedload.names import TableName

__all__ = ["StoredDigest", "forget_digests", "read_digests", "write_digests"]


@dataclass(frozen=True, slots=True)
class StoredDigest:
    """A table's digest as the superhub's data was loaded."""

    digest: str  # "": none computed (the table's counters said it changed)
    rows: int
    fingerprint: str
    counters: str = ""  # the table's counters on the feeder then
    delta: str = ""  # its delta state as JSON (fedload/feeder/delta.py), "" for none


async def read_digests(conn: asyncpg.Connection, feeder: str) -> dict[TableName, StoredDigest]:
    """The feeder's stored digests, by table."""
    found = await conn.fetch(
        "SELECT table_schema, table_name, digest, rows, fingerprint, counters, delta FROM fedload.digests "
        "WHERE feeder = $1",
        feeder,
    )
    return {
        TableName(r["table_schema"], r["table_name"]): StoredDigest(
            r["digest"], r["rows"], r["fingerprint"], r["counters"], r["delta"]
        )
        for r in found
    }


async def write_digests(
    conn: asyncpg.Connection, feeder: str, run_id: int | None, digests: dict[TableName, StoredDigest]
) -> None:
    """Make `digests` the feeder's (in the caller's transaction): those of tables not in it are forgotten."""
    await conn.execute("DELETE FROM fedload.digests WHERE feeder = $1", feeder)
    tables = sorted(digests)
    await conn.execute(
        "INSERT INTO fedload.digests (feeder, table_schema, table_name, digest, rows, fingerprint, counters, delta, "
        "run_id) SELECT $1, s, n, d, r, f, c, x, $9 FROM unnest($2::text[], $3::text[], $4::text[], $5::int8[], "
        "$6::text[], $7::text[], $8::text[]) AS t(s, n, d, r, f, c, x)",
        feeder,
        [t.schema for t in tables],
        [t.name for t in tables],
        [digests[t].digest for t in tables],
        [digests[t].rows for t in tables],
        [digests[t].fingerprint for t in tables],
        [digests[t].counters for t in tables],
        [digests[t].delta for t in tables],
        run_id,
    )


async def forget_digests(conn: asyncpg.Connection, feeder: str, tables: Iterable[TableName] | None = None) -> None:
    """Forget the feeder's digests of `tables` (default: all): their next run sends them."""
    if tables is None:
        await conn.execute("DELETE FROM fedload.digests WHERE feeder = $1", feeder)
        return
    names = list(tables)
    await conn.execute(
        "DELETE FROM fedload.digests WHERE feeder = $1 AND (table_schema, table_name) IN "
        "(SELECT * FROM unnest($2::text[], $3::text[]))",
        feeder,
        [t.schema for t in names],
        [t.name for t in names],
    )
