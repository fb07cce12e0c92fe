"""dump_mode = "binary": every built-in type family crosses PostgreSQL majors exactly as text COPY loads it; tables
with types binary COPY cannot carry exactly go as text, each logged with its reason."""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from fedload.config import Config, parse_config
from fedload.errors import ConfigError
from fedload.localpg import LocalCluster, find_installs
from fedload.results import Outcome
from fedload.superhub.job import feeder_job
from fedload.superhub.pipeline import sync_feeder
from tests.support import binary_faults
from tests.support.federation import AGENT, Federation, failing_after_first_sync, sync, write_script
from tests.support.fix_tally import Category

MAJORS = (15, 17, 18)
# Every built-in type family, with its limits and special values; `mood` (an enum) and `wide` (int4 on the feeder,
# int8 on the superhub) and tsvector are the text fallbacks.
TYPES = """
id int NOT NULL, i2 smallint, i4 integer, i8 bigint, n numeric, n2 numeric(12,3), f4 real, f8 double precision,
ts timestamp, tstz timestamptz, d date, t time, ttz timetz, iv interval, tx text, vc varchar(20), ch char(5),
by bytea, b boolean, u uuid, ine inet, ci cidr, mac macaddr, j json, jb jsonb, ai integer[], at text[],
a2 integer[], r int4range, tr tstzrange, nr numrange, bi bit(8), vb varbit, m money, pt point, o oid
"""
COLUMNS = re.findall(r"(?:^|,)\s*(\w+)\s", TYPES.strip())
ROWS = r"""
INSERT INTO types VALUES
(1, -32768, -2147483648, -9223372036854775808, 'NaN', -999999999.999, '-Infinity', 'NaN', '-infinity',
 '-infinity', '-infinity', '00:00', '00:00+14', '-178000000 years -1 microsecond',
 E'\x01\x02\t\n\r\\ \x7f é 𝄞 "q" ''s', 'vé', 'ab', '\x00ff7f80', false, '00000000-0000-0000-0000-000000000000',
 '::1/128', '10.0.0.0/8', '08:00:2b:01:02:03', '{"a": [1, "x", null], "a": 2}', '{"b": 1, "a": [true, 1.50]}',
 '{1,NULL,3}', '{"a,b","c\"d",NULL,""}', '{{1,2},{3,NULL}}', '[1,5)', '[2020-01-01 00:00+00,infinity)', 'empty',
 B'10101010', B'101', '-92233720368547758.08', '(1.5,-2)', 0),
(2, 32767, 2147483647, 9223372036854775807, 'Infinity', 999999999.999, 'Infinity', '-0', 'infinity',
 'infinity', 'infinity', '24:00', '23:59:59.999999-15:59', '1 year 2 mons 3 days 04:05:06.789', '', '', '',
 '', true, 'ffffffff-ffff-ffff-ffff-ffffffffffff', '255.255.255.255', '::/0', 'ff:ff:ff:ff:ff:ff', '[]', 'null',
 '[-1:1]={7,8,9}', '{}', '{{{1}},{{2}}}', '(,)', 'empty', '[-Infinity,NaN]', B'00000000', B'', '92233720368547758.07',
 '(1e300,-1e-300)', 4294967295),
(3, 0, 0, 0, '-0.000000000000000000000000000001', 0.0005, '1e-45', '4.9e-324', '2000-02-29 23:59:59.999999',
 '1970-01-01 00:00:00.000001+00', '4713-01-01 BC', '12:34:56.789', '12:00-00', '-1 days +1 microsecond',
 repeat('long ', 10000), 'x', 'xxxxx', decode(repeat('00ff', 5000), 'hex'), NULL, gen_random_uuid(),
 '192.168.0.1/24', '2001:db8::/32', '00:00:00:00:00:00', '"\u00e9\n"', '{"deep": {"deeper": [[[]]]}}',
 ARRAY[NULL, NULL]::int[], ARRAY['NULL', 'null'], '{}', '[-2147483648,2147483647)', '(2000-01-01,2000-01-02]',
 '[0.1,0.2]', B'11111111', B'1010101010101', 0, '(0,0)', 1),
(4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO moods VALUES (1, 'ok', '{sad,happy}'), (2, NULL, NULL);
INSERT INTO wide VALUES (1, -2147483648), (2, 2147483647), (3, NULL);
INSERT INTO words VALUES (1, 'a:1 fat:2B cat'), (2, '');
"""
FEEDER_SCHEMA = f"""
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE types ({TYPES});
CREATE TABLE moods (id int NOT NULL, m mood, ms mood[]);
CREATE TABLE wide (id int NOT NULL, v integer);
CREATE TABLE words (id int NOT NULL, tv tsvector);
"""
SUPERHUB_SCHEMA = f"""
CREATE TYPE mood AS ENUM ('happy', 'ok', 'sad');
CREATE TABLE types (hub_id int NOT NULL, {TYPES}) PARTITION BY LIST (hub_id);
CREATE TABLE moods (hub_id int NOT NULL, id int NOT NULL, m mood, ms mood[]) PARTITION BY LIST (hub_id);
CREATE TABLE wide (hub_id int NOT NULL, id int NOT NULL, v bigint) PARTITION BY LIST (hub_id);
CREATE TABLE words (hub_id int NOT NULL, id int NOT NULL, tv tsvector) PARTITION BY LIST (hub_id);
"""
CONTENT = {
    "types": COLUMNS,
    "moods": ["id", "m", "ms"],
    "wide": ["id", "v"],
    "words": ["id", "tv"],
}
_names = itertools.count()


@pytest.fixture(scope="module")
def clusters(cluster: LocalCluster) -> Iterator[Callable[[int], LocalCluster]]:
    """A running cluster of each PostgreSQL major asked for (the module's for its own), started once."""
    running = {cluster.install.major: cluster}
    started: list[LocalCluster] = []

    def of(major: int) -> LocalCluster:
        if major not in running:
            running[major] = LocalCluster(find_installs()[major], name=f"binary{major}").start()
            started.append(running[major])
        return running[major]

    yield of
    for each in started:
        each.stop()


def content(cluster: LocalCluster, db: str, table: str, where: str = "") -> str:
    """The table's rows as text, in id order: each row's values through their types' text output."""
    row = ", ".join(f'"{column}"' for column in CONTENT[table])
    return cluster.psql(f"SELECT string_agg(ROW({row})::text, E'\\n' ORDER BY id) FROM {table} {where}", dbname=db)


def binary_config(
    feeder: LocalCluster, feeder_db: str, superhub: LocalCluster, superhub_db: str, **more: Any
) -> Config:
    """One feeder (key 1) on `feeder` in binary mode, into `superhub`'s parents."""
    settings = {
        "key": 1,
        "transport": "local",
        "database": feeder.conninfo(feeder_db),
        "pg_dump": feeder.install.tool("pg_dump"),
        "dump_mode": "binary",
        **more,
    }
    tables = [f"public.{table}" for table in CONTENT]
    return parse_config({"superhub": {"dsn": superhub.dsn(superhub_db), "tables": tables}, "feeders": {"f": settings}})


def databases(feeder: LocalCluster, superhub: LocalCluster) -> tuple[str, str]:
    """A feeder database with every type's rows, and a superhub database with the parents."""
    suffix = next(_names)
    feeder_db, superhub_db = f"typesfeeder_{suffix}", f"typeshub_{suffix}"
    feeder.psql(f"CREATE DATABASE {feeder_db}")
    feeder.psql(FEEDER_SCHEMA + ROWS, dbname=feeder_db)
    superhub.psql(f"CREATE DATABASE {superhub_db}")
    superhub.psql(SUPERHUB_SCHEMA, dbname=superhub_db)
    return feeder_db, superhub_db


@pytest.mark.parametrize(("feeder_major", "superhub_major"), list(itertools.product(MAJORS, MAJORS)))
async def test_every_type_family_crosses_majors_exactly(
    clusters: Callable[[int], LocalCluster], feeder_major: int, superhub_major: int
) -> None:
    """Every built-in type family loads in binary as its text is on the feeder; the enum, the int4 column of an int8
    parent and tsvector go as text, each table logged once with its reason, and load exactly too."""
    for major in (feeder_major, superhub_major):
        if major not in find_installs():
            pytest.skip(f"PostgreSQL {major} binaries not installed")
    feeder, superhub = clusters(feeder_major), clusters(superhub_major)
    feeder_db, superhub_db = databases(feeder, superhub)
    with capture_logs() as logs:
        run = await sync_feeder(feeder_job(binary_config(feeder, feeder_db, superhub, superhub_db), "f"))
    assert run.outcome == Outcome.SUCCESS, run.error
    for table in CONTENT:
        assert content(superhub, superhub_db, table, "WHERE hub_id = 1") == content(feeder, feeder_db, table), table
    loaded = {e["table"]: e["mode"] for e in logs if e["event"] == "import.table_loaded"}
    assert loaded == {"public.types": "binary", "public.moods": "copy", "public.wide": "copy", "public.words": "copy"}
    fallbacks = {e["table"]: e["reason"] for e in logs if e["event"] == "import.text_fallback"}
    assert sorted(fallbacks) == ["public.moods", "public.wide", "public.words"]
    assert "column m: the superhub takes its type only as text" in fallbacks["public.moods"]
    assert "integer (OID 23) on the feeder, OID 20 on the superhub" in fallbacks["public.wide"]
    assert "the superhub takes its type only as text" in fallbacks["public.words"]


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("flip", "table public.hosts: the binary COPY data has a row of 32767 fields, not the 5 announced"),
        ("cut", "table public.hosts: the binary COPY data ends before its trailer"),
    ],
)
async def test_a_damaged_binary_stream_fails_the_run_and_keeps_old_data(
    federation: Federation, category: Category, how: str, error: str
) -> None:
    """Binary COPY data that is malformed, or cut at a row (which PostgreSQL itself accepts), fails the run as a bad
    dump (fedload.superhub.binary_framing); the feeder's previous data stays."""
    category("fault:binary stream damaged")
    damaging = f'{AGENT} "$@" | {sys.executable} {binary_faults.__file__} {how}\n'
    run = await failing_after_first_sync(federation, damaging, dump_mode="binary")
    assert error in (run.error or "")


async def test_an_agent_older_than_binary_mode_is_told_to_upgrade(federation: Federation) -> None:
    """An agent that refuses --mode=binary (it predates it) fails the run with a line naming the side to upgrade."""
    old = write_script(
        federation.tmp / "old-agent",
        "echo \"fedload agent: error: argument --mode: invalid choice: 'binary'\" >&2\nexit 2\n",
    )
    (run,) = await sync(federation.config(dump_mode="binary", agent_command=[old]), "hub1")
    assert run.outcome == Outcome.FAILED
    assert "upgrade fedload on the feeder" in (run.error or "")


async def test_names_are_quoted_by_the_agent(cluster: LocalCluster) -> None:
    """Mixed case, quotes, a backslash, spaces, non-ASCII and a keyword in table and column names: the agent quotes
    them itself and the table loads in binary, exactly."""
    suffix = next(_names)
    feeder_db, superhub_db = f"oddfeeder_{suffix}", f"oddhub_{suffix}"
    columns = '"c ""q"" \\ é" text, "select" int, "Id" int NOT NULL'
    cluster.psql(f"CREATE DATABASE {feeder_db}")
    cluster.psql(
        f'CREATE TABLE "Odd ""T"" é" ({columns}); INSERT INTO "Odd ""T"" é" VALUES (\'x\', 1, 1), (NULL, NULL, 2)',
        dbname=feeder_db,
    )
    cluster.psql(f"CREATE DATABASE {superhub_db}")
    cluster.psql(f'CREATE TABLE "Odd ""T"" é" (hub_id int NOT NULL, {columns}) PARTITION BY LIST (hub_id)', superhub_db)
    settings = {"key": 1, "transport": "local", "database": cluster.conninfo(feeder_db), "dump_mode": "binary"}
    settings["pg_dump"] = cluster.install.tool("pg_dump")
    superhub = {"dsn": cluster.dsn(superhub_db), "tables": ['public."Odd ""T"" é"']}
    with capture_logs() as logs:
        run = await sync_feeder(feeder_job(parse_config({"superhub": superhub, "feeders": {"f": settings}}), "f"))
    assert run.outcome == Outcome.SUCCESS, run.error
    assert [e["mode"] for e in logs if e["event"] == "import.table_loaded"] == ["binary"]
    rows = 'SELECT string_agg(ROW("c ""q"" \\ é", "select", "Id")::text, \';\' ORDER BY "Id") FROM "Odd ""T"" é"'
    assert cluster.psql(rows, dbname=superhub_db) == cluster.psql(rows, dbname=feeder_db)


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"agent": False}, "dump_mode 'binary' needs the agent on the feeder"),
        ({"pg_dump_args": ["--host=feeder"]}, "dump_mode 'binary' runs psql, not pg_dump"),
    ],
)
def test_binary_mode_needs_the_agent_and_no_pg_dump_args(settings: dict[str, object], error: str) -> None:
    """Binary mode without the agent, or with pg_dump arguments it would not use, is a configuration error."""
    feeder = {"key": 1, "transport": "local", "dump_mode": "binary", **settings}
    with pytest.raises(ConfigError, match=error):
        parse_config({"superhub": {"dsn": "postgresql:///x", "tables": ["public.t"]}, "feeders": {"f": feeder}})
