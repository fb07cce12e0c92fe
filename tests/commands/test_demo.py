"""`fedload demo` ends with next steps that work: with --keep they run as printed, `demo --stop` ends them."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from fedload.localpg import find_installs
from tests.support.federation import fedload


def _run(command: str) -> subprocess.CompletedProcess[str]:
    """A printed command line, run as a shell would (psql given a query on stdin)."""
    return subprocess.run(
        shlex.split(command),
        input="SELECT count(*) FROM __hosts",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_kept_demo_prints_commands_that_work_and_stops() -> None:
    """With --keep: status, sync and psql run as printed; `demo --stop DIR` stops the clusters and removes DIR."""
    assert find_installs(), "no PostgreSQL server binaries found"
    demo = fedload("demo", "--keep", "--hosts", "5", timeout_s=300)
    assert demo.returncode == 0, demo.stderr
    base = Path(re.findall(r"Kept running in (\S+)\. Next steps:", demo.stdout)[0])
    try:
        found = re.findall(r"^  (.+?)    # (.+)$", demo.stdout, flags=re.MULTILINE)
        steps = {what: command.strip() for command, what in found}
        assert list(steps) == [
            "each feeder's last sync",
            "sync again",
            "query the superhub",
            "stop the clusters and remove the directory",
        ]
        status = _run(steps["each feeder's last sync"])
        assert status.returncode == 0, status.stderr
        assert [line.split("\t")[0] for line in status.stdout.splitlines()[2:]] == ["hub1", "hub2", "hub3"]
        assert _run(steps["sync again"]).returncode == 0
        psql = _run(steps["query the superhub"])
        assert psql.returncode == 0, psql.stderr
        assert psql.stdout.split() == ["count", "-------", "30", "(1", "row)"]  # 5 + 10 + 15 hosts
        stop = _run(steps["stop the clusters and remove the directory"])
    finally:
        if base.exists():
            fedload("demo", "--stop", str(base), timeout_s=300)
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout == f"stopped 4 clusters and removed {base}\n"
    assert not base.exists()
    again = fedload("demo", "--stop", str(base), timeout_s=300)
    assert again.returncode == 2
    assert again.stderr == f"fedload: {base} is not a directory kept by `fedload demo --keep`; nothing was stopped\n"


def test_demo_without_keep_prints_no_commands_that_cannot_work() -> None:
    """Without --keep the clusters are gone, and the demo prints no command that needs them."""
    demo = fedload("demo", "--hosts", "5", timeout_s=300)
    assert demo.returncode == 0, demo.stderr
    assert "psql" not in demo.stdout
    assert "--config" not in demo.stdout
    assert demo.stdout.rstrip().endswith("demo --keep")


def test_kept_demo_with_shards() -> None:
    """`demo --shards 2 --keep`: feeders on two shards, status shows them, the coordinator's plan of its counts shows
    the shards scanned at once, each aggregating its own rows; psql on "superhub" reads the coordinator; a plain
    `feeder move` there warns of no stray partitions."""
    demo = fedload("demo", "--keep", "--hosts", "5", "--shards", "2", timeout_s=300)
    assert demo.returncode == 0, demo.stderr
    base = Path(re.findall(r"Kept running in (\S+)\. Next steps:", demo.stdout)[0])
    try:
        steps = {what: command.strip() for command, what in re.findall(r"^  (.+?)    # (.+)$", demo.stdout, re.M)}
        status = _run(steps["each feeder's last sync"] + " --json")
        assert status.returncode == 0, status.stderr
        plan = demo.stdout.split("Its plan", 1)[1].split("Drift handled", 1)[0]
        for table in ("__hosts", "__agentstatus", "__contexts"):  # each shard aggregates its own rows, at once
            for shard in ("s1", "s2"):
                assert f'Relations: Aggregate on (fedload_shards."public.{table}@{shard}"' in plan, plan
        assert plan.count("Async Foreign Scan") == 6, plan
        assert [(s["feeder"], s["shard"]) for s in json.loads(status.stdout)] == [
            ("hub1", "s1"),
            ("hub2", "s2"),
            ("hub3", "s1"),
        ]
        psql = _run(steps["query the superhub"])
        assert psql.stdout.split() == ["count", "-------", "30", "(1", "row)"], psql.stderr  # through both shards
        config = shlex.split(steps["each feeder's last sync"])[-1]
        moved = fedload("feeder", "move", "hub1", "--to", "s2", "--config", config, timeout_s=300)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "stray_partitions" not in moved.stderr, moved.stderr  # nothing stray in a plain move
    finally:
        fedload("demo", "--stop", str(base), timeout_s=300)
    assert (
        fedload("demo", "--shards", "4", timeout_s=300).stderr
        == "fedload: --shards 4: the demo's three feeders fill 1 to 3 shards\n"
    )
