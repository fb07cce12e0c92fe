"""Runs caught mid-COPY: a feeder grown past several 1 MiB stream blocks, whose agent sends the first half of its
stream and hangs, so that a kill or cancel lands while the superhub's COPY has rows in flight (pg_stat_progress_copy
says how many), not inside the stream's first block, where no COPY has begun."""

from __future__ import annotations

import asyncio
import time

from tests.support.federation import AGENT, CONTEXT_COLS, HOST_COLS, Federation, write_script

_GROWTH = (
    "INSERT INTO contexts (hostkey, contextname) SELECT 'SHA=' || g, md5(g::text) || md5(random()::text) "
    "FROM generate_series(1, 30000) g"
)  # ~2.3 MB of dump text: three stream blocks, ~1.1 MB compressed
_COPY_IN_FLIGHT = (
    "SELECT coalesce(max(tuples_processed), 0) FROM pg_stat_progress_copy p JOIN pg_stat_activity a USING (pid) "
    "WHERE a.application_name = 'fedload {feeder}'"
)


HALF_STREAM_BYTES = 800_000  # of a grown feeder's compressed stream: past its first block, short of its end


def grow(fed: Federation, feeder: str = "hub1") -> None:
    """Give `feeder` 30,000 more contexts rows: its stream spans three 1 MiB blocks (~1.1 MB compressed)."""
    fed.cluster.psql(_GROWTH, dbname=fed.feeders[feeder])


def mid_copy_agent(fed: Federation, feeder: str = "hub1") -> str:
    """Grow `feeder` past several stream blocks; an agent command that sends the first half of its stream, then
    hangs (60 s): its run stays mid-COPY with rows in flight."""
    grow(fed, feeder)
    stream = fed.tmp / f"{feeder}.bin"
    return write_script(
        fed.tmp / f"mid_copy_{feeder}.sh",
        f'{AGENT} "$@" > {stream}\nhead -c $(( $(stat -c %s {stream}) / 2 )) {stream}; sleep 60\n',
    )


def rows_in_flight(fed: Federation, feeder: str = "hub1") -> int:
    """Rows the superhub's COPY for `feeder` has taken in so far (0 without a COPY under way)."""
    return int(fed.superhub_sql(_COPY_IN_FLIGHT.format(feeder=feeder)))


def wait_rows_in_flight(fed: Federation, feeder: str = "hub1", timeout_s: float = 120) -> int:
    """Wait until `feeder`'s COPY on the superhub has rows in flight; how many. The agent dumps all before it sends
    half, which on a loaded machine can take a while: the bound is generous."""
    deadline = time.monotonic() + timeout_s
    while (rows := rows_in_flight(fed, feeder)) == 0:
        assert time.monotonic() < deadline, f"no COPY of {feeder} with rows under way within {timeout_s} s"
        time.sleep(0.1)
    return rows


async def rows_in_flight_soon(fed: Federation, feeder: str = "hub1", timeout_s: float = 120) -> int:
    """`wait_rows_in_flight` for a test's event loop."""
    return await asyncio.to_thread(wait_rows_in_flight, fed, feeder, timeout_s)


def feeder_rows(fed: Federation, key: int = 1) -> tuple[str, str]:
    """A feeder's rows of every table on the superhub (digests)."""
    where = f"WHERE hub_id = {key}"
    return fed.digest(fed.superhub, "hosts", HOST_COLS, where), fed.digest(
        fed.superhub, "contexts", CONTEXT_COLS, where
    )
