"""One entity, one feeder, for readers (docs/entities.md, "What a reader can rely on"): no single statement, in read
committed or repeatable read, sees a host under two feeders or under none, whatever moment of a swap (both methods)
or a removal its snapshot comes from.

The window is made deterministic: just before every commit of fedload's (the swap's, the removal's, the history's),
two readers, one per isolation level, send the one-statement check; each takes its snapshot, then waits for a gate
table the test holds; the gate opens right after the commit. So each reader plans with the catalog after the commit
(the partitions attached then) and reads with a snapshot from before it, as a repeatable read reader does that was
queued behind the swap's locks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from asyncpg.transaction import Transaction

from fedload.superhub.job import parents_spec, superhub_target
from fedload.superhub.removal import drop_feeder
from fedload.superhub.swap import SwapPolicy
from tests.superhub.test_entities import entity_config, newer, synced
from tests.support.federation import Federation

GATE = "readers.gate"  # outside superhub.tables (public.*)
# One statement: every host (SHA=1..300) once in hosts, every entity (SHA=0..300) shown in one of the tables (a
# home without contexts of its host shows none), and no entity under two feeders across both. The gate comes first
# in FROM: parse analysis locks it before the tables.
CHECK = f"""
SELECT (SELECT count(*) = 300 AND count(DISTINCT hostkey) = 300 FROM hosts)
   AND (SELECT count(DISTINCT hostkey) = 301 FROM (SELECT hostkey FROM hosts UNION SELECT hostkey FROM contexts) u)
   AND NOT EXISTS (SELECT FROM (SELECT hostkey, hub_id FROM hosts UNION SELECT hostkey, hub_id FROM contexts) u
                   GROUP BY hostkey HAVING count(DISTINCT hub_id) > 1)
FROM {GATE}
"""
_WAITING = f"SELECT count(*) FROM pg_locks WHERE pid = ANY($1::int[]) AND NOT granted AND relation = '{GATE}'::regclass"
ISOLATION = ("read committed", "repeatable read")


@dataclass
class CommitReaders:
    """The readers around every commit of a top-level transaction on fedload's connections (see the module)."""

    dsn: str
    seen: list[tuple[str, str, bool]] = field(default_factory=list)  # (phase, isolation, consistent)
    phase: str = ""
    on: bool = False
    gate: Any = None
    readers: list[Any] = field(default_factory=list)
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def open(self) -> None:
        self.gate = await asyncpg.connect(self.dsn)
        await self.gate.execute(f"CREATE SCHEMA readers; CREATE TABLE {GATE} (); INSERT INTO {GATE} DEFAULT VALUES")
        self.readers = [await asyncpg.connect(self.dsn) for _ in ISOLATION]

    async def close(self) -> None:
        for conn in [self.gate, *self.readers]:
            await conn.close()

    def ours(self, conn: object) -> bool:
        return any(conn is c or getattr(conn, "_con", None) is c for c in [self.gate, *self.readers])

    @contextlib.asynccontextmanager
    async def around_commit(self) -> AsyncIterator[None]:
        """Readers whose snapshots are taken before the commit and whose plans are made after it."""
        async with self.turn:
            await self.gate.execute(f"BEGIN; LOCK TABLE {GATE} IN ACCESS EXCLUSIVE MODE")
            reads = []
            for conn, isolation in zip(self.readers, ISOLATION, strict=True):
                await conn.execute(f"BEGIN ISOLATION LEVEL {isolation}")
                reads.append(asyncio.create_task(conn.fetchval(CHECK)))
            pids = [c.get_server_pid() for c in self.readers]
            async with asyncio.timeout(10):
                while await self.gate.fetchval(_WAITING, pids) < len(pids):  # noqa: ASYNC110 - polls the server
                    await asyncio.sleep(0.005)
            try:
                yield
            finally:
                await self.gate.execute("COMMIT")
                for conn, isolation, read in zip(self.readers, ISOLATION, reads, strict=True):
                    self.seen.append((self.phase, isolation, bool(await read)))
                    await conn.execute("ROLLBACK")

    def wrong(self) -> list[tuple[str, str]]:
        return [(phase, isolation) for phase, isolation, ok in self.seen if not ok]


@pytest.fixture
async def commit_readers(federation: Federation, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[CommitReaders]:
    """CommitReaders on the federation's superhub, hooked into asyncpg's top-level commits while `on`."""
    readers = CommitReaders(federation.cluster.dsn(federation.superhub))
    await readers.open()
    original = Transaction.__aexit__

    async def aexit(self: Transaction, extype: Any, ex: Any, tb: Any) -> None:
        connection = self._connection  # type: ignore[attr-defined]
        if extype is None and readers.on and not self._nested and not readers.ours(connection):  # type: ignore[attr-defined]
            async with readers.around_commit():
                return await original(self, extype, ex, tb)
        return await original(self, extype, ex, tb)

    monkeypatch.setattr(Transaction, "__aexit__", aexit)
    try:
        yield readers
    finally:
        await readers.close()


async def rounds(federation: Federation, readers: CommitReaders, method: str) -> None:
    """Syncs that move hosts every way: taken from another feeder, kept aside again (stale copies), back to another
    feeder when the one showing it drops it; then hub3 removed (its hosts back elsewhere) and synced again (a first
    sync that takes them back)."""
    config = entity_config(federation, swap_method=method, max_parallel_feeders=1)
    hub2, hub3 = federation.feeders["hub2"], federation.feeders["hub3"]
    federation.cluster.psql(  # SHA=250: hub1 -> hub2
        "INSERT INTO hosts (hostkey, name, seen) VALUES ('SHA=250', 'moved', now() + interval '1 hour')", dbname=hub2
    )
    newer(federation, "hub1", "SHA=150", 120)  # a clone, now newest on hub1
    federation.cluster.psql("DELETE FROM hosts WHERE hostkey = 'SHA=50'", dbname=hub3)  # back to hub2
    readers.phase, readers.on = f"{method} sync", True
    await synced(config)
    newer(federation, "hub1", "SHA=250", 180)  # SHA=250: hub2 -> hub1 again
    newer(federation, "hub2", "SHA=150", 240)
    await synced(config, "hub1", "hub2")
    readers.phase = f"{method} remove"
    policy = SwapPolicy.from_config(config.superhub)
    await drop_feeder(superhub_target(config), parents_spec(config), "hub3", 3, policy=policy)
    readers.phase = f"{method} first sync"
    await synced(config, "hub3")
    readers.on = False


@pytest.mark.parametrize("method", ["partition", "mvcc"])
async def test_no_statement_sees_a_host_twice_or_nowhere(
    federation: Federation, commit_readers: CommitReaders, method: str
) -> None:
    """Around every commit of swaps that take, keep aside and give back hosts, of a removal and of a first sync,
    a one-statement reader whose snapshot predates the commit and whose plan follows it, in read committed and in
    repeatable read, sees every host under exactly one feeder."""
    await synced(entity_config(federation))
    await rounds(federation, commit_readers, method)
    phases = {phase for phase, _, _ in commit_readers.seen}
    assert phases == {f"{method} {p}" for p in ("sync", "remove", "first sync")}
    wrong = commit_readers.wrong()
    assert not wrong, f"{len(wrong)} of {len(commit_readers.seen)} readings saw a host twice or nowhere: {wrong}"
