"""The lexical patterns: fast paths agree with the exact patterns, and hostile input costs linear time and little
memory (sre keeps ~200 bytes per iteration of a plain group repetition: 100 times the input for `''''...`)."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.transforms.test_interpreters import STATEMENT as STATEMENT_TEXT
from tests.transforms.test_interpreters import VALUE as VALUE_TEXT
from transforms import DumpSplitter, DumpSyntaxError, Item
from transforms.lexical import STATEMENT, TUPLE, VALUE, find_tuples, find_values, statement_end, tuples_span

MB = 1 << 20


def bounded(work: Callable[[], object], seconds: float, memory_bytes: int) -> None:
    """Fail if `work` takes more CPU time (of this thread: load elsewhere does not count) or memory. Timed and traced
    in two runs: tracemalloc slows every allocation several times (0.34 s became 2.2 s for the nested tuples), so a
    timing under it measured tracemalloc, and failed on a busy machine though the parser was linear."""
    start = time.thread_time()
    work()
    spent = time.thread_time() - start
    tracemalloc.start()
    try:
        work()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert spent < seconds, f"took {spent:.2f} s of CPU"
    assert peak < memory_bytes, f"needed {peak / MB:.0f} MiB"


def split(data: bytes, chunk: int = MB) -> list[Item]:
    splitter = DumpSplitter()
    items = [item for start in range(0, len(data), chunk) for item in splitter.feed(data[start : start + chunk])]
    return items + splitter.close()


HOSTILE_CUT_OFF = {
    "standard literal": b"INSERT INTO t (a) VALUES ('" + b"x;" * (2 * MB),
    "escape literal": b"SELECT E'" + b"\\\\;''" * MB,
    "quoted identifier": b'INSERT INTO "' + b'x;""' * MB,
    "block comment": b"SELECT /* " + b"* ; /*" * MB,
    "dollar quote": b"SELECT $body$ " + b"$body ;" * MB,
    "quote pairs": b"SELECT " + b"''" * (2 * MB),
    "many tokens": b"SELECT " + b"E'a' -1/2 $ " * (MB // 4),
}


@pytest.mark.parametrize("kind", list(HOSTILE_CUT_OFF))
def test_a_long_cut_off_statement_fails_fast_in_little_memory(kind: str) -> None:
    """A few MB of literal, comment or tokens without its end: one DumpSyntaxError in linear time, without
    backtracking into what was read, in memory of the order of the input (not 100 times it)."""
    dump = HOSTILE_CUT_OFF[kind]

    def fails() -> None:
        with pytest.raises(DumpSyntaxError, match="ends inside"):
            split(dump)

    bounded(fails, seconds=1.5, memory_bytes=8 * len(dump))


HOSTILE_COMPLETE = {
    "quote pairs in a tuple": b"INSERT INTO t (a) VALUES ('" + b"''" * (2 * MB) + b"');\n",
    "escapes in a tuple": b"INSERT INTO t (a) VALUES (E'" + b"\\\\" * (2 * MB) + b"');\n",
    "many tuples": b"INSERT INTO t (a) VALUES " + b"(1)," * (MB // 2) + b"(2);\n",
    "nested tuples": b"INSERT INTO t (a) VALUES " + b"((1), E'x')," * (MB // 8) + b"(2);\n",
    "comment lines": b"--\n" * MB + b"SELECT 1;\n",
    "quoted name parts": b'COPY "a""b"' + b'."c"' * (MB // 2) + b" (a) FROM stdin;\n\\.\n",
}


@pytest.mark.parametrize("kind", list(HOSTILE_COMPLETE))
def test_long_complete_statements_parse_in_linear_time_and_little_memory(kind: str) -> None:
    """Millions of tokens in one statement, tuple or literal parse in linear time and bounded memory."""
    dump = HOSTILE_COMPLETE[kind]
    items: list[Item] = []
    bounded(lambda: items.extend(split(dump)), seconds=3, memory_bytes=12 * len(dump))
    assert items


CUT_OFF = st.integers(0, 100)


@settings(max_examples=150, deadline=None)
@given(st.lists(STATEMENT_TEXT, min_size=1, max_size=6), st.data())
def test_statement_end_finds_what_the_exact_pattern_finds(statements: list[str], data: st.DataObject) -> None:
    """statement_end (bounded pieces) and STATEMENT (one exact pattern) agree, also on cut-off input."""
    text = "".join(statements).encode()
    text = text[: data.draw(st.integers(0, len(text)))]
    pos = 0
    while pos < len(text):
        exact = STATEMENT.match(text, pos)
        assert statement_end(text, pos) == (exact.end() if exact else None)
        pos = exact.end() if exact else len(text)


TUPLES = st.lists(st.lists(VALUE_TEXT, min_size=1, max_size=4).map(", ".join), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(TUPLES, st.sampled_from([",", " , ", ",\n\t"]))
def test_tuple_and_value_fast_paths_agree_with_the_exact_patterns(rows: list[str], separator: str) -> None:
    """find_tuples, find_values and tuples_span give what TUPLE and VALUE give."""
    text = separator.join(f"({row})" for row in rows).encode()
    exact = [m.group() for m in TUPLE.finditer(text)]
    assert find_tuples(text) == exact
    assert tuples_span(text, 0, len(text)) == (len(exact[0]), len(text))
    for row in exact:
        assert find_values(row, 1, len(row) - 1) == [m.group() for m in VALUE.finditer(row, 1, len(row) - 1)]


@pytest.mark.parametrize(
    ("finder", "text"),
    [
        (find_tuples, b"(1, E'a''b\\'c'), ((2)), (3)"),
        (lambda t: find_values(t, 0, len(t)), b"1, E'x,\\'y', (2, 3), 4"),
        (find_tuples, b"(" + b"'a'," * 2000 + b"1)"),
    ],
)
def test_fast_paths_fall_back_to_the_exact_patterns(finder: Callable[[bytes], list[bytes]], text: bytes) -> None:
    """E'' literals, nested parentheses and very long tuples, which the fast patterns do not take, still split
    as the exact patterns split them."""
    exact = TUPLE if text.startswith(b"(") else VALUE
    assert finder(text) == [m.group() for m in exact.finditer(text)]
