"""An SSH server that needs no system package, for the tests: asyncssh on 127.0.0.1, each session's command run by
/bin/sh as a real subprocess, as sshd runs it.

`python asyncssh_server.py DIRECTORY` serves with DIRECTORY/host_key to the keys in DIRECTORY/authorized_keys on a
free port, which it writes to DIRECTORY/port once it listens. Each command's stdin, stdout and stderr are wired to
its channel with flow control (a client that does not read stops the command's writes), its exit status or signal
is sent back, and it is killed (its whole process group) when its channel closes first. SIGTERM kills the commands
still running and stops the server; SIGKILL leaves them to the caller, as killing sshd does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import signal
import sys
from pathlib import Path
from typing import Any

import asyncssh

_CHUNK = 1 << 16
_RUNNING: set[asyncio.subprocess.Process] = set()


def _session_env(conn: Any) -> dict[str, str]:
    """The environment sshd gives a session (UsePAM no): user, home, shell, a default PATH, the connection."""
    user = pwd.getpwuid(os.getuid())
    peer, peer_port = conn.get_extra_info("peername")[:2]
    local, local_port = conn.get_extra_info("sockname")[:2]
    return {
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "HOME": user.pw_dir,
        "SHELL": "/bin/sh",
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "SSH_CONNECTION": f"{peer} {peer_port} {local} {local_port}",
    }


async def _pump_out(source: asyncio.StreamReader, channel_stream: Any) -> None:
    """Copy a pipe to the channel at the client's pace: while the client does not read, the command blocks."""
    with contextlib.suppress(BrokenPipeError, ConnectionError, asyncssh.Error):
        while data := await source.read(_CHUNK):
            channel_stream.write(data)
            await channel_stream.drain()


async def _pump_in(channel_stream: Any, sink: asyncio.StreamWriter) -> None:
    """Copy the client's stdin to the command, then close the command's stdin."""
    with contextlib.suppress(BrokenPipeError, ConnectionError, asyncssh.Error):
        while data := await channel_stream.read(_CHUNK):
            sink.write(data)
            await sink.drain()
    sink.close()


async def _run(process: Any, child: asyncio.subprocess.Process) -> None:
    """Wire the command to the channel until it exits; then send its exit status or signal."""
    assert child.stdin is not None  # all three are pipes
    assert child.stdout is not None
    assert child.stderr is not None
    feed = asyncio.ensure_future(_pump_in(process.stdin, child.stdin))
    try:  # the session ends with the command's output and exit, whether or not the client sent EOF
        await asyncio.gather(_pump_out(child.stdout, process.stdout), _pump_out(child.stderr, process.stderr))
        status = await child.wait()
    finally:
        feed.cancel()
    if status >= 0:
        process.exit(status)
    else:
        process.exit_with_signal(signal.Signals(-status).name.removeprefix("SIG"))


async def _session(process: Any) -> None:
    """Run the requested command with `/bin/sh -c` in its own process group; kill the group if the channel closes."""
    if process.command is None:
        process.stderr.write(b"this test server runs commands only, no shell\n")
        process.exit(1)
        return
    child = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        process.command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_session_env(process.channel.get_connection()),
        cwd=_home(),
        start_new_session=True,
    )
    _RUNNING.add(child)
    try:
        run = asyncio.ensure_future(_run(process, child))
        closed = asyncio.ensure_future(process.channel.wait_closed())
        await asyncio.wait([run, closed], return_when=asyncio.FIRST_COMPLETED)
        for task in (run, closed):
            task.cancel()
        await asyncio.gather(run, closed, return_exceptions=True)
    finally:
        _kill(child)
        await child.wait()
        _RUNNING.discard(child)


def _home() -> str:
    """The user's home directory, or / if it does not exist (as sshd falls back, say for `nobody`)."""
    home = pwd.getpwuid(os.getuid()).pw_dir
    return home if Path(home).is_dir() else "/"


def _kill(child: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's process group (the shell and whatever it started)."""
    if child.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)


async def serve(directory: Path) -> None:
    """Listen until SIGTERM; then kill the running commands."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    server = await asyncssh.listen(
        "127.0.0.1",
        0,
        server_host_keys=[str(directory / "host_key")],
        authorized_client_keys=str(directory / "authorized_keys"),
        process_factory=_session,
        encoding=None,
        allow_pty=False,
        agent_forwarding=False,
        x11_forwarding=False,
    )
    port_file = directory / "port"
    port_file.with_suffix(".tmp").write_text(str(server.get_port()))
    port_file.with_suffix(".tmp").rename(port_file)  # whole or absent for the reader
    try:
        await stop.wait()
    finally:
        server.close()
        for child in list(_RUNNING):
            _kill(child)


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
