"""Module line counts and function-length statistics (median, p90, max) for fedload/ and transforms/.

A function's length is its line span (``end_lineno - lineno + 1``, decorators excluded), counted for every
``def`` and ``async def``, nested ones included.  Usage: ``uv run python tools/code_stats.py``.
"""

from __future__ import annotations

import ast
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedload", "transforms")


def function_lengths(path: Path) -> list[tuple[int, str]]:
    """Return (lines, qualified-ish name) for every function in one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            found.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.name}"))
    return found


def percentile(values: list[int], fraction: float) -> int:
    """Nearest-rank percentile of sorted values."""
    rank = max(1, round(fraction * len(values) + 0.5 - 1e-9))
    return values[min(rank, len(values)) - 1]


def main() -> None:
    """Print the statistics."""
    files = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    for path in files:
        if path.parts[-2] != "transforms":
            print(f"{len(path.read_text().splitlines()):6d} {path.relative_to(ROOT)}")
    for pkg in PACKAGES:
        pkg_files = [p for p in files if p.is_relative_to(ROOT / pkg)]
        total = sum(len(p.read_text().splitlines()) for p in pkg_files)
        print(f"{total:6d} total {pkg}/ ({len(pkg_files)} files)")
    found = sorted(f for path in files for f in function_lengths(path))
    lengths = [n for n, _ in found]
    print(
        f"functions: {len(lengths)}  median {statistics.median(lengths):g}  "
        f"p90 {percentile(lengths, 0.9)}  max {lengths[-1]} ({found[-1][1]})"
    )
    if "-v" in sys.argv:
        for n, name in found[-15:]:
            print(f"  {n:4d} {name}")


if __name__ == "__main__":
    main()
