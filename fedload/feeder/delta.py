"""A changed table sent as the buckets of it that changed (issue #55; docs/unchanged.md, "Changed rows only").

A table's rows fall into `buckets` buckets by a hash of their key (the superhub's primary key less the feeder key,
or its NOT NULL columns), `bucket_sql`: the same expression on both sides. After a run, the superhub keeps the
table's *delta state*: how many rows each bucket held, the oldest transaction still running in the snapshot they
came from (`xmin`), and a `basis` hashing what else the rows' values depend on (fedload/feeder/digest.py's
`covered`: the server and its start, the output settings, the table as stored). The next run sends that state
back, and the agent counts each bucket's rows in its own snapshot: those written by transactions older than the
stored `xmin` (`old`: ended before that snapshot, so in it and unchanged since, as any change writes a new row
version) and the others (`new`). A bucket is unchanged when it has no new row and as many old ones as it held: it
then holds exactly the rows the superhub has. The other buckets (the `dirty` ones) are sent whole, and the
superhub replaces its rows of them, in the swap's transaction.

Standard library only (the zipapp); pure apart from the statements' text, run by the caller's session.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from fedload.feeder.sql_text import quote_ident, serially

__all__ = [
    "BUCKET_SEED",
    "DELTA_VERSION",
    "KEY_TYPE_OIDS",
    "MAX_BUCKETS",
    "MAX_SENT_SHARE",
    "PROBE_QUERY",
    "DeltaRequest",
    "DeltaState",
    "bucket_sql",
    "buckets_query",
    "changed_rows_where",
    "decode_bits",
    "decode_counts",
    "delta_basis",
    "differing_buckets",
    "dirty_buckets",
    "encode_bits",
    "encode_counts",
    "parse_buckets",
    "parse_delta_request",
    "parse_new_rows",
    "parse_state",
    "state_digest",
    "written_since_query",
]

DELTA_VERSION = 2  # what the basis and the buckets mean: a change makes every stored state differ
BUCKET_SEED = 0x5EED_B0C7
MIN_BUCKETS, MAX_BUCKETS = 2, 1 << 14
MAX_SENT_SHARE = 0.25  # past this share of the table's buckets, the whole table goes (a fresh partition is cheaper)
# Key types whose text is the same on every server and in every setting: int2, int4, int8, text, varchar, uuid.
_INTEGER_OIDS, _UUID_OID = frozenset({21, 23, 20}), 2950
KEY_TYPE_OIDS = frozenset({*_INTEGER_OIDS, 25, 1043, _UUID_OID})
# The three hashes of fixed values, XORed: the superhub asks deltas only where its servers hash as the feeder's.
PROBE_QUERY = (
    f"SELECT pg_catalog.hashtextextended('fedload bucket probe', {BUCKET_SEED}) "
    f"# pg_catalog.hashint8extended(-1234567890123, {BUCKET_SEED}) "
    f"# pg_catalog.uuid_hash_extended('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', {BUCKET_SEED});"
)
# zlib's fastest level for the states and bitmaps a run encodes (a dozen): 16,384 counts in 0.16 ms and 6,689 bytes,
# against 0.83 ms and 6,575 at level 9.
_ZLIB_LEVEL = 1
_TAG = "fedload delta basis"
_DIGEST_TAG = "fedload delta state digest"
_MAX_COUNT = 2**63 - 1
_IDENT = re.compile(r"[0-9a-f]{64}")
_PROBE = re.compile(r"-?[0-9]{1,20}")


@dataclass(frozen=True)
class DeltaState:
    """A table's delta state as a run leaves it: what the next run's agent compares its snapshot with."""

    basis: str  # SHA-256 hex of what the rows' values depend on besides their tuples
    buckets: int
    xmin: int  # the snapshot's oldest running transaction (64-bit)
    counts: tuple[int, ...]  # rows per bucket
    probe: str  # hashtextextended of a fixed text on the feeder: the superhub asks deltas only where its own is

    def to_json(self) -> dict[str, Any]:
        return {
            "basis": self.basis,
            "buckets": self.buckets,
            "xmin": self.xmin,
            "counts": encode_counts(self.counts),
            "probe": self.probe,
        }


@dataclass(frozen=True)
class DeltaRequest:
    """What the superhub asks of a table: its key and bucket count, the state it holds (None: none yet), and
    whether it takes a bucket that only gained rows as those rows alone (`append`: its `appended` buckets)."""

    key: tuple[str, ...]
    buckets: int
    state: Optional[DeltaState] = None  # noqa: UP045 - Python 3.9 evaluates dataclass fields' types
    append: bool = False


def parse_delta_request(found: object) -> DeltaRequest:
    """A request's `delta` object; ValueError saying what is wrong."""
    if not isinstance(found, dict):
        raise ValueError("delta must be a JSON object")  # noqa: TRY004 - the request is wrong, as for any value
    key, buckets = found.get("key"), found.get("buckets")
    if not isinstance(key, list) or not key or not all(isinstance(k, str) for k in key):
        raise ValueError("delta.key must be a list of column names")
    _check_buckets(buckets)
    assert isinstance(buckets, int)
    state = parse_state(found["state"], buckets) if found.get("state") is not None else None
    append = found.get("append", False)
    if type(append) is not bool:
        raise ValueError("delta.append must be true or false")
    return DeltaRequest(tuple(key), buckets, state, append)


def parse_state(found: object, buckets: int) -> DeltaState:
    """A delta state sent as JSON (`DeltaState.to_json`) for a table of `buckets` buckets; ValueError if it is not
    one."""
    if not isinstance(found, dict):
        raise ValueError("a delta state must be a JSON object")  # noqa: TRY004 - as in parse_delta_request
    _check_buckets(buckets)
    basis, xmin, probe = found.get("basis"), found.get("xmin"), found.get("probe")
    if not isinstance(basis, str) or not _IDENT.fullmatch(basis):
        raise ValueError("its basis is not 64 lowercase hexadecimal digits")
    if found.get("buckets") != buckets:
        raise ValueError(f"its buckets are not the {buckets} asked")
    if type(xmin) is not int or not 0 <= xmin <= _MAX_COUNT:
        raise ValueError("its xmin is not a transaction ID")
    if not isinstance(probe, str) or not _PROBE.fullmatch(probe):
        raise ValueError("its probe is not a 64-bit number")
    counts = found.get("counts")
    if not isinstance(counts, str):
        raise ValueError("its counts are not a string")  # noqa: TRY004 - as above
    return DeltaState(basis, buckets, xmin, decode_counts(counts, buckets), probe)


def _check_buckets(buckets: object) -> None:
    if type(buckets) is not int or not MIN_BUCKETS <= buckets <= MAX_BUCKETS or buckets & (buckets - 1):
        raise ValueError(f"delta.buckets must be a power of two from {MIN_BUCKETS} to {MAX_BUCKETS}")


def encode_counts(counts: Sequence[int]) -> str:
    """Rows per bucket as base64 of zlib of LEB128 varints."""
    if not counts or (min(counts) >= 0 and max(counts) < 0x80):  # the usual: a byte each
        return base64.b64encode(zlib.compress(bytes(counts), _ZLIB_LEVEL)).decode("ascii")
    out = bytearray()
    for count in counts:
        n = count
        while n >= 0x80:
            out.append(0x80 | (n & 0x7F))
            n >>= 7
        out.append(n)
    return base64.b64encode(zlib.compress(bytes(out), _ZLIB_LEVEL)).decode("ascii")


def decode_counts(text: str, buckets: int) -> tuple[int, ...]:
    """`encode_counts`'s text of exactly `buckets` counts; ValueError for anything else (bounded: at most ten bytes
    a count are inflated)."""
    raw = _inflate(text, buckets * 10)
    if len(raw) == buckets and max(raw, default=0) < 0x80:  # a byte each
        return tuple(raw)
    counts: list[int] = []
    value = shift = 0
    for byte in raw:
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte & 0x80:
            if shift > 63:
                raise ValueError("a count is longer than 64 bits")
            continue
        if value > _MAX_COUNT:
            raise ValueError("a count is past a bigint")
        counts.append(value)
        value = shift = 0
    if shift or len(counts) != buckets:
        raise ValueError(f"the counts are not {buckets} numbers")
    return tuple(counts)


def encode_bits(indices: Iterable[int], buckets: int) -> str:
    """A set of buckets as base64 of zlib of a bitmap: bucket n is bit n % 8 of byte n // 8 (PostgreSQL's
    `get_bit(bytea, n)`)."""
    return base64.b64encode(zlib.compress(bitmap(indices, buckets), _ZLIB_LEVEL)).decode("ascii")


def bitmap(indices: Iterable[int], buckets: int) -> bytes:
    """The bitmap `encode_bits` compresses."""
    bits = bytearray((buckets + 7) // 8)
    for n in indices:
        bits[n // 8] |= 1 << (n % 8)
    return bytes(bits)


def decode_bits(text: str, buckets: int) -> frozenset[int]:
    """`encode_bits`'s set; ValueError if it is not a bitmap of `buckets` bits."""
    raw = _inflate(text, (buckets + 7) // 8)
    if len(raw) != (buckets + 7) // 8:
        raise ValueError(f"the bitmap is not of {buckets} buckets")
    return frozenset(n for n in range(buckets) if raw[n // 8] >> (n % 8) & 1)


def _inflate(text: str, limit: int) -> bytes:
    """base64 then zlib, at most `limit` bytes out; ValueError for anything else."""
    try:
        packed = base64.b64decode(text.encode("ascii"), validate=True)
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, limit + 1)
    except (UnicodeEncodeError, binascii.Error, zlib.error) as exc:
        raise ValueError(f"not base64 of zlib data ({exc})") from None
    if len(raw) > limit or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        raise ValueError("longer than its buckets need, or incomplete")
    return raw


def bucket_sql(key: Sequence[tuple[str, int]], buckets: int, alias: str = "r") -> str:
    """SQL of a row's bucket (int4) from its `key` columns, (name, type OID) each: each column hashed by its type's
    own 64-bit hash, seeded by its place (text bytewise, as collation "C" compares it; integers as int8, so int2,
    int4 and int8 hash alike), the hashes XORed; NULL hashes as 0. Identifiers quoted here."""
    hashes = []
    for i, (name, oid) in enumerate(key):
        column, seed = f"{alias}.{quote_ident(name)}", BUCKET_SEED + i
        if oid in _INTEGER_OIDS:
            hashed = f"pg_catalog.hashint8extended({column}::int8, {seed})"
        elif oid == _UUID_OID:
            hashed = f"pg_catalog.uuid_hash_extended({column}, {seed})"
        else:
            hashed = f'pg_catalog.hashtextextended({column}::text COLLATE "C", {seed})'
        hashes.append(f"coalesce({hashed}, 0)")
    return f"(({' # '.join(hashes)}) & {buckets - 1})::int4"


def buckets_query(
    table: tuple[str, str],
    key: Sequence[tuple[str, int]],
    buckets: int,
    old: str,
    held: Sequence[int] | None = None,
) -> str:
    """One statement printing `bucket|old|new` for each bucket of `table` holding rows: `old` the rows for which
    the SQL `old` holds (fedload/feeder/delta_plan.py's `old_rows_sql`: written before the stored state's
    snapshot), `new` the others. Given the rows each bucket `held` in that state, only the buckets that may differ
    from it (a new row, or not as many old rows as it held), and first `-1|old|new` for the whole table
    (`differing_buckets` reads it): most of a changed table's buckets are then not printed, parsed and compared."""
    rows = f"SELECT {bucket_sql(key, buckets)} AS b, {old} AS old FROM {_source(table)} OFFSET 0"  # noqa: S608
    counted = "count(*) FILTER (WHERE s.old), count(*) FILTER (WHERE NOT s.old)"
    if held is None:
        return serially(f"SELECT s.b, {counted} FROM ({rows}) AS s GROUP BY s.b;")  # noqa: S608 - built above
    # A byte a bucket, its stored rows (255: 255 or more, always printed); the whole table's line, bucket -1.
    stored = f"pg_catalog.decode('{bytes(min(count, 0xFF) for count in held).hex()}', 'hex')"
    byte = f"pg_catalog.get_byte({stored}, s.b)"
    differ = f"count(*) FILTER (WHERE NOT s.old) > 0 OR count(*) FILTER (WHERE s.old) <> {byte} OR {byte} = 255"
    grouped = f"FROM ({rows}) AS s GROUP BY GROUPING SETS ((), (s.b)) HAVING GROUPING(s.b) = 1 OR {differ}"
    return serially(f"SELECT coalesce(s.b, -1), {counted} {grouped};")


def parse_buckets(printed: bytes, buckets: int) -> dict[int, tuple[int, int]]:
    """(old, new) by bucket from what `buckets_query` printed; ValueError if it is not its answer."""
    return _bucket_lines(printed, 0, buckets)


def _bucket_lines(printed: bytes, lowest: int, buckets: int) -> dict[int, tuple[int, int]]:
    """(old, new) by the number of each `bucket|old|new` line, from `lowest` (-1: the whole table's line) to the
    last bucket; ValueError if they are not such lines."""
    values = _printed_lines(printed, 3, "the bucket counts")
    numbers = values[0::3]
    found = dict(zip(numbers, zip(values[1::3], values[2::3])))
    _check_buckets_printed(numbers, len(found), lowest, buckets)
    return found


def differing_buckets(printed: bytes, held: Sequence[int]) -> dict[int, tuple[int, int]] | None:
    """(old, new) by bucket that may differ from the `held` counts, from what `buckets_query` given them printed
    (ValueError if it is not its answer): each bucket not listed holds its stored rows, where the whole table's
    rows are as many as the listed buckets' and the others' stored ones. None where they are fewer: a bucket that
    held rows holds none now (its rows deleted), and only every bucket's count (`buckets_query`) says which."""
    found = _bucket_lines(printed, -1, len(held))
    if -1 not in found:
        raise ValueError("the bucket counts lack the whole table's line")
    table_old, table_new = found.pop(-1)
    kept = sum(held) - sum(held[b] for b in found)
    return found if kept + sum(old + new for old, new in found.values()) == table_old + table_new else None


def _source(table: tuple[str, str]) -> str:
    """The rows of `table` itself (no inheritance child's), as `r`; identifiers quoted here."""
    return f"ONLY {quote_ident(table[0])}.{quote_ident(table[1])} AS r"


def _printed_lines(printed: bytes, width: int, what: str) -> list[int]:
    """The numbers of psql's unaligned lines of `width` fields each, in order; ValueError naming `what` otherwise."""
    fields = printed.decode("ascii").replace("\n", "|").split("|")
    if fields[-1] == "":
        fields.pop()
    if len(fields) % width:
        raise ValueError(f"{what} are not lines of {width} numbers")
    return list(map(int, fields))


def _check_buckets_printed(numbers: list[int], distinct: int, lowest: int, buckets: int) -> None:
    """ValueError unless the printed bucket `numbers` are `distinct` different ones, from `lowest` to the last."""
    if distinct != len(numbers) or (numbers and not lowest <= min(numbers) <= max(numbers) < buckets):
        raise ValueError(f"a bucket is not one of {buckets}, or is there twice")


def written_since_query(table: tuple[str, str], key: Sequence[tuple[str, int]], buckets: int, old: str) -> str:
    """One statement printing `-1|old` and `bucket|new` for each bucket of `table` holding rows for which the SQL
    `old` does not hold (written since the stored state): the key is hashed for those rows alone, so a table that
    only gained rows costs its new rows' hashes, not every row's (`buckets_query`)."""
    case = f"CASE WHEN {old} THEN -1 ELSE {bucket_sql(key, buckets)} END"
    rows = f"SELECT {case} AS b FROM {_source(table)} OFFSET 0"  # noqa: S608
    return serially(f"SELECT s.b, count(*) FROM ({rows}) AS s GROUP BY s.b;")  # noqa: S608 - built above


def parse_new_rows(printed: bytes, buckets: int) -> tuple[int, dict[int, int]]:
    """The old rows and the new ones by bucket from what `written_since_query` printed; ValueError if it is not
    its answer."""
    values = _printed_lines(printed, 2, "the rows written since the state")
    numbers = values[0::2]
    found = dict(zip(numbers, values[1::2]))
    _check_buckets_printed(numbers, len(found), -1, buckets)  # -1: the old rows' line
    return found.pop(-1, 0), found


def dirty_buckets(stored: Sequence[int], found: dict[int, tuple[int, int]], *, listed_all: bool = True) -> list[int]:
    """The buckets whose rows may differ from those the superhub holds: a new row, or not the old rows it held.
    `found` lists every bucket holding rows (`listed_all`: one it lacks holds none now), or only those that may
    differ (`buckets_query` given the stored counts: one it lacks holds exactly its stored rows)."""
    dirty = {b for b, (old, new) in found.items() if new or old != stored[b]}
    if listed_all:
        dirty.update(b for b, held in enumerate(stored) if held and b not in found)
    return sorted(dirty)


def delta_basis(covered: list[Any], columns: Sequence[str], key: Sequence[str], buckets: int) -> str:
    """The basis of a table's delta state: `covered` (fedload/feeder/digest.py), the `columns` sent, the key and the
    bucket count, hashed."""
    content = [_TAG, DELTA_VERSION, covered, list(columns), list(key), buckets, BUCKET_SEED]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()


def state_digest(state: DeltaState) -> str:
    """The digest a table sent by its delta is stored with, in place of its identity digest (which the run does not
    compute): a token of the state, which the next run's agent sends back as the table's digest where its rows,
    counted against that state, prove it unchanged. Tagged apart, it never equals an identity or content digest, so
    where the table is not counted against its state the digest differs and the table goes."""
    content = [_DIGEST_TAG, DELTA_VERSION, state.to_json()]
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def changed_rows_where(
    key: Sequence[tuple[str, int]],
    dirty: Iterable[int],
    buckets: int,
    appended: Iterable[int] = (),
    new: str = "false",
) -> str:
    """SQL that holds for the rows (as `r`) in the `dirty` buckets, and for the rows of the `appended` buckets for
    which the SQL `new` holds (written since the stored state): binary_plan's `copy_command` copies those. Where no
    bucket is dirty, every bucket holding new rows is appended (delta_plan's `table_delta`): the new rows are then
    told by `new` alone, no row's key hashed."""
    bucket = bucket_sql(key, buckets)
    changed, added = bitmap(dirty, buckets), bitmap(appended, buckets)
    where = f"pg_catalog.get_bit(pg_catalog.decode('{changed.hex()}', 'hex'), {bucket}) = 1"
    if not any(added):
        return where
    if not any(changed):
        return f"({new})"
    return f"({where} OR ({new} AND pg_catalog.get_bit(pg_catalog.decode('{added.hex()}', 'hex'), {bucket}) = 1))"
