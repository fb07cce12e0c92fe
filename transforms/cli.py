"""`fedload transform` (also `python -m transforms`): the transform as a stdin-to-stdout filter."""

from __future__ import annotations

import argparse
import io
import sys
from typing import TYPE_CHECKING

# `transforms` loads its names on first use: the agent's parser takes add_arguments alone (binary mode never
# transforms, and the transformer's patterns take ~30 ms to compile).
import transforms
from transforms.errors import RemapError, TransformError
from transforms.limits import DEFAULT_MAX_STATEMENT_BYTES, DEFAULT_ROWS_PER_STATEMENT

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["add_arguments", "main", "positive_int", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def _path(text: str) -> Path:
    """`Path(text)`, with pathlib imported only when a path is given: the agent's start skips it (#36)."""
    from pathlib import Path  # noqa: PLC0415

    return Path(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The filter's options."""
    parser.add_argument(
        "--rows-per-statement",
        type=positive_int,
        default=DEFAULT_ROWS_PER_STATEMENT,
        metavar="N",
        help=f"most rows in one merged INSERT (default {DEFAULT_ROWS_PER_STATEMENT})",
    )
    parser.add_argument(
        "--max-statement-bytes",
        type=positive_int,
        default=DEFAULT_MAX_STATEMENT_BYTES,
        metavar="N",
        help="size cap of a merged INSERT; a single larger row still passes (default 16 MiB)",
    )
    parser.add_argument("--remap", type=_path, metavar="FILE", help="TOML file of per-table column remapping")


def run(args: argparse.Namespace, prog: str = "fedload transform") -> int:
    """Filter stdin to stdout; report a bad dump or remap in one line on stderr."""
    try:
        remap = transforms.load_remap(args.remap) if args.remap else None
    except RemapError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    options = transforms.TransformOptions(args.rows_per_statement, args.max_statement_bytes, remap)
    stdout = sys.stdout.buffer
    stdin = sys.stdin.buffer
    read = stdin.read1 if isinstance(stdin, io.BufferedReader) else stdin.read
    try:
        transforms.transform_stream(read, stdout.write, options)
        stdout.flush()
    except TransformError as exc:
        stdout.flush()
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        print(f"{prog}: error: the output was closed before the dump was complete", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m transforms`."""
    parser = argparse.ArgumentParser(prog="python -m transforms", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv), prog="transforms")
