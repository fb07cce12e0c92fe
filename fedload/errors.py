"""fedload's errors, grouped by what the caller can do about them.

- `ConfigError`: fix the configuration file or the command line (exit code 2).
- `FeederError`: the feeder could not be reached or its dump did not arrive; retry later.
- `DumpError`: a dump arrived but is incomplete, malformed or not allowed; reject it, keep the old data.
- `SuperhubError`: the superhub database failed; retry later.

Adapters translate library exceptions (asyncssh, asyncpg, OS errors) into these with `raise ... from exc`.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DumpError",
    "FedloadError",
    "FeederError",
    "SuperhubError",
    "UsageError",
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


class DumpError(FedloadError):
    """A feeder's dump is incomplete, malformed or tries something not allowed: rejected, old data kept."""


class SuperhubError(FedloadError):
    """The superhub database failed: retry later."""
