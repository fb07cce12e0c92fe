"""The statistics calls a dump may carry (fedload.superhub.statistics), and the agent's request, without a database."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from fedload.errors import DumpError
from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.pg_dump import pg_dump_argv
from fedload.feeder.ssh_command import Allowlist, add_arguments, read_request
from fedload.names import TableName
from fedload.superhub.statistics import StatisticsCollector, parse_statistics_call, wants_statistics
from transforms import Statement

RELATION = """SELECT * FROM pg_catalog.pg_restore_relation_stats(
\t'version', '180006'::integer,
\t'schemaname', 'public',
\t'relname', '__hosts',
\t'relpages', '260'::integer,
\t'reltuples', '20000'::real,
\t'relallvisible', '0'::integer,
\t'relallfrozen', '0'::integer
);"""
ATTRIBUTE = """SELECT * FROM pg_catalog.pg_restore_attribute_stats(
\t'version', '180006'::integer,
\t'schemaname', 'public',
\t'relname', '__hosts',
\t'attname', 'Odd; Col',
\t'inherited', 'f'::boolean,
\t'null_frac', '0.3333'::real,
\t'avg_width', '37'::integer,
\t'n_distinct', '-0.6667'::real,
\t'most_common_vals', '{"{a1,b}","{a0,b}"}'::text,
\t'most_common_freqs', '{0.1429,1e-05}'::real[],
\t'correlation', '0.14285712'::real,
\t'most_common_elems', '{a0,a1,b}'::text,
\t'most_common_elem_freqs', '{0.14285,0.1429,1,0.14285,1,0}'::real[],
\t'elem_count_histogram', '{2,2,2,2}'::real[]
);"""
INDEX = RELATION.replace("'__hosts'", "'__hosts_pkey'")


def test_pg_dump_s_calls_are_read_as_written() -> None:
    """pg_dump 18's relation and attribute calls parse into their arguments, values as written."""
    relation, attribute = parse_statistics_call(RELATION), parse_statistics_call(ATTRIBUTE)
    assert relation.table == attribute.table == TableName("public", "__hosts")
    assert relation.args["reltuples"] == "20000"
    assert attribute.args["attname"] == "Odd; Col"
    assert attribute.args["most_common_vals"] == '{"{a1,b}","{a0,b}"}'


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (RELATION.replace("pg_catalog.pg_restore_relation_stats", "pg_catalog.pg_clear_relation_stats"), "it calls"),
        (RELATION.replace("pg_catalog.", "public."), "it calls public."),
        (RELATION.replace("pg_catalog.", ""), "it calls pg_restore"),
        (RELATION.replace("SELECT * FROM", "SELECT"), "does not select *"),
        (RELATION.replace("SELECT *", "SELECT *, pg_sleep(1)"), "does not select *"),
        (RELATION.replace(");", "), pg_catalog.pg_sleep(1);"), "one function"),
        (RELATION.replace(");", ") WHERE pg_sleep(1) IS NULL;"), "clauses"),
        (RELATION.replace(");", ") AS s;"), "clauses"),
        (RELATION.replace(");", "); SELECT 1;"), "not one SELECT"),
        (RELATION.replace("'260'::integer", "260"), "not a string constant"),
        (RELATION.replace("'260'::integer", "'260'::integer + 1"), "not a string constant"),
        (RELATION.replace("'260'::integer", "(SELECT '1'::integer)"), "not a string constant"),
        (RELATION.replace("'260'::integer", "'260'::text"), "cast to another type"),
        (RELATION.replace("'260'::integer", "'1; DROP TABLE x'::integer"), "not a integer"),
        (RELATION.replace("'relpages'", "'stakind1'"), "not one fedload accepts"),
        (RELATION.replace("'relpages'", "'attname'"), "not one fedload accepts"),
        (
            RELATION.replace("'relpages', '260'::integer,", "'relpages', '260'::integer, 'relpages', '1'::integer,"),
            "twice",
        ),
        (RELATION.replace("\t'relallfrozen', '0'::integer\n", "\t'relallfrozen'\n"), "pairs"),
        (RELATION.replace("'schemaname', 'public',", ""), "does not name its relation"),
        (ATTRIBUTE.replace("'{0.1429,1e-05}'::real[]", "'{0.1429,(1)}'::real[]"), "not a real[]"),
        (ATTRIBUTE.replace("'{0.1429,1e-05}'::real[]", "'{0.1429,1e-05}'::real"), "cast to another type"),
        ("SELECT * FROM pg_catalog.pg_restore_relation_stats(", "does not parse"),
    ],
)
def test_anything_but_pg_dump_s_shape_is_refused(text: str, reason: str) -> None:
    """Another function or schema, more than the call, a value that is not a string constant of the argument's
    type, an argument off the allowlist or given twice: refused, saying why."""
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_statistics_call(text)


def _collector() -> StatisticsCollector:
    tables = [TableName("public", "__hosts")]
    return StatisticsCollector("hub1", tables, [TableName("public", "__contexts"), *tables])


def test_the_collector_keeps_the_feeder_s_tables_and_sets_the_rest_aside() -> None:
    """Calls for the feeder's tables are kept by column; an index's (a name the superhub does not hold as a table,
    even where a configured pattern like `public.__*` matches it) is set aside; statements naming neither function
    are left to the importer's policy."""
    collector = _collector()
    for text in (RELATION, ATTRIBUTE, INDEX):
        assert collector.offer(Statement(text.encode(), line=1, offset=0))
    assert not collector.offer(Statement(b"SET lock_timeout = 0;", line=1, offset=0))
    kept = collector.kept[TableName("public", "__hosts")]
    assert kept.relation is not None
    assert list(kept.columns) == ["Odd; Col"]
    assert collector.set_aside == 1


@pytest.mark.parametrize(
    ("schema", "table"), [("public", "__contexts"), ("fedload_parts", "public.__hosts__hub2"), ("fedload", "runs")]
)
def test_statistics_for_a_table_that_is_not_the_feeder_s_reject_the_dump(schema: str, table: str) -> None:
    """A parent table the feeder does not send, or a table of fedload's schemas: the dump is rejected."""
    text = RELATION.replace("'public'", f"'{schema}'").replace("'__hosts'", f"'{table}'")
    with pytest.raises(DumpError, match=f"statistics for table {schema}.{table}, not its own"):
        _collector().offer(Statement(text.encode(), line=9, offset=0))


def test_the_same_statistics_twice_reject_the_dump() -> None:
    """A table's or a column's statistics given twice: rejected."""
    collector = _collector()
    collector.offer(Statement(ATTRIBUTE.encode(), line=1, offset=0))
    with pytest.raises(DumpError, match="given twice"):
        collector.offer(Statement(ATTRIBUTE.encode(), line=2, offset=0))


@pytest.mark.parametrize(
    ("major", "carry", "agent", "wanted"),
    [
        (18, True, True, True),
        (19, True, True, True),
        (17, True, True, False),
        (18, False, True, False),
        (18, True, False, False),
    ],
)
def test_statistics_are_asked_for_by_an_18_superhub_of_an_agent(
    major: int, carry: bool, agent: bool, wanted: bool
) -> None:
    """Only a superhub on 18 or later asks, with carry_statistics on, and only an agent (which knows its pg_dump)."""
    assert wants_statistics(major, carry=carry, agent=agent) is wanted


@pytest.mark.parametrize(("major", "statistics"), [(None, False), (17, False), (18, True), (19, True)])
def test_the_agent_asks_pg_dump_18_for_statistics(major: int | None, statistics: bool) -> None:
    """Asked for statistics, the agent dumps data and statistics (--no-schema --statistics) with pg_dump 18 or
    later, data only (--data-only) with an older or unknown pg_dump; the request reads back the same."""
    options = AgentOptions(database="db", tables=["public.t"], statistics=True)
    argv = pg_dump_argv(options, major)
    assert ("--statistics" in argv, "--no-schema" in argv, "--data-only" in argv) == (
        statistics,
        statistics,
        not statistics,
    )
    assert "--statistics" in options.to_argv()
    assert "--statistics" not in AgentOptions(database="db", tables=["public.t"]).to_argv()


def test_the_forced_command_lets_a_request_for_statistics_through() -> None:
    """`agent ssh-command` reads `--statistics` back into the request, with its own pg_dump as for any dump."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    allowed = Allowlist.from_args(parser.parse_args(["--database", "cfdb", "--allow-table", "public.__*"]))
    asked = AgentOptions("cfdb", ['"public"."__hosts"'], quiet=True, statistics=True)
    assert read_request(shlex.join(["fedload", *asked.to_argv()]), allowed) == asked
