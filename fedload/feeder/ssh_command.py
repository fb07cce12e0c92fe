"""`fedload agent ssh-command`: the forced command of the superhub's key in a feeder's `authorized_keys`.

sshd runs it whatever the superhub asks for, with the request in `SSH_ORIGINAL_COMMAND`. It answers the version
probes of `fedload check-config --connect` (a command ending in `--version`: this agent's version; `pg_dump
--version`: the allowed pg_dump's), runs `agent dump` when the request stays within this command's own allowlist
(its arguments, or a file of them given as `@FILE`: the databases, the table patterns, the pg_dump and its extra
arguments, the dump modes and compressions, the most rows and bytes the dump may merge into one INSERT in the
feeder's memory, the zstd program), and refuses anything else with one line on stderr and exit status 2. The
request is split with shlex and read by the dump's own parser, never given to a shell; the dump runs in this process.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from typing import NoReturn, Union

from fedload import __version__
from fedload.feeder.agent_options import COMPRESSIONS, DUMP_MODES, AgentOptions
from fedload.feeder.agent_options import add_arguments as add_dump_arguments
from fedload.feeder.errors import AgentError, AgentUsageError, one_line
from fedload.feeder.table_patterns import NotAsciiError, exact_name, translate
from transforms.cli import positive_int
from transforms.limits import DEFAULT_MAX_STATEMENT_BYTES, DEFAULT_ROWS_PER_STATEMENT

__all__ = [
    "AGENT_VERSION",
    "PG_DUMP_VERSION",
    "SERVE",
    "Allowlist",
    "add_arguments",
    "answer_version",
    "read_dump_line",
    "read_request",
]

AGENT_VERSION = "agent --version"
PG_DUMP_VERSION = "pg_dump --version"
SERVE = "agent serve"  # the dumps of one kept connection, requested on the session's stdin (fedload.feeder.serve)
_DEFAULT_PG_DUMP = "pg_dump"
_DEFAULT_ZSTD = "zstd"
_VERSION_TIMEOUT_S = 30.0
# By default a request may merge INSERTs up to this many times the transformer's defaults (built in memory).
_STATEMENT_CAP_FACTOR = 4
_MAX_ROWS_PER_STATEMENT = _STATEMENT_CAP_FACTOR * DEFAULT_ROWS_PER_STATEMENT
_MAX_STATEMENT_BYTES_LIMIT = _STATEMENT_CAP_FACTOR * DEFAULT_MAX_STATEMENT_BYTES
_ONLY = "this key may only run `fedload agent dump` within the feeder's allowlist, or ask for versions"

Request = Union[str, AgentOptions]  # AGENT_VERSION, PG_DUMP_VERSION, SERVE, or the dump to run


@dataclass(frozen=True)
class Allowlist:
    """What the superhub may ask of this feeder, from the forced command's own arguments."""

    databases: tuple[str, ...]
    tables: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...]  # (schema, name) of each allowed pattern
    pg_dump: str = _DEFAULT_PG_DUMP
    pg_dump_args: tuple[str, ...] = ()
    modes: tuple[str, ...] = DUMP_MODES
    compressions: tuple[str, ...] = COMPRESSIONS
    max_rows_per_statement: int = _MAX_ROWS_PER_STATEMENT
    max_statement_bytes: int = _MAX_STATEMENT_BYTES_LIMIT
    zstd: str = _DEFAULT_ZSTD

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Allowlist:
        """The allowlist `add_arguments`' parser read; AgentUsageError for a pattern that is not schema.table."""
        tables = tuple(map(_pattern, args.allowed_tables))
        modes, compressions = tuple(args.modes or DUMP_MODES), tuple(args.compressions or COMPRESSIONS)
        caps = (args.max_rows_per_statement, args.max_statement_bytes_limit)
        allowed = (tuple(args.databases), tables, args.pg_dump, tuple(args.args), modes, compressions, *caps)
        return cls(*allowed, zstd=args.zstd)

    def allows_table(self, table: str) -> bool:
        """Whether a requested `--table` names exactly one table (schema.name) that an allowed pattern matches;
        AgentUsageError for a character beyond ASCII outside double quotes (pg_dump would not fold it as we do)."""
        try:
            schema, name = exact_name(table)
        except NotAsciiError as exc:
            raise AgentUsageError(f"refused: table {exc}") from None
        except ValueError:
            return False
        return any(s.fullmatch(schema) and n.fullmatch(name) for s, n in self.tables)


def _pattern(text: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    try:
        parts = translate(text)
    except ValueError as exc:
        raise AgentUsageError(f"--allow-table {exc}") from None
    if len(parts) != 2 or not all(parts):
        raise AgentUsageError(f"--allow-table {text!r} is not schema.table (e.g. public.{text})")
    return re.compile(parts[0], re.DOTALL), re.compile(parts[1], re.DOTALL)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The forced command's own arguments: the allowlist; `@FILE` reads more of them from FILE, one per line."""
    parser.fromfile_prefix_chars = "@"
    parser.add_argument(
        "--database",
        dest="databases",
        action="append",
        required=True,
        metavar="DBNAME",
        help="a database the superhub may dump, exactly as its fedload.toml names it (a name or libpq connection "
        "string); repeatable",
    )
    parser.add_argument(
        "--allow-table",
        dest="allowed_tables",
        action="append",
        required=True,
        metavar="PATTERN",
        help="schema.table pattern (psql rules: * ? [...], quotes keep case) the requested tables must fall "
        "within; repeatable",
    )
    parser.add_argument(
        "--pg-dump",
        default=_DEFAULT_PG_DUMP,
        metavar="PATH",
        help="the pg_dump to run and to answer `pg_dump --version` with (default: from PATH); a request may name "
        "only this one or `pg_dump`",
    )
    parser.add_argument(
        "--zstd",
        default=_DEFAULT_ZSTD,
        metavar="PATH",
        help="the zstd program the dump uses where the zstandard module is missing (default: from PATH); a request "
        "may name only this one or `zstd`",
    )
    parser.add_argument(
        "--allow-mode",
        dest="modes",
        action="append",
        choices=DUMP_MODES,
        help="a dump mode requests may ask for; repeatable (default: any)",
    )
    parser.add_argument(
        "--allow-compression",
        dest="compressions",
        action="append",
        choices=COMPRESSIONS,
        help="a compression requests may ask for; repeatable (default: any)",
    )
    parser.add_argument(
        "--pg-dump-arg",
        dest="args",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra pg_dump argument (after '--') that requests must carry, in this order; repeatable",
    )
    parser.add_argument(
        "--max-rows-per-statement",
        type=positive_int,
        default=_MAX_ROWS_PER_STATEMENT,
        metavar="N",
        help=f"the most --rows-per-statement a request may ask for (default {_MAX_ROWS_PER_STATEMENT})",
    )
    parser.add_argument(
        "--max-statement-bytes-limit",
        type=positive_int,
        default=_MAX_STATEMENT_BYTES_LIMIT,
        metavar="N",
        help=f"the most --max-statement-bytes a request may ask for (default {_MAX_STATEMENT_BYTES_LIMIT}: "
        f"{_MAX_STATEMENT_BYTES_LIMIT >> 20} MiB)",
    )


def read_request(command: str | None, allowed: Allowlist) -> Request:
    """What `command` (SSH_ORIGINAL_COMMAND) asks for, if it is allowed; AgentUsageError saying why not."""
    if not command or not command.strip():
        raise AgentUsageError(f"refused a session without a command (a shell): {_ONLY}")
    argv = _split(command)
    if len(argv) >= 2 and argv[-1] == "--version":
        return PG_DUMP_VERSION if len(argv) == 2 and os.path.basename(argv[0]) == "pg_dump" else AGENT_VERSION
    if len(argv) >= 2 and argv[-1] == "serve" and argv[-2] != "dump":  # `fedload agent serve`, the zipapp's `serve`
        return SERVE
    dump_at = _dump_position(argv)
    if dump_at is None:
        raise AgentUsageError(f"refused `{one_line(command, 200)}`: {_ONLY}")
    return _allowed_dump(_parse_dump(argv[dump_at:]), allowed)


def read_dump_line(line: str, allowed: Allowlist | None) -> AgentOptions:
    """The dump a served session's request line asks for, if `allowed` allows it (None: the agent runs without a
    forced command, as any command of this account could); AgentUsageError saying why not."""
    argv = _split(line)
    dump_at = _dump_position(argv)
    if dump_at is None:
        raise AgentUsageError(f"refused `{one_line(line, 200)}`: a served session runs dumps only")
    options = _parse_dump(argv[dump_at:])
    return options if allowed is None else _allowed_dump(options, allowed)


def _split(command: str) -> list[str]:
    """`command`'s words as a shell would split them; AgentUsageError if it does not split."""
    try:
        return shlex.split(command)
    except ValueError as exc:
        raise AgentUsageError(f"refused `{one_line(command, 200)}`: {exc}") from None


def _dump_position(argv: list[str]) -> int | None:
    """Where the dump's options start: after `agent dump` (`fedload agent dump ...`) or `dump` (the zipapp)."""
    for i in range(1, len(argv)):
        if argv[i - 1 : i + 1] == ["agent", "dump"]:
            return i + 1
    return argv.index("dump", 1) + 1 if "dump" in argv[1:] else None


class _RefusingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise AgentUsageError(f"refused the dump's options: {message}")


def _parse_dump(argv: list[str]) -> AgentOptions:
    # No --help, no abbreviations, no @files: a request cannot make the parser print, guess or read anything.
    parser = _RefusingParser(prog="agent dump", add_help=False, allow_abbrev=False)
    add_dump_arguments(parser)
    return AgentOptions.from_args(parser.parse_args(argv))


def _allowed_dump(options: AgentOptions, allowed: Allowlist) -> AgentOptions:
    if options.database not in allowed.databases:
        raise AgentUsageError(f"refused: database {options.database!r} is not one this key may dump")
    if refused := [table for table in options.tables if not allowed.allows_table(table)]:
        listed = ", ".join(map(repr, refused))
        raise AgentUsageError(f"refused: table {listed} is not within this key's allowed tables (--allow-table)")
    if options.pg_dump not in (_DEFAULT_PG_DUMP, allowed.pg_dump):
        raise AgentUsageError(f"refused: pg_dump {options.pg_dump!r}: this key runs only {allowed.pg_dump!r}")
    if options.zstd not in (_DEFAULT_ZSTD, allowed.zstd):
        raise AgentUsageError(f"refused: zstd {options.zstd!r}: this key runs only {allowed.zstd!r}")
    if tuple(options.pg_dump_args) != allowed.pg_dump_args:
        args = shlex.join(options.pg_dump_args)
        raise AgentUsageError(f"refused: the pg_dump arguments `{args}` are not the allowed ones (--pg-dump-arg)")
    if options.dump_mode not in allowed.modes or options.compression not in allowed.compressions:
        asked = f"--mode={options.dump_mode} --compression={options.compression}"
        raise AgentUsageError(f"refused: {asked} is not allowed (--allow-mode, --allow-compression)")
    if options.remap is not None:
        raise AgentUsageError("refused: --remap is not allowed through this key")
    _within_statement_caps(options, allowed)
    return replace(options, pg_dump=allowed.pg_dump, zstd=allowed.zstd)


def _within_statement_caps(options: AgentOptions, allowed: Allowlist) -> None:
    """AgentUsageError if the request would merge larger statements than the allowlist lets it build in memory."""
    if options.rows_per_statement > allowed.max_rows_per_statement:
        raise AgentUsageError(
            f"refused: --rows-per-statement={options.rows_per_statement} is above this key's "
            f"--max-rows-per-statement={allowed.max_rows_per_statement}"
        )
    if options.max_statement_bytes > allowed.max_statement_bytes:
        raise AgentUsageError(
            f"refused: --max-statement-bytes={options.max_statement_bytes} is above this key's "
            f"--max-statement-bytes-limit={allowed.max_statement_bytes}"
        )


def answer_version(request: str, allowed: Allowlist) -> int:
    """Print the version asked for: this agent's, or the allowed pg_dump's (its own output and exit status)."""
    if request == AGENT_VERSION:
        print(f"fedload {__version__}", flush=True)
        return 0
    try:
        done = subprocess.run(
            [allowed.pg_dump, "--version"], capture_output=True, timeout=_VERSION_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise AgentError(f"cannot run {allowed.pg_dump} --version: {exc}") from exc
    sys.stdout.buffer.write(done.stdout)
    sys.stdout.flush()
    sys.stderr.buffer.write(done.stderr)
    return done.returncode
