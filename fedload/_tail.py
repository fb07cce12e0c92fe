"""The last few KB of a command's stderr, kept while it runs: the agent's pg_dump, the transports' commands."""

from __future__ import annotations

from collections import deque

__all__ = ["STDERR_TAIL_BYTES", "Tail"]

STDERR_TAIL_BYTES = 4096


class Tail:
    """Keeps the last `limit_bytes` of what is appended, whole chunks until the last cut; `text()` decodes it."""

    def __init__(self, limit_bytes: int = STDERR_TAIL_BYTES) -> None:
        self._limit_bytes = limit_bytes
        self._chunks: deque[bytes] = deque()
        self._bytes = 0

    def append(self, chunk: bytes) -> None:
        """Add `chunk`, dropping the oldest chunks while the rest still hold `limit_bytes`."""
        self._chunks.append(chunk)
        self._bytes += len(chunk)
        while len(self._chunks) > 1 and self._bytes - len(self._chunks[0]) >= self._limit_bytes:
            self._bytes -= len(self._chunks.popleft())

    def text(self) -> str:
        """The last `limit_bytes` as text (invalid UTF-8 replaced)."""
        return b"".join(self._chunks)[-self._limit_bytes :].decode("utf-8", errors="replace")
