"""The superhub's reader of binary-mode sections: the same items however the dump text is cut, text sections as
whole lines of a COPY block, and anything out of order or cut short refused."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fedload.config import DumpMode
from fedload.errors import DumpError
from fedload.feeder.sections import PART, SECTION_END, chunk, section_head
from fedload.feeder.wire import BINARY_PROTOCOL, Header, StreamEncoder
from fedload.names import TableName
from fedload.superhub.binary_receive import (
    BinaryEnd,
    BinaryRows,
    BinaryStart,
    SectionItem,
    SectionSplitter,
    UnchangedTable,
)
from fedload.superhub.receive import DumpReceiver
from tests.support.replay import Replay
from transforms import CopyEnd, CopyRows, CopyStart, TooLargeError

BINARY = section_head(("public", "hosts"), ["id", "name"], binary=True, reason="", unsent=["x"])
UNCHANGED = section_head(("public", "kept"), ["id"], binary=True, reason="", unsent=[], unchanged=(12, "ab" * 32))
TEXT = section_head(("public", "wide"), ["id", 'v"w'], binary=False, reason="column v: ...", unsent=[])
PAYLOAD = (
    BINARY
    + chunk(b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8)
    + chunk(b"\xff\xff")
    + SECTION_END
    + UNCHANGED
    + SECTION_END
    + TEXT
    + chunk(b"1\t2\n3")
    + chunk(b"\t4\n")
    + SECTION_END
)


def _items(pieces: list[bytes]) -> list[SectionItem]:
    splitter = SectionSplitter()
    items = [item for piece in pieces for item in splitter.feed(piece)]
    return items + splitter.close()


def _merged(items: Sequence[object]) -> list[object]:
    """Consecutive data items joined: how the data was cut is not part of what it says."""
    out: list[object] = []
    for item in items:
        if isinstance(item, BinaryRows | CopyRows) and out and type(out[-1]) is type(item):
            out[-1] = type(item)(bytes(out[-1].data) + bytes(item.data))
        else:
            out.append(item)
    return out


def test_sections_become_items_however_the_text_is_cut() -> None:
    """Whole or byte by byte, the same binary section (data as it came) and text COPY block (whole lines)."""
    whole = _items([PAYLOAD])
    assert _merged(whole) == [
        BinaryStart(TableName("public", "hosts"), ("id", "name"), ("x",), 1),
        BinaryRows(b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8 + b"\xff\xff"),
        BinaryEnd(),
        UnchangedTable(TableName("public", "kept"), 12, "ab" * 32),
        CopyStart(b"", 3, 0, b'"public"."wide"', b'"id", "v""w"'),
        CopyRows(b"1\t2\n3\t4\n"),
        CopyEnd(b"\\.\n"),
    ]
    by_byte = _items([PAYLOAD[i : i + 1] for i in range(len(PAYLOAD))])
    assert _merged(by_byte) == _merged(whole)
    assert all(item.data.endswith(b"\n") for item in by_byte if isinstance(item, CopyRows))


def test_a_blocks_chunks_reach_the_importer_as_one_item() -> None:
    """The chunks of a section within one block of dump text make one data item, not one each (psql's writes are
    a few KiB: an item each cost the sync more CPU than its bytes)."""
    whole = _items([PAYLOAD])
    assert whole == _merged(whole)


def test_a_blocks_large_chunks_are_passed_on_without_a_copy() -> None:
    """Large chunks' data (the agent's block-sized chunks: a block holds one, or the end of one and the start of the
    next) become items that are views of the inflated block itself, not copies of it: asyncpg copies them into its
    messages, and a block is 1 MiB. Small chunks around them are joined, in order."""
    first, second = bytes(range(256)) * 512, bytes(range(255, -1, -1)) * 600
    block = BINARY + chunk(b"ab") + chunk(first) + chunk(second) + chunk(b"cd")
    items = SectionSplitter().feed(block)
    assert isinstance(items[0], BinaryStart)
    rows = [item.data for item in items[1:] if isinstance(item, BinaryRows)]
    assert rows == [b"ab", first, second, b"cd"]
    assert [isinstance(data, memoryview) and data.obj is block for data in rows] == [False, True, True, False]


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (chunk(b"x"), "unexpected part b'C'"),
        (BINARY + BINARY, "unexpected part b'S'"),
        (SECTION_END, "unexpected part b'E'"),
        (BINARY + PART.pack(b"E", 1) + b"x", "unexpected part b'E'"),
        (BINARY + PART.pack(b"Z", 0), "unexpected part b'Z'"),
        (PART.pack(b"S", 2) + b"{}", "a section head of the binary stream is not valid"),
        (PART.pack(b"S", 1 << 30), "a section head of the binary stream claims"),
        (BINARY + chunk(b"data"), "the binary stream ends inside the section of table public.hosts"),
        (BINARY + chunk(b"data")[:-1], "the binary stream ends inside the section of table public.hosts"),
        (TEXT + chunk(b"1\t2") + SECTION_END, "the text section of table public.wide ends inside a line"),
        (UNCHANGED + chunk(b"data") + SECTION_END, "unexpected part b'C'"),
        (UNCHANGED.replace(b'"rows": 12', b'"rows": -1'), "a section head of the binary stream is not valid"),
    ],
)
def test_anything_else_is_refused(payload: bytes, error: str) -> None:
    """Parts out of order, unknown, oversized or invalid heads, a section cut short: DumpError."""
    with pytest.raises(DumpError, match=error.replace("(", r"\(")):
        _items([payload])


def _stream(protocol: int) -> bytes:
    encoder = StreamEncoder(Header("zstd", "binary", "0.3.0", "15.4", ["public.hosts"], protocol=protocol))
    rows = [("public", "hosts", 0), ("public", "wide", 1)]
    return encoder.start() + encoder.data(PAYLOAD) + encoder.finish(pg_dump_exit_status=0, rows=rows)


async def test_the_receiver_reads_a_binary_stream_by_its_sections() -> None:
    """A protocol 4 stream whose header says binary is read as sections, through the checked framing."""
    receiver = DumpReceiver(Replay(_stream(BINARY_PROTOCOL)), feeder="hub1", dump_mode=DumpMode.BINARY)
    items = [item async for item in receiver.items()]
    assert [type(item).__name__ for item in _merged(items)] == [
        "BinaryStart",
        "BinaryRows",
        "BinaryEnd",
        "UnchangedTable",
        "CopyStart",
        "CopyRows",
        "CopyEnd",
    ]
    assert receiver.trailer is not None


async def test_a_binary_header_of_an_older_protocol_is_refused() -> None:
    """dump_mode binary in a protocol 3 header is not a stream any agent writes: refused."""
    receiver = DumpReceiver(Replay(_stream(3)), feeder="hub1", dump_mode=DumpMode.BINARY)
    with pytest.raises(DumpError, match="states dump_mode binary in stream protocol 3"):
        [item async for item in receiver.items()]


def test_a_text_sections_row_past_the_bound_is_refused_as_it_arrives() -> None:
    """A text section's row that never ends is refused once the bound has arrived, not buffered without end."""
    splitter = SectionSplitter(max_line_bytes=1000)
    splitter.feed(TEXT + chunk(b"1\t" + b"x" * 998))  # 1000 bytes without an end of line: at the bound, kept
    with pytest.raises(TooLargeError, match="a COPY data row is larger than 1000 bytes") as refused:
        splitter.feed(chunk(b"x"))
    assert refused.value.table == b'"public"."wide"'
