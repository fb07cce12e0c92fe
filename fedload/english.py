"""Numbers in sentences for people: "1 feeder", "2 feeders", "1,234 rows"."""

from __future__ import annotations

__all__ = ["counted"]


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """`count` and the noun it counts, singular for exactly one: counted(1, "table") == "1 table"."""
    noun = singular if count == 1 else plural or f"{singular}s"
    return f"{count:,} {noun}"
