"""The superhub's receive path alone, in one process: StreamDecoder.texts + DumpSplitter.feed over a copy-mode dump.

    uv run python bench/bench_receive.py [--size-mb 200] [--repeat 3]

Builds a pg_dump-like copy-mode dump of about --size-mb MB in memory (CFEngine-like rows as in common.py's data:
SHA= keys, paths, tabs and backslashes escaped, NULLs, arrays, timestamps, non-ASCII; several COPY blocks between
SQL statements), encodes it with fedload.stream.StreamEncoder (zstd, 1 MiB blocks), then feeds the stream in
256 KiB reads as fedload/superhub/receive.py does. Printed, best of --repeat: MB of dump text per CPU second for
the whole path, for the decoder alone (zstd + checksums) and for the splitter alone (over the already decoded blocks).
No database, no network: this is the Python CPU per row that the sync process spends before asyncpg.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable, Iterator

from fedload.stream import Header, StreamDecoder, StreamEncoder
from fedload.superhub.receive import READ_BYTES
from transforms import DumpSplitter
from transforms.cli import positive_int

MIB = 1 << 20
_PREAMBLE = b"""--
-- PostgreSQL database dump
--

SET statement_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);

"""
_TABLES = (
    (
        b"__promiselog",
        b"id, hostkey, changetimestamp, policyfile, releaseid, promisehash, namespace, bundlename, "
        b"promisetype, promiser, stackpath, promisehandle, promiseoutcome, logmessages, promisees",
    ),
    (b"__variables", b"hostkey, namespace, bundle, variablename, variablevalue, variabletype, metatags, changetime"),
    (b"__contexts", b"hostkey, contextname, metatags, changetimestamp"),
)


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def _promiselog_row(g: int) -> bytes:
    promiser = (
        "/etc/ssh/sshd_config",
        f"/var/log/app {g % 100}.log",
        "apache2",
        "C:\\\\Program Files\\\\Cfengine\\\\bin\\\\cf-agent.exe",
    )[g % 4]
    message = (
        '{"Promise kept, nothing to do"}',
        '{"Promise kept, nothing to do"}',
        '{"Promise kept, nothing to do"}',
        f'{{"Edited file \'/etc/motd\' ({_md5(str(g))})","Repaired:\\\\n  line 2 of the log message"}}',
        f'{{"Failed to start service \\\\"apache2\\\\": exit code {g % 7}","Rückgabewert \\\\\\\\ 状態 \\t tab"}}',
    )[g % 5]
    handle = "\\N" if g % 3 == 0 else f"handle_{g % 211}"
    fields = (
        str(g),
        f"SHA={_md5(f'1:{1 + (g - 1) // 16}')}",
        f"2024-05-{1 + g % 28:02d} {g % 24:02d}:{g % 60:02d}:{g * 7 % 60:02d}+00",
        f"/var/cfengine/inputs/services/{('main', 'web', 'db', 'ssh')[g % 4]}.cf",
        _md5(f"release{g // 5000}"),
        _md5(f"promise{g % 997}"),
        "default",
        ("cfe_internal_update", "web_server", "database", "sshd_config", "inventory_linux")[g % 5],
        ("files", "packages", "commands", "processes", "services", "vars")[g % 6],
        promiser,
        f"/default/main/methods/'web'/default/web_server/files/'/etc/motd'[1]#{g % 13}",
        handle,
        ("KEPT", "KEPT", "KEPT", "REPAIRED", "NOTKEPT")[g % 5],
        message,
        "{team:ops,owner:" + ("alice", "bob", "chloé")[g % 3] + ',"policy, \\\\"baseline\\\\""}',
    )
    return "\t".join(fields).encode() + b"\n"


def _variables_row(g: int) -> bytes:
    value = (
        f"value of var_{g} with 'quotes', a \\\\ backslash and a \\t tab",
        _md5(f"{g}:v"),
        f'{{"os": "linux", "cores": {g % 64}}}',
        "\\N",
    )[g % 4]
    fields = (
        f"SHA={_md5(f'1:{g // 30}')}",
        "default",
        ("sys", "mon", "inventory_linux")[g % 3],
        f"var_{g % 30}",
        value,
        ("string", "slist", "data", "int")[g % 4],
        f'{{inventory,"attribute_name=Variable {g % 30}"}}',
        f"2024-05-01 00:{g % 60:02d}:00+00",
    )
    return "\t".join(fields).encode() + b"\n"


def _contexts_row(g: int) -> bytes:
    name = ("linux", "x86_64", "debian_12", "cfengine_3", "policy_server", "ipv4_10", "Monday")[g % 7]
    fields = (
        f"SHA={_md5(f'1:{g // 30}')}",
        f"{name}_{g % 30}",
        f'{{source=agent,hardclass,"inventory,attribute_name=Class {g % 30}"}}',
        f"2024-05-01 00:00:{g % 60:02d}+00",
    )
    return "\t".join(fields).encode() + b"\n"


_ROWS: tuple[Callable[[int], bytes], ...] = (_promiselog_row, _variables_row, _contexts_row)
_SHARE = (0.7, 0.2, 0.1)  # of the dump's bytes, per table


def _copy_block(table: bytes, columns: bytes, row: Callable[[int], bytes], size: int) -> Iterator[bytes]:
    """One COPY block of about `size` bytes: 4,096 distinct rows repeated with fresh first fields."""
    yield b"--\n-- Data for Name: " + table + b"; Type: TABLE DATA\n--\n\nCOPY public." + table
    yield b" (" + columns + b") FROM stdin;\n"
    sample = [row(g) for g in range(1, 4097)]
    written, g = 0, 0
    while written < size:
        line = sample[g % len(sample)]
        if row is _promiselog_row:
            line = str(g + 1).encode() + line[line.index(b"\t") :]
        written += len(line)
        g += 1
        yield line
    yield b"\\.\n\n\n"


def build_dump(size: int) -> bytes:
    """A copy-mode dump of about `size` bytes: two rounds of the three tables, statements around them."""
    parts = [_PREAMBLE]
    for part in range(2):
        for (table, columns), row, share in zip(_TABLES, _ROWS, _SHARE, strict=True):
            parts.append(b"CREATE TABLE public." + table + b"_%d (id bigint);\n\n" % part)
            parts.extend(_copy_block(table, columns, row, int(size * share / 2)))
    parts.append(b"ALTER TABLE ONLY public.__promiselog ADD CONSTRAINT __promiselog_pkey PRIMARY KEY (id);\n\n")
    parts.append(b"--\n-- PostgreSQL database dump complete\n--\n\n")
    return b"".join(parts)


def encode(dump: bytes) -> bytes:
    """The fedload stream (zstd) of `dump`, fed to the encoder in 1 MiB pieces as the agent reads pg_dump."""
    encoder = StreamEncoder(Header("zstd", "copy", "bench", "15", [t.decode() for t, _ in _TABLES]))
    out = [encoder.start()]
    out.extend(encoder.data(dump[i : i + MIB]) for i in range(0, len(dump), MIB))
    out.append(encoder.finish(pg_dump_exit_status=0))
    return b"".join(out)


def receive(stream: bytes) -> int:
    """Decode and split `stream` in READ_BYTES reads; the number of items."""
    decoder, splitter, items = StreamDecoder("bench"), DumpSplitter(), 0
    for i in range(0, len(stream), READ_BYTES):
        for text in decoder.texts(stream[i : i + READ_BYTES]):
            items += len(splitter.feed(text))
    decoder.close()
    return items + len(splitter.close())


def decode_only(stream: bytes) -> list[bytes]:
    """Only the decoder: zstd and the checksums; the decoded blocks."""
    decoder, texts = StreamDecoder("bench"), []
    for i in range(0, len(stream), READ_BYTES):
        texts.extend(decoder.feed(stream[i : i + READ_BYTES]))
    decoder.close()
    return texts


def split_only(texts: list[bytes]) -> int:
    """Only the splitter, over already decoded blocks; the number of items."""
    splitter = DumpSplitter()
    items = sum(len(splitter.feed(text)) for text in texts)
    return items + len(splitter.close())


def best_cpu(repeat: int, run: Callable[[], object]) -> float:
    """The least CPU seconds of `repeat` runs."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    """Build, encode, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=positive_int, default=200)
    parser.add_argument("--repeat", type=positive_int, default=3)
    args = parser.parse_args()
    dump = build_dump(args.size_mb * 1_000_000)
    stream = encode(dump)
    texts = decode_only(stream)
    rows = dump.count(b"\n")
    print(f"dump {len(dump) / 1e6:.1f} MB, ~{rows:,} lines, stream {len(stream) / 1e6:.1f} MB (zstd)")
    print(f"{'what':<32} {'CPU s':>7} {'MB/s':>8} {'us/row':>8}")
    for what, run in (
        ("decoder + splitter (receive)", lambda: receive(stream)),
        ("decoder alone (zstd + checksums)", lambda: decode_only(stream)),
        ("splitter alone", lambda: split_only(texts)),
    ):
        seconds = best_cpu(args.repeat, run)
        print(f"{what:<32} {seconds:7.3f} {len(dump) / 1e6 / seconds:8.1f} {seconds / rows * 1e6:8.3f}")


if __name__ == "__main__":
    main()
