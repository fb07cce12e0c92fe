"""pg_dump's command line: the flags that spare a data-only dump the catalogs it never writes change nothing in it."""

from __future__ import annotations

import subprocess

import pytest

from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.pg_dump import major_version, pg_dump_argv
from tests.support.federation import Federation

SKIPPED = {"--no-comments", "--no-security-labels", "--no-publications", "--no-subscriptions"}


@pytest.mark.parametrize(("major", "skips"), [(None, False), (9, False), (10, False), (11, True), (18, True)])
def test_the_flags_go_to_pg_dump_11_and_later_only(major: int | None, skips: bool) -> None:
    """pg_dump 11 added --no-comments: older or unknown versions get none of the flags, 11 and later all four."""
    argv = pg_dump_argv(AgentOptions(database="db", tables=["public.t"]), major)
    assert (set(argv) >= SKIPPED) if skips else SKIPPED.isdisjoint(argv)


@pytest.mark.parametrize(
    ("mode", "major", "rows_per_insert"),
    [
        ("inserts", None, False),
        ("inserts", 11, False),
        ("inserts", 12, True),
        ("inserts", 18, True),
        ("copy", 18, False),
    ],
)
def test_inserts_mode_asks_pg_dump_12_and_later_for_merged_statements(
    mode: str, major: int | None, rows_per_insert: bool
) -> None:
    """pg_dump 12 added --rows-per-insert: in inserts mode it gets the transformer's rows per statement, so it writes
    the statements the transformer would make; older or unknown versions write one row per INSERT, as before."""
    options = AgentOptions(database="db", tables=["public.t"], dump_mode=mode, rows_per_statement=321)
    argv = pg_dump_argv(options, major)
    assert ("--rows-per-insert=321" in argv) is rows_per_insert
    assert ("--column-inserts" in argv) is (mode == "inserts")


@pytest.mark.parametrize(
    ("version", "major"), [("15.20", 15), ("9.6.24", 9), ("18beta1", 18), ("18devel", 18), ("", None), ("x", None)]
)
def test_the_major_is_read_from_pg_dump_s_version(version: str, major: int | None) -> None:
    """The major is the version's leading number, pre-releases included; no number, no major (so no flags)."""
    assert major_version(version) == major


def _dump(argv: list[str]) -> list[str]:
    """The dump's lines, without psql's \\restrict key, which pg_dump draws anew for every dump."""
    result = subprocess.run(argv, capture_output=True, check=True, text=True, timeout=60)
    return [line for line in result.stdout.splitlines() if not line.startswith(("\\restrict", "\\unrestrict"))]


@pytest.mark.parametrize("mode", ["copy", "inserts"])
def test_the_flags_leave_the_dump_unchanged(federation: Federation, mode: str) -> None:
    """With a commented table, a commented column and a publication in the feeder database, the dump with the flags
    is line for line the dump without them: the objects they skip are never in a data-only dump."""
    database = federation.feeders["hub3"]
    federation.cluster.psql(
        "COMMENT ON TABLE hosts IS 'the hosts'; COMMENT ON COLUMN hosts.hostkey IS 'its key';"
        "CREATE PUBLICATION everything FOR ALL TABLES;",
        database,
    )
    options = AgentOptions(
        database=federation.cluster.conninfo(database),
        tables=["public.hosts", "public.contexts"],
        dump_mode=mode,
        pg_dump=federation.cluster.install.tool("pg_dump"),
    )
    with_flags = pg_dump_argv(options, 15)
    without = [arg for arg in with_flags if arg not in SKIPPED]
    assert set(with_flags) >= SKIPPED
    dumped = _dump(with_flags)
    assert dumped == _dump(without)
    assert any(line.startswith(("COPY public.hosts", "INSERT INTO public.hosts")) for line in dumped)
