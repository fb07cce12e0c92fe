"""`fedload feeder pause` and `resume` as an operator runs them: a sync without names skips a paused feeder (its
data stays), a sync naming it runs it, status shows the pause, unknown names, a pause again, an older superhub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedload.results import Outcome
from tests.support.federation import Federation, config_toml, fedload, sync


async def _synced(fed: Federation, extra_superhub: str = "") -> Path:
    """The federation synced once; its configuration file (`extra_superhub`: lines for [superhub])."""
    path = fed.tmp / "fedload.toml"
    path.write_text(config_toml(fed).replace("[superhub]\n", f"[superhub]\n{extra_superhub}"))
    assert all(run.outcome == Outcome.SUCCESS for run in await sync(fed.config()))
    return path


def _runs(fed: Federation, feeder: str) -> int:
    return fed.superhub_int(f"SELECT count(*) FROM fedload.runs WHERE feeder = '{feeder}'")


def _status(config: Path) -> dict[str, dict[str, Any]]:
    result = fedload("status", "--json", "--config", str(config))
    return {s["feeder"]: s for s in json.loads(result.stdout)}


def _sync_json(config: Path, *names: str) -> tuple[int, dict[str, dict[str, Any]]]:
    result = fedload("--log-format", "json", "-v", "sync", "--json", *names, "--config", str(config), timeout_s=120)
    runs = {run["feeder"]: run for run in json.loads(result.stdout)}
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    runs["(logged)"] = {"paused": [(e["feeder"], e["reason"]) for e in events if e["event"] == "sync.feeder_paused"]}
    return result.returncode, runs


async def test_a_sync_without_names_skips_a_paused_feeder_and_a_named_sync_runs_it(federation: Federation) -> None:
    """Paused hub2: `sync` runs hub1 and hub3, reports hub2 paused with its reason (exit 0), records no run of it and
    keeps its rows; `sync hub2` runs it; after `resume`, `sync` runs it again."""
    config = await _synced(federation)
    paused = fedload("feeder", "pause", "hub2", "--reason", "hub2 upgrade, OPS-42", "--config", str(config))
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("feeder hub2: paused since ")
    assert paused.stdout.splitlines()[0].endswith(": hub2 upgrade, OPS-42")
    status, runs = _sync_json(config)
    assert status == 0
    assert runs.pop("(logged)") == {"paused": [("hub2", "hub2 upgrade, OPS-42")]}
    assert {name: run["outcome"] for name, run in runs.items()} == {
        "hub1": "success",
        "hub2": "paused",
        "hub3": "success",
    }
    assert "paused since" in runs["hub2"]["error"]
    assert "hub2 upgrade, OPS-42" in runs["hub2"]["error"]
    assert (_runs(federation, "hub1"), _runs(federation, "hub2")) == (2, 1)
    assert federation.superhub_int("SELECT count(*) FROM hosts WHERE hub_id = 2") == 200  # its data stays
    status, runs = _sync_json(config, "hub2")  # a person asked
    assert (status, runs["hub2"]["outcome"]) == (0, "success")
    assert _runs(federation, "hub2") == 2
    resumed = fedload("feeder", "resume", "hub2", "--config", str(config))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("feeder hub2: resumed (it was paused since ")
    status, runs = _sync_json(config)
    assert (status, runs["hub2"]["outcome"]) == (0, "success")
    assert _runs(federation, "hub2") == 3


async def test_status_shows_the_pause_and_does_not_count_it_stale(federation: Federation) -> None:
    """status --json: paused, paused_reason, paused_since, paused_by; with every feeder's data stale, status exits 1
    until every stale one is paused, then 0 (a paused feeder's data is old on purpose)."""
    config = await _synced(federation, "stale_after_s = 0.001\n")
    before = _status(config)
    assert {s["paused"] for s in before.values()} == {False}
    assert before["hub1"]["paused_reason"] is None
    assert before["hub1"]["paused_since"] is None
    assert fedload("status", "--config", str(config)).returncode == 1
    for name in ("hub1", "hub2"):
        assert fedload("feeder", "pause", name, "--reason", "maintenance", "--config", str(config)).returncode == 0
    assert fedload("status", "--config", str(config)).returncode == 1  # hub3 is stale and not paused
    assert fedload("feeder", "pause", "hub3", "--config", str(config)).returncode == 0
    statuses = _status(config)
    assert fedload("status", "--config", str(config)).returncode == 0
    assert {s["stale"] for s in statuses.values()} == {True}  # stale all the same: the data is old
    assert statuses["hub1"]["paused"] is True
    assert statuses["hub1"]["paused_reason"] == "maintenance"
    assert statuses["hub3"]["paused_reason"] is None
    assert statuses["hub1"]["paused_since"].startswith("20")
    assert "@" in statuses["hub1"]["paused_by"]
    table = fedload("status", "--config", str(config)).stdout
    assert "PAUSED since" in table
    assert "maintenance" in table


async def test_pausing_again_replaces_the_reason_and_keeps_the_start(federation: Federation) -> None:
    """A second pause keeps the first one's start and takes the new reason (the old one without --reason); resuming
    a feeder that is not paused says so; both exit 0."""
    config = await _synced(federation)
    assert fedload("feeder", "pause", "hub1", "--reason", "first", "--config", str(config)).returncode == 0
    since = _status(config)["hub1"]["paused_since"]
    again = fedload("feeder", "pause", "hub1", "--reason", "second", "--config", str(config))
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("feeder hub1 was already paused; paused since ")
    assert again.stdout.endswith(": second (reason now)\n")
    kept = fedload("feeder", "pause", "hub1", "--config", str(config))
    assert kept.stdout.endswith(": second (reason kept)\n")
    assert (_status(config)["hub1"]["paused_since"], _status(config)["hub1"]["paused_reason"]) == (since, "second")
    assert fedload("feeder", "resume", "hub1", "--config", str(config)).returncode == 0
    not_paused = fedload("feeder", "resume", "hub1", "--config", str(config))
    assert (not_paused.returncode, not_paused.stdout) == (0, "feeder hub1 was not paused; nothing changed\n")


async def test_unknown_names_are_usage_errors_naming_the_known_feeders(federation: Federation) -> None:
    """pause and resume of a name that is not configured (nor paused): exit 2, one line naming the known feeders;
    a paused feeder taken out of the configuration can still be resumed."""
    config = await _synced(federation)
    pause = fedload("feeder", "pause", "nosuch", "--config", str(config))
    assert (pause.returncode, pause.stdout) == (2, "")
    assert pause.stderr == (
        "fedload: feeder nosuch is not configured, so it has no runs to pause; known feeders: hub1, hub2, hub3\n"
    )
    resume = fedload("feeder", "resume", "nosuch", "--config", str(config))
    assert resume.returncode == 2
    assert resume.stderr == (
        "fedload: feeder nosuch is not configured and not paused on the superhub; known feeders: hub1, hub2, hub3\n"
    )
    assert fedload("feeder", "pause", "hub3", "--config", str(config)).returncode == 0
    config.write_text(config_toml(federation).split("[feeders.hub3]")[0])
    assert _status(config)["hub3"]["paused"] is True  # shown as not configured, paused
    gone = fedload("feeder", "resume", "hub3", "--config", str(config))
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.startswith("feeder hub3: resumed")
    assert fedload("feeder", "resume", "hub3", "--config", str(config)).returncode == 2


async def test_a_superhub_set_up_by_an_older_fedload_gets_the_table(federation: Federation) -> None:
    """On a superhub whose bookkeeping predates fedload.paused (no table, an older fingerprint), pause creates it;
    a dry run before that, on the old superhub, still works."""
    config = await _synced(federation)
    federation.superhub_sql("DROP TABLE fedload.paused; COMMENT ON TABLE fedload.runs IS 'fedload schema 0ld'")
    dry = fedload("sync", "--dry-run", "--json", "--config", str(config), timeout_s=120)
    assert dry.returncode == 0, dry.stderr
    assert fedload("feeder", "pause", "hub2", "--config", str(config)).returncode == 0
    assert federation.superhub_int("SELECT count(*) FROM fedload.paused") == 1


async def test_removing_a_feeder_forgets_its_pause(federation: Federation) -> None:
    """`feeder remove` forgets the pause with the rest of the feeder's bookkeeping."""
    config = await _synced(federation)
    assert fedload("feeder", "pause", "hub2", "--config", str(config)).returncode == 0
    assert fedload("feeder", "remove", "hub2", "--yes", "--config", str(config)).returncode == 0
    assert federation.superhub_int("SELECT count(*) FROM fedload.paused") == 0
