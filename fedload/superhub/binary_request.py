"""What the superhub asks of a feeder in binary mode: per table, the columns it loads and their types here, as data
(`agent dump --columns=JSON`; the agent decides binary or text per table against its own catalog,
fedload/feeder/binary_plan.py); in every mode, skipping unchanged tables, each table's digest held here.

A table goes whole, as text (as pg_dump would send it, so the importer maps it exactly as in copy mode), where the
feeder's remap drops, adds or orders its columns or bad rows are set aside (`bad_rows = "reject"` bisects text
rows); a remap that only renames asks for the feeder's names and stays binary. A column's
type is sent as 0, text only, where binary input is unsafe here: tsvector's binary input has crashed receiving
backends on strict-alignment CPUs (pgcopydb issue #894).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from fedload.feeder.delta import DeltaRequest
from fedload.log import get_logger
from fedload.names import TableName
from fedload.superhub.schema import Column, ParentTable
from transforms import Remap, TableRemap

__all__ = ["TEXT_ONLY_TYPES", "AskedColumns", "asked_columns", "binary_columns", "digest_requests"]

TEXT_ONLY_TYPES = frozenset({3614, 3643})  # tsvector, tsvector[]
# A table's columns as asked: (the feeder's name, the type OID here; 0: text only), in the superhub's order; None: the
# whole table as text.
AskedColumns = tuple[tuple[str, int], ...] | None

log = get_logger()


def binary_columns(
    parents: Iterable[ParentTable],
    *,
    remap: Remap | None,
    rejects: bool,
    feeder: str = "",
    digests: Mapping[TableName, str] | None = None,
    counters: Mapping[TableName, str] | None = None,
    deltas: Mapping[TableName, DeltaRequest] | None = None,
) -> list[str]:
    """The `--columns` values for `parents` (sorted by table, as `dump_command` sorts `--table`); with `digests`
    (skipping unchanged tables), each asks for the table's digest and states the one held here, if any (null), and
    the table's counters on the feeder when this superhub last loaded it (`counters`, where known); with `deltas`,
    the changed rows of the tables asked in binary (fedload.superhub.delta)."""
    out = []
    for parent in sorted(parents, key=lambda p: p.table):
        rules = remap.for_table(parent.qualified_name) if remap is not None else None
        if whole := _text_reason(rules, rejects=rejects):
            log.info("sync.binary_text_requested", feeder=feeder, table=parent.qualified_name, reason=whole)
        asked = asked_columns(parent, remap=remap, rejects=rejects)
        columns = None if asked is None else [list(column) for column in asked]
        delta = (deltas or {}).get(parent.table) if asked is not None else None
        out.append(_request(parent.table, columns, digests, counters, delta))
    return out


def asked_columns(parent: ParentTable, *, remap: Remap | None, rejects: bool) -> AskedColumns:
    """What `binary_columns` asks of `parent`: its loaded columns under the feeder's names, each with its type OID
    here (0: text only), or None (the whole table as text). The importer holds a binary section to it
    (fedload.superhub.section_head_check)."""
    rules = remap.for_table(parent.qualified_name) if remap is not None else None
    if _text_reason(rules, rejects=rejects):
        return None
    source = {new: old for old, new in rules.rename.items()} if rules is not None else {}
    return tuple((source.get(c.name, c.name), _oid(c)) for c in _loaded(parent))


def digest_requests(
    parents: Iterable[ParentTable], digests: Mapping[TableName, str], counters: Mapping[TableName, str]
) -> list[str]:
    """Copy and inserts modes' `--columns` values, which only ask for each table's digest (pg_dump sends the
    tables whole: columns null), as `binary_columns` does with `digests`."""
    return [_request(p.table, None, digests, counters) for p in sorted(parents, key=lambda p: p.table)]


def _request(
    table: TableName,
    columns: list[list[Any]] | None,
    digests: Mapping[TableName, str] | None,
    counters: Mapping[TableName, str] | None,
    delta: DeltaRequest | None = None,
) -> str:
    """One table's request: its columns; with `digests`, the digest held here (null for none), and its counters where
    they are known; its changed rows by `delta`'s buckets, where asked."""
    request: dict[str, Any] = {"schema": table.schema, "name": table.name, "columns": columns}
    if digests is not None:
        request["digest"] = digests.get(table)
        if counters and table in counters:
            request["counters"] = counters[table]
    if delta is not None:
        state = delta.state.to_json() if delta.state is not None else None
        request["delta"] = {"key": list(delta.key), "buckets": delta.buckets, "state": state, "append": delta.append}
    return json.dumps(request)


def _text_reason(rules: TableRemap | None, *, rejects: bool) -> str:
    if rejects:
        return 'bad_rows = "reject" sets bad rows aside one by one, from text'
    if rules is not None and (rules.drop or rules.add or rules.order is not None):
        return "the feeder's remap drops, adds or orders this table's columns"
    return ""


def _loaded(parent: ParentTable) -> list[Column]:
    """The columns a dump may fill: not the generated ones. The feeder key is asked for too: a feeder that has such
    a column must hold its own key there, as in copy mode; one that has not gets the key as the default."""
    return [c for c in parent.columns if c.generated_sql is None]


def _oid(column: Column) -> int:
    return 0 if column.binary_type_oid in TEXT_ONLY_TYPES else column.binary_type_oid
