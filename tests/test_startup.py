"""A command's start-up settings (fedload.startup): what each changes in the process, seen from outside."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import textwrap

import pytest

# Blocks a little larger each time, their pages touched: glibc maps each one afresh (its dynamic threshold rises
# only to the size just freed) unless the thresholds are fixed above them; then the heap's pages are reused.
_GROWING_BLOCKS = """
    import resource
    from fedload.startup import dump_buffers_reused
    applied = {apply} and dump_buffers_reused()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for k in range(32):
        buffer = bytearray(b"x" * ((4 << 20) + k * (64 << 10)))
        del buffer
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(*, apply: bool) -> tuple[str, int]:
    """Whether the setting was applied, and the page faults of the growing blocks, in a new interpreter."""
    code = textwrap.dedent(_GROWING_BLOCKS.format(apply=apply))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    applied, faults = done.stdout.split()
    return applied.decode(), int(faults)


@pytest.mark.skipif(
    sys.platform != "linux" or os.confstr("CS_GNU_LIBC_VERSION") is None or not ctypes.util.find_library("c"),
    reason="glibc's malloc on Linux only",
)
def test_block_sized_buffers_are_reused_once_freed() -> None:
    """With dump_buffers_reused, block-sized buffers freed and allocated again reuse the heap's pages: a tenth of
    the page faults of the same allocations without it, where glibc maps each one afresh."""
    applied, reused = _faults(apply=True)
    _, mapped = _faults(apply=False)
    assert applied == "True"
    assert reused * 10 < mapped, (reused, mapped)
