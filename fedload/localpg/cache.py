"""A copy of a PostgreSQL install where the server account can reach it, for root's throwaway clusters.

As root, fedload runs PostgreSQL as an unprivileged account, which may not enter the directory the install is in
(a virtual environment in root's 0700 home, say). Such an install is copied once per version into
`/var/cache/fedload/pginstall/<major>-<digest>` and run from there. The copy is made in a temporary directory
beside its final place and renamed into it, so it is complete or absent; it is owned by root and readable by all,
never group- or world-writable, and an existing copy is used only after checking that it still is.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fedload.errors import ConfigError

__all__ = ["CACHE_DIR", "InstallTree", "cached_copy"]

CACHE_DIR = Path("/var/cache/fedload/pginstall")
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True, slots=True)
class InstallTree:
    """The directories an install's programs need (bin, lib, share, and a wheel's bundled libraries), which a copy
    keeps in the same places relative to each other, since programs find their libraries and data relative to
    themselves."""

    bindir: Path
    dirs: tuple[Path, ...]

    @property
    def base(self) -> Path:
        """The deepest directory holding all of `dirs`; the copy mirrors the tree below it."""
        return Path(os.path.commonpath([d.parent for d in self.dirs]))

    def digest(self, version: str) -> str:
        """Names this install's files and their sizes (and its version line): equal installs share one copy."""
        sha = hashlib.sha256(version.encode())
        for path in self._files():
            info = path.lstat()
            target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else ""
            sha.update(f"\0{path.relative_to(self.base)}\0{info.st_size}\0{target}".encode())
        return sha.hexdigest()[:16]

    def _files(self) -> Iterator[Path]:
        for top in self.dirs:
            for parent, dirnames, filenames in os.walk(top):
                dirnames.sort()
                yield from (Path(parent) / name for name in sorted(filenames))


def cached_copy(tree: InstallTree, major: int, version: str, cache_dir: Path = CACHE_DIR) -> Path:
    """The bin directory of a root-owned copy of `tree` in `cache_dir`, made now if there is none yet."""
    try:
        entry = cache_dir / f"{major}-{tree.digest(version)}"
        _make_dirs(cache_dir)
        if not entry.exists():
            _copy(tree, entry)
    except OSError as exc:
        reason = f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else str(exc)
        raise ConfigError(
            f"cannot copy PostgreSQL {major} from {tree.base} to {cache_dir} ({reason}): make "
            f"{cache_dir} writable by root, or put the install where the server's user can read it"
        ) from exc
    _check_trusted(entry, entry)
    return entry / tree.bindir.relative_to(tree.base)


def _make_dirs(cache_dir: Path) -> None:
    """Create the cache's directories (mode 0755 whatever the umask); refuse ones others could have changed."""
    missing = [d for d in (cache_dir, *cache_dir.parents) if not d.exists()]
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir()
            directory.chmod(0o755)
    for directory in (cache_dir, cache_dir.parent):  # fedload's own; above them is the system's
        _check_trusted(directory, directory, walk=False)


def _copy(tree: InstallTree, entry: Path) -> None:
    """Copy into a temporary directory beside `entry`, then rename it into place; another process's copy wins."""
    temporary = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        for directory in tree.dirs:
            shutil.copytree(directory, temporary / directory.relative_to(tree.base), symlinks=True)
        _readable_by_all(temporary)
        try:
            temporary.rename(entry)
        except OSError:
            if not entry.is_dir():
                raise  # else another process renamed its copy into place first: use that one
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _readable_by_all(top: Path) -> None:
    """Directories 0755, programs 0755, other files 0644, whatever modes the source had."""
    top.chmod(0o755)
    for parent, dirnames, filenames in os.walk(top):
        for name in dirnames:
            (Path(parent) / name).chmod(0o755)
        for name in filenames:
            path = Path(parent) / name
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode):
                path.chmod(0o755 if mode & stat.S_IXUSR else 0o644)


def _check_trusted(top: Path, remove: Path, *, walk: bool = True) -> None:
    """ConfigError unless `top` (and with `walk` everything in it) is owned by root and not writable by others."""
    for path in _tree(top) if walk else [top]:
        info = path.lstat()
        if info.st_uid != 0 or (not stat.S_ISLNK(info.st_mode) and info.st_mode & _WRITABLE_BY_OTHERS):
            raise ConfigError(
                f"{path} is not owned by root or is writable by group or others, so fedload will not run "
                f"PostgreSQL from it; remove {remove} and fedload makes a fresh copy"
            )


def _tree(top: Path) -> Iterator[Path]:
    """`top` and everything below it."""
    yield top
    for parent, dirnames, filenames in os.walk(top):
        yield from (Path(parent) / name for name in (*dirnames, *filenames))
