"""The coordinator reading shards that want a password (docs/scale-out.md): the role of `fdw_user`, its password
in the libpq passfile of `fdw_passfile`, which the coordinator's server reads; the password is nowhere else."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from fedload.config import Config, parse_config
from fedload.localpg import LocalCluster
from fedload.scaleout.coordinator import build_coordinator
from tests.support.fault_injection import sabotage_environment
from tests.support.federation import DaemonProcess, Federation, config_toml, fedload, psql_bool, sync
from tests.support.shards import COUNTS, require_postgres_fdw

READER, SECRET = "fdw_reader", "Pa55-word-of-the-reader"


@pytest.fixture
def guarded(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """A cluster of its own, of the module cluster's major, whose role fdw_reader must give its password (SCRAM)
    on every connection."""
    running = LocalCluster(cluster.install, name="auth").start()
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


async def test_the_coordinator_logs_in_with_the_passfiles_password(
    federation: Federation, guarded: LocalCluster
) -> None:
    """Shards loaded, SELECT granted to fdw_reader: the coordinator reads both shards as fdw_reader with the
    passfile's password, directly and through a filter view (fedload grants it those); the password is in no
    server or user mapping option and no log event. With a wrong password, the coordinator's query fails with
    postgres_fdw's error naming the shard's server, and without the password in it."""
    passfile = _passfile(guarded, SECRET)
    config = _config(federation, guarded, passfile)
    with capture_logs() as logs:
        assert all(run.succeeded for run in await sync(config))
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
    report = await build_coordinator(parse_config(document))
    assert (report.filtered, report.pending) == (["s2"], {"hub2": "s1"})
    assert guarded.psql(COUNTS.format(table="hosts"), dbname="coord").strip() == "1:300,2:200,3:100"

    passfile.write_text(f"*:*:*:{READER}:not-the-password\n")
    with pytest.raises(Exception) as refused:  # noqa: PT011 - psql's failure, whatever its class
        guarded.psql(COUNTS.format(table="hosts"), dbname="coord")
    message = str(refused.value)
    assert 'could not connect to server "fedload_s' in message, message
    assert "password authentication failed" in message, message
    assert "not-the-password" not in message  # the password the server was sent (the right one is not in it)


FEEDER_SECRET = "Feeder-s3cret-in-the-conninfo"
WRONG_SECRET = "Not-the-superhub-s3cret"


def _secret_config(fed: Federation, guarded: LocalCluster) -> str:
    """A daemon's configuration with passwords in both connection strings: the superhub's dsn (fdw_reader's
    password, SCRAM: it must be right) and hub1's feeder conninfo (a role that does not exist: every dump fails);
    debug logging, metrics on any free port."""
    text = config_toml(fed, interval_s=0.5).split("[feeders.hub3]")[0]
    text = text.replace('log_level = "info"', 'log_level = "debug"')
    text = text.replace(
        fed.cluster.dsn(fed.superhub), f"postgresql://{READER}:{SECRET}@/sh?host={guarded.dir}&port={guarded.port}"
    )
    hub1 = fed.cluster.conninfo(fed.feeders["hub1"])
    text = text.replace(hub1, hub1.replace("user=postgres", f"user=nobody password={FEEDER_SECRET}"))
    return text.replace("[daemon]\n", '[daemon]\nmetrics_listen = "127.0.0.1:0"\n')


def secrets_seen(text: str) -> list[str]:
    """The test's passwords that `text` contains."""
    return [secret for secret in (SECRET, FEEDER_SECRET, WRONG_SECRET) if secret in text]


@dataclass
class Exposed:
    """Everything an operator sees of a daemon's runs: its log (main process and workers), fedload.runs' errors,
    `fedload status --json`, /metrics, and a `fedload sync` whose superhub password is wrong."""

    log: str
    errors: str
    status: str
    metrics: str
    refused: str

    def secrets(self) -> dict[str, list[str]]:
        found = {name: secrets_seen(str(value)) for name, value in vars(self).items()}
        return {name: seen for name, seen in found.items() if seen}


def exposed_by_a_failing_feeder(
    fed: Federation, guarded: LocalCluster, start_daemon: Callable[..., DaemonProcess], env: dict[str, str] | None
) -> Exposed:
    """Run a daemon with passwords in its dsns until hub1 has failed twice and hub2 succeeded; what it showed."""
    guarded.psql(f"CREATE DATABASE sh OWNER {READER}")
    text = _secret_config(fed, guarded)
    daemon = start_daemon(text, env)
    runs = (
        "SELECT count(*) FILTER (WHERE feeder = 'hub1' AND outcome = 'failed') || ':' || "
        "count(*) FILTER (WHERE feeder = 'hub2' AND outcome = 'success') FROM fedload.runs"
    )

    def enough() -> bool:
        if not psql_bool(guarded, "SELECT to_regclass('fedload.runs') IS NOT NULL", "sh"):
            return False
        failed, succeeded = (int(n) for n in guarded.psql(runs, dbname="sh").strip().split(":"))
        return failed >= 2 and succeeded >= 1

    daemon.wait_for("hub1 failing, hub2 loaded", enough)
    port = next(int(str(e["port"])) for e in daemon.events() if e["event"] == "daemon.metrics_serving")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    config = fed.tmp / "fedload.toml"
    status = fedload("status", "--json", "--config", str(config))
    assert daemon.stop() == 0
    wrong = fed.tmp / "wrong.toml"
    wrong.write_text(text.replace(SECRET, WRONG_SECRET))
    refused = fedload("sync", "--config", str(wrong), "hub2")
    assert "password authentication failed" in refused.stderr, refused
    assert refused.returncode != 0, refused
    errors = guarded.psql("SELECT string_agg(coalesce(error, ''), '|') FROM fedload.runs", dbname="sh")
    assert "nobody" in errors, errors  # the feeder's connection failed, and said so
    return Exposed(
        daemon.log_path.read_text(), errors, status.stdout + status.stderr, metrics, refused.stdout + refused.stderr
    )


def test_a_password_in_a_dsn_is_in_no_log_error_status_or_metric(
    federation: Federation, guarded: LocalCluster, start_daemon: Callable[..., DaemonProcess]
) -> None:
    """Passwords inside the superhub's dsn and a feeder's conninfo, a feeder whose connection fails, a daemon
    logging at debug with worker processes: no password in its log (the workers' lines included), in
    fedload.runs' errors, `fedload status`, /metrics, nor in the error of a sync whose password is wrong."""
    exposed = exposed_by_a_failing_feeder(federation, guarded, start_daemon, None)
    assert '"event": "worker.started"' in exposed.log  # the workers' lines are in the log read
    assert exposed.secrets() == {}


def test_negative_control_a_password_logged_by_a_worker_is_seen(
    federation: Federation, guarded: LocalCluster, start_daemon: Callable[..., DaemonProcess]
) -> None:
    """Negative control: with the dump command lines logged unredacted (in the workers, where the runs are), the
    same check finds the feeder's password in the daemon's log."""
    env = sabotage_environment("passwords-logged", federation.tmp)
    exposed = exposed_by_a_failing_feeder(federation, guarded, start_daemon, env)
    with pytest.raises(AssertionError):
        assert exposed.secrets() == {}
    assert exposed.secrets() == {"log": [FEEDER_SECRET]}
