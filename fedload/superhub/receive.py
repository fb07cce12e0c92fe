"""Receive one feeder's dump: raw bytes from a transport, checked and unpacked, split into statements.

Reading happens only when the consumer asks for the next item, so a slow import slows the feeder down
(backpressure through the SSH channel or the pipe) and memory holds about one read chunk of dump.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fedload.config import DEFAULT_RECEIVED_STATEMENT_BYTES, DumpMode
from fedload.errors import AgentRefusedError, DumpError, FeederCommandError, one_line
from fedload.feeder.wire import BINARY_PROTOCOL
from fedload.names import TableName
from fedload.stream import GzipDecoder, Header, StreamDecoder, Trailer
from fedload.superhub.binary_receive import SectionItem, SectionSplitter, UnchangedTable
from fedload.transport import FeederProcess
from transforms import DumpSplitter, DumpSyntaxError, Item, TooLargeError, qualified_name
from transforms.inserts import TuplesPatterns

__all__ = ["READ_BYTES", "DumpReceiver"]

READ_BYTES = 1 << 18


class DumpReceiver:
    """Iterate `items()` once; afterwards `trailer` holds the agent's verified trailer (None without agent).

    `feeder` names the feeder in messages, such as the one refusing an agent of an incompatible version."""

    def __init__(
        self,
        process: FeederProcess,
        *,
        framed: bool = True,
        feeder: str = "",
        dump_mode: DumpMode = DumpMode.COPY,
        max_statement_bytes: int = DEFAULT_RECEIVED_STATEMENT_BYTES,
        statistics: bool = False,
        digests: bool = False,
    ) -> None:
        """`dump_mode`: the mode the feeder was asked for, which the agent's header must state; `statistics`: it was
        asked for its tables' statistics, `digests` for its tables' digests in copy or inserts mode (an agent too old
        for any is told apart)."""
        self._process = process
        self._feeder = feeder
        self._dump_mode, self._header_checked = dump_mode, False
        self._decoder: StreamDecoder | GzipDecoder = StreamDecoder(feeder) if framed else GzipDecoder()
        # errors after COPY data name the byte offset (its lines are not counted: a pass over every byte)
        self._splitter: DumpSplitter | SectionSplitter = DumpSplitter(max_statement_bytes, count_copy_lines=False)
        self._binary, self._sections = dump_mode == DumpMode.BINARY, False
        self._max_statement_bytes = max_statement_bytes
        self._statistics = statistics
        self._digests = digests
        self.trailer: Trailer | None = None

    @property
    def header(self) -> Header | None:
        """The agent's header (its versions, compression, tables) once the first frame has arrived; None before,
        and without the agent."""
        return self._decoder.header if isinstance(self._decoder, StreamDecoder) else None

    def read_tuples_with(self, patterns: TuplesPatterns) -> None:
        """Read multi-row INSERTs in one pass of their target's pattern (DumpSplitter.read_tuples_with)."""
        if isinstance(self._splitter, DumpSplitter):  # a binary stream's sections hold no INSERTs
            self._splitter.read_tuples_with(patterns)

    @property
    def raw_bytes(self) -> int:
        """Bytes received from the feeder so far (compressed)."""
        return self._decoder.raw_bytes

    @property
    def dump_bytes(self) -> int:
        """Bytes of dump text unpacked so far."""
        return self._decoder.payload_bytes

    async def items(self) -> AsyncIterator[Item | SectionItem]:
        """The dump's items in order; raises DumpError or FeederError if it is not complete and valid."""
        try:
            while raw := await self._process.read(READ_BYTES):
                for text in self._decoder.texts(raw):  # inflated one block at a time: the splitter's bound holds
                    if not self._header_checked:
                        self._check_header()
                    for item in self._splitter.feed(text):
                        yield item
            await self._finish()
            for item in self._splitter.close():
                yield item
            for item in self._unchanged():
                yield item
        except TooLargeError as exc:
            raise DumpError(self._too_large(exc)) from None
        except DumpSyntaxError as exc:
            raise DumpError(f"the dump is malformed at {exc}") from exc

    def _unchanged(self) -> list[UnchangedTable]:
        """The tables a copy or inserts mode's trailer lists as not dumped, their digest unchanged (protocol 5), as
        a binary stream's sections would say it."""
        if self.trailer is None or self._sections:
            return []
        return [UnchangedTable(TableName(s, n), rows, digest) for s, n, rows, digest in self.trailer.unchanged]

    def _check_header(self) -> None:
        """The header states the mode asked (DumpError if not), and a binary stream is read by its sections. Without
        the agent there is no header."""
        if (header := self.header) is None:
            return
        self._header_checked = True
        if header.dump_mode != self._dump_mode:
            where = f"feeder {self._feeder}" if self._feeder else "the feeder"
            raise DumpError(
                f"{where}: the agent's stream states dump_mode {header.dump_mode!r}, but the superhub asked for "
                f"{self._dump_mode.value!r}: refused"
            )
        if header.dump_mode == DumpMode.BINARY:
            self._splitter, self._sections = self._section_splitter(header), True

    def _section_splitter(self, header: Header) -> SectionSplitter:
        """The reader of a binary stream's sections; DumpError if the header's protocol predates them."""
        if header.protocol < BINARY_PROTOCOL:
            raise DumpError(f"the feeder's agent states dump_mode binary in stream protocol {header.protocol}")
        return SectionSplitter(self._feeder, self._max_statement_bytes)

    def _too_large(self, exc: TooLargeError) -> str:
        """A statement or row past the bound, in one line: the feeder, the table, where, and the setting to raise."""
        where = f"feeder {self._feeder}" if self._feeder else "the feeder"
        if exc.table is not None:
            where += f", table {qualified_name(exc.table)}"
        at = f"dump line {exc.line}" if exc.line else f"dump byte {exc.offset}"
        return (
            f"{where}: {exc.what} at {at} is larger than superhub.max_statement_bytes = {exc.limit} "
            f"({exc.limit / (1 << 20):g} MiB): refused as a bad dump; raise the setting if the feeder's values are "
            "really that large"
        )

    async def _finish(self) -> None:
        status = await self._process.wait()
        try:
            self.trailer = self._decoder.close()
            if not self._header_checked:  # a stream of no dump text (every table unchanged)
                self._check_header()
        except DumpError:
            arrived_trailer = getattr(self._decoder, "trailer", None) is not None
            if status != 0 and not arrived_trailer:  # then the command's own failure explains the cut-off stream
                raise self._command_error(status) from None
            raise
        if status != 0:
            raise self._command_error(status)

    def _command_error(self, status: int) -> FeederCommandError:
        """The dump command's failure; AgentRefusedError where it refused its command line before any stream (exit
        2: a usage error), which the run may answer by asking less (fedload.superhub.unchanged)."""
        refused = status == 2 and self.header is None
        return (AgentRefusedError if refused else FeederCommandError)(self._command_failure(status))

    def _command_failure(self, status: int) -> str:
        tail = one_line(self._process.stderr_tail)
        failure = f"the dump command on the feeder exited with status {status}" + (f": {tail}" if tail else "")
        if self._binary and status == 2 and self.header is None:  # refused its options before any stream
            failure += '; a fedload agent older than dump_mode = "binary" refuses it: upgrade fedload on the feeder'
        if self._statistics and status == 2 and self.header is None:
            failure += (
                "; a fedload agent older than carried statistics refuses --statistics: upgrade fedload on the feeder "
                f"or set feeders.{self._feeder or 'NAME'}.carry_statistics = false"
            )
        if self._digests and status == 2 and self.header is None:
            failure += (
                "; a fedload agent older than unchanged tables in copy and inserts modes refuses --columns: upgrade "
                f"fedload on the feeder or set feeders.{self._feeder or 'NAME'}.skip_unchanged = false"
            )
        return failure
