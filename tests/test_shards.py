"""Shards behind postgres_fdw (docs/scale-out.md): the configuration, a run per feeder on its own shard, the
coordinator's foreign partitions, and what a coordinator reader sees during swaps."""

from __future__ import annotations

from typing import Any

import pytest

from fedload.config import parse_config
from fedload.errors import ConfigError


def _document(**extra: Any) -> dict[str, Any]:
    feeders = {
        "a": {"key": 1, "transport": "local", "shard": "s1"},
        "b": {"key": 2, "transport": "local", "shard": "s2"},
    }
    document: dict[str, Any] = {
        "superhub": {"tables": ["public.*"]},
        "shards": {"s1": {"dsn": "postgresql:///s1"}, "s2": {"dsn": "postgresql:///s2"}},
        "feeders": feeders,
    }
    document.update(extra)
    return document


def _problems(document: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(document, source="f.toml")
    return caught.value.problems


def test_each_feeder_runs_against_its_shard() -> None:
    """for_feeder gives the feeder's shard's dsn as the superhub's; everything else is shared."""
    config = parse_config(_document())
    assert config.for_feeder("a").superhub.dsn == "postgresql:///s1"
    assert config.for_feeder("b").superhub.dsn == "postgresql:///s2"
    assert config.for_feeder("b").superhub.tables == config.superhub.tables
    assert config.by_shard() == {"s1": ["a"], "s2": ["b"]}


def test_without_shards_nothing_changes() -> None:
    """No [shards]: one superhub, every feeder in one group, for_feeder is the configuration itself."""
    config = parse_config(
        {
            "superhub": {"dsn": "postgresql:///x", "tables": ["public.*"]},
            "feeders": {"a": {"key": 1, "transport": "local"}},
        }
    )
    assert config.for_feeder("a") is config
    assert config.by_shard() == {None: ["a"]}
    assert _problems({"superhub": {"tables": ["public.*"]}}) == ["f.toml: superhub.dsn: Field required"]


def test_shard_problems_one_line_each() -> None:
    """A feeder without a shard, an unknown shard, an unused shard, two shards on one dsn: a line each."""
    document = _document()
    document["feeders"]["c"] = {"key": 3, "transport": "local"}
    document["feeders"]["d"] = {"key": 4, "transport": "local", "shard": "s9"}
    document["shards"]["s3"] = {"dsn": "postgresql:///s1"}
    document["superhub"]["dsn"] = "postgresql:///old"
    assert _problems(document) == [
        "f.toml: superhub.dsn: with [shards], each shard's dsn says where its feeders load: remove it",
        "f.toml: feeders.c.shard: missing: with [shards], name one of s1, s2, s3",
        "f.toml: feeders.d.shard: 's9' is not a shard; shards: s1, s2, s3",
        "f.toml: shards.s3: no feeder names this shard",
        "f.toml: shards.s3.dsn: the same as shard s1's dsn: each shard is a database of its own",
    ]


def test_coordinator_needs_shards_and_a_dsn_of_its_own() -> None:
    """A coordinator without shards, or on a shard's database, is refused."""
    alone = {"superhub": {"dsn": "postgresql:///x", "tables": ["public.*"]}, "coordinator": {"dsn": "postgresql:///c"}}
    assert _problems(alone) == ["f.toml: coordinator: a coordinator needs [shards.NAME] sections to read from"]
    assert _problems(_document(coordinator={"dsn": "postgresql:///s2"})) == [
        "f.toml: coordinator.dsn: the same as shard s2's dsn: the coordinator needs its own"
    ]
