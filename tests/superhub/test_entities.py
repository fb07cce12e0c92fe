"""One entity, one feeder (`superhub.entity_key`, docs/entities.md): each host shown by the feeder where it is newest,
its other copies displaced, and back when their feeder wins again or the other one is removed.

The federation's three feeders share hosts SHA=1..100 (hub1, hub2, hub3) and SHA=101..200 (hub1, hub2), and all
have SHA=0 in contexts only: the feeder database filled last has the newest `seen` of the hosts it shares."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from rich.console import Console
from structlog.testing import capture_logs

from fedload.commands.probe import probe_superhub
from fedload.commands.status import _table as status_table
from fedload.commands.status import read_status
from fedload.config import Config, ConfigLocation, DumpMode, SuperhubConfig, parse_config
from fedload.errors import ConfigError, ErrorKind
from fedload.names import TableName
from fedload.results import Outcome
from fedload.service.daemon_metrics import read_states_of
from fedload.service.metrics import DaemonMetrics
from fedload.superhub import swap
from fedload.superhub.entities import EntityRule
from fedload.superhub.job import parents_spec, superhub_target
from fedload.superhub.removal import drop_feeder
from fedload.superhub.swap import SwapPolicy
from tests.support.federation import Federation, config_toml, fedload, sync

SHOWN_TWICE = """
SELECT count(*) FROM (
    SELECT hostkey FROM (SELECT hostkey, hub_id FROM hosts UNION SELECT hostkey, hub_id FROM contexts) AS u
    GROUP BY hostkey HAVING count(DISTINCT hub_id) > 1) AS twice
"""
# One statement, one snapshot: every host once in hosts (SHA=1..300), every entity (SHA=0..300) shown, each under
# one feeder in both tables.
CONSISTENT = f"""
SELECT (SELECT count(*) FROM hosts) = 300 AND (SELECT count(DISTINCT hostkey) FROM hosts) = 300
   AND (SELECT count(DISTINCT hostkey) FROM (SELECT hostkey FROM hosts UNION SELECT hostkey FROM contexts) u) = 301
   AND ({SHOWN_TWICE}) = 0
"""


def entity_config(fed: Federation, **superhub: Any) -> Config:
    """The federation's configuration with the entity rule on `hosts.seen`; runs in this process."""
    config = fed.config()
    settings = {"worker_processes": 0, "entity_key": "hostkey", "entity_newest": "public.hosts.seen"}
    # the federation's first round moves most hosts (the feeder filled last is newest): no displacement is held
    # back here but in the tests that ask for it (entity_max_displaced_share below 1); the tests' newer values
    # are up to 2 hours ahead of the clock, believed with this skew
    settings |= {"entity_max_displaced_share": 1.0, "entity_clock_skew_s": 3 * 3600.0} | superhub
    checked = SuperhubConfig.model_validate(config.superhub.model_dump() | settings)
    return config.model_copy(update={"superhub": checked})


def home(fed: Federation, hostkey: str) -> str:
    """The feeder keys that show `hostkey`: "<in hosts>|<in contexts>", e.g. "2|2"."""
    shown = "coalesce((SELECT string_agg(DISTINCT hub_id::text, ',') FROM {} WHERE hostkey = '{}'), '')"
    return fed.superhub_sql(f"SELECT {shown.format('hosts', hostkey)} || '|' || {shown.format('contexts', hostkey)}")


def displaced(fed: Federation, table: str, hostkey: str) -> str:
    """The feeders whose rows of `hostkey` in `table` are displaced, with how many: "hub1:10"."""
    return fed.superhub_sql(
        f"SELECT coalesce(string_agg(fedload_feeder || ':' || n, ','), '') FROM (SELECT fedload_feeder, count(*) n "
        f"""FROM fedload_displaced."public.{table}" WHERE hostkey = '{hostkey}' GROUP BY 1 ORDER BY 1) AS d"""
    )


def newer(fed: Federation, feeder: str, hostkey: str, minutes: int) -> None:
    """Give `hostkey` on `feeder` a `seen` `minutes` from now, after every other copy's."""
    sql = f"UPDATE hosts SET seen = now() + interval '{minutes} minutes' WHERE hostkey = '{hostkey}'"
    fed.cluster.psql(sql, dbname=fed.feeders[feeder])


async def exported_displaced(fed: Federation) -> dict[str, float | None]:
    """`fedload_feeder_displaced_entities` per feeder as the daemon's metrics read and export it."""
    metrics, conn = DaemonMetrics(), await asyncpg.connect(fed.cluster.dsn(fed.superhub))
    try:
        metrics.apply_history(await read_states_of(list(fed.feeders), conn, entities=True))
    finally:
        await conn.close()
    gauge = "fedload_feeder_displaced_entities"
    return {feeder: metrics.registry.get_sample_value(gauge, {"feeder": feeder}) for feeder in fed.feeders}


async def synced(config: Config, *names: str) -> None:
    """Sync the named feeders (all if none); each succeeds."""
    assert [r.outcome for r in await sync(config, *names)] == [Outcome.SUCCESS] * (len(names) or 3)


async def test_shared_hosts_shown_once_and_back_when_the_newest_feeder_is_removed(federation: Federation) -> None:
    """Hosts in several feeders are shown by the newest one alone (ties to the first name), the others' copies are
    displaced and counted in status; removing the newest feeder brings the next newest copies back."""
    config = entity_config(federation)
    await synced(config)
    assert federation.superhub_int(SHOWN_TWICE) == 0
    assert [home(federation, f"SHA={n}") for n in (50, 150, 250)] == ["3|3", "2|2", "1|1"]
    assert home(federation, "SHA=0") == "|1"  # no newest value anywhere: the first feeder by name
    assert displaced(federation, "contexts", "SHA=50") == "hub1:10,hub2:10"
    displaced_of = {s.feeder: s.displaced_entities for s in await read_status(config)}
    assert displaced_of == {"hub1": 200, "hub2": 101, "hub3": 1}  # hub2 loses 1..100 and SHA=0, hub3 SHA=0
    assert await exported_displaced(federation) == displaced_of

    policy = SwapPolicy.from_config(config.superhub)
    await drop_feeder(superhub_target(config), parents_spec(config), "hub3", 3, policy=policy)
    assert federation.superhub_int(SHOWN_TWICE) == 0
    assert home(federation, "SHA=50") == "2|2"
    assert displaced(federation, "contexts", "SHA=50") == "hub1:10"
    left = """SELECT count(*) FROM fedload_displaced."public.hosts" WHERE fedload_feeder = 'hub3'"""
    assert federation.superhub_int(left) == 0


async def test_cfengine_host_moves_and_back_then_its_newest_row_is_removed(federation: Federation) -> None:
    """A host re-bootstrapped from hub1 to hub2 (hub1 keeps its stale copy) is shown by hub2 alone, comes back to
    hub1 when hub1 is newest again, and to hub2 when hub1 removes it; a clone alternately newest follows."""
    config = entity_config(federation)
    await synced(config)
    hub2 = federation.feeders["hub2"]
    federation.cluster.psql(
        "INSERT INTO hosts (hostkey, name, seen) VALUES ('SHA=250', 'moved', now() + interval '1 minute');"
        "INSERT INTO contexts SELECT 'SHA=250', 'new' || g FROM generate_series(1, 5) g",
        dbname=hub2,
    )
    await synced(config, "hub2")
    assert (home(federation, "SHA=250"), displaced(federation, "contexts", "SHA=250")) == ("2|2", "hub1:10")
    since_sql = "SELECT displaced_since FROM fedload.entity_copies WHERE entity = 'SHA=250'"
    since = federation.superhub_sql(since_sql)
    await synced(config, "hub1")  # hub1 reports its stale copy again: it stays aside, since the same moment
    assert home(federation, "SHA=250") == "2|2"
    assert (
        federation.superhub_sql("SELECT displaced_since FROM fedload.entity_copies WHERE entity = 'SHA=250'") == since
    )

    newer(federation, "hub1", "SHA=250", 2)
    await synced(config, "hub1")
    assert (home(federation, "SHA=250"), displaced(federation, "contexts", "SHA=250")) == ("1|1", "hub2:5")

    federation.cluster.psql("DELETE FROM hosts WHERE hostkey = 'SHA=250'", dbname=federation.feeders["hub1"])
    await synced(config, "hub1")  # its newest row gone, hub1's contexts of it have no value: hub2's copy is back
    assert (home(federation, "SHA=250"), displaced(federation, "contexts", "SHA=250")) == ("2|2", "hub1:10")
    federation.cluster.psql("DELETE FROM contexts WHERE hostkey = 'SHA=250'", dbname=federation.feeders["hub1"])
    await synced(config, "hub1")
    assert (home(federation, "SHA=250"), displaced(federation, "contexts", "SHA=250")) == ("2|2", "")
    assert federation.superhub_int("SELECT count(*) FROM contexts WHERE hostkey = 'SHA=250'") == 5

    for minutes, feeder, shown in ((3, "hub1", "1|1"), (4, "hub2", "2|2")):  # a clone, alternately newest
        newer(federation, feeder, "SHA=150", minutes)
        await synced(config, feeder)
        assert home(federation, "SHA=150") == shown
    assert federation.superhub_int(SHOWN_TWICE) == 0


@contextlib.asynccontextmanager
async def snapshot_reader(fed: Federation, seen: list[bool]) -> AsyncIterator[None]:
    """A reader that checks `CONSISTENT` (one statement, one snapshot) in a loop, each answer in `seen`."""
    conn = await asyncpg.connect(fed.cluster.dsn(fed.superhub))

    async def read() -> None:
        while True:
            seen.append(await conn.fetchval(CONSISTENT))
            await asyncio.sleep(0.005)

    task = asyncio.create_task(read())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await conn.close()


async def test_two_feeders_swapping_the_same_moved_hosts_at_once(federation: Federation) -> None:
    """hub1 and hub2 sync at once, round after round, with their 200 shared hosts newest on either side at random:
    no deadlock (mvcc: each swap gets its locks at the first try, so none waited out its lock_timeout), and a
    reader in one snapshot never sees a host twice or nowhere; the same with the partition swap."""
    seen: list[bool] = []
    await synced(entity_config(federation))
    for method, rounds in (("mvcc", 3), ("partition", 1)):
        config = entity_config(federation, swap_method=method, swap_lock_timeout_s=0.9, max_parallel_feeders=2)
        async with snapshot_reader(federation, seen):
            for _ in range(rounds):
                for feeder in ("hub1", "hub2"):
                    federation.cluster.psql(
                        "UPDATE hosts SET seen = now() + random() * interval '1 hour' WHERE hostkey <= 'SHA=200'",
                        dbname=federation.feeders[feeder],
                    )
                runs = await sync(config, "hub1", "hub2")
                assert [r.outcome for r in runs] == [Outcome.SUCCESS] * 2
                if method == "mvcc":  # a partition swap also retries while the reader holds the parents
                    assert [r.swap_attempts for r in runs] == [1, 1]
    assert seen
    assert all(seen), f"{seen.count(False)} of {len(seen)} snapshots saw a host twice or nowhere"
    assert federation.superhub_bool(CONSISTENT)


async def test_without_the_rule_nothing_runs_and_a_missing_newest_column_fails_in_one_line(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `entity_key` the swap never calls the entity step and creates none of its tables; entity_newest
    naming a column the superhub's table lacks fails the run as a configuration error, in one line."""

    async def refused(*_: object) -> None:
        raise AssertionError("the entity step ran without the rule")

    with monkeypatch.context() as patched:
        patched.setattr(swap, "settle_entities", refused)
        config = federation.config()
        config = config.model_copy(update={"superhub": config.superhub.model_copy(update={"worker_processes": 0})})
        await synced(config, "hub3")
    assert not federation.superhub_bool("SELECT to_regclass('fedload.entity_homes') IS NOT NULL")

    [run] = await sync(entity_config(federation, entity_newest="public.hosts.lastseen"), "hub3")
    assert (run.outcome, run.error_kind) == (Outcome.FAILED, ErrorKind.CONFIG)
    missing = "superhub.entity_newest = public.hosts.lastseen: the superhub has no table public.hosts with that column"
    assert run.error == missing
    lines = []
    for newest in ("public.hosts.lastseen", "public.contexts.tags", "public.hosts.seen"):
        rule = EntityRule("hostkey", TableName("public", newest.split(".")[1]), newest.split(".")[2], "hub_id")
        [*_, probe] = await probe_superhub(superhub_target(config), parents_spec(config), "superhub", rule)
        lines.append(probe.line())
    assert lines == [  # check-config --connect's lines
        f"superhub entities: FAILED: {missing}",
        "superhub entities: OK (hostkey by the newest public.contexts.tags (text[]))",
        "superhub entities: OK (hostkey by the newest public.hosts.seen (timestamp with time zone))",
    ]


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"entity_key": "hostkey"}, "superhub.entity_newest: missing: entity_key needs entity_newest"),
        ({"entity_newest": "public.hosts.seen"}, "superhub.entity_key: missing: entity_newest needs entity_key"),
        (
            {"entity_key": "hostkey", "entity_newest": "other.hosts.seen"},
            "superhub.entity_newest: table other.hosts is not one of superhub.tables",
        ),
        (
            {"entity_key": "hostkey", "entity_newest": "hosts.seen"},
            "superhub.entity_newest: 'hosts.seen' is not schema.table.column in lower case",
        ),
        (
            {"entity_max_displaced_share": 1.5},
            "superhub.entity_max_displaced_share: Input should be less than or equal to 1",
        ),
        ({"entity_max_displaced_share": 0}, "superhub.entity_max_displaced_share: Input should be greater than 0"),
        ({"entity_clock_skew_s": 0}, "superhub.entity_clock_skew_s: Input should be greater than 0"),
        ({"entity_max_displaced": -1}, "superhub.entity_max_displaced: Input should be greater than or equal to 0"),
    ],
)
def test_entity_settings_problems_are_one_line(settings: dict[str, str], problem: str) -> None:
    """check-config names what is wrong with entity_key / entity_newest in one line."""
    superhub = {"dsn": "postgresql:///x", "tables": ["public.*"]} | settings
    with pytest.raises(ConfigError) as raised:
        parse_config({"superhub": superhub})
    [line] = raised.value.problems
    assert line.startswith(f"config: {problem}")


async def test_no_table_is_kept_unchanged_under_the_rule(federation: Federation) -> None:
    """With the rule, binary mode sends every table at every run (a kept partition would hold the feeder's rows less
    the displaced ones, which no digest of the feeder's table describes); the same runs without it keep them."""
    binary = {"dump_mode": DumpMode.BINARY, "skip_unchanged": True, "skip_unchanged_min_rows": 0}
    with_rule = entity_config(federation)
    without = with_rule.model_copy(update={"superhub": with_rule.superhub.model_copy(update={"entity_key": None})})
    kept: dict[str, list[tuple[str, ...]]] = {}
    for name, base in (("with", with_rule), ("without", without)):
        config = base.model_copy(update={"feeders": {"hub1": base.feeders["hub1"].model_copy(update=binary)}})
        runs = [(await sync(config, "hub1"))[0] for _ in range(3)]
        assert [run.outcome for run in runs] == [Outcome.SUCCESS] * 3, [run.error for run in runs]
        kept[name] = [tuple(run.unchanged_tables) for run in runs]
    assert kept["with"] == [(), (), ()]
    assert kept["without"][-1], kept  # the control: unchanged tables are kept there


def claim(fed: Federation, feeder: str, first: int, last: int, seen: str) -> None:
    """Feeder `feeder` lists hosts SHA=first..last (another feeder's) with `seen` (SQL), and a context of each."""
    fed.cluster.psql(
        f"INSERT INTO hosts (hostkey, name, seen) SELECT 'SHA=' || g, 'claimed', {seen} "
        f"FROM generate_series({first}, {last}) g;"
        f"INSERT INTO contexts SELECT 'SHA=' || g, 'claimed' FROM generate_series({first}, {last}) g",
        dbname=fed.feeders[feeder],
    )


def shown_count(fed: Federation, key: int) -> int:
    """How many hosts feeder key `key` shows."""
    return fed.superhub_int(f"SELECT count(*) FROM hosts WHERE hub_id = {key}")


@pytest.mark.parametrize("forged", ["'infinity'", "now() + interval '1 day'"])
async def test_a_forged_future_newest_value_takes_no_host(federation: Federation, forged: str) -> None:
    """hub3 lists hub1's 100 own hosts (SHA=201..300) and SHA=0 (shown by hub1 with no value anywhere) with a
    `seen` past the superhub's clock: none moves (they rank below every copy, NULLs too), the run succeeds with
    hub3's honest hosts still its own, and the claim is logged once with hub3's name and count; the displacement
    bound (off here) is not what stops it."""
    config = entity_config(federation)
    await synced(config)
    claim(federation, "hub3", 201, 300, forged)
    federation.cluster.psql(
        f"INSERT INTO hosts (hostkey, seen) VALUES ('SHA=0', {forged})", dbname=federation.feeders["hub3"]
    )
    with capture_logs() as logs:
        await synced(config, "hub3")
    assert [home(federation, f"SHA={n}") for n in (0, 50, 201, 250, 299)] == ["|1", "3|3", "1|1", "1|1", "1|1"]
    assert federation.superhub_int(SHOWN_TWICE) == 0
    assert displaced(federation, "contexts", "SHA=250") == "hub3:1"
    future = [e for e in logs if e["event"] == "entities.future_newest"]
    assert [(e["feeder"], e["entities"], e["log_level"]) for e in future] == [("hub3", 101, "warning")]

    federation.cluster.psql(
        "UPDATE hosts SET seen = now() WHERE hostkey = 'SHA=250'", dbname=federation.feeders["hub3"]
    )
    await synced(config, "hub3")  # an honest value of the same feeder is believed again
    assert home(federation, "SHA=250") == "3|3"


async def test_a_mass_displacement_is_held_back_and_an_honest_move_goes_on(federation: Federation) -> None:
    """With the default bound, hub2 moving 5 of the 101 entities hub1 shows goes on; hub2 then claiming 70 more
    (newer) is held back: a dump error naming both feeders and the setting, every partition as before; one sync
    with entity_max_displaced_share = 1.0 takes them."""
    await synced(entity_config(federation))
    config = entity_config(federation, entity_max_displaced_share=0.5)
    claim(federation, "hub2", 201, 205, "now()")
    await synced(config, "hub2")
    assert [home(federation, f"SHA={n}") for n in (201, 205, 206)] == ["2|2", "2|2", "1|1"]

    claim(federation, "hub2", 206, 275, "now()")
    before = [shown_count(federation, key) for key in (1, 2, 3)]
    [run] = await sync(config, "hub2")
    assert (run.outcome, run.error_kind) == (Outcome.FAILED, ErrorKind.DUMP)
    assert run.error == (
        "feeder hub2 would take 70 of the 96 entities feeder hub1 shows (73%), more than "
        "superhub.entity_max_displaced_share = 0.5 and entity_max_displaced = 10 allow: held back, the old data "
        "kept (if these entities really moved, sync once with entity_max_displaced_share = 1.0)"
    )
    assert [shown_count(federation, key) for key in (1, 2, 3)] == before
    assert [home(federation, f"SHA={n}") for n in (205, 206, 275)] == ["2|2", "1|1", "1|1"]
    assert federation.superhub_int(SHOWN_TWICE) == 0

    await synced(entity_config(federation, entity_max_displaced_share=1.0), "hub2")  # the operator's one step
    assert [home(federation, f"SHA={n}") for n in (206, 275, 276)] == ["2|2", "2|2", "1|1"]


async def test_status_json_and_metrics_say_who_displaced_whom(federation: Federation) -> None:
    """status, status --json and fedload_feeder_displaced_by_entities give, per feeder, how many of its entities
    each other feeder shows."""
    config = entity_config(federation)
    await synced(config)
    pairs = {"hub1": {"hub2": 100, "hub3": 100}, "hub2": {"hub1": 1, "hub3": 100}, "hub3": {"hub1": 1}}
    statuses = await read_status(config)
    assert {s.feeder: s.displaced_by for s in statuses} == pairs
    console = Console(width=400, record=True)
    console.print(status_table(statuses, ConfigLocation(federation.tmp / "fedload.toml", "test")))
    assert "200 (hub2 100, hub3 100)" in console.export_text()

    path = federation.tmp / "fedload.toml"
    rule = 'tables = ["public.*"]\nentity_key = "hostkey"\nentity_newest = "public.hosts.seen"'
    path.write_text(config_toml(federation).replace('tables = ["public.*"]', rule))
    done = fedload("status", "--json", "--config", str(path))
    assert {s["feeder"]: s["displaced_by"] for s in json.loads(done.stdout)} == pairs, done.stderr

    metrics, conn = DaemonMetrics(), await asyncpg.connect(federation.cluster.dsn(federation.superhub))
    try:
        metrics.apply_history(await read_states_of(list(federation.feeders), conn, entities=True))
        gauge = "fedload_feeder_displaced_by_entities"
        exported = {
            (s.labels["feeder"], s.labels["by"]): s.value
            for family in metrics.registry.collect()
            for s in family.samples
            if s.name == gauge
        }
        assert exported == {(f, by): n for f, of in pairs.items() for by, n in of.items()}
        federation.cluster.psql("DELETE FROM contexts WHERE hostkey = 'SHA=0'", dbname=federation.feeders["hub1"])
        await synced(config, "hub1")  # SHA=0 goes to hub2: hub3's pair with hub1 gives way to one with hub2
        metrics.apply_history(await read_states_of(list(federation.feeders), conn, entities=True))
        assert metrics.registry.get_sample_value(gauge, {"feeder": "hub3", "by": "hub1"}) is None
        assert metrics.registry.get_sample_value(gauge, {"feeder": "hub3", "by": "hub2"}) == 1
    finally:
        await conn.close()


async def test_a_newest_column_without_a_clock_has_no_clock_rule(federation: Federation) -> None:
    """A newest column that is no date or timestamp (text[] here) is ranked by its order alone: the syncs work."""
    config = entity_config(federation, entity_newest="public.contexts.tags")
    await synced(config, "hub1", "hub2")
    assert federation.superhub_int(SHOWN_TWICE) == 0
