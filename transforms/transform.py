"""The streaming transform: split the dump, merge INSERTs, apply the remap, count rows per table."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from transforms.batch import DEFAULT_MAX_STATEMENT_BYTES, DEFAULT_ROWS_PER_STATEMENT, InsertBatcher
from transforms.errors import DumpSyntaxError, RemapError
from transforms.inserts import Insert, qualified_name, split_tuple, table_key
from transforms.lexical import DEFAULT_SCHEMA, split_identifiers, unquote_identifier
from transforms.remap import ColumnPlan, Remap
from transforms.split import (
    CopyEnd,
    CopyRows,
    CopyStart,
    DumpSplitter,
    InsertRows,
    Item,
    MetaCommand,
    Statement,
    Verbatim,
)

__all__ = [
    "CHUNK_BYTES",
    "TransformOptions",
    "TransformStats",
    "Transformer",
    "announced_tables",
    "transform_stream",
]

CHUNK_BYTES = 1 << 20
# pg_dump writes names unquoted here, so they may hold "; ": the fixed words around them delimit them.
_DATA_COMMENT = re.compile(rb"^-- Data for Name: (.+?); Type: TABLE DATA; Schema: (.+?); Owner: ", re.MULTILINE)


def announced_tables(text: bytes) -> list[tuple[str, str]]:
    """(schema, name) of each table whose data pg_dump announces in `text` ("-- Data for Name: ..."): pg_dump
    writes that line for every table it dumps, also an empty one, whose inserts-mode dump has no statement."""
    return [(s.decode(errors="replace"), n.decode(errors="replace")) for n, s in _DATA_COMMENT.findall(text)]


TableKey = tuple[str, str]  # a table's (schema, name), as PostgreSQL stores them


@dataclass(frozen=True)
class TransformOptions:
    """What the transform does besides passing the dump through."""

    rows_per_statement: int = DEFAULT_ROWS_PER_STATEMENT
    max_statement_bytes: int = DEFAULT_MAX_STATEMENT_BYTES
    remap: Remap | None = None


@dataclass
class TransformStats:
    """Counts of one transform run."""

    rows: Counter[TableKey] = field(default_factory=Counter)
    tables: set[TableKey] = field(default_factory=set)  # (schema, name) of every table the dump carries, empty or not
    bytes_in: int = 0
    bytes_out: int = 0


class Transformer:
    """Push-style transform: `feed()` input bytes, `close()` at the end; both return output pieces."""

    def __init__(self, options: TransformOptions | None = None) -> None:
        self._options = options or TransformOptions()
        self._splitter = DumpSplitter(insert_pieces_after=self._options.max_statement_bytes)
        self._batcher = InsertBatcher(self._options.rows_per_statement, self._options.max_statement_bytes)
        self._names: dict[bytes, tuple[str, TableKey]] = {}  # a name as written: as text, and as (schema, name)
        self._plans: dict[tuple[str, tuple[bytes, ...] | None], ColumnPlan | None] = {}
        self._copy_table = ""
        self._copy_key: TableKey = ("", "")
        self._copy_plan: ColumnPlan | None = None
        self.stats = TransformStats()

    def feed(self, data: bytes) -> list[bytes]:
        """Transform the items that `data` completes."""
        self.stats.bytes_in += len(data)
        return self._emit(self._splitter.feed(data))

    def close(self) -> list[bytes]:
        """Finish the input; raise DumpSyntaxError or RemapError if it was incomplete or did not fit the remap."""
        out = self._emit(self._splitter.close())
        tail = self._batcher.flush()
        self.stats.bytes_out += sum(map(len, tail))
        self._check_remap_tables_seen()
        return out + tail

    def _emit(self, items: list[Item]) -> list[bytes]:
        out: list[bytes] = []
        for item in items:
            out += self._handle(item)
        self.stats.bytes_out += sum(map(len, out))
        return out

    def _handle(self, item: Item) -> list[bytes]:
        if isinstance(item, InsertRows):
            return self._insert(self._remap_insert(item))
        if isinstance(item, Statement):
            return [*self._batcher.flush(), item.text]
        if isinstance(item, CopyRows):
            return [self._copy_rows(item.data)]
        if isinstance(item, Verbatim):
            return self._verbatim(item.text)
        if isinstance(item, CopyStart):
            return [*self._batcher.flush(), self._copy_start(item)]
        if isinstance(item, (MetaCommand, CopyEnd)):
            return [*self._batcher.flush(), item.text]
        raise AssertionError(item)

    def _insert(self, insert: Insert) -> list[bytes]:
        """A statement read whole that is as the batcher would write it goes on as written (its tuples never split
        nor joined again); other INSERTs are batched."""
        if insert.statement and self._batcher.is_whole(insert):
            return [*self._batcher.flush(), insert.statement]
        return self._batcher.add(insert)

    def _verbatim(self, text: bytes) -> list[bytes]:
        if not text.strip():
            return [text] if self._batcher.is_empty else []  # line breaks between merged INSERTs go
        self.stats.tables.update(announced_tables(text))
        return [*self._batcher.flush(), text]

    def _table_name(self, written: bytes) -> tuple[str, TableKey]:
        """A table as written in the dump: its `schema.name` text (remap rules, messages) and (schema, name)."""
        known = self._names.get(written)
        if known is None:
            name = qualified_name(written)
            key = table_key(written)
            known = self._names[written] = (name if "." in name else f"{DEFAULT_SCHEMA}.{name}", key)
            self.stats.tables.add(key)
        return known

    def _plan(self, table: str, columns: tuple[bytes, ...] | None) -> ColumnPlan | None:
        key = (table, columns)
        if key not in self._plans:
            rules = self._options.remap.for_table(table) if self._options.remap else None
            if rules is not None and columns is None:
                raise RemapError(
                    f"table {table} is remapped but its INSERTs name no columns: dump with --column-inserts"
                )
            names = [unquote_identifier(c) for c in columns or ()]
            self._plans[key] = rules.plan(names, columns or ()) if rules is not None else None
        return self._plans[key]

    def _remap_insert(self, item: InsertRows) -> Insert:
        insert = item.insert
        table, key = self._table_name(insert.table)
        self.stats.rows[key] += insert.rows
        plan = self._plan(table, insert.columns)
        if plan is None:
            return insert
        tuples = []
        for row in insert.tuples:
            values = split_tuple(row)
            if len(values) != plan.input_width:
                raise DumpSyntaxError(
                    f"a row of {table} has {len(values)} values for {plan.input_width} columns",
                    line=item.line,
                    offset=item.offset,
                )
            tuples.append(b"(" + b", ".join(plan.apply_values(values)) + b")")
        return insert.with_tuples(tuples, plan.columns)

    def _copy_start(self, item: CopyStart) -> bytes:
        self._copy_table, self._copy_key = self._table_name(item.table)
        columns = tuple(split_identifiers(item.columns)) if item.columns is not None else None
        self._copy_plan = self._plan(self._copy_table, columns)
        if self._copy_plan is None:
            return item.text
        return b"COPY " + item.table + b" (" + b", ".join(self._copy_plan.columns) + b") FROM stdin;\n"

    def _copy_rows(self, data: bytes) -> bytes:
        self.stats.rows[self._copy_key] += data.count(b"\n")
        plan = self._copy_plan
        if plan is None:
            return data
        out = []
        for line in data.split(b"\n")[:-1]:
            fields = line.split(b"\t")
            if len(fields) != plan.input_width:
                raise RemapError(
                    f"a COPY row of {self._copy_table} has {len(fields)} fields for {plan.input_width} columns"
                )
            out.append(b"\t".join(plan.apply_copy_fields(fields)))
        return b"\n".join(out) + b"\n" if out else b""

    def _check_remap_tables_seen(self) -> None:
        remap = self._options.remap
        seen = {f"{schema}.{name}" for schema, name in self.stats.tables}
        missing = sorted(set(remap.tables) - seen) if remap else []
        if missing:
            raise RemapError(f"the remap names table(s) not in the dump: {', '.join(missing)}")


def transform_stream(
    read: Callable[[int], bytes], write: Callable[[bytes], object], options: TransformOptions | None = None
) -> TransformStats:
    """Run the transform from a `read(n)` source (b"" at the end) to a `write(bytes)` sink."""
    transformer = Transformer(options)
    while chunk := read(CHUNK_BYTES):
        if out := transformer.feed(chunk):
            write(b"".join(out))
    write(b"".join(transformer.close()))
    return transformer.stats
