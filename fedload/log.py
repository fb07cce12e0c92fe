"""structlog setup, done once per process. People read rendered lines, machines read JSON.

- Format: JSON lines under systemd (`JOURNAL_STREAM` is set) or with `--log-format json`; rendered lines for people
  everywhere else (a terminal, a file, a pipe), unless `--log-format json`.
- Priority: where stderr is the journal's stream itself (`JOURNAL_STREAM` names its device and inode), each line
  starts with its syslog priority, sd-daemon's `<N>` (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug), which
  journald strips and keeps as the entry's priority: `journalctl -p err` finds the errors. A child whose stderr is
  a pipe (an agent the daemon runs locally) inherits the variable but not the stream, and writes no prefix.
- Level: on a terminal, warnings and errors (`-v` adds info, `-vv` debug); elsewhere (a file, the journal, the
  superhub reading an agent) the configured level, `info` unless `log_level` says otherwise.

structlog (and rich, which its console renderer imports) is imported when the first event at or above the level is
logged, not before: an agent that succeeds under `--quiet` logs nothing and starts ~90 ms faster, which a
superhub with local transport pays once per feeder and run.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from fedload.feeder.passwords import without_passwords

__all__ = [
    "LOG_FORMATS",
    "configure_logging",
    "configured",
    "get_logger",
    "import_if_logging",
    "journal_prefix",
    "pick_level",
    "without_passwords",
]

LOG_FORMATS = ("auto", "human", "json")
_LEVELS = logging.getLevelNamesMapping()
_configured = {"level": "warning", "log_format": "auto"}
_threshold = [logging.NOTSET]  # the configured level; NOTSET until configure_logging (structlog's default)
_applied = [True]  # False while a configure_logging call waits for structlog's import


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


# syslog priorities (sd-daemon.h's SD_ERR ...) by structlog's level names
_PRIORITIES = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


def _stderr_is_journal() -> bool:
    """Whether stderr is the stream systemd connected to the journal: JOURNAL_STREAM is "DEVICE:INODE" of it."""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        stat = os.fstat(sys.stderr.fileno())
        return (stat.st_dev, stat.st_ino) == (int(device), int(inode))
    except (AttributeError, ValueError, OSError):  # no variable, no stderr file, or not numbers
        return False


def journal_prefix(level: str) -> str:
    """The syslog priority prefix for a line at `level` (`"error"`: `<3>`) that a program writes to stderr itself,
    such as a command's one-line error, where stderr is the journal's stream; "" elsewhere."""
    return f"<{_PRIORITIES[level]}>" if _stderr_is_journal() else ""


def _with_priority(render: Any) -> Any:
    """`render`, each line prefixed with its event's syslog priority (`<3>` for an error ...)."""

    def rendered(logger: Any, method_name: str, event_dict: Any) -> str:
        priority = _PRIORITIES.get(event_dict.get("level", ""), _PRIORITIES["info"])
        return f"<{priority}>{render(logger, method_name, event_dict)}"

    return rendered


class _StderrLogger:
    """Writes each rendered event to the `sys.stderr` of the moment, so rich's live display can place it above."""

    def msg(self, message: str) -> None:
        """Write one event line in one write (`print` writes the line and its newline apart, each straight through
        to the file, so another process's line could land between them), under a lock on the file that every
        fedload process writing to it takes: one write to a pipe is atomic only up to PIPE_BUF (4096 bytes), and an
        event with a traceback is longer."""
        stream = sys.stderr
        with _locked(stream):
            stream.write(message + "\n")
            stream.flush()

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


@contextlib.contextmanager
def _locked(stream: Any) -> Iterator[None]:
    """An exclusive POSIX lock on the file behind `stream` for the block (a pipe, a socket, a file or a terminal:
    the processes sharing a stderr, a sync and its workers, exclude each other), or none where it cannot be had."""
    try:
        fd = stream.fileno()
        fcntl.lockf(fd, fcntl.LOCK_EX, 0, 0, os.SEEK_SET)
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is an OSError and a ValueError
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.lockf(fd, fcntl.LOCK_UN, 0, 0, os.SEEK_SET)


def configure_logging(*, level: str = "warning", log_format: str = "auto") -> None:
    """Send structlog events at `level` and above to stderr, as JSON lines or rendered (see the module docstring).

    Applied now if structlog is in use already, else when the first event at or above `level` is logged."""
    _use_json(log_format)  # an unknown format fails here, not at the first event
    _configured.update(level=level, log_format=log_format)
    _threshold[0] = _LEVELS[level.upper()]
    _applied[0] = False
    if "structlog" in sys.modules:
        _apply()


def _apply() -> None:
    """Configure structlog as `configure_logging` asked (once per call of it)."""
    import structlog  # noqa: PLC0415 - only once an event is logged

    level, log_format = _configured["level"], _configured["log_format"]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if _use_json(log_format)
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    if _stderr_is_journal():
        renderer = _with_priority(renderer)
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
    _applied[0] = True


def import_if_logging(level: int = logging.INFO) -> None:
    """Import and apply structlog now if events at `level` pass the configured level: a process about to fork
    workers that will log such events imports it once for all of them."""
    if level >= _threshold[0] and not _applied[0]:
        _apply()


def configured() -> tuple[str, str]:
    """The level and format `configure_logging` set last (for a worker process to log as its parent does)."""
    return _configured["level"], _configured["log_format"]


def get_logger(**bound: Any) -> Any:
    """A structlog logger with `bound` fields on every event; structlog itself is imported at the first event
    that passes the configured level."""
    return _LazyLogger(bound)


_METHOD_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "msg": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


def _discard(*_args: Any, **_kwargs: Any) -> None:
    """An event below the configured level."""


class _LazyLogger:
    """`structlog.get_logger(**bound)`, resolved at the first event that passes the configured level."""

    __slots__ = ("_bound", "_logger")

    def __init__(self, bound: dict[str, Any]) -> None:
        self._bound = bound
        self._logger: Any = None

    def bind(self, **more: Any) -> _LazyLogger:
        """A logger with more bound fields (structlog's `bind`), still lazy."""
        return _LazyLogger({**self._bound, **more})

    def __getattr__(self, name: str) -> Any:
        if _METHOD_LEVELS.get(name, logging.CRITICAL) < _threshold[0]:
            return _discard
        if not _applied[0]:
            _apply()
        if self._logger is None:
            import structlog  # noqa: PLC0415

            self._logger = structlog.get_logger(**self._bound)
        return getattr(self._logger, name)
