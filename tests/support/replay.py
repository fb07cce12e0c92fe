"""A FeederProcess that plays back recorded stdout, for tests of the superhub's receiver without a feeder."""

from __future__ import annotations


class Replay:
    """A FeederProcess that plays back recorded stdout in small reads (7 bytes: every frame arrives cut), then
    exits 0."""

    def __init__(self, stdout: bytes) -> None:
        self._stdout = stdout
        self.stderr_tail = ""

    async def read(self, max_bytes: int) -> bytes:
        chunk, self._stdout = self._stdout[:7], self._stdout[7:]
        return chunk

    async def wait(self) -> int:
        return 0

    async def cancel(self) -> None:
        return None
