"""`fedload check-config`: the files it names, duplicate keys, and `--connect` against real servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedload import __version__
from fedload.commands.probe import probe_feeder
from fedload.config import FeederConfig, locate_config
from fedload.localpg import LocalCluster
from tests.support.federation import Federation, config_toml
from tests.support.sshd import SshServer, keygen

REPO = Path(__file__).resolve().parents[2]


def check(config: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`fedload check-config` on a file."""
    return subprocess.run(
        [sys.executable, "-m", "fedload", "check-config", "--config", str(config), *options],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def example_with_files(tmp_path: Path) -> Path:
    """The shipped fedload.toml with its /etc/fedload files created under tmp_path."""
    (tmp_path / "remap").mkdir()
    (tmp_path / "remap" / "hub-us1.toml").write_text('[tables."public.__hosts"]\nrename = { hostname = "name" }\n')
    keygen(tmp_path / "id_ed25519")
    (tmp_path / "known_hosts").write_text("")
    config = tmp_path / "fedload.toml"
    config.write_text((REPO / "fedload.toml").read_text().replace("/etc/fedload/", f"{tmp_path}/"))
    return config


def test_example_file_with_its_files_is_ok(tmp_path: Path) -> None:
    """The shipped fedload.toml, once the files it names exist: OK, counted in English."""
    result = check(example_with_files(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(": OK (3 feeders, 6 table patterns)\n")


def test_missing_and_open_files_are_named(tmp_path: Path) -> None:
    """A missing remap file, a key readable by others, a missing known_hosts: exit 2, one line each."""
    config = example_with_files(tmp_path)
    (tmp_path / "remap" / "hub-us1.toml").unlink()
    (tmp_path / "id_ed25519").chmod(0o644)
    (tmp_path / "known_hosts").unlink()
    result = check(config)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    key = tmp_path / "id_ed25519"
    assert f"fedload: {config}: feeders.hub-eu1.ssh.identity: {key} is open to others (mode 0644); " in lines[0]
    assert lines[0].endswith(f"needs 0600 or stricter: chmod 600 {key}")
    assert (
        lines[1]
        == f"fedload: {config}: feeders.hub-eu1.ssh.known_hosts: {tmp_path}/known_hosts: No such file or directory"
    )
    assert (
        lines[-1]
        == f"fedload: {config}: feeders.hub-us1.remap: {tmp_path}/remap/hub-us1.toml: No such file or directory"
    )
    assert len(lines) == 5  # identity and known_hosts of both ssh feeders, the remap file


@pytest.mark.parametrize(
    ("remap", "problem"),
    [
        ('[tables."public.nosuch"]\ndrop = ["x"]\n', "names table public.nosuch, which no pattern in superhub.tables"),
        ("[tables.__hosts]\nrename = 3\n", 'tables.__hosts.rename: expected a table of column = "string" pairs'),
    ],
)
def test_remap_files_parse_and_name_configured_tables(tmp_path: Path, remap: str, problem: str) -> None:
    """A remap file that does not parse, or names a table no pattern matches, is a problem of that feeder."""
    config = example_with_files(tmp_path)
    (tmp_path / "remap" / "hub-us1.toml").write_text(remap)
    result = check(config)
    assert result.returncode == 2
    assert result.stderr.startswith(f"fedload: {config}: feeders.hub-us1.remap: ")
    assert problem in result.stderr


def test_keys_written_as_number_and_string_are_the_same_key(tmp_path: Path) -> None:
    """key = 1 and key = "1" collide; the error names both feeders; one feeder is "1 feeder"."""
    config = tmp_path / "fedload.toml"
    feeder = '[feeders.{}]\nkey = {}\ntransport = "local"\n'
    head = '[superhub]\ndsn = "x"\ntables = ["public.t"]\n'
    config.write_text(head + feeder.format("east", 1) + feeder.format("west", '"1"'))
    result = check(config)
    assert result.returncode == 2
    assert result.stderr == f"fedload: {config}: (top level): feeder keys must be unique: east and west share key 1\n"
    config.write_text(head + feeder.format("east", 1))
    assert check(config).stdout == f"configuration {config} (given by --config): OK (1 feeder, 1 table pattern)\n"


def test_connect_tries_the_superhub_and_every_feeder(federation: Federation) -> None:
    """--connect: one line per item; a feeder whose pg_dump is missing FAILS with the reason, exit 1."""
    config = federation.tmp / "fedload.toml"
    text = config_toml(federation)
    config.write_text(text.replace('pg_dump = "', 'pg_dump = "/nonexistent/pg_dump"\n#', 1))
    result = check(config, "--connect")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    major = federation.cluster.install.major
    assert lines[1].startswith(f"superhub: OK (PostgreSQL {major}.")
    assert lines[2] == (
        "superhub tables: OK (0 partitioned tables match superhub.tables; "
        "the first sync creates public.* from the schema file)"
    )
    assert lines[3:6] == [
        "feeder hub1 connection: OK (local commands, nothing to connect to)",
        f"feeder hub1 agent: OK (fedload {__version__})",
        "feeder hub1 pg_dump: FAILED: cannot start the local dump command /nonexistent/pg_dump: "
        "No such file or directory",
    ]
    assert lines[8].startswith(f"feeder hub2 pg_dump: OK (pg_dump (PostgreSQL) {major}.")
    assert len(lines) == 12


def test_connect_names_an_extension_the_superhub_lacks(federation: Federation) -> None:
    """--connect: a schema-file table needing an extension the superhub does not have FAILS, naming both."""
    config = federation.tmp / "fedload.toml"
    config.write_text(config_toml(federation))
    (federation.tmp / "schema.sql").write_text(
        "CREATE EXTENSION IF NOT EXISTS fedload_no_such_extension WITH SCHEMA public;\n"
        "CREATE TABLE public.hosts (hostkey text NOT NULL, shape public.fancy_shape);\n"
    )
    result = check(config, "--connect")
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[2] == (
        "superhub tables: FAILED: 0 partitioned tables match superhub.tables; the schema file cannot create "
        "public.*: schema.sql:1: table public.hosts needs extension fedload_no_such_extension, which the superhub "
        "does not have (it is not in pg_available_extensions)"
    )


def test_connect_with_the_superhub_down(tmp_path: Path) -> None:
    """--connect with nothing listening: the superhub line says FAILED and why; exit 1."""
    config = tmp_path / "fedload.toml"
    config.write_text('[superhub]\ndsn = "postgresql://fedload@127.0.0.1:1/superhub"\ntables = ["public.t"]\n')
    result = check(config, "--connect")
    assert result.returncode == 1
    assert result.stdout.splitlines()[1].startswith("superhub: FAILED: cannot connect to the superhub: ")


async def test_connect_over_ssh(sshd: SshServer, cluster: LocalCluster, tmp_path: Path) -> None:
    """Over a real sshd: the handshake, the agent's and pg_dump's versions; a wrong host key stops at the handshake."""
    feeder = FeederConfig(
        key=1,
        ssh=sshd.ssh_config(),
        agent_command=[sys.executable, "-m", "fedload"],
        pg_dump=cluster.install.tool("pg_dump"),
    )
    probes = [probe.line() for probe in await probe_feeder("east", feeder)]
    assert probes[0] == f"feeder east connection: OK (ssh {sshd.user}@127.0.0.1:{sshd.port})"
    assert probes[1] == f"feeder east agent: OK (fedload {__version__})"
    assert probes[2].startswith(f"feeder east pg_dump: OK (pg_dump (PostgreSQL) {cluster.install.major}.")
    impostor = keygen(tmp_path / "impostor").split()[:2]
    (tmp_path / "other").write_text(f"[127.0.0.1]:{sshd.port} {' '.join(impostor)}\n")
    wrong = feeder.model_copy(update={"ssh": sshd.ssh_config(known_hosts=tmp_path / "other")})
    [failed] = await probe_feeder("east", wrong)
    assert failed.line().startswith("feeder east connection: FAILED: the host key of feeder 127.0.0.1:")


@pytest.mark.parametrize("rule", ["--config", "$FEDLOAD_CONFIG", "./fedload.toml", "/etc/fedload/fedload.toml"])
def test_the_file_read_and_the_rule_that_chose_it_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    """Each place the configuration may come from is named with its rule, the path whole (from the root)."""
    here, default = tmp_path / "here", tmp_path / "etc-fedload.toml"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr("fedload.config.DEFAULT_CONFIG_PATHS", (Path("fedload.toml"), default))
    given = tmp_path / "given.toml"
    environ = {"FEDLOAD_CONFIG": str(given)} if rule == "$FEDLOAD_CONFIG" else {}
    for path in (given, default, here / "fedload.toml")[: 3 if rule == "./fedload.toml" else 2]:
        path.write_text("")
    location = locate_config(given if rule == "--config" else None, environ)
    expected = {
        "--config": (given, "given by --config"),
        "$FEDLOAD_CONFIG": (given, "from $FEDLOAD_CONFIG"),
        "./fedload.toml": (here / "fedload.toml", "./fedload.toml in the current directory"),
        "/etc/fedload/fedload.toml": (default, "the default, as there is no ./fedload.toml"),
    }[rule]
    assert (location.whole_path, location.chosen_by) == expected
    assert str(location) == f"{expected[0]} ({expected[1]})"


def test_check_config_names_the_file_found_in_the_current_directory(tmp_path: Path) -> None:
    """Run where a fedload.toml lies, check-config says it read that one, with its whole path and why."""
    (tmp_path / "fedload.toml").write_text('[superhub]\ndsn = "x"\ntables = ["public.t"]\n')
    result = subprocess.run(
        [sys.executable, "-m", "fedload", "check-config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (
        f"configuration {tmp_path}/fedload.toml (./fedload.toml in the current directory): "
        "OK (0 feeders, 1 table pattern)\n"
    )


def test_the_jump_example_is_valid_and_a_bad_jump_is_named(tmp_path: Path) -> None:
    """The commented bastion feeder of the example, uncommented, is OK; a `jump` that is not [USER@]HOST[:PORT]
    is one line naming the key, exit 2."""
    config = example_with_files(tmp_path)
    lines = config.read_text().splitlines()
    start = lines.index(
        "# [feeders.hub-ap1]                 # a feeder reachable only through a bastion (an SSH jump host, as ssh -J)"
    )
    uncommented = [line.removeprefix("# ") for line in lines[start : start + 4]]
    config.write_text("\n".join(lines[:start] + uncommented + lines[start + 4 :]) + "\n")
    result = check(config)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(": OK (4 feeders, 6 table patterns)\n")
    config.write_text(config.read_text().replace('jump = "fedload@bastion.example.com:22"', 'jump = "fedload@:22"'))
    result = check(config)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"fedload: {config}: feeders.hub-ap1.ssh.jump: 'fedload@:22' is not [USER@]HOST[:PORT] "
        "(say fedload@bastion.example.com:22)\n"
    )
