"""Live progress of a sync on a terminal (rich), and the summary table printed at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fedload.results import FeederRun, Outcome, Phase, Progress, ProgressCallback

__all__ = ["dry_run_table", "live_progress", "progress_row", "summary_table"]


_COLUMNS = ("feeder", "phase", "received MB", "MB/s", "rows", "rows/s", "seconds", "ETA")


def progress_row(state: Progress, expected_bytes: int | None, now: float) -> list[str]:
    """One feeder's line: phase, MB received (of the expected size, when its last successful run gives one),
    rate, rows, rows/s, seconds so far and, while loading, the time left at the current rate."""
    seconds = max(now - state.started, 1e-6)
    rate = state.raw_bytes / seconds
    received = f"{state.raw_bytes / 1e6:.1f}"
    if expected_bytes:
        received += f" of ~{expected_bytes / 1e6:.1f}"
    return [
        state.feeder,
        state.phase,
        received,
        f"{rate / 1e6:.2f}",
        f"{state.rows:,}",
        f"{state.rows / seconds:,.0f}",
        f"{seconds:.1f}",
        _eta(state, expected_bytes, rate),
    ]


def _eta(state: Progress, expected_bytes: int | None, rate: float) -> str:
    if state.phase != Phase.LOAD or not expected_bytes or rate <= 0:
        return "-"
    left_s = max(expected_bytes - state.raw_bytes, 0) / rate
    return "almost done" if left_s < 1 else f"~{left_s:.0f} s" if left_s < 120 else f"~{left_s / 60:.0f} min"


def _progress_table(states: dict[str, Progress], expected: Mapping[str, int]) -> Table:
    table = Table(title="fedload sync", expand=False)
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column in ("feeder", "phase") else "right")
    now = time.monotonic()
    for state in states.values():
        table.add_row(*progress_row(state, expected.get(state.feeder), now))
    return table


@contextmanager
def live_progress(console: Console, expected: Mapping[str, int] | None = None) -> Iterator[ProgressCallback]:
    """A progress callback that redraws a per-feeder table at most a few times a second; `expected` holds the
    bytes each feeder sent in its last successful run, for the ETA."""
    states: dict[str, Progress] = {}
    sizes = expected or {}
    with Live(_progress_table(states, sizes), console=console, refresh_per_second=4, transient=True) as live:

        def update(state: Progress) -> None:
            states[state.feeder] = state
            live.update(_progress_table(states, sizes))

        yield update


def summary_table(runs: list[FeederRun]) -> Table:
    """Feeder, outcome, rows, MB, seconds, swap lock and error of each run."""
    table = Table(title="fedload sync summary")
    for column in ("feeder", "outcome"):
        table.add_column(column)
    for column in ("rows", "MB received", "seconds", "swap lock ms"):
        table.add_column(column, justify="right")
    table.add_column("error")
    for run in runs:
        lock = "" if run.swap_lock_ms is None else f"{run.swap_lock_ms:.1f}"
        rows, megabytes = f"{sum(run.rows.values()):,}", f"{run.raw_bytes / 1e6:.2f}"
        table.add_row(run.feeder, _outcome(run), rows, megabytes, f"{run.seconds:.1f}", lock, Text(run.error or ""))
    return table


def _outcome(run: FeederRun) -> Text:
    style = "green" if run.succeeded else "yellow" if run.outcome is Outcome.PAUSED else "red"
    outcome = Text(run.outcome, style=style)
    if run.rejected:
        outcome.append(f" ({sum(run.rejected.values()):,} rows rejected, see fedload.rejects)", style="yellow")
    return outcome


def dry_run_table(runs: list[FeederRun]) -> Table:
    """What each feeder's swap would have done; nothing was changed."""
    table = Table(title="fedload sync --dry-run: what a sync would do (nothing was changed)")
    table.add_column("feeder")
    table.add_column("would")
    for run in runs:
        for line in run.plan or (f"nothing: {run.error}",):
            table.add_row(run.feeder, Text(line))
    return table
