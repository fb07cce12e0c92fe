"""Planner statistics carried from a feeder instead of an ANALYZE on the superhub (PostgreSQL 18 at both ends;
docs/statistics.md, "Statistics carried").

pg_dump's `pg_restore_relation_stats`/`pg_restore_attribute_stats` calls are data: parsed with PostgreSQL's own
grammar (pglast), accepted only in exactly pg_dump's shape and for this feeder's tables, never run
(`StatisticsCollector`). After the load the superhub makes its own calls, with bind parameters, on each staging
table, and leaves what it could not carry to an ANALYZE after the commit, as narrow as it can be.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import asyncpg

from fedload.errors import DumpError
from fedload.log import get_logger
from fedload.names import TableName, identifier_refusal
from fedload.superhub.schema import PARTS_SCHEMA, STAGE_SCHEMA, ident
from fedload.superhub.statistics_bounds import ColumnLimits, call_bytes_bound, column_refusal

if TYPE_CHECKING:
    from pglast import ast

    from fedload.config import FeederConfig
    from fedload.superhub.schema import ParentTable
    from fedload.superhub.staged import StagedTable
    from transforms import Statement

__all__ = [
    "STATISTICS_SINCE_MAJOR",
    "StatisticsCall",
    "StatisticsCollector",
    "carry_statistics",
    "max_call_bytes",
    "parse_statistics_call",
    "statistics_modules",
    "wants_statistics",
]

log = get_logger()

STATISTICS_SINCE_MAJOR = 18  # pg_dump --statistics and pg_restore_*_stats(): PostgreSQL 18
_RELATION = "pg_restore_relation_stats"
_ATTRIBUTE = "pg_restore_attribute_stats"
_NAMED = re.compile(rb"pg_restore_(?:relation|attribute)_stats", re.IGNORECASE)
_FEDLOAD_SCHEMAS = frozenset({"fedload", STAGE_SCHEMA, PARTS_SCHEMA})
_STALE_ROWS, _STALE_FRACTION = 50, 0.1  # autovacuum_analyze_threshold and _scale_factor's defaults

# Every argument a call may name, with its SQL type; pg_dump 18 writes no other.
_TYPES = {
    "version": "integer",
    "schemaname": "text",
    "relname": "text",
    "relpages": "integer",
    "reltuples": "real",
    "relallvisible": "integer",
    "relallfrozen": "integer",
    "attname": "text",
    "attnum": "smallint",
    "inherited": "boolean",
    "null_frac": "real",
    "avg_width": "integer",
    "n_distinct": "real",
    "most_common_vals": "text",
    "most_common_freqs": "real[]",
    "histogram_bounds": "text",
    "correlation": "real",
    "most_common_elems": "text",
    "most_common_elem_freqs": "real[]",
    "elem_count_histogram": "real[]",
    "range_length_histogram": "text",
    "range_empty_frac": "real",
    "range_bounds_histogram": "text",
}
_RELATION_ARGS = frozenset(
    {"version", "schemaname", "relname", "relpages", "reltuples", "relallvisible", "relallfrozen"}
)
_ATTRIBUTE_ARGS = frozenset(_TYPES) - _RELATION_ARGS | {"version", "schemaname", "relname"}
_IDENTITY_ARGS = frozenset({"version", "schemaname", "relname", "attname", "attnum", "inherited"})
# The column statistics fedload passes on, in this order.
_COLUMN_STATS = tuple(name for name in _TYPES if name in _ATTRIBUTE_ARGS - _IDENTITY_ARGS)
# How pglast names a cast to each type (pg_dump writes `'4'::integer`, `'{1}'::real[]`): (names, array).
_CASTS = {
    "integer": (("pg_catalog", "int4"), False),
    "smallint": (("pg_catalog", "int2"), False),
    "real": (("pg_catalog", "float4"), False),
    "real[]": (("pg_catalog", "float4"), True),
    "boolean": (("pg_catalog", "bool"), False),
    "text": (("text",), False),
}
_REAL = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|NaN|-?Infinity"
_VALUES = {
    "integer": re.compile(r"[+-]?\d{1,10}"),
    "smallint": re.compile(r"[+-]?\d{1,5}"),
    "real": re.compile(_REAL),
    "real[]": re.compile(r"\{[-+.0-9A-Za-z,]*\}"),  # its numbers: _is_real_array (no nested repetition)
    "boolean": re.compile(r"t|f|true|false", re.IGNORECASE),
    "text": re.compile(r"[^\x00]*", re.DOTALL),
}


@dataclass(frozen=True, slots=True)
class StatisticsCall:
    """One checked call: which function (`_RELATION` or `_ATTRIBUTE`) and its arguments' values, as written."""

    function: str
    args: Mapping[str, str]

    @property
    def table(self) -> TableName:
        """The relation the call is about."""
        return TableName(self.args["schemaname"], self.args["relname"])


def wants_statistics(superhub_major: int, *, carry: bool, agent: bool) -> bool:
    """Whether to ask the feeder's agent for statistics: the superhub can restore them, the setting allows it,
    and the agent (which knows its pg_dump's version) runs there."""
    return carry and agent and superhub_major >= STATISTICS_SINCE_MAJOR


def statistics_modules(feeders: Iterable[FeederConfig]) -> tuple[str, ...]:
    """The parser a worker's runs import to read the statistics `feeders` may send (pglast, ~25-60 ms), for a worker
    process to import before its first run: where any feeder may carry them. Whether the superhub is PostgreSQL 18
    is known only once connected; importing pglast once, in the process that forks the workers, costs less than
    once in each worker after the fork, on the cores the load needs."""
    carried = any(wants_statistics(STATISTICS_SINCE_MAJOR, carry=f.carry_statistics, agent=f.agent) for f in feeders)
    return ("pglast",) if carried else ()


def parse_statistics_call(text: str) -> StatisticsCall:
    """The call `text` makes, if it is exactly a pg_dump statistics call; ValueError saying why not."""
    from pglast import ast, parse_sql  # noqa: PLC0415 - heavy: only runs that carry statistics need it
    from pglast.parser import ParseError  # noqa: PLC0415

    try:
        statements = parse_sql(text)
    except ParseError as exc:
        raise ValueError(f"it does not parse ({exc})") from None
    if len(statements) != 1 or not isinstance(select := statements[0].stmt, ast.SelectStmt):
        raise ValueError("it is not one SELECT")
    call = _only_function(select)
    names = tuple(str(n.sval) for n in call.funcname or () if isinstance(n, ast.String))
    if names not in (("pg_catalog", _RELATION), ("pg_catalog", _ATTRIBUTE)):
        raise ValueError(f"it calls {'.'.join(names) or 'something'}, not pg_catalog.{_RELATION} or {_ATTRIBUTE}")
    if any(getattr(call, a) for a in ("agg_order", "agg_filter", "over", "agg_within_group", "agg_star")):
        raise ValueError("the call has clauses pg_dump never writes")
    if call.agg_distinct or call.func_variadic:
        raise ValueError("the call has clauses pg_dump never writes")
    function = names[1]
    args = _named_arguments(call.args or (), _RELATION_ARGS if function == _RELATION else _ATTRIBUTE_ARGS)
    if "schemaname" not in args or "relname" not in args:
        raise ValueError("the call does not name its relation (schemaname, relname)")
    for name in ("schemaname", "relname", "attname"):
        if name in args and (wrong := identifier_refusal(args[name])) is not None:
            raise ValueError(f"its {name}: {wrong}")
    return StatisticsCall(function, args)


def _only_function(select: ast.SelectStmt) -> ast.FuncCall:
    """The one function of `SELECT * FROM f(...)`, with nothing else in the statement; ValueError otherwise."""
    from pglast import ast  # noqa: PLC0415 - see parse_statistics_call

    slots = getattr(type(select), "__slots__", ())
    used = [s for s in slots if s not in ("targetList", "fromClause", "limitOption", "op")]
    if any(getattr(select, s) for s in used) or select.op not in (None, 0) or select.limitOption not in (None, 0):
        raise ValueError("it has clauses pg_dump never writes")
    target, source = select.targetList or (), select.fromClause or ()
    star = len(target) == 1 and isinstance(value := target[0].val, ast.ColumnRef) and target[0].name is None
    if not star or len(value.fields or ()) != 1 or not isinstance(value.fields[0], ast.A_Star):
        raise ValueError("it does not select *")
    if len(source) != 1 or not isinstance(range_ := source[0], ast.RangeFunction):
        raise ValueError("it does not select from one function")
    if range_.lateral or range_.ordinality or range_.is_rowsfrom or range_.alias or range_.coldeflist:
        raise ValueError("it has clauses pg_dump never writes")
    functions = range_.functions or ()
    if len(functions) != 1 or len(functions[0]) != 2 or functions[0][1] is not None:
        raise ValueError("it does not select from one function")
    call = functions[0][0]
    if not isinstance(call, ast.FuncCall):
        raise ValueError("it does not select from a function call")  # noqa: TRY004 - one error for every refusal
    return call


def _named_arguments(args: Iterable[ast.Node], allowed: frozenset[str]) -> dict[str, str]:
    """The (name, value) pairs of the call, each a string constant, the value of the name's type."""
    items = list(args)
    if len(items) % 2:
        raise ValueError("its arguments are not name, value pairs")
    out: dict[str, str] = {}
    for name_node, value_node in zip(items[::2], items[1::2], strict=True):
        name = _string(name_node, None)
        if name not in allowed:
            raise ValueError(f"argument {name!r} is not one fedload accepts")
        if name in out:
            raise ValueError(f"argument {name!r} is given twice")
        sql_type = _TYPES[name]
        value = _string(value_node, sql_type)
        if _VALUES[sql_type].fullmatch(value) is None or (sql_type == "real[]" and not _is_real_array(value)):
            raise ValueError(f"argument {name!r} is not a {sql_type}: {value[:40]!r}")
        out[name] = value
    return out


def _is_real_array(value: str) -> bool:
    """Whether `value` (braces around letters, digits, signs, dots, commas) is a real[] literal, number by number:
    one regex of nested repetition over a 24 MiB array took 3 GB of the regex engine's stack."""
    real = _VALUES["real"]
    return value == "{}" or all(real.fullmatch(n) is not None for n in value[1:-1].split(","))


def _string(node: ast.Node, sql_type: str | None) -> str:
    """A string constant, bare or cast to `sql_type` (None: bare only); ValueError for anything else."""
    from pglast import ast  # noqa: PLC0415 - see parse_statistics_call

    if isinstance(node, ast.TypeCast) and sql_type is not None:
        type_name = node.typeName
        if type_name is None or (type_name.typmods or type_name.setof or type_name.pct_type):
            raise ValueError(f"a value is cast to another type than {sql_type}")
        names = tuple(str(n.sval) for n in type_name.names or () if isinstance(n, ast.String))
        if (names, bool(type_name.arrayBounds)) != _CASTS[sql_type]:
            raise ValueError(f"a value is cast to another type than {sql_type}")
        return _string(node.arg, None) if node.arg is not None else _string(node, None)
    if not isinstance(node, ast.A_Const) or node.isnull or not isinstance(node.val, ast.String):
        raise ValueError("an argument is not a string constant")
    return str(node.val.sval)


@dataclass(slots=True)
class _TableStatistics:
    relation: StatisticsCall | None = None
    columns: dict[str, StatisticsCall] = field(default_factory=dict)  # by the feeder's column name


class StatisticsCollector:
    """Takes the dump's statistics calls for the importer (`offer`), keeps this feeder's tables' ones."""

    def __init__(
        self,
        feeder: str,
        tables: Collection[TableName],
        others: Collection[TableName],
        *,
        max_call_bytes: int | None = None,
    ) -> None:
        """`tables`: the feeder's (its dump's); `others`: the superhub's other parents (not in this feeder's dump).
        Configured patterns are not enough to tell: `public.__*` also matches the feeder's index names.
        `max_call_bytes`: the longest call read (`max_call_bytes()`); a longer one drops all of the dump's
        statistics unread (None: no bound but the statement's)."""
        self.feeder = feeder
        self._max_call_bytes = max_call_bytes
        self.dropped: str | None = None  # why none of the dump's statistics are carried
        self._tables = frozenset(tables)
        self._others = frozenset(others) - self._tables
        self.kept: dict[TableName, _TableStatistics] = {}
        self.set_aside = 0  # calls for other relations (the feeder's indexes)

    def offer(self, item: Statement) -> bool:
        """True if `item` is a statistics call, checked and kept or set aside; False if it names neither
        function (the importer's own checks apply); DumpError if it names one but is not exactly a call fedload
        accepts, or is about a table of the superhub that is not this feeder's."""
        if _NAMED.search(item.text) is None:
            return False
        where = f"dump line {item.line}" if getattr(item, "line", None) is not None else "dump"
        if self._max_call_bytes is not None and len(item.text) > self._max_call_bytes:
            # Parsing it would cost the superhub seconds (pglast reads ~20 MB/s) for statistics it cannot keep;
            # which table it is about is unknown unread: every table is analyzed instead.
            limit = self._max_call_bytes
            self.dropped = f"{where}: a statistics call of {len(item.text)} bytes, longer than ANALYZE's could be "
            self.dropped += f"here ({limit} bytes at the superhub's statistics targets)"
            return True
        try:
            call = parse_statistics_call(item.text.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            reason = "it is not valid UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)
            raise DumpError(f"{where}: a statistics call of feeder {self.feeder} is refused: {reason}") from None
        self._keep(call, where)
        return True

    def _keep(self, call: StatisticsCall, where: str) -> None:
        table = call.table
        if table not in self._tables:
            if table.schema in _FEDLOAD_SCHEMAS or table in self._others:
                raise DumpError(f"{where}: feeder {self.feeder} sends statistics for table {table}, not its own")
            self.set_aside += 1  # an index of the feeder's, or anything else: never applied
            return
        stats = self.kept.setdefault(table, _TableStatistics())
        if call.function == _RELATION:
            if stats.relation is not None:
                raise DumpError(f"{where}: the statistics of table {table} are given twice")
            stats.relation = call
            return
        column = call.args.get("attname")
        if column is None:
            raise DumpError(f"{where}: a statistics call for table {table} names no column (attname)")
        if call.args.get("inherited", "f").lower() in ("t", "true"):
            return  # a partitioned feeder table's whole-tree statistics: the superhub's parent is its own
        if column in stats.columns:
            raise DumpError(f"{where}: the statistics of column {column} of table {table} are given twice")
        stats.columns[column] = call


_DEFAULT_TARGET = "SELECT current_setting('default_statistics_target')::integer"
# Each column's type width, whether an expression index needs ANALYZE, and what ANALYZE would write for it here
# (fedload.superhub.statistics_bounds): its statistics target, whether its values' and elements' text is their
# stored form (string types), with the partition's bytes and the server's page size.
_COLUMNS = """
SELECT a.attname, t.typlen, EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indrelid = a.attrelid
                                    AND i.indexprs IS NOT NULL),
       coalesce(nullif(a.attstattarget, -1), current_setting('default_statistics_target')::integer),
       t.typcategory = 'S', coalesce(e.typcategory = 'S', false),
       pg_catalog.pg_table_size(a.attrelid), current_setting('block_size')::integer
FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_catalog.pg_type e ON e.oid = t.typelem AND t.typcategory = 'A'
WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
# Autovacuum would analyze the same rows again (it counts the loaded ones as changes since the last ANALYZE):
# the partition's threshold is set above its size, so only a change of more rows than it holds triggers one. An
# absolute threshold: the scale factor multiplies reltuples, which autovacuum's insert-triggered VACUUM lowers to
# an estimate (measured: 18,000 rows became 14,881, and the ANALYZE came a minute later).
_NO_AUTOANALYZE = (
    "ALTER TABLE {table} SET (autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = {threshold})"
)
_MAX_THRESHOLD = 2**31 - 1
# The superhub's own pages and the rows loaded (the planner scales reltuples by the table's actual size; the
# feeder's pages are not the superhub's); relallvisible, read by index-only scans alone, stays as the index builds
# set it.
_RELATION_CALL = """
SELECT pg_catalog.pg_restore_relation_stats(
    'schemaname', $1::text, 'relname', $2::text,
    'relpages', (pg_catalog.pg_relation_size($3::regclass) / current_setting('block_size')::bigint)::integer,
    'reltuples', $4::real)
"""


async def max_call_bytes(conn: asyncpg.Connection, parents: Iterable[ParentTable]) -> int:
    """The longest statistics call worth reading for `parents`: the longest ANALYZE's output could need at their
    columns' highest statistics target on the superhub (default_statistics_target where none is set)."""
    default: int = await conn.fetchval(_DEFAULT_TARGET)
    targets = [c.statistics_target for p in parents for c in p.columns if c.statistics_target is not None]
    return call_bytes_bound(max([default, *targets]))


async def carry_statistics(
    conn: asyncpg.Connection,
    staged: Iterable[StagedTable],
    collector: StatisticsCollector,
    *,
    feeder_key: str,
) -> dict[TableName, tuple[str, ...]]:
    """Give each staging table the feeder's statistics (see the module docstring), in the caller's transaction,
    after its indexes are built. The tables done, each with the columns an ANALYZE must still gather (empty:
    none); a table not listed is ANALYZEd whole, as without statistics. A table whose calls fail is rolled back
    to its savepoint and left to ANALYZE."""
    done: dict[TableName, tuple[str, ...]] = {}
    if collector.set_aside:
        log.debug("statistics.set_aside", feeder=collector.feeder, calls=collector.set_aside)
    if collector.dropped is not None:
        for table in staged:
            log.warning(
                "statistics.refused", feeder=collector.feeder, table=str(table.parent.table), reason=collector.dropped
            )
        return done
    for table in staged:
        name = table.parent.table
        if (reason := _not_carried(collector.kept.get(name), table.rows)) is not None:
            log.info("statistics.not_carried", table=str(name), reason=reason)
            continue
        stats = collector.kept[name]
        try:
            async with conn.transaction():
                missing = await _carry_table(conn, table, stats, feeder_key, feeder=collector.feeder)
        except asyncpg.PostgresError as exc:
            log.warning("statistics.not_carried", table=str(name), reason=str(exc))
            continue
        if missing is not None:
            done[name] = missing
            log.info("statistics.carried", table=str(name), analyze_columns=list(missing))
    return done


def _not_carried(stats: _TableStatistics | None, rows: int) -> str | None:
    """Why a table's statistics are not carried (ANALYZE instead); None if they are: the feeder sent them, and
    its row count (reltuples) is within autovacuum's default analyze threshold (50 rows and 10%) of the rows
    loaded, else they describe older data than the dump's."""
    if stats is None or stats.relation is None or (not stats.columns and rows > 0):
        return "the feeder sent none"
    feeder_rows = float(stats.relation.args.get("reltuples", "-1"))
    stale = not math.isfinite(feeder_rows) or abs(rows - feeder_rows) > _STALE_ROWS + _STALE_FRACTION * feeder_rows
    if rows > 0 and (feeder_rows < 0 or stale):
        return f"older than the data: the feeder counted {feeder_rows:.0f} rows, the dump has {rows}"
    return None


async def _carry_table(
    conn: asyncpg.Connection, table: StagedTable, stats: _TableStatistics, feeder_key: str, *, feeder: str
) -> tuple[str, ...] | None:
    """The calls for one table; the columns left to ANALYZE, or None for the whole table."""
    rows = await conn.fetch(_COLUMNS, table.stage_sql)
    if any(row[2] for row in rows):
        log.info("statistics.not_carried", table=str(table.parent.table), reason="an expression index")
        return None
    by_target = {table.from_dump.get(column): call for column, call in stats.columns.items()}
    by_target.pop(feeder_key, None)  # computed, whatever the feeder says
    if table.rows > 0 and (reason := _refusal(rows, by_target, table.rows)) is not None:
        log.warning("statistics.refused", feeder=feeder, table=str(table.parent.table), reason=reason)
        return None
    await conn.fetchval(_RELATION_CALL, STAGE_SCHEMA, table.stage_name, table.stage_sql, float(table.rows))
    if table.rows == 0:
        return ()  # ANALYZE of an empty table writes no column statistics either
    widths = {row[0]: row[1] for row in rows if row[3] != 0}  # target 0: ANALYZE writes nothing for the column
    missing = []
    for column, width in widths.items():
        if column == feeder_key:
            restored = await _restore_key(conn, table, column)
        elif (call := by_target.get(column)) is not None and column in table.from_dump.values():
            restored = await _restore_column(conn, table, column, call, width)
        else:
            restored = False
        if not restored:
            missing.append(column)
    if not missing:
        threshold = min(table.rows + _STALE_ROWS, _MAX_THRESHOLD)
        await conn.execute(_NO_AUTOANALYZE.format(table=table.stage_sql, threshold=threshold))
    return tuple(missing)


def _refusal(columns: Iterable[asyncpg.Record], calls: Mapping[str | None, StatisticsCall], rows: int) -> str | None:
    """Why the table's carried column statistics are more than ANALYZE could write on the superhub
    (fedload.superhub.statistics_bounds): the first column's reason; None if every column is within bounds."""
    for column in columns:
        if (call := calls.get(column[0])) is None or column[3] == 0:
            continue
        limits = ColumnLimits(column[3], column[4], column[5], rows=rows, table_bytes=column[6], block_size=column[7])
        if (reason := column_refusal(call.args, limits)) is not None:
            return f"column {column[0]}: {reason}"
    return None


async def _restore_column(
    conn: asyncpg.Connection, table: StagedTable, column: str, call: StatisticsCall, width: int
) -> bool:
    """The feeder's statistics of one column, under its superhub name; whether all of them were taken."""
    values = {n: v for n, v in call.args.items() if n in _COLUMN_STATS}
    if width > 0:
        values["avg_width"] = str(width)  # a fixed-width type's width is the superhub's, whatever the feeder's
    return await _restore(conn, table, column, values, call.args.get("version"))


async def _restore_key(conn: asyncpg.Connection, table: StagedTable, column: str) -> bool:
    """The feeder key's statistics, computed: one value, never NULL, its stored width read from a row."""
    key = ident(column)
    row = await conn.fetchrow(
        f"SELECT ARRAY[{key}]::text, pg_catalog.pg_column_size({key}) FROM {table.stage_sql} LIMIT 1"  # noqa: S608
    )
    if row is None:
        return False
    values = {
        "null_frac": "0",
        "avg_width": str(row[1]),
        "n_distinct": "1",
        "most_common_vals": row[0],
        "most_common_freqs": "{1}",
        "correlation": "1",
    }
    return await _restore(conn, table, column, values, None)


async def _restore(
    conn: asyncpg.Connection, table: StagedTable, column: str, values: Mapping[str, str], version: str | None
) -> bool:
    """fedload's own pg_restore_attribute_stats call: argument names from the allowlist, every value bound."""
    params: list[object] = [STAGE_SCHEMA, table.stage_name, column]
    parts = ["'schemaname', $1::text", "'relname', $2::text", "'attname', $3::text", "'inherited', false"]
    if version is not None:
        params.append(version)
        parts.append(f"'version', ${len(params)}::text::integer")
    for name in _COLUMN_STATS:
        if name in values:
            params.append(values[name])
            parts.append(f"'{name}', ${len(params)}::text::{_TYPES[name]}")
    restored: bool = await conn.fetchval(f"SELECT pg_catalog.pg_restore_attribute_stats({', '.join(parts)})", *params)
    return restored
