"""A binary-mode round of one feeder whose tables did not change, with `skip_unchanged` on and off (#46), and one
where everything changed: CPU-seconds of the superhub's server, the feeder's server (each a cluster of its own:
the postmaster's own and reaped children's times) and of this process with its children (the sync and the agent).

    uv run python bench/unchanged_round.py --rows 300000 --reps 3

Tables as in a CFEngine-like feeder: a large inventory that rarely changes and a small host table. Prints the
minimum over the repetitions of each round's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
from pathlib import Path
from typing import Any

from fedload.config import parse_config
from fedload.localpg import LocalCluster, find_installs
from fedload.results import Outcome
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import sync_feeder

FEEDER = """
CREATE TABLE inventory (hostkey text NOT NULL, name text, version text, arch text, changed timestamptz, size bigint);
INSERT INTO inventory SELECT 'SHA=' || md5(i::text), 'package-' || (i % 5000), (i % 97) || '.' || (i % 13) || '-1',
       CASE WHEN i % 3 = 0 THEN 'amd64' ELSE 'all' END, '2026-01-01'::timestamptz + i * interval '1 second', i * 17
FROM generate_series(1, {rows}) AS i;
CREATE TABLE hosts (hostkey text NOT NULL, lastseen timestamptz);
INSERT INTO hosts SELECT 'SHA=' || md5(i::text), now() FROM generate_series(1, 100) AS i;
"""
SUPERHUB = """
CREATE TABLE inventory (hub_id int NOT NULL, hostkey text NOT NULL, name text, version text, arch text,
                        changed timestamptz, size bigint) PARTITION BY LIST (hub_id);
CREATE INDEX ON inventory (hostkey);
CREATE TABLE hosts (hub_id int NOT NULL, hostkey text NOT NULL, lastseen timestamptz) PARTITION BY LIST (hub_id);
"""
CHANGE_ALL = (
    "UPDATE inventory SET size = size + 1 WHERE hostkey = (SELECT min(hostkey) FROM inventory); "
    "UPDATE hosts SET lastseen = now()"
)


def server_cpu(cluster: LocalCluster) -> float:
    pid = int((cluster.data / "postmaster.pid").read_text().split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def round_cpu(feeder: LocalCluster, superhub: LocalCluster, settings: dict[str, Any]) -> tuple[float, float, float]:
    config = parse_config(
        {
            "superhub": {"dsn": superhub.dsn(), "tables": ["public.inventory", "public.hosts"]},
            "feeders": {"f": settings},
        }
    )
    before = server_cpu(superhub), server_cpu(feeder), own_cpu()
    run = asyncio.run(sync_feeder(feeder_job(config, "f")))
    assert run.outcome == Outcome.SUCCESS, run.error
    after = server_cpu(superhub), server_cpu(feeder), own_cpu()
    return after[0] - before[0], after[1] - before[1], after[2] - before[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    install = find_installs()[15]
    feeder, superhub = LocalCluster(install, name="rfeeder").start(), LocalCluster(install, name="rhub").start()
    try:
        feeder.psql(FEEDER.format(rows=args.rows))
        superhub.psql(SUPERHUB)
        settings = {"key": 1, "transport": "local", "database": feeder.conninfo(), "dump_mode": "binary"}
        settings["pg_dump"] = install.tool("pg_dump")
        today, skipping = {**settings, "skip_unchanged": False}, settings
        for _ in range(3):  # digests and counters stored
            round_cpu(feeder, superhub, skipping)
        rounds: dict[str, list[tuple[float, float, float]]] = {"today": [], "unchanged": [], "all changed": []}
        for _ in range(args.reps):
            rounds["today"].append(round_cpu(feeder, superhub, today))
            rounds["unchanged"].append(round_cpu(feeder, superhub, skipping))
            rounds["unchanged"].append(round_cpu(feeder, superhub, skipping))
            feeder.psql(CHANGE_ALL)
            rounds["all changed"].append(round_cpu(feeder, superhub, skipping))
        print(f"{args.rows:,} + 100 rows, min of {args.reps}; load {os.getloadavg()}")
        for name, measured in rounds.items():
            hub, feed, sync = (min(m[i] for m in measured) for i in range(3))
            print(f"{name:12} superhub server {hub:5.2f}   feeder server {feed:5.2f}   sync+agent {sync:5.2f} CPU-s")
    finally:
        feeder.stop()
        superhub.stop()


if __name__ == "__main__":
    main()
