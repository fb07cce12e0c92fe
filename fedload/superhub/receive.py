"""Receive one feeder's dump: raw bytes from a transport, checked and unpacked, split into statements.

Reading happens only when the consumer asks for the next item, so a slow import slows the feeder down
(backpressure through the SSH channel or the pipe) and memory holds about one read chunk of dump.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fedload.errors import DumpError, FeederCommandError, one_line
from fedload.stream import GzipDecoder, Header, StreamDecoder, Trailer
from fedload.transport import FeederProcess
from transforms import DumpSplitter, DumpSyntaxError, Item
from transforms.inserts import TuplesPatterns

__all__ = ["READ_BYTES", "DumpReceiver"]

READ_BYTES = 1 << 18


class DumpReceiver:
    """Iterate `items()` once; afterwards `trailer` holds the agent's verified trailer (None without agent).

    `feeder` names the feeder in messages, such as the one refusing an agent of an incompatible version."""

    def __init__(self, process: FeederProcess, *, framed: bool = True, feeder: str = "") -> None:
        self._process = process
        self._decoder: StreamDecoder | GzipDecoder = StreamDecoder(feeder) if framed else GzipDecoder()
        self._splitter = DumpSplitter()
        self.trailer: Trailer | None = None

    @property
    def header(self) -> Header | None:
        """The agent's header (its versions, compression, tables) once the first frame has arrived; None before,
        and without the agent."""
        return self._decoder.header if isinstance(self._decoder, StreamDecoder) else None

    def read_tuples_with(self, patterns: TuplesPatterns) -> None:
        """Read multi-row INSERTs in one pass of their target's pattern (DumpSplitter.read_tuples_with)."""
        self._splitter.read_tuples_with(patterns)

    @property
    def raw_bytes(self) -> int:
        """Bytes received from the feeder so far (compressed)."""
        return self._decoder.raw_bytes

    @property
    def dump_bytes(self) -> int:
        """Bytes of dump text unpacked so far."""
        return self._decoder.payload_bytes

    async def items(self) -> AsyncIterator[Item]:
        """The dump's items in order; raises DumpError or FeederError if it is not complete and valid."""
        try:
            while raw := await self._process.read(READ_BYTES):
                for text in self._decoder.feed(raw):
                    for item in self._splitter.feed(text):
                        yield item
            await self._finish()
            for item in self._splitter.close():
                yield item
        except DumpSyntaxError as exc:
            raise DumpError(f"the dump is malformed at {exc}") from exc

    async def _finish(self) -> None:
        status = await self._process.wait()
        try:
            self.trailer = self._decoder.close()
        except DumpError:
            arrived_trailer = getattr(self._decoder, "trailer", None) is not None
            if status != 0 and not arrived_trailer:  # then the command's own failure explains the cut-off stream
                raise FeederCommandError(self._command_failure(status)) from None
            raise
        if status != 0:
            raise FeederCommandError(self._command_failure(status))

    def _command_failure(self, status: int) -> str:
        tail = one_line(self._process.stderr_tail)
        return f"the dump command on the feeder exited with status {status}" + (f": {tail}" if tail else "")
