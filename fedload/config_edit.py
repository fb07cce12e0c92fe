"""Changing one key of the configuration file in place, for commands that change what it says
(`fedload feeder move`): every other line, comment and layout is kept (tomlkit), the result must still be a valid
configuration, and the file is replaced atomically with its owner and mode.

    set_feeder_shard(Path("/etc/fedload/fedload.toml"), "hub2", "s2")
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import tomlkit
import tomlkit.exceptions

from fedload.config import parse_config
from fedload.errors import ConfigError

__all__ = ["set_feeder_shard"]


def set_feeder_shard(path: Path, feeder: str, shard: str) -> list[str]:
    """Make `feeders.<feeder>.shard` say `shard` in the file at `path` (a symbolic link's target), and remove the
    `[shards.NAME]` it leaves without feeders (a configuration names no unused shard); the shards removed.
    ConfigError if it cannot."""
    path = path.resolve()
    try:
        document = tomlkit.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomlkit.exceptions.TOMLKitError) as exc:
        raise ConfigError(f"{path}: cannot read it to set feeders.{feeder}.shard: {exc}") from exc
    feeders, shards = document.get("feeders"), document.get("shards")
    if not isinstance(feeders, dict) or not isinstance(feeders.get(feeder), dict) or not isinstance(shards, dict):
        raise ConfigError(f"{path}: has no [feeders.{feeder}] table and [shards] to set its shard in")
    left = feeders[feeder].get("shard")
    feeders[feeder]["shard"] = shard
    emptied = [left] if left in shards and all(f.get("shard") != left for f in feeders.values()) else []
    for name in emptied:
        del shards[name]
    text = tomlkit.dumps(document)
    parse_config(tomlkit.parse(text).unwrap(), source=str(path))  # never write a configuration fedload refuses
    _replace(path, text)
    return emptied


def _replace(path: Path, text: str) -> None:
    """Write `text` beside `path` and rename it over it, with the file's owner and mode."""
    stat = path.stat()
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, stat.st_mode & 0o7777)
        with contextlib.suppress(PermissionError):  # not root: the file stays ours, as it was if we could write it
            os.chown(temporary, stat.st_uid, stat.st_gid)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise ConfigError(f"{path}: cannot write it: {exc.strerror or exc}") from exc
