"""Fixtures for a federation: a superhub and three feeder databases on the module's cluster, and the daemons a test
starts on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fedload.localpg import LocalCluster
from tests.support.federation import DaemonProcess, Federation, make_federation


@pytest.fixture
def federation(cluster: LocalCluster, tmp_path: Path) -> Federation:
    """A fresh superhub database and three feeder databases with 300, 200 and 100 hosts."""
    return make_federation(cluster, tmp_path)


@pytest.fixture
def start_daemon(federation: Federation) -> Iterator[Callable[..., DaemonProcess]]:
    """Start daemons with a given config text (and environment); kill leftovers at the end."""
    started: list[DaemonProcess] = []

    def start(text: str, env: dict[str, str] | None = None) -> DaemonProcess:
        path = federation.tmp / "fedload.toml"
        path.write_text(text)
        daemon = DaemonProcess(path, federation.tmp / f"daemon{len(started)}.log", env)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait(timeout=30)
        daemon.close_log()
