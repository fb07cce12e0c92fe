"""`fedload agent ssh-command`, the forced command of the superhub's key: what it allows, what it refuses, and a
sync and `check-config --connect` through it over a real sshd."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest

from fedload import __version__
from fedload.commands.probe import probe_feeder
from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.errors import AgentUsageError
from fedload.feeder.ssh_command import AGENT_VERSION, PG_DUMP_VERSION, Allowlist, add_arguments, read_request
from fedload.results import Outcome
from tests.feeder.zipapp import build
from tests.support.federation import CONTEXT_COLS, HOST_COLS, Federation, sync, write_script
from tests.support.interpreters import python_named
from tests.support.sshd import OpenSshServer, SshServer, require_openssh

_PG_DUMP = "/usr/lib/postgresql/15/bin/pg_dump"


def _allowlist(*args: str) -> Allowlist:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return Allowlist.from_args(parser.parse_args(list(args)))


_ALLOWED = _allowlist(
    "--database", "cfdb", "--allow-table", "public.__*", "--pg-dump", _PG_DUMP, "--allow-mode", "copy"
)


def _request(*head: str, **changes: object) -> str:
    """The command line the superhub sends for a dump of public.__hosts from cfdb, with `changes`."""
    fields: dict[str, object] = {"database": "cfdb", "tables": ['"public"."__hosts"'], "quiet": True, **changes}
    return shlex.join([*(head or ("fedload",)), *AgentOptions(**fields).to_argv()])  # type: ignore[arg-type]


@pytest.mark.parametrize("head", [("fedload",), ("/usr/bin/python3", "-I", "/opt/fedload/fedload-agent.pyz")])
def test_a_dump_within_the_allowlist_runs_with_the_feeders_pg_dump(head: tuple[str, ...]) -> None:
    """The superhub's `agent dump` (from fedload or the zipapp) is read back into its options, with the pg_dump
    the forced command names."""
    request = read_request(_request(*head, tables=['"public"."__hosts"', "public.__contexts"]), _ALLOWED)
    assert request == AgentOptions("cfdb", ['"public"."__hosts"', "public.__contexts"], pg_dump=_PG_DUMP, quiet=True)
    assert read_request(_request(pg_dump=_PG_DUMP), _ALLOWED) == AgentOptions(
        "cfdb", ['"public"."__hosts"'], pg_dump=_PG_DUMP, quiet=True
    )


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        ("fedload --version", AGENT_VERSION),
        ("/usr/bin/python3 -I /opt/fedload/fedload-agent.pyz --version", AGENT_VERSION),
        ("pg_dump --version", PG_DUMP_VERSION),
        ("/usr/lib/postgresql/17/bin/pg_dump --version", PG_DUMP_VERSION),
    ],
)
def test_version_probes_are_answered(command: str, answer: str) -> None:
    """check-config --connect's probes: the agent's version, and pg_dump's (the allowed one, whichever is asked)."""
    assert read_request(command, _ALLOWED) == answer


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (None, "refused a session without a command (a shell)"),
        ("   ", "refused a session without a command (a shell)"),
        ("cat /etc/shadow", "refused `cat /etc/shadow`: this key may only run"),
        ("sh -c 'fedload agent dump'", "refused `sh -c 'fedload agent dump'`: this key may only run"),
        ("fedload agent dump '--database=cfdb", "refused `fedload agent dump '--database=cfdb`: No closing quotation"),
        (_request(tables=["public.secrets"]), "refused: table 'public.secrets' is not within"),
        (_request(tables=["public.__*"]), "refused: table 'public.__*' is not within"),  # a pattern, not a name
        (_request(tables=["__hosts"]), "refused: table '__hosts' is not within"),  # any schema on the search_path
        (_request(tables=["cfdb.public.__hosts"]), "refused: table 'cfdb.public.__hosts' is not within"),
        (_request(tables=['"Public"."__hosts"']), 'refused: table \'"Public"."__hosts"\' is not within'),
        (_request(database="host=10.0.0.9 dbname=cfdb"), "refused: database 'host=10.0.0.9 dbname=cfdb' is not one"),
        (_request(pg_dump="/bin/sh"), "refused: pg_dump '/bin/sh': this key runs only"),
        (_request(zstd="/bin/sh"), "refused: zstd '/bin/sh': this key runs only 'zstd'"),
        (_request(pg_dump_args=["--file=/root/.ssh/authorized_keys"]), "refused: the pg_dump arguments"),
        (_request(remap=Path("/etc/shadow")), "refused: --remap is not allowed"),
        (_request(dump_mode="inserts"), "refused: --mode=inserts --compression=zstd is not allowed"),
        (_request(dump_mode="binary"), "refused: --mode=binary --compression=zstd is not allowed"),
        (_request(rows_per_statement=4001), "refused: --rows-per-statement=4001 is above this key's "),
        (_request(max_statement_bytes=(64 << 20) + 1), "refused: --max-statement-bytes=67108865 is above this"),
        (_request() + " ; rm -rf /", "refused: the pg_dump arguments `';' rm -rf /` are not"),
        ("fedload agent dump --help", "refused the dump's options: the following arguments are required"),
        ("fedload agent dump --data=cfdb --table=public.__hosts", "refused the dump's options: the following"),
        ("fedload agent dump @/etc/shadow", "refused the dump's options: the following arguments are required"),
    ],
)
def test_anything_else_is_refused(command: str | None, reason: str) -> None:
    """A shell, another command, a table, database, pg_dump or pg_dump argument outside the allowlist, a remap
    file, options the parser would guess or read from a file: refused, saying why."""
    with pytest.raises(AgentUsageError) as refused:
        read_request(command, _ALLOWED)
    assert str(refused.value).startswith(reason)
    assert refused.value.exit_status == 2


_KEYS = _allowlist(
    "--database=cfdb", "--allow-table=public.key", '--allow-table=public."Straße"', '--allow-table=public."\u212aey"'
)


@pytest.mark.parametrize(
    ("table", "char"),
    [
        ("public.\u212aey", "\u212a"),  # KELVIN SIGN: str.lower() gives public.key, pg_dump dumps the table "\u212aey"
        ("PUBLIC.\u212aEY", "\u212a"),
        ("public.\u0130ey", "\u0130"),  # LATIN CAPITAL LETTER I WITH DOT ABOVE: str.lower() gives 'i' + U+0307
        ("public.straße", "ß"),  # str.casefold() gives 'strasse', str.upper() 'STRASSE'
        ("public.\uff4bey", "\uff4b"),  # FULLWIDTH LATIN SMALL LETTER K: NFKC gives 'k'
    ],
)
def test_a_table_with_non_ascii_outside_quotes_is_refused(table: str, char: str) -> None:
    """pg_dump folds only ASCII letters outside double quotes: a requested name with any other character there is
    refused in one line (exit status 2), whatever Python's folding would make of it."""
    with pytest.raises(AgentUsageError) as refused:
        read_request(_request(tables=[table]), _KEYS)
    assert str(refused.value).startswith(f"refused: table {table!r} has {char!r} (U+{ord(char):04X}) outside double")
    assert refused.value.exit_status == 2


def test_quoted_names_are_compared_exactly_and_ascii_letters_folded() -> None:
    """Quoted names keep every character (a quoted non-ASCII name the allowlist names is allowed, and only that
    one); unquoted ASCII letters fold to lower case as pg_dump folds them."""
    for table in ('public."\u212aey"', '"public"."\u212aey"', 'public."Straße"', "PUBLIC.KEY", 'public."key"'):
        assert read_request(_request(tables=[table]), _KEYS) == AgentOptions("cfdb", [table], quiet=True)
    for table in ('public."Key"', 'public."\u212aEY"', 'public."straße"', 'public."STRASSE"', 'public."Strasse"'):
        assert not _KEYS.allows_table(table)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (
            "public.\u212aey",
            "'public.\u212aey' has '\u212a' (U+212A) outside double quotes, where pg_dump and this "
            "check could read it differently: write names with characters beyond ASCII in double quotes, exactly as "
            'stored (e.g. \'"public"."\u212aey"\')',
        ),
        ("public.\u0130*", "'public.\u0130*' has '\u0130' (U+0130) outside double quotes"),
        (
            '"MySchema".Foo',
            "'\"MySchema\".Foo' has upper-case letters outside double quotes, which PostgreSQL "
            "folds to lower case: write '\"MySchema\".foo' for the lower-case table",
        ),
    ],
)
def test_an_allowlist_pattern_is_folded_as_pg_dump_folds(pattern: str, message: str) -> None:
    """--allow-table with a character beyond ASCII outside quotes is a usage error; the lower-case name suggested
    for upper-case letters is pg_dump's reading (ASCII letters outside quotes), not Python's."""
    with pytest.raises(AgentUsageError) as refused:
        _allowlist("--database", "cfdb", "--allow-table", pattern)
    assert str(refused.value).startswith(f"--allow-table {message}")


def test_the_dump_uses_the_allowlists_zstd() -> None:
    """--zstd of the forced command is the zstd program of every dump it runs; a request may name only that one."""
    allowed = _allowlist("--database=cfdb", "--allow-table=public.__*", "--zstd=/usr/bin/zstd")
    expected = AgentOptions("cfdb", ['"public"."__hosts"'], zstd="/usr/bin/zstd", quiet=True)
    assert read_request(_request(), allowed) == read_request(_request(zstd="/usr/bin/zstd"), allowed) == expected
    with pytest.raises(AgentUsageError, match=r"^refused: zstd '/tmp/zstd': this key runs only '/usr/bin/zstd'$"):
        read_request(_request(zstd="/tmp/zstd"), allowed)


def test_the_statement_caps_are_the_allowlists_own() -> None:
    """--max-rows-per-statement and --max-statement-bytes-limit: a request up to them runs, one above is refused
    (an inserts-mode dump would build its statements in the feeder's memory)."""
    allowed = _allowlist(
        "--database=cfdb", "--allow-table=public.__*", "--max-rows-per-statement=10", "--max-statement-bytes-limit=2048"
    )
    at_caps = read_request(_request(rows_per_statement=10, max_statement_bytes=2048), allowed)
    assert at_caps == AgentOptions(
        "cfdb", ['"public"."__hosts"'], rows_per_statement=10, max_statement_bytes=2048, quiet=True
    )
    with pytest.raises(AgentUsageError, match=r"^refused: --rows-per-statement=11 is above this key's "):
        read_request(_request(rows_per_statement=11, max_statement_bytes=2048), allowed)
    with pytest.raises(AgentUsageError, match=r"^refused: --max-statement-bytes=2049 is above this key's "):
        read_request(_request(rows_per_statement=10, max_statement_bytes=2049), allowed)


def test_an_allowlist_pattern_that_is_not_schema_table_is_a_usage_error() -> None:
    """The forced command's own --allow-table must be schema.table, as superhub.tables."""
    with pytest.raises(AgentUsageError, match=r"is not schema\.table"):
        _allowlist("--database", "cfdb", "--allow-table", "__hosts")


# Over a real sshd: the forced command in authorized_keys, as deploy/authorized_keys.example has it.


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's zipapp, built once for the module."""
    return build(tmp_path_factory.mktemp("zipapp"))


@pytest.fixture(params=["installed", "zipapp"])
def forced(request: pytest.FixtureRequest, federation: Federation, zipapp: Path, tmp_path: Path) -> Iterator[SshServer]:
    """OpenSSH's sshd whose only command for the test key is `ssh-command`, allowing hub1's database and
    public.hosts and public.contexts (from the installed fedload, or the zipapp run by /usr/bin/python3 with its
    arguments in a file)."""
    require_openssh()  # what feeders run; asyncssh's server is not the one to trust with forced commands
    allowlist = [
        f"--database={federation.cluster.conninfo(federation.feeders['hub1'])}",
        "--allow-table=public.hosts",
        "--allow-table=public.conte?ts",
        f"--pg-dump={federation.cluster.install.tool('pg_dump')}",
    ]
    if request.param == "installed":
        command = shlex.join([sys.executable, "-m", "fedload", "agent", "ssh-command", *allowlist])
    else:
        (tmp_path / "agent.args").write_text("\n".join(allowlist) + "\n")
        python = str(python_named("system"))  # Debian's own Python, as on a feeder (no zstandard: the zstd program)
        command = shlex.join([python, "-I", str(zipapp), "ssh-command", f"@{tmp_path / 'agent.args'}"])
    directory = tmp_path / "sshd"
    directory.mkdir()
    server = OpenSshServer(directory, forced_command=command.replace('"', '\\"'))
    yield server
    server.stop()


@pytest.mark.parametrize("mode", ["copy", "binary"])
async def test_sync_through_the_forced_command(forced: SshServer, federation: Federation, mode: str) -> None:
    """A superhub sync over SSH through the forced command loads the feeder's rows exactly, in copy mode and in
    binary mode (its columns and types carried as data through SSH_ORIGINAL_COMMAND)."""
    config = federation.config(transport="ssh", ssh=forced.ssh_config().model_dump(), dump_mode=mode)
    (run,) = await sync(config, "hub1")
    assert run.outcome == Outcome.SUCCESS, run.error
    for table, cols in (("hosts", HOST_COLS), ("contexts", CONTEXT_COLS)):
        expected = federation.digest(federation.feeders["hub1"], table, cols)
        assert federation.digest(federation.superhub, table, cols, "WHERE hub_id = 1") == expected


async def test_check_config_connect_through_the_forced_command(forced: SshServer, federation: Federation) -> None:
    """check-config --connect's probes get their answers through the forced command, not a dump."""
    feeder = federation.config(transport="ssh", ssh=forced.ssh_config().model_dump()).feeders["hub1"]
    probes = [probe.line() for probe in await probe_feeder("hub1", feeder)]
    assert probes[0] == f"feeder hub1 connection: OK (ssh {forced.user}@127.0.0.1:{forced.port})"
    assert probes[1] == f"feeder hub1 agent: OK (fedload {__version__})"
    assert probes[2].startswith("feeder hub1 pg_dump: OK (pg_dump (PostgreSQL) ")


@pytest.mark.parametrize(
    ("command", "refusal"),
    [
        ("dump-a-table", 'refused: table \'"public"."secrets"\' is not within this key\'s allowed tables'),
        ("dump-big-statements", "refused: --rows-per-statement=1000000 is above this key's --max-rows-per-statement"),
        ("dump-kelvin", "refused: table 'public.\u212aosts' has '\u212a' (U+212A) outside double quotes, where"),
        ("cat /etc/passwd", "refused `cat /etc/passwd`: this key may only run"),
        (None, "refused a session without a command (a shell): this key may only run"),
    ],
    ids=["table", "statement", "non-ascii", "command", "shell"],
)
async def test_refused_over_ssh_in_one_line(
    forced: SshServer, federation: Federation, command: str | None, refusal: str
) -> None:
    """A table outside the allowlist, inserts merged beyond its caps, a table with a character beyond ASCII outside
    quotes, another command, a shell: exit status 2 and one line on stderr."""
    database = federation.cluster.conninfo(federation.feeders["hub1"])
    if command == "dump-a-table":
        command = shlex.join(["fedload", *AgentOptions(database, ['"public"."secrets"'], quiet=True).to_argv()])
    elif command == "dump-kelvin":
        command = shlex.join(["fedload", *AgentOptions(database, ["public.\u212aosts"], quiet=True).to_argv()])
    elif command == "dump-big-statements":
        request = AgentOptions(database, ["public.hosts"], dump_mode="inserts", rows_per_statement=10**6, quiet=True)
        command = shlex.join(["fedload", *request.to_argv()])
    async with (
        asyncio.timeout(60),
        asyncssh.connect(
            "127.0.0.1",
            forced.port,
            username=forced.user,
            client_keys=[str(forced.client_key)],
            known_hosts=str(forced.known_hosts),
        ) as connection,
    ):
        result = await connection.run(command, check=False)  # None: a shell session
    assert result.exit_status == 2
    assert isinstance(result.stderr, str)
    [line] = result.stderr.splitlines()
    assert line.startswith(f"fedload: error: {refusal}")
    assert result.stdout == ""


def _example_argv() -> list[str]:
    """The forced command of deploy/authorized_keys.example's key, split as sshd's shell splits it."""
    example = Path(__file__).resolve().parents[2] / "deploy" / "authorized_keys.example"
    line = next(line for line in example.read_text().splitlines() if line.startswith("command="))
    return shlex.split(line.split('"')[1])


def test_the_example_forced_command_allows_the_example_tables() -> None:
    """deploy/authorized_keys.example's forced command reads as an allowlist that lets the superhub of the example
    fedload.toml dump its tables from that database, with pg_dump and zstd named by full paths."""
    argv = _example_argv()
    allowed = _allowlist(*argv[argv.index("ssh-command") + 1 :])
    assert argv[:3] == ["/usr/bin/python3", "-I", "/opt/fedload/fedload-agent.pyz"]
    assert allowed.databases == ("cfdb",)
    for table in ("__hosts", "__contexts", "__promiselog_repaired"):
        assert allowed.allows_table(f'"public"."{table}"')
    assert (allowed.pg_dump, allowed.zstd) == ("/usr/lib/postgresql/15/bin/pg_dump", "/usr/bin/zstd")  # not PATH's


async def test_sync_through_the_example_forced_command(federation: Federation, zipapp: Path, tmp_path: Path) -> None:
    """The example's forced command as written, with this machine's zipapp, database, pg_dump and zstd in place of
    its paths, run by sshd: a sync loads the feeder's rows exactly, compressed by the zstd program its --zstd names
    (Debian's python3 has no zstandard module), whatever zstd sshd's PATH holds."""
    require_openssh()
    zstd = shutil.which("zstd")
    if zstd is None:
        pytest.skip("the zstd program is not installed (Debian: apt-get install zstd)")
    used = tmp_path / "zstd.used"
    recording = write_script(tmp_path / "zstd", f'echo "$@" >> {used}\nexec {zstd} "$@"\n')
    ours = {
        "/usr/bin/python3": str(python_named("system")),
        "/opt/fedload/fedload-agent.pyz": str(zipapp),
        "cfdb": federation.cluster.conninfo(federation.feeders["hub1"]),
        "public.__*": "public.*",
        "/usr/lib/postgresql/15/bin/pg_dump": federation.cluster.install.tool("pg_dump"),
        "/usr/bin/zstd": recording,
    }
    example = _example_argv()
    assert set(ours) <= set(example)
    (tmp_path / "sshd").mkdir()
    command = shlex.join([ours.get(word, word) for word in example])
    server = OpenSshServer(tmp_path / "sshd", forced_command=command.replace('"', '\\"'))
    try:
        (run,) = await sync(federation.config(transport="ssh", ssh=server.ssh_config().model_dump()), "hub1")
    finally:
        server.stop()
    assert run.outcome == Outcome.SUCCESS, run.error
    for table, cols in (("hosts", HOST_COLS), ("contexts", CONTEXT_COLS)):
        expected = federation.digest(federation.feeders["hub1"], table, cols)
        assert federation.digest(federation.superhub, table, cols, "WHERE hub_id = 1") == expected
    assert "--stream-size=" in used.read_text()  # the zstd program --zstd names compressed the stream
