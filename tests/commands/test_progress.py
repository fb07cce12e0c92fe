"""Progress that informs: per feeder phase, bytes, rows, rates, and an ETA from the feeder's last successful run."""

from __future__ import annotations

import os

from fedload.commands.progress import progress_row
from fedload.commands.sync import expected_sizes
from fedload.superhub.pipeline import Progress
from tests.support.federation import Federation, config_toml, on_terminal, sync


def test_row_shows_rates_and_eta_from_the_expected_size() -> None:
    """Half of a 100 MB dump in 10 s: 5 MB/s, about 10 s left; no expected size or not loading: no ETA."""
    state = Progress("hub1", phase="load", raw_bytes=50_000_000, dump_bytes=400_000_000, rows=120_000, started=0.0)
    assert progress_row(state, 100_000_000, now=10.0) == [
        "hub1",
        "load",
        "50.0 of ~100.0",
        "5.00",
        "120,000",
        "12,000",
        "10.0",
        "~10 s",
    ]
    assert progress_row(state, None, now=10.0)[2:] == ["50.0", "5.00", "120,000", "12,000", "10.0", "-"]
    state.phase = "swap"
    assert progress_row(state, 100_000_000, now=10.0)[-1] == "-"
    state.phase, state.raw_bytes = "load", 1_000_000
    assert progress_row(state, 1_000_000_000, now=10.0)[-1] == "~166 min"  # 999 MB left at 0.1 MB/s


async def test_expected_sizes_come_from_the_last_successful_run(federation: Federation) -> None:
    """Before any run nothing is expected; after one, each feeder's received bytes of its last success."""
    config = federation.config()
    assert (await expected_sizes(config, ["hub1"])) == {}
    runs = {run.feeder: run for run in await sync(config)}
    assert (await expected_sizes(config, ["hub1", "hub2"])) == {
        "hub1": runs["hub1"].raw_bytes,
        "hub2": runs["hub2"].raw_bytes,
    }


async def test_sync_on_a_terminal_shows_the_live_table(federation: Federation) -> None:
    """`fedload sync` on a terminal draws phase, MB of the expected size, rates and ETA while it runs."""
    config = federation.tmp / "fedload.toml"
    config.write_text(config_toml(federation))
    await sync(federation.config())
    status, text = on_terminal(["sync", "--config", str(config)], env={**os.environ, "COLUMNS": "160"})
    assert status == 0
    for header in ("phase", "received MB", "MB/s", "rows/s", "ETA"):
        assert header in text
    assert " of ~" in text
