"""Binary mode's agent sends a table's COPY data as parts that end where the stream's blocks do, whatever the size of
psql's writes, and the superhub reads back exactly that data, one piece per block."""

from __future__ import annotations

import io

from fedload.feeder.binary_dump import _Parts
from fedload.feeder.sections import SECTION_END, section_head
from fedload.stream import MAX_BLOCK_BYTES, Header, StreamDecoder, StreamEncoder
from fedload.superhub.binary_receive import BinaryEnd, BinaryRows, BinaryStart, SectionSplitter


def test_a_tables_data_goes_in_parts_of_about_a_block() -> None:
    """4 MiB written by psql in 64 KiB pieces reach the superhub unchanged, in full blocks of one piece each, not 64."""
    encoder = StreamEncoder(Header("zstd", "binary", "0.2.0", "15.4", ["public.t"]))
    out = io.BytesIO()
    out.write(encoder.start() + encoder.data(section_head(("public", "t"), ["a"], binary=True, reason="", unsent=[])))
    parts = _Parts(encoder, out)
    pieces = [bytes([i]) * (1 << 16) for i in range(64)]
    for piece in pieces:
        parts.add(piece)
    parts.flush()
    out.write(encoder.data(SECTION_END) + encoder.finish(pg_dump_exit_status=0))

    decoder, splitter = StreamDecoder(), SectionSplitter()
    texts = decoder.feed(out.getvalue())
    items = [item for text in texts for item in splitter.feed(text)]
    decoder.close()
    rows = [item.data for item in items if isinstance(item, BinaryRows)]
    assert isinstance(items[0], BinaryStart)
    assert isinstance(items[-1], BinaryEnd)
    assert b"".join(rows) == b"".join(pieces)
    assert len(rows) == len(texts) == len(b"".join(pieces)) // MAX_BLOCK_BYTES + 1
    assert {len(text) for text in texts[:-1]} == {MAX_BLOCK_BYTES}
