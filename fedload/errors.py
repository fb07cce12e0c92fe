"""fedload's errors, grouped by what the caller can do about them.

- `ConfigError`: fix the configuration file or the command line (exit code 2).
- `FeederError`: the feeder could not be reached or its dump did not arrive; retry later.
- `DumpError`: a dump arrived but is incomplete, malformed or not allowed; reject it, keep the old data.
- `SuperhubError`: the superhub database failed; retry later.
- `WorkerError`: the worker process running a feeder's run died or stopped answering; the run failed, retry later.

Adapters translate library exceptions (asyncssh, asyncpg, OS errors) into these with `raise ... from exc`.
Each class has a `kind` (`ErrorKind`), which a failed run's record keeps, so that the status, the daemon's
back-off and alerts can tell a feeder that sent a bad dump from one that could not be reached.
"""

from __future__ import annotations

from enum import StrEnum

from fedload.feeder.errors import one_line

__all__ = [
    "AgentRefusedError",
    "ConfigError",
    "DumpError",
    "ErrorKind",
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
    "capped_error",
    "internal_error",
    "one_line",
]

MAX_ERROR_CHARS = 2000  # of a run's error: what fedload.runs, status, the log and alerts show


class ErrorKind(StrEnum):
    """What kind of failure ended a run; the values are those of `fedload.runs.error_kind` and of JSON."""

    CONFIG = "config"  # the configuration does not fit the superhub (a pattern matching no parent, a remap file)
    TRANSPORT = "transport"  # the feeder could not be reached or its dump did not arrive
    DUMP = "dump"  # the dump arrived but is incomplete, malformed or not allowed
    SUPERHUB = "superhub"  # the superhub database failed (or refused the swap's locks)
    TIMEOUT = "timeout"  # the run took longer than run_timeout_s
    CANCELLED = "cancelled"  # the run was cancelled (a stopping daemon, Ctrl-C)
    INTERNAL = "internal"  # a bug or a crash: an exception fedload did not expect, a worker that died or hung


class FedloadError(Exception):
    """Base class of every error fedload reports to its user as one sentence."""

    kind = ErrorKind.INTERNAL


class ConfigError(FedloadError):
    """The configuration is invalid: fix the file."""

    kind = ErrorKind.CONFIG

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class UsageError(FedloadError):
    """The command line is invalid: fix the arguments."""

    kind = ErrorKind.CONFIG


class FeederError(FedloadError):
    """A feeder could not deliver its dump (unreachable, refused, authentication, remote failure): retry later."""

    kind = ErrorKind.TRANSPORT


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


class AgentRefusedError(FeederCommandError):
    """The dump command refused its command line, the superhub's request, before writing any stream (exit 2)."""


class DumpError(FedloadError):
    """A feeder's dump is incomplete, malformed or tries something not allowed: rejected, old data kept."""

    kind = ErrorKind.DUMP


class SuperhubError(FedloadError):
    """The superhub database failed: retry later."""

    kind = ErrorKind.SUPERHUB


class SwapLockError(SuperhubError):
    """The swap could not get its locks in time (other sessions held the tables); the old data stays."""


class WorkerError(FedloadError):
    """A worker process died or stopped answering during a feeder's run: that run failed, its old data stays."""


def capped_error(text: str) -> str:
    """A run's error as its record keeps it: one printable line (`one_line`) of at most MAX_ERROR_CHARS, its start
    kept (the sentence names the feeder, the table and what was wrong; a feeder's own words may follow, at any
    length)."""
    flat = one_line(text, limit=None)
    if len(flat) <= MAX_ERROR_CHARS:
        return flat
    return f"{flat[:MAX_ERROR_CHARS]}... ({len(flat) - MAX_ERROR_CHARS} more characters)"


def internal_error(exc: BaseException) -> str:
    """How an exception fedload did not expect (a bug, a library failing in an unforeseen way) reads in a run's
    error: "internal error: <class>: <message>", on one line."""
    return one_line(f"internal error: {type(exc).__name__}: {exc}".removesuffix(": "), limit=None)
