"""`fedload check-config` without the network: the files the configuration names exist, can be read and make
sense (ssh identity private enough, remap files parse and name configured tables, the schema file reads).

Each problem is one line, `FILE: KEY: what is wrong`, like the configuration's own problems.
"""

from __future__ import annotations

import stat
from pathlib import Path

from fedload.config import Config, FeederConfig, SshConfig
from fedload.names import TableName
from transforms import RemapError, load_remap

__all__ = ["file_problems"]


def file_problems(config: Config, source: Path) -> list[str]:
    """Every problem of the files `config` names; empty when all are fine."""
    problems = [f"{source}: {where}: {message}" for where, message in _problems(config)]
    if config.superhub.schema_file is not None:
        from fedload.superhub.schema_file import check_schema_file  # noqa: PLC0415 - pglast only when there is a file

        problems += check_schema_file(config.superhub.schema_file, config.superhub.feeder_key)
    return problems


def _problems(config: Config) -> list[tuple[str, str]]:
    found = []
    for name, feeder in config.feeders.items():
        if feeder.ssh is not None and feeder.transport == "ssh":
            found += [(f"feeders.{name}.ssh.{key}", text) for key, text in _ssh_problems(feeder.ssh)]
        if feeder.remap is not None:
            found += [(f"feeders.{name}.remap", text) for text in _remap_problems(config, name, feeder)]
    return found


def _unreadable(path: Path) -> str | None:
    """Why `path` cannot be read as a file by this user, or None."""
    try:
        with path.open("rb"):
            return None
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"


def _ssh_problems(ssh: SshConfig) -> list[tuple[str, str]]:
    found = []
    if ssh.identity is not None:
        if problem := _unreadable(ssh.identity):
            found.append(("identity", problem))
        elif (mode := stat.S_IMODE(ssh.identity.stat().st_mode)) & 0o077:
            found.append(
                (
                    "identity",
                    f"{ssh.identity} is open to others (mode {mode:04o}); a private key needs 0600 or stricter: "
                    f"chmod 600 {ssh.identity}",
                )
            )
    known_hosts = ssh.known_hosts or Path.home() / ".ssh" / "known_hosts"
    if problem := _unreadable(known_hosts):
        default = "" if ssh.known_hosts else " (the default, as known_hosts is not set)"
        found.append(("known_hosts", problem + default))
    return found


def _remap_problems(config: Config, name: str, feeder: FeederConfig) -> list[str]:
    assert feeder.remap is not None
    if problem := _unreadable(feeder.remap):
        return [problem]
    try:
        remap = load_remap(feeder.remap)
    except RemapError as exc:
        return [str(exc)]
    found = []
    for written in remap.tables:
        schema, _, table_name = written.partition(".")
        table = TableName(schema, table_name)
        if not any(p.matches(table) for p in config.superhub.tables):
            found.append(f"{feeder.remap} names table {table}, which no pattern in superhub.tables matches")
        elif any(p.matches(table) for p in feeder.exclude_tables):
            found.append(f"{feeder.remap} names table {table}, which feeders.{name}.exclude_tables leaves out")
    return found
