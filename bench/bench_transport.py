"""Transport throughput: `fedload agent dump` over ssh, decoded on the superhub, next to `pg_dump | gzip | ssh`.

    uv run --group bench python bench/bench_transport.py [--size-mb 300] [--modes copy,inserts]

A throwaway feeder cluster holds a CFEngine-like __promiselog table whose pg_dump output is about --size-mb MB
(sized for the first mode). A real OpenSSH sshd listens on loopback with temporary keys. For each mode:

- fedload: the superhub side (this process) opens `fedload agent dump` on the "feeder" through fedload's SSH
  transport (asyncssh) and decodes the stream with `fedload.superhub.receive.DumpReceiver`: framing, checksums,
  decompression, statement splitting, trailer checks. The items are counted and dropped: nothing is written.
- naive: `ssh feeder 'pg_dump ... | gzip' | gunzip | wc -c` (OpenSSH client, default cipher; `wc -c` stands for
  `> /dev/null` and counts the dump bytes).

MB/s is pg_dump's output (the dump text before any merging or compression) per wall second, connection set-up
included. Both pipelines run pg_dump with the same arguments on the same data.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import common

from fedload.config import Config, parse_config
from fedload.localpg import LocalCluster
from fedload.log import configure_logging
from fedload.names import TableName
from fedload.superhub.receive import DumpReceiver
from fedload.transport.command import dump_command
from fedload.transport.ssh import SshTransport

TABLE = "public.__promiselog"


@dataclass(frozen=True, slots=True)
class Received:
    """One fedload transfer."""

    seconds: float
    wire_bytes: int
    payload_bytes: int
    items: int
    rows: int
    agent_rss_kib: int
    receiver_cpu_s: float


def fedload_config(cluster: LocalCluster, sshd: common.SshServer, mode: str, compression: str, rss: Path) -> Config:
    """A configuration with one SSH feeder: the benchmark's cluster, reached through the loopback sshd."""
    feeder = {
        "key": 1,
        "transport": "ssh",
        "ssh": sshd.ssh_config().model_dump(),
        "agent_command": common.rss_wrapped(rss, [sys.executable, "-m", "fedload"]),
        "dump_mode": mode,
        "compression": compression,
        "database": cluster.conninfo("cfdb"),
        "pg_dump": cluster.install.tool("pg_dump"),
    }
    superhub = {"dsn": "postgresql://unused@/superhub", "tables": [TABLE]}
    return parse_config({"superhub": superhub, "feeders": {"hub1": feeder}}, source="bench")


async def receive(config: Config) -> tuple[float, DumpReceiver, int]:
    """Run the agent over SSH and decode its stream to the end: seconds, the receiver, items seen."""
    feeder = config.feeders["hub1"]
    assert feeder.ssh is not None
    items = 0
    with common.timed() as elapsed:
        process = await SshTransport(feeder.ssh).open(
            dump_command(feeder, config.transform, [TableName.from_dump(TABLE.encode())])
        )
        try:
            receiver = DumpReceiver(process, framed=True, dump_mode=feeder.dump_mode)
            async for _ in receiver.items():
                items += 1
        finally:
            await process.cancel()
    return elapsed(), receiver, items


def measure_fedload(cluster: LocalCluster, sshd: common.SshServer, mode: str, compression: str, work: Path) -> Received:
    """One fedload transfer of the table."""
    rss = work / f"agent-rss-{mode}"
    config = fedload_config(cluster, sshd, mode, compression, rss)
    cpu_before = common.cpu_seconds()
    seconds, receiver, items = asyncio.run(receive(config))
    cpu = common.cpu_seconds() - cpu_before
    assert receiver.trailer is not None
    rows = sum(receiver.trailer.row_counts().values())
    agent_rss, _ = common.recorded_usage(rss)
    return Received(seconds, receiver.raw_bytes, receiver.dump_bytes, items, rows, agent_rss, cpu)


def measure_naive(cluster: LocalCluster, sshd: common.SshServer, mode: str) -> tuple[float, int]:
    """`ssh feeder 'pg_dump | gzip' | gunzip | wc -c`: seconds and dump bytes."""
    pg_dump = shlex.join(common.pg_dump_argv(cluster, "cfdb", [TABLE], inserts=mode == "inserts"))
    seconds, out = common.shell_output(f"{sshd.remote(f'{pg_dump} | gzip')} | gunzip | wc -c")
    return seconds, int(out)


def report(mode: str, naive: tuple[float, int], fed: Received, compression: str) -> None:
    """One table per mode: MB/s of pg_dump output for both pipelines."""
    naive_s, dump_size = naive
    naive_speed = dump_size / naive_s
    fed_speed = dump_size / fed.seconds
    ratio = fed_speed / naive_speed
    common.print_table(
        f"{mode} mode: {common.mb(dump_size):.0f} MB of pg_dump output ({fed.rows} rows) over ssh on loopback",
        ["pipeline", "seconds", "MB/s", "wire MB", "decoded MB", "vs naive", "target"],
        [
            [
                f"fedload agent ({compression}) -> asyncssh -> decode",
                f"{fed.seconds:.2f}",
                f"{common.mb(fed_speed):.1f}",
                f"{common.mb(fed.wire_bytes):.1f}",
                f"{common.mb(fed.payload_bytes):.0f}",
                common.fmt_ratio(ratio),
                f"not slower: {common.verdict(ratio >= 1)}",
            ],
            [
                "pg_dump | gzip | ssh | gunzip",
                f"{naive_s:.2f}",
                f"{common.mb(naive_speed):.1f}",
                "",
                f"{common.mb(dump_size):.0f}",
                "1.00x",
                "",
            ],
        ],
    )
    print(
        f"fedload: agent peak RSS (pg_dump included) {fed.agent_rss_kib / 1024:.0f} MiB; superhub side (asyncssh + "
        f"decode, this process) {fed.receiver_cpu_s:.1f} CPU s for {fed.items} items"
    )


def main() -> int:
    """Generate the table, measure each mode, print a table per mode."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=300, help="pg_dump output size (default 300 MB)")
    parser.add_argument("--modes", default="copy,inserts", help="comma-separated: copy, inserts (default both)")
    parser.add_argument("--compression", choices=["zstd", "gzip"], default="zstd", help="fedload's (default zstd)")
    common.add_common_arguments(parser)
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"copy", "inserts"}:
        parser.error("--modes takes copy and/or inserts")
    configure_logging(level="warning")
    print(common.machine_line())
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        cluster = work.cluster("feeder")
        cluster.psql("CREATE DATABASE cfdb")
        cluster.psql(common.PROMISELOG_SCHEMA, "cfdb")
        print(f"generating {TABLE} for a ~{args.size_mb:g} MB {modes[0]} dump ...", flush=True)
        common.grow_to_dump_size(cluster, "cfdb", int(args.size_mb * 1e6), inserts=modes[0] == "inserts")
        sshd = work.sshd()
        for mode in modes:
            print(f"measuring {mode} mode ...", flush=True)
            naive = measure_naive(cluster, sshd, mode)
            fed = measure_fedload(cluster, sshd, mode, args.compression, work.dir)
            report(mode, naive, fed, args.compression)
    print(f"\n{common.BUSY_NOTE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
