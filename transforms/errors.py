"""Errors of the transformer, each carrying where in the dump it happened."""

from __future__ import annotations

import contextlib

__all__ = ["DumpSyntaxError", "RemapError", "TooLargeError", "TransformError", "printable"]


def printable(text: str | bytes) -> str:
    """`text` safe to print on a terminal: bytes that are not UTF-8 as `\\xff`, control and other unprintable
    characters as `\\x1b`, `\\n`, `\\u202e`; printable text, including non-ASCII letters, as it is."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="backslashreplace")
    else:
        with contextlib.suppress(UnicodeEncodeError):  # names decoded with surrogateescape: their bytes as \\xff
            text = text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class TransformError(Exception):
    """Base class: the input cannot be transformed as asked. The message is always printable (see `printable`)."""

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


class DumpSyntaxError(TransformError):
    """The dump is malformed: the message names the line (0: not counted) and byte offset."""

    def __init__(self, message: str, *, line: int, offset: int) -> None:
        super().__init__(f"{f'line {line} (byte {offset})' if line else f'byte {offset}'}: {message}")
        self.line = line
        self.offset = offset


class TooLargeError(DumpSyntaxError):
    """An item of the dump (`what`: a statement, a COPY data row...) is longer than the splitter's bound; `table`
    is the table it loads, as written in the dump, where that is known."""

    def __init__(self, what: str, *, table: bytes | None, limit: int, line: int, offset: int) -> None:
        super().__init__(f"{what} is larger than {limit} bytes", line=line, offset=offset)
        self.what = what
        self.table = table
        self.limit = limit


class RemapError(TransformError):
    """The remap file is invalid or does not fit the dump it is applied to."""
