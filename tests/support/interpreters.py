"""The Python interpreters of this machine that feeder-side code is tested on: Debian's own /usr/bin/python3 and
pyenv's releases of other minor versions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["PYENV_VERSIONS", "SYSTEM_PYTHON", "python_named"]

SYSTEM_PYTHON = Path("/usr/bin/python3")
PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


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
