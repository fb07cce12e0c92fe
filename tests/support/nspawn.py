"""A Debian 12 booted with its own systemd (252) in systemd-nspawn, for testing deploy/fedload.service where it runs.

These machines do not boot systemd; nspawn boots one in a container that shares the host's network (so it reaches
services on 127.0.0.1) and sees only the directories bound into it. The tree is made once with debootstrap (minutes)
and cached in `/var/cache/fedload/nspawn/<suite>-<digest>` (as localpg caches PostgreSQL installs: built beside its
place, renamed in, so complete or absent); each boot starts from it clean (`--volatile=overlay`: writes go to a
tmpfs). The container runs in a cgroup of its own, removed at the end with what nspawn leaves in it (empty
`payload` and `supervisor` directories). Needs root, systemd-nspawn and debootstrap (.ci/run installs them).

    with booted(cached_tree(), binds={"/srv/x": host_dir}) as container:
        container.run("systemctl is-system-running")
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CACHE_DIR", "Container", "booted", "cached_tree", "why_not"]

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What deploy/README.md's superhub installs (python3-venv, openssh-client, sudo), and pg_dump for a local feeder.
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-venv",
    "openssh-client",
    "sudo",
    "postgresql-client-15",
)
CACHE_DIR = Path("/var/cache/fedload/nspawn")
BUILD_TIMEOUT_S = 1200.0  # debootstrap: ~70 s on a quiet machine, minutes on a busy one
BOOT_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_CGROUP_HIERARCHIES = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))


def why_not() -> str | None:
    """Why no container can be booted here, or None."""
    if os.geteuid() != 0:
        return "booting a container with systemd-nspawn needs root"
    for program in ("systemd-nspawn", "debootstrap", "nsenter"):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install systemd-container debootstrap)"
    return None


def cached_tree(cache_dir: Path = CACHE_DIR) -> Path:
    """The Debian tree, made now with debootstrap if the cache has none for this suite and package list."""
    digest = hashlib.sha256(f"{SUITE} {MIRROR} {' '.join(PACKAGES)}".encode()).hexdigest()[:12]
    entry = cache_dir / f"{SUITE}-{digest}"
    if entry.is_dir():
        return entry
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache_dir.chmod(0o755)
    temporary = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=cache_dir))
    try:
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(temporary), MIRROR]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"debootstrap failed (exit {done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
        for deb in (temporary / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        temporary.chmod(0o755)
        with contextlib.suppress(OSError):  # another process renamed its tree into place first: use that one
            temporary.rename(entry)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return entry


@dataclass(frozen=True)
class Container:
    """A booted container: its PID 1 (as the host sees it), entered with nsenter."""

    pid1: int

    def run(self, script: str, *, timeout_s: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `script` in bash as root inside the container (Debian's PATH, no host variables); its result."""
        done = subprocess.run(
            ["nsenter", "-t", str(self.pid1), "-a", "/bin/bash", "-c", script],
            env={"PATH": DEBIAN_PATH, "LANG": "C.UTF-8", "HOME": "/root", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check:
            assert done.returncode == 0, f"exit {done.returncode} of {script!r}:\n{done.stdout}{done.stderr}"
        return done

    def output(self, script: str, *, timeout_s: float = 120.0) -> str:
        """The standard output of `script`, which must succeed."""
        return self.run(script, timeout_s=timeout_s).stdout


@contextlib.contextmanager
def booted(tree: Path, *, binds: Mapping[str, Path], log: Path) -> Iterator[Container]:
    """Boot `tree` (a clean overlay of it), `binds` mounted at their keys (read-write); shut it down afterwards and
    remove its cgroups."""
    cgroup = f"fedload-nspawn-{uuid.uuid4().hex[:12]}"
    for hierarchy in _CGROUP_HIERARCHIES:
        (hierarchy / cgroup).mkdir()
    into_cgroup = " && ".join(f"echo $$ > {hierarchy / cgroup}/cgroup.procs" for hierarchy in _CGROUP_HIERARCHIES)
    argv = ["systemd-nspawn", "-D", str(tree), "--boot", "--register=no", "--keep-unit", "--console=passive"]
    argv += ["--volatile=overlay", f"--machine={cgroup}", *(f"--bind={src}:{dst}" for dst, src in binds.items())]
    with log.open("wb") as output:
        nspawn = subprocess.Popen(
            ["/bin/sh", "-c", f'{into_cgroup} && exec "$@"', "sh", *argv], stdout=output, stderr=output
        )
    try:
        yield _wait_for_boot(nspawn, log)
    finally:
        _shut_down(nspawn)
        _remove_cgroup(cgroup)


def _wait_for_boot(nspawn: subprocess.Popen[bytes], log: Path) -> Container:
    """The container once its systemd has finished booting (`is-system-running --wait`)."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if nspawn.poll() is not None:
            raise RuntimeError(f"systemd-nspawn exited {nspawn.returncode}: {log.read_text(errors='replace')[-2000:]}")
        children = Path(f"/proc/{nspawn.pid}/task/{nspawn.pid}/children")
        with contextlib.suppress(OSError):
            if pids := children.read_text().split():
                container = Container(int(pids[0]))
                state = container.run("systemctl is-system-running --wait", timeout_s=BOOT_TIMEOUT_S, check=False)
                if state.stdout.strip() in ("running", "degraded"):
                    return container
        time.sleep(0.1)
    raise RuntimeError(
        f"the container did not boot in {BOOT_TIMEOUT_S:.0f} s: {log.read_text(errors='replace')[-2000:]}"
    )


def _shut_down(nspawn: subprocess.Popen[bytes]) -> None:
    """Ask for an orderly shutdown (nspawn passes SIGTERM on as SIGRTMIN+3 to the container's systemd); kill it if
    it does not end in time."""
    nspawn.terminate()
    try:
        nspawn.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        nspawn.kill()
        nspawn.wait(STOP_TIMEOUT_S)


def _remove_cgroup(cgroup: str) -> None:
    """Remove the container's cgroup directories, deepest first (they are empty once its processes are gone)."""
    for hierarchy in _CGROUP_HIERARCHIES:
        top = hierarchy / cgroup
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
