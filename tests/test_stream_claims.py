"""A feeder's claims in its stream, each bounded before anything believes it (docs/trust.md, "Every field the feeder
sends"): header versions, trailer counts and names, names in section heads, the agent's error. Through the
superhub's PostgreSQL: tests/scenarios/test_adversarial.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from fedload.errors import MAX_ERROR_CHARS, DumpError, capped_error
from fedload.feeder.sections import SECTION_END, section_head
from fedload.feeder.wire import FRAME_HEAD
from fedload.names import MAX_COLUMNS, TableName, columns_refusal, identifier_refusal
from fedload.stream import Header, StreamDecoder, StreamEncoder
from fedload.superhub.binary_receive import SectionSplitter

HEADER = Header("zstd", "copy", "0.2.0", "pg_dump (PostgreSQL) 18.1 (Debian 18.1-1.pgdg120+1)", ["public.t"])
DUMP = b"COPY public.t (a) FROM stdin;\n1\n\\.\n"
NAME_63 = "n" * 63


def decode(header: Header = HEADER, **trailer: Any) -> None:
    """Decode a stream of DUMP with `header`, the trailer's fields overridden by `trailer`."""
    encoder = StreamEncoder(header)
    raw = encoder.start() + encoder.data(DUMP) + encoder.finish(**{"pg_dump_exit_status": 0, **trailer})
    decoder = StreamDecoder("hub1")
    decoder.feed(raw)
    decoder.close()


@pytest.mark.parametrize(
    "name",
    [NAME_63, "é" * 31 + "n", "\udcff" * 63, "a b.c\"'"],
    ids=["63 bytes", "63 bytes of UTF-8", "63 invalid bytes as written", "any other character"],
)
def test_a_name_of_63_bytes_is_an_identifier(name: str) -> None:
    """The control: PostgreSQL holds names of up to 63 bytes, any character but NUL."""
    assert identifier_refusal(name) is None


@pytest.mark.parametrize(
    "name",
    [NAME_63 + "n", "é" * 32, "\udcff" * 64, "\ud800" * 22, "", "a\0b", "x" * 10_000_000],
    ids=["64 bytes", "64 bytes of UTF-8", "64 invalid bytes", "lone surrogates", "empty", "NUL", "10 MB"],
)
def test_a_name_past_63_bytes_is_refused_and_shown_short(name: str) -> None:
    """Longer than 63 bytes as written (invalid UTF-8 counted byte by byte), empty or with a NUL: no name, and the
    reason shows only its printable start."""
    reason = identifier_refusal(name)
    assert reason is not None
    assert len(reason) < 500  # 63 characters at most, each escaped to at most 6
    assert reason.isprintable()


def test_a_column_list_is_at_most_what_a_table_holds() -> None:
    """1600 columns is PostgreSQL's limit; a name past 63 bytes in the list refuses it too."""
    assert columns_refusal([f"c{i}" for i in range(MAX_COLUMNS)]) is None
    assert "more than a PostgreSQL table" in (columns_refusal([f"c{i}" for i in range(MAX_COLUMNS + 1)]) or "")
    assert columns_refusal(["a", NAME_63 + "n"]) is not None


def test_a_dumps_table_name_past_63_bytes_is_refused() -> None:
    """A table name in the dump text is parsed as written: quoted, 64 bytes, refused."""
    assert TableName.from_dump(f'public."{NAME_63}"'.encode()) == TableName("public", NAME_63)
    with pytest.raises(ValueError, match="no PostgreSQL identifier"):
        TableName.from_dump(f'public."{NAME_63}n"'.encode())
    with pytest.raises(ValueError, match="no PostgreSQL identifier"):
        TableName.from_dump(b'public."' + b"n" * 62 + b'\xff\xfe"')  # 64 bytes as written, not UTF-8


def test_the_control_stream_is_accepted() -> None:
    """The streams below differ from this one by the one field each refuses."""
    decode(rows=[("public", "t", 1)], tables=[("public", NAME_63)])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("agent_version", "0." * 101),
        ("agent_version", "0.2.0\x1b]0;owned\x07"),
        ("agent_version", "0.2.0\n0.3.0"),
        ("pg_dump_version", "x" * 201),
        ("pg_dump_version", "pg_dump (PostgreSQL) 18.1\u202e"),
    ],
)
def test_a_header_version_that_is_no_version_is_refused(field: str, value: str) -> None:
    """agent_version and pg_dump_version are at most 200 printable characters: a page of text or terminal
    controls refuse the stream, with a message that shows neither."""
    with pytest.raises(DumpError, match=f"header's {field} is not a version") as refused:
        decode(replace(HEADER, **{field: value}))  # type: ignore[arg-type]
    assert str(refused.value).isprintable()
    assert len(str(refused.value)) < 300


def test_a_long_version_in_a_header_of_another_protocol_is_not_echoed() -> None:
    """The version check of a header this superhub cannot read names the agent's version only if it is one."""
    with pytest.raises(DumpError, match="a fedload agent of unknown version") as refused:
        decode(replace(HEADER, agent_version="9" * 100_000, protocol=99))
    assert len(str(refused.value)) < 300


@pytest.mark.parametrize(
    ("trailer", "words"),
    [
        ({"rows": [("public", "t", -1)]}, "a count in rows"),
        ({"rows": [("public", "t", 2**63)]}, "a count in rows"),
        ({"rows": {"public.t": -1}}, "a count in rows"),
        ({"unchanged": [("public", "u", -1, "ab" * 32)]}, "a count in unchanged"),
        ({"digests": [("public", "t", "", 10**40, "")]}, "a count in digests"),
        ({"pg_dump_exit_status": 10**30}, "pg_dump_exit_status is not an exit status"),
        ({"pg_dump_exit_status": -256}, "pg_dump_exit_status is not an exit status"),
        ({"dump_program": "pg_dump; rm -rf /"}, "dump_program is not one of pg_dump, psql"),
        ({"unchanged": [("public", "u", 1, "AB" * 32)]}, "digest is not 64 lowercase hexadecimal digits"),
        ({"rows": [("public", NAME_63 + "n", 1)]}, "no PostgreSQL identifier"),
        ({"tables": [("public", "t"), ("public", "n" * 100_000)]}, "no PostgreSQL identifier"),
        ({"tables": [("", "t")]}, "no PostgreSQL identifier"),
        ({"unchanged": [("public", "u\0", 1, "ab" * 32)]}, "no PostgreSQL identifier"),
        ({"digests": [("s" * 64, "t", "", 1, "")]}, "no PostgreSQL identifier"),
    ],
)
def test_a_trailer_claim_out_of_bounds_is_refused(trailer: dict[str, Any], words: str) -> None:
    """Counts from 0 to 2^63-1, an exit status of -255 to 255, dump_program the agent's, every table name an
    identifier, an unchanged table's digest in the agent's format: else the trailer is refused, in a short line."""
    with pytest.raises(DumpError, match="the stream's trailer is refused: ") as refused:
        decode(**trailer)
    assert words in str(refused.value)
    assert len(str(refused.value)) < 300


def test_a_trailers_huge_payload_bytes_is_refused() -> None:
    """payload_bytes is compared with what arrived; a number of 4000 digits is refused before it reaches a
    message."""
    encoder = StreamEncoder(HEADER)
    raw = encoder.start() + encoder.data(DUMP) + encoder.finish(pg_dump_exit_status=0)
    trailer = raw.rindex(b'{"pg_dump_exit_status"')  # the last frame's JSON
    stated = raw[trailer:].replace(b'"payload_bytes": %d' % len(DUMP), b'"payload_bytes": ' + b"9" * 4000)
    huge = raw[: trailer - FRAME_HEAD.size] + FRAME_HEAD.pack(b"T", len(stated)) + stated
    decoder = StreamDecoder()
    with pytest.raises(DumpError, match="a count in payload_bytes") as refused:
        decoder.feed(huge)
    assert len(str(refused.value)) < 300


@pytest.mark.parametrize(
    ("head", "words"),
    [
        (section_head(("public", NAME_63 + "n"), ["a"], binary=True, reason="", unsent=[]), "names no table"),
        (section_head(("", "t"), ["a"], binary=True, reason="", unsent=[]), "names no table"),
        (section_head(("public", "t"), ["a", NAME_63 + "n"], binary=True, reason="", unsent=[]), "lists columns"),
        (section_head(("public", "t"), ["a"], binary=False, reason="", unsent=["x\0"]), "lists unsent"),
        (section_head(("public", "t"), [f"c{i}" for i in range(1601)], binary=True, reason="", unsent=[]), "1601"),
    ],
)
def test_a_section_heads_names_are_identifiers(head: bytes, words: str) -> None:
    """A binary section head's schema, name, columns and unsent columns are names PostgreSQL could hold, at most
    1600 columns: else the stream is refused."""
    with pytest.raises(DumpError, match="a section head of the binary stream") as refused:
        SectionSplitter().feed(head + SECTION_END)
    assert words in str(refused.value)


def test_a_section_heads_names_of_63_bytes_are_read() -> None:
    """The control: 63-byte names and 1600 columns in a head are read."""
    columns = [f"{i:063d}" for i in range(MAX_COLUMNS)]
    head = section_head(("s" * 63, NAME_63), columns, binary=True, reason="", unsent=[NAME_63])
    (start, _) = SectionSplitter().feed(head + SECTION_END)
    assert start.table == TableName("s" * 63, NAME_63)  # type: ignore[union-attr]


def test_a_runs_error_is_one_printable_line_of_bounded_length() -> None:
    """A feeder's own words in a run's error (its agent's `error`, names) keep the error's start, printable, at
    most MAX_ERROR_CHARS and a count of what was cut."""
    error = capped_error("the feeder's agent failed: " + "evil\n\x1b[2J\u202e" * 100_000)
    assert error.startswith("the feeder's agent failed: evil \\x1b[2J\\u202e")
    assert error.isprintable()
    assert len(error) <= MAX_ERROR_CHARS + 40
    assert error.endswith("more characters)")
    assert capped_error("short\nerror") == "short error"


def test_deeply_nested_json_is_refused_in_a_trailer_and_a_section_head() -> None:
    """JSON nested 100,000 deep (a field no superhub knows) is refused by the parsers' depth limits, not by
    Python's stack: the trailer's (pydantic's, 255 levels) and a section head's (json's RecursionError)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    encoder = StreamEncoder(HEADER)
    raw = encoder.start() + encoder.data(DUMP) + encoder.finish(pg_dump_exit_status=0)
    trailer = raw.rindex(b'{"pg_dump_exit_status"')
    stated = raw[trailer:-1] + b', "x": ' + deep + b"}"
    with pytest.raises(DumpError, match="recursion limit"):
        StreamDecoder().feed(raw[: trailer - FRAME_HEAD.size] + FRAME_HEAD.pack(b"T", len(stated)) + stated)
    head = section_head(("public", "t"), ["a"], binary=True, reason="", unsent=[])
    body = head[FRAME_HEAD.size : -1] + b', "x": ' + deep + b"}"
    with pytest.raises(DumpError, match="a section head of the binary stream is not valid"):
        SectionSplitter().feed(FRAME_HEAD.pack(b"S", len(body)) + body + SECTION_END)
