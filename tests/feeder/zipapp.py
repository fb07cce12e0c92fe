"""The agent's zipapp for the tests, and the Pythons found here to run it with."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedload.commands.pack import pack

# Debian 12's own Python, then pyenv's releases (issue 34: the feeders' Pythons are 3.9 and later).
SYSTEM_PYTHON = Path("/usr/bin/python3")
PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
PYTHONS = ("system", "3.9", "3.10", "3.12", "3.13")


def build(directory: Path) -> Path:
    """`fedload agent pack -o DIRECTORY/fedload-agent.pyz`; the file."""
    target = directory / "fedload-agent.pyz"
    pack(target)
    return target


def python_named(name: str) -> Path:
    """/usr/bin/python3 ("system") or pyenv's newest release of a minor version ("3.9"); skipped if absent, except
    /usr/bin/python3 where FEDLOAD_REQUIRE_SYSTEM_PYTHON=1 (as .ci/run sets)."""
    if name == "system":
        if SYSTEM_PYTHON.exists():
            return SYSTEM_PYTHON
        if os.environ.get("FEDLOAD_REQUIRE_SYSTEM_PYTHON") == "1":
            pytest.fail(f"{SYSTEM_PYTHON} is required (FEDLOAD_REQUIRE_SYSTEM_PYTHON=1) but absent")
        pytest.skip(f"{SYSTEM_PYTHON} is absent")
    found = PYENV_VERSIONS.glob(f"{name}.*/bin/python3")
    newest = sorted(found, key=lambda path: [int(n) for n in path.parts[-3].split(".") if n.isdigit()])
    if not newest:
        pytest.skip(f"no Python {name} under {PYENV_VERSIONS}")
    return newest[-1]
