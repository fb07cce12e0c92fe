"""The statistics section of a binary stream: pg_dump's statistics SQL split into statements however it is cut, and
nothing else (no COPY data, no statement past the bound) taken from it."""

from __future__ import annotations

import pytest

from fedload.errors import DumpError
from fedload.feeder.sections import SECTION_END, chunk, section_head, statistics_head
from fedload.superhub.binary_receive import BinaryEnd, BinaryStart, SectionItem, SectionSplitter
from transforms import MetaCommand, Statement, TooLargeError, Verbatim

TABLE = section_head(("public", "hosts"), ["id"], binary=True, reason="", unsent=[])
CALL = (
    b"SELECT * FROM pg_catalog.pg_restore_relation_stats(\n\t'version', '180000'::integer,\n\t'schemaname', "
    b"'public',\n\t'relname', 'hosts',\n\t'relpages', '1'::integer\n);\n"
)
SQL = b"\\restrict abc\n-- Name: hosts; Type: STATISTICS DATA\nSET statement_timeout = 0;\n\n" + CALL


def _items(pieces: list[bytes], max_line_bytes: int = 1 << 20) -> list[SectionItem]:
    splitter = SectionSplitter(max_line_bytes=max_line_bytes)
    items = [item for piece in pieces for item in splitter.feed(piece)]
    return items + splitter.close()


def test_the_statistics_section_becomes_statements_however_it_is_cut() -> None:
    """After the tables' sections, pg_dump's SQL as its statements, comments and meta-commands, whole or byte by
    byte."""
    payload = TABLE + chunk(b"PGCOPY") + SECTION_END + statistics_head() + chunk(SQL[:50]) + chunk(SQL[50:])
    payload += SECTION_END
    for pieces in ([payload], [payload[i : i + 1] for i in range(len(payload))]):
        items = _items(pieces)
        assert isinstance(items[0], BinaryStart)
        statements = [i.text for i in items if isinstance(i, Statement)]
        assert statements == [b"SET statement_timeout = 0;", CALL.rstrip(b"\n")]
        after = items[[isinstance(i, BinaryEnd) for i in items].index(True) + 1 :]
        assert all(isinstance(i, Statement | MetaCommand | Verbatim) for i in after)
        assert any(isinstance(i, MetaCommand) for i in after)


def test_copy_data_in_the_statistics_section_is_refused() -> None:
    """A COPY block in the statistics section (data into some table) rejects the dump."""
    sql = b"COPY public.hosts (id) FROM stdin;\n1\n\\.\n"
    with pytest.raises(DumpError, match="statistics section of the binary stream holds CopyStart"):
        _items([statistics_head() + chunk(sql) + SECTION_END])


def test_a_statistics_statement_past_the_bound_is_refused() -> None:
    """A statement longer than superhub.max_statement_bytes is refused as it arrives."""
    with pytest.raises(TooLargeError):
        _items([statistics_head() + chunk(b"SELECT '" + b"x" * 2000)], max_line_bytes=1000)
