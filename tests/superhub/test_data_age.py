"""A run's data is as old as the feeder's snapshot, not the run's end (docs/freshness.md): the agent states its
snapshot's time in the trailer, the superhub keeps the earlier of it and the run's start, and `fedload status`
measures the data's age from that."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedload.commands.status import read_status, run_status
from fedload.config import Config, ConfigLocation
from fedload.feeder.wire import FRAME_HEAD, MAGIC
from fedload.results import FeederRun, Outcome
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import sync_feeder
from fedload.transport import FeederProcess, Transport
from fedload.transport.command import transport_for
from tests.support.federation import Federation, prepare

DELAY_S = 2.0
Trailer = dict[str, Any]


class _HeldBack:
    """A feeder's dump as its own transport delivers it, after the superhub has waited `delay_s` for its first byte
    (a slow link, a long dump: the run ends that much after the snapshot); with `rewrite`, its trailer as a lying
    or older agent would state it (the trailer is no part of the blocks' checksum)."""

    def __init__(self, process: FeederProcess, delay_s: float, rewrite: Callable[[Trailer], Trailer] | None) -> None:
        self._process, self._delay_s, self._rewrite = process, delay_s, rewrite
        self._held: bytes | None = None

    async def read(self, max_bytes: int) -> bytes:
        if self._held is None:
            await asyncio.sleep(self._delay_s)
            self._held = await self._whole() if self._rewrite is not None else b""
        if self._rewrite is None:
            return await self._process.read(max_bytes)
        chunk, self._held = self._held[:max_bytes], self._held[max_bytes:]
        return chunk

    async def _whole(self) -> bytes:
        """The whole stream (a test feeder's: small), its trailer rewritten."""
        stream = b""
        while chunk := await self._process.read(1 << 20):
            stream += chunk
        assert stream.startswith(MAGIC)
        at, frames = len(MAGIC), [MAGIC]
        while at < len(stream):
            kind, length = FRAME_HEAD.unpack_from(stream, at)
            payload = stream[at + FRAME_HEAD.size : at + FRAME_HEAD.size + length]
            if kind == b"T":
                assert self._rewrite is not None
                payload = json.dumps(self._rewrite(json.loads(payload))).encode()
            frames.append(FRAME_HEAD.pack(kind, len(payload)) + payload)
            at += FRAME_HEAD.size + length
        return b"".join(frames)

    async def wait(self) -> int:
        return await self._process.wait()

    @property
    def stderr_tail(self) -> str:
        return self._process.stderr_tail

    async def cancel(self) -> None:
        await self._process.cancel()


class _HoldingBack:
    """The feeder's own transport, its dumps held back (`_HeldBack`)."""

    def __init__(
        self, inner: Transport, delay_s: float = 0.0, rewrite: Callable[[Trailer], Trailer] | None = None
    ) -> None:
        self._inner, self._delay_s, self._rewrite = inner, delay_s, rewrite

    async def open(self, argv: list[str]) -> FeederProcess:
        return _HeldBack(await self._inner.open(argv), self._delay_s, self._rewrite)

    def connect_ahead(self) -> None:
        self._inner.connect_ahead()

    async def close(self) -> None:
        await self._inner.close()


async def _run(config: Config, delay_s: float = 0.0, rewrite: Callable[[Trailer], Trailer] | None = None) -> FeederRun:
    """One run of hub1 through its own transport, held back and its trailer rewritten as asked."""
    await prepare(config)
    transport = _HoldingBack(transport_for(config.feeders["hub1"]), delay_s, rewrite)
    return await sync_feeder(feeder_job(config, "hub1"), transport=transport)


def _last_run(federation: Federation) -> dict[str, Any]:
    """hub1's last run: its start, end, stated snapshot and data time (Unix seconds), outcome and error."""
    row = federation.superhub_sql(
        "SELECT json_build_object('started', extract(epoch FROM started_at), 'finished', extract(epoch FROM "
        "finished_at), 'snapshot', extract(epoch FROM snapshot_at), 'data', extract(epoch FROM data_at), 'outcome', "
        "outcome, 'error', error, 'kept', unchanged_tables) FROM fedload.runs WHERE feeder = 'hub1' ORDER BY id DESC "
        "LIMIT 1"
    )
    found: dict[str, Any] = json.loads(row)
    return found


@pytest.mark.parametrize("mode", ["copy", "binary", "copy kept"])
async def test_a_slow_run_reports_its_data_as_old_as_its_snapshot(
    federation: Federation, mode: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A run whose dump reaches the superhub 2 s after the agent took its snapshot (copy mode: pg_dump's own;
    binary: the agent's session; "copy kept": every table unchanged, proven by digests in the agent's session,
    nothing dumped) reports, right after it, data at least 2 s old in `status` and `status --json`: the data's time
    is the stated snapshot's, at most the run's start, not the run's end."""
    config = federation.config(
        dump_mode="binary" if mode == "binary" else "copy", skip_unchanged_min_rows=0 if mode == "copy kept" else 20_000
    )
    if mode == "copy kept":  # counters standing still: the digests alone decide (tests/superhub/test_unchanged.py)
        federation.cluster.psql(f"ALTER DATABASE {federation.feeders['hub1']} SET track_counts = off")
        for _ in range(2):  # the first round stores the counters, the second the digests
            assert (await _run(config)).succeeded
    run = await _run(config, DELAY_S)
    assert run.succeeded, run.error
    assert bool(run.unchanged_tables) is (mode == "copy kept")
    recorded = _last_run(federation)
    assert recorded["finished"] - recorded["started"] >= DELAY_S
    assert recorded["snapshot"] is not None  # every mode states it
    assert recorded["data"] == min(recorded["snapshot"], recorded["started"])
    assert abs(recorded["snapshot"] - recorded["started"]) < 10  # the feeder's clock is the superhub's here
    hub1 = next(s for s in await read_status(config) if s.feeder == "hub1")
    assert hub1.data_at is not None
    assert hub1.data_at.timestamp() == pytest.approx(recorded["data"], abs=1e-3)
    assert hub1.data_age_s is not None
    assert hub1.data_age_s >= DELAY_S
    location = ConfigLocation(tmp_path / "fedload.toml", "given")
    await asyncio.to_thread(run_status, config, as_json=True, location=location)
    printed = capsys.readouterr().out.splitlines()[-1]  # the JSON, after the log's lines
    shown = next(s for s in json.loads(printed) if s["feeder"] == "hub1")
    assert shown["data_age_s"] >= DELAY_S
    assert shown["data_at"] == str(hub1.data_at)


def _claiming(snapshot_epoch_s: float) -> Callable[[Trailer], Trailer]:
    return lambda trailer: {**trailer, "snapshot_epoch_s": snapshot_epoch_s}


def _unstated(trailer: Trailer) -> Trailer:
    """The trailer of an agent from before the snapshot's time: no such field."""
    return {key: value for key, value in trailer.items() if key != "snapshot_epoch_s"}


async def test_a_snapshot_claimed_in_the_future_counts_from_the_runs_start(federation: Federation) -> None:
    """A feeder stating its snapshot a day ahead cannot make its data look fresher than the run's start on the
    superhub: the data's time is the start; the claim is kept as stated."""
    claim = time.time() + 86_400
    assert (await _run(federation.config(), rewrite=_claiming(claim))).succeeded
    recorded = _last_run(federation)
    assert recorded["snapshot"] == pytest.approx(claim, abs=1e-3)
    assert recorded["data"] == recorded["started"]


async def test_an_agent_stating_no_snapshot_counts_from_the_runs_start(federation: Federation) -> None:
    """An agent from before the field (no `snapshot_epoch_s` in its trailer) is read as before, its data's time the
    run's start; `status` measures its age from there."""
    config = federation.config()
    assert (await _run(config, DELAY_S, rewrite=_unstated)).succeeded
    recorded = _last_run(federation)
    assert recorded["snapshot"] is None
    assert recorded["data"] == recorded["started"]
    hub1 = next(s for s in await read_status(config) if s.feeder == "hub1")
    assert hub1.data_age_s is not None
    assert hub1.data_age_s >= DELAY_S


async def test_a_snapshot_stated_in_the_past_is_believed(federation: Federation) -> None:
    """A feeder whose clock says its snapshot is an hour old only makes its own data look older: believed."""
    config = federation.config()
    claim = time.time() - 3600
    assert (await _run(config, rewrite=_claiming(claim))).succeeded
    assert _last_run(federation)["data"] == pytest.approx(claim, abs=1e-3)
    hub1 = next(s for s in await read_status(config) if s.feeder == "hub1")
    assert hub1.data_age_s is not None
    assert hub1.data_age_s >= 3600


async def test_a_snapshot_time_that_is_no_time_fails_the_run(federation: Federation) -> None:
    """A trailer stating NaN as its snapshot's time is a bad dump: the run fails saying so, the old data stays."""
    config = federation.config()
    assert (await _run(config)).succeeded
    before = federation.superhub_int("SELECT count(*) FROM hosts WHERE hub_id = 1")
    run = await _run(config, rewrite=_claiming(math.nan))
    assert run.outcome is Outcome.FAILED
    assert run.error is not None
    assert "snapshot_epoch_s = nan, which is no time" in run.error
    assert federation.superhub_int("SELECT count(*) FROM hosts WHERE hub_id = 1") == before
    assert _last_run(federation)["data"] is None
