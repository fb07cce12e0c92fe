"""A worker receives, with each run, that run's job (fedload.superhub.job.Job) and no other part of the
configuration: the whole configuration grows with the feeders, so sending it at each run would cost every run in
proportion to the federation."""

from __future__ import annotations

import pickle

import pytest

from fedload.config import Config, parse_config
from fedload.results import Outcome
from fedload.service._pipe import Run, ToWorker, frame
from fedload.service.workers import WorkerPool, _Worker
from fedload.superhub.bookkeeping.connection import Bookkeeping
from fedload.superhub.job import Job, feeder_job
from tests.support.federation import Federation, assert_feeders_equal_partitions, sync


def _with_workers(fed: Federation, count: int) -> Config:
    config = fed.config()
    superhub = config.superhub.model_copy(update={"worker_processes": count})
    return config.model_copy(update={"superhub": superhub})


async def test_a_worker_gets_each_runs_job_with_the_run(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three runs on one worker: each message carries its feeder's job, the third one's (a new configuration, as
    after a daemon's reload) with the reloaded setting; all load exactly."""
    await sync(federation.config(), "hub1")  # the superhub's parents and history exist
    sent: list[Job] = []
    original = _Worker.send

    def recording(worker: _Worker, message: ToWorker) -> None:
        if isinstance(message, Run):
            sent.append(message.job)
        original(worker, message)

    monkeypatch.setattr(_Worker, "send", recording)
    first = _with_workers(federation, 1)
    reloaded = first.model_copy(  # a reload that changed a setting
        update={"superhub": first.superhub.model_copy(update={"run_timeout_s": first.superhub.run_timeout_s + 1})}
    )

    pool, history = WorkerPool(1), Bookkeeping()
    try:
        runs = [
            await pool.run(feeder_job(first, "hub1"), history=history),
            await pool.run(feeder_job(first, "hub2"), history=history),
            await pool.run(feeder_job(reloaded, "hub3"), history=history),
        ]
    finally:
        await pool.close()
        await history.close()
    assert [(r.outcome, r.error) for r in runs] == [(Outcome.SUCCESS, None)] * 3
    assert [job.name for job in sent] == ["hub1", "hub2", "hub3"]
    assert [job.feeder for job in sent] == [first.feeders[name] for name in ("hub1", "hub2", "hub3")]
    assert [job.run_timeout_s for job in sent] == [first.superhub.run_timeout_s] * 2 + [reloaded.superhub.run_timeout_s]
    assert_feeders_equal_partitions(federation)


def _federation_of(feeders: int) -> Config:
    superhub = {"dsn": "postgresql:///superhub", "tables": ["public.*", "reports.*"]}
    hubs = {f"hub{i}": {"key": i, "transport": "local", "exclude_tables": ["public.x"]} for i in range(1, feeders + 1)}
    return parse_config({"superhub": superhub, "feeders": hubs})


def test_a_run_message_is_as_large_with_three_thousand_feeders_as_with_three() -> None:
    """The pickled `Run` of one feeder is the same size whatever the number of feeders, a few hundred bytes, while
    the whole configuration of 3,000 feeders is a hundred times larger."""
    small, large = _federation_of(3), _federation_of(3000)
    sizes = [len(frame(Run(feeder_job(config, "hub1"), dry_run=False))) for config in (small, large)]
    assert sizes[0] == sizes[1]
    assert sizes[0] < 4096, sizes
    assert len(pickle.dumps(large)) > 100 * sizes[0]
