"""Running as another account: as root, the unprivileged account PostgreSQL runs as, and programs run as it."""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import subprocess
from pathlib import Path

from fedload.errors import ConfigError

__all__ = ["TIMEOUT_S", "closed_to", "run_as", "server_user"]

TIMEOUT_S = 60.0


def server_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run servers as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ConfigError(
        "running as root, but there is no 'postgres' or 'nobody' user to run PostgreSQL as: "
        "create one (`useradd --system postgres`) or run fedload as another user"
    )


def run_as(user: pwd.struct_passwd | None, argv: list[str], cwd: str | Path) -> subprocess.CompletedProcess[str]:
    """Run a program to its end as `user` with that user's groups (as ourselves when None); raise if it fails."""
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
        cwd=cwd,
        user=user.pw_uid if user else None,
        group=user.pw_gid if user else None,
        extra_groups=os.getgrouplist(user.pw_name, user.pw_gid) if user else None,
    )


def closed_to(user: pwd.struct_passwd, path: Path) -> Path | None:
    """The first directory on the way to `path` whose mode bits do not let `user` enter it, if any."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for directory in [*reversed(path.parents), path]:
        try:
            info = directory.stat()
        except OSError:
            return None  # gone, or not ours to see either: nothing to say
        if info.st_uid == user.pw_uid:
            allowed = info.st_mode & stat.S_IXUSR
        else:
            allowed = info.st_mode & (stat.S_IXGRP if info.st_gid in groups else stat.S_IXOTH)
        if not allowed:
            return directory
    return None
