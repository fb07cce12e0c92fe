"""Errors of the transformer, each carrying where in the dump it happened."""

from __future__ import annotations

__all__ = ["DumpSyntaxError", "RemapError", "TransformError"]


class TransformError(Exception):
    """Base class: the input cannot be transformed as asked."""


class DumpSyntaxError(TransformError):
    """The dump is malformed: the message names the line and byte offset."""

    def __init__(self, message: str, *, line: int, offset: int) -> None:
        super().__init__(f"line {line} (byte {offset}): {message}")
        self.line = line
        self.offset = offset


class RemapError(TransformError):
    """The remap file is invalid or does not fit the dump it is applied to."""
