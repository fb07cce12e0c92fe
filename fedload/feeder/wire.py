"""What the feeder's agent writes: the fedload stream's framing, header, trailer and encoder (spec:
docs/stream-format.md; the superhub's reader is fedload/stream.py).

    stream  = MAGIC header-frame data-frame* trailer-frame          (then end of input)
    frame   = kind:1 byte  length:uint32 big-endian  payload
    kinds   = b"H" header JSON, b"D" one compressed block, b"T" trailer JSON

Standard library only (the compressor is chosen by fedload/feeder/compress.py): this runs in the agent's zipapp
on the feeder's own Python, 3.9 and later.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from fedload.feeder.compress import gzip_compressor, zstandard_compressor
from fedload.feeder.errors import one_line

__all__ = [
    "BINARY_PROTOCOL",
    "DIGEST_PROTOCOL",
    "FORMAT_VERSION",
    "FRAME_HEAD",
    "MAGIC",
    "MAX_BLOCK_BYTES",
    "PROTOCOL_VERSION",
    "Header",
    "StreamEncoder",
    "Trailer",
    "dump_failure",
]

MAGIC = b"FEDLOAD\x01"
FORMAT_VERSION = 1  # the framing: magic, frame kinds and lengths
# What the header and trailer hold. 1: agents 0.1, which stated no protocol; 2: the trailer lists `tables`;
# 3: the trailer names tables as [schema, name] pairs (`rows`: [schema, name, rows]), not as `schema.name` text,
# which reads the same for `a.b` + `c` and `a` + `b.c`; 4: the trailer's checksum is `blocks_sha256`, of the
# compressed blocks as sent, instead of `payload_sha256`, of the dump text (10x the bytes to hash on both ends), and
# dump_mode "binary", whose dump text is one section per table (fedload/feeder/sections.py).
# 5: unchanged tables: in binary mode a section may say its table is unchanged (and hold no data), in copy and
# inserts modes the trailer lists them (`unchanged`); the trailer lists each table's content digest. An agent states
# 5 only when the superhub asked for digests, which only a superhub reading 5 does: to any other it states 4.
PROTOCOL_VERSION = 4
BINARY_PROTOCOL = 4  # the first protocol with binary mode's sections
DIGEST_PROTOCOL = 5  # the first with unchanged tables and digests
MAX_BLOCK_BYTES = 1 << 20
FRAME_HEAD = struct.Struct(">cI")  # kind, payload length


@dataclass(frozen=True)  # no slots: Python 3.9
class Header:
    """What the agent states before the dump."""

    compression: str
    dump_mode: str
    agent_version: str
    pg_dump_version: str
    tables: list[str]
    format: int = FORMAT_VERSION
    protocol: int = PROTOCOL_VERSION  # absent from agents before 0.2: protocol 1


@dataclass(frozen=True)  # no slots: Python 3.9
class Trailer:
    """What the agent states after the dump: whether it is complete, and what it holds."""

    pg_dump_exit_status: int
    payload_bytes: int
    payload_sha256: str = ""  # of the dump text: agents before protocol 4
    blocks_sha256: str = ""  # of the data frames' payloads in order: since protocol 4
    # Rows per table, and every table pg_dump wrote, empty ones too (None: an agent before 0.2); as
    # (schema, name) pairs since protocol 3, as `schema.name` text before: read them with `row_counts` and
    # `table_keys`.
    rows: list[tuple[str, str, int]] | dict[str, int] = field(default_factory=list)
    tables: list[tuple[str, str]] | list[str] | None = None
    server_version: str = ""
    error: str = ""
    stderr_tail: str = ""
    dump_program: str = "pg_dump"  # whose exit status and stderr these are: psql in binary mode
    # Since protocol 5, where the superhub asked: [schema, name, digest, rows, counters] of each table, sent or
    # unchanged (digest "": not computed, the counters said the table changed).
    digests: list[tuple[str, str, str, int, str]] = field(default_factory=list)
    # Since protocol 5, copy and inserts modes: [schema, name, rows, digest] of each table not dumped because its
    # digest is the one the superhub asked with (binary mode says so in the table's section instead).
    unchanged: list[tuple[str, str, int, str]] = field(default_factory=list)
    # When the dump's data was true, in Unix seconds on the feeder's clock: the feeder server's now() in the
    # snapshot's transaction where the agent holds one (binary mode, digests), else the agent's clock as pg_dump
    # started (its snapshot comes after). None: not stated (an agent before it); the superhub then takes the run's
    # start, and never believes a time later than that (docs/freshness.md).
    snapshot_epoch_s: float | None = None

    def row_counts(self) -> dict[tuple[str, str], int]:
        """The rows the agent saw per (schema, name)."""
        if isinstance(self.rows, dict):
            return {_protocol2_key(table): rows for table, rows in self.rows.items()}
        return {(schema, name): rows for schema, name, rows in self.rows}

    def table_keys(self) -> set[tuple[str, str]] | None:
        """(schema, name) of every table pg_dump wrote; None from an agent before 0.2, which did not say."""
        if self.tables is None:
            return None
        return {table if isinstance(table, tuple) else _protocol2_key(table) for table in self.tables}

    @property
    def succeeded(self) -> bool:
        """pg_dump exited 0 and the agent found nothing wrong."""
        return self.pg_dump_exit_status == 0 and not self.error

    @property
    def failure(self) -> str:
        """Why the dump failed on the feeder, as one sentence (empty if it succeeded); the agent prints it too."""
        return dump_failure(self.pg_dump_exit_status, self.error, self.stderr_tail, self.dump_program)


def _protocol2_key(table: str) -> tuple[str, str]:
    """A protocol 2 agent's `schema.name`, split at its first dot: right unless the schema's name has a dot."""
    schema, _, name = table.partition(".")
    return schema, name


def dump_failure(pg_dump_exit_status: int, error: str, stderr_tail: str, program: str = "pg_dump") -> str:
    """One line saying why a dump failed: pg_dump's (or `program`'s) exit status and its own message, or the agent's
    error."""
    # pg_dump exiting non-zero on its own explains a cut-off dump; killed by a signal, it was most likely stopped by
    # the agent because of `error`.
    if pg_dump_exit_status > 0 or (pg_dump_exit_status < 0 and not error):
        tail = f": {one_line(stderr_tail)}" if stderr_tail.strip() else " and printed nothing on stderr"
        return f"{program} failed on the feeder with exit status {pg_dump_exit_status}{tail}"
    return f"the feeder's agent failed: {error}" if error else ""


def _block_ends(text: bytes, *, final: bool, whole_lines: bool) -> list[int]:
    """Where the blocks of `text` end: each full block (after a line if `whole_lines`, `_block_end`); if `final`,
    the rest too."""
    ends: list[int] = []
    start = 0
    while len(text) - start >= MAX_BLOCK_BYTES:
        start = _block_end(text, start) if whole_lines else start + MAX_BLOCK_BYTES
        ends.append(start)
    if final and start < len(text):
        ends.append(len(text))
    return ends


def _block_end(text: bytes, start: int) -> int:
    """Where the full block of `text` from `start` ends: after its last newline if that is in its second half, so
    that blocks hold whole lines (the superhub hands a block of COPY rows on as it is, without copying it); else
    at MAX_BLOCK_BYTES."""
    newline = text.rfind(b"\n", start + MAX_BLOCK_BYTES // 2, start + MAX_BLOCK_BYTES)
    return newline + 1 if newline >= 0 else start + MAX_BLOCK_BYTES


def _frame(kind: bytes, payload: bytes) -> bytes:
    """One frame: its head, then `payload`."""
    return FRAME_HEAD.pack(kind, len(payload)) + payload


def _compressor(compression: str) -> Callable[[bytes], bytes]:
    """The compressor a header states, exactly (no fallback): for encoders built on the superhub's side."""
    exact = zstandard_compressor() if compression == "zstd" else gzip_compressor() if compression == "gzip" else None
    if exact is None:
        raise ValueError(f"compression {compression!r} is not available here")
    return exact.compress


class StreamEncoder:
    """Builds the stream on the feeder: `start()`, `data()` as dump text arrives, `finish()` with the trailer."""

    def __init__(self, header: Header, compress: Callable[[bytes], bytes] | None = None) -> None:
        """`compress` makes one block's frame for `header.compression` (default: zstandard, or zlib for gzip)."""
        self._header = header
        self._compress = compress or _compressor(header.compression)
        # Blocks end after a line, but in binary mode, whose sections' parts follow no lines: there each block is
        # full, and a part that ends where the block does (`room`) is compressed as it is, without a copy.
        self._whole_lines = header.dump_mode != "binary"
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self._blocks_sha256 = hashlib.sha256()
        self.payload_bytes = 0

    def start(self) -> bytes:
        """Magic and header frame."""
        return MAGIC + _frame(b"H", json.dumps(asdict(self._header)).encode())

    @property
    def room(self) -> int:
        """How many more bytes of dump text complete the block being gathered."""
        return MAX_BLOCK_BYTES - self._pending_bytes

    def data(self, text: bytes | memoryview) -> bytes:
        """Data frames for the blocks that `text` completes (often none)."""
        self.payload_bytes += len(text)
        self._pending.append(text)
        self._pending_bytes += len(text)
        return self._blocks(final=False)

    def finish(self, **trailer: Any) -> bytes:
        """The last data frames and the trailer frame; `trailer` gives the Trailer fields the agent knows."""
        blocks = self._blocks(final=True)
        summary = Trailer(payload_bytes=self.payload_bytes, blocks_sha256=self._blocks_sha256.hexdigest(), **trailer)
        return blocks + _frame(b"T", json.dumps(asdict(summary)).encode())

    def _blocks(self, *, final: bool) -> bytes:
        if self._pending_bytes < MAX_BLOCK_BYTES and not (final and self._pending_bytes):
            return b""
        text = b"".join(self._pending)
        ends = _block_ends(text, final=final, whole_lines=self._whole_lines)
        cut = ends[-1] if ends else 0
        blocks = [self._compress(text[start:end]) for start, end in zip([0, *ends], ends)]
        self._pending = [text[cut:]] if cut < len(text) else []
        self._pending_bytes = len(text) - cut
        for block in blocks:
            self._blocks_sha256.update(block)
        return b"".join(_frame(b"D", block) for block in blocks)
