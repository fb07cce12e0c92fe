"""The `fedload` command line: parse arguments, load the configuration, call one entry function per command."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedload import __version__
from fedload.commands.helptext import COMMANDS, PROGRAM, PROGRAM_EPILOG
from fedload.errors import ConfigError, FedloadError, UsageError, one_line
from fedload.log import LOG_FORMATS, configure_logging, journal_prefix, pick_level
from fedload.startup import collector_paused, dump_buffers_reused, no_pydantic_plugins

if TYPE_CHECKING:
    from fedload.config import Config, ConfigLocation
    from fedload.names import TablePattern

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

Command = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse with exit code 2 and one line for usage errors."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _config(args: argparse.Namespace) -> Config:
    return _located_config(args)[1]


def _located_config(args: argparse.Namespace) -> tuple[ConfigLocation, Config]:
    """The configuration file chosen (and the rule that chose it), and its content."""
    from fedload.config import load_config, locate_config  # noqa: PLC0415 - pydantic only where a config is read

    location = locate_config(args.config)
    return location, load_config(location.path)


def _logging(args: argparse.Namespace, configured: str) -> None:
    configure_logging(level=pick_level(verbose=args.verbose, configured=configured), log_format=args.log_format)


def _run_transform(args: argparse.Namespace) -> int:
    import transforms.cli  # noqa: PLC0415 - see _add_transform_parser

    return transforms.cli.run(args)


def _add_transform_parser(commands: _Commands) -> None:
    import transforms.cli  # noqa: PLC0415 - the transform's options only where it is named (_Commands)

    transform = _command(commands, "transform", _without_config())
    transforms.cli.add_arguments(transform)
    transform.set_defaults(run=_run_transform)


def _run_agent(words: list[str]) -> int:
    """`fedload agent dump|ssh-command ...` as the superhub sends it, through the agent's own parser: a run pays
    neither the whole command line's parser nor the imports of the superhub's commands, once per feeder and run."""
    from fedload.feeder.main import main as agent_main  # noqa: PLC0415

    return agent_main(words, prog="fedload agent")


def _run_agent_dump(args: argparse.Namespace) -> int:
    from fedload.feeder.main import run_dump  # noqa: PLC0415 - keep other commands' start-up light

    return run_dump(args)  # the zipapp's `dump` too


def _run_agent_ssh_command(args: argparse.Namespace) -> int:
    from fedload.feeder.main import run_ssh_command  # noqa: PLC0415

    return run_ssh_command(args)  # the zipapp's `ssh-command` too


def _run_agent_pack(args: argparse.Namespace) -> int:
    from fedload.commands.pack import pack  # noqa: PLC0415

    size = pack(args.output)
    print(f"{args.output}: {size} bytes; run it on a feeder with: python3 -I {args.output.name} dump ...")
    return EXIT_OK


def _add_agent_parser(commands: _Commands) -> None:
    from fedload.feeder import agent_options, ssh_command  # noqa: PLC0415 - the agent's options only where named

    agent = _command(commands, "agent")
    agent_commands = agent.add_subparsers(title="agent commands", metavar="COMMAND", required=True)
    dump = _command(agent_commands, "agent dump", _without_config())
    agent_options.add_arguments(dump)
    dump.set_defaults(run=_run_agent_dump)
    forced = _command(agent_commands, "agent ssh-command", _without_config())
    ssh_command.add_arguments(forced)
    forced.set_defaults(run=_run_agent_ssh_command)
    pack = _command(agent_commands, "agent pack", _without_config())
    pack.add_argument(
        "-o", "--output", type=Path, default=Path("fedload-agent.pyz"), help="where (default: fedload-agent.pyz)"
    )
    pack.set_defaults(run=_run_agent_pack)


def _run_sync(args: argparse.Namespace) -> int:
    dump_buffers_reused()  # in this process and the workers it forks (fedload.startup)
    with collector_paused():  # imports and the configuration: nothing to collect (fedload.startup)
        from fedload.commands.sync import run_sync  # noqa: PLC0415 - asyncpg only where the superhub is used

        config = _config(args)
    _logging(args, config.log_level)
    return run_sync(config, args.feeders, as_json=args.json, dry_run=args.dry_run)


def _run_daemon(args: argparse.Namespace) -> int:
    dump_buffers_reused()  # in the daemon and the workers it forks (fedload.startup)
    from fedload.service.daemon import run_daemon  # noqa: PLC0415

    location, config = _located_config(args)
    _logging(args, config.log_level)
    return run_daemon(config, location.path, shard=args.shard)


def _run_status(args: argparse.Namespace) -> int:
    from fedload.commands.status import run_status  # noqa: PLC0415

    location, config = _located_config(args)
    _logging(args, "warning")
    return run_status(config, as_json=args.json, location=location)


def _table_pattern(text: str) -> TablePattern:
    from fedload.names import TablePattern  # noqa: PLC0415 - keep --help light

    try:
        return TablePattern(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_feeder_move(args: argparse.Namespace) -> int:
    from fedload.commands.move import move_feeder  # noqa: PLC0415

    location, config = _located_config(args)
    _logging(args, config.log_level)
    return move_feeder(config, location.path, args.name, args.to)


def _run_feeder_remove(args: argparse.Namespace) -> int:
    from fedload.commands.admin import remove_feeder  # noqa: PLC0415

    config = _config(args)
    _logging(args, config.log_level)
    return remove_feeder(config, args.name, args.table, yes=args.yes, shard=args.shard)


def _run_feeder_pause(args: argparse.Namespace) -> int:
    from fedload.commands.pause import pause  # noqa: PLC0415

    config = _config(args)
    _logging(args, config.log_level)
    return pause(config, args.name, args.reason)


def _run_feeder_resume(args: argparse.Namespace) -> int:
    from fedload.commands.pause import resume  # noqa: PLC0415

    config = _config(args)
    _logging(args, config.log_level)
    return resume(config, args.name)


def _add_pause_parsers(feeder_commands: argparse._SubParsersAction[_Parser]) -> None:
    pause = _command(feeder_commands, "feeder pause", _with_config())
    pause.add_argument("name", metavar="NAME", help="the feeder's name")
    pause.add_argument("--reason", metavar="TEXT", help="why, shown by status (again on a paused feeder: replaces it)")
    pause.set_defaults(run=_run_feeder_pause)
    resume = _command(feeder_commands, "feeder resume", _with_config())
    resume.add_argument("name", metavar="NAME", help="the feeder's name")
    resume.set_defaults(run=_run_feeder_resume)


def _add_sync_parser(commands: _Commands) -> None:
    sync = _command(commands, "sync", _with_config())
    sync.add_argument(
        "feeders", nargs="*", metavar="FEEDER", help="feeder names, run even if paused (default: all but the paused)"
    )
    sync.add_argument("--json", action="store_true", help="print the summary as JSON")
    sync.add_argument(
        "--dry-run",
        action="store_true",
        help="read and check every dump, load it into staging tables and roll back: report, change nothing",
    )
    sync.set_defaults(run=_run_sync)


def _add_daemon_parser(commands: _Commands) -> None:
    daemon = _command(commands, "daemon", _with_config())
    daemon.add_argument("--shard", metavar="NAME", help="run only the feeders of this shard (default: every feeder)")
    daemon.set_defaults(run=_run_daemon)


def _add_status_parser(commands: _Commands) -> None:
    status = _command(commands, "status", _with_config())
    status.add_argument("--json", action="store_true", help="print JSON for machines")
    status.set_defaults(run=_run_status)


def _add_feeder_parser(commands: _Commands) -> None:
    feeder = _command(commands, "feeder")
    feeder_commands = feeder.add_subparsers(title="feeder commands", metavar="COMMAND", required=True)
    remove = _command(feeder_commands, "feeder remove", _with_config())
    remove.add_argument("name", metavar="NAME", help="the feeder's name")
    remove.add_argument(
        "--table",
        action="append",
        default=[],
        type=_table_pattern,
        metavar="PATTERN",
        help="drop only the feeder's partitions of these tables (schema.table, as in superhub.tables); repeatable",
    )
    remove.add_argument(
        "--yes", "-y", action="store_true", help="do not ask for confirmation (needed without a terminal)"
    )
    remove.add_argument(
        "--shard", metavar="NAME", help="with [shards]: remove it from this shard (default: the feeder's own)"
    )
    remove.set_defaults(run=_run_feeder_remove)
    move = _command(feeder_commands, "feeder move", _with_config())
    move.add_argument("name", metavar="NAME", help="the feeder's name")
    move.add_argument("--to", required=True, metavar="SHARD", help="the shard to move it to")
    move.set_defaults(run=_run_feeder_move)
    _add_pause_parsers(feeder_commands)


def _run_demo(args: argparse.Namespace) -> int:
    from fedload.commands.demo import run_demo, stop_demo  # noqa: PLC0415

    _logging(args, "warning")
    if args.stop is not None:
        return stop_demo(args.stop)
    return run_demo(keep=args.keep, hosts=args.hosts, shards=args.shards)


def _run_check_config(args: argparse.Namespace) -> int:
    from fedload.commands.checks import file_problems  # noqa: PLC0415
    from fedload.english import counted  # noqa: PLC0415

    location, config = _located_config(args)
    if problems := file_problems(config, location.path):
        raise ConfigError(problems)
    tables = counted(len(config.superhub.tables), "table pattern")
    shards = f", {counted(len(config.shards), 'shard')}" if config.shards else ""
    print(f"configuration {location}: OK ({counted(len(config.feeders), 'feeder')}, {tables}{shards})", flush=True)
    if not args.connect:
        return EXIT_OK
    from fedload.commands.probe import run_probes  # noqa: PLC0415 - the network only with --connect

    _logging(args, "warning")
    return run_probes(config)


_CONFIG_HELP = "configuration file (default: $FEDLOAD_CONFIG, ./fedload.toml, /etc/fedload/fedload.toml)"


def _global_options(*, config: bool, top: bool = False) -> _Parser:
    """Options accepted before and after the command; after it, they only override what was given before."""
    default: object = None if top else argparse.SUPPRESS
    options = _Parser(add_help=False)
    group = options.add_argument_group("global options")
    if config:
        group.add_argument("--config", type=Path, metavar="PATH", default=default, help=_CONFIG_HELP)
    group.add_argument(
        "-v", "--verbose", action="count", default=0 if top else argparse.SUPPRESS, help="log info too (-vv: debug)"
    )
    group.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="auto" if top else argparse.SUPPRESS,
        help="json: JSON lines for machines; human: rendered lines; auto (default): JSON under systemd, else human",
    )
    return options


@functools.cache
def _with_config() -> _Parser:
    return _global_options(config=True)


@functools.cache
def _without_config() -> _Parser:
    return _global_options(config=False)


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """fedload's commands, each listed with its summary (`fedload --help`) but its parser built only when the
    command line names it: `fedload sync` builds neither the agent's nor the transform's options, nor imports what
    defines them (argparse spends ~1 ms on each parser it builds)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._builders: dict[str, Callable[[_Commands], None]] = {}
        self._building: str | None = None
        self.choices: dict[str, None] = {}  # every command's name (argparse checks it); the parsers: those built

    def add_command(self, name: str, build: Callable[[_Commands], None]) -> None:
        """Command `name`, listed with its summary; `build(self)` adds its parser once the command line names it."""
        self._choices_actions.append(self._ChoicesPseudoAction(name, (), COMMANDS[name].summary))
        self._builders[name] = build
        self.choices[name] = None

    def build_all(self) -> None:
        """Every command's parser, built now (tools/gen_docs.py documents them all)."""
        while self._builders:
            name, build = next(iter(self._builders.items()))
            del self._builders[name]
            self._building = name
            build(self)
        self._building = None

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if name == self._building:
            del kwargs["help"]  # listed already (add_command)
        return super().add_parser(name, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, list)
        if (build := self._builders.pop(values[0], None)) is not None:
            self._building = values[0]
            build(self)
            self._building = None
        super().__call__(parser, namespace, values, option_string)


def _command(commands: argparse._SubParsersAction[_Parser], name: str, *parents: _Parser) -> _Parser:
    """The parser of command `name` ("feeder remove"), with its summary, description and examples from helptext."""
    text = COMMANDS[name]
    return commands.add_parser(
        name.rsplit(" ", 1)[-1],
        parents=list(parents),
        help=text.summary,
        description=textwrap.fill(text.description),
        epilog=text.examples or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand (each built once the command line names it: `_Commands`)."""
    parser = _Parser(
        prog="fedload",
        description=textwrap.fill(PROGRAM),
        epilog=PROGRAM_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_global_options(config=True, top=True)],
    )
    parser.add_argument("--version", action="version", version=f"fedload {__version__}")
    commands = parser.add_subparsers(
        title="commands", metavar="COMMAND", required=True, parser_class=_Parser, action=_Commands
    )
    assert isinstance(commands, _Commands)
    for name, build in _COMMAND_PARSERS.items():
        commands.add_command(name, build)
    return parser


def every_parser() -> argparse.ArgumentParser:
    """`build_parser()` with every command's parser built, for the commands reference (tools/gen_docs.py)."""
    parser = build_parser()
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if isinstance(action, _Commands):
            action.build_all()
    return parser


def _add_demo_parser(commands: _Commands) -> None:
    from transforms.cli import positive_int  # noqa: PLC0415 - with the demo's parser only (_Commands)

    demo = _command(commands, "demo", _without_config())
    keep_or_stop = demo.add_mutually_exclusive_group()
    keep_or_stop.add_argument(
        "--keep", action="store_true", help="leave the clusters running, with a fedload.toml for them"
    )
    keep_or_stop.add_argument(
        "--stop", type=Path, metavar="DIR", help="stop the clusters a `demo --keep` left in DIR and remove it"
    )
    demo.add_argument(
        "--hosts", type=positive_int, default=500, metavar="N", help="hosts on the first feeder (default 500)"
    )
    demo.add_argument(
        "--shards", type=int, default=0, metavar="N", help="load the feeders into N shards (1-3) read by a coordinator"
    )
    demo.set_defaults(run=_run_demo)


def _add_check_config_parser(commands: _Commands) -> None:
    check = _command(commands, "check-config", _with_config())
    check.add_argument(
        "--connect",
        action="store_true",
        help="also connect: to the superhub (version, tables) and each feeder (SSH, agent and pg_dump versions)",
    )
    check.set_defaults(run=_run_check_config)


# Every command, in the order `fedload --help` lists them, with what builds its parser.
_COMMAND_PARSERS: dict[str, Callable[[_Commands], None]] = {
    "transform": _add_transform_parser,
    "agent": _add_agent_parser,
    "sync": _add_sync_parser,
    "daemon": _add_daemon_parser,
    "status": _add_status_parser,
    "feeder": _add_feeder_parser,
    "demo": _add_demo_parser,
    "check-config": _add_check_config_parser,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fedload` command: exit 0 success, 1 the job failed, 2 usage or configuration error."""
    from fedload.feeder.main import for_the_agent  # noqa: PLC0415 - imported already by `python -m fedload`

    words = sys.argv[1:] if argv is None else argv
    if for_the_agent(words):
        return _run_agent(words)
    args = build_parser().parse_args(words)
    no_pydantic_plugins()  # before any command imports fedload.config (fedload.startup)
    run: Command = args.run
    try:
        return run(args)
    except (ConfigError, UsageError) as exc:
        _report(args, exc.problems if isinstance(exc, ConfigError) else [str(exc)])
        return EXIT_USAGE
    except FedloadError as exc:
        _report(args, [one_line(str(exc), limit=None)], prefix="error: ")
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("fedload: interrupted", file=sys.stderr)
        return 130


def _report(args: argparse.Namespace, problems: list[str], prefix: str = "") -> None:
    """Each problem as one line on stderr (under systemd at error priority: a refused `systemctl reload` says why in
    `journalctl -p err`); with --json, also `{"error": ...}` on stdout, so JSON readers get JSON."""
    priority = journal_prefix("error")
    for problem in problems:
        print(f"{priority}fedload: {prefix}{problem}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": "; ".join(problems)}))
