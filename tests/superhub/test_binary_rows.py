"""The compiled fast walk of binary COPY's framing (fedload/superhub/_binary_rows.c) against the Python one: the same
stop for any bytes, start, field count and bound."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedload.superhub.binary_framing import python_rows
from tests.support.compiled_walk import compiled_rows


@st.composite
def framed_bytes(draw: st.DrawFn) -> tuple[bytes, int, int, int]:
    """Bytes for a fast walk (rows of a field count, some with another count, lengths below -1 or past the end, a
    trailer, noise between), a start, a field count and a bound (often a row's size, or one byte less)."""
    columns = draw(st.integers(1, 4))
    length = st.one_of(st.integers(-1, 30), st.sampled_from([-2, -(2**31), 2**31 - 1]))
    parts, sizes = [], [0]
    for _ in range(draw(st.integers(0, 12))):
        count = draw(st.one_of(st.just(columns), st.integers(-1, 5)))
        words = [struct.pack("!h", count)]
        for _ in range(columns):
            n = draw(length)
            words.append(struct.pack("!i", n) + draw(st.binary(min_size=max(0, min(n, 30)), max_size=max(0, n))))
        parts.append(row := b"".join(words))
        sizes += [len(row), len(row) - 1]
        parts.append(draw(st.sampled_from([b"", b"", b"", b"\xff", b"\x00\x01"])))
    data = b"".join(parts)
    bound = draw(st.one_of(st.integers(0, 200), st.sampled_from(sizes).filter(lambda size: size >= 0)))
    return data, draw(st.integers(0, len(data) + 2)), columns, bound


@settings(max_examples=2000, deadline=None)
@given(framed_bytes())
def test_the_compiled_walk_is_the_python_walk(framed: tuple[bytes, int, int, int]) -> None:
    """For any bytes, start, field count and bound, the compiled walk stops where the Python one does; with a view."""
    data, pos, columns, bound = framed
    compiled = compiled_rows()
    expected = python_rows(data, pos, columns, bound)
    assert compiled(data, pos, columns, bound) == expected
    assert compiled(memoryview(data)[:], pos, columns, bound) == expected


def test_the_compiled_walk_refuses_arguments_out_of_range() -> None:
    """A negative start or bound, or a field count no row can have, is a ValueError, not a read out of bounds."""
    compiled = compiled_rows()
    for pos, columns, bound in [(-1, 1, 10), (0, 0, 10), (0, 32768, 10), (0, 1, -1)]:
        with pytest.raises(ValueError, match="rows: pos and bound"):
            compiled(b"\x00\x01\x00\x00\x00\x00", pos, columns, bound)


ONE_FIELD = struct.pack("!hi", 1, 3) + b"abc" + struct.pack("!hi", 1, -1) + struct.pack("!hi", 1, 0)
THREE_FIELDS = (
    struct.pack("!hi", 3, 2) + b"ab" + struct.pack("!ii", -1, 5) + b"cdefg" + struct.pack("!hiii", 3, 0, 1, 7)
)


@pytest.mark.parametrize(("rows", "columns"), [(ONE_FIELD, 1), (THREE_FIELDS, 3)])
def test_the_compiled_walk_is_the_python_walk_at_every_cut(rows: bytes, columns: int) -> None:
    """Rows cut at every byte, from every start: a word cut is never read past the data's end."""
    data = rows + b"x" * 7 + b"\xff\xff"
    compiled = compiled_rows()
    for end in range(len(data) + 1):
        for pos in range(end + 1):
            for bound in (3, 5, 24):
                expected = python_rows(data[:end], pos, columns, bound)
                assert compiled(data[:end], pos, columns, bound) == expected, (end, pos, bound)


# The walk over data that ends where a page no one may read begins: a read past its end kills the process.
GUARDED_WALKS = """
import ctypes, mmap, random, struct, sys
from fedload.superhub._binary_rows import rows
page = mmap.PAGESIZE
area = mmap.mmap(-1, 2 * page)
start = ctypes.addressof(ctypes.c_char.from_buffer(area))
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
if libc.mprotect(start + page, page, 0) != 0:  # PROT_NONE
    sys.exit(f"mprotect: errno {ctypes.get_errno()}")
generator = random.Random(54)
patterns = [bytes.fromhex(sys.argv[1]), bytes.fromhex(sys.argv[2])]
patterns += [bytes(generator.choice(b"\\x00\\x01\\x02\\x03\\xff") for _ in range(40)) for _ in range(200)]
walks = 0
for data in patterns:
    for end in range(len(data) + 1):
        area[page - end : page] = data[:end]
        view = memoryview(area)[page - end : page]
        for columns in (1, 2, 3):
            for pos in range(end + 1):
                rows(view, pos, columns, 1 << 40)
                walks += 1
        view.release()
print(walks)
"""


def test_the_compiled_walk_never_reads_past_the_data() -> None:
    """Data that ends at a page no one may read (mprotect), every cut of every start, hostile and random framing:
    the walk never reads a byte past the data's end (it would be killed by SIGSEGV)."""
    compiled_rows()
    rows = [ONE_FIELD, THREE_FIELDS]
    done = subprocess.run(
        [sys.executable, "-c", GUARDED_WALKS, *(r.hex() for r in rows)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert int(done.stdout) > 100_000
