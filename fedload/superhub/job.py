"""What a feeder's run is given, resolved from the configuration once, at the top (`fedload sync`, the daemon,
`fedload feeder move`): the superhub it talks to and its job. The load path reads nothing else of the
configuration, and a worker process receives the job with each run: its size does not grow with the feeders.

    job = feeder_job(config, "hub1")  # with shards, hub1's shard is its superhub
    run = await sync_feeder(job)

These resolvers are the only functions here that read the whole configuration: each reads across its sections
(a feeder and its shard, the feeders' keys for the parents' key type).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fedload.config import Analyze, Config, FeederConfig, TransformConfig
from fedload.errors import ConfigError
from fedload.superhub.importer import ImportPolicy
from fedload.superhub.schema import ParentsSpec
from fedload.superhub.session import SuperhubTarget
from fedload.superhub.swap import SwapPolicy

__all__ = [
    "Job",
    "coordinator_target",
    "feeder_job",
    "feeder_jobs",
    "parents_spec",
    "superhub_target",
    "superhub_targets",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One feeder's run: the feeder (`name`, its section), the superhub it loads into, and the settings of its load,
    swap and dump (the transformer's, sent to the agent)."""

    name: str
    feeder: FeederConfig
    superhub: SuperhubTarget
    parents: ParentsSpec
    imports: ImportPolicy
    swap: SwapPolicy
    transform: TransformConfig
    analyze: Analyze
    run_timeout_s: float


def superhub_targets(config: Config) -> dict[str | None, SuperhubTarget]:
    """Every superhub the configuration loads into, by shard name; without shards one, under None."""
    superhub = config.superhub
    connect_s, statement_s = superhub.connect_timeout_s, superhub.statement_timeout_s
    if not config.shards:
        return {None: SuperhubTarget(superhub.dsn, connect_s, statement_s)}
    return {name: SuperhubTarget(shard.dsn, connect_s, statement_s, name) for name, shard in config.shards.items()}


def superhub_target(config: Config, shard: str | None = None) -> SuperhubTarget:
    """The superhub of shard `shard` (None: the one superhub, without shards); KeyError for no such shard."""
    return superhub_targets(config)[shard]


def coordinator_target(config: Config) -> SuperhubTarget:
    """The coordinator's database as a session sees it: its dsn, the superhub's timeouts; ConfigError without one."""
    if config.coordinator is None:
        raise ConfigError("there is no [coordinator] section")
    superhub = config.superhub
    return SuperhubTarget(config.coordinator.dsn, superhub.connect_timeout_s, superhub.statement_timeout_s)


def parents_spec(config: Config) -> ParentsSpec:
    """The parents as configured; their key is an integer column where every feeder's key is an integer."""
    superhub = config.superhub
    key_type = "integer" if all(isinstance(f.key, int) for f in config.feeders.values()) else "text"
    return ParentsSpec(tuple(superhub.tables), superhub.feeder_key, key_type, superhub.schema_file)


def feeder_jobs(config: Config, names: Iterable[str] | None = None) -> dict[str, Job]:
    """The runs of the named feeders (default: all), each on its superhub (with shards, its shard's)."""
    superhub, targets, parents = config.superhub, superhub_targets(config), parents_spec(config)
    imports = ImportPolicy(
        superhub.feeder_key, parents.tables, superhub.extra_columns, superhub.bad_rows, superhub.max_statement_bytes
    )
    swap = SwapPolicy.from_config(superhub)
    return {
        name: Job(
            name=name,
            feeder=(feeder := config.feeders[name]),
            superhub=targets[feeder.shard],
            parents=parents,
            imports=imports,
            swap=swap,
            transform=config.transform,
            analyze=superhub.analyze,
            run_timeout_s=superhub.run_timeout_s,
        )
        for name in (config.feeders if names is None else names)
    }


def feeder_job(config: Config, name: str) -> Job:
    """Feeder `name`'s run, on its superhub (with shards, its shard's)."""
    return feeder_jobs(config, [name])[name]
