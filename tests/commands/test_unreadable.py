"""A directory or file the user cannot read is one line and exit 2, never a traceback: fedload run as `nobody`
(root switches to it with runuser, as `sudo -u fedload fedload status` does in /root) in a 0700 directory.

`nobody` imports fedload from a world-readable copy (tests/support/readable_copy.py), so these tests pass when the
clone itself is out of its reach too (in root's 0700 home).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.readable_copy import readable_copy

RUNUSER = shutil.which("runuser")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or RUNUSER is None, reason="only root runs fedload as another user (runuser)"
)
_CONFIG = '[superhub]\ndsn = "x"\ntables = ["public.t"]\n'


@pytest.fixture(scope="module")
def fedload_for_nobody() -> Iterator[Path]:
    """A root-owned, world-readable copy of this checkout's fedload and its dependencies, for PYTHONPATH; skipped,
    saying why, where user nobody still cannot import fedload from it."""
    directory = readable_copy(Path(tempfile.mkdtemp(prefix="fedload-readable-")))
    try:
        probe = _run_as_nobody([_python(), "-c", "import fedload.cli"], directory, cwd="/")
        if probe.returncode != 0:
            pytest.skip(f"user nobody cannot import fedload from {directory}: {probe.stderr.strip()[-300:]}")
        yield directory
    finally:
        shutil.rmtree(directory)


def as_nobody(
    *args: str, pythonpath: Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m fedload ARGS` run as user nobody in `cwd`, importing fedload from `pythonpath`."""
    return _run_as_nobody([_python(), "-m", "fedload", *args], pythonpath, cwd=cwd, env=env)


def _run_as_nobody(
    argv: list[str], pythonpath: Path, cwd: Path | str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    assert RUNUSER is not None
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pythonpath), **(env or {})}
    settings = [f"{name}={value}" for name, value in environment.items()]
    return subprocess.run(
        [RUNUSER, "-u", "nobody", "--", "env", "-i", *settings, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


def _python() -> str:
    """An interpreter of this version that nobody may run (this one may live in root's home); else skip."""
    wanted = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (os.path.realpath(sys.executable), f"/usr/bin/python{wanted}"):
        assert RUNUSER is not None
        probe = subprocess.run(
            [RUNUSER, "-u", "nobody", "--", candidate, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            cwd="/",
        )
        if probe.returncode == 0 and probe.stdout.strip() == str(sys.version_info[:2]):
            return candidate
    pytest.skip(f"no Python {wanted} that user nobody may run")


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A directory only root may enter, like /root (0700)."""
    directory = Path(tempfile.mkdtemp(prefix="fedload-private-"))
    yield directory
    shutil.rmtree(directory)


@pytest.mark.parametrize("command", [["status"], ["check-config"], ["sync", "--json"]])
def test_unreadable_current_directory_is_one_line(
    fedload_for_nobody: Path, private_dir: Path, command: list[str]
) -> None:
    """Run in a directory the user cannot read, looking for ./fedload.toml says so in one line, exit 2."""
    result = as_nobody(*command, pythonpath=fedload_for_nobody, cwd=private_dir)
    assert result.returncode == 2
    first = result.stderr.splitlines()[0]
    assert first == (
        f"fedload: cannot look for ./fedload.toml in {private_dir}: Permission denied for user nobody; give --config "
        "PATH or set $FEDLOAD_CONFIG, or run fedload from a directory this user can read (cd /)"
    )
    assert result.stderr == first + "\n"


@pytest.mark.parametrize("how", ["--config", "$FEDLOAD_CONFIG"])
@pytest.mark.parametrize("private", ["file", "directory"])
def test_unreadable_configuration_file_is_one_line(
    fedload_for_nobody: Path, private_dir: Path, how: str, private: str
) -> None:
    """A configuration file the user may not read (mode 0600, or in a 0700 directory): one line naming it, exit 2."""
    config = private_dir / "fedload.toml"
    config.write_text(_CONFIG)
    if private == "file":
        private_dir.chmod(0o755)
        config.chmod(0o600)
    env = {"FEDLOAD_CONFIG": str(config)} if how == "$FEDLOAD_CONFIG" else {}
    flags = ["--config", str(config)] if how == "--config" else []
    result = as_nobody("status", *flags, pythonpath=fedload_for_nobody, cwd=Path("/"), env=env)
    assert (result.returncode, result.stderr) == (2, f"fedload: {config}: cannot read the file: Permission denied\n")
