"""Load one feeder's dump items into fresh staging tables on the superhub: the trust boundary.

Nothing from the dump is executed as written. COPY blocks stream into staging tables through asyncpg's COPY with
a column list fedload builds; INSERT tuples are checked to be lists of plain literals and re-sent inside
INSERT statements fedload builds for its own staging table. The few statements pg_dump writes around the data
(known `SET`s, `set_config('search_path')`, `setval`, `\\restrict`) are checked and ignored; statistics calls
go to fedload.superhub.statistics when the run asked for them; anything else rejects the dump. The caller runs
the load inside one transaction, so a rejected dump leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import cast

import asyncpg

from fedload.config import DEFAULT_RECEIVED_STATEMENT_BYTES, BadRows, ExtraColumns
from fedload.errors import DumpError
from fedload.feeder.delta import DeltaRequest
from fedload.log import get_logger
from fedload.names import TableName, TablePattern, columns_refusal
from fedload.superhub.binary_framing import FIXED_WIDTHS, BinaryFraming
from fedload.superhub.binary_receive import BinaryEnd, BinaryRows, BinaryStart, SectionItem, UnchangedTable
from fedload.superhub.binary_request import asked_columns
from fedload.superhub.data_refusals import is_data_refusal, refused_data
from fedload.superhub.delta import StagedDelta, checked_delta
from fedload.superhub.literal_copy import CSV_NULL, CSV_QUOTE, copy_rows_pattern, csv_rows
from fedload.superhub.rejects import RejectWriter
from fedload.superhub.schema import STAGE_SCHEMA, ParentTable, ident, key_literal
from fedload.superhub.section_head_check import check_binary_head
from fedload.superhub.staged import StagedTable
from fedload.superhub.statistics import StatisticsCollector
from transforms import (
    CopyEnd,
    CopyRows,
    CopyStart,
    Insert,
    InsertRows,
    Item,
    MetaCommand,
    Remap,
    RemapError,
    Statement,
    TableRemap,
    Verbatim,
    announced_tables,
    split_tuple,
)
from transforms.lexical import split_identifiers, unquote_identifier
from transforms.remap import ColumnPlan

__all__ = ["ImportPolicy", "Importer"]

log = get_logger()
AnyItem = Item | SectionItem  # a pg_dump's items, or a binary-mode stream's

_SETTINGS = frozenset(
    b"statement_timeout lock_timeout idle_in_transaction_session_timeout transaction_timeout client_min_messages "
    b"check_function_bodies xmloption row_security default_tablespace default_table_access_method "
    b"default_with_oids".split()
)
_REQUIRED_SETTINGS = {b"client_encoding": (b"'utf8'",), b"standard_conforming_strings": (b"on",)}
_SET = re.compile(rb"SET\s++(?:SESSION\s++)?(\w++)\s*+(?:=|TO)\s*+('[^']*+'|[\w.+-]++)\s*+;", re.IGNORECASE)
_HARMLESS = re.compile(
    rb"SELECT\s++pg_catalog\.set_config\('search_path',\s*+'',\s*+false\)\s*+;"
    rb"|SELECT\s++pg_catalog\.setval\('(?>(?:[^']|'')+)',\s*+-?\d++,\s*+(?:true|false)\)\s*+;",
    re.IGNORECASE,
)
_META = re.compile(rb"\\(?:un)?restrict\s++[A-Za-z0-9]++\s*+")
# A repeated group is an atomic group, never a possessive one: Python 3.11.0-3.11.4 (Debian 12's 3.11.2) let a
# possessive group keep the half of an iteration that failed, accepting '(1,)' (CPython gh-106052, fixed in 3.11.5).
_LITERAL = (  # unrolled loops ([^']*+ runs in C), commonest alternative first: this runs once per value
    rb"(?:'[^']*+(?>(?:''[^']*+)*)'"
    rb"|(?i:NULL|TRUE|FALSE|DEFAULT)"
    rb"|[+-]?(?:\d++(?:\.\d*+)?|\.\d++)(?:[eE][+-]?\d++)?"
    rb"|[Ee]'[^'\\]*+(?>(?:(?:\\.|'')[^'\\]*+)*)'"
    rb"|[BbXx]'[0-9A-Fa-f]*+')"
)
_LITERAL_TUPLE = re.compile(rb"\(\s*+" + _LITERAL + rb"(?>(?:\s*+,\s*+" + _LITERAL + rb")*)\s*+\)", re.DOTALL)
_ROWS_PER_INSERT = 1000


@dataclass(frozen=True, slots=True)
class ImportPolicy:
    """What the importer accepts from feeders."""

    feeder_key: str
    table_patterns: tuple[TablePattern, ...]
    extra_columns: ExtraColumns = "warn"
    bad_rows: BadRows = "fail"
    max_statement_bytes: int = DEFAULT_RECEIVED_STATEMENT_BYTES  # of one statement or COPY row held (receive.py)


class Importer:
    """Loads one dump into staging tables named `<stage_prefix>_<n>`; see the module docstring."""

    def __init__(
        self,
        conn: asyncpg.Connection,
        *,
        feeder: str,
        key: int | str,
        stage_prefix: str,
        parents: dict[TableName, ParentTable],
        policy: ImportPolicy,
        run_id: int | None = None,
        remap: Remap | None = None,
        statistics: StatisticsCollector | None = None,
        deltas: Mapping[TableName, DeltaRequest] | None = None,
        stored_rows: Mapping[TableName, int] | None = None,
    ) -> None:
        self._conn = conn
        self._deltas = deltas or {}  # the changed rows asked for (fedload.superhub.delta)
        self._stored_rows = stored_rows or {}  # of those tables, the rows their partitions held when last stored
        self._statistics = statistics  # takes the dump's statistics calls (fedload.superhub.statistics)
        self._feeder = feeder
        self._key = key
        self._policy = policy
        self._remap = remap
        taken = frozenset().union(*(p.constraint_names for p in parents.values()))
        self._key_constraint = _free_name("fedload_feeder_key", taken)  # one name that no parent uses
        self.staged = {
            name: StagedTable(parent, f"{stage_prefix}_{i}") for i, (name, parent) in enumerate(sorted(parents.items()))
        }
        self._announced: set[TableName] = set()
        self._log = log.bind(feeder=feeder, stage_prefix=stage_prefix)
        self._rejects = (
            RejectWriter(conn, feeder=feeder, run_id=run_id, fatal=self._is_key_violation)
            if policy.bad_rows == "reject"
            else None
        )
        self._run_key: object = None  # the INSERT target being loaded; consecutive INSERTs continue it
        self._run_target: StagedTable | None = None
        self._run_plan: ColumnPlan | None = None
        self._run_copy: re.Pattern[bytes] | None = None  # the run's tuples that may go by COPY

    async def load(self, dump: AsyncIterator[AnyItem]) -> None:
        """Consume the dump; DumpError for anything not allowed, or for a staging table the dump does not fill."""
        items = _GivenBack(dump)
        async for item in items:
            if not isinstance(item, InsertRows | Verbatim):
                self._run_key = None
            if isinstance(item, CopyStart):
                await self._copy(item, items)
            elif isinstance(item, BinaryStart):
                await self._copy_binary(item, items)
            elif isinstance(item, UnchangedTable):
                await self._keep(item)
            elif isinstance(item, InsertRows):
                await self._insert(item, items)
            elif isinstance(item, Statement):
                self._statement(item)
            elif isinstance(item, MetaCommand):
                _check_meta(item)
            elif isinstance(item, Verbatim):
                self._note_announced(item.text)
            else:
                raise DumpError(f"unexpected {type(item).__name__} outside a COPY block")
        self._check_complete()
        for staged in self.staged.values():  # a table the dump announced with no data (inserts mode): empty
            if staged.kept is None and not staged.created:
                await self._create_stage(staged)
        self._log_inserted()

    def _statement(self, item: Statement) -> None:
        """A statement other than INSERT: a statistics call kept for later, else one of the few allowed."""
        if self._statistics is None or not self._statistics.offer(item):
            _check_statement(item)

    def _log_inserted(self) -> None:
        for staged in self.staged.values():
            if staged.inserted:
                self._log.info(
                    "import.table_loaded",
                    table=staged.parent.qualified_name,
                    rows=staged.rows,
                    rows_by_copy=staged.rows_by_copy,
                    statements_read_once=staged.read_once,
                    mode="inserts",
                )

    def _note_announced(self, text: bytes) -> None:
        """pg_dump's "-- Data for Name: t; Type: TABLE DATA" line: the table is in the dump, maybe empty."""
        for schema, name in announced_tables(text):
            table = TableName(schema, name)
            self._announced.add(table)
            if (staged := self.staged.get(table)) is not None:
                staged.present = True

    def _check_complete(self) -> None:
        """Every staging table must have been filled by the dump, and every remapped table must be in it."""
        missing = [str(t) for t, s in self.staged.items() if not s.present]
        if missing:
            raise DumpError(
                f"the dump of feeder {self._feeder} lacks table(s) {', '.join(missing)}: fedload will not replace "
                f"their data with nothing (if the feeder no longer has them, list them in "
                f"feeders.{self._feeder}.exclude_tables)"
            )
        seen = {str(t) for t in self._announced | {t for t, s in self.staged.items() if s.loaded}}
        if self._remap is not None and (unknown := sorted(set(self._remap.tables) - seen)):
            raise DumpError(f"the remap of feeder {self._feeder} names table(s) not in its dump: {', '.join(unknown)}")

    async def _keep(self, item: UnchangedTable) -> None:
        """A table the feeder did not send, its digest unchanged: no staging table; the run checks and keeps its
        partition (fedload.superhub.unchanged)."""
        staged = self._target(item.table.sql.encode(), item)
        if staged is None:  # no digest of it was asked: nothing of it is kept
            raise DumpError(f"feeder {self._feeder} says table {item.table} is unchanged, but it is not loaded here")
        staged.kept = item
        self._log.info("import.table_unchanged", table=staged.parent.qualified_name, rows=item.rows)

    async def finish(self) -> None:
        """Build the parent's indexes on each staging table, after the load (faster than maintaining them).

        An index that backs the parent's primary key or unique constraint is built as such a constraint: ATTACH
        matches a constraint only with a constraint, and would otherwise build the index again."""
        for staged in self.staged.values():
            if staged.kept is not None or staged.changes_only is not None:  # changes go to the indexed partition
                continue
            with self._key_checked(staged):  # a duplicate key is the dump's
                await self._build_indexes(staged)

    async def _build_indexes(self, staged: StagedTable) -> None:
        for index in staged.parent.indexes:
            if index.constraint_sql is not None:
                await self._conn.execute(f"ALTER TABLE {staged.stage_sql} ADD {index.constraint_sql}")
            else:
                unique = "UNIQUE " if index.unique else ""
                await self._conn.execute(f"CREATE {unique}INDEX ON {staged.stage_sql} {index.body}")

    async def _create_stage(self, staged: StagedTable) -> None:
        """The staging table: the parent's columns with their types, collations, NOT NULLs, defaults and generated
        expressions, the parent's CHECKs under their names (ATTACH requires all that), the key as default, and the
        partition constraint, so that ATTACH needs no validating scan and the load checks it row by row on the way
        in. Built from the catalog, not with LIKE, which would hold a lock on the parent until the swap and block
        other feeders' swaps. Identity is left out: values come from the feeder, and PostgreSQL 17+ refuses to
        attach a partition with an identity column. The parent's per-column statistics targets are set on it, for
        the ANALYZE after the swap."""
        key, key_default = ident(self._policy.feeder_key), key_literal(self._key)
        parent = staged.parent
        definitions = [c.definition(key_default if c.name == self._policy.feeder_key else None) for c in parent.columns]
        definitions += [f"CONSTRAINT {ident(name)} {check}" for name, check in parent.checks]
        definitions.append(
            f"CONSTRAINT {ident(self._key_constraint)} CHECK ({key} IS NOT NULL AND {key} = {key_default})"
        )
        statements = [f"CREATE TABLE {staged.stage_sql} ({', '.join(definitions)})"]
        if targets := _statistics_targets(parent):
            statements.append(f"ALTER TABLE {staged.stage_sql} {targets}")
        await self._conn.execute(";\n".join(statements))
        staged.created = True

    async def _staged(self, written_table: bytes, where: AnyItem) -> StagedTable | None:
        """`_target`, its staging table created at the table's first data: a table the feeder keeps (unchanged)
        gets none, as it has no data."""
        staged = self._target(written_table, where)
        if staged is not None and not staged.created:
            await self._create_stage(staged)
        return staged

    def _target(self, written_table: bytes, where: AnyItem) -> StagedTable | None:
        """The staging table for a dump table; None to skip it; DumpError if the feeder must not send it."""
        try:
            name = TableName.from_dump(written_table)
        except ValueError as exc:
            raise DumpError(f"{_where(where)}: {exc}") from None
        staged = self.staged.get(name)
        if staged is not None:
            if staged.loaded:
                raise DumpError(f"{_where(where)}: table {name} appears twice in the dump")
            staged.loaded = staged.present = True
            return staged
        if not any(p.matches(name) for p in self._policy.table_patterns):
            raise DumpError(f"{_where(where)}: the dump contains table {name}, which is not configured")
        if self._policy.extra_columns == "error":
            raise DumpError(f"{_where(where)}: table {name} has no partitioned parent on the superhub")
        self._log.warning(
            "import.table_skipped", table=str(name), reason="no partitioned parent, or excluded for this feeder"
        )
        return None

    def _plan(self, staged: StagedTable, written: tuple[bytes, ...], where: AnyItem) -> ColumnPlan:
        """Which dump columns go where (`_column_plan`), noted on the staging table."""
        plan, from_dump, columns, extra = self._column_plan(staged, written, where)
        if extra:
            self._log.warning("import.columns_dropped", table=staged.parent.qualified_name, columns=extra)
        staged.columns, staged.dropped_columns, staged.from_dump = columns, extra, from_dump
        return plan

    def _column_plan(
        self, staged: StagedTable, written: tuple[bytes, ...], where: AnyItem | None
    ) -> tuple[ColumnPlan, dict[str, str], list[str], list[str]]:
        """Which dump columns go where; the dump columns loaded and the columns they load (after remap); the
        staging table's columns they fill; and the columns the parent lacks: the feeder's remap first, then
        columns the parent lacks (dropped or rejected) and generated ones (computed on the superhub) are left out.
        DumpError if they do not fit; nothing else changes."""
        names = [unquote_identifier(c) for c in written]
        parent = staged.parent
        if (wrong := columns_refusal(names)) is not None:
            raise DumpError(f"{_where(where)}: the columns of {parent.qualified_name}: {wrong}")
        if len(set(names)) != len(names):
            raise DumpError(f"{_where(where)}: a column of {parent.qualified_name} is listed twice")
        rules = self._remap.for_table(parent.qualified_name) if self._remap else None
        rename, add = dict(rules.rename) if rules else {}, dict(rules.add) if rules else {}
        drop = set(rules.drop) if rules else set()
        targets = {n: rename.get(n, n) for n in names if n not in drop}
        extra = [t for t in (*targets.values(), *add) if parent.column(t) is None]
        computed = [t for t in (*targets.values(), *add) if (c := parent.column(t)) and c.generated_sql is not None]
        if extra and self._policy.extra_columns == "error":
            raise DumpError(
                f"{_where(where)}: table {parent.qualified_name} has columns the superhub lacks: {', '.join(extra)}"
            )
        left_out = {*extra, *computed}
        drop |= {n for n, t in targets.items() if t in left_out}
        add = {n: v for n, v in add.items() if n not in left_out}
        rename = {n: t for n, t in rename.items() if n not in drop}
        try:
            plan = TableRemap(parent.qualified_name, rename, frozenset(drop), add, None).plan(names, written)
        except RemapError as exc:
            raise DumpError(
                f"{_where(where)}: the remap of feeder {self._feeder} does not fit the dump: {exc}"
            ) from None
        from_dump = {n: t for n, t in targets.items() if n not in drop}
        return plan, from_dump, [*from_dump.values(), *add], extra

    def _is_key_violation(self, exc: asyncpg.PostgresError) -> bool:
        """The dump carries the feeder key column with a value other than this feeder's key."""
        name = getattr(exc, "constraint_name", None)
        if isinstance(exc, asyncpg.CheckViolationError) and name == self._key_constraint:
            return True
        column = getattr(exc, "column_name", None)
        return isinstance(exc, asyncpg.NotNullViolationError) and column == self._policy.feeder_key

    @contextlib.contextmanager
    def _key_checked(self, staged: StagedTable) -> Iterator[None]:
        """A row whose feeder key is not this feeder's condemns the dump (a misconfigured or lying feeder); so does
        any other refusal of the data by PostgreSQL (fedload.superhub.data_refusals), in the feeder's and the
        table's name."""
        try:
            yield
        except asyncpg.PostgresError as exc:
            table = staged.parent.qualified_name
            if self._is_key_violation(exc):
                raise DumpError(
                    f"table {table}: the dump of feeder {self._feeder} carries the feeder key "
                    f"column {self._policy.feeder_key} with a value other than its key {self._key!r}"
                ) from None
            if is_data_refusal(exc):
                raise refused_data(exc, feeder=self._feeder, table=table) from exc
            raise

    async def _copy(self, start: CopyStart, items: AsyncIterator[AnyItem]) -> None:
        staged = await self._staged(start.table, start)
        if start.columns is None:
            raise DumpError(f"{_where(start)}: a COPY without a column list cannot be mapped safely")
        if staged is None:
            await _skip_copy(items)
            return
        plan = self._plan(staged, tuple(_identifiers(start.columns)), start)
        rewrite = plan.columns != tuple(_identifiers(start.columns))
        source = _copy_data(items, plan if rewrite else None, start)
        with self._key_checked(staged):
            if self._rejects is not None:
                loaded, rejected = await self._rejects.copy(staged.parent, staged.stage_sql, staged.columns, source)
                staged.rows, staged.rejected = staged.rows + loaded, staged.rejected + rejected
            else:
                status = await self._conn.copy_to_table(
                    staged.stage_name, schema_name=STAGE_SCHEMA, columns=staged.columns, source=source, freeze=True
                )
                staged.rows += int(status.rsplit(" ", 1)[1])
        self._log.info("import.table_loaded", table=staged.parent.qualified_name, rows=staged.rows, mode="copy")

    async def _copy_binary(self, start: BinaryStart, items: AsyncIterator[AnyItem]) -> None:
        """A binary section, loaded as it came by binary COPY into the staging table with the column list fedload
        builds (the server checks every value); its columns must all go where they are, as the superhub asked."""
        staged = await self._staged(start.table.sql.encode(), start)
        if staged is None:
            await _skip_binary(items)
            return
        asked = asked_columns(staged.parent, remap=self._remap, rejects=self._rejects is not None)
        check_binary_head(start, asked, feeder=self._feeder)
        self._note_delta(staged, start)
        written = tuple(ident(c).encode() for c in start.columns)
        plan = self._plan(staged, written, start)
        as_sent = plan.sources == tuple(range(len(written)))  # every field where it is (renamed at most)
        if self._rejects is not None or not as_sent or len(staged.columns) != len(written):
            raise DumpError(
                f"table {start.table}: the feeder sent columns {', '.join(start.columns)} in binary, which this "
                "superhub cannot load as they are (it asked for other columns, or for text)"
            )
        self._unsent_columns(staged, start)
        with self._key_checked(staged):
            status = await self._conn.copy_to_table(
                staged.stage_name,
                schema_name=STAGE_SCHEMA,
                columns=staged.columns,
                # asyncpg takes any buffer per item (its CopyData message copies it); its stubs say bytes
                source=cast("AsyncIterator[bytes]", _binary_data(items, start, self._framing(start, staged))),
                format="binary",
                freeze=True,
            )
        staged.rows += int(status.rsplit(" ", 1)[1])
        self._log.info("import.table_loaded", table=staged.parent.qualified_name, rows=staged.rows, mode="binary")

    def _note_delta(self, staged: StagedTable, start: BinaryStart) -> None:
        """The section's delta, checked against the one asked (DumpError otherwise), on its staged table."""
        table = staged.parent.table
        asked = self._deltas.get(table)
        head = checked_delta(start.delta, asked, table=start.table, feeder=self._feeder)
        if head is not None:
            assert asked is not None
            stored = self._stored_rows.get(table, 0)
            counts = asked.state.counts if asked.state is not None else ()
            key = tuple((name, _type_oid(staged.parent, name)) for name in asked.key)
            staged.delta = StagedDelta(staged.parent, staged.stage_sql, key, head, stored, counts)

    def _framing(self, start: BinaryStart, staged: StagedTable) -> BinaryFraming:
        """The check of a binary section's framing, its rows held to `max_statement_bytes`; the widths of its
        columns' types here, where fixed (a faster check, if the data has them)."""
        types = (_type_oid(staged.parent, name) for name in staged.columns)
        return BinaryFraming(
            columns=len(start.columns),
            max_row_bytes=self._policy.max_statement_bytes,
            feeder=self._feeder,
            table=start.table,
            widths=tuple(FIXED_WIDTHS.get(oid, 0) for oid in types),
        )

    def _unsent_columns(self, staged: StagedTable, start: BinaryStart) -> None:
        """The feeder's columns the superhub lacks (so did not ask for): dropped with a warning, or an error, as
        `extra_columns` says; generated columns of the parent are computed here, as in copy mode."""
        extra = [name for name in start.unsent if staged.parent.column(name) is None]
        if extra and self._policy.extra_columns == "error":
            raise DumpError(f"table {staged.parent.qualified_name} has columns the superhub lacks: {', '.join(extra)}")
        if extra:
            self._log.warning("import.columns_dropped", table=staged.parent.qualified_name, columns=extra)
        staged.dropped_columns = extra

    async def _insert(self, item: InsertRows, items: _GivenBack) -> None:
        insert = item.insert
        if insert.batch_key != self._run_key:
            self._run_key = insert.batch_key
            self._run_target = await self._staged(insert.table, item)
            if self._run_target is not None:
                if insert.columns is None:
                    raise DumpError(f"{_where(item)}: INSERTs without column names cannot be mapped (--column-inserts)")
                self._run_plan = self._plan(self._run_target, insert.columns, item)
                self._run_copy = self._copy_pattern(
                    self._run_target, self._run_plan, self._run_target.columns, insert.columns
                )
        staged, plan = self._run_target, self._run_plan
        if staged is None or plan is None:
            return
        staged.inserted = True
        if self._run_copy is not None and self._copies(self._run_copy, insert):
            await self._copy_run(staged, item, items)
            return
        tuples = _checked_tuples(insert, plan, item)
        columns = ", ".join(ident(c) for c in staged.columns)
        head = f"INSERT INTO {staged.stage_sql} ({columns}) VALUES "  # noqa: S608 - quoted names, checked literals
        with self._key_checked(staged):
            for start in range(0, len(tuples), _ROWS_PER_INSERT):
                await self._insert_batch(staged, head, tuples[start : start + _ROWS_PER_INSERT], item)

    @staticmethod
    def _copies(pattern: re.Pattern[bytes], insert: Insert) -> bool:
        """Whether the INSERT's tuples go by COPY: the pattern matches them whole, now or when they were read."""
        return insert.checked_by is pattern or pattern.fullmatch(insert.values) is not None

    def _copy_pattern(
        self, staged: StagedTable, plan: ColumnPlan, columns: list[str], written: tuple[bytes, ...] | None
    ) -> re.Pattern[bytes] | None:
        """The tuples COPY may load for an INSERT target with the `written` column list, filling `columns` of the
        staging table (see fedload.superhub.literal_copy); None: INSERTs only, because bad rows are set aside one by
        one, or the remap rewrites the tuples."""
        if self._rejects is not None or plan.columns != written or len(columns) != plan.input_width:
            return None
        parent_columns = [staged.parent.column(name) for name in columns]
        return copy_rows_pattern(tuple(c.base_type_sql if c else "" for c in parent_columns))

    def tuples_pattern(self, table: bytes, written: tuple[bytes, ...] | None) -> re.Pattern[bytes] | None:
        """The pattern the tuples of an INSERT into `table` (`written` columns), as written, must match to go by
        COPY, as `_insert` will decide it: for the splitter, which reads such a statement in one pass of it
        (transforms.DumpSplitter.read_tuples_with). None where the statement would take the INSERT path or be
        refused. Changes nothing, logs nothing: the splitter asks before the importer sees the statement."""
        if self._rejects is not None or written is None:
            return None
        try:
            staged = self.staged.get(TableName.from_dump(table))
            if staged is None:
                return None
            plan, _, columns, _ = self._column_plan(staged, written, None)
        except (ValueError, DumpError):
            return None
        return self._copy_pattern(staged, plan, columns, written)

    async def _copy_run(self, staged: StagedTable, first: InsertRows, items: _GivenBack) -> None:
        """The statement and those after it in its run that COPY may take (`_next_in_run`), loaded by one COPY as
        CSV rows: one COPY per run, not per statement, and the server reads a statement while the next is read.

        An error while reading the run (a bad dump, the stream) ends the COPY, which the caller's transaction then
        rolls back, and is raised after it, as between statements: not from inside the COPY, where asyncpg would
        abort it with a cancel request to the server."""
        stopped: list[Exception] = []
        with self._key_checked(staged):
            status = await self._conn.copy_to_table(
                staged.stage_name,
                schema_name=STAGE_SCHEMA,
                columns=staged.columns,
                source=self._run_rows(staged, first, items, stopped),
                freeze=True,
                format="csv",
                quote=CSV_QUOTE,
                escape=CSV_QUOTE,
                null=CSV_NULL,
            )
        if stopped:
            raise stopped[0]
        rows = int(status.rsplit(" ", 1)[1])
        staged.rows, staged.rows_by_copy = staged.rows + rows, staged.rows_by_copy + rows

    async def _run_rows(
        self, staged: StagedTable, first: InsertRows, items: _GivenBack, stopped: list[Exception]
    ) -> AsyncIterator[bytes]:
        """The CSV rows of each statement of the run, proven by `_copy_pattern` (`_copies`); the error that ends
        them early goes to `stopped`."""
        item: InsertRows | None = first
        try:
            while item is not None:
                data = csv_rows(item.insert.values)
                _check_text(data, item)  # the same checks (NUL, UTF-8) and errors as on the INSERT path
                staged.read_once += item.insert.checked_by is self._run_copy
                yield data
                item = await self._next_in_run(items)
        except Exception as exc:  # noqa: BLE001 - raised again by _copy_run, once the COPY has ended
            stopped.append(exc)

    def _continues_copy(self, insert: Insert) -> bool:
        """Whether the INSERT continues the run being loaded by COPY."""
        pattern = self._run_copy
        return insert.batch_key == self._run_key and pattern is not None and self._copies(pattern, insert)

    async def _next_in_run(self, items: _GivenBack) -> InsertRows | None:
        """The next INSERT of the run if COPY may take it too, past whitespace and comments (noted as in `load`);
        else None, and the item goes back to `items` for `load`."""
        async for item in items:
            if isinstance(item, Verbatim):
                self._note_announced(item.text)
                continue
            if isinstance(item, InsertRows) and self._continues_copy(item.insert):
                return item
            items.give_back(item)
            return None
        return None

    async def _insert_batch(self, staged: StagedTable, head: str, batch: list[bytes], item: InsertRows) -> None:
        if self._rejects is not None:
            rows = [_text(row, item) for row in batch]
            loaded, rejected = await self._rejects.insert(staged.parent, head, rows)
            staged.rows, staged.rejected = staged.rows + loaded, staged.rejected + rejected
        else:
            await self._conn.execute(head + _text(b",".join(batch), item))
            staged.rows += len(batch)


def _statistics_targets(parent: ParentTable) -> str:
    """The parent's per-column statistics targets as ALTER TABLE actions for a staging table ("" if none is set):
    PostgreSQL does not pass them on to partitions, and fedload makes new partitions at every run, so the parent is
    where an operator sets them (0 leaves a column out of ANALYZE, which makes the ANALYZE after the swap cheaper)."""
    return ", ".join(
        f"ALTER COLUMN {ident(c.name)} SET STATISTICS {int(c.statistics_target)}"
        for c in parent.columns
        if c.statistics_target is not None
    )


def _free_name(name: str, taken: frozenset[str]) -> str:
    """`name`, or `name_2`, `name_3`...: the first that is not taken."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    return candidate


def _text(sql: bytes, item: InsertRows) -> str:
    """`sql` decoded; DumpError if it holds a NUL byte or is not UTF-8."""
    if b"\x00" in sql:  # the superhub's protocol cannot carry it; text values cannot hold it either
        raise DumpError(f"{_where(item)}: a VALUES tuple contains a NUL byte")
    try:
        return sql.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DumpError(f"{_where(item)}: a VALUES tuple is not valid UTF-8") from exc


def _check_text(sql: bytes, item: InsertRows) -> None:
    """`_text`'s checks, without decoding where they cannot fail (ASCII without NUL)."""
    if b"\x00" in sql or not sql.isascii():
        _text(sql, item)


def _identifiers(columns: bytes) -> list[bytes]:
    return split_identifiers(columns)


@functools.lru_cache(maxsize=64)
def _literal_rows(width: int) -> re.Pattern[bytes]:
    """Comma-separated tuples of exactly `width` plain literals each: one regular expression call per batch."""
    row = rb"\(\s*+" + _LITERAL + rb"(?:\s*+,\s*+" + _LITERAL + rb"){%d}\s*+\)" % (width - 1)
    return re.compile(row + rb"(?>(?:," + row + rb")*)", re.DOTALL)


def _checked_tuples(insert: Insert, plan: ColumnPlan | None, item: InsertRows) -> list[bytes]:
    """The tuples, each proven to be a list of plain literals, reduced to the kept columns."""
    if plan is not None and plan.columns == insert.columns and plan.input_width > 0:
        joined = b",".join(insert.tuples)  # what gets sent, checked whole; if it fails, the loop finds the culprit
        if _literal_rows(plan.input_width).fullmatch(joined) is not None:
            return list(insert.tuples)
    out = []
    for row in insert.tuples:
        if _LITERAL_TUPLE.fullmatch(row) is None:
            raise DumpError(f"{_where(item)}: a VALUES tuple is not a list of plain literals: {_snippet(row)}")
        values = split_tuple(row)
        if plan is None or len(values) != plan.input_width:
            raise DumpError(f"{_where(item)}: a VALUES tuple has {len(values)} values for its column list")
        out.append(row if plan.columns == insert.columns else b"(" + b", ".join(plan.apply_values(values)) + b")")
    return out


async def _copy_data(items: AsyncIterator[AnyItem], plan: ColumnPlan | None, start: CopyStart) -> AsyncIterator[bytes]:
    """The COPY block's rows (rewritten by `plan` when columns are dropped), up to its end marker."""
    async for item in items:
        if isinstance(item, CopyEnd):
            return
        assert isinstance(item, CopyRows)
        if plan is None:
            yield item.data
            continue
        lines = item.data.split(b"\n")[:-1]
        fields = [line.split(b"\t") for line in lines]
        if any(len(f) != plan.input_width for f in fields):
            raise DumpError(f"{_where(start)}: a COPY row has another number of fields than the column list")
        yield b"".join(b"\t".join(plan.apply_copy_fields(f)) + b"\n" for f in fields)
    raise DumpError(f"{_where(start)}: the COPY block has no end")


class _GivenBack:
    """The dump's items, to which a reader that went one item too far gives it back, to be read next."""

    def __init__(self, items: AsyncIterator[AnyItem]) -> None:
        self._items = items
        self._back: list[AnyItem] = []

    def __aiter__(self) -> _GivenBack:
        return self

    async def __anext__(self) -> AnyItem:
        return self._back.pop() if self._back else await anext(self._items)

    def give_back(self, item: AnyItem) -> None:
        """`item` is the next item again."""
        assert not self._back, "one item at a time"
        self._back.append(item)


async def _skip_copy(items: AsyncIterator[AnyItem]) -> None:
    async for item in items:
        if isinstance(item, CopyEnd):
            return


async def _binary_data(
    items: AsyncIterator[AnyItem], start: BinaryStart, framing: BinaryFraming
) -> AsyncIterator[bytes | memoryview]:
    """A binary section's data as it came, up to its end, each piece's framing checked before it goes on."""
    async for item in items:
        if isinstance(item, BinaryEnd):
            framing.close()
            return
        assert isinstance(item, BinaryRows)
        framing.scan(item.data)
        yield item.data
    raise DumpError(f"the binary section of table {start.table} has no end")


async def _skip_binary(items: AsyncIterator[AnyItem]) -> None:
    async for item in items:
        if isinstance(item, BinaryEnd):
            return


def _check_statement(item: Statement) -> None:
    text = item.text
    setting = _SET.fullmatch(text)
    if setting is not None:
        name, value = setting[1].lower(), setting[2].lower()
        if name in _SETTINGS or value in _REQUIRED_SETTINGS.get(name, ()):
            return
        setting_text = f"{name.decode(errors='replace')} = {value.decode(errors='replace')}"  # any bytes at all
        raise DumpError(f"{_where(item)}: the dump sets {setting_text}, which fedload refuses")
    if _HARMLESS.fullmatch(text) is None:
        raise DumpError(f"{_where(item)}: the dump contains a statement fedload does not accept: {_snippet(text)}")


def _type_oid(parent: ParentTable, name: str) -> int:
    """The type OID of a column of `parent` (0 for none)."""
    column = parent.column(name)
    return column.binary_type_oid if column is not None else 0


def _check_meta(item: MetaCommand) -> None:
    if _META.fullmatch(item.text) is None:
        raise DumpError(
            f"{_where(item)}: the dump contains a psql command fedload does not accept: {_snippet(item.text)}"
        )


def _where(item: AnyItem | None) -> str:
    """Where `item` is: its line, or its byte offset after COPY data whose lines were not counted."""
    line, offset = getattr(item, "line", None), getattr(item, "offset", None)
    return f"dump line {line}" if line else f"dump byte {offset}" if offset is not None else "dump"


def _snippet(text: bytes) -> str:
    first = text[:60].decode("utf-8", errors="replace").splitlines()[0] if text else ""
    return repr(first + ("..." if len(text) > 60 else ""))
