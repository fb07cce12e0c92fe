"""One feeder's run, in the order of its phases (`_FeederSync._sync`): connect, read the expected parents and start
the feeder's dump, lock, start the run's record, load, verify, index, swap, commit, analyze, finish the record.
Each step that needs undoing is an `async with` whose exit is shielded from cancellation.

The dump starts before the lock and the record: the agent's start (a process, pg_dump's connection; over SSH a
session too) is most of a small feeder's run, and the superhub's steps before the load overlap it. Whatever
ends the run before the load (busy, moved away, a failure) stops that dump; an error of the parents' read is
raised where the run records it, as before. The transport connects from the run's start (`connect_ahead`: the
SSH handshake overlaps the superhub's session and the parents' read); a run that ends before its dump closes
that connection unused.

A dry run does all of it but the lock, the swap and the record, inside a transaction that it rolls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable

import asyncpg

from fedload.config import DumpMode, FeederConfig, SwapMethod
from fedload.errors import (
    AgentRefusedError,
    ConfigError,
    DumpError,
    ErrorKind,
    FedloadError,
    capped_error,
    internal_error,
    one_line,
)
from fedload.log import get_logger
from fedload.names import TableName
from fedload.results import FeederRun, Outcome, Phase, Progress, ProgressCallback
from fedload.stream import Header, Trailer
from fedload.superhub import parents_cache
from fedload.superhub.binary_receive import SectionItem
from fedload.superhub.binary_request import binary_columns, digest_requests
from fedload.superhub.bookkeeping import RunRecord, ensure_superhub, forget_rejects, has_history, moved_away
from fedload.superhub.bookkeeping.connection import Bookkeeping, RunHistory
from fedload.superhub.bookkeeping.digests import forget_digests
from fedload.superhub.coordinated_entities import CoordinatedChange, coordinated_change
from fedload.superhub.delta import DeltaRefusedError
from fedload.superhub.freshness import stated_snapshot
from fedload.superhub.importer import Importer
from fedload.superhub.job import Job
from fedload.superhub.kept_sessions import reused_session
from fedload.superhub.receive import DumpReceiver
from fedload.superhub.schema import ParentTable, unmatched_patterns
from fedload.superhub.session import (
    best_effort,
    connect_superhub,
    feeder_lock,
    setup_superhub,
    superhub_error,
    superhub_session,
)
from fedload.superhub.session_watch import SessionWatched
from fedload.superhub.statistics import StatisticsCollector, carry_statistics, max_call_bytes, wants_statistics
from fedload.superhub.swap import SwapStats, analyze_partitions, describe_swap, swap_in
from fedload.superhub.unchanged import (
    KeptPartitionError,
    Skips,
    digests_to_store,
    forget_on_failure,
    forget_refused,
    keep_unchanged,
    loaded_rows,
    plan_skips,
    store_digests,
)
from fedload.transport import FeederProcess, Transport
from fedload.transport.command import dump_command, transport_for
from transforms import Item, Remap, RemapError, load_remap

__all__ = ["FeederRun", "Progress", "ProgressCallback", "sync_feeder"]

log = get_logger()


async def sync_feeder(
    job: Job,
    *,
    progress: ProgressCallback | None = None,
    transport: Transport | None = None,
    dry_run: bool = False,
    history: RunHistory | None = None,
) -> FeederRun:
    """Run one feeder's sync (`job`: the feeder, its superhub and settings, `fedload.superhub.job.feeder_job`); never
    raises for the feeder's or the dump's failures, only reports them.

    `history` is the connection that records the run in fedload.runs, shared by the feeders of a sync or daemon;
    without it the run opens one of its own."""
    feeder_sync = _FeederSync(job, progress or (lambda _: None), transport, dry_run=dry_run)
    if history is not None:
        return await feeder_sync.run(history)
    history = Bookkeeping(f"{job.name} history")
    try:
        return await feeder_sync.run(history)
    finally:
        await asyncio.shield(history.close())


class _FeederSync:
    """The state of one feeder's run while it goes through its phases."""

    def __init__(self, job: Job, report: ProgressCallback, transport: Transport | None, *, dry_run: bool) -> None:
        self.name = job.name
        self.dry_run = dry_run
        self.job = job
        self.feeder = job.feeder
        self.state = Progress(job.name)
        self._report = report
        self._transport = transport or transport_for(self.feeder, job.name)
        self.record = RunRecord(outcome=Outcome.FAILED)
        self.run_id: int | None = None
        self.stage_prefix = ""
        self.plan: list[str] = []
        self._deadline = asyncio.timeout(job.run_timeout_s)
        self._committed = False  # the swap's transaction has committed: the feeder's new data is in
        self._parents: dict[TableName, ParentTable] | Exception = {}  # read before the lock, or why it failed
        self._opening: asyncio.Task[FeederProcess] | None = None  # the dump started before the lock
        self._partitions: dict[TableName, str] = {}  # the feeder's partitions after the swap, for ANALYZE
        self._in_place: set[TableName] = set()  # the parents whose rows the swap replaced in place, for VACUUM
        self._carry = False  # the agent is asked for the feeder's statistics (fedload.superhub.statistics)
        self._remap: Remap | None = None  # the feeder's remap file, read once per run with the parents
        self._all_parents: frozenset[TableName] = frozenset()  # the superhub's parents, this feeder's exclusions too
        self._carried: dict[TableName, tuple[str, ...]] = {}  # tables given them, with the columns left to ANALYZE
        self._skips: Skips | None = None  # the digests asked about (fedload.superhub.unchanged); None: none
        self._kept: frozenset[TableName] = frozenset()  # tables unchanged, their partitions kept

    def phase(self, phase: str) -> None:
        """Enter a phase (then the outcome) and tell the progress display."""
        self.state.phase = phase
        log.debug("sync.phase", feeder=self.name, phase=phase)
        self._report(self.state)

    async def run(self, history: RunHistory) -> FeederRun:
        """Every phase within the run timeout, the run recorded through `history`; failures end up in the returned
        FeederRun."""
        self.phase(Phase.CONNECT)
        try:
            async with self._deadline:
                await (self._dry_run() if self.dry_run else self._sync(history))
        except Exception as exc:  # every failure ends the run as failed; cancellation goes on up
            self._note_error(exc)
            if self.record.error_kind is ErrorKind.INTERNAL and not isinstance(exc, FedloadError):
                log.error("sync.internal_error", feeder=self.name, error=self.record.error, exc_info=exc)
        return self._result()

    async def _sync(self, history: RunHistory) -> None:
        """The run's phases in order; the transport connects to the feeder meanwhile, from the start (its SSH
        handshake beside the superhub's session and the parents' read, before the dump starts on it)."""
        self._transport.connect_ahead()
        try:
            async with reused_session(self.job.superhub, self.name) as conn:
                await ensure_superhub(conn)
                try:
                    await self._start_dump_early(conn)
                    await self._locked_run(conn, history)
                finally:
                    await asyncio.shield(self._stop_unused_dump())
        finally:
            await asyncio.shield(self._transport.close())

    async def _locked_run(self, conn: asyncpg.Connection, history: RunHistory) -> None:
        """The run's phases under the feeder's lock, recorded."""
        async with feeder_lock(conn, self.name) as locked:
            if not locked:
                error = f"feeder {self.name} is being synced by another fedload process"
                self.record = RunRecord(outcome=Outcome.BUSY, error=error)
                return
            async with self._recorded(history):
                if (moved := await moved_away(conn, self.name)) is not None:
                    raise moved
                if isinstance(parents := self._parents, Exception):
                    raise parents
                try:
                    importer = await self._load_and_swap(conn, parents, self._remap)
                except KeptPartitionError as exc:
                    await forget_on_failure(conn, self.name, exc)
                    raise
                except DeltaRefusedError as exc:
                    await forget_digests(conn, self.name, [exc.table])
                    raise
                except AgentRefusedError as exc:
                    if (forgotten := await forget_refused(conn, self.name, self._skips, exc)) is None:
                        raise
                    raise forgotten from exc
                self._committed = True
                self._succeeded(importer)
                await self._analyze(conn, [p for t, p in parents.items() if t not in self._kept])

    async def _load_and_swap(
        self, conn: asyncpg.Connection, parents: dict[TableName, ParentTable], remap: Remap | None
    ) -> Importer:
        """Load the dump, keep the unchanged tables' partitions, swap the others and store the digests, in one
        transaction."""
        entities = coordinated_change(self.job.entities, self.name, self.feeder.key, list(parents.values()))
        async with self._dump(conn, parents) as receiver, entities as change, conn.transaction():
            importer = await self._load(conn, receiver, parents, remap)
            unchanged = await keep_unchanged(conn, importer, self._skips, feeder=self.name, key=self.feeder.key)
            kept = (s for s in importer.staged.values() if s.kept is not None or s.changes_only is not None)
            self._kept = frozenset(s.parent.table for s in kept)  # changed in place: autovacuum analyzes them
            self.record.unchanged_tables = unchanged
            changed = (s.parent.qualified_name for s in importer.staged.values() if s.changes_only is not None)
            self.record.changed_rows_tables = sorted(changed)
            digests = digests_to_store(importer, receiver.trailer, self._skips, self.name)  # checked in any case
            if self._skips is not None:  # before the swap, which may fail: in its transaction all the same
                await store_digests(conn, self.name, self.run_id, digests)
            await self._swap(conn, importer, change)
        return importer

    async def _start_dump_early(self, conn: asyncpg.Connection) -> None:
        """Read the expected parents and start the feeder's dump of them; a failed read is kept for the run."""
        self._carry = _carry_statistics(conn, self.feeder)
        try:
            self._parents = await self._expected_parents(conn)
            self._remap = await asyncio.to_thread(_read_remap, self.feeder)
            self._skips = await self._plan_skips(conn, self._parents)
            command = self._dump_command(self._parents)
        except Exception as exc:  # noqa: BLE001 - raised again inside the run's record (`_locked_run`)
            self._parents = exc
            return
        self._opening = asyncio.get_running_loop().create_task(self._transport.open(command))

    async def _stop_unused_dump(self) -> None:
        """Stop the dump started early if the run ended before loading it (busy, moved away, failed)."""
        opening, self._opening = self._opening, None
        if opening is None:
            return
        opening.cancel()  # a start still under way is undone by the transport
        try:
            process = await opening
        except BaseException:  # noqa: BLE001 - cancelled or could not start: nothing runs
            return
        await process.cancel()

    async def _dry_run(self) -> None:
        """The run's phases up to the swap, which only describes what it would do; then all is rolled back."""
        async with superhub_session(self.job.superhub, self.name) as conn, self._rolled_back(conn):
            await setup_superhub(conn, self.job.parents, history=not await has_history(conn))
            self.stage_prefix = f"dry{conn.get_server_pid()}"
            parents = await self._expected_parents(conn)
            self._remap = await asyncio.to_thread(_read_remap, self.feeder)
            self._carry = _carry_statistics(conn, self.feeder)
            async with self._dump(conn, parents) as receiver:
                importer = await self._load(conn, receiver, parents, self._remap)
                self.phase(Phase.SWAP)
                self.plan = await describe_swap(conn, importer.staged.values(), feeder=self.name, key=self.feeder.key)
                self._succeeded(importer)

    @contextlib.asynccontextmanager
    async def _rolled_back(self, conn: asyncpg.Connection) -> AsyncIterator[None]:
        """A transaction for the block that is always rolled back."""
        transaction = conn.transaction()
        await transaction.start()
        try:
            yield
        finally:
            await asyncio.shield(transaction.rollback())

    @contextlib.asynccontextmanager
    async def _recorded(self, history: RunHistory) -> AsyncIterator[None]:
        """The run's record in fedload.runs, written through `history` (outside the load's transaction): started
        before the block, finished after it with its outcome and error, even when cancelled. If the superhub is
        gone by then, the next run of the feeder marks this one abandoned."""
        run_id = self.run_id = await history.start_run(self.job.superhub, self.name)
        self.stage_prefix = f"r{run_id}"
        try:
            yield
        except BaseException as exc:
            self._note_error(exc)
            raise
        finally:
            self.record.raw_bytes, self.record.dump_bytes = self.state.raw_bytes, self.state.dump_bytes
            await asyncio.shield(best_effort(history.finish_run(self.job.superhub, run_id, self.record)))

    async def _expected_parents(self, conn: asyncpg.Connection) -> dict[TableName, ParentTable]:
        """The parents this feeder's dump must fill: every configured pattern matches one, exclusions aside."""
        spec = self.job.parents
        parents = await parents_cache.cached_parents(conn, self.job.superhub.dsn, spec.tables, spec.feeder_key)
        if unmatched := unmatched_patterns(spec.tables, parents):
            raise ConfigError(
                f"superhub.tables: {', '.join(repr(str(p)) for p in unmatched)} match(es) no partitioned table on "
                "the superhub; create the parent, set superhub.schema_file, or correct the pattern"
            )
        excluded = self.feeder.exclude_tables
        self._all_parents = frozenset(parents)
        return {t: p for t, p in parents.items() if not any(x.matches(t) for x in excluded)}

    def _dump_command(self, parents: dict[TableName, ParentTable]) -> list[str]:
        """The command of the feeder's dump of `parents`, asking for the digests `_plan_skips` chose; in binary mode
        with the columns and types asked for (the remap read with the parents decides which tables can go binary, and
        the load applies the same one)."""
        skips = self._skips
        if self.feeder.dump_mode != DumpMode.BINARY:
            asking = digest_requests(parents.values(), skips.asked, skips.counters) if skips is not None else []
            return dump_command(self.feeder, self.job.transform, parents, asking, statistics=self._carry)
        asked, counters = (skips.asked, skips.counters) if skips is not None else (None, None)
        rejects = self.job.imports.bad_rows == "reject"
        columns = binary_columns(
            parents.values(),
            remap=self._remap,
            rejects=rejects,
            feeder=self.name,
            digests=asked,
            counters=counters,
            deltas=skips.deltas if skips is not None else None,
        )
        return dump_command(self.feeder, self.job.transform, parents, columns, statistics=self._carry)

    async def _plan_skips(self, conn: asyncpg.Connection, parents: dict[TableName, ParentTable]) -> Skips | None:
        """The digests this run asks the agent about (skip_unchanged): None where it asks none. Not with
        `superhub.entity_key` (on one superhub or across shards): a kept partition then holds the feeder's rows less
        those shown by another feeder, not the digest's, and its swap would decide the feeder's entities without
        their newest values."""
        if self.job.swap.entities is not None or self.job.entities is not None:
            return None
        return await plan_skips(conn, self.job, parents, self._remap)

    @contextlib.asynccontextmanager
    async def _dump(
        self, conn: asyncpg.Connection, parents: dict[TableName, ParentTable]
    ) -> AsyncIterator[DumpReceiver]:
        """The feeder's dump of `parents`, streaming, read while the superhub session `conn` is watched (its loss
        ends a wait for the feeder at once); the feeder's command is stopped after the block."""
        opening, self._opening = self._opening, None
        if opening is not None:
            opened = await opening
        else:
            opened = await self._transport.open(self._dump_command(parents))
        process = SessionWatched(opened, conn)
        binary = self.feeder.dump_mode == DumpMode.BINARY
        bound = self.job.imports.max_statement_bytes
        receiver = DumpReceiver(
            process,
            framed=self.feeder.agent,
            feeder=self.name,
            dump_mode=self.feeder.dump_mode,
            max_statement_bytes=bound,
            statistics=self._carry,
            digests=self._skips is not None and not binary,
        )
        try:
            yield receiver
        finally:
            self.record.agent_version = _agent_version(receiver)
            await asyncio.shield(process.cancel())

    async def _load(
        self,
        conn: asyncpg.Connection,
        receiver: DumpReceiver,
        parents: dict[TableName, ParentTable],
        remap: Remap | None,
    ) -> Importer:
        """Load the dump into this run's staging tables (in the caller's transaction), verify the counts the agent
        sent, index the tables, and give them the feeder's statistics where it sent them."""
        self.phase(Phase.LOAD)
        statistics = None
        if self._carry:
            bound = await max_call_bytes(conn, parents.values())
            statistics = StatisticsCollector(self.name, parents, self._all_parents, max_call_bytes=bound)
        importer = Importer(
            conn,
            feeder=self.name,
            key=self.feeder.key,
            stage_prefix=self.stage_prefix,
            parents=parents,
            policy=self.job.imports,
            run_id=self.run_id,
            remap=remap,
            statistics=statistics,
            deltas=self._skips.deltas if self._skips is not None else None,
            stored_rows={t: s.rows for t, s in self._skips.stored.items()} if self._skips is not None else None,
        )
        receiver.read_tuples_with(importer.tuples_pattern)
        await importer.load(self._tracked(receiver, importer))
        _verify_counts(importer, receiver.trailer)
        self.record.snapshot_at = stated_snapshot(receiver.trailer)  # the kept tables were proven unchanged in it
        await importer.finish()
        if statistics is not None:
            self._carried = await self._restore_statistics(conn, importer, statistics)
        return importer

    async def _restore_statistics(
        self, conn: asyncpg.Connection, importer: Importer, statistics: StatisticsCollector
    ) -> dict[TableName, tuple[str, ...]]:
        """The feeder's statistics on the staging tables of the partition swap; the tables done, with the columns
        left to ANALYZE. A table swapped by DELETE and INSERT (mvcc) is vacuumed and analyzed as before."""
        swap = self.job.swap
        tables = [
            s
            for s in importer.staged.values()
            if s.kept is None
            and s.changes_only is None  # a kept partition keeps its own
            and swap.method_for(s.parent) is SwapMethod.PARTITION
        ]
        return await carry_statistics(conn, tables, statistics, feeder_key=self.job.imports.feeder_key)

    async def _tracked(self, receiver: DumpReceiver, importer: Importer) -> AsyncIterator[Item | SectionItem]:
        async for item in receiver.items():
            self.state.raw_bytes, self.state.dump_bytes = receiver.raw_bytes, receiver.dump_bytes
            self.state.rows = sum(s.rows for s in importer.staged.values())
            self._report(self.state)
            yield item

    async def _swap(self, conn: asyncpg.Connection, importer: Importer, change: CoordinatedChange | None) -> None:
        """Replace the feeder's partitions by the staging tables, in the load's transaction, and forget the rows
        rejected from the data swapped out; `change`: the coordinator's entity step, prepared before the locks."""
        self.phase(Phase.SWAP)
        stats = SwapStats()
        try:
            await swap_in(
                conn,
                [s for s in importer.staged.values() if s.kept is None],
                feeder=self.name,
                key=self.feeder.key,
                policy=self.job.swap,
                stats=stats,
                connect=lambda: connect_superhub(self.job.superhub, f"{self.name} swap watcher"),
                before_locks=None if change is None else change.prepare,
            )
        finally:
            _note_swap(self.record, stats)
        self._partitions, self._in_place = stats.partitions, stats.in_place
        await forget_rejects(conn, self.name, except_run=self.run_id)

    async def _analyze(self, conn: asyncpg.Connection, parents: Iterable[ParentTable]) -> None:
        """Gather the new partitions' statistics, after the commit; with `analyze = "autovacuum"` leave them to
        autovacuum, which analyzes a table this fresh within autovacuum_naptime (the same CPU, later, throttled)."""
        if self.job.analyze == "autovacuum":
            return
        self.phase(Phase.ANALYZE)
        partitions, carried, in_place = self._partitions, self._carried, self._in_place
        await analyze_partitions(
            conn,
            parents,
            self.name,
            self.feeder.key,
            self.job.swap,
            partitions=partitions,
            carried=carried,
            in_place=in_place,
        )

    def _succeeded(self, importer: Importer) -> None:
        self.record.outcome = Outcome.SUCCESS
        self.record.rows, self.record.rejected = _counts(importer)

    def _note_error(self, exc: BaseException) -> None:
        """Keep the reason a run fails, and its kind, in the words the caller will see."""
        kind, failure = self._failure(exc)
        error = capped_error(failure)  # a feeder's words in it (its agent's error, names) are bounded here
        parents_cache.forget()  # whatever failed, the next run reads the parents from the catalog again
        if self._committed:  # only what came after the swap failed
            error += "; the new data had been swapped in before"
        self.record.outcome, self.record.error_kind, self.record.error = Outcome.FAILED, kind, error

    def _failure(self, exc: BaseException) -> tuple[ErrorKind, str]:
        """What kind of failure `exc` is for this run, and its one-line description."""
        if isinstance(exc, asyncio.CancelledError | TimeoutError) and self._deadline.expired():
            return ErrorKind.TIMEOUT, f"the run took longer than run_timeout_s = {self.job.run_timeout_s:g}"
        if isinstance(exc, asyncio.CancelledError):
            return ErrorKind.CANCELLED, "the run was cancelled"
        if (error := superhub_error(exc, self.job.superhub.statement_timeout_s)) is not None:
            return error.kind, one_line(str(error), limit=None)
        return ErrorKind.INTERNAL, internal_error(exc)

    def _result(self) -> FeederRun:
        record = self.record
        self.phase(record.outcome)
        seconds = time.monotonic() - self.state.started
        log.info(
            "sync.feeder_done", feeder=self.name, outcome=record.outcome, error=record.error, seconds=round(seconds, 2)
        )
        return FeederRun(
            feeder=self.name,
            outcome=record.outcome,
            error=record.error,
            rows=record.rows or {},
            raw_bytes=self.state.raw_bytes,
            dump_bytes=self.state.dump_bytes,
            seconds=seconds,
            swap_lock_ms=record.swap_lock_ms,
            plan=tuple(self.plan),
            rejected=record.rejected or {},
            swap_attempts=record.swap_attempts,
            cancelled_backends=record.cancelled_backends,
            error_kind=record.error_kind if record.outcome is Outcome.FAILED else None,
            unchanged_tables=tuple(record.unchanged_tables or ()),
            changed_rows_tables=tuple(record.changed_rows_tables or ()),
        )


def _counts(importer: Importer) -> tuple[dict[str, int], dict[str, int]]:
    """Rows loaded (or kept unchanged: the digest's count, which their partition holds), and rows rejected (where
    any were), per table (`str(TableName)`)."""
    staged = importer.staged.values()
    return {s.parent.qualified_name: loaded_rows(s) for s in staged}, {
        s.parent.qualified_name: s.rejected for s in staged if s.rejected
    }


def _note_swap(record: RunRecord, swap: SwapStats) -> RunRecord:
    """Copy how the swap went (its wait, attempts, cancelled queries, lock failure) into the run's record."""
    record.swap_lock_ms, record.swap_attempts = swap.waited_ms, swap.attempts
    record.cancelled_backends, record.swap_lock_failed = swap.cancelled, swap.lock_failed
    return record


def _agent_version(receiver: DumpReceiver) -> str | None:
    """The feeder's agent version its stream's header states; None without the agent, or before the header."""
    header: Header | None = getattr(receiver, "header", None)  # DumpReceiver.header is new: absent before it
    return None if header is None else header.agent_version


def _carry_statistics(conn: asyncpg.Connection, feeder: FeederConfig) -> bool:
    """Whether this run asks the feeder's agent for its tables' statistics (a superhub on PostgreSQL 18+; in binary
    mode too, where the agent adds pg_dump --statistics-only in its session's snapshot)."""
    major = conn.get_server_version().major
    return wants_statistics(major, carry=feeder.carry_statistics, agent=feeder.agent)


def _read_remap(feeder: FeederConfig) -> Remap | None:
    """The feeder's remap file, read on the superhub for each run; ConfigError if it is not valid."""
    if feeder.remap is None:
        return None
    try:
        return load_remap(feeder.remap)
    except RemapError as exc:
        raise ConfigError(str(exc)) from exc


def _verify_counts(importer: Importer, trailer: Trailer | None) -> None:
    """The agent's row counts must match what was loaded (or rejected), table by table, and the agent must have
    seen every table that was loaded (agents before 0.2 do not say which tables they saw)."""
    if trailer is None:
        return
    staged = {(s.parent.table.schema, s.parent.table.name): s for s in importer.staged.values()}
    seen = trailer.table_keys()
    if seen is not None and (unseen := sorted(str(staged[key].parent.table) for key in set(staged) - seen)):
        raise DumpError(f"the feeder's agent does not list table(s) {', '.join(unseen)} as dumped")
    for key, rows in trailer.row_counts().items():
        if (table := staged.get(key)) is not None and table.kept is not None:
            if table.kept.rows != rows:
                raise DumpError(f"table {table.parent.qualified_name}: the feeder's counts of it disagree")
        elif table is not None and (changes := table.changes_only) is not None:
            head = changes.head
            if head.rows != rows or head.sent != table.rows:
                name = table.parent.qualified_name
                raise DumpError(f"table {name}: the feeder's counts of its changed rows disagree")
        elif table is not None and table.rows + table.rejected != rows:
            name = table.parent.qualified_name
            raise DumpError(f"table {name}: the feeder sent {rows} rows but {table.rows} were loaded")
