"""What the superhub asks of a feeder in binary mode: per table, the columns it loads and their types here, as data
(`agent dump --columns=JSON`; the agent decides binary or text per table against its own catalog,
fedload/feeder/binary_plan.py).

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

from fedload.log import get_logger
from fedload.names import TableName
from fedload.superhub.schema import Column, ParentTable
from transforms import Remap, TableRemap

__all__ = ["TEXT_ONLY_TYPES", "binary_columns"]

TEXT_ONLY_TYPES = frozenset({3614, 3643})  # tsvector, tsvector[]

log = get_logger()


def binary_columns(
    parents: Iterable[ParentTable],
    *,
    remap: Remap | None,
    rejects: bool,
    feeder: str = "",
    digests: Mapping[TableName, str] | None = None,
    counters: Mapping[TableName, str] | None = None,
) -> list[str]:
    """The `--columns` values for `parents` (sorted by table, as `dump_command` sorts `--table`); with `digests`
    (skipping unchanged tables), each asks for the table's digest and states the one held here, if any (null), and
    the table's counters on the feeder when this superhub last loaded it (`counters`, where known)."""
    out = []
    for parent in sorted(parents, key=lambda p: p.table):
        rules = remap.for_table(parent.qualified_name) if remap is not None else None
        whole = _text_reason(rules, rejects=rejects)
        if whole:
            log.info("sync.binary_text_requested", feeder=feeder, table=parent.qualified_name, reason=whole)
        source = {new: old for old, new in rules.rename.items()} if rules is not None else {}
        columns = None if whole else [[source.get(c.name, c.name), _oid(c)] for c in _loaded(parent)]
        request: dict[str, Any] = {"schema": parent.table.schema, "name": parent.table.name, "columns": columns}
        if digests is not None:
            request["digest"] = digests.get(parent.table)
            if counters and parent.table in counters:
                request["counters"] = counters[parent.table]
        out.append(json.dumps(request))
    return out


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
