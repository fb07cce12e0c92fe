"""The parents' definitions, read once per process and schema state instead of at every run.

Reading the parents (`schema.read_parents`) costs a transaction and three catalog queries per parent, about a
dozen round trips before a run can start its feeder's dump. Their definitions change only with DDL, and every DDL
that changes what `read_parents` returns writes new versions of catalog rows: a row's `xmin` (the transaction
that wrote that version) changes with every UPDATE, and rows come and go with CREATE and DROP. So one query
fingerprints the rows the definitions come from (each partitioned table's pg_class and schema row, its columns
with their types, collations and schemas, defaults, indexes with their pg_class rows, constraints): while the
fingerprint is the one seen at the last read, on the same superhub, the definitions read then still hold.
ATTACH and DETACH of partitions, which every swap does, write no row of the parent's own, so swaps keep it.

Names the definitions print but that live in other catalogs (a function in an index expression or a default, a
sequence) are not fingerprinted: a rename of one of those makes the next run fail on the old name, and a failed
run forgets the cache (`forget`), so the run after it reads the catalog again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import asyncpg

from fedload.names import TableName, TablePattern
from fedload.superhub.schema import ParentTable, read_parents

__all__ = ["FINGERPRINT", "cached_parents", "forget"]

_ROWS = "string_agg(concat_ws('.', {cols}), ' ' ORDER BY {order})"
FINGERPRINT = f"""
SELECT md5(coalesce(string_agg(concat_ws(':', c.oid, c.xmin, n.xmin,
    (SELECT {_ROWS.format(cols="a.attnum, a.xmin, t.xmin, tn.xmin, co.xmin, cn.xmin", order="a.attnum")}
     FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid JOIN pg_namespace tn ON tn.oid = t.typnamespace
     LEFT JOIN pg_collation co ON co.oid = a.attcollation LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
     WHERE a.attrelid = c.oid AND a.attnum > 0),
    (SELECT {_ROWS.format(cols="d.oid, d.xmin", order="d.oid")} FROM pg_attrdef d WHERE d.adrelid = c.oid),
    (SELECT {_ROWS.format(cols="i.indexrelid, i.xmin, ic.xmin", order="i.indexrelid")}
     FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid),
    (SELECT {_ROWS.format(cols="k.oid, k.xmin", order="k.oid")} FROM pg_constraint k WHERE k.conrelid = c.oid)
  ), ',' ORDER BY c.oid), ''))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'p' AND NOT c.relispartition AND n.nspname NOT IN ('pg_catalog', 'information_schema')
"""  # noqa: S608 - built from our own fragments only
_KEEP = 8  # superhubs (or pattern sets) a process remembers: a worker talks to one, a shard operation to a few

_Key = tuple[object, tuple[TablePattern, ...], str]
_cache: OrderedDict[_Key, tuple[str, dict[TableName, ParentTable]]] = OrderedDict()


async def cached_parents(
    conn: asyncpg.Connection, superhub: object, patterns: Sequence[TablePattern], feeder_key: str
) -> dict[TableName, ParentTable]:
    """`read_parents`, or its last result for the same superhub (`superhub`: what identifies it, its DSN) while
    the catalog's fingerprint is unchanged: one query instead of a dozen."""
    key = (superhub, tuple(patterns), feeder_key)
    fingerprint: str = await conn.fetchval(FINGERPRINT)
    if (known := _cache.get(key)) is not None and known[0] == fingerprint:
        _cache.move_to_end(key)
        return dict(known[1])
    parents = await read_parents(conn, patterns, feeder_key)
    _cache[key] = (fingerprint, dict(parents))
    while len(_cache) > _KEEP:
        _cache.popitem(last=False)
    return parents


def forget() -> None:
    """Drop every cached definition: the next run reads the catalog (after a run failed, whatever the reason)."""
    _cache.clear()
