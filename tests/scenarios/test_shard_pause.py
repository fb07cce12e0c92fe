"""A paused feeder with shards: the pause lives on the feeder's own shard (where its run lock and history are), so
a sync and a daemon of that shard skip it, status shows it on that shard, and `feeder move` takes it along."""

from __future__ import annotations

import json

from fedload.config import load_config
from tests.support.federation import DaemonProcess, Federation, fedload, sync
from tests.support.shards import shard_int, shard_sql, sharded, sharded_toml

PAUSES = "SELECT count(*) FROM fedload.paused WHERE feeder = 'hub3'"
SINCE = "SELECT paused_at || ' ' || reason FROM fedload.paused WHERE feeder = 'hub3'"


async def test_the_pause_is_on_the_feeders_shard_and_follows_a_move(federation: Federation) -> None:
    """hub3 (shard s2) paused: the row is on s2 only; `sync` skips it, a daemon of s2 logs it paused, status shows
    it paused on s2; moved to s1, it stays paused there with the same start and reason, and s2 forgets it."""
    config = sharded(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    assert all(run.succeeded for run in await sync(config))
    path = sharded_toml(federation, config)
    paused = fedload("feeder", "pause", "hub3", "--reason", "maintenance", "--config", str(path))
    assert paused.returncode == 0, paused.stderr
    assert (shard_int(federation, "s1", PAUSES), shard_int(federation, "s2", PAUSES)) == (0, 1)
    since = shard_sql(federation, "s2", SINCE)

    synced = fedload("sync", "--json", "--config", str(path), timeout_s=120)
    assert synced.returncode == 0, synced.stderr
    assert {r["feeder"]: r["outcome"] for r in json.loads(synced.stdout)}["hub3"] == "paused"
    daemon = DaemonProcess(path, federation.tmp / "daemon_s2.log", None, "--shard", "s2")
    try:
        daemon.wait_for("hub3 paused", lambda: any(e["event"] == "daemon.feeder_paused" for e in daemon.events()))
        assert daemon.stop() == 0
    finally:
        daemon.close_log()
    status = {s["feeder"]: s for s in json.loads(fedload("status", "--json", "--config", str(path)).stdout)}
    assert (status["hub3"]["shard"], status["hub3"]["paused"], status["hub3"]["paused_reason"]) == (
        "s2",
        True,
        "maintenance",
    )

    moved = fedload("feeder", "move", "hub3", "--to", "s1", "--config", str(path), timeout_s=180)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert (shard_int(federation, "s1", PAUSES), shard_int(federation, "s2", PAUSES)) == (1, 0)
    assert shard_sql(federation, "s1", SINCE) == since
    assert load_config(path).feeders["hub3"].shard == "s1"
    synced = fedload("sync", "--json", "--config", str(path), timeout_s=120)
    assert {r["feeder"]: r["outcome"] for r in json.loads(synced.stdout)}["hub3"] == "paused"
