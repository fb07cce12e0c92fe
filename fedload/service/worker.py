"""A worker process: runs feeder syncs that its parent (`fedload sync` or the daemon, fedload.service.workers) sends
it, one at a time, on its own core. Started as `python -m fedload.service.worker FD LEVEL FORMAT [MODULE ...]` with FD
one end of a Unix socket pair and MODULEs to import before it says it is ready (those its runs would import lazily, so a
worker started ahead does not pay for them in its first run). The messages are fedload.service._pipe's: from the
parent `Run` (answered by `Done`), `HistoryWritten` or `HistoryFailed` (the answer to a run-history request),
`Cancel` and `Forget` (a feeder's kept SSH connection); to the parent `Ready` once imported, `Progressed` (at most
every 0.2 s, and at each phase), `StartRun` and `FinishRun` (run-history requests), and at the end of each run `Done`,
`Cancelled` or `Crashed`.
The run history stays in the parent's one bookkeeping connection. When the parent goes away, the worker cancels
its run and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import itertools
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import NoReturn

from fedload.errors import FedloadError, SuperhubError, internal_error
from fedload.log import configure_logging, get_logger
from fedload.results import Progress
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
    for_worker,
    frame,
)
from fedload.startup import dump_buffers_reused
from fedload.stream import build_validators
from fedload.superhub.bookkeeping import RunRecord
from fedload.superhub.kept_sessions import close_kept, keep_sessions
from fedload.superhub.pipeline import sync_feeder
from fedload.superhub.session import SuperhubTarget
from fedload.transport.kept_ssh import SshKeeper, close_kept_ssh, forget_kept_ssh, keep_ssh
from fedload.transport.warm import ZYGOTE_MODULE, close_warm_agents, use_warm_agents

log = get_logger()

PROCESS_NAME = b"fedload-worker"  # a forked worker's name (/proc/PID/comm)
HISTORY_TIMEOUT_S = 120.0  # the parent's bookkeeping write is bounded by about a minute and a half itself
_PROGRESS_EVERY_S = 0.2


class _ParentHistory:
    """The RunHistory of a worker: each record is written by the parent, on its shared connection."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._ids = itertools.count()
        self.waiting: dict[int, asyncio.Future[int | None]] = {}

    async def start_run(self, superhub: SuperhubTarget, feeder: str) -> int:
        del superhub  # the parent's run knows its job's
        run_id = await self._ask(StartRun(next(self._ids), feeder))
        assert run_id is not None
        return run_id

    async def finish_run(self, superhub: SuperhubTarget, run_id: int, record: RunRecord) -> None:
        del superhub
        await self._ask(FinishRun(next(self._ids), run_id, record))

    def answer(self, answer: HistoryWritten | HistoryFailed) -> None:
        """The parent's answer to a request."""
        future = self.waiting.pop(answer.request_id, None)
        if future is None or future.done():
            return
        if isinstance(answer, HistoryWritten):
            future.set_result(answer.result)
        else:
            future.set_exception(_history_error(answer))

    async def _ask(self, request: StartRun | FinishRun) -> int | None:
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self.waiting[request.request_id] = future
        self._writer.write(frame(request))
        try:
            async with asyncio.timeout(HISTORY_TIMEOUT_S):
                return await future
        except TimeoutError:
            raise SuperhubError(f"the run history was not written within {HISTORY_TIMEOUT_S:g} s") from None
        finally:
            self.waiting.pop(request.request_id, None)


def _history_error(failed: HistoryFailed) -> FedloadError:
    """The parent's failure to write the run history, as the error the run fails with, of the kind it was."""
    error = SuperhubError(failed.error)
    error.kind = failed.kind
    return error


class _Progress:
    """Progress to the parent: phase changes at once, byte and row counts at most every 0.2 s."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._phase = ""
        self._sent = 0.0

    def __call__(self, state: Progress) -> None:
        now = time.monotonic()
        if state.phase != self._phase or now - self._sent >= _PROGRESS_EVERY_S:
            self._phase, self._sent = state.phase, now
            self._writer.write(frame(Progressed(state)))


async def serve(fd: int, preload: tuple[str, ...] = ()) -> None:
    """Run what the parent sends until it closes its end; a run's superhub connection is kept for the next, so
    is a feeder's SSH connection for its next run (fedload.transport.kept_ssh), and local agents are forked from a
    warm process (fedload.transport.warm)."""
    keep_sessions()
    keep_ssh(SshKeeper())
    use_warm_agents(start_now=ZYGOTE_MODULE in preload)
    try:
        await _serve(fd)
    finally:
        await asyncio.shield(close_kept())
        await asyncio.shield(close_kept_ssh())
        await asyncio.shield(close_warm_agents())


async def _serve(fd: int) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    history = _ParentHistory(writer)
    run: asyncio.Task[None] | None = None
    writer.write(frame(Ready()))
    try:
        while True:
            match await for_worker(reader):
                case Run() as request:
                    run = _start_run(run, writer, history, request)
                case HistoryWritten() | HistoryFailed() as answer:
                    history.answer(answer)
                case Cancel() if run is not None:
                    run.cancel()
                case Forget(feeder, reason):
                    forget_kept_ssh(feeder, reason)
    except (asyncio.IncompleteReadError, ConnectionError):  # the parent has gone: nobody wants the run any more
        pass
    except Exception as exc:  # a message this worker cannot read: it can no longer follow its parent
        log.error("worker.unreadable_message", error=internal_error(exc), exc_info=exc)
    finally:
        if run is not None and not run.done():
            run.cancel()
            await asyncio.wait({run}, timeout=30)


def _start_run(
    run: asyncio.Task[None] | None, writer: asyncio.StreamWriter, history: _ParentHistory, request: Run
) -> asyncio.Task[None] | None:
    """The task of the run the parent asks for; refused (as crashed) while another run is under way."""
    if run is not None and not run.done():
        log.error("worker.busy", feeder=request.job.name)
        writer.write(frame(Crashed("the worker process is still running another feeder's run")))
        return run
    run = asyncio.create_task(_run(writer, history, request))
    run.add_done_callback(functools.partial(_answer_cancelled, writer))
    return run


def _answer_cancelled(writer: asyncio.StreamWriter, run: asyncio.Task[None]) -> None:
    """Tell the parent a run ended cancelled: here, not in the run, which a cancel read together with its "run"
    cancels before its first step, where no `except` of its own would run."""
    if run.cancelled():
        writer.write(frame(Cancelled()))


async def _run(writer: asyncio.StreamWriter, history: _ParentHistory, request: Run) -> None:
    """Run one feeder and tell the parent how it ended, whatever happened: `Done` or `Crashed` (and, through
    `_answer_cancelled`, `Cancelled`)."""
    job, progress = request.job, _Progress(writer)
    try:
        result = await sync_feeder(job, progress=progress, dry_run=request.dry_run, history=history)
        message = frame(Done(result))
    except Exception as exc:  # sync_feeder reports failures: this is a bug, and the parent must know
        log.error("worker.run_crashed", feeder=job.name, exc_info=exc)
        message = frame(Crashed(internal_error(exc)))
    writer.write(message)
    with contextlib.suppress(ConnectionError):  # the parent has gone: nobody is left to tell
        await writer.drain()


def _leave_interrupts_to_the_parent() -> None:
    """Ctrl-C on a terminal signals the whole process group: the parent cancels the run, which the worker must
    then still be serving (its record goes through the parent), not die under or cancel by itself. A handler that
    does nothing, not SIG_IGN: the commands a run starts (a local agent, pg_dump) get the default back at exec."""
    signal.signal(signal.SIGINT, lambda _signum, _frame: None)


def warm_up() -> None:
    """Do now what each worker's first run would do for itself: import what asyncio's connections use (the
    default executor's threads for getaddrinfo, the IDNA codec for host names) and build the stream's validators.
    `fork_workers` calls it before it forks, so that its workers share the result."""
    importlib.import_module("concurrent.futures.thread")
    importlib.import_module("encodings.idna")
    build_validators()


def main(argv: list[str]) -> int:
    """`python -m fedload.service.worker FD LEVEL FORMAT [MODULE ...]`."""
    _leave_interrupts_to_the_parent()
    fd, level, log_format, preload = int(argv[0]), argv[1], argv[2], argv[3:]
    dump_buffers_reused()  # a forked worker has its parent's setting (fedload.startup)
    configure_logging(level=level, log_format=log_format)
    for module in preload:
        importlib.import_module(module)
    warm_up()
    asyncio.run(serve(fd, tuple(preload)))
    return 0


def run_forked(fd: int, sigmask: set[int | signal.Signals], preload: tuple[str, ...] = ()) -> NoReturn:
    """The life of a worker that its parent forked (fedload.service.workers.fork_workers) with this module imported and
    logging configured, and SIGINT blocked: serve on `fd`, then exit without returning into the parent's code."""
    status = 1
    try:
        _leave_interrupts_to_the_parent()
        signal.pthread_sigmask(signal.SIG_SETMASK, sigmask)
        with contextlib.suppress(OSError):  # `top` and `ps -e` show it as a worker; its command line is the parent's
            Path("/proc/self/comm").write_bytes(PROCESS_NAME)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # as a started worker's: the parent's terminal is not ours to read
        os.close(devnull)
        asyncio.run(serve(fd, preload))
        status = 0
    except BaseException:  # noqa: BLE001 - reported, and the process ends here whatever happened
        traceback.print_exc()
    finally:
        _exit_now(status)


def _exit_now(status: int) -> NoReturn:
    """Exit without the interpreter's teardown (~50 ms of freeing modules that the parent waits for): a worker
    holds nothing to flush but its standard streams once `serve` has returned."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    _exit_now(main(sys.argv[1:]))
