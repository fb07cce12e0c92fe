"""The coordinator's upkeep (issue 35): filter views left behind while in use are dropped by a later build, and a
failure while dropping them after the build committed is a warning; the servers of removed shards are dropped;
a coordinator role that does not own the database builds all the same; a build of a configuration that is no
longer the newest does not commit."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

import fedload.scaleout.coordinator as coordinator_module
from fedload.commands.admin import remove_feeder
from fedload.config import Config, parse_config
from fedload.scaleout.coordinator import build_coordinator
from fedload.service.coordinator_keeper import CoordinatorKeeper
from tests.support.federation import Federation, sync
from tests.support.shards import COUNTS, coord_int, coord_sql, shard_sql, with_coordinator

VIEWS = "SELECT string_agg(viewname, ',' ORDER BY viewname) FROM pg_views WHERE schemaname = 'fedload_export'"
BUILDERS_LOCK = "SELECT pg_advisory_lock(1717920876, 1)"


def _with(config: Config, **changes: Any) -> Config:
    document = config.model_dump(mode="json", exclude_none=True)
    for name, shard in changes.items():
        document["feeders"][name]["shard"] = shard
    document["shards"] = {
        s: v for s, v in document["shards"].items() if s in {f["shard"] for f in document["feeders"].values()}
    }
    return parse_config(document)


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


async def test_views_in_use_are_dropped_later_and_removed_shards_servers_go(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hub2 moved by hand to s2 and removed from s1: the build that reads s1 directly again cannot drop s1's filter
    view while a session uses it (a warning, the build succeeds), nor when the coordinator fails after the commit
    (a warning, not an error: the switch did commit); the next build drops it. A shard removed from the
    configuration loses its foreign server and user mapping."""
    before = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    assert all(run.succeeded for run in await sync(before))
    after = _with(before, hub2="s2")
    assert all(run.succeeded for run in await sync(after))  # s2 loads hub2; s1 is read through a filter view
    assert await asyncio.to_thread(remove_feeder, after, "hub2", yes=True, shard="s1") == 0
    views = shard_sql(federation, "s1", VIEWS)

    user = await asyncpg.connect(after.shards["s1"].dsn)
    try:
        async with user.transaction():
            locked = ", ".join(f'fedload_export."{view}"' for view in views.split(","))
            await user.execute(f"LOCK TABLE {locked} IN ACCESS SHARE MODE")
            with capture_logs() as logs:
                assert (await build_coordinator(after)).detached  # s1 read directly again: committed
                monkeypatch.setattr(coordinator_module, "_READ_VIEWS", "SELECT no_such_column FROM pg_class")
                assert (await build_coordinator(after)).attached == []  # fails after its (empty) commit
                monkeypatch.undo()
    finally:
        await user.close()
    not_dropped = _events(logs, "coordinator.views_not_dropped")
    assert [e.get("reason") for e in not_dropped] == ["in use", None], not_dropped
    assert "no_such_column" in not_dropped[1]["error"]
    assert shard_sql(federation, "s1", VIEWS) == views
    await build_coordinator(after)
    assert shard_sql(federation, "s1", VIEWS) == ""
    assert coord_sql(federation, COUNTS.format(table="hosts")) == "1:300,2:200,3:100"

    alone = _with(after, hub2="s1", hub3="s1")  # s2 removed from the configuration
    with capture_logs() as logs:
        await build_coordinator(alone)
    assert [e["server"] for e in _events(logs, "coordinator.server_dropped")] == ["fedload_s2"]
    assert coord_sql(federation, "SELECT string_agg(srvname, ',') FROM pg_foreign_server") == "fedload_s1"
    assert coord_int(federation, "SELECT count(*) FROM pg_user_mappings") == 1


async def test_a_coordinator_role_without_ownership_builds_again_and_again(federation: Federation) -> None:
    """The coordinator's role may create (CREATE on the database and its schema public, USAGE on postgres_fdw) but
    does not own the database: every build succeeds, warning once per build that partitionwise aggregation is not
    set (only the owner may); once the owner has set it, no warning."""
    config = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    coordinator = f"{federation.superhub}_coord"
    federation.cluster.psql(
        f"DROP ROLE IF EXISTS builder_{coordinator}; CREATE ROLE builder_{coordinator} LOGIN; "
        f"GRANT CREATE ON DATABASE {coordinator} TO builder_{coordinator}"
    )
    coord_sql(
        federation,
        f"CREATE EXTENSION postgres_fdw; GRANT USAGE ON FOREIGN DATA WRAPPER postgres_fdw TO builder_{coordinator}; "
        f"GRANT CREATE ON SCHEMA public TO builder_{coordinator}",
    )
    assert config.coordinator is not None
    dsn = config.coordinator.dsn.replace("postgresql://postgres@", f"postgresql://builder_{coordinator}@")
    builder = config.model_copy(update={"coordinator": config.coordinator.model_copy(update={"dsn": dsn})})
    with capture_logs() as logs:
        assert (await build_coordinator(builder)).attached
        assert (await build_coordinator(builder)).attached == []
    assert len(_events(logs, "coordinator.partitionwise_not_set")) == 2
    coord_sql(federation, f"ALTER DATABASE {coordinator} SET enable_partitionwise_aggregate = on")
    with capture_logs() as logs:
        await build_coordinator(builder)
    assert _events(logs, "coordinator.partitionwise_not_set") == []


async def test_a_build_of_an_older_configuration_never_commits_last(federation: Federation) -> None:
    """A build of configuration A waits for the builders' lock when a reload brings B: A's build is cancelled and
    B's alone commits; `build_coordinator(current=...)` returning False rolls a finished build back."""
    base = with_coordinator(federation, {"s1": ["hub1", "hub2"], "s2": ["hub3"]})
    await build_coordinator(base)
    document = base.model_dump(mode="json", exclude_none=True)
    document["feeders"]["hub4"] = {**document["feeders"]["hub3"], "key": 4}
    grown = parse_config(document)  # A: s2's bound would become (3, 4)
    assert (await build_coordinator(grown, current=lambda: False)).superseded
    bound = "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'public.hosts@s2'"
    assert coord_sql(federation, bound) == "FOR VALUES IN (3)"

    assert base.coordinator is not None
    blocker = await asyncpg.connect(base.coordinator.dsn)
    await blocker.execute(BUILDERS_LOCK)
    keeper = CoordinatorKeeper(grown)
    with capture_logs() as logs:
        try:
            keeper.start()
            await asyncio.sleep(1.0)  # A's build waits for the builders' lock
            keeper.reconfigured(base)  # B: the layout the coordinator has
            await asyncio.sleep(0.2)
            await blocker.execute("SELECT pg_advisory_unlock(1717920876, 1)")
            assert await keeper.settled(30.0)
        finally:
            await keeper.close()
            await blocker.close()
    assert _events(logs, "coordinator.built") == []  # neither A's layout nor a change back to B's
    assert coord_sql(federation, bound) == "FOR VALUES IN (3)"
