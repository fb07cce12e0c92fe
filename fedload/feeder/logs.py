"""The agent's logging: fedload's structlog setup (fedload.log) where fedload is installed, else the standard
library's `logging` (the zipapp, or no structlog), with the same dotted event names and fields, on stderr.

Formats as fedload.log chooses them: JSON lines under systemd (`JOURNAL_STREAM`) or with `--log-format json`,
else `timestamp [level] event key=value ...` lines. Levels: warning on a terminal, else info (warning with
`--quiet`); each `-v` shows one level more.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import sys
from typing import Any

__all__ = ["LOG_FORMATS", "configure", "get_logger", "uses_structlog"]

LOG_FORMATS = ("auto", "human", "json")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_stdlib = logging.getLogger("fedload.agent")


@functools.lru_cache(maxsize=1)
def uses_structlog() -> bool:
    """Whether events go through fedload.log and structlog (both importable here), not the standard library."""
    try:
        return importlib.util.find_spec("structlog") is not None and importlib.util.find_spec("fedload.log") is not None
    except (ImportError, ValueError):
        return False


def configure(*, verbose: int = 0, quiet: bool = False, log_format: str = "auto") -> None:
    """Log to stderr at the level and in the format described in the module docstring."""
    configured = "warning" if quiet else "info"
    if uses_structlog():
        from fedload.log import configure_logging, pick_level  # noqa: PLC0415 - not in the zipapp

        configure_logging(level=pick_level(verbose=verbose, configured=configured), log_format=log_format)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_EventFormatter(as_json=_use_json(log_format)))
    _stdlib.handlers[:] = [handler]
    _stdlib.propagate = False
    _stdlib.setLevel(_pick_level(verbose, configured))


def get_logger(**bound: Any) -> Any:
    """A logger with structlog's calls (`log.info("agent.dump_finished", rows=3)`, `bind`)."""
    if uses_structlog():
        from fedload.log import get_logger as structlog_logger  # noqa: PLC0415 - not in the zipapp

        return structlog_logger(**bound)
    return _StdlibLogger(bound)


def _pick_level(verbose: int, configured: str) -> int:
    base = _LEVELS[configured]
    if sys.stderr.isatty():
        base = max(base, logging.WARNING)
    if verbose:
        base = min(base, logging.INFO if verbose == 1 else logging.DEBUG)
    return base


def _use_json(log_format: str) -> bool:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}")
    return log_format == "json" or (log_format == "auto" and "JOURNAL_STREAM" in os.environ)


class _StdlibLogger:
    """structlog's calling convention over a standard library logger."""

    def __init__(self, bound: dict[str, Any]) -> None:
        self._bound = bound

    def bind(self, **more: Any) -> _StdlibLogger:
        """A logger with more fields on every event."""
        return _StdlibLogger({**self._bound, **more})

    def _log(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if _stdlib.isEnabledFor(level):
            exc_info = fields.pop("exc_info", None)
            _stdlib.log(level, event, exc_info=exc_info, extra={"fedload_fields": {**self._bound, **fields}})

    def debug(self, event: str, **fields: Any) -> None:
        """Log `event` at debug level."""
        self._log(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log `event` at info level."""
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log `event` at warning level."""
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        """Log `event` at error level."""
        self._log(logging.ERROR, event, fields)


class _EventFormatter(logging.Formatter):
    """A record as structlog would render it: a JSON object, or `timestamp [level] event key=value ...`."""

    def __init__(self, *, as_json: bool) -> None:
        super().__init__()
        self._as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        """One line (and a traceback's lines, if the event carries one)."""
        import datetime  # noqa: PLC0415 - only once an event is logged, not at every agent's start (#36)

        fields: dict[str, Any] = getattr(record, "fedload_fields", {})
        stamp = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat()
        stamp = stamp.replace("+00:00", "Z")
        level, event = record.levelname.lower(), record.getMessage()
        trace = self.formatException(record.exc_info) if record.exc_info else ""
        if self._as_json:
            extra = {"exception": trace} if trace else {}
            return json.dumps({"event": event, **fields, "level": level, "timestamp": stamp, **extra}, default=str)
        pairs = " ".join(f"{key}={_value(value)}" for key, value in fields.items())
        line = f"{stamp} [{level}] {event} {pairs}".rstrip()
        return f"{line}\n{trace}" if trace else line


def _value(value: Any) -> str:
    text = str(value)
    return text if text and not any(c.isspace() or c in "\"'=" for c in text) else json.dumps(text)
