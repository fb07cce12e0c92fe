"""deploy/fedload.service as shipped, under a real systemd (252, Debian 12 booted in systemd-nspawn: these machines
do not boot systemd), installed as deploy/README.md says (issue 47, item 1).

The module installs once: the wheel and wheelhouse built as "With no internet" writes (on this host, with uv), then
in the container, with its own /usr/bin/python3 (3.11.2), the blocks `offline-install`, `superhub-code` (less its
`python3 -m venv` line), `superhub-key`, `superhub-config` and `superhub-service` run in bash as written, except:
- /path/to/fedload is the checkout copied on this host with its dist/ and wheelhouse/, bound at /srv/fedload;
- `sudo -u postgres ...` makes the superhub's role and database on a cluster of the tests' (this host's, bound into
  the container at /srv/fedload-pg: the container shares the network but not /tmp), made here beforehand;
- `ssh-keyscan` is replaced by a stand-in host key (the local feeder needs none); the "then edit it" of
  fedload.toml installs this test's configuration; `fedload status` may exit 1 (a feeder stale: just started, none
  loaded yet): one local feeder (pg_dump from the container's
  postgresql-client-15) dumping a database of the same cluster, metrics on 127.0.0.1.
The tests then drive the unit with systemctl and read journalctl, as an operator would. Needs root, systemd-nspawn
and debootstrap (.ci/run installs them; the container's tree is built once, minutes, and cached), and what
tests/install/test_deploy_readme.py needs (Debian's python3, uv, PyPI); skipped without, failed in CI.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedload.localpg import LocalCluster
from tests.install import test_deploy_readme
from tests.install.test_deploy_readme import README, Machine, readme_blocks, shlex_quote
from tests.support.federation import FEEDER_DATA, SCHEMA
from tests.support.nspawn import Container, booted, cached_tree, why_not

REPO = Path(__file__).resolve().parents[2]
SUPERHUB_DB = "superhub"
FEEDER_DB = "feeder1"
PG_IN_CONTAINER = "/srv/fedload-pg"
TEST_DIR_IN_CONTAINER = "/srv/fedload-test"
PG_DUMP = "/usr/lib/postgresql/15/bin/pg_dump"  # the container's, from Debian's postgresql-client-15
GRACE_S = 3
WAIT_S = 60.0

requirements = test_deploy_readme.requirements  # the fixture (Debian's python3, uv, PyPI), used by `installed`
# 1800 s: the first run builds the container's tree; PostgreSQL 15: the major of the container's pg_dump
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.pg_major(15)]


@dataclass(frozen=True)
class Installed:
    """The booted container with fedload installed and its unit started; the superhub's cluster; the directory
    bound at /srv/fedload-test (configurations to install); the metrics port."""

    container: Container
    cluster: LocalCluster
    test_dir: Path
    metrics_port: int
    readme_output: str

    def superhub_int(self, sql: str) -> int:
        return int(self.cluster.psql(sql, dbname=SUPERHUB_DB))

    def show(self, *properties: str) -> dict[str, str]:
        """`systemctl show fedload`'s values of `properties`."""
        text = self.container.output(f"systemctl show fedload -p {','.join(properties)}")
        return dict(line.split("=", 1) for line in text.splitlines())

    def journal(self, *options: str) -> str:
        """`journalctl -u fedload` with `options` (e.g. `-p err`), without journalctl's "-- No entries --"."""
        return self.container.output(f"journalctl -q --no-pager -u fedload {' '.join(options)}")

    def install_config(self, text: str) -> None:
        """Make `text` the daemon's /etc/fedload/fedload.toml (as root: `install` keeps it readable by fedload)."""
        (self.test_dir / "next.toml").write_text(text)
        self.container.output(f"install -m 0640 -g fedload {TEST_DIR_IN_CONTAINER}/next.toml /etc/fedload/fedload.toml")


def config_toml(cluster: LocalCluster, metrics_port: int, *, failing_feeder: bool = False) -> str:
    """The test's fedload.toml as the container sees it: the superhub as role fedload over the bound socket, one
    local feeder (and one whose database does not exist)."""
    socket_dsn = f"host={PG_IN_CONTAINER} port={cluster.port}"
    lines = [
        'log_level = "info"',
        "[superhub]",
        f'dsn = "postgresql://fedload@/{SUPERHUB_DB}?host={PG_IN_CONTAINER}&port={cluster.port}"',
        'tables = ["public.*"]',
        'schema_file = "/etc/fedload/schema.sql"',
        "[daemon]",
        f"shutdown_grace_s = {GRACE_S}",
        f'metrics_listen = "127.0.0.1:{metrics_port}"',
    ]
    feeders = {"hub1": FEEDER_DB, **({"hub2": "no_such_database"} if failing_feeder else {})}
    for key, (name, database) in enumerate(feeders.items(), start=1):
        lines += [f"[feeders.{name}]", f"key = {key}", "interval_s = 2", 'transport = "local"']
        lines += [f'database = "{socket_dsn} user=postgres dbname={database}"', f'pg_dump = "{PG_DUMP}"']
    return "\n".join(lines) + "\n"


def in_container(line: str) -> str:
    """A README line as this test runs it in the container (see the module docstring)."""
    if line.startswith("sudo -u postgres "):
        return f"echo {shlex_quote(f'SKIPPED (the superhub is a cluster of the tests): {line}')}"
    if line.startswith("ssh-keyscan "):
        known = (
            "echo \"hub-eu1.example.com $(cut -d' ' -f1,2 /etc/fedload/id_ed25519.pub)\" >> /etc/fedload/known_hosts"
        )
        return f"echo {shlex_quote(f'SKIPPED (the network; a stand-in host key): {line}')}; {known}"
    line = re.sub(r"(?<![\w/.-])/path/to/fedload(?![\w-])", "/srv/fedload", line)
    if line.startswith("cd /var/lib/fedload && sudo -u fedload fedload status"):
        line = line.replace(" status ", " status || [ $? = 1 ] ", 1)  # 1: a feeder is stale (none loaded yet)
    if "# then edit it" in line:
        test = TEST_DIR_IN_CONTAINER
        line += (
            f"\ninstall -m 0640 -g fedload {test}/fedload.toml /etc/fedload/fedload.toml"
            f"\ninstall -m 0644 {test}/schema.sql /etc/fedload/schema.sql"
        )
    return line


def run_blocks(container: Container, lines: list[str]) -> str:
    script = "set -euo pipefail\n" + "\n".join(in_container(line) for line in lines) + "\n"
    done = container.run(script, timeout_s=600, check=False)
    if done.returncode != 0:
        journal = container.run("journalctl -q --no-pager -n 40 -u fedload", check=False).stdout
        pytest.fail(f"exit {done.returncode}:\n{script}\n---\n{(done.stdout + done.stderr)[-4000:]}\n---\n{journal}")
    return done.stdout + done.stderr


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def tree() -> Path:
    """The container's Debian tree (built and cached at the first run); skipped where no container can boot."""
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    return cached_tree()


@pytest.fixture(scope="module")
def superhub_cluster(cluster: LocalCluster) -> LocalCluster:
    """The module's cluster with README's role and database (`createuser fedload`, `createdb -O fedload`) and the
    feeder's database, its socket directory enterable by the container's user fedload."""
    cluster.psql(f"CREATE ROLE fedload LOGIN; CREATE DATABASE {SUPERHUB_DB} OWNER fedload; CREATE DATABASE {FEEDER_DB}")
    cluster.psql(SCHEMA + FEEDER_DATA.format(n=50, m=200), dbname=FEEDER_DB)
    Path(cluster.dir).chmod(0o711)  # the socket is 0777; the directory was the server user's alone
    return cluster


@pytest.fixture(scope="module")
def installed(
    tree: Path, superhub_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, requirements: None
) -> Iterator[Installed]:
    """fedload installed in a booted container as deploy/README.md says, its unit enabled and started."""
    top = tmp_path_factory.mktemp("systemd")
    machine = Machine(top / "root", top / "fedload")
    (machine.root / "etc").mkdir(parents=True)
    ignored = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*_cache", ".hypothesis", "dist", "wheelhouse")
    shutil.copytree(REPO, machine.checkout, ignore=ignored)
    blocks = readme_blocks()
    machine.run(blocks["offline-build"], connected=True)
    test_dir = top / "test"
    test_dir.mkdir()
    metrics_port = free_port()
    (test_dir / "fedload.toml").write_text(config_toml(superhub_cluster, metrics_port))
    (test_dir / "schema.sql").write_text(SCHEMA)
    binds = {"/srv/fedload": machine.checkout, TEST_DIR_IN_CONTAINER: test_dir, PG_IN_CONTAINER: superhub_cluster.dir}
    with booted(tree, binds=binds, log=top / "nspawn.log") as container:
        step1 = [line for line in blocks["superhub-code"] if not line.startswith("python3 -m venv ")]
        install = blocks["offline-install"] + step1 + blocks["superhub-key"] + blocks["superhub-config"]
        output = run_blocks(container, install)
        output += run_blocks(container, blocks["superhub-service"])
        yield Installed(container, superhub_cluster, test_dir, metrics_port, output)
    shutil.rmtree(top)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
        return text


def successes(installed: Installed, feeder: str = "hub1") -> int:
    sql = f"SELECT count(*) FROM fedload.runs WHERE feeder = '{feeder}' AND outcome = 'success'"
    return installed.superhub_int(f"SELECT CASE WHEN to_regclass('fedload.runs') IS NULL THEN 0 ELSE ({sql}) END")


def test_the_unit_starts_as_the_readme_says(installed: Installed) -> None:
    """`systemctl enable --now` returns with the unit active (Type=notify: after READY=1), check-config and
    status as written work, the local feeder loads, the metrics answer, and the journal has no warning or error
    (a first start warned `relation "fedload.runs" does not exist`); a restart returns once the daemon is ready
    (systemd's "Started" follows the daemon's last line before READY=1)."""
    output = installed.readme_output
    assert re.search(r"configuration /etc/fedload/fedload.toml \([^)]*\): OK \(1 feeder", output), output
    assert "SKIPPED (the superhub is a cluster of the tests)" in output
    assert "home = /usr/bin" in installed.container.output("cat /opt/fedload/pyvenv.cfg")
    assert "3.11.2" in installed.container.output("/opt/fedload/bin/python --version")
    state = installed.show("ActiveState", "SubState", "Type", "NRestarts", "StatusText")
    assert state["ActiveState"] == "active", state
    assert state["Type"] == "notify"
    assert state["NRestarts"] == "0"
    wait_for("a run of hub1", lambda: successes(installed) >= 1)
    assert installed.superhub_int("SELECT count(*) FROM public.hosts WHERE hub_id = 1") == 50
    metrics = scrape(installed.metrics_port)
    assert 'fedload_runs_total{feeder="hub1",outcome="success"}' in metrics
    assert "fedload_superhub_up 1.0" in metrics
    assert installed.show("StatusText")["StatusText"] == "scheduling 1 feeder"
    assert installed.journal("-p", "warning") == ""
    assert '"event": "daemon.started"' in installed.journal("-p", "info")
    installed.container.output("systemctl restart fedload")
    assert installed.show("ActiveState")["ActiveState"] == "active"
    lines = installed.journal("-o", "cat", "-n", "30").splitlines()
    serving = max(i for i, line in enumerate(lines) if '"daemon.metrics_serving"' in line)  # just before READY=1
    assert any(line.startswith("Started fedload.service") for line in lines[serving:]), lines


def test_reload_applies_a_valid_file_and_refuses_an_invalid_one(installed: Installed) -> None:
    """`systemctl reload` with a second feeder (failing: its database does not exist) applies it: the status says
    so and the feeder's failure is in the journal at warning priority. With an invalid file the reload fails,
    `journalctl -p err` says why (check-config's line), and the daemon keeps running on the file before."""
    container, main_pid = installed.container, installed.show("MainPID")["MainPID"]
    installed.install_config(config_toml(installed.cluster, installed.metrics_port, failing_feeder=True))
    container.output("systemctl reload fedload")
    wait_for("the new status", lambda: installed.show("StatusText")["StatusText"] == "scheduling 2 feeders")
    wait_for("hub2's failure", lambda: '"daemon.feeder_failed"' in installed.journal("-p", "warning"))
    warnings = installed.journal("-p", "warning..warning", "-o", "cat").splitlines()  # priority 4 only
    assert [line for line in warnings if "daemon.feeder_failed" in line and '"hub2"' in line], warnings
    assert installed.journal("-p", "err") == ""  # a failing feeder is a warning: it is retried
    installed.install_config("[superhub]\nbogus_key = 1\n")
    refused = container.run("systemctl reload fedload", check=False)
    assert refused.returncode != 0
    errors = installed.journal("-p", "err", "-o", "cat")
    assert "fedload: /etc/fedload/fedload.toml: superhub.bogus_key: unknown key" in errors, errors
    state = installed.show("ActiveState", "MainPID", "StatusText")
    assert (state["ActiveState"], state["MainPID"]) == ("active", main_pid)
    before = successes(installed)
    wait_for("more runs of hub1", lambda: successes(installed) > before)
    installed.install_config(config_toml(installed.cluster, installed.metrics_port))
    container.output("systemctl reload fedload")
    wait_for("one feeder again", lambda: installed.show("StatusText")["StatusText"] == "scheduling 1 feeder")


def test_stop_mid_dump_ends_within_the_grace_period(installed: Installed) -> None:
    """`systemctl stop` while hub1's pg_dump waits on a lock ends in the daemon's grace period (well within
    TimeoutStopSec), cleanly (no SIGKILL, no timeout), with no run left 'running' in fedload.runs."""
    psql = [
        installed.cluster.install.tool("psql"),
        "-X",
        "-h",
        installed.cluster.host,
        "-p",
        str(installed.cluster.port),
    ]
    holder = subprocess.Popen(
        [*psql, "-U", "postgres", "-d", FEEDER_DB, "-c", "BEGIN; LOCK TABLE public.hosts; SELECT pg_sleep(120)"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        blocked = f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{FEEDER_DB}' AND wait_event_type = 'Lock'"
        wait_for("hub1's dump blocked", lambda: int(installed.cluster.psql(blocked)) >= 1)
        started = time.monotonic()
        installed.container.output("systemctl stop fedload", timeout_s=300)
        seconds = time.monotonic() - started
    finally:
        holder.terminate()
        holder.wait(30)
    state = installed.show("ActiveState", "Result", "TimeoutStopUSec")
    assert state["ActiveState"] == "inactive"
    assert state["Result"] == "success", state
    assert seconds < GRACE_S + 15, seconds
    assert installed.superhub_int("SELECT count(*) FROM fedload.runs WHERE outcome = 'running'") == 0
    assert "SIGKILL" not in installed.journal()


def test_the_watchdog_keeps_a_pinging_daemon_alive(installed: Installed) -> None:
    """With WatchdogSec shortened to 2 s (a drop-in), the daemon's WATCHDOG=1 pings keep it running past several
    intervals: same main process, no watchdog timeout in the journal."""
    container = installed.container
    dropin = "/etc/systemd/system/fedload.service.d/watchdog.conf"
    container.output(f"mkdir -p {Path(dropin).parent} && printf '[Service]\\nWatchdogSec=2\\n' > {dropin}")
    container.output("systemctl daemon-reload && systemctl restart fedload")
    try:
        state = installed.show("MainPID", "WatchdogUSec")
        assert state["WatchdogUSec"] == "2s"
        time.sleep(7)
        after = installed.show("ActiveState", "MainPID", "NRestarts")
        assert (after["ActiveState"], after["MainPID"], after["NRestarts"]) == ("active", state["MainPID"], "0")
        assert "Watchdog timeout" not in installed.journal()
    finally:
        container.output(f"rm {dropin} && systemctl daemon-reload")  # the shipped WatchdogSec for the next start


def test_the_hardening_holds(installed: Installed) -> None:
    """The daemon runs as user fedload with no capabilities, no new privileges and a seccomp filter; systemd 252's
    `systemd-analyze verify` has nothing to say of the unit, and `systemd-analyze security` rates it as
    deploy/README.md says."""
    container = installed.container
    pid = installed.show("MainPID")["MainPID"]
    status = dict(
        line.split(":", 1) for line in container.output(f"cat /proc/{pid}/status").splitlines() if ":" in line
    )
    uid = container.output("id -u fedload").strip()
    assert status["Uid"].split()[0] == uid
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"
    assert int(status["CapEff"], 16) == int(status["CapBnd"], 16) == 0
    verified = container.run("systemd-analyze verify /etc/systemd/system/fedload.service")
    assert verified.stdout + verified.stderr == ""  # no unknown setting, no missing executable
    rating = container.output("systemd-analyze security fedload --no-pager")
    score = re.search(r"Overall exposure level for fedload\.service: (\d+\.\d+) (\w+)", rating)
    assert score is not None, rating
    noted = re.search(r"`systemd-analyze security fedload`[^`]*?(\d+\.\d+) \((\w+)\)", README.read_text())
    assert noted is not None, "deploy/README.md notes no `systemd-analyze security fedload` score"
    assert score.groups() == noted.groups(), rating
