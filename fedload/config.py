"""The configuration file (`fedload.toml`): where it is found, its model, and one-line problems when invalid."""

from __future__ import annotations

import os
import pwd
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from fedload.errors import ConfigError
from fedload.fdw_dsn import dsn_problems
from fedload.names import TableName, TablePattern

__all__ = [
    "DEFAULT_CONFIG_PATHS",
    "DEFAULT_RECEIVED_STATEMENT_BYTES",
    "BadRows",
    "Compression",
    "Config",
    "ConfigLocation",
    "CoordinatorConfig",
    "DaemonConfig",
    "DumpMode",
    "ExtraColumns",
    "FeederConfig",
    "JumpHost",
    "ShardConfig",
    "SshConfig",
    "SuperhubConfig",
    "SwapMethod",
    "SwapOnTimeout",
    "TransformConfig",
    "load_config",
    "locate_config",
    "parse_config",
    "split_jump",
    "split_listen_address",
]

DEFAULT_CONFIG_PATHS = (Path("fedload.toml"), Path("/etc/fedload/fedload.toml"))
# superhub.max_statement_bytes (docs/how-it-works.md): values to 128 MiB of dump text (a 64 MiB bytea, hex
# doubling it), twice the largest INSERT a feeder's forced command lets the agent merge (64 MiB); a feeder past it
# costs the superhub about this much memory and a few seconds before it is refused.
DEFAULT_RECEIVED_STATEMENT_BYTES = 128 << 20
CONFIG_ENV = "FEDLOAD_CONFIG"


def _matching(pattern: str, what: str) -> AfterValidator:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


Name = Annotated[str, _matching(r"[a-z0-9][a-z0-9_-]{0,39}", "a feeder name (1-40 of a-z 0-9 _ -)")]
ColumnName = Annotated[str, _matching(r"[a-z_][a-z0-9_]{0,62}", "a lower-case column name")]
Seconds = Annotated[float, Field(gt=0)]
_NEWEST = r"[a-z_][a-z0-9_]{0,62}\.[a-z_][a-z0-9_]{0,62}\.[a-z_][a-z0-9_]{0,62}"
ExtraColumns = Literal["warn", "error"]  # a dump's column the superhub lacks: dropped with a warning, or an error
BadRows = Literal["fail", "reject"]  # a row the superhub refuses: fails the run, or goes to fedload.rejects
Analyze = Literal["after_swap", "autovacuum"]  # who gathers a new partition's statistics: the run, or autovacuum


class DumpMode(StrEnum):
    """How the feeder sends data: pg_dump's COPY blocks, column INSERTs merged by the transformer, or binary COPY
    from one psql session where exact (text COPY elsewhere; the agent's binary mode)."""

    COPY = "copy"
    INSERTS = "inserts"
    BINARY = "binary"


class Compression(StrEnum):
    """Compression of the feeder's stream."""

    ZSTD = "zstd"
    GZIP = "gzip"


class SwapMethod(StrEnum):
    """How a feeder's new data replaces its old data (see docs/swap.md)."""

    PARTITION = "partition"  # DETACH old, ATTACH staging: ACCESS EXCLUSIVE on the parent for milliseconds
    MVCC = "mvcc"  # DELETE old rows, INSERT new ones: readers never wait, the partition needs vacuum


class SwapOnTimeout(StrEnum):
    """What a swap does once `swap_max_wait_s` of polite tries have passed."""

    FAIL = "fail"  # give up; the next run tries again
    CANCEL = "cancel"  # wait for the locks and cancel the queries that hold them (never terminate)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TransformConfig(_Model):
    """How INSERTs are merged (inserts mode)."""

    rows_per_statement: int = Field(
        1000, ge=1, description="Rows per merged INSERT; also pg_dump's --rows-per-insert (pg_dump 12 and later)."
    )
    max_statement_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Bytes per merged INSERT (16 MiB); a single larger row still passes."
    )


class SuperhubConfig(_Model):
    """The consolidating database (with [shards]: what every shard shares, each shard's dsn replacing this one)."""

    dsn: str = Field(
        "",
        description="libpq-style DSN of the consolidating database (asyncpg syntax); required without [shards], "
        "where each shard has its own instead.",
    )
    feeder_key: ColumnName = Field(
        "hub_id", description="The column that tells the feeders apart; each parent is partitioned BY LIST on it."
    )
    tables: list[TablePattern] = Field(
        min_length=1,
        description="The parents to federate, as psql and pg_dump read --table patterns (docs/tables.md); each must "
        "match a partitioned parent, and every matched parent must be in each feeder's dump.",
    )
    max_parallel_feeders: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        description="Feeder runs at once (default: the number of CPUs).",
    )
    schema_file: Path | None = Field(
        None,
        description="CREATE TABLEs (a feeder's pg_dump --schema-only) from which missing parents are created "
        "(docs/schema-file.md).",
    )
    extra_columns: ExtraColumns = Field(
        "warn", description='A dump\'s column the superhub lacks: "warn" (dropped with a warning) or "error".'
    )
    bad_rows: BadRows = Field(
        "fail",
        description='A row the superhub refuses: "fail" the run (old data kept) or "reject": set it aside in '
        "fedload.rejects and load the rest.",
    )
    stale_after_s: Seconds = Field(
        1800.0, description="`fedload status` flags a feeder whose data is older, and exits 1 (not for a paused one)."
    )
    connect_timeout_s: Seconds = Field(15.0, description="The longest wait to connect to the superhub.")
    statement_timeout_s: Seconds = Field(3600.0, description="The longest one statement on the superhub may take.")
    swap_lock_timeout_s: Seconds = Field(
        0.5,
        lt=1.0,
        description="Each polite try of a swap waits this long for its locks (below PostgreSQL's deadlock_timeout: "
        "the swap yields).",
    )
    swap_max_wait_s: Seconds = Field(
        300.0,
        description="Polite tries for this long, then swap_on_timeout; `feeder remove` and a move's drop try as long.",
    )
    swap_method: SwapMethod = Field(
        SwapMethod.PARTITION,
        description='"partition": DETACH old, ATTACH new (ACCESS EXCLUSIVE for milliseconds); "mvcc": DELETE and '
        "INSERT, readers never wait (docs/swap.md).",
    )
    swap_method_tables: dict[str, SwapMethod] = Field(
        {}, description='Per table ("schema.table" = method), overriding swap_method.'
    )
    swap_on_timeout: SwapOnTimeout = Field(
        SwapOnTimeout.FAIL,
        description='After swap_max_wait_s: "fail" (old data kept, the next run tries again) or "cancel" the queries '
        "blocking the swap (never terminate).",
    )
    swap_cancel_wait_s: Seconds = Field(
        30.0, description='With swap_on_timeout = "cancel": the longest wait for the locks while cancelling.'
    )
    swap_never_cancel_roles: list[str] = Field(
        [], description="Roles whose queries a swap never cancels: the swap gives up instead."
    )
    swap_never_cancel_applications: list[str] = Field([], description="Likewise, by application_name.")
    analyze: Analyze = Field(
        "after_swap",
        description='Who gathers the new partitions\' planner statistics: "after_swap" (the run, after its commit) '
        'or "autovacuum" (later and throttled; runs end sooner).',
    )
    run_timeout_s: Seconds = Field(
        6 * 3600.0, description='A run that takes longer fails (error_kind "timeout"), old data kept.'
    )
    worker_processes: int | None = Field(
        None,
        ge=0,
        description="Processes that run feeders, one feeder each at a time (default: max_parallel_feeders; 0: "
        "every run in the main process); a change takes effect when the daemon restarts.",
    )
    max_statement_bytes: int = Field(
        DEFAULT_RECEIVED_STATEMENT_BYTES,
        ge=1 << 20,
        description="The most of one statement or COPY data row the superhub holds without its end (128 MiB); more "
        "fails the run as a bad dump. Must exceed transform.max_statement_bytes.",
    )
    entity_key: ColumnName | None = Field(
        None,
        description="One entity, one feeder (docs/entities.md): the column that names an entity, in every "
        "configured table that has it. Needs entity_newest.",
    )
    entity_newest: Annotated[str, _matching(_NEWEST, "schema.table.column in lower case")] | None = Field(
        None,
        description='"schema.table.column" whose newest value per entity picks the feeder that shows it (ties: the '
        "feeder name first in byte order). Needs entity_key.",
    )
    entity_clock_skew_s: Seconds = Field(
        300.0,
        description="A feeder's newest value past the superhub's clock by more than this (a date or timestamp newest "
        "column) is not believed: that copy ranks below every other one, NULLs too (docs/entities.md).",
    )
    entity_max_displaced_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="A run that would take from another feeder more than entity_max_displaced of its entities, and "
        "more than this share of those it shows, is held back (a dump error, the old data kept); 1.0: never.",
    )
    entity_max_displaced: int = Field(
        10, ge=0, description="The count of another feeder's entities a run may always take (see the share)."
    )

    @property
    def workers(self) -> int:
        """How many worker processes run feeders (0: every run in the main process): by default one per feeder
        that may run at once, so that runs waiting on their feeders still overlap."""
        return self.max_parallel_feeders if self.worker_processes is None else self.worker_processes


class JumpHost(NamedTuple):
    """A bastion the feeder is reached through: `[user@]host[:port]`."""

    user: str | None
    host: str
    port: int


_JUMP = re.compile(r"(?:(?P<user>[^@\s:]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>[0-9]{1,5}))?")


def split_jump(text: str) -> JumpHost:
    """The user (None: the feeder's), host and port (default 22) of "[user@]host[:port]" (an IPv6 host in
    brackets); ValueError if `text` is not that."""
    match = _JUMP.fullmatch(text)
    port = int(match["port"] or 22) if match else 0
    if match is None or not 1 <= port <= 65535:
        raise ValueError(f"{text!r} is not [USER@]HOST[:PORT] (say fedload@bastion.example.com:22)")
    return JumpHost(match["user"], match["host"].strip("[]"), port)


def _jump_address(text: str) -> str:
    split_jump(text)
    return text


class SshConfig(_Model):
    """How the superhub reaches a feeder over SSH (through `jump`, a bastion, with the same identity, known_hosts
    and timeouts, if set)."""

    host: str = Field(min_length=1, description="The feeder's host name or address.")
    port: int = Field(22, ge=1, le=65535, description="Its SSH port.")
    user: str = Field("fedload", description="The account the superhub logs in as.")
    identity: Path | None = Field(None, description="The private key file (mode 0600 or stricter).")
    known_hosts: Path | None = Field(None, description="The known_hosts file holding the feeder's (and bastion's) key.")
    connect_timeout_s: Seconds = Field(15.0, description="The longest SSH handshake (both, through a bastion).")
    read_timeout_s: Seconds = Field(300.0, description="The longest silence of the feeder's stream.")
    keepalive_s: Seconds = Field(15.0, description="How often SSH keepalives are sent.")
    jump: Annotated[str, AfterValidator(_jump_address)] | None = Field(
        None,
        description="A bastion, [USER@]HOST[:PORT] (as ssh -J), reached with the same identity, known_hosts and "
        "timeouts.",
    )

    @property
    def jump_host(self) -> JumpHost | None:
        """The bastion of `jump`, its user defaulting to `user`; None without one."""
        if self.jump is None:
            return None
        jump = split_jump(self.jump)
        return jump._replace(user=jump.user or self.user)


class FeederConfig(_Model):
    """One feeder hub."""

    key: int | str = Field(description='This feeder\'s value of superhub.feeder_key (1 and "1" are the same key).')
    interval_s: Seconds = Field(
        300.0,
        description="The daemon syncs this feeder every so often (with jitter): the most often it runs while no "
        "feeder is behind its freshness target.",
    )
    freshness_target_s: Seconds | None = Field(
        None,
        description="The oldest this feeder's data should get (docs/freshness.md): past it the feeder is due before "
        "its interval, and a free lane goes to the feeder oldest against its target (default: "
        "daemon.freshness_target_s).",
    )
    dump_mode: DumpMode = Field(DumpMode.COPY, description='"copy", "inserts" or "binary" (docs/dump-modes.md).')
    compression: Compression = Field(
        Compression.ZSTD,
        description='"zstd" or "gzip"; an agent with neither zstandard nor the zstd program sends gzip.',
    )
    transport: Literal["ssh", "local"] = Field(
        "ssh", description='"ssh" (needs the ssh table) or "local": the feeder\'s PostgreSQL is on this host.'
    )
    ssh: SshConfig | None = Field(None, description="How to reach the feeder over SSH: [feeders.NAME.ssh].")
    agent: bool = Field(True, description="Whether the feeder runs fedload's agent (false: plain pg_dump).")
    agent_command: list[str] | None = Field(
        None,
        description="The agent's command (default: \"fedload\" over SSH, this Python's fedload for a local feeder); "
        'the zipapp: ["/usr/bin/python3", "-I", "/opt/fedload/fedload-agent.pyz"].',
    )
    read_timeout_s: Seconds = Field(300.0, description="The longest silence of the feeder's stream.")
    database: str = Field("cfdb", description="The feeder's database (a name or connection string for pg_dump).")
    pg_dump: str = Field("pg_dump", description="The feeder's pg_dump (its psql beside it in binary mode).")
    pg_dump_args: list[str] = Field([], description="More pg_dump arguments (not in binary mode).")
    carry_statistics: bool = Field(
        True,
        description="With a superhub on PostgreSQL 18+: the agent sends its tables' planner statistics, which "
        "replace the ANALYZE (docs/statistics.md); false for an agent that refuses --statistics.",
    )
    skip_unchanged: bool = Field(
        True,
        description="With the agent: a table whose digest (of its tuples' identities, or of its content) is the one "
        "stored at its last load is not sent again (docs/unchanged.md).",
    )
    skip_unchanged_min_rows: Annotated[int, Field(ge=0)] = Field(
        20_000,
        description="Ask for digests only once the feeder's last load held this many rows (or kept a table); 0: "
        "always.",
    )
    send_changed_rows: bool = Field(
        True,
        description="Binary mode, with skip_unchanged: a changed table whose parent has a primary key (or NOT NULL "
        "columns) of integer, text or uuid types goes as the buckets of its rows that changed, applied to the "
        "feeder's partition in the swap's transaction (docs/unchanged.md, \"Changed rows only\"); false: a changed "
        "table goes whole.",
    )
    remap: Path | None = Field(
        None, description="A column remap file on the superhub, applied there whatever the feeder runs."
    )
    exclude_tables: list[TablePattern] = Field(
        [],
        description="Configured tables this feeder does not send; its old partition stays until `fedload feeder "
        "remove NAME --table`.",
    )
    shard: str | None = Field(
        None, description="With [shards]: the shard whose superhub this feeder loads into (docs/scale-out.md)."
    )

    @model_validator(mode="after")
    def _ssh_needs_host(self) -> FeederConfig:
        if self.transport == "ssh" and self.ssh is None:
            raise ValueError("transport is 'ssh' but there is no [feeders.NAME.ssh] table with a host")
        if self.dump_mode == DumpMode.BINARY and not self.agent:
            raise ValueError("dump_mode 'binary' needs the agent on the feeder (agent = true)")
        if self.dump_mode == DumpMode.BINARY and self.pg_dump_args:
            raise ValueError(
                "dump_mode 'binary' runs psql, not pg_dump: put connection settings in database, not pg_dump_args"
            )
        return self


def split_listen_address(text: str) -> tuple[str, int]:
    """The host and port of "HOST:PORT" (an IPv6 host in brackets: "[::1]:9498"; port 0: any free one);
    ValueError if `text` is not that."""
    host, _, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not host or not port.isdigit() or int(port) > 65535 or (":" in host) != bracketed:
        raise ValueError(f"{text!r} is not HOST:PORT (say 127.0.0.1:9498, or [::1]:9498)")
    return host, int(port)


def _listen_address(text: str) -> str:
    split_listen_address(text)
    return text


class DaemonConfig(_Model):
    """The long-running scheduler."""

    shutdown_grace_s: Seconds = Field(
        60.0, description="On SIGTERM, how long running syncs may finish before they are cancelled."
    )
    metrics_listen: Annotated[str, AfterValidator(_listen_address)] | None = Field(
        None,
        description="HOST:PORT of the Prometheus metrics (docs/metrics.md); off by default. Plain HTTP without "
        "authentication; read at start.",
    )
    freshness_target_s: Seconds | None = Field(
        None,
        description="Every feeder's freshness target unless it sets its own (docs/freshness.md); none: the feeders "
        "run at their intervals, as before.",
    )


class ShardConfig(_Model):
    """One shard (docs/scale-out.md): a full superhub for the feeders that name it; `superhub` settings but the dsn
    apply to it."""

    dsn: str = Field(
        min_length=1, description="The shard's superhub; its TLS and connection settings reach the coordinator too."
    )


class CoordinatorConfig(_Model):
    """The database where reports run over all shards, through postgres_fdw foreign partitions (docs/scale-out.md)."""

    dsn: str = Field(min_length=1, description="The coordinator's database.")
    fdw_user: str | None = Field(
        None,
        description="The role the coordinator's postgres_fdw logs in as on every shard (a user mapping FOR PUBLIC; "
        "default: the user of each shard's dsn).",
    )
    fdw_passfile: Path | None = Field(
        None,
        description="Its password, only ever in a libpq passfile on the coordinator's host that its server can "
        "read, never in this file.",
    )
    fetch_size: int = Field(10000, ge=1, description="Rows postgres_fdw fetches from a shard at a time.")


class Config(_Model):
    """The whole file."""

    superhub: SuperhubConfig = Field(description="The consolidating database.")
    transform: TransformConfig = Field(TransformConfig(), description="How INSERTs are merged (inserts mode).")
    daemon: DaemonConfig = Field(DaemonConfig(), description="`fedload daemon`.")
    feeders: dict[Name, FeederConfig] = Field({}, description="The feeder hubs, by name.")
    shards: dict[Name, ShardConfig] = Field({}, description="Shards, by name (docs/scale-out.md).")
    coordinator: CoordinatorConfig | None = Field(None, description="The reports' database over the shards.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level where no terminal is attached (on a terminal: -v, -vv)."
    )

    def freshness_target_s(self, name: str) -> float | None:
        """Feeder `name`'s freshness target: its own, else the daemon's default; None without either."""
        own = self.feeders[name].freshness_target_s
        return self.daemon.freshness_target_s if own is None else own

    def by_shard(self, names: Iterable[str] | None = None) -> dict[str | None, list[str]]:
        """The named feeders (default: all) grouped by shard, in configuration order; one group, None, without
        shards."""
        groups: dict[str | None, list[str]] = {}
        for name in self.feeders if names is None else names:
            groups.setdefault(self.feeders[name].shard, []).append(name)
        return groups

    @model_validator(mode="after")
    def _shards_consistent(self) -> Config:
        if problems := _shard_problems(self):
            raise ValidationError.from_exception_data(
                "Config",
                [
                    InitErrorDetails(
                        type=PydanticCustomError("shards", "{message}", {"message": message}), loc=where, input=None
                    )
                    for where, message in problems
                ],
            )
        return self

    @model_validator(mode="after")
    def _statements_fit(self) -> Config:
        merged = self.transform.max_statement_bytes
        if self.superhub.max_statement_bytes <= merged:
            message = f"must be larger than transform.max_statement_bytes ({merged}): the superhub would refuse the "
            raise ValidationError.from_exception_data(
                "Config",
                [
                    InitErrorDetails(
                        type=PydanticCustomError("bound", "{message}", {"message": message + "INSERTs it merges"}),
                        loc=("superhub", "max_statement_bytes"),
                        input=self.superhub.max_statement_bytes,
                    )
                ],
            )
        return self

    @model_validator(mode="after")
    def _entities_complete(self) -> Config:
        if problem := _entity_problem(self.superhub):
            where, message = problem
            raise ValidationError.from_exception_data(
                "Config",
                [
                    InitErrorDetails(
                        type=PydanticCustomError("entities", "{message}", {"message": message}),
                        loc=("superhub", where),
                        input=None,
                    )
                ],
            )
        return self

    @model_validator(mode="after")
    def _keys_unique(self) -> Config:
        by_key: dict[str, list[str]] = {}
        for name, feeder in self.feeders.items():
            by_key.setdefault(_key_value(feeder.key), []).append(name)
        if repeated := [f"{' and '.join(names)} share key {key}" for key, names in by_key.items() if len(names) > 1]:
            raise ValueError(f"feeder keys must be unique: {'; '.join(repeated)}")
        return self


def _shard_problems(config: Config) -> list[tuple[tuple[str, ...], str]]:
    """Each inconsistency of [shards], the feeders' shards, [coordinator] and superhub.dsn, with where it is."""
    found: list[tuple[tuple[str, ...], str]]
    if not config.shards:
        found = [
            (("feeders", n, "shard"), f"names shard {f.shard!r} but there is no [shards] section")
            for n, f in config.feeders.items()
            if f.shard is not None
        ]
        if not config.superhub.dsn:
            found.append((("superhub", "dsn"), "Field required"))
        if config.coordinator is not None:
            found.append((("coordinator",), "a coordinator needs [shards.NAME] sections to read from"))
        return found
    found = []
    if config.superhub.dsn:
        found.append((("superhub", "dsn"), "with [shards], each shard's dsn says where its feeders load: remove it"))
    if config.superhub.entity_key is not None and config.coordinator is None:
        found.append(
            (("superhub", "entity_key"), "with [shards], one entity, one feeder is kept on the coordinator: add one")
        )
    for name, feeder in config.feeders.items():
        if feeder.shard is None:
            found.append(
                (("feeders", name, "shard"), f"missing: with [shards], name one of {', '.join(config.shards)}")
            )
        elif feeder.shard not in config.shards:
            found.append(
                (("feeders", name, "shard"), f"{feeder.shard!r} is not a shard; shards: {', '.join(config.shards)}")
            )
    used = {f.shard for f in config.feeders.values()}
    found += [(("shards", s), "no feeder names this shard") for s in config.shards if s not in used]
    by_dsn: dict[str, list[str]] = {}
    for name, shard in config.shards.items():
        by_dsn.setdefault(shard.dsn.strip(), []).append(name)
    found += [
        (("shards", other, "dsn"), f"the same as shard {names[0]}'s dsn: each shard is a database of its own")
        for names in by_dsn.values()
        for other in names[1:]
    ]
    if config.coordinator is not None and (same := by_dsn.get(config.coordinator.dsn.strip())):
        found.append((("coordinator", "dsn"), f"the same as shard {same[0]}'s dsn: the coordinator needs its own"))
    if config.coordinator is not None:  # each shard's dsn becomes its foreign server's options
        found += [(("shards", n, "dsn"), p) for n, s in config.shards.items() for p in dsn_problems(s.dsn)]
    return found


def _entity_problem(superhub: SuperhubConfig) -> tuple[str, str] | None:
    """What is wrong with `entity_key` and `entity_newest` that the file alone shows (the key), or None."""
    key, newest = superhub.entity_key, superhub.entity_newest
    if key is None and newest is None:
        return None
    if newest is None:
        return "entity_newest", "missing: entity_key needs entity_newest (schema.table.column whose newest value wins)"
    if key is None:
        return "entity_key", "missing: entity_newest needs entity_key (the column that names an entity)"
    schema, table, _ = newest.split(".")
    if not any(p.matches(TableName(schema, table)) for p in superhub.tables):
        return "entity_newest", f"table {schema}.{table} is not one of superhub.tables"
    return None


def _key_value(key: int | str) -> str:
    """The key as the superhub's partition bound sees it: 1, "1" and "01" are the same integer key."""
    text = str(key)
    return str(int(text)) if text.lstrip("-").isdigit() else text


@dataclass(frozen=True, slots=True)
class ConfigLocation:
    """The configuration file to read and the rule that chose it ("from $FEDLOAD_CONFIG" ...)."""

    path: Path
    chosen_by: str

    @property
    def whole_path(self) -> Path:
        """The path from the root (as given if the current directory is gone)."""
        return _whole(self.path)

    def __str__(self) -> str:
        """ "/etc/fedload/fedload.toml (from $FEDLOAD_CONFIG)": the whole path, for people to see which file."""
        return f"{self.whole_path} ({self.chosen_by})"


def _whole(path: Path) -> Path:
    """`path` from the root where the current directory is known, else as given."""
    try:
        return path.absolute()
    except OSError:  # the current directory was removed
        return path


def locate_config(explicit: Path | None, environ: Mapping[str, str] = os.environ) -> ConfigLocation:
    """--config, else $FEDLOAD_CONFIG, else ./fedload.toml, else /etc/fedload/fedload.toml; ConfigError if none
    is there, or a directory to look in cannot be searched by this user."""
    if explicit is not None:
        return ConfigLocation(explicit, "given by --config")
    if environ.get(CONFIG_ENV):
        return ConfigLocation(Path(environ[CONFIG_ENV]), f"from ${CONFIG_ENV}")
    here, default = DEFAULT_CONFIG_PATHS
    if _exists(here):
        return ConfigLocation(here, "./fedload.toml in the current directory")
    if _exists(default):
        return ConfigLocation(default, "the default, as there is no ./fedload.toml")
    searched = ", ".join(str(p) for p in DEFAULT_CONFIG_PATHS)
    raise ConfigError(f"no configuration file: give --config PATH, set ${CONFIG_ENV}, or create one of {searched}")


def _exists(candidate: Path) -> bool:
    """Whether `candidate` is a file; ConfigError, one line, if its directory cannot be searched by this user."""
    try:
        return candidate.is_file()
    except OSError as exc:
        relative = not candidate.is_absolute()
        shown, where = f"{'./' if relative else ''}{candidate}", _whole(candidate).parent
        elsewhere = ", or run fedload from a directory this user can read (cd /)" if relative else ""
        raise ConfigError(
            f"cannot look for {shown} in {where}: {exc.strerror or exc} for user {_user()}; "
            f"give --config PATH or set ${CONFIG_ENV}{elsewhere}"
        ) from None


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid without a name
        return str(os.geteuid())


def load_config(path: Path) -> Config:
    """Read and validate a configuration file; ConfigError lists every problem, one line each."""
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_config(document, source=str(path))


def parse_config(document: Mapping[str, Any], source: str = "config") -> Config:
    """Validate a parsed configuration document."""
    try:
        return Config.model_validate(document)
    except ValidationError as exc:
        raise ConfigError([_problem(source, error) for error in exc.errors()]) from None


def _problem(source: str, error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"] if part != "[key]") or "(top level)"
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key (misspelt?)"
    return f"{source}: {where}: {message}"
