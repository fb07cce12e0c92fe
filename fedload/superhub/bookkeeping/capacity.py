"""The daemon's freshness verdict (`fedload.capacity`, one row): whether its lanes hold every feeder within its
freshness target, with the measured round time and what it would take (docs/freshness.md); `fedload status` shows
it beside each feeder with a target."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import asyncpg

__all__ = ["CapacityReport", "forget_capacity", "read_capacity", "store_capacity"]

_STORE = """
INSERT INTO fedload.capacity AS c (one, reachable, round_s, lanes, lanes_needed, cores, smallest_target_s, behind,
                                   too_long, reported_by, reported_at)
VALUES (true, $1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $9, now())
ON CONFLICT (one) DO UPDATE SET reachable = excluded.reachable, round_s = excluded.round_s, lanes = excluded.lanes,
    lanes_needed = excluded.lanes_needed, cores = excluded.cores, smallest_target_s = excluded.smallest_target_s,
    behind = excluded.behind, too_long = excluded.too_long, reported_by = excluded.reported_by,
    reported_at = excluded.reported_at
"""
_READ = (
    "SELECT reachable, round_s, lanes, lanes_needed, cores, smallest_target_s, behind, too_long, reported_by, "
    "reported_at FROM fedload.capacity"
)


@dataclass(frozen=True, slots=True)
class CapacityReport:
    """The daemon's last verdict on the freshness targets, as `status` shows it."""

    reachable: bool
    round_s: float  # the time to run every feeder once with the daemon's lanes
    lanes: int  # the runs it may have at once
    lanes_needed: int | None  # to hold the smallest target; None: no number will do (a run outlasts it)
    cores: int  # the daemon host's CPUs
    smallest_target_s: float
    behind: tuple[str, ...] = ()  # feeders past their target for more than a round
    too_long: tuple[str, ...] = ()  # feeders whose run alone outlasts the smallest target
    reported_by: str | None = None  # host:pid of the daemon
    reported_at: datetime | None = None


async def store_capacity(conn: asyncpg.Connection, report: CapacityReport) -> None:
    """Record the daemon's verdict, replacing the one before."""
    await conn.execute(
        _STORE,
        report.reachable,
        report.round_s,
        report.lanes,
        report.lanes_needed,
        report.cores,
        report.smallest_target_s,
        json.dumps(list(report.behind)),
        json.dumps(list(report.too_long)),
        report.reported_by,
    )


async def forget_capacity(conn: asyncpg.Connection) -> None:
    """No verdict any more (no feeder has a target)."""
    await conn.execute("DELETE FROM fedload.capacity")


async def read_capacity(conn: asyncpg.Connection) -> CapacityReport | None:
    """The daemon's last verdict, None if it never gave one."""
    r = await conn.fetchrow(_READ)
    if r is None:
        return None
    return CapacityReport(
        reachable=r["reachable"],
        round_s=r["round_s"],
        lanes=r["lanes"],
        lanes_needed=r["lanes_needed"],
        cores=r["cores"],
        smallest_target_s=r["smallest_target_s"],
        behind=tuple(json.loads(r["behind"])),
        too_long=tuple(json.loads(r["too_long"])),
        reported_by=r["reported_by"],
        reported_at=r["reported_at"],
    )
