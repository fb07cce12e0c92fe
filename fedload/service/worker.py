"""A worker process: runs feeder syncs that its parent (`fedload sync` or the daemon, fedload.service.workers) sends
it, one at a time, on its own core. Started as `python -m fedload.service.worker FD LEVEL FORMAT [MODULE ...]` with FD
one end of a Unix socket pair and MODULEs to import before it says it is ready (those its runs would import lazily, so a
worker started ahead does not pay for them in its first run); the messages (fedload.service._pipe) are, from the parent:

- `("run", feeder, config, dry_run)`: sync one feeder; answered by `("done", FeederRun)`; `config` None: the
  configuration of the worker's last run (the parent sends a configuration once, not at every run);
- `("history", request_id, result)` or `("history_error", request_id, message, kind)`: the parent's answer to a
  run-history request (`kind`: the ErrorKind of its failure);
- `("cancel",)`: cancel the run under way (its transaction rolls back, its record says so);

and, to the parent: `("ready",)` once imported, `("progress", Progress)` (at most every 0.2 s, and at each phase),
`("history", request_id, "start", feeder)` / `("history", request_id, "finish", run_id, record)`, and at the
end of each run `("done", FeederRun)`, `("cancelled",)` or `("crashed", error)`.
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
from typing import Any, NoReturn

from fedload.config import Config
from fedload.errors import ErrorKind, FedloadError, SuperhubError, internal_error
from fedload.log import configure_logging, get_logger
from fedload.results import Progress
from fedload.service._pipe import frame, receive
from fedload.superhub.bookkeeping import RunRecord
from fedload.superhub.kept_sessions import close_kept, keep_sessions
from fedload.superhub.pipeline import sync_feeder

log = get_logger()

PROCESS_NAME = b"fedload-worker"  # a forked worker's name (/proc/PID/comm)
HISTORY_TIMEOUT_S = 120.0  # the parent's bookkeeping write is bounded by about a minute and a half itself
_PROGRESS_EVERY_S = 0.2


class _ParentHistory:
    """The RunHistory of a worker: each record is written by the parent, on its shared connection."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._ids = itertools.count()
        self.waiting: dict[int, asyncio.Future[Any]] = {}

    async def start_run(self, config: Config, feeder: str) -> int:
        del config  # the parent's own configuration says where the history is
        run_id: int = await self._ask("start", feeder)
        return run_id

    async def finish_run(self, config: Config, run_id: int, record: RunRecord) -> None:
        del config
        await self._ask("finish", run_id, record)

    def answer(self, request_id: int, result: Any = None, error: FedloadError | None = None) -> None:
        """The parent's answer to a request."""
        future = self.waiting.pop(request_id, None)
        if future is None or future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    async def _ask(self, *request: Any) -> Any:
        request_id = next(self._ids)
        future = self.waiting[request_id] = asyncio.get_running_loop().create_future()
        self._writer.write(frame(("history", request_id, *request)))
        try:
            async with asyncio.timeout(HISTORY_TIMEOUT_S):
                return await future
        except TimeoutError:
            raise SuperhubError(f"the run history was not written within {HISTORY_TIMEOUT_S:g} s") from None
        finally:
            self.waiting.pop(request_id, None)


def _history_error(message: str, kind: str = ErrorKind.SUPERHUB) -> FedloadError:
    """The parent's failure to write the run history, as the error the run fails with, of the kind it was."""
    error = SuperhubError(message)
    error.kind = ErrorKind(kind)
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
            self._writer.write(frame(("progress", state)))


async def serve(fd: int) -> None:
    """Run what the parent sends until it closes its end; a run's superhub connection is kept for the next."""
    keep_sessions()
    try:
        await _serve(fd)
    finally:
        await asyncio.shield(close_kept())


async def _serve(fd: int) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    history = _ParentHistory(writer)
    run: asyncio.Task[None] | None = None
    config: Config | None = None  # the last configuration the parent sent
    writer.write(frame(("ready",)))
    try:
        while True:
            message = await receive(reader)
            kind = message[0]
            if kind == "run":
                feeder, sent, dry_run = message[1:]
                config = sent or config
                run = _start_run(run, writer, history, feeder, config, dry_run)
            elif kind == "history":
                history.answer(message[1], result=message[2])
            elif kind == "history_error":
                history.answer(message[1], error=_history_error(*message[2:]))
            elif kind == "cancel" and run is not None:
                run.cancel()
    except (asyncio.IncompleteReadError, ConnectionError):  # the parent has gone: nobody wants the run any more
        pass
    except Exception as exc:  # a message this worker cannot read: it can no longer follow its parent
        log.error("worker.unreadable_message", error=internal_error(exc), exc_info=exc)
    finally:
        if run is not None and not run.done():
            run.cancel()
            await asyncio.wait({run}, timeout=30)


def _start_run(
    run: asyncio.Task[None] | None, writer: asyncio.StreamWriter, history: _ParentHistory, *request: Any
) -> asyncio.Task[None] | None:
    """The task of the run the parent asks for; refused (as crashed) while another run is under way."""
    if run is not None and not run.done():
        log.error("worker.busy", feeder=request[0])
        writer.write(frame(("crashed", "the worker process is still running another feeder's run")))
        return run
    if request[1] is None:  # a bug of the parent's: it never sent a configuration
        writer.write(frame(("crashed", "the worker process was asked for a run without a configuration")))
        return run
    run = asyncio.create_task(_run(writer, history, *request))
    run.add_done_callback(functools.partial(_answer_cancelled, writer))
    return run


def _answer_cancelled(writer: asyncio.StreamWriter, run: asyncio.Task[None]) -> None:
    """Tell the parent a run ended cancelled: here, not in the run, which a cancel read together with its "run"
    cancels before its first step, where no `except` of its own would run."""
    if run.cancelled():
        writer.write(frame(("cancelled",)))


async def _run(writer: asyncio.StreamWriter, history: _ParentHistory, feeder: str, config: Config, dry: bool) -> None:
    """Run one feeder and tell the parent how it ended, whatever happened: `done` or `crashed` (and, through
    `_answer_cancelled`, `cancelled`)."""
    try:
        result = await sync_feeder(feeder, config, progress=_Progress(writer), dry_run=dry, history=history)
        message = frame(("done", result))
    except Exception as exc:  # sync_feeder reports failures: this is a bug, and the parent must know
        log.error("worker.run_crashed", feeder=feeder, exc_info=exc)
        message = frame(("crashed", internal_error(exc)))
    writer.write(message)
    with contextlib.suppress(ConnectionError):  # the parent has gone: nobody is left to tell
        await writer.drain()


def _leave_interrupts_to_the_parent() -> None:
    """Ctrl-C on a terminal signals the whole process group: the parent cancels the run, which the worker must
    then still be serving (its record goes through the parent), not die under or cancel by itself. A handler that
    does nothing, not SIG_IGN: the commands a run starts (a local agent, pg_dump) get the default back at exec."""
    signal.signal(signal.SIGINT, lambda _signum, _frame: None)


def main(argv: list[str]) -> int:
    """`python -m fedload.service.worker FD LEVEL FORMAT [MODULE ...]`."""
    _leave_interrupts_to_the_parent()
    fd, level, log_format, preload = int(argv[0]), argv[1], argv[2], argv[3:]
    configure_logging(level=level, log_format=log_format)
    for module in preload:
        importlib.import_module(module)
    asyncio.run(serve(fd))
    return 0


def run_forked(fd: int, sigmask: set[int | signal.Signals]) -> NoReturn:
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
        asyncio.run(serve(fd))
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
