"""`python -m fedload` and the `fedload` console script: the agent's commands straight to the agent, the rest to
the command line.

`fedload agent dump|ssh-command` runs once per feeder and run (the superhub starts it over SSH or locally), so it
goes to the agent's own entry without importing fedload.cli, whose parser and imports serve the superhub's
commands: issue #36, a run's fixed cost.

The process then ends without the interpreter's teardown (`fedload.feeder.main.exit_now`, which the zipapp's
entry uses too): freeing every module and object one by one takes ~0.1-0.2 s of CPU after a sync (a process that
has imported asyncpg, pydantic and rich), which nobody needs once stdout and stderr are flushed, and which an agent
started as a program (`python -m fedload agent dump`, over SSH or by a custom `agent_command`) pays at every run.
"""

from __future__ import annotations

import sys
from typing import NoReturn

from fedload.feeder.main import exit_now, for_the_agent
from fedload.feeder.main import main as agent_main

__all__ = ["main", "run"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of `fedload`: exit 0 success, 1 the job or dump failed, 2 usage or configuration error."""
    words = sys.argv[1:] if argv is None else argv
    if for_the_agent(words):
        return agent_main(words, prog="fedload agent")
    from fedload.cli import main as cli_main  # noqa: PLC0415 - the superhub's command line, not the agent's

    return cli_main(words)


def run() -> NoReturn:
    """The process's entry (the console script, `python -m fedload`): `main`, then `exit_now` with its status."""
    exit_now(main())


if __name__ == "__main__":
    run()
