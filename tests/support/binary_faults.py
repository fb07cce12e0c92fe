"""A binary-mode stream damaged on its way, as a hostile or broken feeder could send it: `python binary_faults.py
HOW` reads the agent's stream on stdin and writes it again, well framed and checksummed, with the hosts table's
binary COPY data damaged:

    flip  the first row claims 32767 fields (malformed)
    cut   the last row and the end marker are gone: still valid binary COPY data, one row short (truncated)
"""

from __future__ import annotations

import dataclasses
import struct
import sys

from fedload.feeder.sections import CHUNK, END, HEAD, PART, SECTION_END, chunk
from fedload.stream import StreamDecoder, StreamEncoder

_SIGNATURE = 19  # "PGCOPY\n\xff\r\n\0", flags, header extension length


def sections(payload: bytes) -> list[tuple[bytes, bytes]]:
    """Each section's head part and its data, concatenated."""
    out, pos = [], 0
    while pos < len(payload):
        kind, length = PART.unpack_from(payload, pos)
        body = payload[pos + PART.size : pos + PART.size + length]
        pos += PART.size + length
        if kind == HEAD:
            out.append((PART.pack(HEAD, length) + body, b""))
        elif kind == CHUNK:
            out[-1] = (out[-1][0], out[-1][1] + body)
        else:
            assert kind == END
    return out


def without_last_row(data: bytes) -> bytes:
    """Binary COPY data without its last row and end marker."""
    pos, last = _SIGNATURE, _SIGNATURE
    while struct.unpack_from(">h", data, pos)[0] != -1:
        last = pos
        (fields,) = struct.unpack_from(">h", data, pos)
        pos += 2
        for _ in range(fields):
            (length,) = struct.unpack_from(">i", data, pos)
            pos += 4 + max(length, 0)
    return data[:last]


def damage(payload: bytes, how: str) -> bytes:
    """The payload with the hosts section's data damaged as `how` says."""
    out = b""
    for head, data in sections(payload):
        sent = data
        if b'"name": "hosts"' in head:
            flipped = data[:_SIGNATURE] + b"\x7f\xff" + data[_SIGNATURE + 2 :]
            sent = flipped if how == "flip" else without_last_row(data)
        out += head + chunk(sent) + SECTION_END
    return out


def main() -> None:
    """Stream in, damaged stream out."""
    decoder = StreamDecoder()
    payload = b"".join(decoder.feed(sys.stdin.buffer.read()))
    trailer = decoder.close()
    assert decoder.header is not None
    stated = {
        k: v
        for k, v in dataclasses.asdict(trailer).items()
        if k not in ("payload_bytes", "payload_sha256", "blocks_sha256")
    }
    encoder = StreamEncoder(decoder.header)
    damaged = damage(payload, sys.argv[1])
    sys.stdout.buffer.write(encoder.start() + encoder.data(damaged) + encoder.finish(**stated))


if __name__ == "__main__":
    main()
