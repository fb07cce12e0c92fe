"""The fedload stream codec: what the encoder writes the decoder gives back, and each kind of corruption is refused."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import asdict
from typing import Any

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from fedload.errors import DumpError
from fedload.stream import MAGIC, MAX_BLOCK_BYTES, GzipDecoder, Header, StreamDecoder, StreamEncoder, Trailer

HEADER = Header("zstd", "copy", "0.2.0", "15.4", ["public.t"])
DUMP = b"COPY public.t (a) FROM stdin;\n1\n2\n\\.\n"


def frame(kind: bytes, payload: bytes) -> bytes:
    """One frame as the format defines it."""
    return struct.pack(">cI", kind, len(payload)) + payload


def stream(dump: bytes = DUMP, header: Header = HEADER, **trailer: Any) -> bytes:
    """A complete stream around `dump`; `trailer` overrides what the agent states at the end."""
    encoder = StreamEncoder(header)
    return encoder.start() + encoder.data(dump) + encoder.finish(**{"pg_dump_exit_status": 0, **trailer})


def decoded(raw: bytes, chunk: int = 1 << 16) -> tuple[bytes, Trailer]:
    """The dump text and trailer a decoder gets from `raw`, fed `chunk` bytes at a time."""
    decoder = StreamDecoder()
    out = [text for i in range(0, len(raw), chunk) for text in decoder.feed(raw[i : i + chunk])]
    return b"".join(out), decoder.close()


def refused(raw: bytes) -> str:
    """The DumpError message for `raw`."""
    with pytest.raises(DumpError) as caught:
        decoded(raw)
    return str(caught.value)


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.binary(max_size=3000) | st.just(b"x" * (MAX_BLOCK_BYTES + 17)), max_size=4),
    compression=st.sampled_from(["zstd", "gzip"]),
    chunk=st.integers(1, 70_000),
)
def test_decoder_gives_back_what_the_encoder_sent(pieces: list[bytes], compression: str, chunk: int) -> None:
    """For any dump text in any pieces, either compression and any read size, the decoder yields exactly that text
    and the trailer the agent wrote."""
    encoder = StreamEncoder(Header(compression, "inserts", "0.2.0", "17.1", ["public.*"]))
    raw = encoder.start() + b"".join(encoder.data(piece) for piece in pieces)
    raw += encoder.finish(pg_dump_exit_status=0, rows=[("public", "t", 3)], tables=[("public", "t")])
    text, trailer = decoded(raw, chunk if len(raw) < 100_000 else 1 << 16)
    assert text == b"".join(pieces)
    assert (trailer.row_counts(), trailer.table_keys(), trailer.payload_bytes) == (
        {("public", "t"): 3},
        {("public", "t")},
        len(text),
    )


@pytest.mark.parametrize(
    ("rows", "tables"),
    [
        ([("a", "b.c", 1), ("a.b", "c", 3)], [("a", "b.c"), ("a.b", "c")]),  # protocol 3: pairs, never ambiguous
        ({"a.b.c": 1}, ["a.b.c"]),  # protocol 2's text, split at its first dot
    ],
)
def test_trailer_names_tables_by_schema_and_name(rows: Any, tables: Any) -> None:
    """A trailer's tables read as (schema, name): protocol 3's pairs keep `a`.`b.c` apart from `a.b`.`c`; an agent
    of protocol 2 still reads, its `schema.name` split at the first dot."""
    decoder = StreamDecoder()
    decoder.feed(stream(rows=rows, tables=tables))
    trailer = decoder.close()
    expected = {("a", "b.c"): 1, ("a.b", "c"): 3} if isinstance(rows, list) else {("a", "b.c"): 1}
    assert trailer.row_counts() == expected
    assert trailer.table_keys() == set(expected)


def test_decoder_reads_header_and_trailer_fields() -> None:
    """The header and trailer arrive as the agent stated them."""
    decoder = StreamDecoder()
    decoder.feed(stream(rows={"public.t": 2}, server_version="15.4", stderr_tail="note"))
    trailer = decoder.close()
    assert decoder.header == HEADER
    assert trailer.server_version == "15.4"
    assert trailer.stderr_tail == "note"


def _blocks(compress: Any) -> bytes:
    """Magic, header and one data block: a stream cut before its trailer."""
    return MAGIC + frame(b"H", json.dumps(asdict(HEADER)).encode()) + frame(b"D", compress(DUMP))


def _trailer(sha: str = "", **fields: Any) -> bytes:
    """A hand-written trailer frame for one block of DUMP (`sha` overrides its checksum)."""
    summary = {
        "pg_dump_exit_status": 0,
        "payload_bytes": len(DUMP),
        "blocks_sha256": sha or hashlib.sha256(ZSTD(DUMP)).hexdigest(),
        **fields,
    }
    return frame(b"T", json.dumps(summary).encode())


ZSTD = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress
GOOD = stream()
HEAD = MAGIC + frame(b"H", json.dumps(asdict(HEADER)).encode())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"PGDMP\x00\x01\x02" + GOOD[8:], "the feeder's output is not a fedload stream (bad magic bytes)"),
        (b"", "the stream is truncated: it ends before its header, without a trailer"),
        (GOOD[:5], "the stream is truncated: it ends before its header, without a trailer"),
        (GOOD[: len(HEAD) + 3], "the stream is truncated: it ends after 0 bytes of dump, without a trailer"),
        (_blocks(ZSTD), f"the stream is truncated: it ends after {len(DUMP)} bytes of dump, without a trailer"),
        (GOOD + b"\x00\x00", "the stream has 2 unexpected bytes after its trailer"),
        (GOOD + frame(b"D", ZSTD(b"x")), "the stream continues after its trailer"),
        (MAGIC + frame(b"D", ZSTD(DUMP)), "unexpected stream frame b'D' at this point"),
        (MAGIC + _trailer(), "unexpected stream frame b'T' at this point"),
        (HEAD + frame(b"H", json.dumps(asdict(HEADER)).encode()), "unexpected stream frame b'H' at this point"),
        (HEAD + frame(b"X", b""), "unexpected stream frame b'X' at this point"),
        (HEAD + struct.pack(">cI", b"D", 1 << 30), "a stream frame claims 1073741824 bytes, more than the"),
        (HEAD + frame(b"D", ZSTD(DUMP)[:-1] + b"\x00"), "a compressed block is corrupt:"),
        (HEAD + frame(b"D", b"not zstd at all"), "a compressed block is corrupt:"),
        (
            HEAD + frame(b"D", zstandard.ZstdCompressor(write_content_size=True).compress(DUMP)) + _trailer(),
            "a compressed block has no content checksum",
        ),
        (
            HEAD + frame(b"D", zstandard.ZstdCompressor(write_content_size=False).compress(DUMP)) + _trailer(),
            "a compressed block does not declare its size",
        ),
        (
            HEAD + frame(b"D", zstandard.ZstdCompressor(write_content_size=True).compress(b"\x00" * (5 << 20))),
            f"a compressed block declares {5 << 20} bytes, more than the {4 * MAX_BLOCK_BYTES} allowed",
        ),
        (MAGIC + frame(b"H", b"{not json"), "the stream's header is not valid:"),
        (
            MAGIC + frame(b"H", b'{"compression": "zstd", "protocol": 2}'),
            "the stream's header is not valid: dump_mode: Field required",
        ),
        (
            MAGIC + frame(b"H", json.dumps({**asdict(HEADER), "tables": "public.t"}).encode()),
            "the stream's header is not valid: tables: Input should be a valid array",
        ),
        (
            MAGIC + frame(b"H", json.dumps({**asdict(HEADER), "compression": "lz4"}).encode()),
            "the stream uses unknown compression 'lz4'",
        ),
        (
            MAGIC + frame(b"H", json.dumps({**asdict(HEADER), "pad": "x" * (1 << 20)}).encode()),
            f"the stream's header is larger than {1 << 20} bytes",
        ),
        (HEAD + frame(b"D", ZSTD(DUMP)) + frame(b"T", b"[]"), "the stream's trailer is not valid:"),
        (
            HEAD + frame(b"D", ZSTD(DUMP)) + _trailer(payload_bytes=len(DUMP) + 1),
            f"the stream's checksum does not match: the trailer states {len(DUMP) + 1} bytes, {len(DUMP)} arrived",
        ),
        (
            HEAD + frame(b"D", ZSTD(DUMP)) + _trailer(sha="0" * 64),
            f"the stream's checksum does not match: the trailer states {len(DUMP)} bytes, {len(DUMP)} arrived",
        ),
        (
            stream(pg_dump_exit_status=1, stderr_tail="pg_dump: error: connection failed\n"),
            "pg_dump failed on the feeder with exit status 1: pg_dump: error: connection failed",
        ),
        (
            stream(pg_dump_exit_status=1),
            "pg_dump failed on the feeder with exit status 1 and printed nothing on stderr",
        ),
        (
            stream(pg_dump_exit_status=-9, error="the dump could not be transformed: line 3"),
            "the feeder's agent failed: the dump could not be transformed: line 3",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_each_corruption_is_refused(raw: bytes, message: str) -> None:
    """Bad magic, truncation, trailing bytes, frames out of order or too large, corrupt or oversized blocks,
    invalid header or trailer, a checksum mismatch and a failed dump each give their own DumpError."""
    assert message in refused(raw)


def test_gzip_blocks_with_trailing_bytes_are_refused() -> None:
    """A gzip block must be one complete member: trailing bytes after it are refused."""
    header = Header("gzip", "copy", "0.2.0", "15.4", ["public.t"])
    block = zlib.compress(DUMP, 6, wbits=31)
    raw = MAGIC + frame(b"H", json.dumps(asdict(header)).encode()) + frame(b"D", block + b"junk")
    assert "a gzip block is incomplete, has trailing bytes, or inflates past" in refused(raw)


@pytest.mark.parametrize("compression", ["zstd", "gzip", "plain gzip"])
def test_a_read_of_many_blocks_is_inflated_one_block_at_a_time(compression: str) -> None:
    """One read holding 64 MiB of highly compressed dump text inflates block by block as the consumer asks: one
    that stops after the first block (as the splitter does past its bound) has had 1 MiB inflated, not 64."""
    text = b"x" * (64 * MAX_BLOCK_BYTES)
    decoder: StreamDecoder | GzipDecoder
    if compression == "plain gzip":  # pg_dump | gzip, without the agent
        raw, decoder = zlib.compress(text, 1, wbits=31), GzipDecoder()
    else:
        encoder = StreamEncoder(Header(compression, "copy", "0.2.0", "15.4", ["public.t"]))
        raw, decoder = encoder.start() + encoder.data(text), StreamDecoder()
    assert len(raw) < len(text) // 200
    first = next(block for block in decoder.texts(raw) if block)
    assert len(first) == MAX_BLOCK_BYTES
    assert decoder.payload_bytes == MAX_BLOCK_BYTES


def _two_blocks(first: bytes, second: bytes, header: Header = HEADER) -> tuple[bytes, bytes, bytes]:
    """Head, the two data frames and the trailer of a stream of two full blocks, as the agent writes it."""
    raw = stream(first + second, header)
    head = raw[: len(MAGIC) + 5 + len(json.dumps(asdict(header)).encode())]
    rest = raw[len(head) :]
    one = 5 + struct.unpack(">I", rest[1:5])[0]
    two = one + 5 + struct.unpack(">I", rest[one + 1 : one + 5])[0]
    return head, rest[:one] + rest[one:two], rest[two:]


@pytest.mark.parametrize("protocol", [3, 4])
def test_blocks_out_of_order_are_refused(protocol: int) -> None:
    """Two full blocks swapped keep every block's checksum and the byte count: the trailer's checksum (of the
    compressed blocks since protocol 4, of the dump text before) refuses them."""
    header = Header("zstd", "copy", "0.2.0", "15.4", ["public.t"], protocol=protocol)
    first, second = b"a" * MAX_BLOCK_BYTES, b"b" * MAX_BLOCK_BYTES
    head, frames, trailer = _two_blocks(first, second, header)
    if protocol < 4:  # an agent before protocol 4 hashed the dump text
        summary: dict[str, object] = {"pg_dump_exit_status": 0, "payload_bytes": 2 * MAX_BLOCK_BYTES}
        summary["payload_sha256"] = hashlib.sha256(first + second).hexdigest()
        trailer = frame(b"T", json.dumps(summary).encode())
    assert decoded(head + frames + trailer)[0] == first + second
    one = 5 + struct.unpack(">I", frames[1:5])[0]
    swapped = frames[one:] + frames[:one]
    assert "the stream's checksum does not match" in refused(head + swapped + trailer)


def _data_blocks(raw: bytes) -> list[bytes]:
    """The decompressed text of each data frame of a zstd stream."""
    blocks, pos = [], len(HEAD)
    while raw[pos : pos + 1] == b"D":
        length = struct.unpack(">I", raw[pos + 1 : pos + 5])[0]
        blocks.append(zstandard.ZstdDecompressor().decompress(raw[pos + 5 : pos + 5 + length]))
        pos += 5 + length
    return blocks


def test_blocks_end_after_a_line() -> None:
    """The agent cuts a full block after its last line (in the block's second half), so that the superhub can hand
    a block of COPY rows on whole; a block without a newline there is cut at the block size."""
    rows = b"".join(b"%d\tsome text\n" % i for i in range(200_000))
    long_line = b"x" * (3 * MAX_BLOCK_BYTES) + b"\n"
    blocks = _data_blocks(stream(rows + long_line + rows))
    assert b"".join(blocks) == rows + long_line + rows
    assert all(len(block) <= MAX_BLOCK_BYTES for block in blocks)
    cut_in_line = [block for block in blocks[:-1] if not block.endswith(b"\n")]
    assert len(cut_in_line) == 3  # the long line's blocks, and the one before, whose second half has no newline
