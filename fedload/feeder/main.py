"""The agent's commands, one code path for `fedload agent dump|ssh-command|serve` and the zipapp's own:
parse, set up logging, run, and report a failure as one line on stderr (exit 1; 2 for usage and refusals).

`main` is the zipapp's entry point (`python3 -I fedload-agent.pyz dump ...`, `... ssh-command ...`,
`... --version`); it also takes `agent dump ...`, the command the superhub sends, so the zipapp can be a feeder's
`agent_command` as it is. `exit_now` ends the process after it, without the interpreter's teardown (~35 ms of a
zipapp dump's CPU on the feeder, at every run), for the zipapp and for `python -m fedload`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import os
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO, NoReturn, cast

from fedload import __version__
from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.agent_options import add_arguments as add_dump_arguments
from fedload.feeder.errors import EXIT_USAGE, AgentError, AgentUsageError, one_line
from fedload.feeder.helptext import AGENT_COMMANDS
from fedload.feeder.logs import LOG_FORMATS, configure

if TYPE_CHECKING:
    from fedload.feeder import ssh_command
    from fedload.feeder.snapshot import SnapshotSession

__all__ = [
    "add_dump_arguments",
    "dump_options_of",
    "exit_now",
    "for_the_agent",
    "main",
    "preload_dumps",
    "run_dump",
]

# Binary mode's modules, and copy and inserts modes' with digests; the transformer only for copy and inserts modes.
_DUMP_MODULES = (
    "fedload.feeder.agent",
    "fedload.feeder.snapshot_dump",
    "fedload.feeder.binary_dump",
    "transforms.transform",
    "zstandard",
)


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    """-v and --log-format, as `fedload`'s global options (the zipapp has no others)."""
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log info too (-vv: debug)")
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="auto",
        help="json: JSON lines; human: rendered lines; auto (default): JSON under systemd, else human",
    )


def run_dump(args: argparse.Namespace) -> int:
    """`agent dump`: the stream on stdout; a failure as one line on stderr."""
    configure(verbose=args.verbose, quiet=args.quiet, log_format=args.log_format)
    return _reported(lambda: _dump(AgentOptions.from_args(args)))


def run_ssh_command(args: argparse.Namespace) -> int:
    """`agent ssh-command`: what SSH_ORIGINAL_COMMAND asks for, if allowed; else one line and exit 2."""
    return _reported(lambda: _forced(args))


def _forced(args: argparse.Namespace) -> int:
    from fedload.feeder import ssh_command  # noqa: PLC0415 - only under a forced command

    allowed = ssh_command.Allowlist.from_args(args)
    request = ssh_command.read_request(os.environ.get("SSH_ORIGINAL_COMMAND"), allowed)
    if request == ssh_command.SERVE:
        return _serve(args, allowed)
    if isinstance(request, str):
        return ssh_command.answer_version(request, allowed)
    configure(verbose=args.verbose, quiet=request.quiet, log_format=args.log_format)
    return _dump(request)


def run_serve(args: argparse.Namespace) -> int:
    """`agent serve`: dumps requested on stdin, without a forced command's allowlist (fedload.feeder.serve)."""
    return _reported(lambda: _serve(args, None))


def _serve(args: argparse.Namespace, allowed: ssh_command.Allowlist | None) -> int:
    """Serve the dumps a kept connection asks for, each within `allowed` (None: no forced command)."""
    from fedload.feeder import serve, ssh_command  # noqa: PLC0415 - only for a served session
    from fedload.feeder.kept_session import KeptSession  # noqa: PLC0415 - as above
    from fedload.feeder.snapshot import psql_beside  # noqa: PLC0415 - as above

    if sys.stdout.isatty():
        raise AgentUsageError("fedload agent serve writes binary frames; run it over SSH")
    kept = KeptSession()

    def accept(line: str) -> Callable[[], int]:
        options = ssh_command.read_dump_line(line, allowed)
        session = kept.lend(psql_beside(options.pg_dump), options.database) if options.dump_mode == "binary" else None

        def dump() -> int:  # in the forked child
            configure(verbose=args.verbose, quiet=options.quiet, log_format=args.log_format)
            framed = cast(BinaryIO, serve.FrameWriter(sys.stdout.fileno()))  # write, flush, fileno: all a dump uses
            borrowed = session.borrow() if session is not None else None
            return _reported(lambda: _dump(options, framed, borrowed))

        return dump

    preload_dumps()
    try:
        return serve.serve(accept, ended=kept.ended)
    except BrokenPipeError:  # the superhub went away between two dumps
        return 0
    finally:
        kept.close()


def preload_dumps() -> None:
    """Import what a dump of any mode needs (zstandard where installed), in a process that forks agents: the warm
    agent process (fedload.transport.zygote) and the served agent; each child starts with them imported (~15 ms of
    imports a dump)."""
    for module in _DUMP_MODULES:
        with contextlib.suppress(ImportError):  # zstandard is optional: the dump falls back to zstd or gzip
            __import__(module)


def _dump(options: AgentOptions, out: BinaryIO | None = None, kept: SnapshotSession | None = None) -> int:
    from fedload.feeder.agent import run_agent  # noqa: PLC0415 - the transformer only for a dump

    if out is None and sys.stdout.isatty():
        raise AgentUsageError("fedload agent dump writes a binary stream; redirect its output or run it over SSH")
    try:
        return run_agent(options, sys.stdout.buffer if out is None else out, kept)
    except BrokenPipeError:
        raise AgentError("the receiver closed the stream before the dump was complete") from None


def _reported(command: Callable[[], int]) -> int:
    try:
        return command()
    except AgentError as exc:
        print(f"fedload: error: {one_line(str(exc), limit=None)}", file=sys.stderr, flush=True)
        return exc.exit_status
    except KeyboardInterrupt:
        print("fedload: interrupted", file=sys.stderr)
        return 130


class _Parser(argparse.ArgumentParser):
    """argparse with exit status 2 and one line for usage errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_ssh_command_arguments(parser: argparse.ArgumentParser) -> None:
    from fedload.feeder import ssh_command  # noqa: PLC0415 - only for the forced command's parser

    ssh_command.add_arguments(parser)


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """`agent serve` has no options of its own: each request carries its dump's."""


_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "dump": (add_dump_arguments, run_dump),
    "ssh-command": (_add_ssh_command_arguments, run_ssh_command),
    "serve": (_add_serve_arguments, run_serve),
}


def build_parser(prog: str = "fedload-agent.pyz", words: list[str] | None = None) -> argparse.ArgumentParser:
    """The zipapp's command line: dump, ssh-command, serve, --version. Given the `words` to parse, only the command they
    name gets its options (the others are listed with their summary, and never parsed): a dump, once per feeder and
    run, does not import the forced command's module (#36).

    Built once per process and kind (argparse's building, with its gettext lookups, costs ~3 ms): the warm agent
    process builds it when it looks ahead at a request, and each agent it forks parses with that parser."""
    return _parser(prog, _named_command(words))


@functools.cache
def _parser(prog: str, named: str | None) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="fedload's feeder agent, as one file.")
    parser.add_argument("--version", action="version", version=f"fedload {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True, parser_class=_Parser)
    for name, (add, run) in _COMMANDS.items():
        text = AGENT_COMMANDS[name]
        command = commands.add_parser(
            name,
            help=text.summary,
            description=textwrap.fill(text.description),
            epilog=text.examples or None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if named in (None, name):
            add(command)
            add_logging_arguments(command)
        command.set_defaults(run=run)
    return parser


def _named_command(words: list[str] | None) -> str | None:
    """The command `words` name (their first word that is not an option: argparse picks the subparser by it), if
    one of the agent's; None for any other, or no words."""
    first = next((word for word in words or () if not word.startswith("-")), None)
    return first if first in _COMMANDS else None


def for_the_agent(words: list[str]) -> bool:
    """Whether `fedload` words are `agent dump ...` or `agent ssh-command ...`, as the superhub and sshd send them:
    those go straight to `main`, past the superhub's command line (`fedload/__main__.py`, `fedload.cli.main`)."""
    return words[:1] == ["agent"] and words[1:2] != [] and words[1] in _COMMANDS


def dump_options_of(words: list[str]) -> AgentOptions | None:
    """The options of `[agent] dump ...` words as `main` reads them; None for another command or words that do not
    parse (nothing printed): a process that forks agents looks ahead at what they will need."""
    words = words[1:] if words[:1] == ["agent"] else words
    if _named_command(words) != "dump":
        return None
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = build_parser("fedload agent", words).parse_args(words)
    except SystemExit:
        return None
    return AgentOptions.from_args(args)


def main(argv: list[str] | None = None, prog: str = "fedload-agent.pyz") -> int:
    """The zipapp's entry point, and `fedload agent dump|ssh-command`'s (prog "fedload agent"): 0 success, 1 the
    dump failed, 2 usage error or a refused request."""
    words = sys.argv[1:] if argv is None else argv
    words = words[1:] if words[:1] == ["agent"] else words
    args = build_parser(prog, words).parse_args(words)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


def exit_now(status: int) -> NoReturn:
    """End the process with `status` once stdout, stderr and logging are flushed, skipping the interpreter's teardown.

    Only where nothing else could still need it: with another thread alive (which a normal exit waits for), a
    profiler or tracer watching (`python -m cProfile -m fedload ...` writes its report at exit, coverage its data),
    or an output that cannot be flushed (a reader gone: Python reports it at exit), the process exits normally."""
    if threading.active_count() == 1 and sys.getprofile() is None and sys.gettrace() is None:
        try:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed pipe or stream: the normal exit reports it as it always did
            pass
        else:
            os._exit(status)
    sys.exit(status)
