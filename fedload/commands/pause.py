"""`fedload feeder pause NAME [--reason TEXT]` and `fedload feeder resume NAME`: stop and restart a feeder's
scheduled runs without touching its data or its configuration (a feeder hub under maintenance, say).

The pause is a row of `fedload.paused` on the superhub that loads the feeder (with shards, its own shard, where its
run lock and history are too), so every daemon that runs it sees it, and it outlasts restarts. The daemons and a
`fedload sync` without names skip a paused feeder and say so; `fedload sync NAME` runs it (a person asked); a run
under way finishes. Pausing a paused feeder keeps its start and replaces its reason (kept without `--reason`);
resuming a feeder that is not paused says so. Both exit 0 then.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import socket

from fedload.config import Config
from fedload.errors import UsageError
from fedload.log import get_logger
from fedload.service.pauses import PAUSED_RECHECK_S
from fedload.superhub.bookkeeping import Pause, ensure_superhub, pause_feeder, read_pause, resume_feeder
from fedload.superhub.job import superhub_target, superhub_targets
from fedload.superhub.session import SuperhubTarget, superhub_session

__all__ = ["pause", "resume"]

log = get_logger()


def pause(config: Config, name: str, reason: str | None) -> int:
    """Pause the configured feeder `name` (UsageError for another name); 0."""
    if name not in config.feeders:
        configured = ", ".join(config.feeders) or "none"
        raise UsageError(f"feeder {name} is not configured, so it has no runs to pause; known feeders: {configured}")
    reason = (reason or "").strip() or None
    superhub = superhub_target(config, config.feeders[name].shard)
    now, before = asyncio.run(_pause(superhub, name, reason))
    log.info("feeder.paused", feeder=name, reason=now.reason, since=str(now.since), by=now.by, again=before is not None)
    if before is None:
        print(f"feeder {name}: {now.describe()}")
        print(
            "the daemons and `fedload sync` skip it until `fedload feeder resume "
            f"{name}` (a run under way finishes; `fedload sync {name}` still runs it)"
        )
    else:
        said = "now" if reason is not None else "kept"
        print(f"feeder {name} was already paused; {now.describe()} (reason {said})")
    return 0


def resume(config: Config, name: str) -> int:
    """End the pause of feeder `name`, configured or paused on some superhub (UsageError for another name); 0."""
    configured = config.feeders.get(name)
    targets = [superhub_target(config, configured.shard)] if configured else list(superhub_targets(config).values())
    ended = asyncio.run(_resume(targets, name))
    if configured is None and not ended:
        known = ", ".join(sorted(config.feeders)) or "none"
        raise UsageError(f"feeder {name} is not configured and not paused on the superhub; known feeders: {known}")
    if not ended:
        print(f"feeder {name} was not paused; nothing changed")
        return 0
    for pause_ended in ended:
        log.info("feeder.resumed", feeder=name, paused_since=str(pause_ended.since), reason=pause_ended.reason)
        print(f"feeder {name}: resumed (it was {pause_ended.describe()})")
    if configured is not None:
        within_s = min(configured.interval_s, PAUSED_RECHECK_S)
        print(f"the daemons run it again at their next look, within {within_s:g} s")
    return 0


async def _pause(superhub: SuperhubTarget, name: str, reason: str | None) -> tuple[Pause, Pause | None]:
    async with superhub_session(superhub) as conn:
        await ensure_superhub(conn)
        return await pause_feeder(conn, name, reason, _who())


async def _resume(targets: list[SuperhubTarget], name: str) -> list[Pause]:
    """The pauses ended, one per superhub of `targets` where the feeder was paused. A feeder no longer configured
    is looked for on every superhub, where fedload has set it up (none is created for that)."""
    ended = []
    for superhub in targets:
        async with superhub_session(superhub) as conn:
            if len(targets) == 1:
                await ensure_superhub(conn)
            elif await read_pause(conn, name) is None:
                continue
            if (gone := await resume_feeder(conn, name)) is not None:
                ended.append(gone)
    return ended


def _who() -> str:
    """Who pauses: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a container's numeric user)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"
