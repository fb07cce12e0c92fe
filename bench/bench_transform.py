"""Transformer throughput next to `gzip -6`, and psql import time of a per-row dump next to the merged one.

    uv run --group bench python bench/bench_transform.py [--size-mb 250] [--repeat 1] [--rows-per-statement 1000]
    uv run --group bench python bench/bench_transform.py --against main [--size-mb 40] [--repeat 5]

Generates a `pg_dump --column-inserts` data dump of a CFEngine-like __promiselog table (text, timestamps, text[],
quotes, backslashes, non-ASCII, newlines inside values) of about --size-mb MB from a throwaway cluster, then:
1. merges it with the in-process transforms API (`transform_stream`, one core; input in memory, output collected
   in memory) and compresses the same file with `gzip -6 -c FILE > /dev/null` (one core): MB of input per second;
2. imports the original and the merged dump, each into a fresh database holding the empty table, with
   `psql -X -v ON_ERROR_STOP=1 -q -f DUMP` (autocommit, as written: one transaction per statement), and checks
   that both databases hold exactly the source table's rows (count and digest).

With `--against REV`, instead: this checkout's transformer and REV's (`git archive REV transforms`, imported beside
it), interleaved in one run on the --column-inserts dump, a COPY dump of the same table, INSERTs of multi-MB
literals, and the superhub's split of the merged dump: CPU seconds of each (best of --repeat), the ratio new/old
of their throughput, and whether their outputs are equal.
"""

from __future__ import annotations

import argparse
import importlib
import io
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import common

import transforms
from fedload.localpg import LocalCluster
from transforms import TransformOptions, transform_stream
from transforms.cli import positive_int

TABLE = "public.__promiselog"
TABLE_KEY = ("public", "__promiselog")
DIGEST_SQL = "SELECT md5(string_agg(md5(t::text), '' ORDER BY id, t::text)) FROM public.__promiselog t"


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass over the dump: best seconds, bytes in, bytes out."""

    seconds: float
    bytes_in: int
    bytes_out: int

    @property
    def speed(self) -> float:
        """Input bytes per second."""
        return self.bytes_in / self.seconds


def measure_transform(data: bytes, options: TransformOptions, repeat: int) -> tuple[Pass, bytes, int]:
    """Best of `repeat` in-process transforms; the merged output and the rows the transformer counted."""
    best = float("inf")
    merged = b""
    rows = 0
    for _ in range(repeat):
        out: list[bytes] = []
        with common.timed() as elapsed:
            stats = transform_stream(io.BytesIO(data).read, out.append, options)
        best = min(best, elapsed())
        merged, rows = b"".join(out), stats.rows[TABLE_KEY]
    return Pass(best, len(data), len(merged)), merged, rows


def measure_gzip(path: str, size: int, repeat: int) -> Pass:
    """Best of `repeat` runs of `gzip -6 -c FILE > /dev/null`; the compressed size from one more run."""
    best = min(common.run_shell(f"gzip -6 -c {shlex.quote(path)} > /dev/null") for _ in range(repeat))
    return Pass(best, size, int(common.shell_output(f"gzip -6 -c {shlex.quote(path)} | wc -c")[1]))


def measure_import(cluster: LocalCluster, path: str, dbname: str) -> tuple[float, int]:
    """Seconds to load `path` with psql into a fresh database holding the empty table; rows loaded."""
    cluster.psql(f"CREATE DATABASE {dbname}")
    cluster.psql(common.PROMISELOG_SCHEMA, dbname)
    seconds = common.run_shell(shlex.join([*common.psql_argv(cluster, dbname), "-f", path]))
    rows = int(cluster.psql(f"SELECT count(*) FROM {TABLE}", dbname))  # noqa: S608 - our own table name
    return seconds, rows


def digest(cluster: LocalCluster, dbname: str) -> str:
    """A digest of every row's text, in id order: equal digests, equal tables."""
    return cluster.psql(DIGEST_SQL, dbname)


def report_throughput(rows: int, transformer: Pass, gzip: Pass) -> None:
    """The throughput table."""
    ratio = transformer.speed / gzip.speed
    common.print_table(
        f"Throughput on the same {common.mb(transformer.bytes_in):.0f} MB --column-inserts dump ({rows:,} rows), "
        "one core each",
        ["what", "seconds", "MB/s (input)", "output MB", "vs gzip -6", "target"],
        [
            [
                "transformer (merge INSERTs, in-process)",
                f"{transformer.seconds:.2f}",
                f"{common.mb(transformer.speed):.1f}",
                f"{common.mb(transformer.bytes_out):.1f}",
                common.fmt_ratio(ratio),
                f"faster than gzip -6: {common.verdict(ratio > 1)}",
            ],
            [
                "gzip -6",
                f"{gzip.seconds:.2f}",
                f"{common.mb(gzip.speed):.1f}",
                f"{common.mb(gzip.bytes_out):.1f}",
                "1.00x",
                "",
            ],
        ],
    )


def report_import(rows: int, per_row: tuple[float, int], merged: tuple[float, int], rows_per_statement: int) -> None:
    """The import table."""
    ratio = per_row[0] / merged[0]
    common.print_table(
        "psql -v ON_ERROR_STOP=1 -q -f DUMP into a fresh database",
        ["dump", "seconds", "rows/s", "rows loaded", "speed-up", "target"],
        [
            ["per-row INSERTs (pg_dump)", f"{per_row[0]:.2f}", f"{rows / per_row[0]:,.0f}", per_row[1], "1.00x", ""],
            [
                f"merged, {rows_per_statement} rows/statement",
                f"{merged[0]:.2f}",
                f"{rows / merged[0]:,.0f}",
                merged[1],
                common.fmt_ratio(ratio),
                f">= 6x: {common.verdict(ratio >= 6)}",
            ],
        ],
    )


def load_transforms(rev: str) -> ModuleType:
    """The `transforms` package as of git revision `rev`, imported beside this checkout's (which stays `transforms`
    in sys.modules): its modules keep the references they imported, so both run side by side."""
    target = Path(tempfile.mkdtemp(prefix="fedload-bench-transforms-"))
    repository = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(repository), "archive", rev, "transforms"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    ours = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "transforms"}
    for name in ours:
        del sys.modules[name]
    sys.path.insert(0, str(target))
    try:
        return importlib.import_module("transforms")
    finally:
        sys.path.remove(str(target))
        shutil.rmtree(target, ignore_errors=True)  # the modules are loaded: their files are no longer needed
        for name in [name for name in sys.modules if name.split(".")[0] == "transforms"]:
            del sys.modules[name]
        sys.modules.update(ours)


def transform_with(module: ModuleType, rows_per_statement: int) -> Callable[[bytes], object]:
    """One whole transform of a dump held in memory, by `module`'s transformer: the output."""

    def run(data: bytes) -> object:
        out: list[bytes] = []
        module.transform_stream(io.BytesIO(data).read, out.append, module.TransformOptions(rows_per_statement))
        return b"".join(out)

    return run


def split_with(module: ModuleType) -> Callable[[bytes], object]:
    """The superhub's split of a (merged) dump fed as it arrives (256 KiB reads), by `module`: rows per item."""

    def run(data: bytes) -> object:
        splitter = module.DumpSplitter()
        items = [item for i in range(0, len(data), 1 << 18) for item in splitter.feed(data[i : i + (1 << 18)])]
        items += splitter.close()
        return [(i.insert.table, len(i.insert.tuples)) if hasattr(i, "insert") else type(i).__name__ for i in items]

    return run


def big_literals(total_bytes: int, pattern: bytes) -> bytes:
    """INSERTs of a 3 MB literal each (`pattern` repeated), about total_bytes in all."""
    row = b"INSERT INTO public.t (id, body) VALUES (%d, '" + pattern * (3_000_000 // len(pattern)) + b"');\n"
    return b"".join(row % i for i in range(max(1, total_bytes // len(row))))


def compare(old: ModuleType, inputs: dict[str, bytes], rows_per_statement: int, repeat: int) -> list[list[object]]:
    """Per input: MB, CPU seconds of old and new (best of `repeat`, interleaved), new/old throughput, equal?"""
    rows: list[list[object]] = []
    for kind, data in inputs.items():
        make = split_with if kind.startswith("superhub") else lambda m: transform_with(m, rows_per_statement)
        runs = {"old": make(old), "new": make(transforms)}
        best = {"old": float("inf"), "new": float("inf")}
        outputs: dict[str, object] = {}
        for _ in range(repeat):
            for label, run in runs.items():
                started = time.thread_time()
                outputs[label] = run(data)
                best[label] = min(best[label], time.thread_time() - started)
        same = "yes" if outputs["old"] == outputs["new"] else "NO"
        ratio = common.fmt_ratio(best["old"] / best["new"])
        rows.append([kind, f"{common.mb(len(data)):.0f}", f"{best['old']:.3f}", f"{best['new']:.3f}", ratio, same])
    return rows


def main_against(args: argparse.Namespace) -> int:
    """Generate the dumps, compare this checkout's transformer with REV's; 1 if any output differs."""
    old = load_transforms(args.against)
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        cluster = work.cluster("transform")
        cluster.psql("CREATE DATABASE source")
        cluster.psql(common.PROMISELOG_SCHEMA, "source")
        print(f"generating a ~{args.size_mb:g} MB --column-inserts dump of {TABLE} and its COPY dump ...", flush=True)
        common.grow_to_dump_size(cluster, "source", int(args.size_mb * 1e6), inserts=True)
        dumps = {}
        for mode, inserts in (("inserts", True), ("copy", False)):
            dump = work.dir / f"{mode}.sql"
            common.run_shell(f"{shlex.join(common.pg_dump_argv(cluster, 'source', [TABLE], inserts=inserts))} > {dump}")
            dumps[mode] = dump.read_bytes()
    merged = transform_with(transforms, args.rows_per_statement)(dumps["inserts"])
    assert isinstance(merged, bytes)
    inputs = {
        "--column-inserts dump": dumps["inserts"],
        "COPY dump": dumps["copy"],
        "INSERTs of 3 MB literals": big_literals(len(dumps["copy"]), b"log line; all ok\n"),
        "INSERTs of 3 MB literals, '' every 5 bytes": big_literals(len(dumps["copy"]), b"x;''y"),
        "superhub split of the merged dump": merged,
    }
    rows = compare(old, inputs, args.rows_per_statement, args.repeat)
    common.print_table(
        f"Transformer of this checkout (new) against {args.against} (old), interleaved, one core",
        ["input", "MB", "old CPU s", "new CPU s", "new/old throughput", "same output"],
        rows,
    )
    return 0 if all(row[-1] == "yes" for row in rows) else 1


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=250, help="size of the generated dump (default 250 MB)")
    parser.add_argument(
        "--repeat", type=positive_int, default=1, help="runs of each throughput measurement; best is kept"
    )
    parser.add_argument(
        "--rows-per-statement",
        type=positive_int,
        default=TransformOptions().rows_per_statement,
        help="transformer's cap",
    )
    parser.add_argument(
        "--against", metavar="REV", help="compare this checkout's transformer with git revision REV's, and stop"
    )
    common.add_common_arguments(parser)
    return parser.parse_args()


def main() -> int:
    """Generate the dump, measure, print the tables; 1 if rows went missing anywhere."""
    args = parse_args()
    print(common.machine_line())
    if args.against:
        return main_against(args)
    with common.Workspace(common.pick_install(args.pg_major), keep=args.keep) as work:
        cluster = work.cluster("transform")
        cluster.psql("CREATE DATABASE source")
        cluster.psql(common.PROMISELOG_SCHEMA, "source")
        print(f"generating a ~{args.size_mb:g} MB --column-inserts dump of {TABLE} ...", flush=True)
        rows = common.grow_to_dump_size(cluster, "source", int(args.size_mb * 1e6), inserts=True)
        dump = work.dir / "per_row.sql"
        common.run_shell(f"{shlex.join(common.pg_dump_argv(cluster, 'source', [TABLE], inserts=True))} > {dump}")
        data = dump.read_bytes()
        print(f"transformer and gzip -6 on {common.mb(len(data)):.0f} MB ...", flush=True)
        options = TransformOptions(rows_per_statement=args.rows_per_statement)
        transformer, merged, counted = measure_transform(data, options, args.repeat)
        merged_path = work.dir / "merged.sql"
        merged_path.write_bytes(merged)
        del data, merged
        gzip = measure_gzip(str(dump), transformer.bytes_in, args.repeat)
        print("importing both dumps with psql ...", flush=True)
        per_row = measure_import(cluster, str(dump), "per_row")
        merged_import = measure_import(cluster, str(merged_path), "merged")
        same = digest(cluster, "source") == digest(cluster, "per_row") == digest(cluster, "merged")
    report_throughput(rows, transformer, gzip)
    report_import(rows, per_row, merged_import, args.rows_per_statement)
    print(f"\n{common.BUSY_NOTE}")
    if same and counted == rows == per_row[1] == merged_import[1]:
        print("check: both imports hold exactly the source table's rows (count and digest)")
        return 0
    print(
        f"ROWS DIFFER: generated {rows}, transformer counted {counted}, loaded {per_row[1]} and {merged_import[1]}; "
        f"digests equal: {same}"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
