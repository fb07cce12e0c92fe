"""Shards with every feeder-key type (issue 35): `smallint`, `integer`, `bigint` (negative keys too) and `text`,
through the coordinator's build, a move, a hand change of a feeder's shard, a new feeder and removals. After each
step a coordinator reader sees each feeder exactly once with all of its rows, whether it filters on the key or
not, and a second build changes nothing (each shard is found to hold its feeders, whatever the way
`pg_get_expr` prints the keys of their partitions' bounds)."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from fedload.commands.admin import remove_feeder
from fedload.commands.move import move_feeder
from fedload.config import Config, load_config, parse_config
from fedload.scaleout.coordinator import CoordinatorReport, build_coordinator
from tests.support.federation import Federation, sync
from tests.support.shards import config_file, exactly_once, read_per_feeder, shard_int, shard_sql, with_coordinator

TYPED_SCHEMA = """
CREATE TABLE public.hosts (hub_id {type} NOT NULL, hostkey text NOT NULL, name text, site text DEFAULT 'none',
    seen timestamptz, online boolean, PRIMARY KEY (hostkey));
CREATE TABLE public.contexts (hub_id {type} NOT NULL, hostkey text NOT NULL, contextname text, tags text[],
    score integer);
"""
KEYS: dict[str, dict[str, int | str]] = {
    "smallint": {"hub1": 1, "hub2": 2, "hub3": 3, "hub4": 4},
    "integer": {"hub1": -1, "hub2": -2, "hub3": 3, "hub4": -4},
    "bigint": {"hub1": 1, "hub2": -2, "hub3": 5_000_000_000, "hub4": -4},
    "text": {"hub1": "a", "hub2": "b'2", "hub3": "-3", "hub4": "d"},
}


def _typed(federation: Federation, key_type: str) -> Config:
    """hub1, hub2 on s1 and hub3 on s2 with a coordinator, the parents' key column of `key_type`."""
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    schema = federation.tmp / "typed.sql"
    schema.write_text(TYPED_SCHEMA.format(type=key_type))
    document = config.model_dump(mode="json", exclude_none=True)
    document["superhub"] |= {"schema_file": str(schema), "worker_processes": 0}
    for name, feeder in document["feeders"].items():
        feeder["key"] = KEYS[key_type][name]
    return parse_config(document)


async def _settled(federation: Federation, config: Config, rows: dict[str, int]) -> None:
    """Each feeder seen exactly once with its rows, before and after a build (which may read a shard directly again
    after a removal); another build then changes nothing and filters no shard."""
    keys = {name: feeder.key for name, feeder in config.feeders.items()}
    assert read_per_feeder(federation, keys) == exactly_once(federation, keys, rows)
    assert (await build_coordinator(config)).filtered == []
    assert read_per_feeder(federation, keys) == exactly_once(federation, keys, rows)
    assert (await build_coordinator(config)) == CoordinatorReport()


@pytest.mark.parametrize("key_type", list(KEYS))
async def test_every_key_type_through_build_move_hand_change_new_feeder_and_removal(
    federation: Federation, key_type: str
) -> None:
    """Build, move, hand change, new feeder and removals with this key type: exactly once after every step."""
    config = _typed(federation, key_type)
    assert all(run.succeeded for run in await sync(config))
    column = "SELECT format_type(atttypid, -1) FROM pg_attribute WHERE attrelid = 'hosts'::regclass AND attnum = 1"
    assert shard_sql(federation, "s1", column) == key_type
    await _settled(federation, config, {"hub1": 300, "hub2": 200, "hub3": 100})

    path = config_file(federation, config)  # a move: hub1 to s2
    with capture_logs() as logs:
        assert await asyncio.to_thread(move_feeder, config, path, "hub1", "s2") == 0
    assert [e for e in logs if e["event"] == "coordinator.stray_partitions"] == []  # s1 drops it: no warning
    assert [e["feeders"] for e in logs if e["event"] == "coordinator.feeders_leaving"] == [["hub1"]]
    config = load_config(path)
    assert shard_int(federation, "s1", "SELECT count(*) FROM pg_inherits WHERE inhparent = 'hosts'::regclass") == 1
    await _settled(federation, config, {"hub1": 300, "hub2": 200, "hub3": 100})

    document = config.model_dump(mode="json", exclude_none=True)  # by hand: hub3 to s1, then removed from s2
    document["feeders"]["hub3"]["shard"] = "s1"
    config = parse_config(document)
    assert all(run.succeeded for run in await sync(config))
    keys = {name: feeder.key for name, feeder in config.feeders.items()}
    assert read_per_feeder(federation, keys) == exactly_once(federation, keys, {"hub1": 300, "hub2": 200, "hub3": 100})
    assert await asyncio.to_thread(remove_feeder, config, "hub3", yes=True, shard="s2") == 0
    await _settled(federation, config, {"hub1": 300, "hub2": 200, "hub3": 100})

    document["feeders"]["hub4"] = {**document["feeders"]["hub3"], "key": KEYS[key_type]["hub4"], "shard": "s2"}
    config = parse_config(document)  # a new feeder on s2, reading hub3's database
    assert all(run.succeeded for run in await sync(config))
    await _settled(federation, config, {"hub1": 300, "hub2": 200, "hub3": 100, "hub4": 100})

    # removed, then gone from the configuration
    assert await asyncio.to_thread(remove_feeder, config, "hub2", yes=True) == 0
    del document["feeders"]["hub2"]
    config = parse_config(document)
    await _settled(federation, config, {"hub1": 300, "hub3": 100, "hub4": 100})
