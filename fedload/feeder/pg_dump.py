"""pg_dump as the agent runs it: its command line (`pg_dump_argv`), and its version, asked once per binary
(`VersionProbe`, `remember_pg_dump_version`)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess

from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.errors import AgentError

__all__ = [
    "STATISTICS_SINCE_MAJOR",
    "UNWRITTEN_OPTIONS",
    "VersionProbe",
    "ask_version",
    "major_version",
    "pg_dump_argv",
    "pg_dump_version",
    "remember_pg_dump_version",
]

_VERSION_TIMEOUT_S = 30.0
_EXIT_TIMEOUT_S = 60.0
_PG_DUMP_VERSION = re.compile(r"\(PostgreSQL\) (\S+)")  # "pg_dump (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"
_LEADING_NUMBER = re.compile(r"\d+")


# Objects a data-only dump never writes, whose catalogs pg_dump would still read unless told not to: comments
# (pg_description, the largest of its catalog queries on a small database), security labels, publications and
# subscriptions. About 40% of the feeder server's time per dump of a small database; the output is the same.
UNWRITTEN_OPTIONS = ("--no-comments", "--no-security-labels", "--no-publications", "--no-subscriptions")
_UNWRITTEN_SINCE_MAJOR = 11  # --no-comments is the newest of them
_ROWS_PER_INSERT_SINCE_MAJOR = 12
# --statistics and --statistics-only; with --statistics, --no-schema says "data only" (--data-only excludes them)
STATISTICS_SINCE_MAJOR = 18


def pg_dump_argv(options: AgentOptions, pg_dump_major: int | None = None) -> list[str]:
    """The pg_dump command line: data only, plain format, the configured tables; with pg_dump's major version
    known (11 or later), also the flags that spare it reading catalogs a data-only dump never writes; asked for
    statistics and pg_dump 18 or later, the tables' statistics too."""
    major = pg_dump_major or 0
    mode = _inserts_options(options, major) if options.dump_mode == "inserts" else []
    skipped = UNWRITTEN_OPTIONS if major >= _UNWRITTEN_SINCE_MAJOR else ()
    tables = [f"--table={pattern}" for pattern in options.tables]
    data = ["--no-schema", "--statistics"] if options.statistics and major >= STATISTICS_SINCE_MAJOR else []
    return [
        options.pg_dump,
        *(data or ["--data-only"]),
        "--no-password",
        "--encoding=UTF8",
        *skipped,
        *mode,
        *tables,
        *options.pg_dump_args,
        f"--dbname={options.database}",
    ]


def _inserts_options(options: AgentOptions, major: int) -> list[str]:
    """Inserts mode's flags: INSERTs naming their columns, and from pg_dump 12 on, as many rows per statement as
    the transformer merges, so pg_dump writes the merged statements (a third fewer bytes) and the transformer
    passes them on as written (transforms.batch.InsertBatcher.is_whole)."""
    rows = [f"--rows-per-insert={options.rows_per_statement}"] if major >= _ROWS_PER_INSERT_SINCE_MAJOR else []
    return ["--column-inserts", *rows]


def major_version(version: str) -> int | None:
    """15 for "15.20", 9 for "9.6.24", 18 for "18beta1", None for what does not start with a number."""
    found = _LEADING_NUMBER.match(version)
    return int(found[0]) if found else None


# The versions of pg_dump binaries, asked once by a process that forks agents (fedload.transport.zygote) and
# inherited by each child: a run saves a pg_dump start (~5 ms of CPU). Keyed by the resolved file's identity, so a
# binary replaced in place (an upgrade) is asked again; a script (Debian's pg_wrapper picks a version per cluster
# and environment) is never kept.
_known_versions: dict[tuple[str, int, int, int, int], str] = {}
_ELF_MAGIC = b"\x7fELF"


def remember_pg_dump_version(pg_dump: str) -> None:
    """Ask `pg_dump` for its version now, and keep it for this process and the agents it forks, if it is a binary."""
    identity = _binary_identity(pg_dump)
    if identity is not None and identity not in _known_versions:
        _known_versions[identity] = ask_version(pg_dump)


def pg_dump_version(pg_dump: str) -> str:
    """The kept version where a forking parent asked this binary already; else pg_dump is asked now (an exec'd
    agent, which has nothing kept, does not even look at the file)."""
    return VersionProbe(pg_dump).version()


def _known_version(pg_dump: str) -> str | None:
    identity = _binary_identity(pg_dump) if _known_versions else None
    return _known_versions.get(identity) if identity is not None else None


class VersionProbe:
    """`pg_dump --version` started now and read by `version()`, so that it runs while the agent starts something
    else (binary mode: psql and its connection); the kept version where there is one (`pg_dump_version`), then
    nothing runs. AgentError, as `pg_dump_version`, if pg_dump cannot run or fails."""

    def __init__(self, pg_dump: str) -> None:
        self._known = _known_version(pg_dump)
        self._asked = _VersionAsked(pg_dump) if self._known is None else None

    def version(self) -> str:
        """pg_dump's version ("15.20"), once it has answered."""
        if self._asked is not None:
            asked, self._asked = self._asked, None
            self._known = asked.answer()
        assert self._known is not None
        return self._known

    def abandon(self) -> None:
        """Stop pg_dump if it still runs (the agent fails before it needs the version)."""
        if self._asked is not None:
            self._asked.abandon()
            self._asked = None


class _VersionAsked:
    """`program --version`, started now; `answer()` waits for its version. AgentError if it cannot run or fails."""

    def __init__(self, program: str) -> None:
        self._program = program
        try:
            self._process: subprocess.Popen[str] = subprocess.Popen(
                [program, "--version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        except OSError as exc:
            raise self._error(str(exc)) from exc

    def answer(self) -> str:
        """The version ("15.20"), once the program has answered (bounded by _VERSION_TIMEOUT_S)."""
        try:
            stdout, _ = self._process.communicate(timeout=_VERSION_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            _stop(self._process)
            raise self._error(str(exc)) from exc
        if self._process.returncode != 0:
            raise self._error(f"it exited with status {self._process.returncode}")
        return _parsed_version(stdout)

    def abandon(self) -> None:
        _stop(self._process)

    def _error(self, why: str) -> AgentError:
        return AgentError(f"cannot run {self._program} --version on the feeder: {why}")


def _stop(process: subprocess.Popen[str]) -> None:
    process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # killed, yet not gone: the agent goes on all the same
        process.communicate(timeout=_EXIT_TIMEOUT_S)


def _binary_identity(pg_dump: str) -> tuple[str, int, int, int, int] | None:
    """The file `pg_dump` runs (PATH searched as exec does), as (path, device, inode, mtime, size); None if it is not
    an ELF binary or cannot be read."""
    path = _on_path(pg_dump)
    try:
        with open(path, "rb") as binary:
            if binary.read(len(_ELF_MAGIC)) != _ELF_MAGIC:
                return None
            found = os.fstat(binary.fileno())
    except OSError:
        return None
    return os.path.realpath(path), found.st_dev, found.st_ino, found.st_mtime_ns, found.st_size


def _on_path(program: str) -> str:
    """`program` as exec finds it on PATH: shutil.which's search, without importing shutil (bz2, lzma) at every
    agent's start."""
    if os.sep in program:
        return program
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return program


def ask_version(program: str) -> str:
    """`program --version`'s version, asked now."""
    return _VersionAsked(program).answer()


def _parsed_version(stdout: str) -> str:
    """ "15.20" from "pg_dump (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)"; the last word of anything else."""
    found = _PG_DUMP_VERSION.search(stdout)
    return found[1] if found else stdout.strip().rsplit(" ", 1)[-1]
