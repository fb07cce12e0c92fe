"""SQL text the agent writes itself: identifiers quoted, never taken as SQL from a request. Standard library only."""

from __future__ import annotations

__all__ = ["quote_ident"]


def quote_ident(name: str) -> str:
    """`name` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'
