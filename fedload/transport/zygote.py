"""The warm agent process: started once by a worker, it imports the agent and then forks one child per local dump.

A local feeder's agent started as a new interpreter (`python -m fedload agent dump ...`) spends ~90 ms of CPU on
Python's start and the agent's imports before pg_dump even runs, on the superhub's own host and on every run; a
fork of a process that has already imported the agent costs ~2 ms. `fedload.transport.warm` starts this process and
talks to it over a SOCK_SEQPACKET socket pair, one JSON message per datagram:

    to the zygote:   {"id": N, "words": ["agent", "dump", ...], "env": {...} or null}, with the child's stdout and
                     stderr (the write ends of two pipes) attached as SCM_RIGHTS
    from the zygote: {"id": N, "pid": P} once the child is forked, or {"id": N, "error": "..."} if it could not be;
                     {"id": N, "status": S} once the child has exited (S as asyncio's returncode: -signal if killed)

The child is what an exec'd agent would be: its own session (so killing its process group reaches pg_dump too),
/dev/null as stdin, the pipes as stdout and stderr, nothing else open, the environment it was given; it runs
`fedload.feeder.main.main(words)` and exits with its status. The zygote runs nothing else: one thread, no event
loop, so a fork copies nothing half-done. It ends when the worker closes its end of the socket (the worker's own
end, or its death); children still running go on and end as an exec'd agent would (their reader gone, the
agent kills pg_dump).

    python -m fedload.transport.zygote FD
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["MAX_MESSAGE_BYTES", "main"]

MAX_MESSAGE_BYTES = 1 << 20  # a request carries the agent's argv and environment: far below this
_CHILD_STDIO = 2  # stdout and stderr, attached to every request


def main(argv: list[str]) -> int:
    """`python -m fedload.transport.zygote FD`: serve the requests on socket FD until it is closed."""
    sock = socket.socket(fileno=int(argv[0]))
    from fedload.feeder.main import preload_dumps  # noqa: PLC0415 - the agent's modules, once, for every child

    preload_dumps()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the worker has gone: nobody to answer
        _serve(sock)
    return 0


def _serve(sock: socket.socket) -> None:
    """Fork a child per request; report each child's pid, then its exit status. Returns at the socket's end."""
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, None)
    while True:
        for key, _ in selector.select():
            if key.data is not None:
                _report_exit(sock, selector, key.fd, key.data)
            elif not _take_request(sock, selector):
                return


def _take_request(sock: socket.socket, selector: selectors.BaseSelector) -> bool:
    """Read one request and fork its child; False at the end of the socket."""
    message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE_BYTES, _CHILD_STDIO)
    if not message:
        return False
    request_id = -1
    try:
        request = json.loads(message)
        request_id = int(request["id"])
        _look_ahead(request["words"])
        pid = _fork(list(request["words"]), request.get("env"), _stdio(fds))
        pidfd = _pidfd(pid)
    except Exception as exc:  # noqa: BLE001 - the worker falls back to exec'ing the agent, and logs why
        _send(sock, {"id": request_id, "error": f"{type(exc).__name__}: {exc}"})
        return True
    finally:
        for fd in fds:
            os.close(fd)
    selector.register(pidfd, selectors.EVENT_READ, (request_id, pid))
    _send(sock, {"id": request_id, "pid": pid})
    return True


def _look_ahead(words: list[str]) -> None:
    """Ask the dump's pg_dump for its version here, once per binary, so that every child inherits the answer."""
    from fedload.feeder.main import dump_options_of  # noqa: PLC0415
    from fedload.feeder.pg_dump import remember_pg_dump_version  # noqa: PLC0415 - imported already (preload_dumps)

    options = dump_options_of(words)
    if options is not None:
        with contextlib.suppress(Exception):  # the child asks again, and reports what fails
            remember_pg_dump_version(options.pg_dump)


def _stdio(fds: list[int]) -> list[int]:
    if len(fds) != _CHILD_STDIO:
        raise ValueError(f"{len(fds)} file descriptors came with the request, not {_CHILD_STDIO}")
    return fds


def _fork(words: list[str], env: dict[str, str] | None, stdio: list[int]) -> int:
    pid = os.fork()
    if pid == 0:
        _child(words, env, stdio)
    return pid


def _pidfd(pid: int) -> int:
    """A pidfd of the new child; if none can be had, the child is killed and reaped (nobody could report its exit)."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise


def _report_exit(sock: socket.socket, selector: selectors.BaseSelector, pidfd: int, child: tuple[int, int]) -> None:
    request_id, pid = child
    selector.unregister(pidfd)
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    _send(sock, {"id": request_id, "status": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode())


def _child(words: list[str], env: dict[str, str] | None, stdio: list[int]) -> NoReturn:
    """The forked agent: set up as an exec'd one would be, run it, exit with its status (never return)."""
    status = 1
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdio[0], 1)
        os.dup2(stdio[1], 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the zygote's socket and selector, the other children's pidfds
        with contextlib.suppress(OSError):  # `ps` and `top` show it as an agent, not as one more zygote
            Path("/proc/self/comm").write_bytes(b"fedload-agent")
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        from fedload.feeder.main import main as agent_main  # noqa: PLC0415 - imported already, by the zygote

        status = agent_main(words, prog="fedload agent")
    except SystemExit as exc:  # argparse's --help and usage errors
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # noqa: BLE001 - reported on the child's stderr, as an exec'd agent's traceback would be
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


if __name__ == "__main__":
    from fedload.feeder.main import exit_now  # imported already (preload_dumps)

    # without the interpreter's teardown (freeing every module), which the worker waits for
    exit_now(main(sys.argv[1:]))
