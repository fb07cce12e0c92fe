"""The fedload stream: a self-verifying, compressed container for one feeder's dump (spec: docs/stream-format.md).
This is the superhub's reader; the agent's writer, the header and trailer are in fedload/feeder/wire.py.

    stream  = MAGIC header-frame data-frame* trailer-frame          (then end of input)
    frame   = kind:1 byte  length:uint32 big-endian  payload
    kinds   = b"H" header JSON, b"D" one compressed block, b"T" trailer JSON

Every data block is an independent zstd frame (with checksum and content size) or gzip member holding at most
`MAX_BLOCK_BYTES` of dump text, so the receiver bounds memory and rejects decompression bombs before inflating.
The trailer carries pg_dump's exit status, rows per table, the length of the dump text and the SHA-256 of the
compressed blocks as sent (of the dump text before protocol 4), so a truncated, reordered or half-failed dump is
told apart from a complete one.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar, cast

import zstandard

from fedload import __version__
from fedload.errors import DumpError
from fedload.feeder.binary_plan import DIGEST_FORMAT
from fedload.feeder.wire import (
    DIGEST_PROTOCOL,
    FORMAT_VERSION,
    FRAME_HEAD,
    MAGIC,
    MAX_BLOCK_BYTES,
    PROTOCOL_VERSION,
    Header,
    StreamEncoder,
    Trailer,
    dump_failure,
)
from fedload.names import TableName
from transforms.errors import printable

if TYPE_CHECKING:
    from pydantic import TypeAdapter

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_BLOCK_BYTES",
    "NEWEST_PROTOCOL",
    "OLDEST_PROTOCOL",
    "PROTOCOL_VERSION",
    "GzipDecoder",
    "Header",
    "StreamDecoder",
    "StreamEncoder",
    "Trailer",
    "build_validators",
    "dump_failure",
]

OLDEST_PROTOCOL = 2  # the oldest agents' protocol this superhub reads
NEWEST_PROTOCOL = DIGEST_PROTOCOL  # the newest this superhub reads: its own agents' when asked for digests
_BLOCKS_HASHED = 4  # the first protocol whose trailer hashes the compressed blocks, not the dump text
_MAX_ACCEPTED_BLOCK_BYTES = 4 * MAX_BLOCK_BYTES  # a receiver tolerates senders with larger blocks, to a bound
_MAX_FRAME_BYTES = _MAX_ACCEPTED_BLOCK_BYTES + (1 << 16)
_MAX_JSON_BYTES = 1 << 20
_MAX_VERSION_CHARS = 200  # a header's agent_version and pg_dump_version
_SHOWN_CHARS = 60  # of a refused text, in the message
_MAX_COUNT = 2**63 - 1  # a count of rows or bytes, as PostgreSQL's bigint holds it
_MAX_EXIT_STATUS = 255  # a process's exit status, or (negative) the signal that ended it
_DUMP_PROGRAMS = ("pg_dump", "psql")
_T = TypeVar("_T")


class _BlockDecompressor:
    """Inflates one block with a hard output bound; with `checksums`, a zstd block must carry its content checksum
    (a gzip member always has its CRC-32)."""

    def __init__(self, compression: str, *, checksums: bool) -> None:
        if compression not in ("zstd", "gzip"):
            raise DumpError(f"the stream uses unknown compression {compression!r}")
        self._zstd = zstandard.ZstdDecompressor() if compression == "zstd" else None
        self._checksums = checksums

    def __call__(self, block: bytes) -> bytes:
        try:
            return self._zstd_block(block) if self._zstd is not None else self._gzip_block(block)
        except (zstandard.ZstdError, zlib.error) as exc:
            raise DumpError(f"a compressed block is corrupt: {exc}") from exc

    def _zstd_block(self, block: bytes) -> bytes:
        assert self._zstd is not None
        frame = zstandard.get_frame_parameters(block)
        if frame.content_size == zstandard.CONTENTSIZE_UNKNOWN:
            raise DumpError("a compressed block does not declare its size")
        if frame.content_size > _MAX_ACCEPTED_BLOCK_BYTES:
            raise DumpError(
                f"a compressed block declares {frame.content_size} bytes, more than the {_MAX_ACCEPTED_BLOCK_BYTES} "
                "allowed"
            )
        if self._checksums and not frame.has_checksum:
            raise DumpError("a compressed block has no content checksum")
        text: bytes = self._zstd.decompress(block, max_output_size=_MAX_ACCEPTED_BLOCK_BYTES, allow_extra_data=False)
        return text

    @staticmethod
    def _gzip_block(block: bytes) -> bytes:
        inflater = zlib.decompressobj(wbits=31)
        text = inflater.decompress(block, _MAX_ACCEPTED_BLOCK_BYTES)
        if inflater.unconsumed_tail or not inflater.eof or inflater.unused_data:
            raise DumpError(
                f"a gzip block is incomplete, has trailing bytes, or inflates past {_MAX_ACCEPTED_BLOCK_BYTES}"
            )
        return text


class StreamDecoder:
    """Checks and unpacks the stream on the superhub: `feed()` raw bytes, get dump text; `close()` gives the trailer.

    Raises DumpError for anything but a complete stream whose dump succeeded on the feeder.
    """

    def __init__(self, feeder: str = "") -> None:
        self._feeder = feeder  # named in messages
        self._buf = bytearray()
        self._magic_seen = False
        self._decompress: _BlockDecompressor | None = None
        self._blocks_sha256 = hashlib.sha256()
        self._text_sha256: hashlib._Hash | None = None  # only for agents before protocol 4
        self.header: Header | None = None
        self.trailer: Trailer | None = None
        self.payload_bytes = 0
        self.raw_bytes = 0

    def feed(self, raw: bytes) -> list[bytes]:
        """Dump text from the frames that `raw` completes, all inflated at once (`texts` inflates them lazily)."""
        return list(self.texts(raw))

    def texts(self, raw: bytes) -> Iterator[bytes]:
        """Dump text from the frames that `raw` completes, each block inflated when the consumer asks for the next:
        a consumer that refuses what it has (the splitter's bound) stops after one block, however many a read holds
        (zstd frames of 1 MiB of one byte take ~60 bytes: a 256 KiB read could inflate to gigabytes)."""
        self.raw_bytes += len(raw)
        self._buf += raw
        if not self._magic_seen:
            if len(self._buf) < len(MAGIC):
                return
            if bytes(self._buf[: len(MAGIC)]) != MAGIC:
                raise DumpError("the feeder's output is not a fedload stream (bad magic bytes)")
            del self._buf[: len(MAGIC)]
            self._magic_seen = True
        while (frame := self._next_frame()) is not None:
            yield from self._handle(*frame)

    def close(self) -> Trailer:
        """The verified trailer; DumpError if the stream is truncated, inconsistent or reports a failed dump."""
        if self.trailer is None:
            where = "before its header" if self.header is None else f"after {self.payload_bytes} bytes of dump"
            raise DumpError(f"the stream is truncated: it ends {where}, without a trailer")
        if self._buf:
            raise DumpError(f"the stream has {len(self._buf)} unexpected bytes after its trailer")
        self._verify(self.trailer)
        return self.trailer

    def _next_frame(self) -> tuple[bytes, bytes] | None:
        if len(self._buf) < FRAME_HEAD.size:
            return None
        kind, length = FRAME_HEAD.unpack_from(self._buf)
        if length > _MAX_FRAME_BYTES:
            raise DumpError(f"a stream frame claims {length} bytes, more than the {_MAX_FRAME_BYTES} allowed")
        end = FRAME_HEAD.size + length
        if len(self._buf) < end:
            return None
        with memoryview(self._buf) as view:  # one copy of the payload, not a bytearray slice and then bytes
            payload = bytes(view[FRAME_HEAD.size : end])
        del self._buf[:end]
        return kind, payload

    def _handle(self, kind: bytes, payload: bytes) -> list[bytes]:
        if self.trailer is not None:
            raise DumpError("the stream continues after its trailer")
        if kind == b"D" and self._decompress is not None:
            self._blocks_sha256.update(payload)
            text = self._decompress(payload)
            if self._text_sha256 is not None:
                self._text_sha256.update(text)
            self.payload_bytes += len(text)
            return [text]
        if kind == b"H" and self.header is None:
            _check_versions(payload, f"feeder {self._feeder}" if self._feeder else "the feeder")
            self.header = _checked_header(_parse(Header, payload, "header"))
            self._decompress = _BlockDecompressor(self.header.compression, checksums=self._blocks_hashed)
            if not self._blocks_hashed:
                self._text_sha256 = hashlib.sha256()
            return []
        if kind == b"T" and self.header is not None:
            self.trailer = _checked_trailer(_parse(Trailer, payload, "trailer"))
            return []
        raise DumpError(f"unexpected stream frame {kind!r} at this point")

    @property
    def _blocks_hashed(self) -> bool:
        """Whether the agent's trailer hashes the compressed blocks (protocol 4 on) rather than the dump text."""
        return self.header is not None and self.header.protocol >= _BLOCKS_HASHED

    def _verify(self, trailer: Trailer) -> None:
        if trailer.failure:
            raise DumpError(trailer.failure)
        if self._text_sha256 is not None:
            stated, arrived = trailer.payload_sha256, self._text_sha256.hexdigest()
        else:
            stated, arrived = trailer.blocks_sha256, self._blocks_sha256.hexdigest()
        if trailer.payload_bytes != self.payload_bytes or stated != arrived:
            raise DumpError(
                f"the stream's checksum does not match: the trailer states {trailer.payload_bytes} bytes, "
                f"{self.payload_bytes} arrived"
            )


def _check_versions(header: bytes, feeder: str) -> None:
    """DumpError in one line if the header's format or protocol is not one this superhub reads, saying which
    side to upgrade; read leniently before the strict parse, so a newer agent's header gets this message."""
    try:
        stated = json.loads(header) if len(header) <= _MAX_JSON_BYTES else None
    except (ValueError, RecursionError):
        return  # the strict parse says what is wrong with it
    if not isinstance(stated, dict):
        return
    version = stated.get("agent_version")
    known = isinstance(version, str) and _version_refusal("agent_version", version) is None
    agent = f"fedload agent {version}" if known else "a fedload agent of unknown version"
    stream_format, protocol = stated.get("format", FORMAT_VERSION), stated.get("protocol", 1)
    superhub = f"this superhub (fedload {__version__})"
    if stream_format != FORMAT_VERSION:
        newer = isinstance(stream_format, int) and stream_format > FORMAT_VERSION
        raise DumpError(
            f"{feeder} runs {agent} (stream format {json.dumps(stream_format)}); {superhub} reads format "
            f"{FORMAT_VERSION}: upgrade fedload on the {'superhub' if newer else 'feeder'}"
        )
    if not isinstance(protocol, int) or not OLDEST_PROTOCOL <= protocol <= NEWEST_PROTOCOL:
        newer = isinstance(protocol, int) and protocol > NEWEST_PROTOCOL
        wanted = f"{OLDEST_PROTOCOL}" + (f" to {NEWEST_PROTOCOL}" if OLDEST_PROTOCOL < NEWEST_PROTOCOL else "")
        raise DumpError(
            f"{feeder} runs {agent} (stream protocol {json.dumps(protocol)}); {superhub} needs protocol {wanted}: "
            f"upgrade fedload on the {'superhub' if newer else 'feeder'}"
        )


def _version_refusal(field: str, version: str) -> str | None:
    """Why a header's version text is refused (None if it is not): a version is a short line of printable text
    (fedload's own `__version__`, pg_dump's `--version` line), never a place for a page or terminal controls."""
    if len(version) <= _MAX_VERSION_CHARS and version.isprintable():
        return None
    shown = printable(version[:_SHOWN_CHARS]) + ("..." if len(version) > _SHOWN_CHARS else "")
    return (
        f"the header's {field} is not a version ({len(version)} characters, at most {_MAX_VERSION_CHARS} "
        f"printable): {shown}"
    )


def _checked_header(header: Header) -> Header:
    """`header`, its texts checked (`_version_refusal`); DumpError if one is refused."""
    for field in ("agent_version", "pg_dump_version"):
        if (wrong := _version_refusal(field, getattr(header, field))) is not None:
            raise DumpError(f"the stream's header is refused: {wrong}")
    return header


def _checked_trailer(trailer: Trailer) -> Trailer:
    """`trailer`, its claims checked before any is believed: counts within bigint, 0 or more; exit status that of
    a process (or a signal's); every table name an identifier; an unchanged table's digest in the agent's format;
    `dump_program` one of the agent's. DumpError naming the first refused."""
    if (wrong := _trailer_refusal(trailer)) is not None:
        raise DumpError(f"the stream's trailer is refused: {wrong}")
    return trailer


def _trailer_refusal(trailer: Trailer) -> str | None:
    if not -_MAX_EXIT_STATUS <= trailer.pg_dump_exit_status <= _MAX_EXIT_STATUS:
        return f"pg_dump_exit_status is not an exit status (-{_MAX_EXIT_STATUS} to {_MAX_EXIT_STATUS})"
    if trailer.dump_program not in _DUMP_PROGRAMS:
        return f"dump_program is not one of {', '.join(_DUMP_PROGRAMS)}"
    if any(not DIGEST_FORMAT.fullmatch(digest) for *_, digest in trailer.unchanged):
        return "an unchanged table's digest is not 64 lowercase hexadecimal digits"
    return _counts_refusal(trailer) or _names_refusal(trailer)


def _counts_refusal(trailer: Trailer) -> str | None:
    """Why a count of the trailer is refused: payload_bytes, and the rows of `rows`, `unchanged` and `digests`."""
    counts = {
        "payload_bytes": [trailer.payload_bytes],
        "rows": list(trailer.row_counts().values()),
        "unchanged": [rows for *_, rows, _ in trailer.unchanged],
        "digests": [rows for *_, rows, _ in trailer.digests],
    }
    wrong = next((field for field, values in counts.items() if any(not 0 <= n <= _MAX_COUNT for n in values)), None)
    return None if wrong is None else f"a count in {wrong} is not from 0 to {_MAX_COUNT}"


def _names_refusal(trailer: Trailer) -> str | None:
    """Why a table name of the trailer is refused (`rows`, `tables`, `unchanged`, `digests`)."""
    names = [
        *trailer.row_counts(),
        *(trailer.table_keys() or ()),
        *((s, n) for s, n, *_ in trailer.unchanged),
        *((s, n) for s, n, *_ in trailer.digests),
    ]
    return next((wrong for s, n in names if (wrong := _name_refusal(s, n)) is not None), None)


def _name_refusal(schema: str, name: str) -> str | None:
    try:
        TableName.claimed(schema, name)
    except ValueError as exc:
        return f"a table it lists: {exc}"
    return None


_ADAPTERS: dict[type, TypeAdapter[object]] = {}


def _adapter(kind: type[_T]) -> TypeAdapter[_T]:
    """The validator of a frame's dataclass, built once per process: building one costs a few milliseconds of
    pydantic's schema generation, which every run paid twice (header and trailer)."""
    from pydantic import TypeAdapter  # noqa: PLC0415 - only the receiver needs pydantic

    if kind not in _ADAPTERS:
        _ADAPTERS[kind] = TypeAdapter(kind)
    return cast("TypeAdapter[_T]", _ADAPTERS[kind])


def build_validators() -> None:
    """Build the header's and the trailer's validators now: a process about to fork workers builds them once for
    all (~20 ms of pydantic's schema generation each worker would pay at its first run)."""
    for kind in (Header, Trailer):
        _adapter(kind)


def _parse(kind: type[_T], payload: bytes, what: str) -> _T:
    """Validate a header or trailer frame's JSON against its dataclass."""
    from pydantic import ValidationError  # noqa: PLC0415 - only the receiver needs pydantic

    if len(payload) > _MAX_JSON_BYTES:
        raise DumpError(f"the stream's {what} is larger than {_MAX_JSON_BYTES} bytes")
    try:
        return _adapter(kind).validate_json(payload, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise DumpError(f"the stream's {what} is not valid: {where}: {first['msg']}") from None


class GzipDecoder:
    """For feeders without the agent: plain `pg_dump | gzip` output, inflated with bounded output per call.

    Completeness rests on gzip's end-of-stream and CRC check plus the remote command's exit status.
    """

    def __init__(self) -> None:
        self._inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header, auto-detected
        self.payload_bytes = 0
        self.raw_bytes = 0

    def feed(self, raw: bytes) -> list[bytes]:
        """Dump text inflated from `raw`, in pieces of at most MAX_BLOCK_BYTES, all at once."""
        return list(self.texts(raw))

    def texts(self, raw: bytes) -> Iterator[bytes]:
        """Dump text inflated from `raw`, in pieces of at most MAX_BLOCK_BYTES, each inflated when the consumer asks
        for the next (deflate reaches ~1000:1: a 256 KiB read could inflate to 256 MiB)."""
        self.raw_bytes += len(raw)
        data = raw
        while data and not self._inflater.eof:
            text, data = self._inflate(data)
            self.payload_bytes += len(text)
            yield text
        if self._inflater.eof and (data or self._inflater.unused_data):
            raise DumpError("the feeder's gzip stream has unexpected bytes after its end")

    def _inflate(self, data: bytes) -> tuple[bytes, bytes]:
        """At most MAX_BLOCK_BYTES of text from `data`, and what of `data` is left."""
        try:
            return self._inflater.decompress(data, MAX_BLOCK_BYTES), self._inflater.unconsumed_tail
        except zlib.error as exc:
            raise DumpError(f"the feeder's gzip stream is corrupt: {exc}") from exc

    def close(self) -> None:
        """DumpError unless the gzip stream ended properly."""
        if not self._inflater.eof:
            raise DumpError(f"the feeder's gzip stream is truncated after {self.payload_bytes} bytes of dump")
