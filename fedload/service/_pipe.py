"""Messages between fedload and its own worker processes: length-prefixed pickles over a Unix socket pair.

Only fedload's parent and the workers it started are at either end (the socket is inherited, never named), so
pickle carries configuration, progress and results as they are. Feeder data never crosses it.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

__all__ = ["frame", "receive"]

_HEADER = 4
_MAX_MESSAGE = 64 << 20  # a run's result or config is kilobytes: anything larger is a bug


def frame(message: Any) -> bytes:
    """`message` ready to write: its length, then its pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(_HEADER, "big") + data


async def receive(reader: asyncio.StreamReader) -> Any:
    """The next message; asyncio.IncompleteReadError when the other end has gone."""
    size = int.from_bytes(await reader.readexactly(_HEADER), "big")
    if size > _MAX_MESSAGE:
        raise ValueError(f"a worker message of {size} bytes")
    return pickle.loads(await reader.readexactly(size))  # noqa: S301 - our own process at the other end
