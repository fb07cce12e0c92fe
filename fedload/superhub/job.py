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
from dataclasses import dataclass, replace

from fedload.config import Analyze, Config, FeederConfig, TransformConfig
from fedload.errors import ConfigError
from fedload.superhub.coordinated_entities import CoordinatedEntities
from fedload.superhub.entities import EntityRule
from fedload.superhub.importer import ImportPolicy
from fedload.superhub.schema import ParentsSpec
from fedload.superhub.session import SuperhubTarget
from fedload.superhub.swap import SwapPolicy

__all__ = [
    "Job",
    "coordinated_entities",
    "coordinator_target",
    "feeder_job",
    "feeder_jobs",
    "parents_spec",
    "superhub_target",
    "superhub_targets",
    "swap_policy",
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
    entities: CoordinatedEntities | None = None  # the entity rule kept on the coordinator (with [shards])


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


def coordinated_entities(config: Config) -> CoordinatedEntities | None:
    """With [shards], [coordinator] and `superhub.entity_key`: the rule, kept on the coordinator
    (fedload.superhub.coordinated_entities); None otherwise (without shards the superhub keeps it itself)."""
    superhub = config.superhub
    rule = EntityRule.of_superhub(superhub)
    if rule is None or not config.shards or config.coordinator is None:
        return None
    return CoordinatedEntities(rule, coordinator_target(config), superhub.swap_max_wait_s)


def swap_policy(config: Config) -> SwapPolicy:
    """The swap's policy (`SwapPolicy.from_config`); with shards the shards move no rows of the entity rule (the
    coordinator hides the copies, `coordinated_entities`)."""
    policy = SwapPolicy.from_config(config.superhub)
    return replace(policy, entities=None) if config.shards else policy


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
    swap, entities = swap_policy(config), coordinated_entities(config)
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
            entities=entities,
        )
        for name in (config.feeders if names is None else names)
    }


def feeder_job(config: Config, name: str) -> Job:
    """Feeder `name`'s run, on its superhub (with shards, its shard's)."""
    return feeder_jobs(config, [name])[name]
