"""The superhub session's socket: a local superhub's (Unix socket) takes a block of COPY data in one send; a TCP
socket keeps the kernel's autotuned buffer."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from fedload.localpg import LocalCluster
from fedload.superhub.session import (
    _LOCAL_SEND_BUFFER_BYTES,
    SuperhubTarget,
    _larger_local_send_buffer,
    close_superhub,
    connect_superhub,
)


def _cap() -> int:
    """The send buffer the kernel gives for the size asked (it doubles what it accepts, up to wmem_max)."""
    wmem_max = int(Path("/proc/sys/net/core/wmem_max").read_text())
    return 2 * min(_LOCAL_SEND_BUFFER_BYTES, wmem_max)


async def test_a_local_superhubs_socket_takes_a_block_in_one_send(cluster: LocalCluster) -> None:
    """Over the cluster's Unix socket the session's send buffer is the one asked for, or the kernel's cap."""
    conn = await connect_superhub(SuperhubTarget(cluster.dsn(), 30.0, 60.0))
    try:
        sock = getattr(conn, "_transport").get_extra_info("socket")  # noqa: B009 - the driver keeps it there, untyped
        assert sock.family == socket.AF_UNIX
        size = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert size == _cap()
    finally:
        await close_superhub(conn)


class _Connection:
    """What `_larger_local_send_buffer` reads of an asyncpg connection: its transport."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport


async def test_a_tcp_socket_keeps_its_buffer() -> None:
    """A TCP connection (a remote superhub) is left as it is: a fixed size would turn off the kernel's autotuning."""
    accepted: list[asyncio.StreamWriter] = []  # the server's side of the connection, closed at the end

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        sock = writer.get_extra_info("socket")
        before = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        _larger_local_send_buffer(_Connection(writer.transport))  # type: ignore[arg-type]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == before
        writer.close()
        await writer.wait_closed()
    finally:
        for theirs in accepted:
            theirs.close()
            await theirs.wait_closed()
        server.close()
        await server.wait_closed()
