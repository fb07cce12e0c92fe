"""`fedload check-config --connect`: try what a sync needs, one line per item, OK or FAILED with the reason.

The superhub (with [shards], each shard): connect, its server version, the partitioned parents `superhub.tables`
names (or whether the schema file can create the missing ones there: its PostgreSQL has their clauses, their
extensions are available); the coordinator, if configured: connect, version, postgres_fdw available. Each feeder,
in parallel: the transport (the SSH handshake), the agent's version (`fedload --version` there) and pg_dump's.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import asyncpg

from fedload import __version__
from fedload.config import Config, FeederConfig, SshConfig
from fedload.english import counted
from fedload.errors import (
    ConfigError,
    FedloadError,
    FeederCommandError,
    FeederError,
    FeederTimeoutError,
    SuperhubError,
    internal_error,
    one_line,
)
from fedload.log import get_logger
from fedload.superhub.entities import EntityRule, check_entity_rule
from fedload.superhub.job import coordinator_target, parents_spec, superhub_targets
from fedload.superhub.schema import ParentsSpec, read_parents, unmatched_patterns
from fedload.superhub.session import SuperhubTarget, schema_file_refusals, superhub_session
from fedload.transport.base import Transport

__all__ = ["Probe", "probe_coordinator", "probe_feeder", "probe_superhub", "run_probes"]

log = get_logger()

_COMMAND_TIMEOUT_S = 30.0
_MAX_OUTPUT_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Probe:
    """One item tried: what, whether it worked, and its detail or the reason it failed."""

    item: str
    ok: bool
    detail: str

    def line(self) -> str:
        """`item: OK (detail)` or `item: FAILED: reason`."""
        return f"{self.item}: OK ({self.detail})" if self.ok else f"{self.item}: FAILED: {self.detail}"


async def probe_superhub(
    superhub: SuperhubTarget, parents: ParentsSpec, what: str = "superhub", entities: EntityRule | None = None
) -> list[Probe]:
    """Connect to the superhub (`what`: "shard NAME" for a shard's), read its version and the parents of the
    configured tables, and check the entity rule's columns (`entities`, superhub.entity_key) if set."""
    try:
        async with superhub_session(superhub, "check-config") as conn:
            version = await conn.fetchval("SHOW server_version")
            probes = [Probe(what, True, f"PostgreSQL {version}"), await _tables(conn, parents, f"{what} tables")]
            return probes + ([await _entities(conn, entities, f"{what} entities")] if entities else [])
    except FedloadError as exc:
        return [Probe(what, False, str(exc))]


async def _entities(conn: asyncpg.Connection, rule: EntityRule, item: str) -> Probe:
    """Whether the superhub has the entity rule's newest column, of a type with an order, in a table with the key."""
    try:
        newest_type, _ = await check_entity_rule(conn, rule)
    except (ConfigError, SuperhubError) as exc:
        return Probe(item, False, str(exc))
    newest = f"{rule.newest_table}.{rule.newest_column}"
    return Probe(item, True, f"{rule.key_column} by the newest {newest} ({newest_type})")


async def probe_coordinator(coordinator: SuperhubTarget) -> list[Probe]:
    """Connect to the coordinator, read its version and whether it has postgres_fdw."""
    try:
        async with superhub_session(coordinator, "check-config") as conn:
            version = await conn.fetchval("SHOW server_version")
            fdw = await conn.fetchval("SELECT count(*) FROM pg_available_extensions WHERE name = 'postgres_fdw'")
    except FedloadError as exc:
        return [Probe("coordinator", False, str(exc))]
    if not fdw:
        return [Probe("coordinator", False, f"PostgreSQL {version} without postgres_fdw")]
    return [Probe("coordinator", True, f"PostgreSQL {version}, postgres_fdw available")]


async def _tables(conn: asyncpg.Connection, spec: ParentsSpec, item: str = "superhub tables") -> Probe:
    try:
        parents = await read_parents(conn, spec.tables, spec.feeder_key)
    except FedloadError as exc:
        return Probe(item, False, str(exc))
    found = f"{counted(len(parents), 'partitioned table')} match superhub.tables"
    unmatched = ", ".join(map(str, unmatched_patterns(spec.tables, parents)))
    if not unmatched:
        return Probe(item, True, found)
    if spec.schema_file is not None:
        if refusals := await schema_file_refusals(conn, spec):
            return Probe(item, False, f"{found}; the schema file cannot create {unmatched}: {'; '.join(refusals)}")
        return Probe(item, True, f"{found}; the first sync creates {unmatched} from the schema file")
    return Probe(item, False, f"{unmatched} match no partitioned table on the superhub, and no schema_file is set")


def _transport(feeder: FeederConfig) -> tuple[Transport, str]:
    if feeder.transport == "local":
        from fedload.transport.local import LocalTransport  # noqa: PLC0415 - import what is used

        return LocalTransport(read_timeout_s=_COMMAND_TIMEOUT_S), "local commands, nothing to connect to"
    from fedload.transport.ssh import SshTransport  # noqa: PLC0415 - asyncssh is heavy

    assert feeder.ssh is not None
    return SshTransport(feeder.ssh), _ssh_label(feeder.ssh)


def _ssh_label(ssh: SshConfig) -> str:
    """`ssh user@host:port`, and `via bastion host:port` for a feeder behind a bastion."""
    jump = ssh.jump_host
    via = f" via bastion {jump.host}:{jump.port}" if jump else ""
    return f"ssh {ssh.user}@{ssh.host}:{ssh.port}{via}"


async def _first_line(transport: Transport, argv: list[str], timeout_s: float) -> str:
    """Run `argv` on the feeder; the first line it prints, or a FeederError saying why not."""
    try:
        async with asyncio.timeout(timeout_s):
            process = await transport.open(argv)
    except TimeoutError:
        raise FeederTimeoutError(f"`{shlex.join(argv)}` could not be started within {timeout_s:g} s") from None
    try:
        async with asyncio.timeout(timeout_s):
            output = b""
            while len(output) < _MAX_OUTPUT_BYTES and (chunk := await process.read(_MAX_OUTPUT_BYTES)):
                output += chunk
            status = await process.wait()
    except TimeoutError:
        raise FeederTimeoutError(f"`{shlex.join(argv)}` did not answer within {timeout_s:g} s") from None
    finally:
        await process.cancel()
    if status != 0:
        raise FeederCommandError(f"`{shlex.join(argv)}` exited with status {status}: {one_line(process.stderr_tail)}")
    return one_line(output.decode(errors="replace").strip().partition("\n")[0]) or "(no output)"


def _commands(feeder: FeederConfig) -> list[tuple[str, list[str]]]:
    head = feeder.agent_command or ([sys.executable, "-m", "fedload"] if feeder.transport == "local" else ["fedload"])
    agent = [("agent", [*head, "--version"])] if feeder.agent else []
    return [*agent, ("pg_dump", [feeder.pg_dump, "--version"])]


async def probe_feeder(name: str, feeder: FeederConfig) -> list[Probe]:
    """The feeder's connection, then its agent's and pg_dump's versions; nothing more once the connection fails."""
    transport, how = _transport(feeder)
    timeout_s = _COMMAND_TIMEOUT_S + (feeder.ssh.connect_timeout_s if feeder.ssh else 0.0)
    probes: list[Probe] = []
    for label, argv in _commands(feeder):
        try:
            answer = await _first_line(transport, argv, timeout_s)
        except FeederCommandError as exc:
            probes.append(Probe(f"feeder {name} {label}", False, str(exc)))
        except FeederError as exc:
            return [*probes, Probe(f"feeder {name} connection", False, str(exc))]
        else:
            if label == "agent" and answer != f"fedload {__version__}":
                answer += f"; this superhub runs fedload {__version__}"
            probes.append(Probe(f"feeder {name} {label}", True, answer))
        if len(probes) == 1:
            probes.insert(0, Probe(f"feeder {name} connection", True, how))
    return probes


async def _all(config: Config) -> list[Probe]:
    superhub = config.superhub
    rule = EntityRule.of_superhub(superhub)
    async with asyncio.TaskGroup() as group:
        superhubs = [
            group.create_task(_unexpected_fails(what, probe_superhub(target, parents_spec(config), what, rule)))
            for target, what in _superhubs(config)
        ]
        if config.coordinator is not None:
            coordinator = coordinator_target(config)
            superhubs.append(group.create_task(_unexpected_fails("coordinator", probe_coordinator(coordinator))))
        feeders = [
            group.create_task(_unexpected_fails(f"feeder {name}", probe_feeder(name, f)))
            for name, f in config.feeders.items()
        ]
    return [*(probe for task in [*superhubs, *feeders] for probe in task.result())]


def _superhubs(config: Config) -> list[tuple[SuperhubTarget, str]]:
    """The superhubs to probe: the one, or each shard."""
    return [(target, f"shard {shard}" if shard else "superhub") for shard, target in superhub_targets(config).items()]


async def _unexpected_fails(item: str, probing: Coroutine[Any, Any, list[Probe]]) -> list[Probe]:
    """The probes, or one failed probe for an exception the probe did not expect (logged with its traceback),
    so that one probe's bug neither cancels the others nor ends the command with a traceback."""
    try:
        return await probing
    except Exception as exc:
        log.error("probe.crashed", item=item, exc_info=exc)
        return [Probe(item, False, internal_error(exc))]


def run_probes(config: Config) -> int:
    """Try the superhub and every feeder, print one line per item; 0 if all worked, 1 if something failed."""
    probes = asyncio.run(_all(config))
    for probe in probes:
        print(probe.line())
    return 0 if all(probe.ok for probe in probes) else 1
