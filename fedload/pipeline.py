"""One feeder's run, end to end: lock, dump over the transport, load into staging, verify, swap, record.

A dry run does all of it but the swap and the record, inside a transaction that it rolls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import asyncpg

from fedload.command import dump_command, transport_for
from fedload.config import Config, FeederConfig
from fedload.errors import ConfigError, DumpError, FedloadError, SuperhubError, one_line
from fedload.importer import Importer, ImportPolicy
from fedload.log import get_logger
from fedload.names import TableName
from fedload.receive import DumpReceiver
from fedload.rejects import is_bad_row
from fedload.runs import (
    RunRecord,
    ensure_superhub,
    finish_run,
    forget_rejects,
    start_run,
    try_feeder_lock,
    unlock_feeder,
)
from fedload.schema import ParentTable, read_parents, unmatched_patterns
from fedload.schema_file import create_parents_from_file
from fedload.stream import Trailer
from fedload.swap import SwapPolicy, SwapStats, analyze_partitions, describe_swap, swap_in
from fedload.transport import FeederProcess, Transport
from transforms import Item, Remap, RemapError, load_remap

__all__ = [
    "FeederRun",
    "Progress",
    "close_superhub",
    "connect_superhub",
    "create_parents",
    "server_message",
    "superhub_errors",
    "sync_feeder",
]

log = get_logger()


@dataclass(slots=True)
class Progress:
    """Live state of one feeder's run, for progress displays."""

    feeder: str
    phase: str = "waiting"
    raw_bytes: int = 0
    dump_bytes: int = 0
    rows: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class FeederRun:
    """How one feeder's run ended."""

    feeder: str
    outcome: str  # success | failed | busy
    error: str | None
    rows: dict[str, int]
    raw_bytes: int
    dump_bytes: int
    seconds: float
    swap_lock_ms: float | None = None
    plan: tuple[str, ...] = ()  # a dry run's account of what the swap would do
    rejected: dict[str, int] = field(default_factory=dict)  # bad_rows = "reject": rows set aside, per table
    swap_attempts: int | None = None
    cancelled_backends: int | None = None  # queries the swap cancelled to get its locks


ProgressCallback = Callable[[Progress], None]
# The importer's literal check reads strings as PostgreSQL does with standard_conforming_strings on: a database or
# role set to off would read backslashes differently, so the session always sets it (startup options win).
_SESSION_SETTINGS = {"standard_conforming_strings": "on"}


async def connect_superhub(config: Config, purpose: str = "") -> asyncpg.Connection:
    """A connection to the superhub, with fedload's timeouts; SuperhubError if it cannot be made.

    `purpose` (a feeder's name, say) shows in pg_stat_activity as the application name "fedload <purpose>"."""
    superhub = config.superhub
    settings = {**_SESSION_SETTINGS, "application_name": f"fedload {purpose}".strip()[:63]}
    try:
        async with asyncio.timeout(superhub.connect_timeout_s):
            return await asyncpg.connect(
                superhub.dsn, command_timeout=superhub.statement_timeout_s, server_settings=settings
            )
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise SuperhubError(f"cannot connect to the superhub: {exc or type(exc).__name__}") from exc


async def create_parents(conn: asyncpg.Connection, config: Config) -> list[str]:
    """Create the missing partitioned parents from the schema file, if one is configured; their names."""
    superhub = config.superhub
    if superhub.schema_file is None:
        return []
    key_type = "integer" if all(isinstance(f.key, int) for f in config.feeders.values()) else "text"

    def wanted(schema: str, name: str) -> bool:
        return any(p.matches(TableName(schema, name)) for p in superhub.tables)

    return await create_parents_from_file(conn, superhub.schema_file, superhub.feeder_key, key_type, wanted)


async def sync_feeder(
    name: str,
    config: Config,
    *,
    progress: ProgressCallback | None = None,
    transport: Transport | None = None,
    dry_run: bool = False,
) -> FeederRun:
    """Run one feeder's sync; never raises for the feeder's or the dump's failures, only reports them."""
    return await _FeederSync(name, config, progress or (lambda _: None), transport, dry_run=dry_run).run()


class _FeederSync:
    """The state of one feeder's run while it goes through its phases."""

    def __init__(
        self, name: str, config: Config, report: ProgressCallback, transport: Transport | None, *, dry_run: bool
    ) -> None:
        self.name = name
        self.dry_run = dry_run
        self.config = config
        self.feeder = config.feeders[name]
        self.state = Progress(name)
        self._report = report
        self._transport = transport or transport_for(self.feeder)
        self.record = RunRecord("failed")
        self.run_id: int | None = None
        self.stage_prefix = ""
        self.plan: list[str] = []
        self._deadline = asyncio.timeout(config.superhub.run_timeout_s)

    def _cancelled_why(self) -> str:
        if self._deadline.expired():
            return f"the run took longer than run_timeout_s = {self.config.superhub.run_timeout_s:g}"
        return "the run was cancelled"

    def phase(self, phase: str) -> None:
        """Enter a phase and tell the progress display."""
        self.state.phase = phase
        self._report(self.state)

    async def run(self) -> FeederRun:
        """Every phase within the run timeout; failures end up in the returned FeederRun."""
        self.phase("connect")
        try:
            async with self._deadline:
                await self._locked()
        except TimeoutError:  # only the run's deadline: superhub_errors() translates the database's timeouts
            self.record.error = self._cancelled_why()
        except FedloadError as exc:
            self.record.error = one_line(str(exc), limit=None)
        self.phase(self.record.outcome)
        seconds = time.monotonic() - self.state.started
        log.info(
            "sync.feeder_done",
            feeder=self.name,
            outcome=self.record.outcome,
            error=self.record.error,
            seconds=round(seconds, 2),
        )
        return FeederRun(
            self.name,
            self.record.outcome,
            self.record.error,
            self.record.rows or {},
            self.state.raw_bytes,
            self.state.dump_bytes,
            seconds,
            self.record.swap_lock_ms,
            tuple(self.plan),
            self.record.rejected or {},
            self.record.swap_attempts,
            self.record.cancelled_backends,
        )

    async def _locked(self) -> None:
        with superhub_errors(self.config):
            await self._session()

    async def _session(self) -> None:
        conn = await connect_superhub(self.config, self.name)
        try:
            if self.dry_run:
                await self._rolled_back(conn)
                return
            await ensure_superhub(conn)
            if not await try_feeder_lock(conn, self.name):
                self.record = RunRecord("busy", error=f"feeder {self.name} is being synced by another fedload process")
                return
            try:
                await self._recorded(conn)
            finally:  # a lost connection has released the lock already
                await asyncio.shield(_superhub_gone_is_fine(unlock_feeder(conn, self.name)))
        finally:
            await asyncio.shield(close_superhub(conn))

    async def _rolled_back(self, conn: asyncpg.Connection) -> None:
        """The dry run: bootstrap (if needed), load and check inside a transaction that is always rolled back."""
        transaction = conn.transaction()
        await transaction.start()
        try:
            if await conn.fetchval("SELECT to_regclass('fedload.runs')") is None:
                await ensure_superhub(conn)
            await create_parents(conn, self.config)
            self.stage_prefix = f"dry{conn.get_server_pid()}"
            await self._load_and_swap(conn)
        finally:
            await asyncio.shield(transaction.rollback())

    async def _recorded(self, conn: asyncpg.Connection) -> None:
        # the run's history is written on a connection of its own, outside the load's transaction
        meta = await connect_superhub(self.config, f"{self.name} history")
        try:
            self.run_id = await start_run(meta, self.name)
            self.stage_prefix = f"r{self.run_id}"
            await self._load_and_swap(conn)
        except FedloadError as exc:
            self.record.error = one_line(str(exc), limit=None)
            raise
        except asyncio.CancelledError:
            self.record.error = self._cancelled_why()
            raise
        finally:
            self.record.raw_bytes, self.record.dump_bytes = self.state.raw_bytes, self.state.dump_bytes
            await asyncio.shield(self._finish(meta))

    async def _finish(self, meta: asyncpg.Connection) -> None:
        """Record the outcome; if the superhub is gone, the next run of the feeder marks this one abandoned."""
        try:
            if self.run_id is not None:
                await _superhub_gone_is_fine(finish_run(meta, self.run_id, self.record))
        finally:
            await close_superhub(meta)

    async def _load_and_swap(self, conn: asyncpg.Connection) -> None:
        """Translated here as well, so that the run's history records the error."""
        with superhub_errors(self.config):
            parents = await self._expected_parents(conn)
            remap = await asyncio.to_thread(_read_remap, self.feeder)
            process = await self._transport.open(dump_command(self.feeder, self.config, parents))
            try:
                await self._import(conn, process, parents, remap)
            finally:
                await asyncio.shield(process.cancel())

    async def _expected_parents(self, conn: asyncpg.Connection) -> dict[TableName, ParentTable]:
        """The parents this feeder's dump must fill: every configured pattern matches one, exclusions aside."""
        superhub = self.config.superhub
        parents = await read_parents(conn, superhub.tables, superhub.feeder_key)
        if unmatched := unmatched_patterns(superhub.tables, parents):
            raise ConfigError(
                f"superhub.tables: {', '.join(repr(str(p)) for p in unmatched)} match(es) no partitioned table on "
                "the superhub; create the parent, set superhub.schema_file, or correct the pattern"
            )
        excluded = self.feeder.exclude_tables
        return {t: p for t, p in parents.items() if not any(x.matches(t) for x in excluded)}

    async def _import(
        self,
        conn: asyncpg.Connection,
        process: FeederProcess,
        parents: dict[TableName, ParentTable],
        remap: Remap | None,
    ) -> None:
        superhub = self.config.superhub
        receiver = DumpReceiver(process, framed=self.feeder.agent, feeder=self.name)
        policy = ImportPolicy(superhub.feeder_key, tuple(superhub.tables), superhub.extra_columns, superhub.bad_rows)
        self.phase("load")
        async with conn.transaction():
            importer = Importer(
                conn,
                feeder=self.name,
                key=self.feeder.key,
                stage_prefix=self.stage_prefix,
                parents=parents,
                policy=policy,
                run_id=self.run_id,
                remap=remap,
            )
            await importer.load(self._tracked(receiver, importer))
            rows = {staged.parent.qualified_name: staged.rows for staged in importer.staged.values()}
            rejected = {s.parent.qualified_name: s.rejected for s in importer.staged.values() if s.rejected}
            _verify_counts(rows, rejected, receiver.trailer)
            await importer.finish()
            self.phase("swap")
            if self.dry_run:
                self.plan = await describe_swap(conn, importer.staged.values(), feeder=self.name, key=self.feeder.key)
                self.record = RunRecord("success", rows=rows, rejected=rejected)
                return
            swap = SwapStats()
            try:
                await swap_in(
                    conn,
                    importer.staged.values(),
                    feeder=self.name,
                    key=self.feeder.key,
                    policy=SwapPolicy.from_config(superhub),
                    stats=swap,
                    connect=lambda: connect_superhub(self.config, f"{self.name} swap watcher"),
                )
            finally:
                _note_swap(self.record, swap)
            await forget_rejects(conn, self.name, except_run=self.run_id)  # they described the data swapped out
        self.record = _note_swap(RunRecord("success", rows=rows, rejected=rejected), swap)
        self.phase("analyze")
        await analyze_partitions(conn, parents, self.name, self.feeder.key)

    async def _tracked(self, receiver: DumpReceiver, importer: Importer) -> AsyncIterator[Item]:
        async for item in receiver.items():
            self.state.raw_bytes, self.state.dump_bytes = receiver.raw_bytes, receiver.dump_bytes
            self.state.rows = sum(s.rows for s in importer.staged.values())
            self._report(self.state)
            yield item


def _note_swap(record: RunRecord, swap: SwapStats) -> RunRecord:
    """Copy how the swap went (its wait, attempts, cancelled queries, lock failure) into the run's record."""
    record.swap_lock_ms, record.swap_attempts = swap.waited_ms, swap.attempts
    record.cancelled_backends, record.swap_lock_failed = swap.cancelled, swap.lock_failed
    return record


def _read_remap(feeder: FeederConfig) -> Remap | None:
    """The feeder's remap file, read on the superhub for each run; ConfigError if it is not valid."""
    if feeder.remap is None:
        return None
    try:
        return load_remap(feeder.remap)
    except RemapError as exc:
        raise ConfigError(str(exc)) from exc


def _verify_counts(loaded: dict[str, int], rejected: dict[str, int], trailer: Trailer | None) -> None:
    """The agent's row counts must match what was loaded (or rejected), table by table, and the agent must have
    seen every table that was loaded (agents before 0.2 do not say which tables they saw)."""
    if trailer is None:
        return
    if trailer.tables is not None and (unseen := sorted(set(loaded) - set(trailer.tables))):
        raise DumpError(f"the feeder's agent does not list table(s) {', '.join(unseen)} as dumped")
    for table, rows in trailer.rows.items():
        if table in loaded and loaded[table] + rejected.get(table, 0) != rows:
            raise DumpError(f"table {table}: the feeder sent {rows} rows but {loaded[table]} were loaded")


_CONNECTION_LOST = (asyncpg.InterfaceError, ConnectionError)


@contextlib.contextmanager
def superhub_errors(config: Config) -> Iterator[None]:
    """Translate the database driver's failures into fedload's errors: a refused row is the dump's fault
    (DumpError), anything else the superhub's (SuperhubError), a lost connection or a timed-out statement too."""
    try:
        yield
    except asyncpg.PostgresError as exc:
        raise _translate(exc) from exc
    except _CONNECTION_LOST as exc:
        raise SuperhubError(f"the superhub connection was lost: {one_line(str(exc)) or type(exc).__name__}") from exc
    except TimeoutError as exc:  # asyncpg's command_timeout
        limit = config.superhub.statement_timeout_s
        raise SuperhubError(f"a superhub statement took longer than statement_timeout_s = {limit:g}") from exc


async def close_superhub(conn: asyncpg.Connection) -> None:
    """Close a connection politely, or drop it if the server does not answer."""
    try:
        await conn.close(timeout=10)
    except (*_CONNECTION_LOST, asyncpg.PostgresError, TimeoutError):
        conn.terminate()


async def _superhub_gone_is_fine(step: Awaitable[object]) -> None:
    """Run a bookkeeping step whose failure must not hide the run's own error: a dead superhub is only logged."""
    try:
        await step
    except (*_CONNECTION_LOST, asyncpg.PostgresError, TimeoutError) as exc:
        log.warning("sync.bookkeeping_failed", error=str(exc) or type(exc).__name__)


def _translate(exc: asyncpg.PostgresError) -> FedloadError:
    """Rows the superhub refuses (data or integrity errors) reject the dump; the rest is the superhub's failure."""
    if is_bad_row(exc):
        return DumpError(f"the superhub rejected a row: {server_message(exc)}")
    return SuperhubError(f"the superhub failed: {server_message(exc)}")


def server_message(exc: asyncpg.PostgresError) -> str:
    """The server's message on one line, then its detail and hint shortened: a DETAIL can hold a whole row."""
    head = getattr(exc, "message", None) or (exc.args[0] if exc.args else type(exc).__name__)
    parts = [str(head)]
    for label in ("detail", "hint"):
        text = getattr(exc, label, None)
        if text:
            flat = one_line(str(text), limit=None)
            parts.append(f"{label.upper()}: {flat[:300]}{'...' if len(flat) > 300 else ''}")
    return one_line(" ".join(parts), limit=None)
