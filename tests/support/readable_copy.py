"""fedload where another user can import it, for tests that run fedload as that user (root's `runuser -u nobody`).

A clone in root's 0700 home, and the virtual environment in it, are out of that user's reach. Such a test puts on
PYTHONPATH a root-owned, world-readable copy of what `python -m fedload` imports: the clone's `fedload` and
`transforms` packages and the files of fedload's runtime dependencies (its requirements and theirs, as the
installed distributions state them; not the test tools). A world-readable file is hard-linked where the file
system allows (no bytes copied), any other file copied and made readable; every directory is made 0755.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

__all__ = ["REPO", "readable_copy"]

REPO = Path(__file__).resolve().parents[2]
_PACKAGES = ("fedload", "transforms")


def readable_copy(destination: Path) -> Path:
    """Fill the directory `destination` with what `python -m fedload` imports; the directory, for PYTHONPATH."""
    for package in _PACKAGES:
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO / package, destination / package, ignore=ignore, copy_function=_link_or_copy)
    for distribution in _runtime_closure("fedload"):
        for file in distribution.files or ():
            if ".." in file.parts or file.parts[0] in _PACKAGES:  # scripts beside the environment; the editable fedload
                continue
            target = destination / file
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(str(distribution.locate_file(file)), str(target))
    _open_directories(destination)
    return destination


def _runtime_closure(name: str) -> Iterator[metadata.Distribution]:
    """The installed distribution `name` and every one it requires, transitively (no extras)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        seen.add(key)
        distribution = metadata.distribution(key)
        yield distribution
        for line in distribution.requires or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)


def _link_or_copy(source: str, target: str) -> str:
    if os.stat(source).st_mode & stat.S_IROTH:
        try:
            os.link(source, target)
        except OSError:  # another file system, or links refused: copy
            pass
        else:
            return target
    shutil.copyfile(source, target)
    os.chmod(target, 0o644)
    return target


def _open_directories(top: Path) -> None:
    """Every directory from `top` down: 0755, whatever the umask or the source's modes were."""
    top.chmod(0o755)
    for parent, dirnames, _ in os.walk(top):
        for name in dirnames:
            os.chmod(os.path.join(parent, name), 0o755)  # noqa: S103 - for another user to read, never write
