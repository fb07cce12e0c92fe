"""The pg_dump version a process that forks agents asks once (fedload.transport.zygote): kept per binary, asked
again when the binary changes, never kept for a script."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fedload.feeder.errors import AgentError
from fedload.feeder.main import dump_options_of
from fedload.feeder.pg_dump import VersionProbe, pg_dump_version, remember_pg_dump_version
from fedload.localpg import LocalCluster


@pytest.fixture
def pg_dump_copy(cluster: LocalCluster, tmp_path: Path) -> Path:
    """A copy of the test install's pg_dump binary, which the test may make unrunnable."""
    copy = tmp_path / "pg_dump"
    shutil.copy2(cluster.install.tool("pg_dump"), copy)
    return copy


def test_a_remembered_binary_is_not_asked_again(pg_dump_copy: Path, cluster: LocalCluster) -> None:
    """Once remembered, the version comes without running pg_dump (here it could not run any more)."""
    version = pg_dump_version(str(pg_dump_copy))
    remember_pg_dump_version(str(pg_dump_copy))
    pg_dump_copy.chmod(0o644)

    assert pg_dump_version(str(pg_dump_copy)) == version
    assert version.split(".")[0] == str(cluster.install.major)


def test_a_binary_changed_in_place_is_asked_again(pg_dump_copy: Path) -> None:
    """A new modification time (an upgrade replacing the file) makes the kept version stale: pg_dump is run again
    (and here, unrunnable, fails saying so)."""
    remember_pg_dump_version(str(pg_dump_copy))
    pg_dump_copy.chmod(0o644)
    os.utime(pg_dump_copy, ns=(0, 1_000_000_000))

    with pytest.raises(AgentError, match="cannot run"):
        pg_dump_version(str(pg_dump_copy))


def test_a_script_is_never_kept(tmp_path: Path) -> None:
    """A wrapper script (Debian's pg_wrapper picks a version per cluster) is run at every dump."""
    script = tmp_path / "pg_dump"
    script.write_text("#!/bin/sh\necho 'pg_dump (PostgreSQL) 17.6'\n")
    script.chmod(0o755)
    remember_pg_dump_version(str(script))
    assert pg_dump_version(str(script)) == "17.6"
    script.chmod(0o644)

    with pytest.raises(AgentError, match="cannot run"):
        pg_dump_version(str(script))


def test_a_probe_answers_as_the_agent_asks(pg_dump_copy: Path) -> None:
    """A probe started before other work (binary mode starts psql meanwhile) reads the version pg_dump states; one
    of a remembered binary runs nothing (here it could not run); one that cannot run fails as the agent's ask."""
    probe = VersionProbe(str(pg_dump_copy))
    assert probe.version() == pg_dump_version(str(pg_dump_copy))
    remember_pg_dump_version(str(pg_dump_copy))
    pg_dump_copy.chmod(0o644)
    assert VersionProbe(str(pg_dump_copy)).version() == probe.version()
    os.utime(pg_dump_copy, ns=(0, 1_000_000_000))  # no longer the binary remembered

    with pytest.raises(AgentError, match="cannot run"):
        VersionProbe(str(pg_dump_copy)).version()


def test_a_probe_of_a_failing_script_fails(tmp_path: Path) -> None:
    """A pg_dump that exits non-zero on --version gives no version: the dump fails saying so."""
    script = tmp_path / "pg_dump"
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)

    with pytest.raises(AgentError, match="status 3"):
        VersionProbe(str(script)).version()


def test_dump_options_are_read_as_the_agent_reads_them() -> None:
    """The zygote's look-ahead reads the superhub's words as the agent does; other commands and bad words: None."""
    words = ["agent", "dump", "--quiet", "--database=x", "--table=t", "--pg-dump=/opt/pg/bin/pg_dump", "--", "-h", "y"]
    options = dump_options_of(words)

    assert options is not None
    assert (options.pg_dump, options.pg_dump_args) == ("/opt/pg/bin/pg_dump", ("-h", "y"))
    assert dump_options_of(["agent", "ssh-command"]) is None
    assert dump_options_of(["agent", "dump", "--no-such-flag"]) is None
