"""`fedload feeder remove` as an operator runs it: unknown names, confirmation, --yes, --table, status after."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

from fedload.results import Outcome
from tests.support.federation import Federation, config_toml, fedload, sync


async def _synced(fed: Federation) -> Path:
    """The federation synced once; its configuration file."""
    path = fed.tmp / "fedload.toml"
    path.write_text(config_toml(fed))
    assert all(run.outcome == Outcome.SUCCESS for run in await sync(fed.config()))
    return path


def _on_terminal(args: list[str], answer: bytes) -> tuple[int, str]:
    """Run fedload with a pseudo-terminal as stdin and stdout, answer its question; exit status and output."""
    primary, secondary = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "fedload", *args], stdin=secondary, stdout=secondary, stderr=secondary
    ) as child:
        os.close(secondary)
        output = b""
        deadline = time.monotonic() + 60
        while b"[y/N]" not in output and time.monotonic() < deadline:
            output += os.read(primary, 4096)
        os.write(primary, answer)
        with contextlib.suppress(OSError):  # EIO once the child has closed the terminal
            while chunk := os.read(primary, 4096):
                output += chunk
        status = child.wait(timeout=60)
    os.close(primary)
    return status, output.decode().replace("\r\n", "\n")


def _partitions(fed: Federation, key: int) -> str:
    return fed.superhub_sql(
        "SELECT string_agg(inhparent::regclass::text, ',' ORDER BY 1) FROM pg_inherits i JOIN pg_class c "
        f"ON c.oid = i.inhrelid WHERE pg_get_expr(c.relpartbound, c.oid) = 'FOR VALUES IN ({key})'"
    )


async def test_unknown_feeder_is_an_error_naming_the_known_ones(federation: Federation) -> None:
    """A name neither configured nor known to the superhub: exit 2, one line naming the known feeders."""
    config = await _synced(federation)
    result = fedload("feeder", "remove", "nosuch", "--yes", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr == (
        "fedload: feeder nosuch is not configured and the superhub holds no partitions or run history of it; "
        "known feeders: hub1, hub2, hub3\n"
    )
    assert result.stdout == ""


async def test_without_terminal_or_yes_nothing_is_dropped(federation: Federation) -> None:
    """stdin not a terminal and no --yes: a one-line error saying to pass --yes; the partitions stay."""
    config = await _synced(federation)
    result = fedload("feeder", "remove", "hub2", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr == "fedload: feeder remove hub2 asks for confirmation on a terminal; pass --yes to remove it\n"
    assert _partitions(federation, 2) == "contexts,hosts"


async def test_terminal_shows_tables_and_rows_and_asks(federation: Federation) -> None:
    """On a terminal the tables and row counts are shown; "n" keeps everything (exit 1), "y" drops them."""
    config = await _synced(federation)
    status, output = _on_terminal(["feeder", "remove", "hub2", "--config", str(config)], b"n\n")
    assert status == 1
    assert "  public.contexts: 2,000 rows\n  public.hosts: 200 rows\n  run history: 1 recorded run\n" in output
    assert "feeder hub2: nothing removed" in output
    assert _partitions(federation, 2) == "contexts,hosts"
    status, output = _on_terminal(["feeder", "remove", "hub2", "--config", str(config)], b"y\n")
    assert status == 0, output
    assert "feeder hub2: dropped 2 partitions" in output
    assert _partitions(federation, 2) == ""


async def test_removed_feeder_leaves_status(federation: Federation) -> None:
    """After removing an unconfigured feeder, status no longer lists it; a second removal is an unknown name."""
    config = await _synced(federation)
    config.write_text(config_toml(federation).split("[feeders.hub3]")[0])
    result = fedload("feeder", "remove", "hub3", "--yes", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "feeder hub3: dropped 2 partitions\n  public.contexts: 1,000 rows\n  public.hosts: 100 rows\n"
        "feeder hub3: forgot its run history (1 run)\n"
    )
    status = json.loads(fedload("status", "--json", "--config", str(config)).stdout)
    assert [s["feeder"] for s in status] == ["hub1", "hub2"]
    assert fedload("feeder", "remove", "hub3", "--yes", "--config", str(config)).returncode == 2


async def test_table_option_drops_only_those_tables_and_keeps_history(federation: Federation) -> None:
    """--table drops only the matching tables' partitions; the run history stays; a pattern matching nothing is
    an error."""
    config = await _synced(federation)
    result = fedload("feeder", "remove", "hub1", "--table", "public.contexts", "--yes", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "feeder hub1: dropped 1 partition",
        "  public.contexts: 3,000 rows",
        "public.contexts not in feeders.hub1.exclude_tables: the next sync of hub1 brings their data back",
    ]
    assert _partitions(federation, 1) == "hosts"
    assert federation.superhub_int("SELECT count(*) FROM fedload.runs WHERE feeder = 'hub1'") == 1
    nothing = fedload("feeder", "remove", "hub1", "--table", "public.nosuch", "--yes", "--config", str(config))
    assert nothing.returncode == 2
    assert "--table public.nosuch matches none of the superhub's tables" in nothing.stderr
