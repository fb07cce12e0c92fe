"""The `sshd` fixture: each test that asks for it runs against OpenSSH's sshd (skipped where it is not installed,
unless FEDLOAD_REQUIRE_SSHD=1) and against asyncssh's server, which needs no system package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sshd import SERVERS, SshServer, start_server


@pytest.fixture(params=SERVERS)
def sshd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SshServer]:
    """A running SSH server, OpenSSH's or asyncssh's, allowing any command for the test key."""
    directory = tmp_path / "sshd"
    directory.mkdir()
    server = start_server(request.param, directory)
    yield server
    server.stop()
