"""One entity, one feeder through the coordinator with shards (docs/entities.md, "Across shards"): hub1 and hub3 on
s1, hub2 on s2; hub1 and hub2 share hosts SHA=1..200, all three SHA=1..100 (the sample federation, where the feeder
filled last has the newest `seen`). The coordinator hides the copies not at home; its readers see each host once,
while the feeders on both shards swap the moved hosts back and forth."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from fedload.commands.move import move_feeder
from fedload.commands.status import read_status
from fedload.config import Config, SuperhubConfig, SwapMethod, parse_config
from fedload.errors import ConfigError, ErrorKind, SwapLockError
from fedload.results import Outcome
from fedload.service.daemon_metrics import coordinator_displaced
from fedload.service.metrics import DaemonMetrics
from fedload.superhub import swap
from fedload.superhub.job import coordinated_entities, parents_spec, superhub_target, swap_policy
from fedload.superhub.removal import drop_feeder
from tests.superhub.test_entities import CONSISTENT, SHOWN_TWICE  # the same checks as on one superhub
from tests.support.federation import Federation, sync
from tests.support.shards import config_file, coord_int, coord_sql, shard_int, with_coordinator

LAYOUT = {"s1": ["hub1", "hub3"], "s2": ["hub2"]}


def entity_shards(fed: Federation, **superhub: Any) -> Config:
    """hub1, hub3 on s1 and hub2 on s2 with a coordinator, the entity rule on `hosts.seen`; runs in this process."""
    config = with_coordinator(fed, LAYOUT)
    settings = {"worker_processes": 0, "entity_key": "hostkey", "entity_newest": "public.hosts.seen"}
    # the federation's first round moves most hosts (the feeder filled last is newest): no displacement is held
    # back here but in the tests that ask for it (entity_max_displaced_share below 1); the tests' newer values
    # are up to 2 hours ahead of the clock, believed with this skew
    settings |= {"entity_max_displaced_share": 1.0, "entity_clock_skew_s": 3 * 3600.0} | superhub
    checked = SuperhubConfig.model_validate(config.superhub.model_dump() | settings)
    return config.model_copy(update={"superhub": checked})


def again(config: Config, **superhub: Any) -> Config:
    """`config` with other superhub settings."""
    return config.model_copy(update={"superhub": config.superhub.model_copy(update=superhub)})


def shown_by(fed: Federation, hostkey: str) -> str:
    """The feeder keys the coordinator shows `hostkey` under: "<in hosts>|<in contexts>", e.g. "2|2"."""
    shown = "coalesce((SELECT string_agg(DISTINCT hub_id::text, ',') FROM {} WHERE hostkey = '{}'), '')"
    return coord_sql(fed, f"SELECT {shown.format('hosts', hostkey)} || '|' || {shown.format('contexts', hostkey)}")


async def synced(config: Config, *names: str) -> None:
    """Sync the named feeders (all if none); each succeeds."""
    runs = await sync(config, *names)
    assert [r.outcome for r in runs] == [Outcome.SUCCESS] * (len(names) or 3), [r.error for r in runs]


async def test_hosts_shown_once_across_shards_and_back_when_the_newest_feeder_is_removed(
    federation: Federation,
) -> None:
    """Hosts in feeders on two shards are shown once by the coordinator, by the newest feeder; the other copies are
    in the coordinator's displaced views, not moved on the shards; removing hub2 (s2) shows hub1's copies again."""
    config = entity_shards(federation)
    await synced(config)
    assert coord_int(federation, SHOWN_TWICE) == 0
    assert [shown_by(federation, f"SHA={n}") for n in (50, 150, 250)] == ["3|3", "2|2", "1|1"]
    assert shown_by(federation, "SHA=0") == "|1"  # no newest value anywhere: the first feeder by name
    displaced = """SELECT string_agg(fedload_feeder || ':' || n, ',' ORDER BY fedload_feeder) FROM (
        SELECT fedload_feeder, count(*) AS n FROM fedload_displaced."public.hosts" GROUP BY 1) AS d"""
    assert coord_sql(federation, displaced) == "hub1:200,hub2:100"
    assert shard_int(federation, "s2", "SELECT count(*) FROM hosts") == 200  # the shards keep every copy
    assert coord_sql(federation, 'SELECT count(*) FROM fedload_all."public.hosts"') == "600"
    displaced_of = {s.feeder: s.displaced_entities for s in await read_status(config)}
    assert displaced_of == {"hub1": 200, "hub2": 101, "hub3": 1}  # from the coordinator's registry
    metrics = DaemonMetrics()
    metrics.set_displaced(await coordinator_displaced(config) or {})
    gauge = "fedload_feeder_displaced_entities"
    assert {f: metrics.registry.get_sample_value(gauge, {"feeder": f}) for f in displaced_of} == displaced_of

    entities = coordinated_entities(config)
    await drop_feeder(
        superhub_target(config, "s2"), parents_spec(config), "hub2", 2, policy=swap_policy(config), coordinated=entities
    )
    assert coord_int(federation, SHOWN_TWICE) == 0
    assert [shown_by(federation, f"SHA={n}") for n in (50, 150, 250)] == ["3|3", "1|1", "1|1"]
    assert coord_int(federation, "SELECT count(*) FROM fedload.entity_copies WHERE feeder = 'hub2'") == 0
    assert coord_int(federation, "SELECT count(*) FROM fedload.entity_pending") == 0


Reader = Callable[[asyncpg.Connection], Awaitable[bool]]


async def _one_statement(conn: asyncpg.Connection) -> bool:
    return bool(await conn.fetchval(CONSISTENT))


# A transaction's first statement takes its locks on both tables at once, in the order the swaps and builds take
# theirs (by name): a reader that locked one table and asks for the other in a later statement would wait behind a
# swap's or a build's lock request that waits for it, until that request's lock timeout, again and again.
FIRST = "SELECT (SELECT count(*) FROM contexts{where}), (SELECT count(*) FROM hosts{where})"


async def _repeatable_read(conn: asyncpg.Connection) -> bool:
    """Its local snapshot at the first statement, which reads s1 alone; s2's snapshot at the second, later."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        await conn.fetchrow(FIRST.format(where=" WHERE hub_id = 1"))
        await asyncio.sleep(0.15)
        return bool(await conn.fetchval(CONSISTENT))


async def _read_committed(conn: asyncpg.Connection) -> bool:
    """Both shards' snapshots at the first statement, a new local snapshot at the second, later."""
    async with conn.transaction(readonly=True):
        await conn.fetchrow(FIRST.format(where=""))
        await asyncio.sleep(0.15)
        return bool(await conn.fetchval(CONSISTENT))


READERS: dict[str, Reader] = {
    "statement": _one_statement,
    "repeatable read": _repeatable_read,
    "read committed": _read_committed,
}


@contextlib.asynccontextmanager
async def readers(dsn: str, seen: dict[str, list[bool]], kinds: dict[str, Reader]) -> AsyncIterator[None]:
    """Readers of the coordinator in a loop, each answer in `seen` under the reader's name."""

    async def loop(name: str, read: Reader) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            while True:
                seen.setdefault(name, []).append(await read(conn))
                await asyncio.sleep(0.005)
        finally:
            await conn.close()

    tasks = [asyncio.create_task(loop(name, read)) for name, read in kinds.items()]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


MOVED = "hostkey BETWEEN 'SHA=201' AND 'SHA=220'"  # on hub1 only at first (SHA=201..300 are hub1's alone)


def gain_or_drop(fed: Federation, round_: int) -> None:
    """Round 0, 2, ...: hub2 (s2) gains the moved hosts, newer than hub1's copies; round 1, 3, ...: hub2 drops them
    and hub1's stale copies are the only ones again. Both feeders' shared hosts get a random `seen` every round."""
    if round_ % 2 == 0:
        sql = (
            "INSERT INTO hosts (hostkey, name, seen) SELECT 'SHA=' || n, 'moved', now() + interval '2 hours' "
            "FROM generate_series(201, 220) AS n;"
            "INSERT INTO contexts SELECT 'SHA=' || n, 'new' || g "
            "FROM generate_series(201, 220) AS n, generate_series(1, 5) AS g"
        )
    else:
        sql = f"DELETE FROM contexts WHERE {MOVED}; DELETE FROM hosts WHERE {MOVED}"
    fed.cluster.psql(sql, dbname=fed.feeders["hub2"])
    for feeder in ("hub1", "hub2"):
        fed.cluster.psql(
            "UPDATE hosts SET seen = now() + random() * interval '1 hour' WHERE hostkey <= 'SHA=200'",
            dbname=fed.feeders[feeder],
        )


async def test_readers_of_the_coordinator_see_each_host_once_while_feeders_on_two_shards_swap(
    federation: Federation,
) -> None:
    """hub1 (s1) and hub2 (s2) sync at once, round after round: hub2 gains 20 of hub1's hosts (newer) and drops them
    again, their 200 shared hosts newest on either side at random. Readers of the coordinator (one statement; a
    repeatable read transaction reading s1, then both; a read committed one of two statements) never see a host
    twice or nowhere; both swap methods."""
    config = entity_shards(federation)
    await synced(config)
    seen: dict[str, list[bool]] = {}
    dsn = federation.cluster.dsn(f"{federation.superhub}_coord")
    for method, rounds, kinds in ((SwapMethod.MVCC, 4, READERS), (SwapMethod.PARTITION, 2, READERS)):
        swapping = again(config, swap_method=method, max_parallel_feeders=2)
        async with readers(dsn, seen, kinds):
            for round_ in range(rounds):
                gain_or_drop(federation, round_)
                await synced(swapping, "hub1", "hub2")
                assert shown_by(federation, "SHA=210") == ("2|2" if round_ % 2 == 0 else "1|1")
    assert all(seen.get(name) for name in ("statement", "repeatable read", "read committed")), seen.keys()
    wrong = {name: answers.count(False) for name, answers in seen.items() if not all(answers)}
    counts = {name: len(answers) for name, answers in seen.items()}
    assert not wrong, f"readings that saw a host twice or nowhere: {wrong} of {counts}"
    assert coord_int(federation, SHOWN_TWICE) == 0
    assert coord_int(federation, "SELECT count(*) FROM fedload.entity_pending") == 0


async def test_a_swap_failing_after_its_prepare_leaves_its_feeder_pending_and_the_next_change_heals_it(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hub2 gains 20 hosts, newer, but its swap fails after the coordinator's prepare: the coordinator still shows
    each host once (hub1's copies), hub2 is pending; the next changes (hub1's sync, the build beside it) settle it
    from what hub2 still has; hub2's next sync shows the gained hosts."""
    config = entity_shards(federation)
    await synced(config)
    gain_or_drop(federation, 0)

    async def failed(*_: object) -> bool:
        raise SwapLockError("the swap's locks never came (a test)")

    with monkeypatch.context() as patched:
        patched.setattr(swap, "_polite", failed)
        [run] = await sync(config, "hub2")
    assert run.outcome is Outcome.FAILED
    assert coord_sql(federation, "SELECT string_agg(feeder, ',') FROM fedload.entity_pending") == "hub2"
    assert coord_sql(federation, CONSISTENT) == "t"
    assert shown_by(federation, "SHA=210") == "1|1"

    await synced(config, "hub1")
    assert coord_int(federation, "SELECT count(*) FROM fedload.entity_pending") == 0
    assert (
        coord_int(federation, "SELECT count(*) FROM fedload.entity_copies WHERE feeder = 'hub2'") == 201
    )  # SHA=0..200
    await synced(config, "hub2")
    assert (shown_by(federation, "SHA=210"), coord_sql(federation, CONSISTENT)) == ("2|2", "t")


async def test_a_feeder_moved_to_another_shard_with_new_hosts_is_seen_once_throughout(federation: Federation) -> None:
    """hub2 gains 20 of hub1's hosts (newer) and is then moved from s2 to s1 (`feeder move`, which loads it there
    and switches the coordinator): readers of the coordinator see every host once throughout, and hub2 shows the
    gained hosts afterwards."""
    config = entity_shards(federation)
    await synced(config)
    gain_or_drop(federation, 0)
    path = config_file(federation, config)
    seen: dict[str, list[bool]] = {}
    async with readers(federation.cluster.dsn(f"{federation.superhub}_coord"), seen, READERS):
        assert await asyncio.to_thread(move_feeder, config, path, "hub2", "s1") == 0
    wrong = {name: answers.count(False) for name, answers in seen.items() if not all(answers)}
    counts = {name: len(answers) for name, answers in seen.items()}
    assert not wrong, f"readings that saw a host twice or nowhere: {wrong} of {counts}"
    assert (shown_by(federation, "SHA=210"), coord_sql(federation, CONSISTENT)) == ("2|2", "t")
    assert coord_int(federation, "SELECT count(*) FROM fedload.entity_pending") == 0


def test_entity_rule_with_shards_needs_a_coordinator() -> None:
    """check-config: entity_key with [shards] and no [coordinator] is refused in one line."""
    document = {
        "superhub": {"tables": ["public.*"], "entity_key": "hostkey", "entity_newest": "public.hosts.seen"},
        "shards": {"s1": {"dsn": "postgresql:///a"}},
        "feeders": {"hub1": {"key": 1, "shard": "s1", "transport": "local"}},
    }
    with pytest.raises(ConfigError) as raised:
        parse_config(document)
    [line] = raised.value.problems
    assert line.startswith("config: superhub.entity_key: with [shards], one entity, one feeder is kept on the coord")


async def test_across_shards_a_forged_newest_wins_nothing_and_a_mass_displacement_is_held_back(
    federation: Federation,
) -> None:
    """hub2 (s2) lists hub1's own hosts (s1, SHA=201..300) with `seen` = 'infinity': the coordinator still shows
    hub1's copies, and says who displaced whom; then hub2 claims 70 of them with a current `seen` under the default
    bound: held back before its shard commits (a dump error naming both feeders and the setting, s2's data as
    before, nothing left pending), and one sync with entity_max_displaced_share = 1.0 takes them."""
    config = entity_shards(federation)
    await synced(config)
    hub2 = federation.feeders["hub2"]
    federation.cluster.psql(
        "INSERT INTO hosts (hostkey, seen) SELECT 'SHA=' || g, 'infinity' FROM generate_series(201, 300) g",
        dbname=hub2,
    )
    await synced(config, "hub2")
    assert [shown_by(federation, f"SHA={n}") for n in (150, 201, 299)] == ["2|2", "1|1", "1|1"]
    assert coord_int(federation, SHOWN_TWICE) == 0
    by = {s.feeder: s.displaced_by for s in await read_status(config)}
    assert by == {"hub1": {"hub2": 100, "hub3": 100}, "hub2": {"hub1": 101, "hub3": 100}, "hub3": {"hub1": 1}}

    federation.cluster.psql("UPDATE hosts SET seen = now() WHERE hostkey BETWEEN 'SHA=201' AND 'SHA=270'", dbname=hub2)
    on_s2 = shard_int(federation, "s2", "SELECT count(*) FROM hosts WHERE seen <> 'infinity'")
    [run] = await sync(again(config, entity_max_displaced_share=0.5), "hub2")
    assert (run.outcome, run.error_kind) == (Outcome.FAILED, ErrorKind.DUMP), run.error
    assert run.error is not None
    assert run.error.startswith(
        "feeder hub2 would take 70 of the 101 entities feeder hub1 shows (69%), more than "
        "superhub.entity_max_displaced_share = 0.5"
    )
    assert shard_int(federation, "s2", "SELECT count(*) FROM hosts WHERE seen <> 'infinity'") == on_s2
    assert [shown_by(federation, f"SHA={n}") for n in (201, 270)] == ["1|1", "1|1"]
    assert coord_int(federation, "SELECT count(*) FROM fedload.entity_pending") == 0

    await synced(config, "hub2")  # the share at 1.0: the operator's one step
    assert [shown_by(federation, f"SHA={n}") for n in (201, 270, 271)] == ["2|", "2|", "1|1"]  # hub2 has no contexts
    assert coord_int(federation, SHOWN_TWICE) == 0
