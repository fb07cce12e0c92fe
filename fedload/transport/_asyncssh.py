"""asyncssh, imported with `ctypes.util.find_library` looking only in the dynamic linker's cache.

asyncssh looks for optional C libraries as it is imported (nettle for the UMAC MACs, liboqs for post-quantum key
exchange). On Linux `find_library` asks `ldconfig -p`, and for a library not there goes on to run gcc and ld to
search their paths: ~0.04 CPU-s of every `fedload sync` where liboqs is not installed, for a library that
`ctypes` could load only from the linker's paths anyway. Here it asks the cache alone (ctypes' own lookup, its
first step); where ctypes has no such step (not Linux), it is left as it is.
"""

from __future__ import annotations

import contextlib
import ctypes.util
from collections.abc import Iterator

__all__ = ["asyncssh"]


@contextlib.contextmanager
def _linker_cache_only() -> Iterator[None]:
    """`ctypes.util.find_library` is ctypes' `ldconfig -p` lookup for the block (the process's, so: one thread)."""
    in_cache = getattr(ctypes.util, "_findSoname_ldconfig", None)
    if in_cache is None:
        yield
        return
    find_library = ctypes.util.find_library
    ctypes.util.find_library = in_cache
    try:
        yield
    finally:
        ctypes.util.find_library = find_library


with _linker_cache_only():
    import asyncssh
