"""The stderr tail kept for the agent's pg_dump and the transports' commands."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fedload._tail import Tail


@given(st.lists(st.binary(max_size=50)), st.integers(1, 120))
def test_tail_keeps_the_last_bytes(chunks: list[bytes], limit: int) -> None:
    """Whatever the chunks, the tail is the last `limit` bytes of all that was appended."""
    tail = Tail(limit)
    for chunk in chunks:
        tail.append(chunk)
    assert tail.text() == b"".join(chunks)[-limit:].decode("utf-8", errors="replace")


def test_tail_decodes_leniently() -> None:
    """Invalid UTF-8 (a multi-byte character cut by the limit) becomes a replacement character, not an error."""
    tail = Tail(2)
    tail.append("pg_dump: éa".encode())
    assert tail.text() == "\ufffda"
