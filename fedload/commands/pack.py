"""`fedload agent pack`: the agent as one file, a zipapp for a feeder's own python3 (3.9 and later).

It holds fedload/__init__.py, fedload/_tail.py, fedload/feeder/ (the agent, its options, the stream writer, the
compressor, the logging shim, the forced command, the served agent) and transforms/ (the transformer), nothing else,
as source, and beside each module its bytecode for the Python that packed it: a feeder on the same release (Debian
12's python3 and a superhub on 3.11) loads that instead of compiling every module at every run (#36); any other
release finds a magic number not its own and compiles the source, as before. The bytecode is checked against the
source's hash, so the two cannot disagree. Entries are sorted and dated 1980-01-01, so the same fedload always gives
the same bytes.
"""

from __future__ import annotations

import importlib.util
import io
import marshal
import os
import tempfile
import zipapp
import zipfile
from pathlib import Path

import fedload
import transforms
from fedload.errors import UsageError

__all__ = ["agent_files", "bytecode", "pack"]

INTERPRETER = "/usr/bin/env python3"
_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can state
_MAIN = b'''"""fedload's feeder agent as one file (built by `fedload agent pack`): dump, ssh-command, serve."""

from fedload.feeder.main import exit_now, main

exit_now(main())
'''


def agent_files() -> dict[str, Path]:
    """The archive's modules: name in the archive -> source file."""
    fedload_dir = Path(fedload.__file__).parent
    transforms_dir = Path(transforms.__file__).parent
    sources = [
        fedload_dir / "__init__.py",
        fedload_dir / "_tail.py",
        *(fedload_dir / "feeder").glob("*.py"),
        *transforms_dir.glob("*.py"),
    ]
    return {path.relative_to(fedload_dir.parent).as_posix(): path for path in sources}


def bytecode(source: bytes, name: str) -> bytes:
    """The .pyc of a module for this Python, checked against the hash of `source` (PEP 552): zipimport uses it
    where the magic number is its own and the source beside it has that hash, else it compiles the source."""
    code = compile(source, name, "exec", dont_inherit=True)
    checked_hash = (0b11).to_bytes(4, "little")  # hash-based, and checked
    return importlib.util.MAGIC_NUMBER + checked_hash + importlib.util.source_hash(source) + marshal.dumps(code)


def _entries() -> dict[str, bytes]:
    """The archive's content: each module's source and bytecode, and __main__.py."""
    entries = {"__main__.py": _MAIN}
    for name, path in agent_files().items():
        source = path.read_bytes()
        entries[name] = source
        entries[f"{name}c"] = bytecode(source, name)
    return entries


def pack(target: Path) -> int:
    """Write the zipapp to `target` (replaced atomically); its size in bytes. UsageError if it cannot be written."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as out:
        for name, content in sorted(_entries().items()):
            entry = zipfile.ZipInfo(name, _DATE)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            out.writestr(entry, content)
    archive.seek(0)
    try:
        return _write(archive, target)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from None


def _write(archive: io.BytesIO, target: Path) -> int:
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        zipapp.create_archive(archive, temporary, interpreter=INTERPRETER)  # the shebang line, then the zip
        os.chmod(temporary, 0o755)  # noqa: S103 - a program that anyone may read and run, like /usr/bin/*
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target.stat().st_size
