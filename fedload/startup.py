"""A command's start-up without Python's cyclic garbage collector, and its imports frozen before workers fork.

Importing the superhub's side (pydantic, asyncpg, asyncssh and cryptography, pglast) creates a few hundred thousand
objects, none of them garbage; the collector meanwhile walks them again and again as they accumulate (~0.05 CPU-s
of every `fedload sync`). `collector_paused()` turns it off for a block, as CPython's documentation of `gc.freeze`
advises for a process that forks; `freeze_imported()`, just before the fork, moves every object alive into the
permanent generation, so that neither the parent nor a forked worker walks them again, and a worker's collections
do not write to (and so copy) the pages it shares with the parent.

`no_pydantic_plugins()`: fedload's configuration uses no pydantic plugin, and looking for them (entry points of
every installed distribution, through importlib.metadata) costs ~0.05 CPU-s at the first model; an environment that
sets PYDANTIC_DISABLE_PLUGINS itself (empty: look for them) keeps its value.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator

__all__ = ["collector_paused", "freeze_imported", "no_pydantic_plugins"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection within the block (imports and reading the configuration); as before after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def freeze_imported() -> None:
    """Move every object alive now into the permanent generation: collections from now on walk only newer ones."""
    gc.freeze()


def no_pydantic_plugins() -> None:
    """Before pydantic's first model: it looks for no plugins, unless the environment says otherwise."""
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
