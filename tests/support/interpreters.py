"""The Python interpreters of this machine that feeder-side code is tested on: Debian's own /usr/bin/python3 and
pyenv's releases of other minor versions."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["PYENV_VERSIONS", "SYSTEM_PYTHON", "pyenv_pythons", "python_named"]

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
    newest = pyenv_pythons(name)
    if isinstance(newest, str):
        pytest.skip(newest)
    return newest[-1]


def pyenv_pythons(minor: str) -> list[Path] | str:
    """The python3 of each pyenv release of `minor` this account can run, oldest first; else why there is none (an
    absent or unreadable PYENV_VERSIONS is lacking, as on an account whose PYENV_ROOT is another user's)."""
    try:
        releases = [entry.name for entry in os.scandir(PYENV_VERSIONS) if entry.name.startswith(f"{minor}.")]
    except FileNotFoundError:
        return f"no Python {minor}: {PYENV_VERSIONS} is absent"
    except OSError as exc:
        return f"no Python {minor}: this account cannot read {PYENV_VERSIONS} ({exc.strerror})"
    runnable = [PYENV_VERSIONS / release / "bin" / "python3" for release in releases]
    runnable = [path for path in runnable if os.access(path, os.X_OK)]
    if not runnable:
        return f"no Python {minor} this account can run under {PYENV_VERSIONS}"
    return sorted(runnable, key=lambda path: [int(n) for n in path.parts[-3].split(".") if n.isdigit()])
