"""The agent's zipapp for the tests, and the Pythons found here to run it with."""

from __future__ import annotations

from pathlib import Path

from fedload.commands.pack import pack

# Debian 12's own Python, then pyenv's releases (issue 34: the feeders' Pythons are 3.9 and later).
PYTHONS = ("system", "3.9", "3.10", "3.12", "3.13")


def build(directory: Path) -> Path:
    """`fedload agent pack -o DIRECTORY/fedload-agent.pyz`; the file."""
    target = directory / "fedload-agent.pyz"
    pack(target)
    return target
