"""Copy and inserts modes' digests on the feeder (fedload/feeder/snapshot_dump.py), without a database: the
request they serve, and what the trailer says of the tables kept and dumped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.errors import AgentUsageError
from fedload.feeder.snapshot_dump import read_digest_requests
from fedload.feeder.snapshot_plan import DigestedTable, SnapshotPlan

TABLES = ('"public"."t"', '"public"."u"')


def _asking(**more: Any) -> AgentOptions:
    columns = [json.dumps({"schema": "public", "name": n, "columns": None, "digest": None}) for n in "tu"]
    return AgentOptions(**{"database": "db", "tables": TABLES, "columns": columns, **more})


@pytest.mark.parametrize(
    ("more", "refusal"),
    [
        ({"pg_dump_args": ["--host=elsewhere"]}, "no pg_dump arguments"),
        ({"remap": Path("remap.toml")}, "no --remap"),
        ({"columns": [json.dumps({"schema": "public", "name": n, "columns": [["id", 23]]}) for n in "tu"]}, "null"),
    ],
)
def test_a_request_one_snapshot_cannot_serve_is_refused(more: dict[str, Any], refusal: str) -> None:
    """Digests with pg_dump arguments (psql would not connect as pg_dump does), with a remap on the feeder, or with
    columns (which pg_dump cannot choose) are refused in one line."""
    with pytest.raises(AgentUsageError, match=refusal):
        read_digest_requests(_asking(**more))


def test_the_trailer_lists_the_kept_tables_with_the_digests_rows() -> None:
    """A kept table is in the trailer's rows, tables and unchanged with its digest's count; a dumped one with
    pg_dump's; the snapshot's time is stated; pg_dump reads the exported snapshot, and only the dumped table."""
    plan = SnapshotPlan(
        "00000003-0000001B-1",
        "15.4",
        1_700_000_000.25,
        ('"public"."t"',),
        (
            DigestedTable("public", "t", "1 2 0 0", "", 0, kept=False),
            DigestedTable("public", "u", "3 4 0 0", "d", 7, kept=True),
        ),
    )
    trailer = plan.trailer({("public", "t"): 5}, [("public", "t")])
    assert trailer == {
        "rows": [("public", "t", 5), ("public", "u", 7)],
        "tables": [("public", "t"), ("public", "u")],
        "digests": [("public", "t", "", 5, "1 2 0 0"), ("public", "u", "d", 7, "3 4 0 0")],
        "unchanged": [("public", "u", 7, "d")],
        "snapshot_epoch_s": 1_700_000_000.25,
    }
    options = plan.pg_dump_options(_asking())
    assert options.tables == ('"public"."t"',)
    assert options.columns == ()
    assert "--snapshot=00000003-0000001B-1" in options.pg_dump_args


def test_pg_dump_sending_other_rows_than_digested_is_a_contradiction() -> None:
    """A dumped table whose digest was taken (it changed) must come with the digest's count: pg_dump read the same
    snapshot; a table without a digest is not checked."""
    plan = SnapshotPlan(
        "1-1-1",
        "15.4",
        0.0,
        TABLES,
        (DigestedTable("public", "t", "", "d", 5, kept=False), DigestedTable("public", "u", "", "", 0, kept=False)),
    )
    assert plan.contradiction({("public", "t"): 5, ("public", "u"): 9}) == ""
    assert "pg_dump sent 6 rows but 5 were digested" in plan.contradiction({("public", "t"): 6})
