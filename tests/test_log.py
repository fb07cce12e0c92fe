"""Under systemd, each log line starts with its syslog priority (sd-daemon's `<N>`), so `journalctl -p err` finds
the errors; nowhere else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_LEVELS = ["debug", "info", "warning", "error", "critical", "error"]  # the last: log.exception
_EVERY_LEVEL = """
from fedload.log import configure_logging, get_logger
configure_logging(level="debug", log_format="auto")
log = get_logger()
for level in ("debug", "info", "warning", "error", "critical"):
    getattr(log, level)("test.event", said=level)
try:
    1 / 0
except ZeroDivisionError:
    log.exception("test.failed")
"""


def _log_every_level(tmp_path: Path, journal: str | None) -> list[str]:
    """The stderr lines of a process logging one event at each level (auto format), its stderr a file; with
    JOURNAL_STREAM "file" set to that file's device and inode, as systemd sets it, or to `journal` as given."""
    stderr = tmp_path / "stderr"
    env = {"PATH": os.environ["PATH"]}
    with stderr.open("wb") as file:
        if journal is not None:
            stat = os.fstat(file.fileno())
            env["JOURNAL_STREAM"] = f"{stat.st_dev}:{stat.st_ino}" if journal == "file" else journal
        subprocess.run([sys.executable, "-c", _EVERY_LEVEL], stderr=file, env=env, check=True, timeout=60)
    return stderr.read_text().splitlines()


def test_each_level_carries_its_syslog_priority_under_systemd(tmp_path: Path) -> None:
    """stderr is the journal's stream: `<7>` debug, `<6>` info, `<4>` warning, `<3>` error (an exception too),
    `<2>` critical, each before a whole JSON line."""
    lines = _log_every_level(tmp_path, "file")
    assert [line[: line.index("{")] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>", "<3>"]
    events = [json.loads(line[3:]) for line in lines]
    assert [e["level"] for e in events] == _LEVELS
    assert "ZeroDivisionError" in events[-1]["exception"]


@pytest.mark.parametrize("journal", [None, "8:1234", "not numbers"])
def test_no_priority_where_stderr_is_not_the_journal(tmp_path: Path, journal: str | None) -> None:
    """Without JOURNAL_STREAM, or with one naming another stream (an agent the daemon runs with its stderr on a
    pipe inherits the variable), lines carry no prefix; the variable alone still means JSON."""
    lines = _log_every_level(tmp_path, journal)
    assert not [line for line in lines if line.startswith("<")]
    if journal is not None:
        assert [json.loads(line)["level"] for line in lines] == _LEVELS
