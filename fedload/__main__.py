"""`python -m fedload` and the `fedload` console script: the agent's commands straight to the agent, the rest to
the command line.

`fedload agent dump|ssh-command` runs once per feeder and run (the superhub starts it over SSH or locally), so it
goes to the agent's own entry without importing fedload.cli, whose parser and imports serve the superhub's
commands: issue #36, a run's fixed cost.

The process then ends without the interpreter's teardown (`exit_now`): freeing every module and object one by one
takes ~0.1-0.2 s of CPU after a sync (a process that has imported asyncpg, pydantic and rich), which nobody needs
once stdout and stderr are flushed, and which an agent started as a program (`python -m fedload agent dump`, over
SSH or by a custom `agent_command`) pays at every run.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import NoReturn

from fedload.feeder.main import for_the_agent
from fedload.feeder.main import main as agent_main

__all__ = ["exit_now", "main", "run"]


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


def exit_now(status: int) -> NoReturn:
    """End the process with `status` once stdout, stderr and logging are flushed, skipping the interpreter's teardown.

    Only where nothing else could still need it: with another thread alive (which a normal exit waits for), a
    profiler or tracer watching (`python -m cProfile -m fedload ...` writes its report at exit, coverage its data),
    or an output that cannot be flushed (a reader gone: Python reports it at exit), the process exits normally."""
    if threading.active_count() == 1 and sys.getprofile() is None and sys.gettrace() is None:
        try:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed pipe or stream: the normal exit reports it as it always did
            pass
        else:
            os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    run()
