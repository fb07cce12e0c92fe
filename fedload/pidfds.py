"""Whether this kernel gives pidfds (Linux 5.3 and later): what the forked workers and the warm agents' zygote need
to learn of a child's exit without a child watcher."""

from __future__ import annotations

import os

__all__ = ["pidfds_work"]


def pidfds_work() -> bool:
    """True if a pidfd of this process can be opened (and it is closed again)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True
