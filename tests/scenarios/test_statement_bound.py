"""A feeder that never ends a statement or a COPY row: the superhub holds at most `superhub.max_statement_bytes`
of it, then refuses the dump at once (old data kept, no staging left, the run failed as a bad dump naming the
feeder, the table and the setting), in copy and inserts mode, with the agent (zstd or gzip blocks) and without it
(pg_dump | gzip), with the sync's peak memory under its usual plus twice the bound. A large value within the bound
still loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedload.config import DEFAULT_RECEIVED_STATEMENT_BYTES, Config
from fedload.errors import ErrorKind
from fedload.results import Outcome
from tests.support.federation import (
    AGENT,
    HOST_COLS,
    Federation,
    last_outcome,
    staging_leftovers,
    sync,
)

MIB = 1 << 20
HOSTILE_BYTES = 2 << 30  # what a hostile feeder would send, if nobody stopped it
# The start of an item that never ends, then "x;" for ever (a `;` makes the splitter scan a statement whole, the
# worst case for its time): a statement, or a COPY data row.
OPENINGS = {
    "statement": b"INSERT INTO public.hosts (hostkey, name) VALUES ('k', '",
    "row": b"COPY public.hosts (hostkey, name) FROM stdin;\nk\t",
}
WHAT = {"statement": "a statement", "row": "a COPY data row"}
# A feeder's agent_command (framed stream, its blocks in `compression`) or pg_dump (agent = false: the superhub
# runs `pg_dump | gzip -1`) that writes OPENING then "x" until HOSTILE_BYTES or a closed pipe.
AGENT_SCRIPT = """#!{python}
import sys
from fedload.stream import MAX_BLOCK_BYTES, Header, StreamEncoder
encoder = StreamEncoder(Header({compression!r}, {dump_mode!r}, "evil", "15", ["public.*"]))
out = sys.stdout.buffer
opening = {opening!r}
out.write(encoder.start() + encoder.data((opening + b"x;" * MAX_BLOCK_BYTES)[:MAX_BLOCK_BYTES]))  # one block
frames = encoder.data(b"x;" * (4 << 20))  # eight blocks of 1 MiB, ~60 bytes each in zstd, ~1 KiB in gzip
for _ in range({total} // (8 << 20)):
    out.write(frames)
"""
PG_DUMP_SCRIPT = """#!{python}
import sys
out = sys.stdout.buffer
out.write({opening!r})
block = b"x;" * (4 << 20)
for _ in range({total} // (8 << 20)):
    out.write(block)
"""
# (feeder settings, the script's template and compression)
MODES: dict[str, tuple[dict[str, object], str, str]] = {
    "copy-zstd": ({"dump_mode": "copy", "compression": "zstd"}, AGENT_SCRIPT, "zstd"),
    "inserts-gzip": ({"dump_mode": "inserts", "compression": "gzip"}, AGENT_SCRIPT, "gzip"),
    "no-agent-copy": ({"dump_mode": "copy", "agent": False}, PG_DUMP_SCRIPT, ""),
    "no-agent-inserts": ({"dump_mode": "inserts", "agent": False}, PG_DUMP_SCRIPT, ""),
}


def hostile_feeder(fed: Federation, mode: str, item: str) -> dict[str, object]:
    """hub1's settings for a feeder in `mode` that sends an `item` that never ends: its agent_command, or without
    the agent its pg_dump."""
    settings, template, compression = MODES[mode]
    script = fed.tmp / f"hostile-{mode}-{item}"
    script.write_text(
        template.format(
            python=sys.executable,
            compression=compression,
            dump_mode=settings["dump_mode"],
            opening=OPENINGS[item],
            total=HOSTILE_BYTES,
        )
    )
    script.chmod(0o755)
    where = {"agent_command": [str(script)]} if template is AGENT_SCRIPT else {"pg_dump": str(script)}
    return {**settings, **where, "exclude_tables": ["public.contexts"]}


def bounded(config: Config, limit: int) -> Config:
    """`config` with superhub.max_statement_bytes = `limit`."""
    return config.model_copy(update={"superhub": config.superhub.model_copy(update={"max_statement_bytes": limit})})


@pytest.mark.parametrize("item", list(OPENINGS))
@pytest.mark.parametrize("mode", list(MODES))
async def test_an_item_that_never_ends_is_refused_at_the_bound(federation: Federation, mode: str, item: str) -> None:
    """Past the bound, the run fails at once as a bad dump that names the feeder, the table and the setting; the
    feeder's old data stays and no staging is left."""
    fed, limit = federation, 16 * MIB
    assert (await sync(bounded(fed.config(), limit), "hub1"))[0].outcome == Outcome.SUCCESS
    before = fed.digest(fed.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1")
    started = time.monotonic()
    (run,) = await sync(bounded(fed.config(**hostile_feeder(fed, mode, item)), limit), "hub1")
    seconds = time.monotonic() - started
    assert run.outcome == Outcome.FAILED
    assert run.error_kind is ErrorKind.DUMP, run.error
    assert run.error == (
        f"feeder hub1, table public.hosts: {WHAT[item]} at dump line {1 if item == 'statement' else 2} is larger "
        f"than superhub.max_statement_bytes = {limit} (16 MiB): refused as a bad dump; raise the setting if the "
        "feeder's values are really that large"
    )
    assert seconds < 30, f"refused after {seconds:.1f} s"
    assert fed.digest(fed.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1") == before
    assert staging_leftovers(fed) == 0
    assert last_outcome(fed) == Outcome.FAILED


def peak_rss_mib(config: Path) -> tuple[int, float]:
    """`fedload sync` of the feeders of `config`: its exit status and the peak resident set of it and its children
    (wait4's ru_maxrss: the largest of them), MiB."""
    argv = [*AGENT.split(), "sync", "--config", str(config)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss / 1024


def one_feeder_toml(fed: Federation, **feeder: object) -> Path:
    """A configuration file with hub1 alone, with `feeder` settings, run in the sync's own process."""
    settings = {
        "key": 1,
        "transport": "local",
        "database": fed.cluster.conninfo(fed.feeders["hub1"]),
        "pg_dump": fed.cluster.install.tool("pg_dump"),
        "exclude_tables": ["public.contexts"],
        **feeder,
    }
    lines = [
        "[superhub]",
        f"dsn = {json.dumps(fed.cluster.dsn(fed.superhub))}",
        'tables = ["public.*"]',
        f"schema_file = {json.dumps(str(fed.tmp / 'schema.sql'))}",
        "worker_processes = 0",
        "[feeders.hub1]",
        *(f"{key} = {json.dumps(value)}" for key, value in settings.items()),
    ]
    path = fed.tmp / f"one-feeder-{len(feeder)}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("mode", ["copy-zstd", "no-agent-inserts"])
def test_peak_memory_stays_under_the_usual_plus_one_and_a_half_bounds(federation: Federation, mode: str) -> None:
    """At the default bound, the sync that refuses a 2 GiB statement does so within seconds and peaks under a
    normal sync's peak plus one and a half times the bound (less than twice, as required)."""
    fed, limit_mib = federation, DEFAULT_RECEIVED_STATEMENT_BYTES // MIB
    fed.config()  # writes the schema file
    status, usual = peak_rss_mib(one_feeder_toml(fed))
    assert status == 0
    started = time.monotonic()
    status, peak = peak_rss_mib(one_feeder_toml(fed, **hostile_feeder(fed, mode, "statement")))
    seconds = time.monotonic() - started
    assert status == 1
    assert last_outcome(fed) == Outcome.FAILED
    print(f"{mode}: usual {usual:.0f} MiB, refusing a 2 GiB statement {peak:.0f} MiB in {seconds:.1f} s")
    # Twice the bound is what joining bytes would cost (measured 241 MiB over the usual with 128 MiB): the held
    # item grows in place, and costs about the bound (measured 105 MiB over the usual).
    assert peak < usual + 1.5 * limit_mib, f"peak {peak:.0f} MiB, usual {usual:.0f} MiB, bound {limit_mib} MiB"
    assert seconds < 60, f"refused after {seconds:.1f} s"


async def test_a_value_within_the_bound_loads(federation: Federation) -> None:
    """A 6 MiB text value loads under an 8 MiB bound, as COPY data and as an INSERT, with the agent and without."""
    fed = federation
    db = fed.feeders["hub2"]
    fed.cluster.psql("UPDATE hosts SET name = repeat('0123456789abcdef', 393216) WHERE hostkey = 'SHA=1'", dbname=db)
    for settings in ({"dump_mode": "copy"}, {"dump_mode": "inserts"}, {"dump_mode": "inserts", "agent": False}):
        (run,) = await sync(bounded(fed.config(**settings), 8 * MIB), "hub2")
        assert run.outcome == Outcome.SUCCESS, (settings, run.error)
        assert fed.digest(fed.superhub, "hosts", HOST_COLS, "WHERE hub_id = 2") == fed.digest(db, "hosts", HOST_COLS)
    assert fed.superhub_int("SELECT max(length(name)) FROM hosts WHERE hub_id = 2") == 6 * MIB
