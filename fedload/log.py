"""structlog setup, done once per process. People read rendered lines, machines read JSON.

- Format: JSON lines under systemd (`JOURNAL_STREAM` is set) or with `--log-format json`; rendered lines for people
  everywhere else (a terminal, a file, a pipe), unless `--log-format json`.
- Level: on a terminal, warnings and errors (`-v` adds info, `-vv` debug); elsewhere (a file, the journal, the
  superhub reading an agent) the configured level, `info` unless `log_level` says otherwise.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

__all__ = ["LOG_FORMATS", "configure_logging", "configured", "get_logger", "pick_level"]

LOG_FORMATS = ("auto", "human", "json")
_LEVELS = logging.getLevelNamesMapping()
_configured = {"level": "warning", "log_format": "auto"}


def pick_level(*, verbose: int = 0, configured: str = "info") -> str:
    """The level to log at: warning on a terminal, `configured` elsewhere; each `-v` shows one level more."""
    base = _LEVELS[configured.upper()]
    if sys.stderr.isatty():
        base = max(base, logging.WARNING)
    if verbose:
        base = min(base, logging.INFO if verbose == 1 else logging.DEBUG)
    return logging.getLevelName(base).lower()


def _use_json(log_format: str) -> bool:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}")
    return log_format == "json" or (log_format == "auto" and "JOURNAL_STREAM" in os.environ)


class _StderrLogger:
    """Writes each rendered event to the `sys.stderr` of the moment, so rich's live display can place it above."""

    def msg(self, message: str) -> None:
        """Write one event line."""
        print(message, file=sys.stderr, flush=True)

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def configure_logging(*, level: str = "warning", log_format: str = "auto") -> None:
    """Send structlog events at `level` and above to stderr, as JSON lines or rendered (see the module docstring)."""
    import structlog  # noqa: PLC0415 - imported by the commands that log, not by --help or check-config

    _configured.update(level=level, log_format=log_format)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if _use_json(log_format)
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level.upper()]),
        logger_factory=lambda *_: _StderrLogger(),
        cache_logger_on_first_use=False,
    )


def configured() -> tuple[str, str]:
    """The level and format `configure_logging` set last (for a worker process to log as its parent does)."""
    return _configured["level"], _configured["log_format"]


def get_logger(**bound: Any) -> Any:
    """A structlog logger with `bound` fields on every event."""
    import structlog  # noqa: PLC0415

    return structlog.get_logger(**bound)
