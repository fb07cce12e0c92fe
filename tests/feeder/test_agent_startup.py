"""The agent starts once per feeder and run (issue #36): its entries import the agent, not the superhub's command
line nor what another agent command needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "fedload"  # the console script, installed next to the interpreter


def _imported(argv: list[str]) -> set[str]:
    """Every module a command imports (from PYTHONPROFILEIMPORTTIME, as `-X importtime`); it must exit 0."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize(
    "entry", [[sys.executable, "-m", "fedload"], [str(SCRIPT)]], ids=["python -m fedload", "console script"]
)
def test_agent_dump_does_not_import_the_command_line(entry: list[str]) -> None:
    """`fedload agent dump` reaches the agent without fedload.cli, the superhub's commands or the forced command."""
    imported = _imported([*entry, "agent", "dump", "--help"])
    assert "fedload.feeder.main" in imported  # the check sees the agent's modules
    assert {"fedload.cli", "fedload.commands", "fedload.feeder.ssh_command"} & imported == set()


def test_agent_ssh_command_does_not_import_the_command_line() -> None:
    """`fedload agent ssh-command` reaches the forced command without fedload.cli."""
    imported = _imported([sys.executable, "-m", "fedload", "agent", "ssh-command", "--help"])
    assert "fedload.feeder.ssh_command" in imported
    assert {"fedload.cli", "fedload.commands"} & imported == set()


def test_other_commands_still_reach_the_command_line() -> None:
    """Any other command goes through fedload.cli, as before."""
    assert "fedload.cli" in _imported([sys.executable, "-m", "fedload", "agent", "pack", "--help"])


def test_binary_mode_does_not_import_the_transformer() -> None:
    """The agent's modules for binary mode, which never transforms, leave the transformer unimported (compiling its
    patterns took ~30 ms of every agent's start); copy mode's entry imports it."""
    code = "import sys, fedload.feeder.main, fedload.feeder.binary_dump; print(*sorted(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    imported = set(done.stdout.split())
    assert "fedload.feeder.binary_dump" in imported
    assert {"transforms.transform", "transforms.lexical", "transforms.split"} & imported == set()
    assert "transforms.cli" in imported  # the dump's parser takes the transformer's options
