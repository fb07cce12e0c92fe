"""PostgreSQL's refusals of a feeder's data while it reads it (COPY, INSERT, the unique indexes built on it): the
dump's fault, so a dump error naming the feeder and the table, in every dump mode (docs/trust.md). Other failures
in that phase (a lost connection, a statement timeout, a full disk) stay the superhub's.

By SQLSTATE, never by message: class 22 (data exception: a value its type refuses, binary data in another format)
and 23 (integrity: NOT NULL, CHECK, a duplicate key), 54000 (program limit exceeded: seven array dimensions),
08P01 (protocol violation: a binary value shorter than its type, "insufficient data left in message") and 42804
(datatype mismatch: a binary array or record of another element type).
"""

from __future__ import annotations

import asyncpg

from fedload.errors import DumpError
from fedload.superhub.session import server_message

__all__ = ["is_data_refusal", "refused_data"]

_DATA_CLASSES = ("22", "23")
_DATA_STATES = frozenset({"08P01", "42804", "54000"})


def is_data_refusal(exc: BaseException) -> bool:
    """Whether `exc`, raised while PostgreSQL read a feeder's data, is a refusal of that data."""
    state = getattr(exc, "sqlstate", None) or ""
    return isinstance(exc, asyncpg.PostgresError) and (state[:2] in _DATA_CLASSES or state in _DATA_STATES)


def refused_data(exc: asyncpg.PostgresError, *, feeder: str, table: str) -> DumpError:
    """The dump error for PostgreSQL's refusal `exc` of `feeder`'s data of `table`."""
    return DumpError(
        f"table {table}: the superhub refused the data of feeder {feeder} (SQLSTATE {exc.sqlstate}): "
        f"{server_message(exc)}"
    )
