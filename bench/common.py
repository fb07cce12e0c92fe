"""Shared helpers of the benchmark scripts: clusters, CFEngine-like data, sshd on loopback, timing, tables.

Not a test module: the scripts in bench/ import it by name (`import common`), as `python bench/<script>.py` puts
bench/ on sys.path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedload.config import SshConfig
from fedload.localpg import LocalCluster, PgInstall, find_installs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for tests.support.sshd
from tests.support.sshd import SSHD, OpenSshServer

__all__ = [
    "BUSY_NOTE",
    "DATASET_TABLES",
    "MIB",
    "PROMISELOG_SCHEMA",
    "ROWS_PER_HOST",
    "RSS_WRAPPER",
    "SCHEMA_SQL",
    "SSHD",
    "Measured",
    "SshServer",
    "Workspace",
    "add_common_arguments",
    "cpu_seconds",
    "dataset_sql",
    "dump_bytes",
    "fmt_ratio",
    "grow_to_dump_size",
    "machine_line",
    "mb",
    "pg_dump_argv",
    "pick_install",
    "pin_tree",
    "postmaster_pid",
    "print_table",
    "process_tree",
    "promiselog_sql",
    "psql_argv",
    "recorded_usage",
    "rss_wrapped",
    "run_measured",
    "run_shell",
    "shell_output",
    "ssh_feeder_lines",
    "timed",
    "tree_cpu_seconds",
    "verdict",
]

MIB = 1 << 20
BUSY_NOTE = "numbers from one run; on a busy or small machine they are noisy: compare ratios, not absolutes"

# ---------------------------------------------------------------------------------------------------------------
# CFEngine-like data: the tables of a CFEngine Enterprise hub's reporting database (cfdb), with generated rows that
# look like the real ones: SHA= host keys, text with quotes, backslashes, tabs and non-ASCII letters, text[] arrays,
# NULLs, timestamps. Deterministic (md5 of the row number, no random()): the same size always gives the same bytes.
# ---------------------------------------------------------------------------------------------------------------

PROMISELOG_SCHEMA = """
CREATE TABLE public.__promiselog (id bigint NOT NULL, hostkey text NOT NULL, changetimestamp timestamptz,
    policyfile text, releaseid text, promisehash text, namespace text, bundle text, promisetype text,
    promiser text, stackpath text, promisehandle text, promiseoutcome text, logmessages text[], promisees text[]);
"""

SCHEMA_SQL = (
    """
CREATE TABLE public.__hosts (hostkey text NOT NULL, hostname text, ipaddress text, site text DEFAULT 'unknown',
    firstreporttimestamp timestamptz, lastreporttimestamp timestamptz, PRIMARY KEY (hostkey));
CREATE TABLE public.__contexts (hostkey text NOT NULL, contextname text NOT NULL, metatags text[],
    changetimestamp timestamptz);
CREATE TABLE public.__variables (hostkey text NOT NULL, namespace text, bundle text, variablename text,
    variablevalue text, variabletype text, metatags text[], changetimestamp timestamptz);
CREATE TABLE public.__software (hostkey text NOT NULL, softwarename text, softwareversion text,
    softwarearchitecture text, changetimestamp timestamptz);
CREATE TABLE public.__lastseenhosts (hostkey text NOT NULL, lastseendirection text, remotehostkey text,
    remotehostip text, lastseentimestamp timestamptz, lastseeninterval real);
"""
    + PROMISELOG_SCHEMA
)

# Rows per host in each table of the dataset (100 in all, so `rows / 100` hosts make `rows` rows).
DATASET_TABLES = {
    "__hosts": 1,
    "__contexts": 30,
    "__variables": 30,
    "__software": 20,
    "__lastseenhosts": 3,
    "__promiselog": 16,
}
ROWS_PER_HOST = sum(DATASET_TABLES.values())
_HOSTKEY = "'SHA=' || md5('{hub}:' || ({host}))"
_T0 = "timestamptz '2024-05-01 00:00:00+00'"

_PROMISELOG_ROWS = r"""
INSERT INTO public.__promiselog
SELECT g, {hostkey}, {t0} + g * interval '7 seconds',
    '/var/cfengine/inputs/services/' || (ARRAY['main', 'web', 'db', 'ssh'])[1 + g % 4] || '.cf',
    md5('release' || (g / 5000)),
    md5('promise' || (g % 997)),
    'default',
    (ARRAY['cfe_internal_update', 'web_server', 'database', 'sshd_config', 'inventory_linux'])[1 + g % 5],
    (ARRAY['files', 'packages', 'commands', 'processes', 'services', 'vars'])[1 + g % 6],
    CASE g % 4 WHEN 0 THEN '/etc/ssh/sshd_config' WHEN 1 THEN '/var/log/app ' || (g % 100) || '.log'
        WHEN 2 THEN 'apache2' ELSE E'C:\\Program Files\\Cfengine\\bin\\cf-agent.exe' END,
    '/default/main/methods/''' || (ARRAY['web', 'db', 'ssh'])[1 + g % 3] || '''/default/' ||
        (ARRAY['web_server', 'database', 'sshd_config'])[1 + g % 3] || '/files/''/etc/motd''[1]',
    CASE WHEN g % 3 = 0 THEN NULL ELSE 'handle_' || (g % 211) END,
    (ARRAY['KEPT', 'KEPT', 'KEPT', 'REPAIRED', 'NOTKEPT'])[1 + g % 5],
    CASE WHEN g % 5 = 3 THEN ARRAY['Edited file ''/etc/motd'' (' || md5(g::text) || ')',
            {multiline}]
        WHEN g % 5 = 4 THEN ARRAY['Failed to start service "apache2": exit code ' || (g % 7),
            E'Rückgabewert \\ 状態 \t tab']
        ELSE ARRAY['Promise kept, nothing to do']
    END,
    ARRAY['team:ops', 'owner:' || (ARRAY['alice', 'bob', 'chloé'])[1 + g % 3], 'policy, "baseline"']
FROM generate_series({first}, {last}) g;
"""

_DATASET_ROWS = r"""
INSERT INTO public.__hosts
SELECT {hostkey}, 'host-{hub}-' || h || '.example.com', '10.{hub}.' || (h / 250 % 250) || '.' || (h % 250),
    (ARRAY['eu-west', 'us-east', 'ap-south'])[1 + h % 3], {t0} - interval '200 days' + h * interval '1 minute',
    {t0} + (h % 300) * interval '1 second'
FROM generate_series(1, {hosts}) h;
INSERT INTO public.__contexts
SELECT {hostkey}, (ARRAY['linux', 'x86_64', 'debian_12', 'cfengine_3', 'policy_server', 'ipv4_10', 'Monday',
        'Hr12', 'any', 'systemd'])[1 + c % 10] || '_' || c,
    ARRAY['source=agent', 'hardclass', 'inventory,attribute_name=Class ' || c], {t0} + c * interval '1 second'
FROM generate_series(1, {hosts}) h, generate_series(1, 30) c;
INSERT INTO public.__variables
SELECT {hostkey}, 'default', (ARRAY['sys', 'mon', 'inventory_linux'])[1 + v % 3], 'var_' || v,
    CASE v % 4 WHEN 0 THEN 'value of var_' || v || E' with ''quotes'', a \\ backslash and a \t tab'
        WHEN 1 THEN md5(h || ':' || v) WHEN 2 THEN '{{"os": "linux", "cores": ' || (v % 64) || '}}'
        ELSE NULL END,
    (ARRAY['string', 'slist', 'data', 'int'])[1 + v % 4],
    ARRAY['inventory', 'attribute_name=Variable ' || v], {t0} + v * interval '1 minute'
FROM generate_series(1, {hosts}) h, generate_series(1, 30) v;
INSERT INTO public.__software
SELECT {hostkey}, (ARRAY['openssl', 'libc6', 'cfengine-nova', 'nginx', 'postgresql-15'])[1 + s % 5] || '-' || s,
    '1.' || s || '.' || (h % 10) || '-1+deb12u1', 'amd64', {t0} + s * interval '1 hour'
FROM generate_series(1, {hosts}) h, generate_series(1, 20) s;
INSERT INTO public.__lastseenhosts
SELECT {hostkey}, (ARRAY['INCOMING', 'OUTGOING'])[1 + p % 2], 'SHA=' || md5('peer' || p), '10.0.0.' || p,
    {t0} + p * interval '1 second', 300.5
FROM generate_series(1, {hosts}) h, generate_series(1, 3) p;
"""


def promiselog_sql(first: int, last: int, *, hub: int = 1, newlines: bool = True) -> str:
    """INSERT ... SELECT of __promiselog rows number `first`..`last` (16 per host of `hub`)."""
    multiline = r"E'Repaired:\n  line 2 of the log message'" if newlines else "'Repaired: see the log'"
    return _PROMISELOG_ROWS.format(
        hostkey=_HOSTKEY.format(hub=hub, host="1 + (g - 1) / 16"), t0=_T0, first=first, last=last, multiline=multiline
    )


def dataset_sql(rows: int, *, hub: int, newlines: bool = False) -> tuple[str, int]:
    """SQL filling every dataset table for one feeder with about `rows` rows; the SQL and the exact row count."""
    hosts = max(1, math.ceil(rows / ROWS_PER_HOST))
    sql = _DATASET_ROWS.format(hostkey=_HOSTKEY.format(hub=hub, host="h"), hub=hub, hosts=hosts, t0=_T0)
    sql += promiselog_sql(1, hosts * DATASET_TABLES["__promiselog"], hub=hub, newlines=newlines)
    return sql, hosts * ROWS_PER_HOST


# ---------------------------------------------------------------------------------------------------------------
# Clusters, psql, pg_dump
# ---------------------------------------------------------------------------------------------------------------


def pick_install(major: int | None) -> PgInstall:
    """The PostgreSQL install to use: the asked major, else 15 (Debian's), else the oldest found."""
    installs = find_installs()
    if not installs:
        sys.exit("no PostgreSQL server binaries found (install postgresql-15 or run `uv sync`)")
    if major is not None:
        if major not in installs:
            sys.exit(f"PostgreSQL {major} is not installed; found {sorted(installs)}")
        return installs[major]
    return installs.get(15) or installs[min(installs)]


class Workspace:
    """A temporary directory with the clusters and the sshd a benchmark starts; `close()` stops and removes all."""

    def __init__(self, install: PgInstall, *, keep: bool = False) -> None:
        self.install = install
        self.dir = Path(tempfile.mkdtemp(prefix="fedload-bench-"))
        self.dir.chmod(0o755)  # the servers may run as another user and must reach their directories
        self.keep = keep
        self._clusters: list[LocalCluster] = []
        self._sshd: SshServer | None = None

    def cluster(self, name: str) -> LocalCluster:
        """A started cluster."""
        cluster = LocalCluster(self.install, name=name, base_dir=self.dir)
        self._clusters.append(cluster)
        return cluster.start()

    def sshd(self) -> SshServer:
        """The workspace's sshd on loopback (started on first use)."""
        if self._sshd is None:
            directory = self.dir / "sshd"
            directory.mkdir()
            self._sshd = SshServer(directory)
        return self._sshd

    def close(self) -> None:
        """Stop everything started here; remove the directory unless asked to keep it."""
        if self._sshd is not None:
            self._sshd.stop()
        for cluster in self._clusters:
            cluster.stop(remove=not self.keep)
        if self.keep:
            print(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def psql_argv(cluster: LocalCluster, dbname: str, *extra: str) -> list[str]:
    """psql for loading SQL into a database of the cluster: no psqlrc, quiet, stop at the first error."""
    return [
        cluster.install.tool("psql"),
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        *extra,
        "-h",
        cluster.host,
        "-p",
        str(cluster.port),
        "-U",
        "postgres",
        "-d",
        dbname,
    ]


def pg_dump_argv(cluster: LocalCluster, dbname: str, tables: Sequence[str], *, inserts: bool) -> list[str]:
    """pg_dump of the tables' data, as the agent runs it (plain format, COPY or --column-inserts)."""
    mode = ["--column-inserts"] if inserts else []
    return [
        cluster.install.tool("pg_dump"),
        "--data-only",
        "--no-password",
        "--encoding=UTF8",
        *mode,
        *[f"--table={t}" for t in tables],
        f"--dbname={cluster.conninfo(dbname)}",
    ]


def dump_bytes(cluster: LocalCluster, dbname: str, tables: Sequence[str], *, inserts: bool) -> int:
    """Size of the tables' pg_dump output, counted without keeping it."""
    process = subprocess.Popen(pg_dump_argv(cluster, dbname, tables, inserts=inserts), stdout=subprocess.PIPE)
    assert process.stdout is not None
    total = 0
    while chunk := process.stdout.read(MIB):
        total += len(chunk)
    if process.wait() != 0:
        sys.exit("pg_dump failed while measuring the dump size")
    return total


def grow_to_dump_size(
    cluster: LocalCluster, dbname: str, target_bytes: int, *, inserts: bool, newlines: bool = True
) -> int:
    """Fill __promiselog until its pg_dump output is about `target_bytes` (from a sample's bytes per row); rows."""
    sample = 20_000
    cluster.psql(promiselog_sql(1, sample, newlines=newlines), dbname)
    per_row = dump_bytes(cluster, dbname, ["public.__promiselog"], inserts=inserts) / sample
    rows = max(sample, round(target_bytes / per_row))
    step = 500_000
    for first in range(sample + 1, rows + 1, step):
        cluster.psql(promiselog_sql(first, min(rows, first + step - 1), newlines=newlines), dbname)
    cluster.psql("VACUUM (FREEZE, ANALYZE) public.__promiselog", dbname)
    return rows


# ---------------------------------------------------------------------------------------------------------------
# sshd on loopback (after tests/support/sshd.py, without pytest)
# ---------------------------------------------------------------------------------------------------------------


class SshServer(OpenSshServer):
    """The tests' sshd (tests/support/sshd.py), plus the OpenSSH client command lines the baselines use."""

    def __init__(self, directory: Path) -> None:
        if not Path(SSHD).exists():
            sys.exit(f"{SSHD} not found: install openssh-server")
        super().__init__(directory)

    def ssh_config(self, **overrides: object) -> SshConfig:
        """fedload's client settings for this server, with a read timeout for large dumps."""
        return super().ssh_config(**{"read_timeout_s": 120, **overrides})

    def ssh_argv(self) -> list[str]:
        """The OpenSSH client command line for this server (default ciphers), before the remote command."""
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-p",
            str(self.port),
            "-i",
            str(self.client_key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            f"{self.user}@127.0.0.1",
        ]

    def remote(self, pipeline: str) -> str:
        """A shell snippet running the bash `pipeline` (with pipefail) on the "feeder" over this server."""
        remote_command = shlex.join(["bash", "-o", "pipefail", "-c", pipeline])
        return f"{shlex.join(self.ssh_argv())} {shlex.quote(remote_command)}"


def tree_environment(tree: Path | None) -> dict[str, str]:
    """This process's environment, with `tree` (another checkout) first on PYTHONPATH where given: this
    interpreter then imports that tree's fedload, as do the children started with it."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def ssh_feeder_lines(section: str, ssh: SshConfig) -> list[str]:
    """The fedload.toml lines of feeder `section`'s `[feeders.<section>.ssh]` table, reaching it through `ssh`."""
    return [
        f"[feeders.{section}.ssh]",
        f"host = {json.dumps(ssh.host)}",
        f"port = {ssh.port}",
        f"user = {json.dumps(ssh.user)}",
        f"identity = {json.dumps(str(ssh.identity))}",
        f"known_hosts = {json.dumps(str(ssh.known_hosts))}",
    ]


# ---------------------------------------------------------------------------------------------------------------
# Running and timing
# ---------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def timed() -> Iterator[Callable[[], float]]:
    """`with timed() as elapsed:` ... `elapsed()` gives the seconds of the block (frozen at its end)."""
    started = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - started
    end.append(time.perf_counter())


def shell_output(script: str) -> tuple[float, str]:
    """Run a bash pipeline (pipefail): its wall seconds and stdout; exit with its stderr if it fails."""
    with timed() as elapsed:
        result = subprocess.run(["bash", "-o", "pipefail", "-c", script], capture_output=True, check=False)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {script}\n{result.stderr.decode(errors='replace')[-2000:]}")
    return elapsed(), result.stdout.decode(errors="replace")


def run_shell(script: str) -> float:
    """Run a bash pipeline (pipefail); its wall seconds."""
    return shell_output(script)[0]


@dataclass(frozen=True, slots=True)
class Measured:
    """A finished child process: exit status, wall seconds, peak RSS (KiB) and CPU seconds (user + system), both of
    it and its waited-for children."""

    status: int
    seconds: float
    max_rss_kib: int
    cpu_s: float
    stdout: bytes


def run_measured(argv: Sequence[str], *, stderr: Path | None = None, cwd: Path | None = None) -> Measured:
    """Run a command (in `cwd`); wall time, its own peak RSS and CPU time (wait4: other children of ours do not
    count)."""
    err = stderr.open("wb") if stderr else subprocess.DEVNULL
    try:
        with timed() as elapsed:
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, cwd=cwd)
            assert process.stdout is not None
            out = process.stdout.read()
            _, wait_status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(wait_status)  # reaped here, not by Popen
        process.stdout.close()
    finally:
        if not isinstance(err, int):
            err.close()
    return Measured(process.returncode, elapsed(), int(usage.ru_maxrss), usage.ru_utime + usage.ru_stime, out)


# An agent_command prefix: runs the agent as a child, then appends "<peak RSS KiB> <CPU s>" of the agent and its
# children (pg_dump) as one line to a file.
RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "status = subprocess.call(sys.argv[2:])\n"
    "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "with open(sys.argv[1], 'a') as out:\n"
    "    out.write(f'{usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}\\n')\n"
    "sys.exit(status)\n"
)


def rss_wrapped(record: Path, argv: Sequence[str]) -> list[str]:
    """`argv` run under RSS_WRAPPER, which appends its peak RSS and CPU time to `record`."""
    return [sys.executable, "-c", RSS_WRAPPER, str(record), *argv]


def recorded_usage(record: Path) -> tuple[int, float]:
    """What RSS_WRAPPER recorded: the largest peak RSS (KiB) and the total CPU seconds; zeros if nothing."""
    lines = [line.split() for line in record.read_text().splitlines()] if record.exists() else []
    return max((int(rss) for rss, _ in lines), default=0), sum(float(cpu) for _, cpu in lines)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------------------------
# Processes: trees, CPU accounting from /proc, CPU affinity
# ---------------------------------------------------------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def process_tree(pid: int) -> list[int]:
    """`pid` and its living descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(current := todo.pop())
        todo += children.get(current, [])
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process tree so far: utime+stime+cutime+cstime (fields 14-17 of /proc/PID/stat) of `pid`
    and of each living descendant. cutime/cstime hold the CPU of children already reaped (a server's exited
    backends), so the difference of two readings is the tree's CPU in between, exited processes included."""
    total = 0
    for member in process_tree(pid):
        if (fields := _stat_fields(member)) is not None:
            total += sum(int(f) for f in fields[11:15])
    return total / _CLK_TCK


def cpu_busy_seconds() -> dict[str, float]:
    """Each CPU's busy seconds since boot (/proc/stat: all but idle and iowait), by its number as a string."""
    busy = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            ticks = [int(field) for field in fields]
            busy[name[3:]] = (sum(ticks[:8]) - ticks[3] - ticks[4]) / _CLK_TCK
    return busy


def pin_tree(pid: int, cpus: str) -> None:
    """Set the CPU affinity of a running process tree (every thread: `taskset -a -p`); children forked later
    inherit it (a postmaster's new backends, an sshd's new sessions)."""
    for member in process_tree(pid):
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(member)], capture_output=True, check=False)


def postmaster_pid(cluster: LocalCluster) -> int:
    """The pid of a running cluster's postmaster (first line of postmaster.pid)."""
    return int((cluster.data / "postmaster.pid").read_text().split()[0])


# ---------------------------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------------------------


def mb(n_bytes: float) -> float:
    """Bytes in MB (10^6, as throughput is usually quoted)."""
    return n_bytes / 1e6


def fmt_ratio(value: float) -> str:
    """A ratio as `12.3x`."""
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def verdict(ok: bool) -> str:
    """Met / missed, for the target column."""
    return "met" if ok else "MISSED"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain aligned table (first column left-aligned, the rest right-aligned)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    print(f"\n{title}")
    print(line(cells[0]))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print(line(row))


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every script has."""
    parser.add_argument("--pg-major", type=int, metavar="N", help="PostgreSQL major to use (default 15, else oldest)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (clusters stopped)")


def machine_line() -> str:
    """One line describing where the numbers come from."""
    load = os.getloadavg()[0]
    return f"machine: {os.cpu_count()} CPUs, load average {load:.2f} at start; python {sys.version.split()[0]}"
