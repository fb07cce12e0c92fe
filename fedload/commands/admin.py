"""Administrative commands on the superhub: `fedload feeder remove`.

A removal is planned first (which partitions, how many rows, how much run history), shown and confirmed, then
done under the feeder's run lock. Removing a whole feeder also forgets its run history, schedule and rejected
rows, so `fedload status` no longer shows data the superhub does not hold; `--table` drops only some tables'
partitions and keeps the history.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedload.config import Config
from fedload.english import counted
from fedload.errors import SuperhubError, UsageError
from fedload.log import get_logger
from fedload.names import TableName, TablePattern
from fedload.superhub.bookkeeping import count_runs, ensure_superhub, known_feeders
from fedload.superhub.job import coordinated_entities, parents_spec, superhub_target, swap_policy
from fedload.superhub.removal import FeederBusyError, drop_feeder, partition_rows
from fedload.superhub.session import superhub_session

__all__ = ["RemovalPlan", "remove_feeder"]

log = get_logger()


@dataclass(frozen=True, slots=True)
class RemovalPlan:
    """What `feeder remove` would drop: the feeder's partitions (rows per table) and its recorded runs."""

    feeder: str
    partitions: dict[TableName, int]
    runs: int
    whole: bool  # no --table: the history goes too
    known: list[str]

    def lines(self) -> list[str]:
        """The plan for a person, one line per table, then the history."""
        lines = [f"  {table}: {counted(rows, 'row')}" for table, rows in self.partitions.items()]
        if self.whole:
            lines.append(f"  run history: {counted(self.runs, 'recorded run')}")
        return lines


def _key(config: Config, name: str) -> int | str | None:
    """The feeder's key; None for a feeder no longer configured."""
    feeder = config.feeders.get(name)
    return feeder.key if feeder else None


async def _plan(config: Config, shard: str | None, name: str, only: Sequence[TablePattern]) -> RemovalPlan:
    async with superhub_session(superhub_target(config, shard)) as conn:
        await ensure_superhub(conn)
        partitions = await partition_rows(conn, parents_spec(config), name, _key(config, name), only)
        runs = await count_runs(conn, name)
        known = sorted({*config.feeders, *await known_feeders(conn)})
    return RemovalPlan(name, partitions, runs, whole=not only, known=known)


def _check_known(plan: RemovalPlan, config: Config) -> None:
    if plan.feeder in config.feeders or plan.partitions or plan.runs or plan.feeder in plan.known:
        return
    known = ", ".join(plan.known) or "none"
    raise UsageError(
        f"feeder {plan.feeder} is not configured and the superhub holds no partitions or run history of it; "
        f"known feeders: {known}"
    )


def _on_shard(config: Config, name: str, only: Sequence[TablePattern], shard: str | None) -> str | None:
    """The shard to remove feeder `name` from (see `remove_feeder`); None without shards."""
    if not config.shards:
        if shard is not None:
            raise UsageError(f"--shard {shard}: the configuration has no [shards]")
        return None
    if shard is not None:
        if shard not in config.shards:
            raise UsageError(f"unknown shard {shard}; shards: {', '.join(config.shards)}")
        return shard
    if name in config.feeders:
        return config.feeders[name].shard
    plans = {s: asyncio.run(_plan(config, s, name, only)) for s in config.shards}
    holding = [s for s, plan in plans.items() if plan.partitions or plan.runs]
    if len(holding) > 1:
        raise UsageError(f"feeder {name} is on shards {', '.join(holding)}: say which with --shard")
    return holding[0] if holding else next(iter(config.shards))


def _confirmed(plan: RemovalPlan, ask: Callable[[str], str]) -> bool:
    print(f"feeder {plan.feeder}: this drops its partitions and cannot be undone:")
    print("\n".join(plan.lines()) if plan.lines() else "  (no partitions)")
    try:
        answer = ask(f"Remove feeder {plan.feeder}? [y/N] ")
    except EOFError:
        answer = ""
    return answer.strip().lower() in ("y", "yes")


def remove_feeder(
    config: Config,
    name: str,
    only: Sequence[TablePattern] = (),
    *,
    yes: bool = False,
    ask: Callable[[str], str] = input,
    shard: str | None = None,
) -> int:
    """Detach and drop every partition of feeder `name` (or those of the `only` tables), after confirmation on a
    terminal unless `yes`; 0 when done, 1 when the person declined. Works whether or not the feeder is still
    configured; UsageError for a feeder nobody knows, or for no terminal and no `yes`. With shards, on `shard`,
    by default the feeder's own, or for a feeder no longer configured the one shard that holds it."""
    shard = _on_shard(config, name, only, shard)
    plan = asyncio.run(_plan(config, shard, name, only))
    _check_known(plan, config)
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"feeder remove {name} asks for confirmation on a terminal; pass --yes to remove it")
        if not _confirmed(plan, ask):
            print(f"feeder {name}: nothing removed")
            return 1
    dropped, runs = asyncio.run(_dropped(config, shard, name, only))
    log.info("feeder.removed", feeder=name, tables=[str(t) for t in dropped], runs_forgotten=runs)
    _report(config, name, only, dropped, runs)
    return 0


async def _dropped(
    config: Config, shard: str | None, name: str, only: Sequence[TablePattern]
) -> tuple[dict[TableName, int], int]:
    """The removal itself, waiting for a run of the feeder and for the parents' locks as a swap does (`drop_feeder`);
    when it gives up, SuperhubError in one line: nothing removed, where the feeder is, what to run to finish."""
    superhub, parents, key = superhub_target(config, shard), parents_spec(config), _key(config, name)
    try:
        return await drop_feeder(
            superhub, parents, name, key, only, policy=swap_policy(config), coordinated=coordinated_entities(config)
        )
    except (FeederBusyError, SuperhubError) as exc:
        where = "the superhub" if shard is None else f"shard {shard}"
        raise SuperhubError(
            f'feeder {name}: nothing removed ({exc}); {where} still holds all of it: run "{_again(name, only, shard)}" '
            "again to finish"
        ) from exc


def _again(name: str, only: Sequence[TablePattern], shard: str | None) -> str:
    """The command that finishes a removal that gave up."""
    tables = [f"--table '{t}'" for t in only]
    return " ".join(["fedload feeder remove", name, *tables, *([f"--shard {shard}"] if shard else [])])


def _report(config: Config, name: str, only: Sequence[TablePattern], dropped: dict[TableName, int], runs: int) -> None:
    tables = "".join(f"\n  {t}: {counted(rows, 'row')}" for t, rows in dropped.items())
    print(f"feeder {name}: dropped {counted(len(dropped), 'partition')}{tables}")
    if not only:
        print(f"feeder {name}: forgot its run history ({counted(runs, 'run')})")
    feeder = config.feeders.get(name)
    if feeder is None:
        return
    if not only:
        print(f"feeder {name} is still configured: remove [feeders.{name}], or the next sync brings its data back")
    elif back := [t for t in dropped if not any(x.matches(t) for x in feeder.exclude_tables)]:
        names = ", ".join(map(str, back))
        print(f"{names} not in feeders.{name}.exclude_tables: the next sync of {name} brings their data back")
