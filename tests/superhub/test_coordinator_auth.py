"""The coordinator reading shards that want a password (docs/scale-out.md): the role of `fdw_user`, its password
in the libpq passfile of `fdw_passfile`, which the coordinator's server reads; the password is nowhere else."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from fedload.config import Config, parse_config
from fedload.localpg import LocalCluster, find_installs
from fedload.superhub.coordinator import build_coordinator
from tests.federation import Federation, sync
from tests.shards import COUNTS, require_postgres_fdw

READER, SECRET = "fdw_reader", "Pa55-word-of-the-reader"


@pytest.fixture
def guarded() -> Iterator[LocalCluster]:
    """A cluster of its own whose role fdw_reader must give its password (SCRAM) on every connection."""
    installs = find_installs()
    running = LocalCluster(installs.get(15) or installs[min(installs)], name="auth").start()
    try:
        require_postgres_fdw(running)
        running.psql(f"CREATE ROLE {READER} LOGIN PASSWORD '{SECRET}'")
        hba = running.data / "pg_hba.conf"
        hba.write_text(f"local all {READER} scram-sha-256\n" + hba.read_text())
        running.psql("SELECT pg_reload_conf()")
        yield running
    finally:
        running.stop()


def _passfile(cluster: LocalCluster, password: str) -> Path:
    """A libpq passfile for fdw_reader in the cluster's directory, owned like it (by the server's account)."""
    path = cluster.dir / "pgpass"
    path.write_text(f"*:*:*:{READER}:{password}\n")
    path.chmod(0o600)  # libpq ignores a passfile others may read
    owner = cluster.dir.stat()
    if os.geteuid() == 0:
        os.chown(path, owner.st_uid, owner.st_gid)
    return path


def _config(fed: Federation, cluster: LocalCluster, passfile: Path) -> Config:
    """The federation's feeders on two shards of `guarded`, read by its coordinator as fdw_reader."""
    document = fed.config().model_dump(mode="json", exclude_none=True)
    del document["superhub"]["dsn"]
    layout = {"s1": ["hub1", "hub2"], "s2": ["hub3"]}
    document["shards"] = {}
    for shard, feeders in layout.items():
        cluster.psql(f"CREATE DATABASE {shard}")
        document["shards"][shard] = {"dsn": cluster.dsn(shard)}
        for name in feeders:
            document["feeders"][name]["shard"] = shard
    cluster.psql("CREATE DATABASE coord")
    document["coordinator"] = {"dsn": cluster.dsn("coord"), "fdw_user": READER, "fdw_passfile": str(passfile)}
    return parse_config(document)


def test_the_coordinator_logs_in_with_the_passfiles_password(federation: Federation, guarded: LocalCluster) -> None:
    """Shards loaded, SELECT granted to fdw_reader: the coordinator reads both shards as fdw_reader with the
    passfile's password, directly and through a filter view (fedload grants it those); the password is in no
    server or user mapping option and no log event. With a wrong password, the coordinator's query fails with
    postgres_fdw's error naming the shard's server, and without the password in it."""
    passfile = _passfile(guarded, SECRET)
    config = _config(federation, guarded, passfile)
    with capture_logs() as logs:
        assert all(run.succeeded for run in sync(config))
    for shard in ("s1", "s2"):
        guarded.psql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER}", dbname=shard)
    assert guarded.psql(COUNTS.format(table="hosts"), dbname="coord").strip() == "1:300,2:200,3:100"
    options = guarded.psql(
        "SELECT string_agg(array_to_string(srvoptions, ','), ';') FROM pg_foreign_server", dbname="coord"
    ) + guarded.psql("SELECT string_agg(array_to_string(umoptions, ','), ';') FROM pg_user_mappings", dbname="coord")
    assert (f"passfile={passfile}" in options, f"user={READER}" in options, SECRET in options) == (True, True, False)
    assert SECRET not in repr(logs)

    document = config.model_dump(mode="json", exclude_none=True)
    document["feeders"]["hub2"]["shard"] = "s2"  # by hand: s2 is read through a filter view until it loads hub2
    report = asyncio.run(build_coordinator(parse_config(document)))
    assert (report.filtered, report.pending) == (["s2"], {"hub2": "s1"})
    assert guarded.psql(COUNTS.format(table="hosts"), dbname="coord").strip() == "1:300,2:200,3:100"

    passfile.write_text(f"*:*:*:{READER}:not-the-password\n")
    with pytest.raises(Exception) as refused:  # noqa: PT011 - psql's failure, whatever its class
        guarded.psql(COUNTS.format(table="hosts"), dbname="coord")
    message = str(refused.value)
    assert 'could not connect to server "fedload_s' in message, message
    assert "password authentication failed" in message, message
    assert SECRET not in message
