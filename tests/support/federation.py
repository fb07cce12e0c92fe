"""Helpers for the tests on a superhub with three feeder databases (the fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import pty
import signal
import stat
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fedload.config import Config, parse_config
from fedload.localpg import LocalCluster
from fedload.results import Outcome
from fedload.service.sync import sync_feeders
from fedload.stream import Header, StreamEncoder
from fedload.superhub.job import parents_spec, superhub_target
from fedload.superhub.pipeline import FeederRun
from fedload.superhub.session import prepare_superhub

SCHEMA = """
CREATE TABLE public.hosts (hostkey text NOT NULL, name text, site text DEFAULT 'none', seen timestamptz,
    online boolean, PRIMARY KEY (hostkey));
CREATE TABLE public.contexts (hostkey text NOT NULL, contextname text, tags text[], score integer);
"""
FEEDER_DATA = """
INSERT INTO hosts (hostkey, name, seen, online)
SELECT 'SHA=' || g, E'host ''' || g || E'''\\n;\\t\\\\ x', now() - g * interval '1 minute', g % 3 = 0
FROM generate_series(1, {n}) g;
INSERT INTO contexts SELECT 'SHA=' || (g % {n}), 'ctx' || g, ARRAY['a,b', 'c"d', NULL], g
FROM generate_series(1, {m}) g;
"""
DIGEST = "SELECT count(*) || ':' || coalesce(md5(string_agg({cols}, '|' ORDER BY {cols})), '') FROM {table}"
_names = itertools.count()
AGENT = f"{sys.executable} -m fedload"


@dataclass
class Federation:
    """A superhub database and feeder databases on the test cluster, with a config naming them."""

    cluster: LocalCluster
    superhub: str
    feeders: dict[str, str]
    tmp: Path

    def config(self, **feeder_overrides: Any) -> Config:
        """The configuration; `feeder_overrides` apply to every feeder."""
        schema_file = self.tmp / "schema.sql"
        schema_file.write_text(SCHEMA)
        superhub = {"dsn": self.cluster.dsn(self.superhub), "tables": ["public.*"], "schema_file": str(schema_file)}
        feeders = {
            name: {
                "key": i,
                "transport": "local",
                "database": self.cluster.conninfo(db),
                "pg_dump": self.cluster.install.tool("pg_dump"),
                **feeder_overrides,
            }
            for i, (name, db) in enumerate(self.feeders.items(), start=1)
        }
        return parse_config({"superhub": superhub, "feeders": feeders})

    def digest(self, db: str, table: str, cols: str, where: str = "") -> str:
        """Row count and digest of a table's rows."""
        return self.cluster.psql(DIGEST.format(cols=cols, table=f"{table} {where}"), dbname=db).strip()

    def superhub_sql(self, sql: str) -> str:
        """Run SQL on the superhub; psql's text (for text values)."""
        return self.cluster.psql(sql, dbname=self.superhub).strip()

    def superhub_int(self, sql: str) -> int:
        """The integer (a count) that `sql` selects on the superhub."""
        return psql_int(self.cluster, sql, self.superhub)

    def superhub_bool(self, sql: str) -> bool:
        """The boolean that `sql` selects on the superhub."""
        return psql_bool(self.cluster, sql, self.superhub)


def psql_int(cluster: LocalCluster, sql: str, dbname: str = "postgres") -> int:
    """The integer (a count) that `sql` selects, read from psql's text; NULL or any other text fails."""
    return int(cluster.psql(sql, dbname=dbname))


def psql_bool(cluster: LocalCluster, sql: str, dbname: str = "postgres") -> bool:
    """The boolean that `sql` selects, read from psql's `t` or `f`; NULL or any other text fails."""
    text = cluster.psql(sql, dbname=dbname).strip()
    assert text in ("t", "f"), f"{sql} gave {text!r}, not a boolean"
    return text == "t"


FEEDER_HOSTS = (300, 200, 100)
_feeder_templates: weakref.WeakKeyDictionary[LocalCluster, None] = weakref.WeakKeyDictionary()


def _make_feeder_templates(cluster: LocalCluster) -> None:
    """The feeders' contents, once per cluster: a copy of a filled database costs a third of filling a new one.
    Closed to connections as soon as filled, so autovacuum never analyzes them (each copy starts unanalyzed, as a
    newly filled database would)."""
    for n in FEEDER_HOSTS:
        template = f"feeder_template_{n}"
        cluster.psql(f"CREATE DATABASE {template}")
        cluster.psql(SCHEMA + FEEDER_DATA.format(n=n, m=n * 10), dbname=template)
        cluster.psql(f"ALTER DATABASE {template} ALLOW_CONNECTIONS false")
    _feeder_templates[cluster] = None


def make_federation(cluster: LocalCluster, tmp: Path) -> Federation:
    """A fresh superhub database and three feeder databases with 300, 200 and 100 hosts (copies of templates)."""
    if cluster not in _feeder_templates:
        _make_feeder_templates(cluster)
    suffix = next(_names)
    superhub = f"superhub_{suffix}"
    feeders = {f"hub{i}": f"feeder{i}_{suffix}" for i in range(1, len(FEEDER_HOSTS) + 1)}
    copies = (
        f"CREATE DATABASE {db} TEMPLATE feeder_template_{n};"
        for db, n in zip(feeders.values(), FEEDER_HOSTS, strict=True)
    )
    cluster.psql("\n".join([f"CREATE DATABASE {superhub};", *copies]))
    tmp.chmod(0o755)
    return Federation(cluster, superhub, feeders, tmp)


HOST_COLS = "hostkey || coalesce(name, '') || coalesce(seen::text, '') || coalesce(online::text, '')"
CONTEXT_COLS = "hostkey || contextname || coalesce(tags::text, '') || coalesce(score::text, '')"


def assert_feeders_equal_partitions(fed: Federation, keys: dict[str, int] | None = None) -> None:
    """Every feeder's tables equal its rows on the superhub (row digests)."""
    keys = keys or {name: i for i, name in enumerate(fed.feeders, start=1)}
    for name, key in keys.items():
        db = fed.feeders[name]
        for table, cols in (("hosts", HOST_COLS), ("contexts", CONTEXT_COLS)):
            expected = fed.digest(db, table, cols)
            assert fed.digest(fed.superhub, table, cols, f"WHERE hub_id = {key}") == expected, (name, table)


def config_toml(fed: Federation, *, interval_s: float = 0.5, extra: str = "", agent_command: str = "") -> str:
    """A configuration file for the federation, as an operator would write it."""
    schema = fed.tmp / "schema.sql"
    schema.write_text(SCHEMA)
    lines = [
        'log_level = "info"',
        "[superhub]",
        f'dsn = "{fed.cluster.dsn(fed.superhub)}"',
        'tables = ["public.*"]',
        f'schema_file = "{schema}"',
        "[daemon]",
        "shutdown_grace_s = 1",
    ]
    for key, (name, db) in enumerate(fed.feeders.items(), start=1):
        lines += [
            f"[feeders.{name}]",
            f"key = {key}",
            f"interval_s = {interval_s}",
            'transport = "local"',
            f'database = "{fed.cluster.conninfo(db)}"',
            f'pg_dump = "{fed.cluster.install.tool("pg_dump")}"',
        ]
        if agent_command and name == "hub1":
            lines.append(f'agent_command = ["{agent_command}"]')
    return "\n".join(lines) + "\n" + extra


_databases = itertools.count()


def new_database(cluster: LocalCluster, prefix: str, sql: str = "") -> str:
    """A new database on `cluster`, named `prefix` and a number, with `sql` run in it; its name."""
    name = f"{prefix}_{next(_databases)}"
    cluster.psql(f"CREATE DATABASE {name}")
    if sql:
        cluster.psql(sql, dbname=name)
    return name


async def sync(config: Config, *names: str) -> list[FeederRun]:
    """Sync the named feeders (all if none)."""
    return await sync_feeders(config, list(names) or list(config.feeders))


async def prepare(config: Config) -> None:
    """The (one) superhub of `config` set up as a sync sets it up: fedload's schemas, history, parents."""
    await prepare_superhub(superhub_target(config), parents_spec(config))


def staging_leftovers(fed: Federation) -> int:
    """How many tables are left in fedload's staging schema."""
    return fed.superhub_int("SELECT count(*) FROM pg_tables WHERE schemaname = 'fedload_stage'")


def last_outcome(fed: Federation) -> Outcome:
    """The outcome of the superhub's last recorded run (a value `fedload.runs.outcome` may hold)."""
    return Outcome(fed.superhub_sql("SELECT outcome FROM fedload.runs ORDER BY id DESC LIMIT 1"))


def write_script(path: Path, body: str) -> str:
    """An executable shell script."""
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXOTH | stat.S_IROTH)
    return str(path)


async def failing_after_first_sync(fed: Federation, body: str | None = None, **overrides: Any) -> FeederRun:
    """Sync hub1 once normally, then again with `body` as its dump command (or other overrides); that result."""
    config = fed.config()
    assert (await sync(config, "hub1"))[0].outcome == Outcome.SUCCESS
    before = fed.digest(fed.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1")
    fed.cluster.psql("INSERT INTO hosts (hostkey) VALUES ('new')", dbname=fed.feeders["hub1"])
    if body is not None:
        overrides["agent_command"] = [write_script(fed.tmp / "dump.sh", body)]
    (run,) = await sync(fed.config(**overrides), "hub1")
    assert fed.digest(fed.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1") == before  # old data intact
    assert staging_leftovers(fed) == 0
    assert last_outcome(fed) == Outcome.FAILED
    return run


async def end_process(process: asyncio.subprocess.Process, timeout_s: float = 10) -> None:
    """Kill `process` (a psql holding a lock, a report) if it still runs, and wait for its end."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # ended meanwhile
            process.kill()
    await asyncio.wait_for(process.wait(), timeout_s)


def crafted_stream(dump: bytes, rows: dict[str, int] | None = None, mode: str = "copy") -> bytes:
    """A well-formed fedload stream around `dump`, as a hostile feeder could send it."""
    encoder = StreamEncoder(Header("zstd", mode, "evil", "15", ["public.*"]))
    return encoder.start() + encoder.data(dump) + encoder.finish(pg_dump_exit_status=0, rows=rows or {})


class DaemonProcess:
    """A running `fedload daemon` with its JSON log (`--log-format json`) captured in a file."""

    def __init__(self, config: Path, log: Path, env: dict[str, str] | None = None, *options: str) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fedload", "--log-format", "json", "daemon", "--config", str(config), *options],
            stderr=self._log,
            stdout=self._log,
            env=env,
        )

    def events(self) -> list[dict[str, object]]:
        """The structlog events logged so far."""
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
        """Poll until `predicate()` holds; fail with the log tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            assert self.process.poll() is None, f"daemon exited early: {self.log_path.read_text()[-3000:]}"
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {what}; log tail: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> int:
        """SIGTERM and wait for exit; the exit status. A daemon not gone within 30 s is killed, and the test
        fails with the log's tail (what it was still waiting for)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            tail = self.log_path.read_text()[-3000:]
            pytest.fail(f"the daemon did not stop within 30 s of SIGTERM; log tail: {tail}")

    def close_log(self) -> None:
        """Close the log file handle."""
        self._log.close()


def successes(fed: Federation, feeder: str) -> int:
    """Successful runs of a feeder so far."""
    return fed.superhub_int(f"SELECT count(*) FROM fedload.runs WHERE feeder = '{feeder}' AND outcome = 'success'")


def runs_exist(fed: Federation) -> bool:
    """Whether the daemon has set up its history table yet."""
    return fed.superhub_bool("SELECT to_regclass('fedload.runs') IS NOT NULL")


def fedload(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `python -m fedload ARGS` in a child process with an empty stdin; its exit status and output, as text."""
    return subprocess.run(
        [sys.executable, "-m", "fedload", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def on_terminal(args: list[str], *, stream: str = "stdout", env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run `python -m fedload ARGS` with its stdout (or stderr) on a pseudo-terminal, the other stream discarded;
    its exit status and what the terminal showed."""
    primary, secondary = pty.openpty()
    stdout = secondary if stream == "stdout" else subprocess.DEVNULL
    stderr = secondary if stream == "stderr" else subprocess.DEVNULL
    argv = [sys.executable, "-m", "fedload", *args]
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env) as child:
        os.close(secondary)
        output = b""
        with contextlib.suppress(OSError):  # EIO once the child has closed the terminal
            while chunk := os.read(primary, 4096):
                output += chunk
        status = child.wait(timeout=60)
    os.close(primary)
    return status, output.decode(errors="replace")


def children_running(parent: int, word: str) -> list[int]:
    """The child processes of `parent` whose command line contains `word`."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            ppid = next(line for line in status.read_text().splitlines() if line.startswith("PPid:"))
            argv = (status.parent / "cmdline").read_bytes()
        except (OSError, StopIteration):
            continue
        if int(ppid.split()[1]) == parent and word.encode() in argv:
            pids.append(int(status.parent.name))
    return pids
