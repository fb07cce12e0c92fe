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

`dump_buffers_reused()`: the receiving side allocates and frees a few buffers of about a block (1 MiB) per block of
dump (the inflated block, asyncpg's message, the socket transport's buffer). glibc's malloc maps such a buffer with
mmap and unmaps it when freed (or trims the heap's top above 2x that size), so the next one faults in its pages
afresh from the kernel, zeroed: ~0.1 CPU-s of system time per 250 MB of dump. Fixed thresholds above a block keep
them on the heap and reuse the pages; they are within the bounds glibc's own dynamic threshold may reach (32 MiB,
and trimming at twice that), so a process holds at most that much more freed memory. Elsewhere than glibc on Linux
it does nothing.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator

__all__ = ["collector_paused", "dump_buffers_reused", "freeze_imported", "no_pydantic_plugins"]

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 16 << 20  # above the largest block a receiver accepts (4 MiB) and asyncpg's copy of it
_TRIM_THRESHOLD_BYTES = 32 << 20


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


def dump_buffers_reused() -> bool:
    """Buffers of a block's size stay on the heap once freed (glibc on Linux only: see the module's docstring);
    whether malloc took both thresholds."""
    if sys.platform != "linux":
        return False
    import ctypes  # noqa: PLC0415 - only here; asyncssh's import has loaded it already

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: no such tuning
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    mapped = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    trimmed = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
    return bool(mapped and trimmed)
