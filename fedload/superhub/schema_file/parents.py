"""The schema file as a whole: read and checked, and the parents it defines that a superhub lacks, created."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from fedload.errors import ConfigError
from fedload.log import get_logger
from fedload.names import TableName
from fedload.superhub.schema import existing_tables
from fedload.superhub.schema_file.build import Step, plan_tables, superhub_problems, table_steps
from fedload.superhub.schema_file.model import LeftOut, Problem, SchemaFile, Table
from fedload.superhub.schema_file.read import read_statements

__all__ = ["SchemaFile", "check_schema_file", "create_parents_from_file", "read_schema_file", "schema_file_refusals"]

log = get_logger()


def read_schema_file(path: Path) -> SchemaFile:
    """Read and check a schema file; its problems are in the result, never raised."""
    sf = SchemaFile(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        sf.problems.append(Problem(0, f"cannot be read: {exc.strerror or exc}"))
        return sf
    read_statements(sf, data)
    return sf


def check_schema_file(path: Path, feeder_key: str) -> list[str]:
    """Problems of a schema file, without a database: "file:LINE: ..." each; empty when fine."""
    sf = read_schema_file(path)
    for table in sf.tables.values():
        table_steps(sf, table, feeder_key, "integer")  # what cannot be built is a problem of the file
    return [f"{sf.where(p.line)}: {p.message}" for p in sorted(sf.problems, key=lambda p: p.line)]


_TYPES = "SELECT n.nspname, t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace"
_EXTENSIONS = "SELECT name, installed_version IS NOT NULL FROM pg_available_extensions"


@dataclass(slots=True)
class _Plan:
    sf: SchemaFile
    missing: list[Table]
    steps: dict[tuple[str, str], list[Step]]
    extensions: dict[str, bool]  # available on the superhub: installed or not


async def _prepare(
    conn: asyncpg.Connection, schema_file: Path, feeder_key: str, key_type: str, wanted: Callable[[str, str], bool]
) -> _Plan:
    """The wanted tables the superhub lacks and their statements; ConfigError naming each reason the file or the
    superhub cannot have them (a problem of the file, a clause its PostgreSQL lacks, an extension it lacks)."""
    sf = await asyncio.to_thread(read_schema_file, schema_file)
    tables = [t for t in sf.tables.values() if wanted(t.schema, t.name)]
    names = {(t.schema, t.name) for t in tables}
    existing = await existing_tables(conn, (TableName(t.schema, t.name) for t in tables))
    missing = [t for t in tables if TableName(t.schema, t.name) not in existing]
    steps = {(t.schema, t.name): table_steps(sf, t, feeder_key, key_type) for t in missing}
    fatal = [p for p in sf.problems if p.fatal and (p.table is None or p.table in names)]
    if fatal:
        raise ConfigError([f"{sf.where(p.line)}: {p.message}" for p in fatal])
    extensions = {str(name): bool(installed) for name, installed in await conn.fetch(_EXTENSIONS)}
    if refused := superhub_problems(sf, missing, conn.get_server_version().major, extensions):
        raise ConfigError(refused)
    return _Plan(sf, missing, steps, extensions)


async def schema_file_refusals(
    conn: asyncpg.Connection, schema_file: Path, feeder_key: str, key_type: str, wanted: Callable[[str, str], bool]
) -> list[str]:
    """Why creating the missing parents from `schema_file` on this superhub would fail, without creating any."""
    try:
        await _prepare(conn, schema_file, feeder_key, key_type, wanted)
    except ConfigError as exc:
        return exc.problems
    return []


async def create_parents_from_file(
    conn: asyncpg.Connection,
    schema_file: Path,
    feeder_key: str,
    key_type: str,
    wanted: Callable[[str, str], bool],
) -> list[str]:
    """Create the missing parents of the wanted tables in `schema_file`, in one transaction; their `schema.name`.
    Nothing is created when the file or the superhub cannot hold them all (ConfigError naming each reason)."""
    plan = await _prepare(conn, schema_file, feeder_key, key_type, wanted)
    if not plan.missing:
        return []
    async with conn.transaction():
        types = {(s, n) for s, n in await conn.fetch(_TYPES)}
        for step in plan_tables(plan.sf, plan.missing, plan.steps, types, plan.extensions):
            await _execute(conn, plan.sf, step)
    _warn_left_out(plan.sf, plan.missing)
    return [f"{t.schema}.{t.name}" for t in plan.missing]


async def _execute(conn: asyncpg.Connection, sf: SchemaFile, step: Step) -> None:
    try:
        await conn.execute(step.sql)
    except asyncpg.PostgresError as exc:
        place = sf.where(step.line) if step.line else sf.path.name
        message = " ".join(str(exc).split())
        raise ConfigError(f"{place}: the superhub refused to create {step.what}: {message}") from exc


def _warn_left_out(sf: SchemaFile, created: list[Table]) -> None:
    used = {e for t in created for e in t.extensions}
    unused = [LeftOut("extension", name, e.line) for name, e in sf.extensions.items() if name not in used]
    items = list(dict.fromkeys(f"{o.kind} {o.name}" for o in [*sf.left_out, *unused]))
    if items:
        log.warning("schema_file.left_out", file=str(sf.path), count=len(items), items=items)
