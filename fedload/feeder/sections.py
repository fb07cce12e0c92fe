"""The dump text of a binary-mode stream: one section per table (spec: docs/stream-format.md, "Binary mode").

    payload = section*
    section = S-part  C-part*  E-part
    part    = kind:1 byte  length:uint32 big-endian  body
    kinds   = b"S" the section's head, JSON; b"C" COPY data as the feeder's server wrote it; b"E" the end (empty)

The head names the table, the columns the data holds in order, its format ("binary": PostgreSQL's binary COPY
format; "text": COPY's text format, whole lines), why it is text where it is, and the feeder's columns left out;
since protocol 5, `unchanged` (rows and digest) where the table is not sent: its digest is the superhub's.
Standard library only: this runs in the agent's zipapp on the feeder's own Python, 3.9 and later.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

__all__ = ["CHUNK", "END", "HEAD", "PART", "SECTION_END", "chunk", "chunk_head", "section_head", "statistics_head"]

PART = struct.Struct(">cI")  # kind, body length
HEAD, CHUNK, END = b"S", b"C", b"E"
SECTION_END = PART.pack(END, 0)


def section_head(
    table: tuple[str, str],
    columns: Sequence[str],
    *,
    binary: bool,
    reason: str,
    unsent: Sequence[str],
    unchanged: tuple[int, str] | None = None,
    delta: dict[str, object] | None = None,
) -> bytes:
    """The part that opens a table's section; `unchanged` (rows, digest): the table is not sent, its digest is the
    one the superhub holds, and the section holds no data (protocol 5); `delta`: the table's delta state and, where
    only its changed buckets are sent, which ones (fedload/feeder/delta_plan.py)."""
    head: dict[str, object] = {
        "schema": table[0],
        "name": table[1],
        "columns": list(columns),
        "format": "binary" if binary else "text",
        "reason": reason,
        "unsent": list(unsent),
    }
    if unchanged is not None:
        head["unchanged"] = {"rows": unchanged[0], "digest": unchanged[1]}
    if delta is not None:
        head["delta"] = delta
    body = json.dumps(head).encode()
    return PART.pack(HEAD, len(body)) + body


def chunk(data: bytes) -> bytes:
    """A part carrying `data`, COPY output of the section's table."""
    return chunk_head(len(data)) + data


def chunk_head(length: int) -> bytes:
    """The head of a part carrying `length` bytes of COPY output, which follow it."""
    return PART.pack(CHUNK, length)


def statistics_head() -> bytes:
    """The part that opens the statistics section: pg_dump's `--statistics-only` SQL text follows, in C-parts."""
    body = json.dumps({"format": "statistics"}).encode()
    return PART.pack(HEAD, len(body)) + body
