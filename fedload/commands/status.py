"""`fedload status`: per feeder, the last success, the age of its data, rows, duration, last error, next run or its
pause."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, replace
from datetime import UTC, datetime

import asyncpg
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fedload.commands.output import print_table
from fedload.config import Config, ConfigLocation
from fedload.english import counted
from fedload.errors import ErrorKind, FedloadError
from fedload.log import get_logger
from fedload.superhub.bookkeeping import (
    CapacityReport,
    FeederStatus,
    ensure_superhub,
    read_capacity,
    read_feeder_statuses,
)
from fedload.superhub.entities import displaced_counts, displaced_pairs
from fedload.superhub.job import coordinator_target, superhub_target
from fedload.superhub.session import SuperhubTarget, superhub_session

__all__ = ["read_status", "run_status"]

log = get_logger()


async def read_status(config: Config) -> list[FeederStatus]:
    """The status of every feeder that is configured or has history; with shards, read from each shard's history
    (a feeder is configured on its own shard only)."""
    stale_after_s, entities = config.superhub.stale_after_s, config.superhub.entity_key is not None
    targets = {name: config.freshness_target_s(name) for name in config.feeders}
    if not config.shards:
        return await _read_status(superhub_target(config), targets, None, stale_after_s, entities)
    statuses = []
    for shard in config.shards:
        mine = {name: targets[name] for name in config.by_shard().get(shard, [])}
        try:
            statuses += await _read_status(superhub_target(config, shard), mine, shard, stale_after_s, entities=False)
        except FedloadError as exc:  # the other shards' feeders are still shown; this one's say why they are not
            log.warning("status.shard_unreachable", shard=shard, error=str(exc))
            statuses += [_unreachable(name, shard, exc) for name in mine]
    statuses = _one_per_feeder(statuses)
    return await _coordinator_counts(config, statuses) if entities else statuses


async def _coordinator_counts(config: Config, statuses: list[FeederStatus]) -> list[FeederStatus]:
    """With shards the coordinator keeps the entity registry: each feeder's displaced entities read there (None,
    with a warning, when it cannot be read)."""
    try:
        async with superhub_session(coordinator_target(config), "status") as conn:
            return await _with_displaced(conn, statuses)
    except FedloadError as exc:
        log.warning("status.coordinator_unreachable", error=str(exc))
        return [replace(s, displaced_entities=None) for s in statuses]


async def _with_displaced(conn: asyncpg.Connection, statuses: list[FeederStatus]) -> list[FeederStatus]:
    """The statuses with each feeder's displaced entities and the feeders showing them, from the registry."""
    counts, pairs = await displaced_counts(conn), await displaced_pairs(conn)
    return [
        replace(s, displaced_entities=counts.get(s.feeder, 0), displaced_by=pairs.get(s.feeder, {})) for s in statuses
    ]


def _one_per_feeder(statuses: list[FeederStatus]) -> list[FeederStatus]:
    """Each feeder once, by name, whichever shards hold history of it: from the shard the configuration names (where
    its runs go), or, for a feeder no longer configured, the one with its newest success; the other shards are
    named in `also_on` (history a move or a removal left there, or a daemon with an old configuration refused)."""
    by_feeder: dict[str, list[FeederStatus]] = {}
    for status in statuses:
        by_feeder.setdefault(status.feeder, []).append(status)
    return [_shown(rows) for _, rows in sorted(by_feeder.items())]


def _shown(rows: list[FeederStatus]) -> FeederStatus:
    """The one of a feeder's rows (one per shard) that `status` shows, naming the others' shards."""
    never = datetime.min.replace(tzinfo=UTC)
    shown = max(rows, key=lambda s: (s.configured, s.last_success or never))
    others = tuple(sorted(s.shard for s in rows if s is not shown and s.shard is not None))
    return replace(shown, also_on=others) if others else shown


def _unreachable(feeder: str, shard: str, exc: FedloadError) -> FeederStatus:
    """A configured feeder whose shard cannot be read: nothing known of it, so it counts as stale."""
    return FeederStatus(
        feeder=feeder,
        last_success=None,
        data_age_s=None,
        rows=None,
        duration_s=None,
        last_outcome=None,
        last_error=f"shard {shard} cannot be reached: {exc}",
        last_error_kind=ErrorKind.SUPERHUB,
        next_run=None,
        failures=0,
        configured=True,
        running=False,
        stale=True,
        shard=shard,
    )


async def _read_status(
    superhub: SuperhubTarget,
    targets: dict[str, float | None],
    shard: str | None,
    stale_after_s: float,
    entities: bool,
) -> list[FeederStatus]:
    """The statuses of the configured feeders (`targets`: each one's freshness target) and of the others with
    history, from one superhub; `entities`: with their displaced entities (superhub.entity_key)."""
    async with superhub_session(superhub) as conn:
        await ensure_superhub(conn)
        statuses = await read_feeder_statuses(conn, list(targets), stale_after_s=stale_after_s, shard=shard)
        statuses = _with_targets(statuses, targets, await read_capacity(conn))
        if not entities:
            return statuses
        return await _with_displaced(conn, statuses)


def _with_targets(
    statuses: list[FeederStatus], targets: dict[str, float | None], capacity: CapacityReport | None
) -> list[FeederStatus]:
    """Each configured feeder's freshness target and, with one, the daemon's verdict on its lanes."""
    shown = []
    for s in statuses:
        target = targets.get(s.feeder)
        shown.append(s if target is None else replace(s, freshness_target_s=target, capacity=capacity))
    return shown


def _table(statuses: list[FeederStatus], location: ConfigLocation) -> Table:
    table = Table(title=f"fedload status, configuration {location}")
    sharded = any(s.shard is not None for s in statuses)
    entities = any(s.displaced_entities is not None for s in statuses)
    targets = any(s.freshness_target_s is not None for s in statuses)
    for column in (
        *("feeder", *(["shard"] if sharded else []), "last success", "data age", *(["target"] if targets else [])),
        *("rows", "seconds"),
        *(["displaced (shown by)"] if entities else []),
        *("last run", "next run", "last swap", "error kind", "last error"),
    ):
        table.add_column(column, justify="right" if column in ("data age", "rows", "seconds") else "left")
    for s in statuses:
        age = "never" if s.data_age_s is None else f"{s.data_age_s / 60:.1f} min"
        table.add_row(
            s.feeder + ("" if s.configured else " (not configured)"),
            *([_shard(s)] if sharded else []),
            s.last_success.strftime("%Y-%m-%d %H:%M:%S") if s.last_success else "-",
            _age(s, age),
            *([_target(s)] if targets else []),
            _rows(s),
            f"{s.duration_s:.1f}" if s.duration_s is not None else "-",
            *([_displaced(s)] if entities else []),
            Text(_last_run(s)),
            _next_run(s),
            _last_swap(s),
            s.last_error_kind or "",
            Text(s.last_error or ""),
        )
    return table


def _displaced(s: FeederStatus) -> str:
    """How many of the feeder's entities other feeders show, and which: "201 (hub2 200, hub3 1)"."""
    by = ", ".join(f"{other} {n:,}" for other, n in sorted((s.displaced_by or {}).items()))
    return f"{s.displaced_entities or 0:,}" + (f" ({by})" if by else "")


def _target(s: FeederStatus) -> Text | str:
    """The feeder's freshness target, flagged BEHIND when its data is older."""
    if s.freshness_target_s is None:
        return "-"
    target = f"{s.freshness_target_s / 60:.1f} min"
    return Text(f"{target} BEHIND", style="red") if s.behind_target else target


def _capacity_lines(statuses: list[FeederStatus]) -> list[Text]:
    """The daemon's verdicts on the freshness targets (one per shard with shards), in a line each."""
    seen: dict[str | None, CapacityReport] = {}
    for s in statuses:
        if s.capacity is not None:
            seen.setdefault(s.shard, s.capacity)
    return [_capacity_line(shard, report) for shard, report in sorted(seen.items(), key=lambda kv: kv[0] or "")]


def _capacity_line(shard: str | None, r: CapacityReport) -> Text:
    where = f"shard {shard}: " if shard else ""
    when = f" (daemon {r.reported_by}, {r.reported_at:%Y-%m-%d %H:%M:%S})" if r.reported_at else ""
    lanes = f"{counted(r.lanes, 'lane')}, a round takes {r.round_s:.1f} s"
    if r.reachable:
        return Text(f"{where}freshness targets held: {lanes}, the smallest target is {r.smallest_target_s:.0f} s{when}")
    need = (
        f"{r.lanes_needed} lanes needed (the host has {counted(r.cores, 'core')})"
        if r.lanes_needed is not None
        else f"no number of lanes will do: {', '.join(r.too_long)} alone outlast it"
    )
    behind = f"; behind for more than a round: {', '.join(r.behind)}" if r.behind else ""
    text = f"{where}FRESHNESS TARGETS UNREACHABLE: {lanes}, the smallest target is {r.smallest_target_s:.0f} s; "
    return Text(text + need + behind + when, style="red")


def _rows(s: FeederStatus) -> str:
    """The rows of the last success, and how many of its tables were kept unchanged (not sent) or sent their
    changed rows only."""
    if s.rows is None:
        return "-"
    notes = [f"{s.unchanged_tables} tables unchanged"] if s.unchanged_tables else []
    notes += [f"{s.changed_rows_tables} changed rows only"] if s.changed_rows_tables else []
    return f"{s.rows:,}" + (f" ({', '.join(notes)})" if notes else "")


def _age(s: FeederStatus, age: str) -> Text | str:
    """The data's age, flagged STALE in red when old, unless the feeder is paused (old on purpose)."""
    if not s.stale:
        return age
    return Text(f"{age} (paused)", style="yellow") if s.paused else Text(f"{age} STALE", style="red")


def _next_run(s: FeederStatus) -> Text | str:
    """The next scheduled run, or the feeder's pause: since when, by whom, why."""
    if s.paused:
        since = f" since {s.paused_since:%Y-%m-%d %H:%M:%S}" if s.paused_since else ""
        by = f" by {s.paused_by}" if s.paused_by else ""
        reason = f": {s.paused_reason}" if s.paused_reason else ""
        return Text(f"PAUSED{since}{by}{reason}", style="yellow")
    return s.next_run.strftime("%H:%M:%S") if s.next_run else "-"


def _shard(s: FeederStatus) -> str:
    """The shard whose history a row shows, and the other shards holding some of the feeder's history."""
    also = f" (history also on {', '.join(s.also_on)})" if s.also_on else ""
    return (s.shard or "-") + also


def _last_swap(s: FeederStatus) -> Text:
    """The last swap's wait and tries, and a red flag when swaps keep failing for locks."""
    parts = []
    if s.swap_attempts is not None:
        parts.append(f"waited {(s.swap_wait_ms or 0) / 1000:.1f} s, {counted(s.swap_attempts, 'try', 'tries')}")
    if s.cancelled_backends:
        parts.append(f"{counted(s.cancelled_backends, 'query', 'queries')} cancelled")
    if s.swaps_starved:
        flag = f"FAILING FOR LOCKS ({counted(s.swap_lock_failures or 0, 'run')} in a row)"
        return Text(", ".join([*parts, flag]), style="red")
    return Text(", ".join(parts) or "-")


def _last_run(s: FeederStatus) -> str:
    failures = f" ({s.failures} failures)" if s.failures else ""
    return (s.last_outcome or "-") + failures + (" [running]" if s.running else "")


def run_status(config: Config, *, as_json: bool, location: ConfigLocation) -> int:
    """Print the status, headed by the configuration file read (`location`; in JSON, each feeder's
    "configuration"); 1 if some configured feeder is stale and not paused, else 0."""
    statuses = asyncio.run(read_status(config))
    if as_json:
        read = {"configuration": str(location.whole_path)}
        print(json.dumps([asdict(s) | read for s in statuses], default=str))
    else:
        console = Console()
        print_table(_table(statuses, location), console)
        for line in _capacity_lines(statuses):
            console.print(line)
    return 1 if any(s.overdue for s in statuses) else 0
