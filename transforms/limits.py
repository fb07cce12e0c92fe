"""The transformer's default caps on a merged INSERT, apart from the transformer, so that a command line can state
them without importing it (the agent in binary mode never transforms)."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_STATEMENT_BYTES", "DEFAULT_ROWS_PER_STATEMENT"]

DEFAULT_ROWS_PER_STATEMENT = 1000
DEFAULT_MAX_STATEMENT_BYTES = 16 * 1024 * 1024
