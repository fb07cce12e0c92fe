"""fedload's errors, grouped by what the caller can do about them.

- `ConfigError`: fix the configuration file or the command line (exit code 2).
- `FeederError`: the feeder could not be reached or its dump did not arrive; retry later.
- `DumpError`: a dump arrived but is incomplete, malformed or not allowed; reject it, keep the old data.
- `SuperhubError`: the superhub database failed; retry later.
- `WorkerError`: the worker process running a feeder's run died or stopped answering; the run failed, retry later.

Adapters translate library exceptions (asyncssh, asyncpg, OS errors) into these with `raise ... from exc`.
"""

from __future__ import annotations

from transforms.errors import printable

__all__ = [
    "ConfigError",
    "DumpError",
    "FedloadError",
    "FeederAuthError",
    "FeederCommandError",
    "FeederConnectionLostError",
    "FeederError",
    "FeederHostKeyError",
    "FeederTimeoutError",
    "FeederUnreachableError",
    "SuperhubError",
    "SwapLockError",
    "UsageError",
    "WorkerError",
    "one_line",
]


class FedloadError(Exception):
    """Base class of every error fedload reports to its user as one sentence."""


class ConfigError(FedloadError):
    """The configuration is invalid: fix the file."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class UsageError(FedloadError):
    """The command line is invalid: fix the arguments."""


class FeederError(FedloadError):
    """A feeder could not deliver its dump (unreachable, refused, authentication, remote failure): retry later."""


class FeederUnreachableError(FeederError):
    """The feeder's name does not resolve, or its SSH port refuses or does not answer."""


class FeederAuthError(FeederError):
    """The feeder refused the superhub's key or user."""


class FeederHostKeyError(FeederError):
    """The feeder's host key is unknown or does not match known_hosts: possibly another machine."""


class FeederTimeoutError(FeederError):
    """The feeder stopped sending for longer than the read timeout."""


class FeederConnectionLostError(FeederError):
    """The connection to the feeder broke during the dump."""


class FeederCommandError(FeederError):
    """The dump command on the feeder could not run or exited non-zero; the message ends with its stderr tail."""


class DumpError(FedloadError):
    """A feeder's dump is incomplete, malformed or tries something not allowed: rejected, old data kept."""


class SuperhubError(FedloadError):
    """The superhub database failed: retry later."""


class SwapLockError(SuperhubError):
    """The swap could not get its locks in time (other sessions held the tables); the old data stays."""


class WorkerError(FedloadError):
    """A worker process died or stopped answering during a feeder's run: that run failed, its old data stays."""


def one_line(text: str, limit: int | None = 500) -> str:
    """`text` (a command's stderr, say) as one line for an error message: whitespace collapsed, its last `limit`
    characters kept, since a tail says what went wrong; control characters escaped, never sent to a terminal."""
    flat = printable(" ".join(text.split()))
    return flat if limit is None or len(flat) <= limit else "..." + flat[-limit:]
