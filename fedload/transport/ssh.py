"""SSH transport (asyncssh): key authentication, known_hosts verification, timeouts, keepalives.

Every asyncssh and socket failure is translated here into the FeederError subclass that says what the operator
can do: fix DNS or the network (unreachable), the keys (auth), known_hosts (host key), or wait (timeout, lost).

In a worker process a feeder's connection is kept from one run to the next (fedload.transport.kept_ssh): a command
that ended cleanly gives its connection back; a kept one that cannot open the next command's channel is dropped
and the command started on a new connection, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shlex
import socket
from pathlib import Path
from typing import Any

from fedload._tail import Tail
from fedload.config import SshConfig
from fedload.errors import (
    FeederAuthError,
    FeederCommandError,
    FeederConnectionLostError,
    FeederError,
    FeederHostKeyError,
    FeederTimeoutError,
    FeederUnreachableError,
    one_line,
)
from fedload.log import get_logger, without_passwords
from fedload.transport._asyncssh import asyncssh
from fedload.transport.kept_ssh import SERVE_REFUSED, Lease, SshKeeper, close_connection, kept_ssh
from fedload.transport.served import ServedAgent, ServedDump, serve_argv

__all__ = ["SshProcess", "SshTransport"]

_WAIT_TIMEOUT_S = 30.0
_CLOSE_TIMEOUT_S = 10.0
_COMMAND_NOT_FOUND = 127
# AES-GCM first: asyncssh handles packets in Python, and AES-GCM runs in OpenSSL's C at several times the speed.
_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com", "aes128-ctr")
log = get_logger()


class SshProcess:
    """The dump command running on a feeder over one SSH connection."""

    def __init__(
        self,
        conn: Any,
        process: Any,
        config: SshConfig,
        where: str,
        keep: tuple[SshKeeper, Lease] | None = None,
        *,
        agent: Any = None,
    ) -> None:
        self._conn = conn
        self._agent = agent  # kept with the connection: SERVE_REFUSED, or None
        self._process = process
        self._config = config
        self._where = where
        self._keep = keep  # where the connection goes back if the command ends cleanly
        self._eof = False  # stdout was read to its end
        self._clean = False  # ... and the command exited with status 0: the connection may serve another
        self._stderr = Tail()
        self._stderr_task = asyncio.create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        with contextlib.suppress(asyncssh.Error, OSError):
            while chunk := await self._process.stderr.read(1024):
                self._stderr.append(chunk)

    async def read(self, max_bytes: int) -> bytes:
        """Up to `max_bytes` of the command's stdout; b"" at its end."""
        try:
            async with asyncio.timeout(self._config.read_timeout_s):
                data: bytes = await self._process.stdout.read(max_bytes)
        except TimeoutError:
            raise FeederTimeoutError(
                f"{self._where} sent nothing for {self._config.read_timeout_s:g} s (read_timeout_s)"
            ) from None
        except (asyncssh.Error, OSError) as exc:
            raise FeederConnectionLostError(f"the connection to {self._where} broke during the dump: {exc}") from exc
        if not data and self._conn.is_closed() and self._process.exit_status is None:
            raise FeederConnectionLostError(f"the connection to {self._where} closed before the command finished")
        self._eof = not data
        return data

    async def wait(self) -> int:
        """The remote exit status (negative signal number if killed); FeederCommandError if unknown."""
        try:
            async with asyncio.timeout(_WAIT_TIMEOUT_S):
                completed = await self._process.wait(check=False)
                await self._stderr_task
        except TimeoutError:
            raise FeederCommandError(
                f"the command on {self._where} did not exit within {_WAIT_TIMEOUT_S:g} s"
            ) from None
        except (asyncssh.Error, OSError) as exc:
            raise FeederConnectionLostError(f"the connection to {self._where} broke at the end: {exc}") from exc
        status = self._status(completed)
        self._clean = self._eof and status == 0
        return status

    def _status(self, completed: Any) -> int:
        if completed.exit_status is not None and completed.exit_status >= 0:
            if completed.exit_status == _COMMAND_NOT_FOUND:
                raise FeederCommandError(
                    f"the dump command was not found on {self._where}: {one_line(self.stderr_tail)}"
                )
            return int(completed.exit_status)
        if completed.exit_signal:
            signal_name = completed.exit_signal[0]
            with contextlib.suppress(AttributeError, KeyError):
                import signal  # noqa: PLC0415

                return -int(signal.Signals[f"SIG{signal_name}"])
            return -1
        raise FeederConnectionLostError(f"{self._where} closed the channel without an exit status")

    @property
    def stderr_tail(self) -> str:
        """The last few KB of the command's stderr."""
        return self._stderr.text()

    async def cancel(self) -> None:
        """Close the channel, and the connection unless the command ended cleanly where connections are kept
        (then it goes back to the keeper); idempotent, never raises."""
        keep, self._keep = self._keep, None
        with contextlib.suppress(Exception):
            self._process.close()
        if keep is not None and self._clean and not self._conn.is_closed():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await self._process.wait_closed()
            keeper, lease = keep
            keeper.give_back(lease, self._conn, self._agent)
        else:
            await close_connection(self._conn)
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # its own failure must not hide the run's
            await self._stderr_task
        log.debug("transport.closed", feeder=self._where)


class _NotStarted(Exception):  # noqa: N818 - not an error of its own: carries the one `open` raises
    """The command's channel never opened on the connection: nothing of the command ran."""

    def __init__(self, error: FeederError) -> None:
        super().__init__(str(error))
        self.error = error


class SshTransport:
    """Reaches one feeder over SSH, through its bastion (`jump`) if it has one; with `feeder` (its name), on the
    connection its last run left where this process keeps them (fedload.transport.kept_ssh)."""

    def __init__(self, config: SshConfig, feeder: str | None = None) -> None:
        self._config = config
        self._jump = config.jump_host
        self._bastion = f"bastion {self._jump.host}:{self._jump.port}" if self._jump else ""
        via = f" via {self._bastion}" if self._jump else ""
        self._where = f"feeder {config.host}:{config.port}{via}"
        self._ahead: asyncio.Future[Any] | None = None  # the connection `connect_ahead` started or took, for `open`
        self._ahead_kept = False  # `_ahead` is a kept connection
        self._agent: Any = None  # the served agent kept with the connection taken (fedload.transport.kept_ssh.Kept)
        keeper = kept_ssh() if feeder is not None else None
        self._keep = (keeper, keeper.lease(feeder, config)) if keeper is not None and feeder is not None else None

    def _options(self, *, port: int, user: str, tunnel: Any = ()) -> dict[str, Any]:
        """asyncssh's options for the feeder or its bastion: the same key, known_hosts and timeouts for both."""
        config = self._config
        known_hosts = config.known_hosts or Path.home() / ".ssh" / "known_hosts"
        return {
            "port": port,
            "username": user,
            "client_keys": [str(config.identity)] if config.identity else (),
            "known_hosts": str(known_hosts),
            "agent_path": None,
            "agent_forwarding": False,
            "password_auth": False,
            "kbdint_auth": False,
            "preferred_auth": "publickey",
            "login_timeout": config.connect_timeout_s,
            "connect_timeout": config.connect_timeout_s,
            "keepalive_interval": config.keepalive_s,
            "keepalive_count_max": 3,
            "encryption_algs": list(_CIPHERS),
            "config": [],
            "tunnel": tunnel,
        }

    def connect_ahead(self) -> None:
        """Take the feeder's kept connection, or start a new one now (its handshake, ~0.07 s on a LAN), for the
        next `open`: a run's own steps on the superhub before it starts the dump (~0.04 s) then overlap it."""
        if self._ahead is not None:
            return
        if (kept := self._take_kept()) is not None:
            self._ahead, self._ahead_kept = asyncio.get_running_loop().create_future(), True
            self._ahead.set_result(kept)
            return
        self._ahead, self._ahead_kept = asyncio.get_running_loop().create_task(self._connect()), False

    async def close(self) -> None:
        """Release the connection `connect_ahead` started or took if no `open` took it (a run that ended before
        its dump: busy, or a failure on the superhub): kept again where connections are kept, else closed; a
        failure to connect is nobody's to see then."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        ahead.cancel()  # a handshake still under way stops; a connection made is kept by the task's result
        try:
            conn = await ahead
        except BaseException:  # noqa: BLE001 - cancelled or failed: nothing is open
            return
        if self._keep is not None and not conn.is_closed():  # nothing ran on it: as good as before
            keeper, lease = self._keep
            keeper.give_back(lease, conn, self._agent)
            return
        await close_connection(conn)

    async def open(self, argv: list[str]) -> SshProcess | ServedDump:
        """Connect (or take the connection `connect_ahead` started, or the feeder's kept one) and start `argv`
        (quoted for the remote shell); a FeederError subclass if that fails. A kept connection on which the
        command's channel does not open (the feeder closed it, the network broke while it was idle) is dropped and
        the command started on a new connection, once: nothing of it ran on the kept one. Where connections are
        kept, an agent dump is asked of the connection's served agent (fedload.transport.served), unless the
        feeder's agent does not serve."""
        conn, kept = await self._connection()
        if self._keep is not None and (serve := serve_argv(argv)) is not None and self._agent is not SERVE_REFUSED:
            try:
                dump = await self._served(conn, serve, argv)
            except FeederError as exc:
                await close_connection(conn)
                if not kept:
                    raise
                log.info("transport.kept_connection_dropped", feeder=self._keep[1].feeder, reason=str(exc))
                conn, kept, self._agent = await self._connect(), False, None
                dump = await self._served(conn, serve, argv)
            if dump is not None:
                return dump
        try:
            process = await self._start(conn, argv)
        except _NotStarted as exc:
            if not kept:
                raise exc.error from exc.error.__cause__
            assert self._keep is not None
            log.info("transport.kept_connection_dropped", feeder=self._keep[1].feeder, reason=str(exc.error))
            conn = await self._connect()  # `_start` closed the kept one
            try:
                process = await self._start(conn, argv)
            except _NotStarted as again:
                raise again.error from again.error.__cause__
        log.debug("transport.started", feeder=self._where, argv=[without_passwords(a) for a in argv])
        return SshProcess(conn, process, self._config, self._where, self._keep, agent=self._agent)

    async def _served(self, conn: Any, serve: list[str], argv: list[str]) -> ServedDump | None:
        """`argv`'s dump from the served agent on `conn` (the kept one, or one started now); None if the feeder's
        agent does not serve (remembered with the connection). FeederError if the session cannot start or breaks:
        `conn` is then no good."""
        agent = self._agent if isinstance(self._agent, ServedAgent) and self._agent.usable else None
        if agent is None:
            agent = await ServedAgent.start(conn, serve, self._config, self._where)
        dump = await agent.dump(argv, functools.partial(self._served_end, conn, agent))
        self._agent = None if dump is not None else SERVE_REFUSED  # the dump hands the agent back at its end
        if dump is not None:
            log.debug("transport.served", feeder=self._where, argv=[without_passwords(a) for a in argv])
        return dump

    async def _served_end(self, conn: Any, agent: ServedAgent, clean: bool) -> None:
        """A served dump is over: its connection and agent kept for the next run if it ended cleanly, else closed."""
        if clean and self._keep is not None and not conn.is_closed() and agent.usable:
            keeper, lease = self._keep
            keeper.give_back(lease, conn, agent)
            return
        await agent.close()
        await close_connection(conn)

    async def _connection(self) -> tuple[Any, bool]:
        """The connection for `open`, and whether a run before kept it: `connect_ahead`'s, the kept one, or new."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            kept, self._ahead_kept = self._ahead_kept, False
            if not kept:
                self._agent = None
            return await ahead, kept
        if (conn := self._take_kept()) is not None:
            return conn, True
        self._agent = None
        return await self._connect(), False

    def _take_kept(self) -> Any | None:
        """The feeder's kept connection (its agent in `_agent`), or None."""
        if self._keep is None:
            return None
        keeper, lease = self._keep
        kept = keeper.take(lease)
        if kept is None:
            return None
        self._agent = kept.agent
        return kept.conn

    async def _start(self, conn: Any, argv: list[str]) -> Any:
        """Start `argv` on `conn` (closed if that fails): the FeederError, or `_NotStarted` with it when the
        command's channel never opened (asyncssh makes the session only once the feeder confirms the channel, and
        asks for the command after that)."""
        opened = False

        def session() -> Any:
            nonlocal opened
            opened = True
            return asyncssh.SSHClientProcess()

        error: FeederError
        try:
            async with asyncio.timeout(self._config.connect_timeout_s):
                _, process = await conn.create_session(session, shlex.join(argv), encoding=None)
                await process.redirect(asyncssh.DEVNULL, asyncssh.PIPE, asyncssh.PIPE)
        except TimeoutError:  # before OSError, of which it is a subclass
            conn.close()
            limit = self._config.connect_timeout_s
            error = FeederTimeoutError(f"{self._where} did not start the dump command within {limit:g} s")
        except (asyncssh.Error, OSError) as exc:
            conn.close()
            error = FeederCommandError(f"cannot start the dump command on {self._where}: {exc}")
            error.__cause__ = exc
        except BaseException:  # cancelled while it starts: the connection (and the command) must not outlive it
            conn.close()
            raise
        else:
            return process
        if opened:
            raise error from error.__cause__
        raise _NotStarted(error)

    async def _connect(self) -> Any:
        """The connection to the feeder, through its bastion if it has one (then closed with it); both handshakes
        within one budget: the connect timeout, plus a margin for asyncssh's own, which bounds each."""
        config, jump = self._config, self._jump
        bastion: Any = None
        where, user = (self._bastion, jump.user or config.user) if jump else (self._where, config.user)
        try:
            async with asyncio.timeout(config.connect_timeout_s + 5):
                if jump is not None:
                    bastion = await asyncssh.connect(jump.host, **self._options(port=jump.port, user=user))
                    log.debug("transport.bastion_connected", feeder=self._where)
                    where, user = self._where, config.user
                options = self._options(port=config.port, user=config.user, tunnel=bastion or ())
                conn = await asyncssh.connect(config.host, **options)
        except BaseException as exc:
            if bastion is not None:
                bastion.close()
            if isinstance(exc, Exception):  # every failure is translated into one FeederError below
                raise self._translate(exc, where, user) from exc
            raise
        if bastion is not None:
            conn.set_tunnel(bastion)  # closing the feeder's connection closes the bastion's
        log.debug("transport.connected", feeder=self._where)
        return conn

    def _translate(self, exc: BaseException, where: str, user: str) -> FeederError:
        """The FeederError for a failure to connect to `where` (the feeder or its bastion) as `user`, by what the
        operator can do about it."""
        rules: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], type[FeederError], str], ...] = (
            (socket.gaierror, FeederUnreachableError, f"cannot resolve the host name of {where}"),
            (
                asyncssh.HostKeyNotVerifiable,
                FeederHostKeyError,
                f"the host key of {where} is not in known_hosts or differs",
            ),
            (asyncssh.PermissionDenied, FeederAuthError, f"{where} refused the key of user {user!r}"),
            ((TimeoutError, asyncssh.TimeoutError), FeederUnreachableError, f"{where} did not answer in time"),
            (
                ConnectionRefusedError,
                FeederUnreachableError,
                f"{where} refused the connection (is sshd running there?)",
            ),
            (OSError, FeederUnreachableError, f"cannot reach {where}"),
            (
                asyncssh.ChannelOpenError,  # only through a bastion: it did not open the tunnel
                FeederUnreachableError,
                f"{self._bastion} did not forward the connection to feeder {self._config.host}:{self._config.port}",
            ),
            (
                (asyncssh.DisconnectError, asyncssh.ConnectionLost),
                FeederConnectionLostError,
                f"{where} hung up at login",
            ),
        )
        for types, error, message in rules:
            if isinstance(exc, types):
                return error(f"{message}: {exc}" if str(exc) else message)
        return FeederError(f"cannot connect to {where}: {exc}")
