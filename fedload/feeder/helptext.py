"""What the agent's commands tell a user in `--help`: `fedload agent dump|ssh-command` and the zipapp's."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["AGENT_COMMANDS", "CommandHelp"]


class CommandHelp(NamedTuple):
    """The summary in the command list, the description atop the command's help, and its examples."""

    summary: str
    description: str
    examples: str = ""


AGENT_COMMANDS = {
    "dump": CommandHelp(
        "dump the feeder's tables as a compressed, self-checking stream on stdout",
        "Run pg_dump on this feeder for the given tables, pass its output through the transformer and a compressor, "
        "and write a fedload stream on stdout. The stream ends with pg_dump's exit status and a checksum, so the "
        "superhub tells a complete dump from a broken one; if pg_dump fails, its message is also printed on stderr "
        "and the exit status is 1. Extra pg_dump arguments (connection options such as --host) may follow a '--'. "
        "zstd comes from the zstandard module, else the zstd program, else the stream falls back to gzip (logged).",
        """\
examples:
  fedload agent dump --database cfdb --table 'public.__*' > /dev/null && echo 'this feeder can dump'
  fedload agent dump --database cfdb --table public.__hosts -- --host /run/postgresql | wc -c""",
    ),
    "serve": CommandHelp(
        "run the dumps a kept SSH connection asks for, one process for many runs",
        "Started by the superhub on its kept SSH connection to this feeder (through `agent ssh-command` where the "
        "key has a forced command, which checks every request against its allowlist), it reads one `agent dump` "
        "request per line on stdin, runs each in a child forked from this process (no interpreter start per run) "
        "and writes its stream on stdout in frames, each dump ending with its exit status and stderr's tail. It "
        "ends when stdin does. Not for use by hand.",
    ),
    "ssh-command": CommandHelp(
        "the forced command for the superhub's key in a feeder's authorized_keys",
        'Run by sshd for the superhub\'s key (command="..." in authorized_keys), it reads the request from '
        "SSH_ORIGINAL_COMMAND: it answers the version probes of `fedload check-config --connect`, runs `agent dump` "
        "if the database, tables, pg_dump, its arguments and the INSERT sizes are within the allowlist given here "
        "(or in @FILE, one argument per line), and refuses anything else with one line on stderr and exit status 2.",
        """\
examples (authorized_keys):
  command="fedload agent ssh-command --database cfdb --allow-table 'public.__*'",restrict ssh-ed25519 AAAA...
  command="python3 -I /opt/fedload/fedload-agent.pyz ssh-command @/etc/fedload/agent.args",restrict ssh-...""",
    ),
}
