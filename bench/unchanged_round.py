"""Rounds of one feeder with `skip_unchanged` on and off (#46), in any dump mode: CPU-seconds of the superhub's
server and of the sync (this process: fedload's own Python on the superhub's side), and of the feeder's server
(each server a cluster of its own: the postmaster and its backends, living or reaped).

    uv run python bench/unchanged_round.py --rows 300000 --reps 3 [--mode copy] [--rounds today,cfengine]

Tables as in a CFEngine-like feeder: a large software inventory that rarely changes (80% of the rows), a table of
contexts that changes every cycle (20%) and a small host table. Rounds, each repetition in this order:

- today: `skip_unchanged = false`, every table sent (the cost of a round before #46);
- unchanged: nothing changed, every table kept (two rounds, the second counted: after a round that changed
  everything, the content digest's first round computes the digests the second keeps by; the identity proof's
  first round keeps already);
- cfengine: one row of contexts and every host changed, the inventory kept (80% of the rows unchanged);
- all changed: one row of every table changed, every table sent.

Prints the minimum over the repetitions of each round's CPU, and the superhub's (server + sync) against today's.
The agent runs as a warm local process, whose CPU is not counted here (see bench/digest_cost.py for the feeder's
cost of a digest). Run with another tree's interpreter (`TREE/.venv/bin/python bench/unchanged_round.py --rounds
today` from that tree) to measure its round of today, or this interpreter with that tree first on the path
(`cd TREE && PYTHONPATH=TREE python bench/unchanged_round.py`: the agents it starts inherit it) for all its rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
from typing import Any

import common

from fedload.config import parse_config
from fedload.localpg import LocalCluster, find_installs
from fedload.results import Outcome
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import sync_feeder

FEEDER = """
CREATE TABLE inventory (hostkey text NOT NULL, name text, version text, arch text, changed timestamptz, size bigint);
INSERT INTO inventory SELECT 'SHA=' || md5(i::text), 'package-' || (i % 5000), (i % 97) || '.' || (i % 13) || '-1',
       CASE WHEN i % 3 = 0 THEN 'amd64' ELSE 'all' END, '2026-01-01'::timestamptz + i * interval '1 second', i * 17
FROM generate_series(1, {inventory}) AS i;
CREATE TABLE contexts (hostkey text NOT NULL, context text, namespace text, changed timestamptz);
INSERT INTO contexts SELECT 'SHA=' || md5((i % 100)::text), 'context_' || i, 'default',
       '2026-01-01'::timestamptz + i * interval '1 second'
FROM generate_series(1, {contexts}) AS i;
CREATE TABLE hosts (hostkey text NOT NULL, lastseen timestamptz);
INSERT INTO hosts SELECT 'SHA=' || md5(i::text), now() FROM generate_series(1, 100) AS i;
"""
SUPERHUB = """
CREATE TABLE inventory (hub_id int NOT NULL, hostkey text NOT NULL, name text, version text, arch text,
                        changed timestamptz, size bigint) PARTITION BY LIST (hub_id);
CREATE INDEX ON inventory (hostkey);
CREATE TABLE contexts (hub_id int NOT NULL, hostkey text NOT NULL, context text, namespace text,
                       changed timestamptz) PARTITION BY LIST (hub_id);
CREATE INDEX ON contexts (hostkey);
CREATE TABLE hosts (hub_id int NOT NULL, hostkey text NOT NULL, lastseen timestamptz) PARTITION BY LIST (hub_id);
"""
TABLES = ["public.inventory", "public.contexts", "public.hosts"]
CHANGE_SOME = (
    "UPDATE contexts SET changed = changed + interval '1 second' WHERE context = 'context_1'; "
    "UPDATE hosts SET lastseen = now()"
)
CHANGE_ALL = (
    "UPDATE contexts SET changed = changed + interval '1 second' WHERE context = 'context_1'; "
    "UPDATE hosts SET lastseen = now(); "
    "UPDATE inventory SET size = size + 1 WHERE hostkey = (SELECT min(hostkey) FROM inventory)"
)
Measured = dict[str, tuple[float, float, float]]  # a round's CPU (superhub server, sync, feeder server) by name
ROUNDS = ("today", "unchanged", "cfengine", "all changed")


def server_cpu(cluster: LocalCluster) -> float:
    """CPU-seconds of the cluster's postmaster and every backend, living (a kept superhub session) or reaped."""
    return common.tree_cpu_seconds(int((cluster.data / "postmaster.pid").read_text().split()[0]))


def own_cpu() -> float:
    """This process's CPU: the sync, its threads included (not the warm agents, children of its agent zygote)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def round_cpu(feeder: LocalCluster, superhub: LocalCluster, settings: dict[str, Any]) -> tuple[float, float, float]:
    """One sync of the feeder: CPU-seconds of the superhub's server, the sync, the feeder's server."""
    config = parse_config({"superhub": {"dsn": superhub.dsn(), "tables": TABLES}, "feeders": {"f": settings}})
    before = server_cpu(superhub), own_cpu(), server_cpu(feeder)
    run = asyncio.run(sync_feeder(feeder_job(config, "f")))
    assert run.outcome == Outcome.SUCCESS, run.error
    after = server_cpu(superhub), own_cpu(), server_cpu(feeder)
    return after[0] - before[0], after[1] - before[1], after[2] - before[2]


def repetition(feeder: LocalCluster, superhub: LocalCluster, settings: dict[str, Any], rounds: list[str]) -> Measured:
    """One repetition of the `rounds` asked for, in ROUNDS' order; their CPU by name."""
    today, skipping = {**settings, "skip_unchanged": False}, settings
    measured: Measured = {}
    if "today" in rounds:
        measured["today"] = round_cpu(feeder, superhub, today)
    if "unchanged" in rounds:
        round_cpu(feeder, superhub, skipping)  # the digests computed, where the last round sent every table
        measured["unchanged"] = round_cpu(feeder, superhub, skipping)
    if "cfengine" in rounds:
        feeder.psql(CHANGE_SOME)
        measured["cfengine"] = round_cpu(feeder, superhub, skipping)
    if "all changed" in rounds:
        feeder.psql(CHANGE_ALL)
        measured["all changed"] = round_cpu(feeder, superhub, skipping)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000, help="rows of inventory and contexts (80%% and 20%%)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mode", choices=("binary", "copy", "inserts"), default="binary")
    parser.add_argument("--major", type=int, default=15, help="PostgreSQL major of both clusters")
    parser.add_argument("--rounds", default=",".join(ROUNDS), help=f"of {', '.join(ROUNDS)}; comma-separated")
    args = parser.parse_args()
    rounds = [r for r in ROUNDS if r in args.rounds.split(",")]
    install = find_installs()[args.major]
    feeder, superhub = LocalCluster(install, name="rfeeder").start(), LocalCluster(install, name="rhub").start()
    try:
        feeder.psql(FEEDER.format(inventory=args.rows * 4 // 5, contexts=args.rows // 5))
        superhub.psql(SUPERHUB)
        settings = {"key": 1, "transport": "local", "database": feeder.conninfo(), "dump_mode": args.mode}
        settings["pg_dump"] = install.tool("pg_dump")
        for _ in range(3):  # digests and counters stored
            round_cpu(feeder, superhub, settings)
        runs = [repetition(feeder, superhub, settings, rounds) for _ in range(args.reps)]
        report(args, runs, rounds)
    finally:
        feeder.stop()
        superhub.stop()


def report(args: argparse.Namespace, runs: list[Measured], rounds: list[str]) -> None:
    where = f"{args.mode} mode, PostgreSQL {args.major}, {args.rows:,} + 100 rows"
    print(f"{where}, min of {args.reps}; load {os.getloadavg()}")
    lowest = {name: [min(r[name][i] for r in runs) for i in range(3)] for name in rounds}
    for name, (hub, sync, feed) in lowest.items():
        ratio = f"   superhub {(hub + sync) / sum(lowest['today'][:2]):4.2f}x today" if "today" in lowest else ""
        print(f"{name:12} superhub server {hub:5.2f}   sync {sync:5.2f}   feeder server {feed:5.2f} CPU-s{ratio}")


if __name__ == "__main__":
    main()
