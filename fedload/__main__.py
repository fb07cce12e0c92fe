"""`python -m fedload` and the `fedload` console script: the agent's commands straight to the agent, the rest to
the command line.

`fedload agent dump|ssh-command` runs once per feeder and run (the superhub starts it over SSH or locally), so it
goes to the agent's own entry without importing fedload.cli, whose parser and imports serve the superhub's
commands: issue #36, a run's fixed cost.
"""

from __future__ import annotations

import sys

from fedload.feeder.main import for_the_agent
from fedload.feeder.main import main as agent_main

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of `fedload`: exit 0 success, 1 the job or dump failed, 2 usage or configuration error."""
    words = sys.argv[1:] if argv is None else argv
    if for_the_agent(words):
        return agent_main(words, prog="fedload agent")
    from fedload.cli import main as cli_main  # noqa: PLC0415 - the superhub's command line, not the agent's

    return cli_main(words)


if __name__ == "__main__":
    sys.exit(main())
