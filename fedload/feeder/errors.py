"""The agent's errors, by what its caller can do: fix the command line (exit 2), or retry later (exit 1).

Standard library only, like all of fedload/feeder/: the agent reports these itself, as one line on stderr, the same
in `fedload agent dump` and in the zipapp. `one_line` is also fedload's (re-exported by fedload.errors).
"""

from __future__ import annotations

from transforms.errors import printable

__all__ = ["EXIT_FAILED", "EXIT_USAGE", "AgentError", "AgentUsageError", "one_line"]

EXIT_FAILED, EXIT_USAGE = 1, 2


class AgentError(Exception):
    """The dump could not be made or is incomplete (pg_dump could not run, failed, or its output was refused)."""

    exit_status = EXIT_FAILED


class AgentUsageError(AgentError):
    """The command line, a file it names, or the request under a forced command is not acceptable."""

    exit_status = EXIT_USAGE


def one_line(text: str, limit: int | None = 500) -> str:
    """`text` (a command's stderr, say) as one line for an error message: whitespace collapsed, its last `limit`
    characters kept, since a tail says what went wrong; control characters escaped, never sent to a terminal."""
    flat = printable(" ".join(text.split()))
    return flat if limit is None or len(flat) <= limit else "..." + flat[-limit:]
