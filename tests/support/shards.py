"""Helpers of the tests with shards and a coordinator: shard databases on the federation's cluster, a
configuration file naming them, SQL on a shard or the coordinator."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tomlkit

from fedload.config import Config, parse_config
from fedload.localpg import LocalCluster
from fedload.superhub.schema import key_literal
from tests.support.federation import Federation, config_toml, psql_bool, psql_int


def sharded(fed: Federation, layout: dict[str, list[str]], *, coordinator: str | None = None) -> Config:
    """The federation's configuration with shard databases (created) holding the feeders of `layout`."""
    document = fed.config().model_dump(mode="json", exclude_none=True)
    del document["superhub"]["dsn"]
    document["shards"] = {}
    for shard, feeders in layout.items():
        fed.cluster.psql(f"CREATE DATABASE {fed.superhub}_{shard}")
        document["shards"][shard] = {"dsn": fed.cluster.dsn(f"{fed.superhub}_{shard}")}
        for name in feeders:
            document["feeders"][name]["shard"] = shard
    if coordinator is not None:
        document["coordinator"] = {"dsn": coordinator}
    return parse_config(document)


COUNTS = (  # rows per feeder key: "1:300,2:200"
    "SELECT string_agg(hub_id || ':' || n, ',' ORDER BY hub_id) "
    "FROM (SELECT hub_id, count(*) AS n FROM {table} GROUP BY 1) AS c"
)


def shard_sql(fed: Federation, shard: str, sql: str) -> str:
    """Run SQL on a shard's database; psql's text (for text values)."""
    return fed.cluster.psql(sql, dbname=f"{fed.superhub}_{shard}").strip()


def shard_int(fed: Federation, shard: str, sql: str) -> int:
    """The integer (a count) that `sql` selects on a shard's database."""
    return psql_int(fed.cluster, sql, f"{fed.superhub}_{shard}")


def shard_bool(fed: Federation, shard: str, sql: str) -> bool:
    """The boolean that `sql` selects on a shard's database."""
    return psql_bool(fed.cluster, sql, f"{fed.superhub}_{shard}")


def synced(fed: Federation, shard: str) -> int:
    """How many feeders have synced successfully on a shard."""
    if shard_bool(fed, shard, "SELECT to_regclass('fedload.runs') IS NULL"):
        return 0
    return shard_int(fed, shard, "SELECT count(DISTINCT feeder) FROM fedload.runs WHERE outcome = 'success'")


def sharded_toml(fed: Federation, config: Config) -> Path:
    """A configuration file for `config`'s shards, as an operator would write it."""
    text = config_toml(fed).replace(f'dsn = "{fed.cluster.dsn(fed.superhub)}"\n', "")
    for name, feeder in config.feeders.items():
        text = text.replace(f"[feeders.{name}]\n", f'[feeders.{name}]\nshard = "{feeder.shard}"\n')
    text += "".join(f'[shards.{shard}]\ndsn = "{s.dsn}"\n' for shard, s in config.shards.items())
    if config.coordinator is not None:
        text += f'[coordinator]\ndsn = "{config.coordinator.dsn}"\n'
    path = fed.tmp / "sharded.toml"
    path.write_text(text)
    return path


def with_coordinator(fed: Federation, layout: dict[str, list[str]]) -> Config:
    """`sharded` plus a coordinator database (created) on the same cluster."""
    require_postgres_fdw(fed.cluster)
    fed.cluster.psql(f"CREATE DATABASE {fed.superhub}_coord")
    return sharded(fed, layout, coordinator=fed.cluster.dsn(f"{fed.superhub}_coord"))


def coord_sql(fed: Federation, sql: str) -> str:
    """Run SQL on the coordinator; psql's text (for text values)."""
    return fed.cluster.psql(sql, dbname=f"{fed.superhub}_coord").strip()


def coord_int(fed: Federation, sql: str) -> int:
    """The integer (a count) that `sql` selects on the coordinator."""
    return psql_int(fed.cluster, sql, f"{fed.superhub}_coord")


def require_postgres_fdw(cluster: LocalCluster) -> None:
    """Fail (in CI, where FEDLOAD_REQUIRE_MAJORS lists the major) or skip when an install lacks postgres_fdw."""
    if psql_bool(cluster, "SELECT count(*) = 1 FROM pg_available_extensions WHERE name = 'postgres_fdw'"):
        return
    major = cluster.install.major
    if str(major) in os.environ.get("FEDLOAD_REQUIRE_MAJORS", "").split(","):
        pytest.fail(f"PostgreSQL {major} in {cluster.install.bindir} lacks postgres_fdw, which is required here")
    pytest.skip(f"PostgreSQL {major} in {cluster.install.bindir} lacks postgres_fdw")


def config_file(fed: Federation, config: Config, name: str = "sharded.toml") -> Path:
    """`config` written as a configuration file (for the commands that rewrite it, `feeder move`)."""
    path = fed.tmp / name
    path.write_text(tomlkit.dumps(config.model_dump(mode="json", exclude_none=True)))
    return path


def read_per_feeder(fed: Federation, keys: dict[str, int | str], table: str = "hosts") -> dict[str, object]:
    """What a coordinator reader sees of each feeder: the GROUP BY rows (a feeder twice would show twice), and per
    feeder the count of `WHERE key = k`, and the unfiltered total."""
    grouped = coord_sql(fed, f"SELECT hub_id::text || ':' || count(*) FROM {table} GROUP BY hub_id ORDER BY 1")
    filtered = {
        name: coord_int(fed, f"SELECT count(*) FROM {table} WHERE hub_id = {key_literal(key)}")
        for name, key in keys.items()
    }
    total = coord_int(fed, f"SELECT count(*) FROM {table}")
    return {"grouped": sorted(grouped.split()), "filtered": filtered, "total": total}


def exactly_once(fed: Federation, keys: dict[str, int | str], rows: dict[str, int]) -> dict[str, object]:
    """The reading `read_per_feeder` must give when each feeder of `rows` is seen exactly once with its rows (a
    feeder with no rows has no GROUP BY row)."""
    by_key = {str(keys[name]): n for name, n in rows.items() if n}
    return {
        "grouped": sorted(f"{key}:{n}" for key, n in by_key.items()),
        "filtered": {name: rows.get(name, 0) for name in keys},
        "total": sum(rows.values()),
    }
