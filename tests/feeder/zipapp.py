"""The agent's zipapp for the tests: built once per module, and the Pythons found here to run it with."""

from __future__ import annotations

import glob
import subprocess
from pathlib import Path

import pytest

from fedload.commands.pack import pack

# Debian 12's own Python, then pyenv's releases (issue 34: the feeders' Pythons are 3.9 and later).
PYTHONS = (
    "/usr/bin/python3",
    *(f"/root/.pyenv/versions/{minor}.*/bin/python3" for minor in ("3.9", "3.10", "3.12", "3.13")),
)
# Until the transformer stops relying on possessive quantifiers (issue 34, item 2: branch transforms-portable), it
# does not compile on Python 3.9 and 3.10 and splits statements wrongly on 3.11 before 3.11.5.
_TRANSFORMS = Path(__file__).resolve().parents[2] / "transforms"
TRANSFORMER_NEEDS_3_11_5 = "*+" in (_TRANSFORMS / "lexical.py").read_text()


def build(directory: Path) -> Path:
    """`fedload agent pack -o DIRECTORY/fedload-agent.pyz`; the file."""
    target = directory / "fedload-agent.pyz"
    pack(target)
    return target


def interpreter_params() -> list[object]:
    """One pytest param per Python of PYTHONS: skipped if absent, xfail (strict) where the transformer cannot run."""
    params: list[object] = []
    for pattern in PYTHONS:
        found = sorted(glob.glob(pattern))
        if not found:
            params.append(pytest.param(pattern, marks=pytest.mark.skip(reason=f"no {pattern} here"), id=pattern))
            continue
        python = found[-1]
        version = python_version(python)
        marks = []
        if TRANSFORMER_NEEDS_3_11_5 and version < (3, 11, 5):
            reason = "the transformer's possessive quantifiers need Python 3.11.5 (issue 34, item 2)"
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        params.append(pytest.param(python, marks=marks, id=".".join(map(str, version))))
    return params


def python_version(python: str) -> tuple[int, ...]:
    """The version of the Python at `python`."""
    done = subprocess.run(
        [python, "-I", "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True, check=True, timeout=30
    )
    return tuple(map(int, done.stdout.split()))
