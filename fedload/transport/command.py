"""The superhub's view of a feeder: the command it runs there, and the transport that runs it."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence

from fedload.config import FeederConfig, TransformConfig
from fedload.feeder.agent_options import AgentOptions
from fedload.feeder.pg_dump import pg_dump_argv
from fedload.names import TableName
from fedload.transport import Transport
from fedload.transport.local import FEDLOAD_HERE, LocalTransport
from fedload.transport.warm import ZYGOTE_MODULE

__all__ = ["dump_command", "transport_for", "transport_modules"]


def dump_command(
    feeder: FeederConfig,
    transform: TransformConfig,
    tables: Iterable[TableName],
    columns: Sequence[str] = (),
    *,
    statistics: bool = False,
) -> list[str]:
    """The command the transport runs on the feeder: the agent (merging INSERTs as `transform` says; asked for
    the tables' statistics too with `statistics`), or pg_dump piped into gzip without it. `columns`: binary mode's
    request for each table (fedload.superhub.binary_request).

    pg_dump gets the exact, quoted names of the tables the superhub expects, never the configured patterns:
    the superhub has already matched those by PostgreSQL's rules, so pg_dump cannot read them another way."""
    options = AgentOptions(
        database=feeder.database,
        tables=[table.sql for table in sorted(tables)],
        dump_mode=feeder.dump_mode.value,
        compression=feeder.compression.value,
        pg_dump=feeder.pg_dump,
        pg_dump_args=feeder.pg_dump_args,
        rows_per_statement=transform.rows_per_statement,
        max_statement_bytes=transform.max_statement_bytes,
        quiet=True,
        columns=columns,
        statistics=statistics and feeder.agent,
    )
    if not feeder.agent:
        return ["bash", "-o", "pipefail", "-c", f"{shlex.join(pg_dump_argv(options))} | gzip -1"]
    head = feeder.agent_command or (list(FEDLOAD_HERE) if feeder.transport == "local" else ["fedload"])
    return [*head, *options.to_argv()]


def transport_modules(feeders: Iterable[FeederConfig]) -> tuple[str, ...]:
    """The transport modules `feeders` need, for a worker process to import before its first run; with the warm
    agents' zygote among them, a worker starts its zygote at once (fedload.transport.warm)."""
    feeders = list(feeders)
    ssh = any(f.transport == "ssh" for f in feeders)
    warm = any(f.transport == "local" and f.agent and not f.agent_command for f in feeders)
    return (*(["fedload.transport.ssh"] if ssh else []), *([ZYGOTE_MODULE] if warm else []))


def transport_for(feeder: FeederConfig, name: str | None = None) -> Transport:
    """How the superhub reaches `feeder`: a local subprocess or SSH, as configured; with its `name`, over SSH on
    the connection its last run left where the process keeps them (fedload.transport.kept_ssh)."""
    if feeder.transport == "local":
        return LocalTransport(read_timeout_s=feeder.read_timeout_s, warm=True)
    from fedload.transport.ssh import SshTransport  # noqa: PLC0415 - asyncssh is heavy

    assert feeder.ssh is not None
    return SshTransport(feeder.ssh, name)
