"""The superhub on other PostgreSQL majors than the feeders: drift, resync and rejection behave the same."""

from __future__ import annotations

import pytest

from fedload.config import Config
from fedload.localpg import LocalCluster
from fedload.results import Outcome
from tests.support.federation import CONTEXT_COLS, DIGEST, HOST_COLS, Federation, psql_int, sync


def on_superhub(fed: Federation, hub: LocalCluster, **feeder_overrides: object) -> Config:
    """The federation's configuration with its superhub database on `hub`."""
    hub.psql(f"CREATE DATABASE {fed.superhub}")
    config = fed.config(**feeder_overrides)
    superhub = config.superhub.model_copy(update={"dsn": hub.dsn(fed.superhub)})
    return config.model_copy(update={"superhub": superhub})


def assert_partitions_equal(fed: Federation, hub: LocalCluster) -> None:
    """Every feeder's tables (on the feeders' cluster) equal its partition on the superhub's cluster."""
    for key, db in enumerate(fed.feeders.values(), start=1):
        for table, cols in (("hosts", HOST_COLS), ("contexts", CONTEXT_COLS)):
            expected = fed.cluster.psql(DIGEST.format(cols=cols, table=table), dbname=db).strip()
            actual = hub.psql(DIGEST.format(cols=cols, table=f"{table} WHERE hub_id = {key}"), dbname=fed.superhub)
            assert actual.strip() == expected, (db, table)


@pytest.mark.pg_major(17, 18)  # the superhub's; the feeders are on the module's cluster, PostgreSQL 15
@pytest.mark.parametrize("mode", ["copy", "inserts", "binary"])
async def test_drifting_feeders_load_into_a_superhub_of_another_major(
    federation: Federation, major_cluster: LocalCluster, mode: str
) -> None:
    """Feeders on PostgreSQL 15 with drifting schemas load exactly into a PostgreSQL 17/18 superhub, twice."""
    feeders = federation.cluster
    feeders.psql(
        "ALTER TABLE hosts DROP COLUMN site; ALTER TABLE hosts ADD COLUMN uptime int", dbname=federation.feeders["hub2"]
    )
    config = on_superhub(federation, major_cluster, dump_mode=mode)
    runs = await sync(config)
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 3, [r.error for r in runs]
    assert_partitions_equal(federation, major_cluster)
    feeders.psql("DELETE FROM contexts WHERE score % 3 = 0", dbname=federation.feeders["hub3"])
    assert [r.outcome for r in await sync(config)] == [Outcome.SUCCESS] * 3
    assert_partitions_equal(federation, major_cluster)
    leftovers = "SELECT count(*) FROM pg_tables WHERE schemaname = 'fedload_stage'"
    assert psql_int(major_cluster, leftovers, federation.superhub) == 0
