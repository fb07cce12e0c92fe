"""Worker processes for feeder runs, so that a superhub's cores decode and check several feeders at once.

    pool = WorkerPool(config.superhub.workers)
    run = await pool.run(feeder_job(config, "hub1"), progress=..., history=bookkeeping)
    await pool.close()

A worker (`python -m fedload.service.worker`, fedload/service/worker.py) is started once, when a run first needs it
or ahead of the first runs (`start_ahead`), and then runs one feeder at a time for the life of the pool, so a run
pays no interpreter start or import (`preload`, `worker_modules`: the modules runs import lazily, such as the
SSH transport's asyncssh and the carried statistics' pglast).
`fedload sync` forks its first workers instead (`fork_workers`, before its event loop starts), from a process that
has imported what they need: a fork costs milliseconds where an interpreter start and its imports cost ~0.3 s of
CPU per worker, on the cores the load needs.
A run's message carries its job (fedload.superhub.job.Job: the feeder, its superhub, the load's settings), all the
worker reads of the configuration, so it costs the same with ten feeders as with ten thousand.
The parent keeps the one view of the runs: the run history is written through its bookkeeping connection at the
worker's request, progress comes back to its display. A worker that dies fails only the run it had (its superhub
session ends, so the run's transaction rolls back: old data kept, no staging left), the run's record is finished
by the parent, and the next run starts a new worker. Cancelling `run()` cancels the worker's run and waits for it
to end (at most `CANCEL_WAIT_S`), then kills the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from fedload.errors import ErrorKind, FedloadError, WorkerError, internal_error
from fedload.log import configured, get_logger, import_if_logging
from fedload.pidfds import pidfds_work
from fedload.results import FeederRun, Outcome, ProgressCallback
from fedload.service._pipe import (
    Cancel,
    Cancelled,
    Crashed,
    Done,
    FinishRun,
    Forget,
    HistoryFailed,
    HistoryWritten,
    Progressed,
    Ready,
    Run,
    StartRun,
    ToParent,
    ToWorker,
    for_parent,
    frame,
)
from fedload.startup import collector_paused, freeze_imported
from fedload.superhub.bookkeeping import RunRecord
from fedload.superhub.bookkeeping.connection import RunHistory
from fedload.superhub.job import Job
from fedload.superhub.session import best_effort
from fedload.superhub.statistics import statistics_modules
from fedload.transport.command import transport_modules
from fedload.transport.kept_ssh import MAX_IDLE

if TYPE_CHECKING:
    from fedload.config import FeederConfig

__all__ = ["ForkedWorker", "WorkerPool", "fork_workers", "reap_forked", "worker_modules", "worker_pool"]

log = get_logger()

START_TIMEOUT_S = 60.0  # imports on a loaded machine; a healthy start takes about half a second
CANCEL_WAIT_S = 30.0
# A worker ends its run by run_timeout_s itself, then rolls back and has its record written through the parent
# (worker.HISTORY_TIMEOUT_S): one with no result this long after that has stopped answering and is killed.
SILENT_MARGIN_S = 180.0


@dataclass(frozen=True, slots=True)
class _Exited:
    """The last item of a worker's inbox: its socket ended, or a message could not be read."""


_EXITED = _Exited()


class _Process(Protocol):
    """What a worker needs of its process: asyncio's Process, or a `_ForkedProcess`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


class _ForkedProcess:
    """A worker process forked by `fork_workers`, as asyncio's Process would show it: waited for through its pidfd
    (so the event loop learns of its exit without a child watcher), signalled through it (never another process
    that took its pid)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)
        self._exited: asyncio.Future[None] | None = None

    async def wait(self) -> int:
        if self.returncode is None:
            if self._exited is None:
                loop = asyncio.get_running_loop()
                self._exited = loop.create_future()
                loop.add_reader(self._pidfd, self._reap, loop)
            await asyncio.shield(self._exited)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def reap_now(self, timeout_s: float = 5.0) -> None:
        """Without an event loop: wait up to `timeout_s` for the process to exit, then kill it; reap it."""
        if self.returncode is not None:
            return
        exited, _, _ = select.select([self._pidfd], [], [], timeout_s)  # a pidfd reads ready once it has exited
        if not exited:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        self._collect()

    def _reap(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self._pidfd)
        self._collect()
        assert self._exited is not None
        self._exited.set_result(None)

    def _collect(self) -> None:
        """Reap the exited process (255 if something else reaped it, as asyncio says) and close the pidfd."""
        try:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            self.returncode = 255
        os.close(self._pidfd)


def worker_modules(feeders: Iterable[FeederConfig]) -> tuple[str, ...]:
    """What the runs of `feeders` would import lazily in a worker (their transports, the statistics' parser): a
    worker's `preload`, imported once before `fork_workers` forks, or by a started worker before it says it is
    ready."""
    feeders = list(feeders)
    return (*transport_modules(feeders), *statistics_modules(feeders))


ForkedWorker = tuple[_ForkedProcess, socket.socket]  # a forked worker and the parent's end of its socket pair


def fork_workers(count: int, preload: tuple[str, ...] = ()) -> list[ForkedWorker]:
    """Fork `count` worker processes now, from this process with the worker's modules and `preload` imported.

    Call it before any event loop or other thread exists (a fork copies only the calling thread, and a lock that
    another thread held stays locked in the child): where another thread runs, or the kernel has no pidfds, it
    forks nothing, and where a fork fails it stops there; the pool starts the workers it lacks as separate
    interpreters. Hand the result to `WorkerPool`, and to `reap_forked` once the pool is closed."""
    if count < 1 or not pidfds_work():
        return []
    with collector_paused():
        from fedload.service import worker  # noqa: PLC0415 - the workers' modules, imported once for all of them

        for module in preload:
            importlib.import_module(module)
        worker.warm_up()
        import_if_logging()
    if threading.active_count() > 1:
        return []
    freeze_imported()  # the workers share these objects' pages and never walk them (fedload.startup)
    sys.stdout.flush()  # what a child inherits unflushed it would print again
    sys.stderr.flush()
    pairs = [socket.socketpair() for _ in range(count)]
    forked: list[ForkedWorker] = []
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # no Ctrl-C between fork and handler
    try:
        for i, (ours, _) in enumerate(pairs):
            forked.append((_fork(i, pairs, functools.partial(worker.run_forked, preload=preload), mask), ours))
    except OSError as exc:  # EAGAIN, EMFILE...: the pool starts the rest
        log.warning("worker.fork_failed", error=str(exc), forked=len(forked))
        for _, ours in pairs[len(forked) :]:
            ours.close()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for _, theirs in pairs:
            theirs.close()
    log.debug("worker.forked", pids=[process.pid for process, _ in forked])
    return forked


def _fork(
    i: int,
    pairs: list[tuple[socket.socket, socket.socket]],
    run: Callable[[int, set[int | signal.Signals]], NoReturn],
    mask: set[int | signal.Signals],
) -> _ForkedProcess:
    """Fork worker `i` of `pairs`: the child keeps only its own end of its own pair and never returns."""
    pid = os.fork()
    if pid == 0:
        try:
            for other, (parent_end, child_end) in enumerate(pairs):
                parent_end.close()
                if other != i:
                    child_end.close()
            run(pairs[i][1].detach(), mask)
        finally:
            os._exit(1)  # whatever happened, never back into the parent's code
    try:
        return _ForkedProcess(pid)
    except OSError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise


def reap_forked(forked: list[ForkedWorker]) -> None:
    """After the pool has closed (or never started): stop and wait for every forked worker it did not take, so
    that none outlives the command. Such a worker exits when its socket closes; it is killed after 5 s."""
    for process, ours in forked:
        ours.close()
        process.reap_now()


class _Worker:
    """One worker process and its end of the socket pair; messages arrive in `inbox` in order."""

    def __init__(self, process: _Process, reader: asyncio.StreamReader, writer: Any) -> None:
        self.process, self._reader, self._writer = process, reader, writer
        self.inbox: asyncio.Queue[ToParent | _Exited] = asyncio.Queue()
        self.recent: list[str] = []  # the feeders it ran last, most recent last: those it may keep connections of
        self._reading = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, preload: tuple[str, ...] = ()) -> _Worker:
        """A new worker process: `python -m fedload.service.worker`."""
        ours, theirs = socket.socketpair()
        level, log_format = configured()
        with theirs:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "fedload.service.worker",
                str(theirs.fileno()),
                level,
                log_format,
                *preload,
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                process_group=0,  # Ctrl-C on a terminal is the parent's to handle: it cancels the runs (a SIGINT
                # to the whole group would reach a worker still importing, before its handler, as a traceback)
            )
        return await cls._connect(process, ours)

    @classmethod
    async def adopt(cls, forked: ForkedWorker) -> _Worker:
        """A worker that `fork_workers` forked."""
        return await cls._connect(*forked)

    @classmethod
    async def _connect(cls, process: _Process, ours: socket.socket) -> _Worker:
        """The worker on the other end of `ours`, once it says it is ready."""
        try:
            reader, writer = await asyncio.open_unix_connection(sock=ours)
        except BaseException:
            ours.close()
            await asyncio.shield(_reap(process))
            raise
        worker = cls(process, reader, writer)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                ready = await worker.inbox.get()
        except TimeoutError:
            await worker.kill()
            raise WorkerError(f"a worker process did not start within {START_TIMEOUT_S:g} s") from None
        except BaseException:  # cancelled while it starts: no process outlives its pool
            await asyncio.shield(worker.kill())
            raise
        if not isinstance(ready, Ready):
            raise WorkerError(f"a worker process failed to start ({await worker.exit_status()})")
        log.debug("worker.started", pid=process.pid)
        return worker

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self._reading.done()

    def send(self, message: ToWorker) -> None:
        self._writer.write(frame(message))

    def ran(self, feeder: str) -> None:
        """Note a run of `feeder` (its SSH connection may be kept here: fedload.transport.kept_ssh)."""
        with contextlib.suppress(ValueError):
            self.recent.remove(feeder)
        self.recent = [*self.recent, feeder][-MAX_IDLE:]

    async def exit_status(self) -> str:
        """How the process ended, in words (it is killed if it has not ended within 5 s)."""
        try:
            async with asyncio.timeout(5):
                code = await self.process.wait()
        except TimeoutError:
            await self.kill()
            return "stopped answering and was killed"
        if code < 0:
            return f"was killed by signal {signal.Signals(-code).name}"
        return f"exited with status {code}"

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self.process.wait()
        self._writer.close()

    async def close(self) -> None:
        """Close our end: the worker exits; killed if it has not within 5 s."""
        self._writer.close()
        try:
            async with asyncio.timeout(5):
                with contextlib.suppress(ConnectionError):
                    await self._writer.wait_closed()
                await self.process.wait()
        except TimeoutError:  # something holds its socket open, or it hangs
            log.warning("worker.close_timeout", pid=self.process.pid, waited_s=5)
            await self.kill()
        self._reading.cancel()

    async def _read(self) -> None:
        """Messages into the inbox until the socket ends or a message cannot be read (a garbled frame, a class
        this process lacks: a worker of another fedload version); then `_EXITED`, whatever ended it."""
        try:
            while True:
                await self.inbox.put(await for_parent(self._reader))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception as exc:  # the worker is of no more use: its run fails as if it had exited
            log.error("worker.unreadable", pid=self.process.pid, error=internal_error(exc), exc_info=exc)
        finally:
            self.inbox.put_nowait(_EXITED)


class WorkerPool:
    """At most `size` worker processes, each running one feeder at a time; `forked` (from `fork_workers`) are its
    first workers, the others are started as separate interpreters when needed."""

    def __init__(self, size: int, *, preload: tuple[str, ...] = (), forked: list[ForkedWorker] | None = None) -> None:
        self._size, self._preload = size, preload
        self._forked = list(forked or [])  # taken first; the caller reaps them all (`reap_forked`) after `close()`
        self._idle: list[_Worker] = []
        self._starting: list[asyncio.Task[_Worker]] = []
        self._slots = asyncio.Semaphore(size)
        self._all: set[_Worker] = set()

    @property
    def processes(self) -> int:
        """Worker processes alive now, idle or running a feeder."""
        return sum(1 for worker in self._all if worker.alive)

    def start_ahead(self, count: int) -> None:
        """Start up to `count` workers now, in the background, so that the first runs do not wait for them."""
        for _ in range(min(count, self._size) - len(self._starting) - len(self._all)):
            self._starting.append(asyncio.create_task(self._new_worker()))

    async def _new_worker(self) -> _Worker:
        """A forked worker while there is one, else a newly started one. The forked one leaves `_forked` only when
        this runs: a task cancelled before it starts leaves it there for `close()`."""
        return await (_Worker.adopt(self._forked.pop(0)) if self._forked else _Worker.start(self._preload))

    async def run(
        self, job: Job, *, history: RunHistory, progress: ProgressCallback | None = None, dry_run: bool = False
    ) -> FeederRun:
        """Run `sync_feeder` for `job` in a worker; a dead worker fails this run only."""
        feeder, started = job.name, time.monotonic()
        async with self._slots:
            try:
                worker = await self._take(feeder)
            except WorkerError as exc:
                return _failed(feeder, str(exc), started)
            except Exception as exc:  # a worker that cannot start fails this run, whatever the cause
                log.error("worker.start_failed", feeder=feeder, exc_info=exc)
                return _failed(feeder, f"no worker process could be started: {internal_error(exc)}", started)
            try:
                run = _WorkerRun(worker, job, history=history, progress=progress or (lambda _: None), started=started)
                return await run.result(dry_run)
            finally:
                worker.ran(feeder)
                if worker.alive:
                    self._idle.append(worker)
                else:
                    self._all.discard(worker)
                    await asyncio.shield(worker.close())

    def forget(self, feeder: str, reason: str) -> None:
        """Have every worker close the feeder's kept SSH connection and keep none of a run of it under way
        (paused, removed from the configuration, its SSH settings changed)."""
        for worker in self._all:  # a busy one too: the run under way then keeps nothing
            if worker.alive:
                with contextlib.suppress(ValueError):
                    worker.recent.remove(feeder)
                worker.send(Forget(feeder, reason))

    async def _take(self, feeder: str) -> _Worker:
        """An idle worker if one is alive (the one that ran `feeder` last if idle: its SSH connection is kept
        there), else one started ahead, else a new one; WorkerError if it cannot start."""
        while self._idle:
            if (worker := self._idle.pop(_affine(self._idle, feeder))).alive:
                return worker
            self._all.discard(worker)
            await asyncio.shield(worker.close())
        worker = await (self._starting.pop() if self._starting else self._new_worker())
        self._all.add(worker)
        return worker

    async def close(self) -> None:
        """Stop every worker, those still starting too."""
        self._forked = []  # those never taken are reap_forked's, like every forked worker once the pool is closed
        starting, self._starting = self._starting, []
        for task in starting:
            task.cancel()  # a worker cancelled while it starts kills its process
        started = await asyncio.gather(*starting, return_exceptions=True)
        workers, self._all, self._idle = self._all, set(), []
        workers.update(w for w in started if isinstance(w, _Worker))
        for result in await asyncio.gather(*(w.close() for w in workers), return_exceptions=True):
            if isinstance(result, Exception):
                log.error("worker.close_failed", error=internal_error(result), exc_info=result)


def _affine(idle: list[_Worker], feeder: str) -> int:
    """The index in `idle` of the worker to run `feeder`: the one that ran it most recently, else the worker idle
    the shortest (the last)."""
    ran = [(w.recent[::-1].index(feeder), i) for i, w in enumerate(idle) if feeder in w.recent]
    return min(ran)[1] if ran else -1


def worker_pool(
    workers: int, preload: tuple[str, ...] = (), forked: list[ForkedWorker] | None = None
) -> WorkerPool | None:
    """The pool of `workers` worker processes (`superhub.workers`); None for none."""
    return WorkerPool(workers, preload=preload, forked=forked) if workers else None


class _WorkerRun:
    """One feeder's run in a worker, seen from the parent: it answers the worker's history requests and relays
    its progress until the run's result arrives."""

    def __init__(
        self, worker: _Worker, job: Job, *, history: RunHistory, progress: ProgressCallback, started: float
    ) -> None:
        self.worker, self.job, self.feeder = worker, job, job.name
        self._history, self._progress, self._started = history, progress, started
        self._run_id: int | None = None
        self._finished = False

    async def result(self, dry_run: bool) -> FeederRun:
        """The run's result: the worker's, or a failed one if the worker died, crashed or went silent."""
        self.worker.send(Run(self.job, dry_run))
        bound_s = self.job.run_timeout_s + SILENT_MARGIN_S
        try:
            async with asyncio.timeout(bound_s):
                return await self._serve()
        except TimeoutError:
            return await self._silent(bound_s)
        except asyncio.CancelledError:
            await asyncio.shield(self._cancel())
            raise
        except BaseException:  # a bug here (a progress display that raised): the worker's run must not go on
            await asyncio.shield(self.worker.kill())  # unseen, to hand its result to the pool's next run
            raise

    async def _serve(self) -> FeederRun:
        while True:
            match await self.worker.inbox.get():
                case Done(result):
                    return result
                case Progressed(progress):
                    self._progress(progress)
                case StartRun() | FinishRun() as request:
                    await self._answer(request)
                case Crashed(error):
                    return await self._failed_in_worker(error)
                case Cancelled():
                    return await self._failed_in_worker("the worker process cancelled the run by itself")
                case _Exited():
                    return await self._died()

    async def _answer(self, request: StartRun | FinishRun) -> None:
        """Write the worker's run record through the parent's history; the answer (or its failure) back."""
        try:
            if isinstance(request, StartRun):
                self._run_id = await self._history.start_run(self.job.superhub, request.feeder)
                self.worker.send(HistoryWritten(request.request_id, self._run_id))
                return
            await self._history.finish_run(self.job.superhub, request.run_id, request.record)
            self._finished = True
            self.worker.send(HistoryWritten(request.request_id, None))
        except FedloadError as exc:  # the worker's pipeline decides, as with its own history
            self.worker.send(HistoryFailed(request.request_id, str(exc) or type(exc).__name__, exc.kind))
        except Exception as exc:  # a bug here: logged once, and the worker's run fails with it as an internal error
            log.error("worker.history_failed", feeder=self.feeder, exc_info=exc)
            self.worker.send(HistoryFailed(request.request_id, internal_error(exc), ErrorKind.INTERNAL))

    async def _died(self) -> FeederRun:
        """The worker ended mid-run: the run failed; its record (if it was started) says why."""
        error = f"the worker process (pid {self.worker.process.pid}) for feeder {self.feeder} "
        error += await self.worker.exit_status()
        log.error("worker.died", feeder=self.feeder, pid=self.worker.process.pid, error=error)
        return await self._fail(error)

    async def _silent(self, waited_s: float) -> FeederRun:
        """The worker sent no result within the bound: it hangs or is stopped. It is killed, the run failed."""
        pid = self.worker.process.pid
        error = f"the worker process (pid {pid}) for feeder {self.feeder} went silent: no result after "
        error += f"{waited_s:g} s (run_timeout_s + {SILENT_MARGIN_S:g}); it was killed"
        log.error("worker.silent", feeder=self.feeder, pid=pid, waited_s=waited_s)
        await self.worker.kill()
        return await self._fail(error)

    async def _failed_in_worker(self, error: str) -> FeederRun:
        """The worker's run ended without a result (logged there): the run failed; the worker goes on serving."""
        return await self._fail(f"feeder {self.feeder}: {error}")

    async def _fail(self, error: str) -> FeederRun:
        """The run failed for `error`, outside its pipeline: its record, if started and not finished, says so."""
        if self._run_id is not None and not self._finished:
            record = RunRecord(outcome=Outcome.FAILED, error=error, error_kind=ErrorKind.INTERNAL)
            await best_effort(self._history.finish_run(self.job.superhub, self._run_id, record))
        return _failed(self.feeder, error, self._started)

    async def _cancel(self) -> None:
        """Cancel the worker's run and wait for its end (its record written), at most CANCEL_WAIT_S; then kill."""
        if not self.worker.alive:
            return
        self.worker.send(Cancel())
        try:
            async with asyncio.timeout(CANCEL_WAIT_S):
                while not isinstance(message := await self.worker.inbox.get(), Done | Cancelled | Crashed | _Exited):
                    if isinstance(message, StartRun | FinishRun):
                        await self._answer(message)
        except TimeoutError:
            log.warning("worker.killed", feeder=self.feeder, pid=self.worker.process.pid, waited_s=CANCEL_WAIT_S)
            await self.worker.kill()


def _failed(feeder: str, error: str, started: float) -> FeederRun:
    """A run that failed around its pipeline (a worker that could not start, died, crashed or hung)."""
    return FeederRun.failed(feeder, error, kind=ErrorKind.INTERNAL, seconds=time.monotonic() - started)


async def _reap(process: _Process) -> None:
    """Kill a worker process that never became a worker, and wait for it (at most 5 s)."""
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await process.wait()
