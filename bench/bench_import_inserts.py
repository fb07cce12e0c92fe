"""The superhub's Python for an inserts-mode dump, in one process: stream decode, split and the importer.

    uv run python bench/bench_import_inserts.py [--rows 300000] [--repeat 3] [--tree PATH]

A merged inserts-mode dump of __promiselog-like rows (1,000 per statement, as the agent merges them: text with
quotes, backslashes and non-ASCII, NULLs, text[] literals, timestamps) is encoded as the agent's stream (zstd, 1 MiB
blocks), then decoded in 256 KiB reads, split and loaded by `fedload.superhub.importer.Importer` into a fake
connection that only counts the COPY rows and INSERTs it is sent: no database, no network. Printed: the least CPU
seconds of --repeat loads and the rows that went by COPY. `--tree PATH` imports fedload and transforms from another
checkout (`git worktree add /tmp/base REV`), to compare: run it once per tree, alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

COLUMNS = (
    ("id", "bigint"),
    ("hostkey", "text"),
    ("changetimestamp", "timestamp with time zone"),
    *((name, "text") for name in ("policyfile", "releaseid", "promisehash", "namespace", "bundle", "promisetype")),
    *((name, "text") for name in ("promiser", "stackpath", "promisehandle", "promiseoutcome")),
    ("logmessages", "text[]"),
    ("promisees", "text[]"),
)
MIB = 1 << 20


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def row(g: int) -> str:
    md5 = hashlib.md5(str(g // 16).encode(), usedforsecurity=False).hexdigest()
    values = [
        str(g),
        literal(f"SHA={md5}"),
        literal(f"2024-05-{1 + g % 28:02d} {g % 24:02d}:{g % 60:02d}:00+00"),
        literal(f"/var/cfengine/inputs/services/{('main', 'web', 'db', 'ssh')[g % 4]}.cf"),
        literal(md5[:16]),
        literal(md5[16:]),
        literal("default"),
        literal(("cfe_internal_update", "web_server")[g % 2]),
        literal("files"),
        literal(("/etc/ssh/sshd_config", "apache2", "C:\\Program Files\\x")[g % 3]),
        literal(f"/default/main/methods/'web'/default/web_server/files/'/etc/motd'[1]#{g % 13}"),
        "NULL" if g % 3 == 0 else literal(f"handle_{g % 211}"),
        literal("KEPT"),
        literal('{"Promise kept, nothing to do"}' if g % 2 else '{"Edited \'/etc/motd\'","Rückgabewert \\\\ 状態"}'),
        literal('{team:ops,owner:alice,"policy, \\"baseline\\""}'),
    ]
    return "(" + ", ".join(values) + ")"


def merged_dump(rows: int) -> bytes:
    """The agent's merged output for `rows` rows, 1,000 per statement."""
    head = f"INSERT INTO public.__promiselog ({', '.join(name for name, _ in COLUMNS)}) VALUES\n\t"
    out = ["SET client_encoding = 'UTF8';\nSET standard_conforming_strings = on;\n\n"]
    out.extend(
        head + ",\n\t".join(row(g) for g in range(start, min(rows, start + 1000))) + ";\n"
        for start in range(0, rows, 1000)
    )
    return "".join(out).encode()


class Connection:
    """What the importer needs of asyncpg's connection; counts the rows it is sent."""

    async def execute(self, sql: str) -> str:
        return "INSERT 0 0"

    async def copy_to_table(self, name: str, *, source: AsyncIterator[bytes], **options: object) -> str:
        rows = 0
        async for data in source:
            rows += data.count(b"\n")  # exact here: no newline inside this data's values
        return f"COPY {rows}"


async def load(stream: bytes) -> tuple[int, int]:
    """Decode, split and import the stream as the superhub does; (rows, rows by COPY)."""
    from fedload.names import TableName, TablePattern  # noqa: PLC0415 - from the tree chosen at run time
    from fedload.stream import StreamDecoder  # noqa: PLC0415
    from fedload.superhub.importer import Importer, ImportPolicy  # noqa: PLC0415
    from fedload.superhub.schema import Column, ParentTable  # noqa: PLC0415
    from transforms import DumpSplitter  # noqa: PLC0415

    columns = tuple(Column(n, t, False, None, None, t) for n, t in (*COLUMNS, ("hub_id", "integer")))
    parent = ParentTable(TableName("public", "__promiselog"), columns, ())
    policy = ImportPolicy("hub_id", (TablePattern("public.*"),))
    connection: Any = Connection()  # asyncpg's, as far as the importer looks
    importer = Importer(connection, feeder="f", key=1, stage_prefix="s", parents={parent.table: parent}, policy=policy)
    splitter, decoder = DumpSplitter(), StreamDecoder("bench")
    if hasattr(splitter, "read_tuples_with"):  # the one pass (issue #44)
        splitter.read_tuples_with(importer.tuples_pattern)

    async def items() -> AsyncIterator[object]:
        for i in range(0, len(stream), 1 << 18):
            for text in decoder.feed(stream[i : i + (1 << 18)]):
                for item in splitter.feed(text):
                    yield item
        decoder.close()
        for item in splitter.close():
            yield item

    await importer.load(items())  # type: ignore[arg-type]
    staged = importer.staged[parent.table]
    return staged.rows, staged.rows_by_copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tree", type=Path, help="the checkout whose fedload and transforms to run")
    args = parser.parse_args()
    if args.tree is not None:
        sys.path.insert(0, str(args.tree.resolve()))
    import fedload  # noqa: PLC0415
    from fedload.stream import Header, StreamEncoder  # noqa: PLC0415

    dump = merged_dump(args.rows)
    encoder = StreamEncoder(Header("zstd", "inserts", "bench", "15", ["public.__promiselog"]))
    blocks = (encoder.data(dump[i : i + MIB]) for i in range(0, len(dump), MIB))
    stream = b"".join([encoder.start(), *blocks, encoder.finish(pg_dump_exit_status=0)])
    best, rows, by_copy = float("inf"), 0, 0
    for _ in range(args.repeat):
        start = time.process_time()
        rows, by_copy = asyncio.run(load(stream))
        best = min(best, time.process_time() - start)
    where = Path(fedload.__file__).parent.parent
    print(f"{where}: {best:.3f} CPU s for {rows:,} rows ({len(dump) / 1e6:.0f} MB), {by_copy:,} by COPY")


if __name__ == "__main__":
    main()
