"""The superhub connection: its settings and timeouts, the one translation of the driver's errors into fedload's,
sessions that always close, the feeder's run lock, and the setup every command expects (schemas, run history,
parents from the schema file). A session is given the `SuperhubTarget` it talks to, resolved from the configuration
once, at the top (`fedload.superhub.job`), never the whole configuration.

    async with superhub_session(target, "hub1") as conn:  # errors inside come out as DumpError/SuperhubError
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass, field

import asyncpg

from fedload.errors import DumpError, FedloadError, SuperhubError, internal_error, one_line
from fedload.log import get_logger
from fedload.superhub.bookkeeping import ensure_superhub, try_feeder_lock, unlock_feeder
from fedload.superhub.rejects import is_bad_row
from fedload.superhub.schema import ParentsSpec, existing_tables

__all__ = [
    "SuperhubTarget",
    "application_name",
    "best_effort",
    "close_superhub",
    "connect_superhub",
    "create_parents",
    "feeder_lock",
    "prepare_superhub",
    "server_message",
    "setup_superhub",
    "superhub_error",
    "superhub_errors",
    "superhub_session",
]

log = get_logger()

# The importer's literal check reads strings as PostgreSQL does with standard_conforming_strings on: a database or
# role set to off would read backslashes differently, so the session always sets it (startup options win).
_SESSION_SETTINGS = {"standard_conforming_strings": "on"}
_CLOSE_TIMEOUT_S = 10.0
# A local superhub's socket (AF_UNIX) takes a block of COPY data (1 MiB, as one CopyData message) in one send: with
# the default buffer (~200 KiB) asyncio sent a fifth, copied the rest into its transport's buffer and sent that in
# four more turns of the event loop. The kernel caps it at net.core.wmem_max. A TCP socket keeps the kernel's
# autotuning, which a fixed size would turn off.
_LOCAL_SEND_BUFFER_BYTES = 4 << 20
# The driver's client-side failures: misuse or a lost connection (InterfaceError), or a connection left in a state
# the driver cannot go on from (InternalClientError: "another operation is in progress", a protocol error).
_CLIENT_ERRORS = (asyncpg.InterfaceError, asyncpg.InternalClientError, ConnectionError)
_DRIVER_ERRORS = (*_CLIENT_ERRORS, asyncpg.PostgresError, TimeoutError)


@dataclass(frozen=True, slots=True)
class SuperhubTarget:
    """The superhub a session talks to: its dsn and timeouts (`superhub.connect_timeout_s`, `statement_timeout_s`);
    with shards one shard's dsn, `shard` naming it. Resolved from the configuration once, at the top
    (`fedload.superhub.job.superhub_target`). The dsn, which may hold a password, is left out of its repr."""

    dsn: str = field(repr=False)
    connect_timeout_s: float
    statement_timeout_s: float
    shard: str | None = None


async def connect_superhub(superhub: SuperhubTarget, purpose: str = "") -> asyncpg.Connection:
    """A connection to the superhub, with fedload's settings and timeouts; SuperhubError if it cannot be made.

    `purpose` (a feeder's name, say) shows in pg_stat_activity as the application name "fedload <purpose>"."""
    settings = {**_SESSION_SETTINGS, "application_name": application_name(purpose)}
    try:
        async with asyncio.timeout(superhub.connect_timeout_s):
            conn = await asyncpg.connect(
                superhub.dsn, command_timeout=superhub.statement_timeout_s, server_settings=settings
            )
    except (OSError, *_DRIVER_ERRORS) as exc:
        raise SuperhubError(f"cannot connect to the superhub: {exc or type(exc).__name__}") from exc
    _larger_local_send_buffer(conn)
    return conn


def _larger_local_send_buffer(conn: asyncpg.Connection) -> None:
    """A Unix socket's send buffer raised to `_LOCAL_SEND_BUFFER_BYTES` (or the kernel's cap); a TCP socket, or a
    driver that does not show its transport, as it is."""
    transport = getattr(conn, "_transport", None)  # asyncpg keeps its asyncio transport there
    sock = transport.get_extra_info("socket") if isinstance(transport, asyncio.BaseTransport) else None
    if sock is not None and sock.family == socket.AF_UNIX:
        with contextlib.suppress(OSError):  # a socket that refuses keeps its buffer: only slower
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _LOCAL_SEND_BUFFER_BYTES)


def application_name(purpose: str) -> str:
    """The name a session of fedload shows in pg_stat_activity: "fedload <purpose>", within PostgreSQL's 63 bytes."""
    return f"fedload {purpose}".strip()[:63]


async def close_superhub(conn: asyncpg.Connection) -> None:
    """Close a connection politely, or drop it if the server does not answer or the driver cannot close it."""
    try:
        await conn.close(timeout=_CLOSE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - whatever the close fails with, the connection is dropped
        conn.terminate()


@contextlib.asynccontextmanager
async def superhub_session(superhub: SuperhubTarget, purpose: str = "") -> AsyncIterator[asyncpg.Connection]:
    """A superhub connection for the block, closed after it even when cancelled; the driver's errors in the block
    come out as fedload's (see `superhub_error`)."""
    with superhub_errors(superhub.statement_timeout_s):
        conn = await connect_superhub(superhub, purpose)
        try:
            yield conn
        finally:
            await asyncio.shield(close_superhub(conn))


@contextlib.contextmanager
def superhub_errors(statement_timeout_s: float) -> Iterator[None]:
    """Raise the driver's failures in the block as fedload's errors (`superhub_error`), the rest unchanged."""
    try:
        yield
    except Exception as exc:
        if (translated := superhub_error(exc, statement_timeout_s)) in (None, exc):
            raise
        raise translated from exc


def superhub_error(exc: BaseException, statement_timeout_s: float) -> FedloadError | None:
    """fedload's error for a failure of the superhub session, None for an exception that is not the driver's.

    A refused row is the dump's fault (DumpError); anything else the superhub's (SuperhubError): a lost
    connection, any other client-side failure of the driver, and a statement past `statement_timeout_s`
    (asyncpg's command_timeout, the session's `statement_timeout_s`) too. fedload's own errors stay as they are."""
    if isinstance(exc, FedloadError):
        return exc
    if isinstance(exc, asyncpg.PostgresError):
        if is_bad_row(exc):
            return DumpError(f"the superhub rejected a row: {server_message(exc)}")
        return SuperhubError(f"the superhub failed: {server_message(exc)}")
    if isinstance(exc, _CLIENT_ERRORS):
        return _client_error(exc)
    if isinstance(exc, TimeoutError):
        return SuperhubError(f"a superhub statement took longer than statement_timeout_s = {statement_timeout_s:g}")
    return None


def _client_error(exc: Exception) -> SuperhubError:
    """A client-side failure of the driver: the connection lost, or left in a state the driver cannot go on from."""
    why = one_line(str(exc)) or type(exc).__name__
    if isinstance(exc, asyncpg.InternalClientError):
        return SuperhubError(f"the superhub driver failed ({type(exc).__name__}): {why}")
    return SuperhubError(f"the superhub connection was lost: {why}")


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


async def best_effort(step: Awaitable[object]) -> None:
    """Run a bookkeeping step whose failure must not hide the caller's own error: a dead superhub is only logged,
    an exception fedload did not expect is logged with its traceback."""
    try:
        await step
    except (*_DRIVER_ERRORS, FedloadError) as exc:
        log.warning("sync.bookkeeping_failed", error=str(exc) or type(exc).__name__)
    except Exception as exc:  # a bug here must not replace the run's own outcome
        log.error("sync.bookkeeping_failed", error=internal_error(exc), exc_info=exc)


@contextlib.asynccontextmanager
async def feeder_lock(conn: asyncpg.Connection, feeder: str) -> AsyncIterator[bool]:
    """Try the feeder's run lock for the block: True if this session holds it, False if another one does.
    Released after the block (shielded, best effort: a lost connection has released it already)."""
    if not await try_feeder_lock(conn, feeder):
        yield False
        return
    try:
        yield True
    finally:
        await asyncio.shield(best_effort(unlock_feeder(conn, feeder)))


async def create_parents(conn: asyncpg.Connection, parents: ParentsSpec) -> list[str]:
    """Create the missing partitioned parents from the schema file, if one is configured; their names.

    Where the configured tables are named exactly and all exist, the file is not read: it could create nothing, and
    pglast's import and the file's parse (~0.1 s) would be paid by every `fedload sync` before its first run."""
    if parents.schema_file is None:
        return []
    if (named := parents.named_tables()) is not None and await existing_tables(conn, named) == set(named):
        return []
    from fedload.superhub.schema_file import create_parents_from_file  # noqa: PLC0415 - pglast, not needed by worker processes

    args = (parents.schema_file, parents.feeder_key, parents.key_type, parents.wanted)
    return await create_parents_from_file(conn, *args)


async def schema_file_refusals(conn: asyncpg.Connection, parents: ParentsSpec) -> list[str]:
    """Why the schema file's missing parents could not be created on this superhub (none created); [] if they can."""
    if parents.schema_file is None:
        return []
    from fedload.superhub import schema_file  # noqa: PLC0415 - pglast, not needed by worker processes

    args = (parents.schema_file, parents.feeder_key, parents.key_type, parents.wanted)
    return await schema_file.schema_file_refusals(conn, *args)


async def setup_superhub(conn: asyncpg.Connection, parents: ParentsSpec, *, history: bool = True) -> list[str]:
    """What every command expects of the superhub: fedload's schemas and run history (`history`; safe to race),
    then the parents of the schema file the superhub lacks. The parents created."""
    if history:
        await ensure_superhub(conn)
    return await create_parents(conn, parents)


async def prepare_superhub(superhub: SuperhubTarget, parents: ParentsSpec) -> None:
    """Set up the superhub on a session of its own (see `setup_superhub`), logging the parents it creates."""
    async with superhub_session(superhub) as conn:
        if created := await setup_superhub(conn, parents):
            log.info("superhub.parents_created", tables=created)
