"""What `fedload agent dump` is told: its options as a value, as the argv the superhub sends, and as the parser.

The flags are defined here once: `add_arguments` gives the parser of `fedload agent dump`, `AgentOptions.to_argv`
the command line that parser reads back into the same options, `AgentOptions.from_args` the options it parsed.
Light on purpose (no structlog, no compressor): the CLI builds this parser for every command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import transforms.cli
from transforms.limits import DEFAULT_MAX_STATEMENT_BYTES, DEFAULT_ROWS_PER_STATEMENT

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["COMPRESSIONS", "DUMP_MODES", "AgentOptions", "add_arguments"]

DUMP_MODES = ("copy", "inserts", "binary")
COMPRESSIONS = ("zstd", "gzip")


@dataclass(frozen=True)  # no slots: Python 3.9
class AgentOptions:
    """What to dump and how to send it."""

    database: str
    tables: Sequence[str]
    dump_mode: str = "copy"
    compression: str = "zstd"
    pg_dump: str = "pg_dump"
    pg_dump_args: Sequence[str] = field(default_factory=tuple)
    remap: Path | None = None
    rows_per_statement: int = DEFAULT_ROWS_PER_STATEMENT
    max_statement_bytes: int = DEFAULT_MAX_STATEMENT_BYTES
    quiet: bool = False  # log warnings and errors only
    zstd: str = "zstd"  # the zstd program where the zstandard module is missing: on PATH, or a path
    # Binary mode: per table, its columns and their types on the superhub, as JSON (fedload/feeder/binary_plan.py).
    columns: Sequence[str] = field(default_factory=tuple)
    statistics: bool = False  # the tables' planner statistics too, where pg_dump can (18+)

    def __post_init__(self) -> None:
        # Tuples, so options compare equal however the sequences were given.
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "pg_dump_args", tuple(self.pg_dump_args))
        object.__setattr__(self, "columns", tuple(self.columns))

    def to_argv(self) -> list[str]:
        """`agent dump` and its flags (after the program, e.g. `fedload`): the parser reads back these options."""
        argv = ["agent", "dump", *(["--quiet"] if self.quiet else []), f"--database={self.database}"]
        argv += [f"--table={table}" for table in self.tables]
        argv += [f"--mode={self.dump_mode}", f"--compression={self.compression}", f"--pg-dump={self.pg_dump}"]
        argv += [f"--rows-per-statement={self.rows_per_statement}", f"--max-statement-bytes={self.max_statement_bytes}"]
        argv += [f"--remap={self.remap}"] if self.remap is not None else []
        argv += [f"--zstd={self.zstd}"] if self.zstd != "zstd" else []  # only when set: older agents lack it
        argv += [f"--columns={columns}" for columns in self.columns]
        argv += ["--statistics"] if self.statistics else []  # only when set: older agents lack it
        return [*argv, "--", *self.pg_dump_args]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AgentOptions:
        """The options `add_arguments`' parser read."""
        return cls(**{option.name: getattr(args, option.name) for option in fields(cls)})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `fedload agent dump`; `dest` is the AgentOptions field each one sets."""
    parser.add_argument("--database", required=True, metavar="DBNAME", help="database name or libpq connection string")
    parser.add_argument(
        "--table",
        dest="tables",
        action="append",
        required=True,
        metavar="PATTERN",
        help="table or pg_dump pattern; repeatable",
    )
    parser.add_argument(
        "--mode",
        dest="dump_mode",
        choices=DUMP_MODES,
        default="copy",
        help="COPY blocks (default), INSERTs, or binary COPY from one psql session",
    )
    parser.add_argument(
        "--columns",
        action="append",
        default=[],
        metavar="JSON",
        help="binary mode: a table's columns and their types on the superhub; one per --table",
    )
    parser.add_argument("--compression", choices=COMPRESSIONS, default="zstd", help="default zstd")
    parser.add_argument("--pg-dump", default="pg_dump", metavar="PATH", help="pg_dump to run (default: from PATH)")
    parser.add_argument(
        "--zstd",
        default="zstd",
        metavar="PATH",
        help="the zstd program, used where the zstandard module is missing (default: from PATH)",
    )
    parser.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    parser.add_argument(
        "--statistics", action="store_true", help="also send the tables' planner statistics (pg_dump 18 or later)"
    )
    transforms.cli.add_arguments(parser)  # --rows-per-statement, --max-statement-bytes, --remap
    parser.add_argument("pg_dump_args", nargs="*", metavar="-- PG_DUMP_ARG", help=argparse.SUPPRESS)
