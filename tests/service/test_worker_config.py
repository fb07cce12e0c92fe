"""A worker receives the configuration once, not with every run: its size grows with the feeders, so sending it
at each run cost every run in proportion to the federation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fedload.config import Config
from fedload.service._pipe import Run, ToWorker
from fedload.service.workers import WorkerPool, _Worker
from fedload.superhub.bookkeeping import Bookkeeping
from tests.federation import Federation, assert_feeders_equal_partitions, sync


def _with_workers(fed: Federation, count: int) -> Config:
    config = fed.config()
    superhub = config.superhub.model_copy(update={"worker_processes": count})
    return config.model_copy(update={"superhub": superhub})


def test_a_worker_gets_the_configuration_once_per_configuration(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three runs on one worker: the first sends the configuration, the second (same configuration) only the
    feeder's name, the third (a new configuration, as after a daemon's reload) the new one; all load exactly."""
    sync(federation.config(), "hub1")  # the superhub's parents and history exist
    sent: list[Any] = []
    original = _Worker.send

    def recording(worker: _Worker, message: ToWorker) -> None:
        if isinstance(message, Run):
            sent.append(message.config)
        original(worker, message)

    monkeypatch.setattr(_Worker, "send", recording)
    first = _with_workers(federation, 1)
    reloaded = first.model_copy(  # a reload that changed a setting: a configuration equal to the first is not resent
        update={"superhub": first.superhub.model_copy(update={"run_timeout_s": first.superhub.run_timeout_s + 1})}
    )

    async def three_runs() -> list[str]:
        pool, history = WorkerPool(1), Bookkeeping()
        try:
            runs = [
                await pool.run("hub1", first, history=history),
                await pool.run("hub2", first, history=history),
                await pool.run("hub3", reloaded, history=history),
            ]
        finally:
            await pool.close()
            await history.close()
        return [f"{r.outcome} {r.error or ''}".strip() for r in runs]

    assert asyncio.run(three_runs()) == ["success"] * 3
    assert [c is first for c in sent] == [True, False, False]
    assert sent[1] is None
    assert sent[2] is reloaded
    assert_feeders_equal_partitions(federation)
