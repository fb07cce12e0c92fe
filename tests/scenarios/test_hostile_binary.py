"""Hostile feeders in binary mode: an agent that ignores its type guard or lies in a section's head or its header,
and binary values PostgreSQL refuses. Each is refused as a dump error naming the feeder and the table; the feeder's
old data stays, and nothing is left behind (docs/trust.md, "Binary mode")."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

from fedload.errors import ErrorKind
from fedload.feeder.sections import SECTION_END, chunk, section_head
from fedload.feeder.wire import BINARY_PROTOCOL, Header, StreamEncoder
from fedload.localpg import LocalCluster
from fedload.results import Outcome
from fedload.superhub.pipeline import FeederRun
from tests.support.federation import (
    AGENT,
    CONTEXT_COLS,
    HOST_COLS,
    Federation,
    make_federation,
    staging_leftovers,
    sync,
    write_script,
)
from tests.support.mid_copy import grow, rows_in_flight_soon

TABLES = ("contexts", "hosts", "words")
# A parent the federation's schema lacks: tsvector and an enum, which the superhub asks only as text.
WORDS_SUPERHUB = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE words (hub_id int NOT NULL, id int NOT NULL, tv tsvector, m mood) PARTITION BY LIST (hub_id);
"""
WORDS_FEEDER = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE words (id int NOT NULL, tv tsvector, m mood);
INSERT INTO words VALUES (1, 'fat cat', 'ok'), (2, NULL, 'sad');
"""
WORDS_COLS = "id::text || coalesce(tv::text, '') || coalesce(m::text, '')"
DIGESTS = {"hosts": HOST_COLS, "contexts": CONTEXT_COLS, "words": WORDS_COLS}


def binary_copy(*rows: Sequence[bytes | None]) -> bytes:
    """PostgreSQL's binary COPY format of `rows`, each value as its binary bytes (None: NULL)."""
    out = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
    for row in rows:
        out += struct.pack(">h", len(row))
        for value in row:
            out += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    return out + struct.pack(">h", -1)


def int4(n: int) -> bytes:
    return struct.pack(">i", n)


TSVECTOR = int4(1) + b"cat\x00" + struct.pack(">H", 0)  # one lexeme, no positions: 'cat'
# A one-dimensional array of one int4 element: what int4[] is, not the text[] the superhub's tags column is.
INT4_ARRAY = int4(1) + int4(0) + int4(23) + int4(1) + int4(1) + int4(4) + int4(7)


def section(table: str, columns: Sequence[str], data: bytes, unsent: Sequence[str] = ()) -> bytes:
    """A binary section of `table` holding `columns`, as an agent writes it."""
    head = section_head(("public", table), columns, binary=True, reason="", unsent=unsent)
    return head + chunk(data) + SECTION_END


def binary_stream(sections: Sequence[tuple[str, bytes, int]], mode: str = "binary") -> bytes:
    """A well-formed protocol 4 stream of `sections` (table, section, rows), its header stating `mode`."""
    encoder = StreamEncoder(Header("zstd", mode, "evil", "15", ["public.*"], protocol=BINARY_PROTOCOL))
    payload = b"".join(body for _, body, _ in sections)
    rows = [("public", table, n) for table, _, n in sections]
    tables = [("public", table) for table, _, _ in sections]
    trailer = {"pg_dump_exit_status": 0, "rows": rows, "tables": tables, "dump_program": "psql"}
    return encoder.start() + encoder.data(payload) + encoder.finish(**trailer)


HOST = (b"k1", b"n1")
HOSTS_OK = ("hosts", section("hosts", ["hostkey", "name"], binary_copy(HOST), unsent=["feeder_only"]), 1)


@dataclass(frozen=True)
class Lie:
    """A binary stream a hostile agent sends, the feeder's settings for the run, and what the refusal says."""

    sections: tuple[tuple[str, bytes, int], ...]
    message: str
    header_mode: str = "binary"
    settings: dict[str, object] = field(default_factory=dict)


def _hosts(columns: Sequence[str], *row: bytes | None, unsent: Sequence[str] = ()) -> tuple[str, bytes, int]:
    return ("hosts", section("hosts", columns, binary_copy(row), unsent), 1)


SENT = "table public.{}: feeder hub1 sent binary data "
LIES = {
    # issue 54 item 4: the type guard ignored, or a table asked as text sent in binary
    "tsvector-in-binary": Lie(
        (("words", section("words", ["id", "tv"], binary_copy((int4(3), TSVECTOR))), 1),),
        SENT.format("words") + "for column tv, whose type the superhub takes only as text",
    ),
    "enum-in-binary": Lie(
        (("words", section("words", ["id", "m"], binary_copy((int4(3), b"ok"))), 1),),
        SENT.format("words") + "for column m, whose type the superhub takes only as text",
    ),
    "table-asked-as-text": Lie(
        (_hosts(["hostkey", "name"], *HOST),),
        SENT.format("hosts") + "for a table the superhub asked as text",
        settings={"remap": "drop-site"},
    ),
    # issue 54 item 7: the head's column list
    "no-column-list": Lie(
        (_hosts([], int4(1), b"k1", b"n1", None, None, None),),  # the staging table's columns by position
        SENT.format("hosts") + "with no column list",
    ),
    "a-column-twice": Lie(
        (_hosts(["hostkey", "hostkey"], *HOST),),
        SENT.format("hosts") + "with column hostkey twice",
    ),
    "a-column-not-asked": Lie(
        (_hosts(["hostkey", "secret"], *HOST),),
        SENT.format("hosts") + "for column secret, which the superhub did not ask for",
    ),
    "columns-out-of-order": Lie(
        (_hosts(["name", "hostkey"], *HOST),),
        SENT.format("hosts") + "with column hostkey out of the order asked",
    ),
    "an-asked-column-said-unsent": Lie(
        (_hosts(["hostkey"], b"k1", unsent=["name"]),),
        SENT.format("hosts") + "naming column name unsent, which the superhub asked for",
    ),
    # the header's mode: copy asked, binary sent
    "binary-where-copy-was-asked": Lie(
        (HOSTS_OK,),
        "feeder hub1: the agent's stream states dump_mode 'binary', but the superhub asked for 'copy'",
        settings={"dump_mode": "copy"},
    ),
    # issue 54 item 6: values PostgreSQL refuses while it reads them
    "an-int4-of-three-bytes": Lie(
        (("contexts", section("contexts", ["hostkey", "score"], binary_copy((b"k1", b"\x00\x00\x07"))), 1),),
        "table public.contexts: the superhub refused the data of feeder hub1 (SQLSTATE 08P01): "
        "insufficient data left in message",
    ),
    "an-int4-array-for-text-array": Lie(
        (("contexts", section("contexts", ["hostkey", "tags"], binary_copy((b"k1", INT4_ARRAY))), 1),),
        "table public.contexts: the superhub refused the data of feeder hub1 (SQLSTATE 42804): ",  # words vary
    ),
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")  # a module's fixture awaits on a loop of its scope
async def synced(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Federation:
    """hub1 synced once in binary mode by its real agent, with a words table (tsvector, enum) besides the others."""
    fed = make_federation(cluster, tmp_path_factory.mktemp("hostile-binary"))
    fed.superhub_sql(WORDS_SUPERHUB)
    cluster.psql(WORDS_FEEDER, dbname=fed.feeders["hub1"])
    (fed.tmp / "drop-site.toml").write_text('[tables."public.hosts"]\ndrop = ["site"]\n')
    (run,) = await sync(fed.config(dump_mode="binary"), "hub1")
    assert run.outcome == Outcome.SUCCESS, run.error
    return fed


def hub1_data(fed: Federation) -> dict[str, str]:
    """hub1's rows on the superhub, a digest per table."""
    return {table: fed.digest(fed.superhub, table, cols, "WHERE hub_id = 1") for table, cols in DIGESTS.items()}


async def sync_stream(fed: Federation, stream: bytes, tables: Sequence[str], **settings: object) -> FeederRun:
    """Sync hub1 in binary mode (unless `settings` say otherwise) from `stream`, as its feeder sends it; the
    parents other than `tables` excluded for the run."""
    path = fed.tmp / "hostile.bin"
    path.write_bytes(stream)
    script = write_script(fed.tmp / "hostile.sh", f"cat {path}\n")
    if "remap" in settings:
        settings["remap"] = str(fed.tmp / f"{settings['remap']}.toml")
    excluded = [f"public.{table}" for table in TABLES if table not in tables]
    settings = {"dump_mode": "binary", "agent_command": [script], "exclude_tables": excluded, **settings}
    (run,) = await sync(fed.config(**settings), "hub1")
    return run


@pytest.mark.parametrize("lie", list(LIES))
async def test_a_lying_binary_stream_is_refused_and_old_data_stays(synced: Federation, lie: str) -> None:
    """Each lie fails the run as a dump error that names the feeder, the table and what was wrong; hub1's data on
    the superhub is as before, and no staging table is left."""
    case = LIES[lie]
    before = hub1_data(synced)
    stream = binary_stream(case.sections, case.header_mode)
    run = await sync_stream(synced, stream, [table for table, _, _ in case.sections], **case.settings)
    assert (run.outcome, run.error_kind) == (Outcome.FAILED, ErrorKind.DUMP), run.error
    assert case.message in (run.error or ""), run.error
    assert hub1_data(synced) == before
    assert staging_leftovers(synced) == 0


async def test_an_honest_binary_section_is_loaded(synced: Federation) -> None:
    """The control: a crafted section as an honest agent sends it (a subset of the columns asked, in their order,
    a feeder column not asked named unsent) loads, so the refusals above are the checks', not the crafting's."""
    run = await sync_stream(synced, binary_stream([HOSTS_OK]), ["hosts"])
    assert run.outcome == Outcome.SUCCESS, run.error
    assert synced.superhub_sql("SELECT hostkey || '=' || name FROM hosts WHERE hub_id = 1") == "k1=n1"


_CANCEL_COPY = (
    "SELECT count(pg_cancel_backend(a.pid)) FROM pg_stat_progress_copy p JOIN pg_stat_activity a USING (pid) "
    "WHERE a.application_name = 'fedload hub1'"
)


async def test_a_copy_cancelled_on_the_superhub_stays_the_superhubs(synced: Federation) -> None:
    """The other side of the data refusals: PostgreSQL's error in the data phase that is not about the data (the
    binary COPY cancelled on the superhub, SQLSTATE 57014) is the superhub's failure (error_kind superhub), not a
    bad dump; the old data stays."""
    before = hub1_data(synced)
    grow(synced)  # the stream spans blocks: its first half starts the COPY, which then waits for the rest
    stream = synced.tmp / "grown.bin"
    pausing = write_script(
        synced.tmp / "pausing.sh",
        f'{AGENT} "$@" > {stream}\nhalf=$(( $(stat -c %s {stream}) / 2 ))\n'
        f"head -c $half {stream}; sleep 8; tail -c +$(( half + 1 )) {stream}\n",
    )
    running = asyncio.create_task(sync(synced.config(dump_mode="binary", agent_command=[pausing]), "hub1"))
    await rows_in_flight_soon(synced)
    assert synced.superhub_int(_CANCEL_COPY) == 1
    (run,) = await asyncio.wait_for(running, 60)
    assert (run.outcome, run.error_kind) == (Outcome.FAILED, ErrorKind.SUPERHUB), run.error
    assert "canceling statement due to user request" in (run.error or "")
    assert hub1_data(synced) == before
