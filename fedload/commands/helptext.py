"""What `fedload --help` and each command's `--help` tell a user: a one-line summary, what it does, examples."""

from __future__ import annotations

from fedload.feeder.helptext import AGENT_COMMANDS, CommandHelp

__all__ = ["COMMANDS", "PROGRAM", "PROGRAM_EPILOG", "CommandHelp"]


PROGRAM = (
    "fedload gathers the PostgreSQL data of many feeder databases into one superhub database: each feeder's tables "
    "become its partitions of the superhub's tables, replaced atomically at every sync; a failed dump keeps the old "
    "data."
)
PROGRAM_EPILOG = """\
Try it locally with `fedload demo`. `fedload COMMAND --help` explains a command.
Global options (--config, -v, --log-format) go before or after the command.
Exit status: 0 success, 1 the job failed (some feeder, a bad dump, the superhub), 2 usage or configuration error."""

COMMANDS = {
    "transform": CommandHelp(
        "merge and remap a pg_dump plain-SQL dump, stdin to stdout",
        "Read a pg_dump plain-SQL dump on stdin and write it to stdout with consecutive single-row INSERTs merged "
        "into multi-row ones (much faster to load) and, with --remap, columns renamed, dropped or added per table. "
        "Needs no database.",
        """\
examples:
  pg_dump --data-only --column-inserts cfdb | fedload transform > merged.sql
  pg_dump --data-only --column-inserts cfdb | fedload transform --remap remap.toml | psql superhub""",
    ),
    "agent": CommandHelp(
        "commands that run on a feeder (the superhub starts them over SSH)",
        "Commands that run on a feeder host. The superhub starts `fedload agent dump` over SSH; run it by hand to "
        "check that a feeder can dump. `agent ssh-command` is the forced command for the superhub's key; "
        "`agent pack` builds the same agent as one file, for feeders without fedload installed.",
    ),
    "agent dump": AGENT_COMMANDS["dump"],
    "agent ssh-command": AGENT_COMMANDS["ssh-command"],
    "agent pack": CommandHelp(
        "build the agent as one file, a zipapp to copy onto feeders",
        "Write a zipapp holding the agent, the transformer and the stream writer, nothing else: it runs with a "
        "feeder's own python3 (3.9 or later) in isolated mode, with no package installed (zstd through the "
        "zstandard module or the zstd program if present, else gzip). The build is reproducible: the same fedload "
        "gives the same bytes.",
        """\
examples:
  fedload agent pack -o fedload-agent.pyz
  scp fedload-agent.pyz hub-eu1:/opt/fedload/ && ssh hub-eu1 python3 -I /opt/fedload/fedload-agent.pyz --version""",
    ),
    "sync": CommandHelp(
        "sync some or all feeders once, now, and print a summary",
        "Pull each named feeder's dump (default: every configured feeder but the paused ones, shown as paused), load "
        "it and swap it in as that feeder's partitions on the superhub, several feeders in parallel. A feeder whose "
        "dump fails keeps its old data. "
        "Live progress on a terminal, then a summary (tab-separated lines when piped, JSON with --json). "
        "Exit status 0 if every feeder synced (or was skipped as paused), 1 if some did not.",
        """\
examples:
  fedload sync                        # every configured feeder
  fedload sync hub1 hub2 --dry-run    # check two feeders' dumps, change nothing
  fedload --config /etc/fedload/fedload.toml sync --json | jq '.[] | select(.outcome != "success")'""",
    ),
    "daemon": CommandHelp(
        "keep every feeder in sync on its own schedule (the systemd service)",
        "Sync each feeder every interval_s seconds (with jitter), sooner past its freshness_target_s, the feeder "
        "most behind its target first when a lane frees (docs/freshness.md), back off from feeders that fail, "
        "reload the configuration on SIGHUP and stop gracefully on SIGTERM. Meant to run under systemd "
        "(deploy/fedload.service), where it logs JSON lines. With [shards], each feeder loads into its own shard; "
        "--shard NAME runs only that shard's feeders (a daemon per shard).",
    ),
    "status": CommandHelp(
        "show each feeder's last sync, data age and last error",
        "Read the superhub's run history: per feeder the last successful sync, the age of its data (STALE when "
        "older than stale_after_s), rows, duration, the last run's outcome and error, and the next scheduled run, "
        "under a title naming the configuration file read. "
        "A paused feeder shows its pause instead of its next run. "
        "With freshness targets: each feeder's target (BEHIND when its data is older) and the daemon's last verdict "
        "on its lanes (docs/freshness.md). "
        "Exit status 0 if no configured feeder is stale (a paused one does not count), 1 if one is (or the superhub "
        "cannot be read), 2 usage or configuration error.",
    ),
    "feeder": CommandHelp(
        "manage the feeders the superhub holds",
        "Commands that change which feeders' data the superhub holds, and whether their runs are scheduled.",
    ),
    "feeder remove": CommandHelp(
        "drop a feeder's data (its partitions) from the superhub",
        "Detach and drop every partition of the named feeder on the superhub, and forget its run history, so "
        "`fedload status` no longer shows its old runs (with --table: only those tables' partitions; the history "
        "stays). On a terminal it shows the tables and rows it will drop and asks first; scripts pass --yes. "
        "fedload never does this on its own: a feeder taken out of the configuration keeps its data until you run "
        "this. Exit status 0 removed, 1 declined or failed, 2 a name neither configured nor known to the superhub.",
        """\
examples:
  fedload feeder remove hub7                          # shows what it drops, asks
  fedload feeder remove hub7 --table public.__software --yes""",
    ),
    "feeder move": CommandHelp(
        "move a feeder to another shard, served from one shard at every moment",
        "With [shards]: load the feeder on shard SHARD, switch the coordinator to read it there (one transaction: "
        "its readers never see it missing or twice), set feeders.NAME.shard in the configuration file, then drop it "
        "from its old shard. A failure stops the move where it is, says where the feeder is served from, and keeps "
        "the old data until the new shard serves it; running the move again finishes it. Reload the daemons after "
        "(systemctl reload fedload): a daemon still running the old configuration is refused on the old shard. "
        "Exit status 0 moved, 1 the move stopped, 2 an unknown feeder or shard.",
        """\
examples:
  fedload feeder move hub7 --to s2""",
    ),
    "feeder pause": CommandHelp(
        "stop a feeder's scheduled runs, keeping its data, until resumed",
        "Record on the superhub (with [shards], the feeder's shard) that the named configured feeder is paused: "
        "every daemon and `fedload sync` without names skip it and say so (outcome paused), until `fedload feeder "
        "resume`; its data stays as it is, `status` shows the pause and does not count it as stale, and the stale "
        "and failing alerts ignore it. A run under way finishes; `fedload sync NAME` still runs it (you asked). "
        "Pausing a paused feeder keeps its start and replaces the reason (kept without --reason). "
        "Exit status 0 paused, 1 the superhub failed, 2 a name not configured.",
        """\
examples:
  fedload feeder pause hub7 --reason "hub7 upgrade, ticket OPS-42"
  fedload feeder resume hub7""",
    ),
    "feeder resume": CommandHelp(
        "end a feeder's pause: the daemons run it again",
        "Remove the named feeder's pause (`fedload feeder pause`): the daemons run it again at their next look, "
        "within its interval_s and at most 30 s. Resuming a feeder that is not paused says so. A feeder no longer "
        "configured is resumed on every superhub that holds a pause of it. "
        "Exit status 0 resumed or not paused, 1 the superhub failed, 2 a name neither configured nor paused.",
    ),
    "demo": CommandHelp(
        "try fedload locally: a superhub and three feeders, synced and explained",
        "Start throwaway PostgreSQL clusters (a superhub and three feeders with drifting schemas), sync them once "
        "with the live display and show what the superhub holds. Needs no PostgreSQL of your own; everything is "
        "removed afterwards unless --keep, which leaves the clusters running with a fedload.toml for them and prints "
        "the commands to try next; `fedload demo --stop DIR` stops them.",
    ),
    "check-config": CommandHelp(
        "check the configuration file and print every problem",
        "Read the configuration file and the files it names (ssh identity and known_hosts, remap files, the "
        "schema file) and print every problem on a line of its own, naming the key; touches no network. Its OK line "
        "names the file read and why (--config, $FEDLOAD_CONFIG, ./fedload.toml or the default). With "
        "--connect, also try the superhub and every feeder (SSH, agent and pg_dump versions), one OK or FAILED "
        "line each. Exit status 0 if all is well, 1 if --connect found a failure, 2 if the configuration is invalid.",
        """\
examples:
  fedload check-config --config /etc/fedload/fedload.toml
  sudo -u fedload fedload check-config --connect""",
    ),
}
