"""SQL text the agent writes itself: identifiers quoted, never taken as SQL from a request. Standard library only."""

from __future__ import annotations

__all__ = ["quote_ident", "serially"]


def quote_ident(name: str) -> str:
    """`name` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def serially(statement: str) -> str:
    """`statement` run without parallel workers, the setting restored after it: a scan that hashes every row costs
    the server more CPU in workers than the scan they share (bench/digest_cost.py)."""
    return f"SET max_parallel_workers_per_gather = 0; {statement} RESET max_parallel_workers_per_gather;"
