"""Live progress of a sync on a terminal (rich), and the summary table printed at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fedload.pipeline import FeederRun, Progress, ProgressCallback

__all__ = ["dry_run_table", "live_progress", "summary_table"]


def _progress_table(states: dict[str, Progress]) -> Table:
    table = Table(title="fedload sync", expand=False)
    for column in ("feeder", "phase", "received MB", "dump MB", "rows", "rows/s", "seconds"):
        table.add_column(column, justify="left" if column in ("feeder", "phase") else "right")
    for state in states.values():
        seconds = max(time.monotonic() - state.started, 1e-6)
        table.add_row(
            state.feeder,
            state.phase,
            f"{state.raw_bytes / 1e6:.1f}",
            f"{state.dump_bytes / 1e6:.1f}",
            f"{state.rows:,}",
            f"{state.rows / seconds:,.0f}",
            f"{seconds:.1f}",
        )
    return table


@contextmanager
def live_progress(console: Console) -> Iterator[ProgressCallback]:
    """A progress callback that redraws a per-feeder table at most a few times a second."""
    states: dict[str, Progress] = {}
    with Live(_progress_table(states), console=console, refresh_per_second=4, transient=True) as live:

        def update(state: Progress) -> None:
            states[state.feeder] = state
            live.update(_progress_table(states))

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
    outcome = Text(run.outcome, style="green" if run.outcome == "success" else "red")
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
