"""The agent's own log lines never show the password of the connection string it was given."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "database",
    ["host=/nonexistent dbname=cfdb password=s3cret-pw", "postgresql://fedload:s3cret-pw@/cfdb?host=/nonexistent"],
)
def test_the_dump_started_event_hides_the_password(database: str) -> None:
    """`fedload agent dump -vv`: the debug event with pg_dump's command line says `***` where the password was (the
    dump then fails: no server there), and no line of stderr holds the password."""
    agent = [sys.executable, "-m", "fedload", "agent", "dump", "-vv", "--log-format", "json"]
    result = subprocess.run(
        [*agent, "--database", database, "--table", "public.hosts", "--compression", "gzip"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    stderr = result.stderr.decode()
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    started = next(e for e in events if e["event"] == "agent.dump_started")
    assert any("***" in arg for arg in started["argv"]), started["argv"]
    assert "s3cret-pw" not in stderr
