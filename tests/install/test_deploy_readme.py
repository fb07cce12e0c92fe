"""deploy/README.md's superhub install, run as written with Debian's own /usr/bin/python3 (issue 34, item 3).

The shell blocks marked `<!-- install-test: NAME -->` run in bash, line by line as written, except:
- paths: /opt/fedload, /usr/local/bin, /usr/share/doc/fedload, /etc/fedload and /var/lib/fedload lie under a
  temporary root; /path/to/fedload is a copy of this checkout (the build writes dist/ and wheelhouse/ there);
- the account `fedload` does not exist here (creating it is a system change): `sudo -u fedload CMD` runs CMD as
  the test's user, and `install` leaves out `-o fedload` and `-g fedload`;
- the lines of SKIPPED run no command: the script echoes `SKIPPED (reason): line` and does the stand-in shown;
- the "then edit it" of fedload.toml is done by `EDIT_CONFIG`: the example's /etc/fedload paths moved under the
  temporary root, and the remap file it names written;
- `fedload check-config` finds the file through $FEDLOAD_CONFIG (it is not in /etc/fedload here).
pip reads no configuration of this machine (PIP_CONFIG_FILE=/dev/null, no PIP_* variables), as on a fresh Debian;
the superhub's commands get Debian's PATH, the build on "a machine with internet" also the directory of `uv`.
Needs /usr/bin/python3 with venv and ensurepip, and PyPI: skipped without, failed instead where
FEDLOAD_REQUIRE_SYSTEM_PYTHON=1 (CI).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "deploy" / "README.md"
UNIT = REPO / "deploy" / "fedload.service"
DOCUMENTATION = re.compile(r"^Documentation=(.*)$", re.MULTILINE)
SYSTEM_PYTHON = Path("/usr/bin/python3")
PYPI = "https://pypi.org/simple/pip/"
STEP_TIMEOUT_S = 300.0
BLOCK = re.compile(r"^( *)<!-- install-test: ([\w-]+) -->\n\1```sh\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)
MOVED = ("/opt/fedload", "/usr/local/bin", "/usr/share/doc/fedload", "/etc/fedload", "/var/lib/fedload")
REMAP = '[tables."public.__hosts"]\nadd = { site = "\'eu-west\'" }\n'

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass(frozen=True)
class Skip:
    """A README line that changes the system or needs what a test has not: why, and what runs instead."""

    start: str
    reason: str
    instead: str = ":"


SKIPPED = (
    Skip("apt install ", "system packages; `requirements` checked venv and ensurepip of /usr/bin/python3"),
    Skip("useradd ", "a system account; its home is made", "install -d /var/lib/fedload"),
    Skip("sudo -u postgres ", "a database server; the suite's own clusters test the database side"),
    Skip(
        "ssh-keyscan ",
        "the network; a stand-in host key",
        "echo \"hub-eu1.example.com $(cut -d' ' -f1,2 /etc/fedload/id_ed25519.pub)\" >> /etc/fedload/known_hosts",
    ),
)
EDIT_CONFIG = (  # @ETC@ is the example's own /etc/fedload, not moved
    "sed -i 's#\"@ETC@/#\"/etc/fedload/#g' /etc/fedload/fedload.toml && "
    "install -D -m 0644 @REMAP@ /etc/fedload/remap/hub-us1.toml"
)


def readme_blocks() -> dict[str, list[str]]:
    """The marked blocks of deploy/README.md, each as its logical lines (a trailing backslash continues one)."""
    blocks = {}
    for match in BLOCK.finditer(README.read_text()):
        indent, name, body = match.groups()
        text = "\n".join(line.removeprefix(indent) for line in body.splitlines())
        blocks[name] = text.replace("\\\n", " ").splitlines()
    return blocks


def as_tested(line: str) -> str:
    """The line with the account-free rewrites and the skips applied (paths are moved afterwards)."""
    for skip in SKIPPED:
        if line.startswith(skip.start):
            return f"echo {shlex_quote(f'SKIPPED ({skip.reason}): {line}')}; {skip.instead}"
    line = line.replace("sudo -u fedload ", "").replace(" -o fedload", "").replace(" -g fedload", "")
    if "# then edit it" in line:
        line = f"{line}\n{EDIT_CONFIG}"
    return line


def shlex_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@dataclass(frozen=True)
class Machine:
    """A temporary root standing in for the superhub's file system, and the checkout copied there."""

    root: Path
    checkout: Path

    def moved(self, line: str) -> str:
        line = re.sub(r"(?<![\w/.-])/path/to/fedload(?![\w-])", str(self.checkout), line)
        for path in MOVED:
            line = re.sub(rf"(?<![\w/.-]){re.escape(path)}(?![\w-])", f"{self.root}{path}", line)
        return line.replace("@REMAP@", str(self.root / "remap.toml")).replace("@ETC@", "/etc/fedload")

    def script(self, lines: list[str]) -> str:
        return "set -euo pipefail\n" + "\n".join(self.moved(as_tested(line)) for line in lines) + "\n"

    def env(self, *, connected: bool) -> dict[str, str]:
        path = f"{self.root}/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
        if connected:
            path = f"{Path(str(shutil.which('uv'))).parent}:{path}"
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHON", "UV_"))}
        return keep | {
            "PATH": path,
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "FEDLOAD_CONFIG": f"{self.root}/etc/fedload/fedload.toml",
        }

    def run(self, lines: list[str], *, connected: bool = False) -> str:
        """Run the lines in bash, as root would in a fresh shell (cwd: the temporary root); their output."""
        done = subprocess.run(
            ["bash", "-c", self.script(lines)],
            cwd=self.root,
            env=self.env(connected=connected),
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
            check=False,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"exit {done.returncode}:\n{self.script(lines)}\n---\n{output[-4000:]}"
        return output


def missing(what: str) -> None:
    """Skip, or fail where FEDLOAD_REQUIRE_SYSTEM_PYTHON=1 (CI)."""
    if os.environ.get("FEDLOAD_REQUIRE_SYSTEM_PYTHON") == "1":
        pytest.fail(f"{what} (FEDLOAD_REQUIRE_SYSTEM_PYTHON=1)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def requirements() -> None:
    """Debian's python3 with venv and ensurepip (`apt install python3-venv`), uv, and PyPI reachable."""
    if not SYSTEM_PYTHON.exists():
        missing(f"{SYSTEM_PYTHON} is absent: the install steps are written for Debian's own Python")
    probe = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import venv, ensurepip"], capture_output=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        missing(f"{SYSTEM_PYTHON} lacks venv or ensurepip: apt install python3-venv")
    if shutil.which("uv") is None:
        missing("uv is not on PATH: the offline build uses it")
    try:
        with urllib.request.urlopen(PYPI, timeout=10):
            pass
    except OSError as exc:
        missing(f"PyPI is unreachable ({exc}): pip install and pip download need it")


@pytest.fixture
def machine(tmp_path: Path, requirements: None) -> Iterator[Machine]:
    """The temporary root and checkout, removed afterwards (a venv, a wheelhouse: up to 170 MB)."""
    root = tmp_path / "root"
    for directory in ("usr/local/bin", "var/lib", "etc"):
        (root / directory).mkdir(parents=True)
    checkout = tmp_path / "fedload"
    ignored = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*_cache", ".hypothesis", "dist", "wheelhouse")
    shutil.copytree(REPO, checkout, ignore=ignored)
    (root / "remap.toml").write_text(REMAP)
    yield Machine(root, checkout)
    shutil.rmtree(root)
    shutil.rmtree(checkout)


def version() -> str:
    match = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert match is not None
    return match.group(1)


def assert_installed_on_system_python(machine: Machine, output: str) -> None:
    """fedload runs from /opt/fedload (through the link), a venv of /usr/bin/python3, and the docs are in place: every
    page the unit's Documentation= names."""
    assert f"fedload {version()}" in output
    assert "home = /usr/bin" in (machine.root / "opt/fedload/pyvenv.cfg").read_text()
    assert (machine.root / "usr/local/bin/fedload").resolve() == machine.root / "opt/fedload/bin/fedload"
    assert (machine.root / "usr/share/doc/fedload/INSTALL.md").read_text() == README.read_text()
    pages = DOCUMENTATION.search(UNIT.read_text())
    assert pages is not None, "deploy/fedload.service has no Documentation= line"
    assert [page for page in pages[1].split() if not (machine.root / page.removeprefix("file:///")).is_file()] == []


def configure(machine: Machine, blocks: dict[str, list[str]]) -> None:
    """Steps 2 and 3: the SSH key, fedload.toml, and `check-config` on the example, which finds no problem."""
    machine.run(blocks["superhub-key"])
    output = machine.run(blocks["superhub-config"])
    assert "SKIPPED (a database server" in output
    config = f"{machine.root}/etc/fedload/fedload.toml"
    assert f"configuration {config} (from $FEDLOAD_CONFIG): OK (3 feeders, 6 table patterns)" in output, output


def test_the_superhub_installs_as_written(machine: Machine) -> None:
    """Steps 1-3 of "On the superhub" with Debian's python3 and pip from PyPI: fedload runs, the example checks."""
    blocks = readme_blocks()
    output = machine.run(blocks["superhub-code"])
    assert "SKIPPED (system packages" in output
    assert "SKIPPED (a system account" in output
    assert_installed_on_system_python(machine, output)
    configure(machine, blocks)


def test_the_superhub_installs_with_no_internet(machine: Machine) -> None:
    """The wheel and wheelhouse built as written install with `pip install --no-index`; the installed superhub
    code reads literals right on Debian's Python."""
    blocks = readme_blocks()
    machine.run(blocks["offline-build"], connected=True)
    assert len(list((machine.checkout / "dist").glob("fedload-*.whl"))) == 1
    step1 = [line for line in blocks["superhub-code"] if not line.startswith("python3 -m venv ")]
    assert len(step1) == len(blocks["superhub-code"]) - 1, "step 1 has no `python3 -m venv ...` line to replace"
    output = machine.run(blocks["offline-install"] + step1)
    assert "--no-index" in "".join(blocks["offline-install"])
    assert_installed_on_system_python(machine, output)
    configure(machine, blocks)
    cases = REPO / "tests" / "superhub" / "literal_cases.py"
    machine.run([f"/opt/fedload/bin/python -I {cases}"])
