"""The agent's protocol: the command line the superhub sends, and the versions both ends state in the stream."""

from __future__ import annotations

import json
import struct
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fedload import __version__
from fedload.cli import build_parser
from fedload.errors import DumpError
from fedload.feeder.agent_options import COMPRESSIONS, DUMP_MODES, AgentOptions
from fedload.stream import (
    MAGIC,
    NEWEST_PROTOCOL,
    OLDEST_PROTOCOL,
    PROTOCOL_VERSION,
    Header,
    StreamDecoder,
    StreamEncoder,
)
from fedload.superhub.receive import DumpReceiver
from tests.support.replay import Replay

# What an argv element can hold: any text but NUL (and lone surrogates, which no OS argument carries), and but a
# lone "--": Python 3.11's argparse drops it even as an option's own value (`--pg-dump=--` reads as []), and no
# database, table pattern or pg_dump path the superhub sends is "--".
_ARG = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")).filter(lambda arg: arg != "--")

_OPTIONS = st.builds(
    AgentOptions,
    database=_ARG,
    tables=st.lists(_ARG, min_size=1, max_size=4),
    dump_mode=st.sampled_from(DUMP_MODES),
    compression=st.sampled_from(COMPRESSIONS),
    pg_dump=_ARG,
    pg_dump_args=st.lists(_ARG, max_size=4),
    remap=st.none() | st.builds(Path, _ARG.filter(bool)),
    rows_per_statement=st.integers(1, 10**9),
    max_statement_bytes=st.integers(1, 10**12),
    quiet=st.booleans(),
    zstd=_ARG,
)


@settings(deadline=None)  # pure CPU, but 200 ms (hypothesis's default) was passed on a loaded 2-core machine
@given(_OPTIONS)
@example(AgentOptions("-d", ["-t", "--table=x"], pg_dump="-", pg_dump_args=["--", "-v", "--config=x"]))
def test_agent_command_line_round_trips(options: AgentOptions) -> None:
    """Parsing the argv built from some options, as `fedload agent dump` does, gives back the same options."""
    args = build_parser().parse_args(options.to_argv())
    assert AgentOptions.from_args(args) == options


def test_agent_command_line_names_every_flag() -> None:
    """The superhub's command states every option, each flag with its value in one argument."""
    options = AgentOptions("cfdb", ['public."Hosts"', "-x"], "inserts", "gzip", "/bin/pg_dump", ["--host", "/run"])
    assert options.to_argv() == [
        "agent",
        "dump",
        "--database=cfdb",
        '--table=public."Hosts"',
        "--table=-x",
        "--mode=inserts",
        "--compression=gzip",
        "--pg-dump=/bin/pg_dump",
        "--rows-per-statement=1000",
        "--max-statement-bytes=16777216",
        "--",
        "--host",
        "/run",
    ]


def _header_frame(**fields: Any) -> bytes:
    """Magic and a header frame stating `fields` over a valid header's (None: leave the field out)."""
    header = {**asdict(Header("zstd", "copy", "0.9.0", "15.4", ["public.t"])), **fields}
    payload = json.dumps({k: v for k, v in header.items() if v is not None}).encode()
    return MAGIC + struct.pack(">cI", b"H", len(payload)) + payload


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"protocol": None, "agent_version": "0.1.0"},
            f"feeder hub1 runs fedload agent 0.1.0 (stream protocol 1); this superhub (fedload {__version__}) "
            f"needs protocol {OLDEST_PROTOCOL} to {NEWEST_PROTOCOL}: upgrade fedload on the feeder",
        ),
        (
            {"protocol": NEWEST_PROTOCOL + 1},
            f"feeder hub1 runs fedload agent 0.9.0 (stream protocol {NEWEST_PROTOCOL + 1}); this superhub "
            f"(fedload {__version__}) needs protocol {OLDEST_PROTOCOL} to {NEWEST_PROTOCOL}: "
            "upgrade fedload on the superhub",
        ),
        (
            {"format": 2},
            f"feeder hub1 runs fedload agent 0.9.0 (stream format 2); this superhub (fedload {__version__}) "
            "reads format 1: upgrade fedload on the superhub",
        ),
        (
            {"format": "one", "agent_version": 7},
            'feeder hub1 runs a fedload agent of unknown version (stream format "one"); this superhub '
            f"(fedload {__version__}) reads format 1: upgrade fedload on the feeder",
        ),
    ],
)
def test_incompatible_agent_is_refused_in_one_line(fields: dict[str, Any], message: str) -> None:
    """An agent whose stream format or protocol is too old or too new is refused at its header, in one line
    naming both versions and the side to upgrade."""
    decoder = StreamDecoder("hub1")
    with pytest.raises(DumpError) as caught:
        decoder.feed(_header_frame(**fields))
    assert str(caught.value) == message
    assert decoder.header is None


def test_agent_states_the_current_protocol() -> None:
    """A header built today states the current protocol, and the superhub reads it back."""
    decoder = StreamDecoder("hub1")
    assert decoder.feed(StreamEncoder(Header("zstd", "copy", __version__, "15.4", ["public.t"])).start()) == []
    assert decoder.header is not None
    assert decoder.header.protocol == PROTOCOL_VERSION
    assert decoder.header.agent_version == __version__


async def test_receiver_exposes_the_agents_header() -> None:
    """DumpReceiver.header is None before the first frame and the agent's header (with its version) after it."""
    encoder = StreamEncoder(Header("gzip", "copy", "0.2.7", "15.4", ["public.t"]))
    dump = b"COPY public.t (a) FROM stdin;\n1\n\\.\n"
    stream = encoder.start() + encoder.data(dump) + encoder.finish(pg_dump_exit_status=0, rows={"public.t": 1})
    receiver = DumpReceiver(Replay(stream), feeder="hub1")
    assert receiver.header is None
    items = receiver.items()
    await anext(items)
    assert receiver.header is not None
    assert (receiver.header.agent_version, receiver.header.compression) == ("0.2.7", "gzip")
    assert [item async for item in items]
    assert receiver.trailer is not None
