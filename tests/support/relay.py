"""The forwarding half of the tests' TCP relays on loopback (tests/transport/): one direction of a connection."""

from __future__ import annotations

import asyncio
import contextlib


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, silent: asyncio.Event | None = None) -> None:
    """Forward what `reader` reads to `writer` until it ends or its connection fails, then close `writer`; once
    `silent` is set, read on and forward nothing (a network gone quiet, the connection still open)."""
    try:
        while data := await reader.read(1 << 16):
            if silent is None or not silent.is_set():
                writer.write(data)
                await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
