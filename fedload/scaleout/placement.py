"""Which shard the coordinator reads each feeder from, and which shards it reads through a filter
(docs/scale-out.md, "Moving a feeder").

A shard's foreign partition on the coordinator gets every row the shard's relation holds, whatever the partition's
bound says: postgres_fdw does not send the bound to the shard. So the coordinator reads a shard's parent directly
only while the shard holds exactly the feeders read from it. A shard that holds others (a feeder moved away and not
yet removed there), or that may at any moment (a feeder configured there but still served from its old shard), is
read through a view on the shard that keeps only the keys read from it.

A feeder is read from its configured shard once that shard holds it, or when no shard does (a new feeder: its first
load lands there). Until then it is read from a shard that holds it. So a feeder given another shard stays served
from its old one until the new one has loaded it, and is then switched in one coordinator transaction: a reader of
the coordinator never sees it missing or twice.

    placement = place(config, held={"s1": {"hub1", "hub2"}, "s2": {"hub3"}})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from fedload.config import Config, FeederConfig

__all__ = ["Placement", "ShardReads", "place"]


@dataclass(frozen=True, slots=True)
class ShardReads:
    """What the coordinator reads from one shard: these feeders, from its parents directly or through a filter."""

    feeders: tuple[str, ...]
    filtered: bool


@dataclass(frozen=True, slots=True)
class Placement:
    """Per shard what the coordinator reads from it; per feeder the shard it is read from."""

    reads: dict[str, ShardReads]
    served_from: dict[str, str]

    def pending(self, feeders: Mapping[str, FeederConfig]) -> dict[str, str]:
        """Feeders read from another shard than their configured one (which has not loaded them yet): name to the
        shard they are read from."""
        return {name: shard for name, shard in self.served_from.items() if feeders[name].shard != shard}


def place(
    config: Config, held: Mapping[str, Set[str]], unknown: Mapping[str, Sequence[str]] | None = None
) -> Placement:
    """The placement for `config` when each shard holds partitions of the `held` feeders (configured ones), and
    `unknown` partitions of keys no configured feeder has (each makes its shard filtered)."""
    served_from = {name: _served_from(name, config, held) for name in config.feeders}
    reads = {}
    for shard in config.shards:
        feeders = tuple(sorted(name for name, where in served_from.items() if where == shard))
        configured = {name for name, feeder in config.feeders.items() if feeder.shard == shard}
        others = (set(held.get(shard, ())) | configured) - set(feeders)
        reads[shard] = ShardReads(feeders, filtered=bool(others or (unknown or {}).get(shard)))
    return Placement(reads, served_from)


def _served_from(name: str, config: Config, held: Mapping[str, Set[str]]) -> str:
    configured = config.feeders[name].shard
    assert configured is not None, "placement is for configurations with shards"
    holders = sorted(shard for shard in config.shards if name in held.get(shard, ()))
    return configured if configured in holders or not holders else holders[0]
