"""structlog setup, done once per process: JSON lines when stderr is not a terminal, readable text when it is."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

__all__ = ["configure_logging", "get_logger"]


def configure_logging(*, level: str = "info", json: bool | None = None) -> None:
    """Send structlog events to stderr; `json=None` picks JSON unless stderr is a terminal."""
    use_json = not sys.stderr.isatty() if json is None else json
    renderer: Any = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> Any:
    """A structlog logger with `bound` fields on every event."""
    return structlog.get_logger(**bound)
