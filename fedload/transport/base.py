"""The Transport interface: start a dump command on a feeder and read its raw stdout with backpressure."""

from __future__ import annotations

from typing import Protocol

__all__ = ["FeederProcess", "Transport"]


class FeederProcess(Protocol):
    """A dump command running on a feeder."""

    async def read(self, max_bytes: int) -> bytes:
        """Up to `max_bytes` of stdout; b"" at the end. Not reading stops the feeder's writer (backpressure).

        FeederTimeoutError if nothing arrives within the read timeout; FeederConnectionLostError if the link breaks.
        """
        ...

    async def wait(self) -> int:
        """The command's exit status once stdout has ended (bounded wait); FeederCommandError if unknown."""
        ...

    @property
    def stderr_tail(self) -> str:
        """The last few KB the command wrote to stderr."""
        ...

    async def cancel(self) -> None:
        """Stop the command and release the connection; idempotent, never raises."""
        ...


class Transport(Protocol):
    """How the superhub reaches one feeder."""

    async def open(self, argv: list[str]) -> FeederProcess:
        """Start `argv` on the feeder; raise a FeederError subclass saying why it could not start."""
        ...

    def connect_ahead(self) -> None:
        """Start reaching the feeder now, in the background, for the next `open` to use (an SSH connection's
        handshake); nothing where there is nothing to reach (a local command). A failure is `open`'s to raise."""
        ...

    async def close(self) -> None:
        """Release what `connect_ahead` started and no `open` took; idempotent, bounded, never raises."""
        ...
