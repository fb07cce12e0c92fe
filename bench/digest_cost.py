"""The feeder's cost of a table's content digest (#46) against dumping the same table: CPU-seconds of the feeder's
server (the postmaster's own and reaped children's times, so the backend's) and of the client program, per way:

- identity: the agent's tuple-identity proof (fedload/feeder/digest.py, `identity_query`) run by psql;
- identity, text: the same proof as PostgreSQL 11 and 12 take it (hashtextextended of the identities' text);
- content digest: the agent's content digest (`content_query`), the proof of tables the identities cannot prove;
- binary copy: the binary mode's `\\copy (SELECT cols FROM ONLY t) TO ... (FORMAT binary)`;
- pg_dump: `pg_dump --data-only --table=t` (copy mode's dump), output to /dev/null.

    uv run python bench/digest_cost.py --rows 1000000 --reps 3

Prints the minimum over the repetitions of each way's server and client CPU, and the digest's share of each dump.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import time
from pathlib import Path

from fedload.feeder.binary_plan import TablePlan, quote_ident
from fedload.feeder.digest import content_query, identity_query
from fedload.localpg import LocalCluster, find_installs

TABLE = """
CREATE TABLE inventory (hostkey text NOT NULL, name text, version text, arch text, changed timestamptz,
                        size bigint, note text);
INSERT INTO inventory SELECT 'SHA=' || md5(i::text), 'package-' || (i % 5000), (i % 97) || '.' || (i % 13) || '-1',
       CASE WHEN i % 3 = 0 THEN 'amd64' ELSE 'all' END, '2026-01-01'::timestamptz + i * interval '1 second',
       i * 17, CASE WHEN i % 10 = 0 THEN NULL ELSE repeat('x', i % 40) END
FROM generate_series(1, {rows}) AS i;
VACUUM ANALYZE inventory;
"""
COLUMNS = ("hostkey", "name", "version", "arch", "changed", "size", "note")


def server_cpu(cluster: LocalCluster) -> float:
    """CPU-seconds of the postmaster and its reaped children (the backends that ended)."""
    pid = int((cluster.data / "postmaster.pid").read_text().split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def children(cluster: LocalCluster) -> set[str]:
    """The postmaster's child processes now."""
    pid = int((cluster.data / "postmaster.pid").read_text().split()[0])
    return set(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())


def measured(cluster: LocalCluster, argv: list[str]) -> tuple[float, float]:
    """Server and client CPU-seconds of running `argv` (its output discarded), once the backend it used has been
    reaped (a backend ends after its client: read too early, its CPU would count in the next way's)."""
    before = children(cluster)
    server, client = server_cpu(cluster), client_cpu()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10.0
    while not children(cluster) <= before and time.monotonic() < deadline:
        time.sleep(0.01)
    return server_cpu(cluster) - server, client_cpu() - client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--major", type=int, default=15)
    args = parser.parse_args()
    install = find_installs()[args.major]
    cluster = LocalCluster(install, name="digestcost").start()
    try:
        cluster.psql(TABLE.format(rows=args.rows))
        psql, pg_dump = install.tool("psql"), install.tool("pg_dump")
        conn = cluster.conninfo()
        plan = TablePlan("public", "inventory", COLUMNS, binary=True, reason="", unsent=())
        columns = ", ".join(map(quote_ident, COLUMNS))
        copy = f"\\copy (SELECT {columns} FROM ONLY public.inventory) TO /dev/null (FORMAT binary)"  # noqa: S608 - our names
        xmax = int(cluster.psql("SELECT txid_snapshot_xmax(txid_current_snapshot())").strip())
        identity = identity_query(plan, xmax, args.major)
        with_text = identity_query(plan, xmax, 12)
        ways = {
            "identity": [psql, "-X", "-q", "-d", conn, "-c", identity],
            "identity, text": [psql, "-X", "-q", "-d", conn, "-c", with_text],
            "content digest": [psql, "-X", "-q", "-d", conn, "-c", content_query(plan)],
            "binary copy": [psql, "-X", "-q", "-d", conn, "-c", copy],
            "pg_dump": [pg_dump, "--data-only", "--table=public.inventory", "-d", conn, "-f", "/dev/null"],
        }
        best = {way: min((measured(cluster, argv) for _ in range(args.reps)), key=sum) for way, argv in ways.items()}
        size = cluster.psql("SELECT pg_size_pretty(pg_total_relation_size('inventory'))").strip()
        print(f"{args.rows:,} rows ({size}), PostgreSQL {args.major}, min of {args.reps}; load: {os.getloadavg()}")
        for way, (server, client) in best.items():
            print(f"{way:14} server {server:6.2f} CPU-s   client {client:6.2f} CPU-s   total {server + client:6.2f}")
        for proof in ("identity", "content digest"):
            for way in ("binary copy", "pg_dump"):
                ratio, server = sum(best[proof]) / sum(best[way]), best[proof][0] / best[way][0]
                print(f"{proof} / {way}: {ratio:.2f} (server only {server:.2f})")
        ratio = best["identity"][0] / best["content digest"][0]
        print(f"identity / content digest, server: {ratio:.3f}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
