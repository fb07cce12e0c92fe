"""The `fedload` command line: exit codes and one-line errors, run as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedload.commands.helptext import COMMANDS
from fedload.errors import DumpError
from fedload.localpg import find_installs
from fedload.stream import StreamDecoder
from tests.support.federation import Federation, config_toml, on_terminal

REPO = Path(__file__).resolve().parents[2]


def fedload(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run the fedload command line in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "fedload", *args], input=stdin, capture_output=True, timeout=60, env=env, check=False
    )


def test_help_lists_the_commands() -> None:
    """`fedload --help` says what fedload is for and names every command with its summary."""
    result = fedload("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.decode().split())
    assert "gathers the PostgreSQL data of many feeder databases into one superhub database" in text
    for name, help_text in COMMANDS.items():
        if " " not in name:
            assert f"{name} {help_text.summary}" in text
    assert "Exit status: 0 success" in text


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_explains_itself(command: str) -> None:
    """`fedload COMMAND --help` exits 0 and says what the command does; sync, transform and agent dump show examples."""
    result = fedload(*command.split(), "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.decode().split())
    assert " ".join(COMMANDS[command].description.split()) in text
    if command in ("sync", "transform", "agent dump"):
        assert f"fedload {command} " in text.partition("examples:")[2]


def test_transform_merges_stdin_to_stdout() -> None:
    """`fedload transform` filters a dump: two INSERTs become one statement, exit 0."""
    dump = b"INSERT INTO t (a) VALUES (1);\nINSERT INTO t (a) VALUES (2);\n"
    result = fedload("transform", stdin=dump)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"INSERT INTO t (a) VALUES\n\t(1),\n\t(2);\n"


@pytest.mark.parametrize(
    ("dump", "message"),
    [
        (b"SET a = 1;\nINSERT INTO t VALUES ('unterminated);\n", b"line 2 (byte 11): the input ends inside"),
        (b"SET a = 1;\n\x00\x01garbage;\n", b"line 2 (byte 11): unexpected text"),
    ],
)
def test_transform_rejects_malformed_input_in_one_line(dump: bytes, message: bytes) -> None:
    """Malformed input exits 1 with one line naming line and byte offset, no traceback."""
    result = fedload("transform", stdin=dump)
    assert result.returncode == 1
    assert result.stderr.startswith(b"fedload transform: error: " + message)
    assert result.stderr.count(b"\n") == 1


def test_transform_with_invalid_remap_file_is_a_usage_error(tmp_path: Path) -> None:
    """A remap file that does not parse exits 2 and names the file."""
    remap = tmp_path / "remap.toml"
    remap.write_text('[tables.t]\nadd = { c = "now()" }\n')
    result = fedload("transform", "--remap", str(remap), stdin=b"")
    assert result.returncode == 2
    assert b"is not an SQL literal" in result.stderr
    assert b"Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["transform", "--rows-per-statement", "0"], ["nonsense"], ["transform", "--x"]])
def test_bad_arguments_exit_2_in_one_line(args: list[str]) -> None:
    """Invalid command lines exit 2 with one line on stderr."""
    result = fedload(*args)
    assert result.returncode == 2
    assert result.stderr.count(b"\n") == 1


def test_check_config_accepts_the_example_file_but_for_its_files() -> None:
    """The shipped fedload.toml is valid; on a machine without /etc/fedload only its files are missing."""
    result = fedload("check-config", "--config", str(REPO / "fedload.toml"))
    lines = result.stderr.decode().splitlines()
    assert result.returncode == (2 if lines else 0)
    assert all("/etc/fedload/" in line for line in lines), lines


def test_check_config_prints_every_problem_one_per_line(tmp_path: Path) -> None:
    """Each problem is one line naming the key path; exit 2, no traceback."""
    config = tmp_path / "bad.toml"
    config.write_text(
        '[superhub]\ndsn = "x"\ntables = ["hosts"]\nfoo = 1\n[feeders.b]\nkey = 1\nssh = { host = "h", port = "x" }\n'
    )
    result = fedload("check-config", "--config", str(config))
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 3
    assert f"{config}: superhub.tables.0: 'hosts' is not schema.table" in lines[0]
    assert "superhub.foo: unknown key" in lines[1]
    assert "feeders.b.ssh.port: Input should be a valid integer" in lines[2]


def test_check_config_refuses_a_statement_bound_the_merged_inserts_would_pass(tmp_path: Path) -> None:
    """superhub.max_statement_bytes at or below transform.max_statement_bytes would refuse the INSERTs the agent
    merges: exit 2, one line naming both settings; below 1 MiB is refused too."""
    config = tmp_path / "bound.toml"
    head = '[superhub]\ndsn = "x"\ntables = ["public.t"]\n'
    config.write_text(head + "max_statement_bytes = 16777216\n[transform]\nmax_statement_bytes = 16777216\n")
    result = fedload("check-config", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        f"fedload: {config}: superhub.max_statement_bytes: must be larger than transform.max_statement_bytes "
        "(16777216): the superhub would refuse the INSERTs it merges"
    ]
    config.write_text(head + "max_statement_bytes = 1000\n")
    result = fedload("check-config", "--config", str(config))
    assert result.returncode == 2
    assert "superhub.max_statement_bytes: Input should be greater than or equal to 1048576" in result.stderr.decode()


def test_check_config_reports_toml_syntax_with_position(tmp_path: Path) -> None:
    """A TOML syntax error names the file, line and column."""
    config = tmp_path / "broken.toml"
    config.write_text("[superhub\n")
    result = fedload("check-config", "--config", str(config))
    assert result.returncode == 2
    assert b"not valid TOML" in result.stderr
    assert b"line 1" in result.stderr


def test_config_is_found_through_the_environment(tmp_path: Path) -> None:
    """Without --config, $FEDLOAD_CONFIG names the file."""
    config = tmp_path / "env.toml"
    config.write_text('[superhub]\ndsn = "x"\ntables = ["public.t"]\n')
    result = fedload("check-config", env={"FEDLOAD_CONFIG": str(config), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert str(config).encode() in result.stdout


def test_missing_config_says_where_it_looked(tmp_path: Path) -> None:
    """No config anywhere: exit 2 and the message lists the places searched."""
    result = subprocess.run(
        [sys.executable, "-m", "fedload", "check-config"],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    if Path("/etc/fedload/fedload.toml").exists():
        pytest.skip("this machine has /etc/fedload/fedload.toml")
    assert result.returncode == 2
    assert b"no configuration file" in result.stderr


def _pg_dump() -> str:
    installs = find_installs()
    if not installs:
        pytest.fail("no PostgreSQL binaries found")
    return installs[min(installs)].tool("pg_dump")


def test_agent_dump_says_why_pg_dump_failed(tmp_path: Path) -> None:
    """An unreachable feeder database: exit 1, one stderr line with pg_dump's status and message; same in the stream."""
    socket_dir = tmp_path / "no-server"
    socket_dir.mkdir()
    result = fedload(
        "agent", "dump", "--database", f"host={socket_dir} dbname=x", "--table", "public.t", "--pg-dump", _pg_dump()
    )
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("fedload: error: pg_dump failed on the feeder with exit status 1: pg_dump: error:")
    assert str(socket_dir) in lines[0]
    decoder = StreamDecoder()
    decoder.feed(result.stdout)
    with pytest.raises(DumpError) as failed:
        decoder.close()
    assert f"fedload: error: {failed.value}" == lines[0]


def _unreachable_dump(tmp_path: Path, *options: str, env: dict[str, str] | None = None) -> list[str]:
    """stderr lines of `fedload OPTIONS agent dump` from a database with no server."""
    args = ["agent", "dump", "--database", f"host={tmp_path} dbname=x", "--table", "t", "--pg-dump", _pg_dump()]
    return fedload(*options, *args, env=env).stderr.decode().splitlines()


@pytest.mark.parametrize(
    ("options", "journal", "json_lines"),
    [
        ([], False, False),
        (["--log-format", "json"], False, True),
        ([], True, True),
        (["--log-format", "human"], True, False),
    ],
)
def test_logs_are_rendered_for_people_and_json_for_machines(
    tmp_path: Path, options: list[str], journal: bool, json_lines: bool
) -> None:
    """To a pipe: rendered lines; under systemd (JOURNAL_STREAM) or with --log-format json: JSON lines."""
    env = {"PATH": os.environ["PATH"], **({"JOURNAL_STREAM": "8:1234"} if journal else {})}
    event, error = _unreachable_dump(tmp_path, *options, "-vv", env=env)
    assert "agent.dump_started" in event
    assert event.startswith("{") == json_lines
    if json_lines:
        assert json.loads(event)["level"] == "debug"
    assert error.startswith("fedload: error: pg_dump failed")


def test_terminal_shows_warnings_unless_verbose(tmp_path: Path) -> None:
    """With stderr on a terminal, info and debug events show only with -v / -vv (global or after the command)."""
    assert _on_terminal(tmp_path, []) == []
    assert _on_terminal(tmp_path, ["-vv"]) == ["agent.dump_started"]
    assert _on_terminal(tmp_path, ["--verbose", "--verbose"], after=True) == ["agent.dump_started"]


_LAZY_LOGGING = """
import sys
from fedload.log import configure_logging, get_logger
configure_logging(level="warning", log_format="json")
log = get_logger(feeder="hub1").bind(table="t")
log.info("quiet.info")
log.debug("quiet.debug")
print("structlog" in sys.modules)
log.warning("loud.warning", rows=3)
print("structlog" in sys.modules)
"""


def test_structlog_is_imported_at_the_first_event_that_passes_the_level() -> None:
    """A quiet agent that succeeds never imports structlog (~90 ms per agent); the first warning does, with the
    configured format and the fields bound before."""
    done = subprocess.run([sys.executable, "-c", _LAZY_LOGGING], capture_output=True, check=True)
    assert done.stdout.split() == [b"False", b"True"]
    (event,) = done.stderr.decode().splitlines()
    assert json.loads(event) | {"timestamp": None} == {
        "event": "loud.warning",
        "feeder": "hub1",
        "table": "t",
        "rows": 3,
        "level": "warning",
        "timestamp": None,
    }


def _on_terminal(tmp_path: Path, options: list[str], *, after: bool = False) -> list[str]:
    """Events `fedload agent dump` logs when its stderr is a pseudo-terminal."""
    args = ["agent", "dump", "--database", f"host={tmp_path} dbname=x", "--table", "t", "--pg-dump", _pg_dump()]
    args = [*args, *options] if after else [*options, *args]
    status, text = on_terminal(args, stream="stderr")
    assert status == 1
    assert "fedload: error: pg_dump failed" in text
    return [word for word in ("agent.dump_started", "agent.dump_finished") if word in text]


def test_piped_sync_summary_and_status_keep_whole_values(federation: Federation) -> None:
    """Piped, the sync summary and status are tab-separated lines with whole timestamps and whole errors."""
    config = federation.tmp / "fedload.toml"
    config.write_text(config_toml(federation))
    gone = federation.feeders["hub2"]
    federation.cluster.psql(f"ALTER DATABASE {gone} RENAME TO gone_{gone}")
    synced = fedload("sync", "--config", str(config))
    assert synced.returncode == 1, synced.stderr
    summary = synced.stdout.decode().splitlines()
    assert summary[:2] == ["# fedload sync summary", "feeder\toutcome\trows\tMB received\tseconds\tswap lock ms\terror"]
    hub2 = next(line.split("\t") for line in summary if line.startswith("hub2\t"))
    assert hub2[1] == "failed"  # the summary's text: a contract, in its own words
    assert hub2[-1].startswith("pg_dump failed on the feeder with exit status 1: pg_dump: error: connection to server")
    assert hub2[-1].endswith(f'database "{gone}" does not exist')

    status = fedload("--config", str(config), "status")
    lines = status.stdout.decode().splitlines()
    assert lines[0] == f"# fedload status, configuration {config} (given by --config)"
    assert lines[1].split("\t")[:3] == ["feeder", "last success", "data age"]
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[2:]}
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", rows["hub1"][1])
    assert rows["hub2"][1:3] == ["-", "never STALE"]
    assert rows["hub2"][-1] == hub2[-1]
    assert status.returncode == 1
    as_json = fedload("status", "--json", env={**os.environ, "FEDLOAD_CONFIG": str(config)})
    assert {(s["feeder"], s["configuration"]) for s in json.loads(as_json.stdout)} == {
        (name, str(config)) for name in federation.feeders
    }


@pytest.mark.parametrize(
    "args",
    [["sync", "--json", "--config", "{config}"], ["--config", "{config}", "status", "--json"]],
)
def test_json_answers_json_when_the_superhub_is_down(tmp_path: Path, args: list[str]) -> None:
    """With the superhub unreachable, sync --json and status --json print {"error": ...} on stdout and exit 1."""
    config = tmp_path / "fedload.toml"
    config.write_text(
        '[superhub]\ndsn = "postgresql://fedload@127.0.0.1:1/superhub"\ntables = ["public.t"]\n'
        '[feeders.hub1]\nkey = 1\ntransport = "local"\ndatabase = "hub1"\n'
    )
    result = fedload(*(arg.format(config=config) for arg in args))
    assert result.returncode == 1
    answer = json.loads(result.stdout)
    assert "superhub" in answer["error"]
    assert result.stderr.decode() == f"fedload: error: {answer['error']}\n"


def test_json_answers_json_for_a_configuration_error(tmp_path: Path) -> None:
    """A configuration problem under --json: exit 2, the problem on stderr and as {"error": ...} on stdout."""
    config = tmp_path / "broken.toml"
    config.write_text("[superhub\n")
    result = fedload("--config", str(config), "sync", "--json")
    assert result.returncode == 2
    assert "not valid TOML" in json.loads(result.stdout)["error"]


def test_transform_of_binary_input_shows_an_escaped_snippet() -> None:
    """Binary input: the error quotes the start of it escaped (\\x7f, \\xff, \\x1b), never raw bytes."""
    result = fedload("transform", stdin=b"\x7fELF\x02\x01\xff\xfe\x1b[2J\x9b\x00 rest\n" + bytes(range(256)))
    assert result.returncode == 1
    line = result.stderr.decode("ascii")  # fails on any byte that is not ASCII
    assert line.endswith("\n")
    assert line[:-1].isprintable()
    assert r"unexpected text '\x7fELF\x02\x01\xff\xfe\x1b[2J\x9b\x00 rest'" in line


def _imported_modules(*args: str) -> set[str]:
    """Modules `python -m fedload ARGS` imports (from -X importtime)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fedload", *args], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}


def _imported(*args: str) -> set[str]:
    """Top-level packages `python -m fedload ARGS` imports (from -X importtime)."""
    return {module.split(".")[0] for module in _imported_modules(*args)}


def test_a_command_builds_and_imports_only_its_own_options() -> None:
    """The superhub's commands do not build the agent's options, nor import its forced command's module for them;
    the agent's commands (through the command line: `agent pack`) still do."""
    assert "fedload.feeder.ssh_command" not in _imported_modules("sync", "--help")
    assert "fedload.feeder.ssh_command" not in _imported_modules("status", "--help")
    assert "fedload.feeder.ssh_command" in _imported_modules("agent", "pack", "--help")


def test_sync_and_the_daemon_import_the_scale_out_code_only_for_a_coordinator() -> None:
    """The coordinator's build (fedload.scaleout) is imported at the first build, not with `sync` or the daemon."""
    code = "import json, sys, fedload.commands.sync, fedload.service.daemon; print(json.dumps(list(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert not [module for module in json.loads(done.stdout) if module.startswith("fedload.scaleout")]


def test_quick_commands_import_only_what_they_use(tmp_path: Path) -> None:
    """--help loads no heavy library; check-config only pydantic, for the configuration (no driver, no SQL parser)."""
    heavy = {"pglast", "asyncssh", "asyncpg", "pydantic", "structlog", "rich", "zstandard"}
    assert _imported("--help") & heavy == set()
    assert _imported("sync", "--help") & heavy == set()
    config = tmp_path / "fedload.toml"
    config.write_text('[superhub]\ndsn = "x"\ntables = ["public.t"]\n[feeders.hub1]\nkey = 1\ntransport = "local"\n')
    assert _imported("check-config", "--config", str(config)) & heavy <= {"pydantic", "structlog"}


def test_a_configuration_file_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    """A configuration file with bytes that are not UTF-8: exit 2 and one line naming the file, no traceback."""
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'log_level = "info"\n# caf\xe9\n')
    argv = [sys.executable, "-m", "fedload", "check-config", "--config", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"{path}: not valid TOML" in done.stderr


_LONG_EVENTS = """
import os, sys
from fedload.log import configure_logging, get_logger
configure_logging(level="info", log_format="json")
pids = []
for writer in range(3):
    pid = os.fork()
    if pid == 0:
        log = get_logger()
        for i in range(40):
            log.info("long.event", writer=writer, i=i, text=str(writer) * 70_000)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
"""


def test_long_events_of_several_processes_never_interleave() -> None:
    """Three processes sharing a stderr pipe log events far longer than PIPE_BUF (a traceback can be): every line
    that arrives is one whole event."""
    done = subprocess.run([sys.executable, "-c", _LONG_EVENTS], capture_output=True, check=True, timeout=120)
    events = [json.loads(line) for line in done.stderr.decode().splitlines()]
    assert len(events) == 120
    assert all(event["text"] == str(event["writer"]) * 70_000 for event in events)
