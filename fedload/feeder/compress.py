"""The agent's compressor: zstd through the zstandard module, else through the zstd program (`zstd` on PATH, or
the one `--zstd PATH` names), else gzip (zlib).

Each call compresses one stream block into one independent frame: a zstd frame stating its content size and
carrying a checksum (what the superhub requires of a block), or a gzip member. The zstd program gets
`--stream-size`, so it writes the content size too; a program that does not is not used. The stream's header
states the compression actually used, and a fallback is logged, so a feeder without zstd still delivers.
"""

from __future__ import annotations

import subprocess
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from fedload.feeder.errors import AgentError, one_line
from fedload.feeder.logs import get_logger

__all__ = ["Compressor", "choose_compressor", "gzip_compressor"]

# Level 2, not zstd's default 3: per 1 MiB block, min of 7 (this machine), 24-28% less CPU and 4-6% fewer bytes on
# the benchmark's dump text (binary COPY 62 MB: 0.105 s / 5.21 MB vs 0.138 s / 5.44 MB; COPY text 53 MB: 0.073 s /
# 4.15 MB vs 0.101 s / 4.39 MB), and on other data (a tar of Python's library, of shared libraries) 26-35% less CPU
# for 4-5% more bytes. The feeder's CPU is what a dump waits for: the compressor is most of the agent's own.
_ZSTD_LEVEL = 2
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_PROGRAM_TIMEOUT_S = 120.0  # one block of at most 1 MiB

log = get_logger()


@dataclass(frozen=True)
class Compressor:
    """One way to compress the stream's blocks."""

    compression: str  # what the stream's header states: "zstd" or "gzip"
    implementation: str  # for the log: "the zstandard module 0.25.0", "the zstd program /usr/bin/zstd", "zlib"
    compress: Callable[[bytes], bytes]


def choose_compressor(requested: str, zstd_program: str = "zstd") -> Compressor:
    """The compressor for `requested` ("zstd" or "gzip"); for zstd without zstandard nor a usable `zstd_program`
    (a name looked up on PATH, or a path), gzip. Each fallback is logged, saying which compressor is used and why."""
    if requested == "gzip":
        return gzip_compressor()
    if requested != "zstd":
        raise ValueError(f"unknown compression {requested!r}")
    module = zstandard_compressor()
    if module is not None:
        return module
    program, why_not = zstd_program_compressor(zstd_program)
    if program is not None:
        log.info("agent.compression_fallback", requested=requested, using=program.implementation, reason=why_not)
        return program
    log.warning("agent.compression_fallback", requested=requested, using="gzip (zlib)", reason=why_not)
    return gzip_compressor()


def zstandard_compressor() -> Compressor | None:
    """zstd through the zstandard module, if it can be imported."""
    try:
        import zstandard  # noqa: PLC0415 - optional on a feeder
    except ImportError:
        return None
    compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True, write_content_size=True)
    return Compressor("zstd", f"the zstandard module {zstandard.__version__}", compressor.compress)


def zstd_program_compressor(program: str = "zstd") -> tuple[Compressor | None, str]:
    """zstd through `program` (a name on PATH, or a path), if it writes frames the superhub reads; else None and
    why not."""
    import shutil  # noqa: PLC0415 - with bz2 and lzma, only where the zstandard module is missing (#36)

    path = shutil.which(program)
    if path is None:
        where = "on PATH" if "/" not in program else "not an executable file"
        return None, f"neither the zstandard module nor the zstd program ({program}: {where}) is installed"
    compress = _program(path)
    try:
        sample = compress(b"fedload")
    except AgentError as exc:
        return None, f"the zstandard module is not installed and {exc}"
    if not _states_size_and_checksum(sample):
        return None, f"the zstandard module is not installed and {path} writes no content size or checksum"
    return Compressor("zstd", f"the zstd program {path}", compress), "the zstandard module is not installed"


def gzip_compressor() -> Compressor:
    """gzip members from the standard library's zlib."""

    def compress(block: bytes) -> bytes:
        deflater = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
        return deflater.compress(block) + deflater.flush()

    return Compressor("gzip", "zlib", compress)


def _program(path: str) -> Callable[[bytes], bytes]:
    def compress(block: bytes) -> bytes:
        argv = [path, "-q", "-c", f"-{_ZSTD_LEVEL}", f"--stream-size={len(block)}"]
        try:
            done = subprocess.run(argv, input=block, capture_output=True, timeout=_PROGRAM_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise AgentError(f"the zstd program {path} could not compress: {exc}") from exc
        if done.returncode != 0:
            stderr = one_line(done.stderr.decode(errors="replace"))
            raise AgentError(f"the zstd program {path} exited with status {done.returncode}: {stderr}")
        return done.stdout

    return compress


def _states_size_and_checksum(frame: bytes) -> bool:
    """Whether a zstd frame's header states the content size and announces a checksum (RFC 8878, 3.1.1.1.1)."""
    if len(frame) < 5 or not frame.startswith(_ZSTD_MAGIC):
        return False
    descriptor = frame[4]
    size_stated = descriptor >> 6 != 0 or descriptor & 0x20 != 0  # Frame_Content_Size_flag or Single_Segment_flag
    return size_stated and descriptor & 0x04 != 0  # Content_Checksum_flag
