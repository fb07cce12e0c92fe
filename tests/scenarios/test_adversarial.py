"""Adversarial feeders: fuzzed real dumps, injection attempts, huge and deep values, invalid UTF-8.

The transformer and the stream decoders end every input either normally or with their own error (never another
exception, never a hang). On the superhub, a dump can at most load rows into its feeder's partitions: every case
checks that nothing else changed (relations, functions, roles, settings, the other feeders' data).
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from fedload.errors import MAX_ERROR_CHARS, DumpError, ErrorKind
from fedload.localpg import LocalCluster
from fedload.results import Outcome
from fedload.stream import GzipDecoder, Header, StreamDecoder, StreamEncoder
from fedload.superhub.pipeline import FeederRun
from tests.support.federation import (
    CONTEXT_COLS,
    FEEDER_DATA,
    HOST_COLS,
    SCHEMA,
    Federation,
    crafted_stream,
    make_federation,
    staging_leftovers,
    sync,
    write_script,
)
from tests.support.fix_tally import Category
from transforms import DumpSyntaxError, Transformer, TransformError, TransformOptions

DUMP_OPTIONS = {"copy": [], "inserts": ["--column-inserts"], "rows-per-insert": ["--rows-per-insert=7"]}
PWNED = Path("/tmp/fedload-pwned")
# Bytes that matter to SQL, COPY and psql, spliced into real dumps besides arbitrary ones.
SPECIAL = [b"'", b"''", b'"', b"\\", b"\\.\n", b"\n", b"\t", b";", b"(", b")", b"$$", b"E'", b"\xff", b"\x00", b"--"]
# How the transformer and the importer refuse a corrupted dump: by the dump's line, or its own fault; never a
# superhub failure or another exception's text. After COPY data the superhub's receiver, which counts no lines
# there, names the byte.
SYNTAX_ERROR = re.compile(r"line \d+ \(byte \d+\): \S.*")
DUMP_FAULT = re.compile(
    r"dump (line|byte) \d+: |the dump is malformed at (line \d+ \(byte \d+\)|byte \d+): "
    r"|the superhub rejected a row: "
    r"|table public\.\w+: the superhub refused the data of feeder hub1 \(SQLSTATE \w{5}\): "
    r"|the dump of feeder hub1 lacks table\(s\) |table public\.\w+: the feeder sent "
)
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def real_dumps(cluster: LocalCluster) -> dict[str, bytes]:
    """pg_dump output of a small feeder with awkward values, in every dump mode."""
    cluster.psql("CREATE DATABASE adversarial_source")
    cluster.psql(SCHEMA + FEEDER_DATA.format(n=30, m=60), dbname="adversarial_source")
    dumps = {}
    for mode, options in DUMP_OPTIONS.items():
        dumps[mode] = pg_dump(cluster, "adversarial_source", options)
    return dumps


def pg_dump(cluster: LocalCluster, db: str, options: list[str]) -> bytes:
    """A data-only dump of the public tables, as the agent takes it."""
    import subprocess  # noqa: PLC0415

    argv = [cluster.install.tool("pg_dump"), "--data-only", "--table=public.*", *options, "--dbname"]
    return subprocess.run([*argv, cluster.conninfo(db)], capture_output=True, check=True, timeout=60).stdout


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """`original` truncated, with a bit flipped, with bytes spliced in, or with a span cut out."""
    offset = draw(st.integers(0, len(original) - 1), label="offset")
    kind = draw(st.sampled_from(["truncate", "flip", "splice", "cut"]), label="mutation")
    if kind == "truncate":
        return original[:offset]
    if kind == "flip":
        bit = draw(st.integers(0, 7), label="bit")
        return original[:offset] + bytes([original[offset] ^ (1 << bit)]) + original[offset + 1 :]
    if kind == "splice":
        spliced = draw(st.sampled_from(SPECIAL) | st.binary(min_size=1, max_size=12), label="spliced")
        return original[:offset] + spliced + original[offset:]
    return original[:offset] + original[offset + draw(st.integers(1, 64), label="cut") :]


def fed_in_chunks(feed: object, data: bytes, chunk: int) -> list[bytes]:
    """Everything a decoder's or transformer's `feed` returns for `data` given `chunk` bytes at a time."""
    out: list[bytes] = []
    for i in range(0, len(data), chunk):
        out += feed(data[i : i + chunk])  # type: ignore[operator]
    return out


@pytest.mark.parametrize("mode", list(DUMP_OPTIONS))
@FUZZ
@given(data=st.data())
def test_transformer_ends_every_mutated_dump_cleanly(
    real_dumps: dict[str, bytes], category: Category, mode: str, data: st.DataObject
) -> None:
    """A truncated or corrupted dump is transformed or rejected with a TransformError, never anything else."""
    category("adversarial:truncations and byte flips (transformer)")
    category.inputs()
    dump = data.draw(mutated(real_dumps[mode]), label="dump")
    chunk = data.draw(st.integers(1, 4096), label="chunk")
    transformer = Transformer(TransformOptions(rows_per_statement=5))
    error: TransformError | None = None
    try:
        fed_in_chunks(transformer.feed, dump, chunk)
        transformer.close()
    except TransformError as exc:
        error = exc
    if error is not None:
        note(f"rejected: {error}")
        assert isinstance(error, DumpSyntaxError)  # no remap here: only the dump's syntax can be wrong
        assert SYNTAX_ERROR.fullmatch(str(error)), str(error)


def framed(dump: bytes, compression: str) -> bytes:
    """The agent's stream around `dump`."""
    encoder = StreamEncoder(Header(compression, "copy", "test", "15", ["public.*"]))
    return encoder.start() + encoder.data(dump) + encoder.finish(pg_dump_exit_status=0, rows={"public.hosts": 30})


@pytest.mark.parametrize("wrapping", ["zstd", "gzip", "plain gzip"])
@FUZZ
@given(data=st.data())
def test_decoders_accept_only_the_exact_dump(
    real_dumps: dict[str, bytes], category: Category, wrapping: str, data: st.DataObject
) -> None:
    """A mutated stream either fails with a DumpError or still yields exactly the dump that was sent."""
    category("adversarial:truncations and byte flips (stream)")
    category.inputs()
    dump = real_dumps["copy"]
    decoder: StreamDecoder | GzipDecoder
    if wrapping == "plain gzip":  # what pg_dump | gzip sends when the feeder has no agent
        stream, decoder = zlib.compress(dump, 6, wbits=31), GzipDecoder()
    else:
        stream, decoder = framed(dump, wrapping), StreamDecoder()
    corrupted = data.draw(mutated(stream), label="stream")
    try:
        out = fed_in_chunks(decoder.feed, corrupted, data.draw(st.integers(1, 8192), label="chunk"))
        decoder.close()
    except DumpError as exc:
        note(f"rejected: {exc}")
        return
    assert b"".join(out) == dump


# --- on the superhub ---------------------------------------------------------------------------------------------

FINGERPRINT = """
SELECT concat_ws(' | ',
    (SELECT string_agg(n.nspname || '.' || c.relname || ':' || c.relkind::text, ',' ORDER BY n.nspname, c.relname)
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') AND n.nspname NOT LIKE 'pg\\_%'
       AND n.nspname NOT IN ('information_schema', 'fedload_stage')),
    (SELECT count(*) FROM pg_proc WHERE pronamespace NOT IN ('pg_catalog'::regnamespace,
                                                             'information_schema'::regnamespace)),
    (SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles),
    (SELECT count(*) FROM pg_db_role_setting), (SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal),
    (SELECT count(*) FROM pg_event_trigger))
"""


@dataclass
class SuperhubState:
    """What a dump of hub1 must not change: the superhub's objects and the other feeders' data."""

    fingerprint: str
    others: list[str]
    hub1: list[str]

    @classmethod
    def of(cls, fed: Federation) -> SuperhubState:
        def digests(where: str) -> list[str]:
            return [
                fed.digest(fed.superhub, t, c, where) for t, c in (("hosts", HOST_COLS), ("contexts", CONTEXT_COLS))
            ]

        return cls(fed.superhub_sql(FINGERPRINT), digests("WHERE hub_id <> 1"), digests("WHERE hub_id = 1"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")  # a module's fixture awaits on a loop of its scope
async def synced(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Federation:
    """A federation synced once, shared by the attacks below: each compares the superhub before and after it."""
    fed = make_federation(cluster, tmp_path_factory.mktemp("adversarial"))
    assert [r.outcome for r in await sync(fed.config())] == [Outcome.SUCCESS] * 3
    return fed


@pytest.fixture(scope="module")
def hub3_dumps(synced: Federation) -> dict[str, bytes]:
    """hub3's data-only dumps (copy, and inserts with --column-inserts), taken once: the fuzz tests mutate them."""
    cluster, db = synced.cluster, synced.feeders["hub3"]
    return {"copy": pg_dump(cluster, db, []), "inserts": pg_dump(cluster, db, ["--column-inserts"])}


async def sync_crafted(fed: Federation, stream: bytes, name: str = "crafted", **overrides: object) -> FeederRun:
    """Sync hub1 from a stream that its feeder sends as is; crafted dumps carry only hosts unless they say so."""
    overrides.setdefault("exclude_tables", ["public.contexts"])
    path = fed.tmp / f"{name}.bin"
    path.write_bytes(stream)
    script = write_script(fed.tmp / f"{name}.sh", f"cat {path}\n")
    return (await sync(fed.config(agent_command=[script], **overrides), "hub1"))[0]


def assert_only_hub1_data_changed(fed: Federation, before: SuperhubState, run: FeederRun) -> SuperhubState:
    """Nothing but hub1's rows may differ; a failed run changes nothing at all. The state after the run."""
    after = SuperhubState.of(fed)
    assert after.fingerprint == before.fingerprint
    assert after.others == before.others
    if run.outcome != Outcome.SUCCESS:
        assert after.hub1 == before.hub1
    assert staging_leftovers(fed) == 0
    assert not PWNED.exists()
    return after


def hub1_hosts(fed: Federation) -> list[list[str | None]]:
    """hub1's (hostkey, name) rows on the superhub by hostkey, exactly as stored (JSON keeps every character)."""
    rows: list[list[str | None]] = json.loads(
        fed.superhub_sql(
            "SELECT json_agg(json_build_array(hostkey, name) ORDER BY hostkey) FROM hosts WHERE hub_id = 1"
        )
    )
    return rows


def one_line_error(run: FeederRun) -> str:
    """A failed run's error: one sentence, no traceback."""
    assert run.outcome == Outcome.FAILED
    error = run.error or ""
    assert error, "a failed run must say why"
    assert "Traceback" not in error
    return error


@pytest.mark.slow  # some sixty syncs
@pytest.mark.parametrize("mode", ["copy", "inserts"])
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data())
async def test_importer_loads_mutated_dumps_or_rejects_them(
    synced: Federation, hub3_dumps: dict[str, bytes], category: Category, mode: str, data: st.DataObject
) -> None:
    """A corrupted dump in a well-formed stream loads rows into hub1's partitions, or fails and changes nothing."""
    category("adversarial:truncations and byte flips (importer)")
    category.inputs()
    before = SuperhubState.of(synced)
    dump = data.draw(mutated(hub3_dumps[mode]), label="dump")
    run = await sync_crafted(synced, crafted_stream(dump, mode=mode), dump_mode=mode)
    note(f"{run.outcome}: {run.error}")
    event(run.outcome)
    if run.outcome == Outcome.SUCCESS:
        assert int(synced.superhub_sql("SELECT count(*) FROM hosts WHERE hub_id = 1")) == run.rows["public.hosts"]
    else:
        assert DUMP_FAULT.match(one_line_error(run)), run.error
    assert_only_hub1_data_changed(synced, before, run)


@dataclass(frozen=True)
class Attack:
    """A dump a hostile feeder sends, and whether fedload must reject it (saying `message`) or may load it as plain
    data: then hub1's hosts on the superhub are exactly `arrived` (hostkey, name)."""

    dump: bytes
    rejected: bool
    mode: str = "inserts"
    message: str = ""
    arrived: tuple[tuple[str, str | None], ...] = ()
    exclude_tables: tuple[str, ...] = ("public.contexts",)


ROW = b"INSERT INTO public.hosts (hostkey, name) VALUES "
NOT_PLAIN = "dump line 1: a VALUES tuple is not a list of plain literals: "
REFUSED = "dump line 1: the dump contains a statement fedload does not accept: "
NOT_CONFIGURED = "dump line 1: the dump contains table {}, which is not configured"
NO_HOSTS = "the dump of feeder hub1 lacks table(s) public.hosts: fedload will not replace their data with nothing"
INJECTIONS = {
    "quote in a value": Attack(
        ROW + b"('a''); DROP TABLE public.contexts; --', 'b');\n",
        rejected=False,
        arrived=(("a'); DROP TABLE public.contexts; --", "b"),),
    ),
    "backslash before a quote": Attack(
        ROW + b"('\\', ') ; DROP TABLE public.contexts; --');\n",
        rejected=False,
        arrived=(("\\", ") ; DROP TABLE public.contexts; --"),),
    ),
    "quoted CSV-significant text": Attack(
        ROW + b"('a\"b,c', '\n\\.\n'), ('NULL', ''), (' x ', E'\\r'), ('\"', '\"'', NULL');\n",
        rejected=False,  # E'' keeps the whole statement on the INSERT path
        arrived=((" x ", "\r"), ('"', "\"', NULL"), ("NULL", ""), ('a"b,c', "\n\\.\n")),
    ),
    "quoted CSV-significant text, plain": Attack(  # the COPY path (CSV, quote ') keeps every byte of the strings
        ROW + b"('a\"b,c', '\n\\.\n'), ('NULL', ''), (' x ', NULL), ('\"', '\"'', NULL');\n",
        rejected=False,
        arrived=((" x ", None), ('"', "\"', NULL"), ("NULL", ""), ('a"b,c', "\n\\.\n")),
    ),
    "escape string": Attack(
        ROW + b"(E'a\\''); DROP TABLE public.contexts; --', 'b');\n",
        rejected=True,
        message="dump line 1: a VALUES tuple has 1 values for its column list",
    ),
    "dollar quoting": Attack(ROW + b"($$a$$, 'b');\n", rejected=True, message=NOT_PLAIN + "\"($$a$$, 'b')\""),
    "cast": Attack(ROW + b"('a'::text, 'b');\n", rejected=True, message=NOT_PLAIN + "\"('a'::text, 'b')\""),
    "function call": Attack(
        ROW + b"('a', pg_sleep(30)::text);\n", rejected=True, message=NOT_PLAIN + "\"('a', pg_sleep(30)::text)\""
    ),
    "comment in a tuple": Attack(
        ROW + b"('a' /* x */, 'b');\n", rejected=True, message=NOT_PLAIN + "\"('a' /* x */, 'b')\""
    ),
    "returning": Attack(
        ROW + b"('a', 'b') RETURNING (SELECT 1);\n",
        rejected=True,
        message=REFUSED + "\"INSERT INTO public.hosts (hostkey, name) VALUES ('a', 'b') R...\"",
    ),
    "on conflict": Attack(  # pg_dump writes it
        ROW + b"('a', 'b') ON CONFLICT DO NOTHING;\n", rejected=False, arrived=(("a", "b"),)
    ),
    "insert select": Attack(
        b"INSERT INTO public.hosts (hostkey) SELECT rolname FROM pg_roles;\n",
        rejected=True,
        message=REFUSED + "'INSERT INTO public.hosts (hostkey) SELECT rolname FROM pg_ro...'",
    ),
    "quoted column with injection": Attack(  # a column the superhub does not have: dropped
        b'INSERT INTO public.hosts (hostkey, "name"") VALUES (1); DROP TABLE public.contexts; --") '
        b"VALUES ('a', 'b');\n",
        rejected=False,
        arrived=(("a", None),),
    ),
    "quoted table with injection": Attack(  # a table the superhub does not have: skipped
        ROW + b"('a', 'b');\nINSERT INTO public.\"hosts; DROP TABLE public.contexts; --\" (hostkey) VALUES ('a');\n",
        rejected=False,
        arrived=(("a", "b"),),
    ),
    "feeder key column": Attack(
        b"INSERT INTO public.hosts (hostkey, hub_id) VALUES ('a', 2);\n",
        rejected=True,
        message="table public.hosts: the dump of feeder hub1 carries the feeder key column hub_id with a value other "
        "than its key 1",
    ),
    "own feeder key column": Attack(
        b"INSERT INTO public.hosts (hostkey, hub_id) VALUES ('a', 1);\n", rejected=False, arrived=(("a", None),)
    ),
    "other feeder's partition": Attack(
        b"INSERT INTO fedload_parts.hosts_hub2 (hostkey) VALUES ('a');\n",
        rejected=True,
        message=NOT_CONFIGURED.format("fedload_parts.hosts_hub2"),
    ),
    "staging schema": Attack(
        b"INSERT INTO fedload_stage.r1_0 (hostkey) VALUES ('a');\n",
        rejected=True,
        message=NOT_CONFIGURED.format("fedload_stage.r1_0"),
    ),
    "copy from program": Attack(
        b"COPY public.hosts (hostkey) FROM PROGRAM 'touch /tmp/fedload-pwned';\n",
        rejected=True,
        mode="copy",
        message=REFUSED + '"COPY public.hosts (hostkey) FROM PROGRAM \'touch /tmp/fedload..."',
    ),
    "copy from a file": Attack(
        b"COPY public.hosts (hostkey) FROM '/etc/passwd';\n",
        rejected=True,
        mode="copy",
        message=REFUSED + "\"COPY public.hosts (hostkey) FROM '/etc/passwd';\"",
    ),
    "copy with options": Attack(
        b"COPY public.hosts (hostkey) FROM stdin WITH (FORMAT csv);\na\n\\.\n",
        rejected=True,
        mode="copy",
        message="the dump is malformed at line 2 (byte 58): unexpected text 'a' where an SQL statement should start",
    ),
    "copy header with injection": Attack(  # a column the superhub does not have: dropped
        b'COPY public.hosts (hostkey, "x"") FROM PROGRAM \'touch /tmp/fedload-pwned\'; --") FROM stdin;\nk\tv\n\\.\n',
        rejected=False,
        mode="copy",
        arrived=(("k", None),),
    ),
    "copy end marker then sql": Attack(
        b"COPY public.hosts (hostkey) FROM stdin;\nk\n\\.\nDROP TABLE public.contexts;\n",
        rejected=True,
        mode="copy",
        message="dump byte 45: the dump contains a statement fedload does not accept: 'DROP TABLE public.contexts;'",
    ),
    "psql copy": Attack(
        b"\\copy public.hosts from '/etc/passwd'\n",
        rejected=True,
        message="dump line 1: the dump contains a psql command fedload does not accept: "
        "\"\\\\copy public.hosts from '/etc/passwd'\"",
    ),
    "psql include": Attack(
        b"\\i /etc/passwd\n",
        rejected=True,
        message="dump line 1: the dump contains a psql command fedload does not accept: '\\\\i /etc/passwd'",
    ),
    "psql gexec": Attack(
        b"SELECT 'DROP TABLE public.contexts' \\gexec\n",
        rejected=True,
        message="the dump is malformed at line 1 (byte 0): the input ends inside this statement",
    ),
    "do block": Attack(
        b"DO $$ BEGIN PERFORM pg_sleep(1); END $$;\n",
        rejected=True,
        message=REFUSED + "'DO $$ BEGIN PERFORM pg_sleep(1); END $$;'",
    ),
    "string settings off": Attack(
        b"SET standard_conforming_strings = off;\n",
        rejected=True,
        message="dump line 1: the dump sets standard_conforming_strings = off, which fedload refuses",
    ),
    "setting not in utf-8": Attack(
        b"SET client_encoding = '\xd5TF8';\n",
        rejected=True,
        message="dump line 1: the dump sets client_encoding = '\ufffdtf8', which fedload refuses",
    ),
    "search path": Attack(
        b"SET search_path = fedload_parts, public;\n",
        rejected=True,
        message=REFUSED + "'SET search_path = fedload_parts, public;'",
    ),
    "role": Attack(
        b"SET SESSION AUTHORIZATION postgres;\n",
        rejected=True,
        message=REFUSED + "'SET SESSION AUTHORIZATION postgres;'",
    ),
    "transaction control": Attack(b"COMMIT;\n", rejected=True, message=REFUSED + "'COMMIT;'"),
    "deep parentheses": Attack(
        ROW + b"(" * 100_000 + b"'a'" + b")" * 100_000 + b";\n",
        rejected=True,
        message=REFUSED + "'INSERT INTO public.hosts (hostkey, name) VALUES ((((((((((((...'",
    ),
    "deep array": Attack(  # with hosts, so that the array is what fails
        b"COPY public.hosts (hostkey) FROM stdin;\nk\n\\.\n"
        b"COPY public.contexts (hostkey, tags) FROM stdin;\nk\t" + b"{" * 10_000 + b"}" * 10_000 + b"\n\\.\n",
        rejected=True,
        mode="copy",
        message="table public.contexts: the superhub refused the data of feeder hub1 (SQLSTATE 54000): number of array "
        "dimensions (7) exceeds the maximum allowed (6)",
        exclude_tables=(),
    ),
    "invalid utf-8 in a copy row": Attack(
        b"COPY public.hosts (hostkey, name) FROM stdin;\nk\tbad \xff\xfe here\n\\.\n",
        rejected=True,
        mode="copy",
        message="table public.hosts: the superhub refused the data of feeder hub1 (SQLSTATE 22021): invalid byte "
        'sequence for encoding "UTF8": 0xff',
    ),
    "invalid utf-8 in a value": Attack(
        ROW + b"('k', 'bad \xff\xfe here');\n", rejected=True, message="dump line 1: a VALUES tuple is not valid UTF-8"
    ),
    "invalid utf-8 in a table name": Attack(  # a table the superhub does not have: skipped
        ROW + b"('a', 'b');\nINSERT INTO public.\"ho\xffsts\" (hostkey) VALUES ('a');\n",
        rejected=False,
        arrived=(("a", "b"),),
    ),
    "only another table": Attack(
        b"INSERT INTO public.\"hosts \" (hostkey) VALUES ('a');\n", rejected=True, message=NO_HOSTS
    ),
    "invalid utf-8 in a column name": Attack(  # a column the superhub does not have: dropped
        b'COPY public.hosts (hostkey, "na\xffme") FROM stdin;\nk\tv\n\\.\n',
        rejected=False,
        mode="copy",
        arrived=(("k", None),),
    ),
    "nul byte": Attack(
        ROW + b"('k', 'a\x00b');\n", rejected=True, message="dump line 1: a VALUES tuple contains a NUL byte"
    ),
    # Names past PostgreSQL's 63 bytes name nothing the superhub has: refused, where they were skipped or dropped.
    "identifier: a 64-byte table name": Attack(
        b"COPY public.hosts (hostkey) FROM stdin;\nk\n\\.\n"
        b'COPY public."' + b"n" * 64 + b'" (hostkey) FROM stdin;\nk\n\\.\n',
        rejected=True,
        mode="copy",
        message=f"dump byte 45: the name '{'n' * 63}...' (64 bytes) is no PostgreSQL identifier",
    ),
    "identifier: a 64-byte column name": Attack(
        b'COPY public.hosts (hostkey, "' + b"n" * 64 + b'") FROM stdin;\nk\tv\n\\.\n',
        rejected=True,
        mode="copy",
        message="dump line 1: the columns of public.hosts: the name 'nnn",
    ),
    "identifier: a column name of 64 bytes as written, not utf-8": Attack(
        b'COPY public.hosts (hostkey, "' + b"n" * 62 + b'\xff\xfe") FROM stdin;\nk\tv\n\\.\n',
        rejected=True,
        mode="copy",
        message="nn\\xff...' (64 bytes) is no PostgreSQL identifier",
    ),
    "identifier: a 63-byte column name": Attack(  # the control: a column the superhub does not have, dropped
        b'COPY public.hosts (hostkey, "' + b"n" * 63 + b'") FROM stdin;\nk\tv\n\\.\n',
        rejected=False,
        mode="copy",
        arrived=(("k", None),),
    ),
    "identifier: 1601 columns": Attack(
        b"COPY public.hosts (hostkey, "
        + b", ".join(b"c%d" % i for i in range(1600))
        + b") FROM stdin;\nk"
        + b"\tv" * 1600
        + b"\n\\.\n",
        rejected=True,
        mode="copy",
        message="dump line 1: the columns of public.hosts: 1601 columns, more than a PostgreSQL table can have",
    ),
    "identifier: a 64-byte column in an insert": Attack(
        b'INSERT INTO public.hosts (hostkey, "' + b"n" * 64 + b"\") VALUES ('a', 'b');\n",
        rejected=True,
        message="dump line 1: the columns of public.hosts: the name 'nnn",
    ),
}


def category_of(attack: str) -> str:
    """The summary category of a corpus entry."""
    if "utf-8" in attack or "nul" in attack:
        return "adversarial:invalid utf-8"
    if attack.startswith("identifier"):
        return "adversarial:identifiers"
    if "deep" in attack:
        return "adversarial:deep nesting"
    if attack.startswith(("quote", "backslash", "escape", "quoted", "copy header")):
        return "adversarial:sql injection"
    return "adversarial:statements other than data"


@pytest.mark.parametrize("attack", list(INJECTIONS))
async def test_injection_corpus_loads_only_data(synced: Federation, category: Category, attack: str) -> None:
    """Each attack is rejected with a one-line error, or its text is loaded as plain data; nothing else changes."""
    category(category_of(attack))
    before = SuperhubState.of(synced)
    case = INJECTIONS[attack]
    run = await sync_crafted(
        synced,
        crafted_stream(case.dump, mode=case.mode),
        dump_mode=case.mode,
        exclude_tables=list(case.exclude_tables),
    )
    assert run.outcome == (Outcome.FAILED if case.rejected else Outcome.SUCCESS), run.error
    if case.rejected:
        assert case.message in one_line_error(run)
    else:
        assert hub1_hosts(synced) == [list(row) for row in case.arrived]
    assert_only_hub1_data_changed(synced, before, run)


async def test_values_stay_data_when_the_superhub_defaults_to_backslash_escapes(
    federation: Federation, category: Category
) -> None:
    """A superhub database set to standard_conforming_strings = off does not turn a backslash into an injection."""
    category("adversarial:sql injection")
    assert [r.outcome for r in await sync(federation.config())] == [Outcome.SUCCESS] * 3
    before = SuperhubState.of(federation)
    federation.superhub_sql(f"ALTER DATABASE {federation.superhub} SET standard_conforming_strings = off")
    before.fingerprint = federation.superhub_sql(FINGERPRINT)
    stream = crafted_stream(INJECTIONS["backslash before a quote"].dump, mode="inserts")
    run = await sync_crafted(federation, stream, dump_mode="inserts")
    assert run.outcome == Outcome.SUCCESS, run.error
    assert_only_hub1_data_changed(federation, before, run)
    assert federation.superhub_sql("SELECT name FROM hosts WHERE hub_id = 1") == ") ; DROP TABLE public.contexts; --"


@pytest.mark.slow  # 100 MiB through pg_dump, the agent and the superhub, twice
@pytest.mark.timeout(120)  # ten times its usual time: a splitter that rescans a huge row per chunk takes minutes
@pytest.mark.parametrize("mode", ["copy", "inserts"])
async def test_a_100_mb_value_and_deep_arrays_load_intact(
    federation: Federation, category: Category, mode: str
) -> None:
    """A single 100 MiB value, a 6-dimensional array and a 100,000-element array arrive exactly as on the feeder."""
    category("adversarial:huge values")
    category("adversarial:deep nesting")
    db = federation.feeders["hub3"]
    federation.cluster.psql(
        "UPDATE hosts SET name = repeat(md5(hostkey), 3276800) WHERE hostkey = 'SHA=1';"
        "UPDATE contexts SET tags = '{{{{{{a}}}}}}' WHERE score = 1;"
        "UPDATE contexts SET tags = (SELECT array_agg(g::text) FROM generate_series(1, 100000) g) WHERE score = 2;",
        dbname=db,
    )
    (run,) = await sync(federation.config(dump_mode=mode), "hub3")
    assert run.outcome == Outcome.SUCCESS, run.error
    assert run.dump_bytes > 100 * 1024 * 1024
    for table, cols in (("hosts", HOST_COLS), ("contexts", CONTEXT_COLS)):
        assert federation.digest(federation.superhub, table, cols, "WHERE hub_id = 3") == federation.digest(
            db, table, cols
        )
    assert federation.superhub_sql("SELECT max(length(name)) FROM hosts") == str(100 * 1024 * 1024)


# --- every field of the stream's header and trailer (docs/trust.md, "Every field the feeder sends") --------------

HOST_ROW = b"COPY public.hosts (hostkey, name) FROM stdin;\nk\tv\n\\.\n"


@dataclass(frozen=True)
class Claim:
    """A stream of one host whose header or trailer claims what no agent would; the words of the refusal."""

    message: str
    header: dict[str, str] = field(default_factory=dict)  # agent_version, pg_dump_version
    trailer: dict[str, object] = field(default_factory=dict)


CLAIMS = {
    "a page as agent_version": Claim(
        "the header's agent_version is not a version", header={"agent_version": "9" * 10**5}
    ),
    "terminal controls in agent_version": Claim(
        "the header's agent_version is not a version", header={"agent_version": "0.3\x1b]0;owned\x07"}
    ),
    "a page as pg_dump_version": Claim(
        "the header's pg_dump_version is not a version", header={"pg_dump_version": "pg_dump " * 10**4}
    ),
    "half a megabyte of the agent's error": Claim(
        "the feeder's agent failed: evil \\x1b[2Jevil \\x1b[2Jevil", trailer={"error": "evil\n\x1b[2J" * 50_000}
    ),
    "pg_dump's stderr": Claim(
        "pg_dump failed on the feeder with exit status 1: ...",
        trailer={"pg_dump_exit_status": 1, "stderr_tail": "x" * 10**5},
    ),
    "an exit status of 10^30": Claim(
        "pg_dump_exit_status is not an exit status", trailer={"pg_dump_exit_status": 10**30}
    ),
    "negative rows": Claim("a count in rows is not from 0", trailer={"rows": [("public", "hosts", -1)]}),
    "rows past bigint": Claim("a count in rows is not from 0", trailer={"rows": [("public", "hosts", 2**63)]}),
    "a 64-byte name in tables": Claim(
        "is no PostgreSQL identifier", trailer={"tables": [("public", "hosts"), ("public", "n" * 64)]}
    ),
    "a command as dump_program": Claim(
        "dump_program is not one of pg_dump, psql", trailer={"dump_program": "sh -c 'touch /tmp/fedload-pwned'"}
    ),
    "an unchanged table's digest not in the agent's format": Claim(
        "digest is not 64 lowercase hexadecimal digits", trailer={"unchanged": [("public", "hosts", 1, "x")]}
    ),
}


def claiming(claim: Claim) -> bytes:
    """The stream of HOST_ROW, as a hostile feeder could send it, with `claim`'s header and trailer fields."""
    versions = {"agent_version": "0.3.0", "pg_dump_version": "pg_dump (PostgreSQL) 15.4", **claim.header}
    encoder = StreamEncoder(
        Header("zstd", "copy", versions["agent_version"], versions["pg_dump_version"], ["public.*"])
    )
    trailer: dict[str, object] = {"pg_dump_exit_status": 0, "rows": [("public", "hosts", 1)], **claim.trailer}
    return encoder.start() + encoder.data(HOST_ROW) + encoder.finish(**trailer)


@pytest.mark.parametrize("claim", list(CLAIMS))
async def test_a_claim_out_of_bounds_fails_the_run_in_a_bounded_line(
    synced: Federation, category: Category, claim: str
) -> None:
    """Each header or trailer field out of its bounds fails the run as a dump error; the run's error, as returned
    and as fedload.runs keeps it, is one printable line of at most MAX_ERROR_CHARS (and a count of what was cut),
    the agent version kept is none of the feeder's text, and nothing else changes."""
    category("adversarial:stream claims")
    before = SuperhubState.of(synced)
    run = await sync_crafted(synced, claiming(CLAIMS[claim]))
    error = one_line_error(run)
    assert CLAIMS[claim].message in error, error
    assert run.error_kind is ErrorKind.DUMP
    assert error.isprintable()
    assert len(error) <= MAX_ERROR_CHARS + 40
    kept = json.loads(
        synced.superhub_sql(
            "SELECT json_build_array(error, agent_version) FROM fedload.runs WHERE feeder = 'hub1' ORDER BY id DESC "
            "LIMIT 1"
        )
    )
    assert kept[0] == error
    assert kept[1] in (None, "0.3.0")
    assert_only_hub1_data_changed(synced, before, run)


async def test_the_claims_control_stream_loads(synced: Federation, category: Category) -> None:
    """The control: the stream the claims above alter, unaltered, loads its one host."""
    category("adversarial:stream claims")
    before = SuperhubState.of(synced)
    run = await sync_crafted(synced, claiming(Claim("")))
    assert run.outcome == Outcome.SUCCESS, run.error
    assert hub1_hosts(synced) == [["k", "v"]]
    assert_only_hub1_data_changed(synced, before, run)
