"""Binary mode on the feeder: the request read as data, and each table's plan (binary only where exact, text with
its reason elsewhere), decided from the feeder's catalog without a database."""

from __future__ import annotations

import json

import pytest

from fedload.feeder.binary_plan import (
    FeederColumn,
    TablePlan,
    TableRequest,
    copy_command,
    plan_table,
    read_requests,
)
from fedload.feeder.digest import parse_digest
from fedload.feeder.errors import AgentUsageError

FEEDER = [
    FeederColumn("id", 23, "integer", has_send=True),
    FeederColumn("name", 25, "text", has_send=True),
    FeederColumn("extra", 25, "text", has_send=True),
]


def _columns(schema: str, name: str, columns: list[list[object]] | None) -> str:
    return json.dumps({"schema": schema, "name": name, "columns": columns})


def test_the_request_pairs_each_table_with_its_columns() -> None:
    """Each exact --table gets its --columns, whatever their order; names are read as pg_dump reads them."""
    requests = read_requests(
        ['"public"."Hosts"', "public.contexts"],
        [_columns("public", "contexts", None), _columns("public", "Hosts", [["id", 23]])],
    )
    assert requests == [TableRequest("public", "Hosts", (("id", 23),)), TableRequest("public", "contexts", None)]


def test_a_digest_travels_in_the_columns_request() -> None:
    """`digest` present asks for the table's digest (null: none held here); absent, as from older superhubs, not."""
    digest = "ab" * 32
    asked = [
        json.dumps({"schema": "public", "name": "a", "columns": None, "digest": None}),
        json.dumps({"schema": "public", "name": "b", "columns": [["id", 23]], "digest": digest}),
        _columns("public", "c", None),
    ]
    a, b, c = read_requests(["public.a", "public.b", "public.c"], asked)
    assert (a.wants_digest, a.digest, b.wants_digest, b.digest, c.wants_digest) == (True, "", True, digest, False)


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("digest", "x" * 64, "digest must be 64 hexadecimal digits or null"),
        ("digest", "AB" * 32, "digest must be 64 hexadecimal digits or null"),
        ("digest", 7, "digest must be 64 hexadecimal digits or null"),
        ("digest", "ab" * 32 + "'; DROP TABLE t; --", "digest must be 64 hexadecimal digits or null"),
        ("counters", "1 2 x", "counters must be numbers separated by spaces"),
        ("counters", "1; SELECT 1", "counters must be numbers separated by spaces"),
    ],
)
def test_a_digest_or_counters_of_another_shape_are_refused(field: str, value: object, error: str) -> None:
    """A digest that is not 64 lowercase hexadecimal digits or null, counters that are not numbers: a usage error."""
    asked = json.dumps({"schema": "public", "name": "t", "columns": None, "digest": None, field: value})
    with pytest.raises(AgentUsageError, match=error):
        read_requests(["public.t"], [asked])


@pytest.mark.parametrize(
    ("tables", "columns", "reason"),
    [
        (["public.t"], [], "binary mode needs exactly one --columns for each --table"),
        (["public.t"], [_columns("public", "secret", None)], "binary mode needs exactly one --columns"),
        (["public.t"], [_columns("public", "t", None)] * 2, "binary mode needs exactly one --columns"),
        (["public.t"], ["SELECT 1"], "--columns 'SELECT 1' is not a JSON object"),
        (["public.t"], [_columns("public", "t", [["id", "int4"]])], "--columns of 't': columns must be a list"),
        (["public.t"], [_columns("public", "t", [["id", -1]])], "--columns of 't': columns must be a list"),
        (["public.t*"], [_columns("public", "t", None)], "--table 'public.t*' is a pattern"),
        (["t"], [_columns("public", "t", None)], "--table 't' is not schema.table"),
    ],
)
def test_a_request_that_does_not_hold_together_is_refused(tables: list[str], columns: list[str], reason: str) -> None:
    """Columns for another table, twice, missing, or not data of the expected shape: a usage error, nothing run."""
    with pytest.raises(AgentUsageError) as refused:
        read_requests(tables, columns)
    assert str(refused.value).startswith(reason)


def test_binary_where_every_column_is_built_in_and_the_same_type() -> None:
    """Columns go in the superhub's order; one the feeder lacks is left to the superhub's default; the feeder's
    other columns are named as unsent."""
    plan = plan_table(TableRequest("public", "t", (("name", 25), ("gone", 23), ("id", 23))), FEEDER)
    assert (plan.columns, plan.binary, plan.reason, plan.unsent) == (("name", "id"), True, "", ("extra",))


@pytest.mark.parametrize(
    ("feeder", "superhub_oid", "reason"),
    [
        (FeederColumn("v", 23, "integer", has_send=True), 20, "column v: its type is integer (OID 23) on the feeder, "),
        (FeederColumn("v", 16500, "mood", has_send=True), 16400, "column v: its type mood is not built in"),
        (FeederColumn("v", 16500, "mood[]", has_send=True), 16500, "column v: its type mood[] is not built in"),
        (FeederColumn("v", 1033, "aclitem", has_send=False), 1033, "column v: its type aclitem has no binary output"),
        (FeederColumn("v", 3614, "tsvector", has_send=True), 0, "column v: the superhub takes its type only as text"),
    ],
)
def test_text_where_binary_would_not_be_exact(feeder: FeederColumn, superhub_oid: int, reason: str) -> None:
    """A type not built in (even with the same OID on both sides), another type there, one without binary output,
    or one the superhub takes only as text: the table goes as text, saying which column and why."""
    plan = plan_table(TableRequest("public", "t", (("id", 23), ("v", superhub_oid))), [FEEDER[0], feeder])
    assert not plan.binary
    assert plan.reason.startswith(reason)


def test_a_table_asked_for_as_text_goes_whole() -> None:
    """No columns in the request: all of the feeder's columns, as text, as pg_dump would send them."""
    plan = plan_table(TableRequest("public", "t", None), FEEDER)
    assert (plan.columns, plan.binary, plan.unsent) == (("id", "name", "extra"), False, ())


def test_the_copy_command_quotes_every_name_itself() -> None:
    """Identifiers from the request are quoted by the agent, quotes doubled; binary or text COPY as planned."""
    plan = plan_table(TableRequest('s"; DROP', 't"x', (('a"b', 23),)), [FeederColumn('a"b', 23, "integer", True)])
    expected = '\\copy (SELECT "a""b" FROM ONLY "s""; DROP"."t""x") TO PSTDOUT (FORMAT binary)\n'
    assert copy_command(plan) == expected


def test_a_name_with_a_line_break_is_refused() -> None:
    """psql reads \\copy to the end of its line: a name with a line break cannot be sent that way."""
    plan = plan_table(TableRequest("public", "t", (("a\nb", 23),)), [FeederColumn("a\nb", 23, "integer", True)])
    with pytest.raises(ValueError, match="line break"):
        copy_command(plan)


def test_the_digest_covers_the_columns_types_with_their_modifiers() -> None:
    """The same rows under varchar(50) and varchar(60), or under another column name, give other digests."""
    plan = TablePlan("public", "t", ("v",), binary=True, reason="", unsent=())
    printed = b"3|-12|34\n"
    columns = [("v", "character varying(50)"), ("v", "character varying(60)"), ("w", "character varying(50)")]
    digests = {
        parse_digest(printed, plan, [FeederColumn(name, 1043, "character varying", has_send=True, type_sql=sql)]).digest
        for name, sql in columns
    }
    assert len(digests) == 3
    assert parse_digest(printed, plan, []).rows == 3
