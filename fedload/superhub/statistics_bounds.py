"""What ANALYZE itself could write on the superhub: the bounds a feeder's carried column statistics must keep
(docs/statistics.md). Pure functions on a call's argument text, no database: the caller reads the superhub's limits
(each column's statistics target, its type's category, the partition's size and rows) from its catalog.

PostgreSQL's ANALYZE keeps at most `target` most common values and `target + 1` histogram bounds
(compute_scalar_stats), `10 * target` most common elements with 3 more frequencies (min, max, NULL elements;
tsvector 2), a distinct-element-count histogram of `max(target, 2) + 1` numbers (array_typanalyze.c), range
histograms of `target + 1` entries (rangetypes_typanalyze.c), and skips for its value lists any value wider than
`WIDTH_THRESHOLD` = 1024 bytes after detoasting (analyze.c). Frequencies are fractions of the sampled rows, so the
most common values' add up, with the NULLs', to at most 1. A stored value's width fits in a page.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["WIDTH_THRESHOLD", "ColumnLimits", "call_bytes_bound", "column_refusal"]

WIDTH_THRESHOLD = 1024  # analyze.c: wider values are left out of the value lists, after detoasting
_VARHDRSZ = 4  # the width ANALYZE measures counts the value's 4-byte header
_TEXT_FACTOR = 8  # a non-string value's text may be several times its stored width (hex bytea, timestamptz[])
_ELEMENT_BYTES = 2048  # an element of most_common_elems: a tsvector's lexeme is at most 2047 bytes
_TOLERANCE = 1e-3  # float4 rounding of up to 10,000 frequencies, each within 6e-8 of its value
_SHOWN_CHARS = 40  # of a refused number, in the reason logged
_CALL_BYTES = 64 << 10  # a call's names, identity arguments and scalars, generously
_REAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|NaN|-?Infinity")
# One element of a one-dimensional array literal as array_out writes it: quoted (backslash escapes) or bare.
_ELEMENT = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"|([^{}",\\\s]+)', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ColumnLimits:
    """What the superhub allows one column's statistics: its statistics target (attstattarget, else
    default_statistics_target), whether its values' (and elements') text is their stored form (type category S:
    text, varchar...), the partition's rows and bytes (pg_table_size), and the server's block size."""

    target: int
    string_values: bool
    string_elements: bool
    rows: int
    table_bytes: int
    block_size: int = 8192


_VERSIONS = (90200, 9_999_999)  # the server versions a carried call may name (pg_dump 18 reads 9.2 on)


def call_bytes_bound(target: int) -> int:
    """The longest statistics call ANALYZE's output could need at statistics target `target` on the superhub: every
    list at its longest, every entry at the width rule, quoted with every character escaped. A longer call is not
    parsed: its statistics are dropped unread."""
    entries = (2 * target + 1) + 2 * (target + 1)  # values and histogram bounds, or a range column's two histograms
    elements = 10 * target
    numbers = (target + 10 * target + 3 + max(target, 2) + 1) * 16  # frequencies and counts as float4 text
    return (
        _CALL_BYTES + entries * (2 * _TEXT_FACTOR * WIDTH_THRESHOLD + 3) + elements * (2 * _ELEMENT_BYTES + 3) + numbers
    )


def column_refusal(args: Mapping[str, str], limits: ColumnLimits) -> str | None:
    """Why a column's carried statistics (a pg_restore_attribute_stats call's arguments, as written) are more than
    ANALYZE could write on the superhub; None if they are within its bounds."""
    for check in (_version, _scalars, _values, _elements, _ranges):
        if (reason := check(args, limits)) is not None:
            return reason
    return None


def _scalars(args: Mapping[str, str], limits: ColumnLimits) -> str | None:
    null_frac = _number(args.get("null_frac", "0"))
    if not 0 <= null_frac <= 1:
        return f"null_frac {_shown(args['null_frac'])} is not in [0, 1]"
    if "correlation" in args and not -1 <= _number(args["correlation"]) <= 1:
        return f"correlation {_shown(args['correlation'])} is not in [-1, 1]"
    if "range_empty_frac" in args and not 0 <= _number(args["range_empty_frac"]) <= 1:
        return f"range_empty_frac {_shown(args['range_empty_frac'])} is not in [0, 1]"
    n_distinct = _number(args.get("n_distinct", "0"))
    if not -1 <= n_distinct <= max(limits.rows, 0):
        return f"n_distinct {_shown(args['n_distinct'])} is not in [-1, {limits.rows}] (the rows loaded)"
    if "avg_width" in args:
        return _width(int(args["avg_width"]), null_frac, limits)
    return None


def _version(args: Mapping[str, str], _limits: ColumnLimits) -> str | None:
    if "version" in args and not _is_server_version(args["version"]):
        return f"version {_shown(args['version'])} is not a server version from {_VERSIONS[0]} to {_VERSIONS[1]}"
    return None


def _is_server_version(text: str) -> bool:
    """Whether `text` is a `server_version_num` pg_dump 18 can dump statistics from (9.2 on): the call casts it to
    integer on the superhub, where a number out of range would fail the call, not refuse it."""
    return text.isascii() and text.isdigit() and len(text) <= 7 and _VERSIONS[0] <= int(text) <= _VERSIONS[1]


def _shown(text: str) -> str:
    """A feeder's number as a reason shows it: its start (`\\d+` has no length, a call holds megabytes)."""
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _width(avg_width: int, null_frac: float, limits: ColumnLimits) -> str | None:
    """avg_width: a stored value fits in a page, and the non-NULL values' widths fit in the partition's bytes."""
    stored = limits.rows * (1 - null_frac) * avg_width
    if avg_width < 0 or avg_width > limits.block_size or stored > limits.table_bytes:
        return (
            f"avg_width {avg_width} is more than the loaded data holds ({limits.table_bytes} bytes, {limits.rows} rows)"
        )
    return None


def _values(args: Mapping[str, str], limits: ColumnLimits) -> str | None:
    width = WIDTH_THRESHOLD - _VARHDRSZ if limits.string_values else _TEXT_FACTOR * WIDTH_THRESHOLD
    freqs = _listed("most_common_vals", "most_common_freqs", args, limits.target, width=width, extra=(0,))
    if isinstance(freqs, str):
        return freqs
    if sum(freqs) + _number(args.get("null_frac", "0")) > 1 + _TOLERANCE:
        return "most_common_freqs add up, with null_frac, to more than 1"
    bounds = args.get("histogram_bounds")
    reason = None if bounds is None else _list("histogram_bounds", bounds, limits.target + 1, width)
    return reason if isinstance(reason, str) else None


def _elements(args: Mapping[str, str], limits: ColumnLimits) -> str | None:
    width = _ELEMENT_BYTES if limits.string_elements else _TEXT_FACTOR * WIDTH_THRESHOLD
    # min, max (and, but for tsvector, NULL elements') frequencies follow the elements'
    freqs = _listed("most_common_elems", "most_common_elem_freqs", args, 10 * limits.target, width=width, extra=(2, 3))
    if isinstance(freqs, str):
        return freqs
    if "elem_count_histogram" in args:
        counts = _numbers("elem_count_histogram", args["elem_count_histogram"], max(limits.target, 2) + 1)
        if isinstance(counts, str):
            return counts
        if any(not 0 <= c < math.inf for c in counts):
            return "elem_count_histogram has a count that is not a finite number of at least 0"
    return None


def _listed(
    name: str, freqs_name: str, args: Mapping[str, str], most: int, *, width: int, extra: tuple[int, ...]
) -> list[float] | str:
    """The frequencies of a list of values (`name`, at most `most`, each at most `width` bytes) and theirs
    (`freqs_name`: one per value, then one of `extra` more), each in [0, 1]; [] for neither; else why not."""
    values, freqs = args.get(name), args.get(freqs_name)
    if values is None or freqs is None:
        return [] if values is None and freqs is None else f"{name} and {freqs_name} do not come together"
    if isinstance(count := _list(name, values, most, width), str):
        return count
    numbers = _numbers(freqs_name, freqs, most + max(extra))
    if isinstance(numbers, str):
        return numbers
    if len(numbers) - count not in extra:
        return f"{freqs_name} has not one frequency per entry of {name}"
    if any(not 0 <= n <= 1 for n in numbers):  # NaN too
        return f"{freqs_name} has a frequency that is not in [0, 1]"
    return numbers


def _ranges(args: Mapping[str, str], limits: ColumnLimits) -> str | None:
    for name in ("range_length_histogram", "range_bounds_histogram"):
        if name in args:
            width = WIDTH_THRESHOLD - _VARHDRSZ if limits.string_values else _TEXT_FACTOR * WIDTH_THRESHOLD
            if isinstance(reason := _list(name, args[name], limits.target + 1, 2 * width), str):  # two bounds each
                return reason
    return None


def _list(name: str, text: str, most: int, width: int) -> int | str:
    """How many entries the array literal `text` has, at most `most`, each at most `width` bytes; else why not."""
    if len(text) > 2 + most * (2 * width + 3):  # before reading it: longer than any such list can be written
        return f"{name} is longer ({len(text)} characters) than {most} entries of ANALYZE's width"
    entries = _entries(text, most)
    if entries is None:
        return f"{name} is not a one-dimensional array of at most {most} entries (statistics target)"
    if any(len(e.encode()) > width for e in entries):
        return f"{name} has an entry wider than ANALYZE keeps ({width} bytes)"
    return len(entries)


def _entries(text: str, most: int) -> list[str] | None:
    """The entries of a one-dimensional array literal as array_out writes it, unescaped; None if it is not one or
    has more than `most` (read no further than that)."""
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        return None
    out: list[str] = []
    position, end = 1, len(text) - 1
    while position < end:
        match = _ELEMENT.match(text, position, end)
        if match is None or len(out) == most:
            return None
        out.append(_ESCAPE.sub(r"\1", match[1]) if match[1] is not None else match[2])
        position = match.end()
        if position < end and (text[position] != "," or position + 1 == end):
            return None
        position += 1
    return out


def _numbers(name: str, text: str, most: int) -> list[float] | str:
    """A float4 array literal's numbers, at most `most`; else why not."""
    if len(text) > 2 + most * 32:
        return f"{name} is longer ({len(text)} characters) than {most} numbers"
    items = text[1:-1].split(",") if text != "{}" else []
    if len(items) > most:
        return f"{name} has {len(items)} numbers, more than {most} (statistics target)"
    if any(_REAL.fullmatch(i) is None for i in items):
        return f"{name} is not an array of numbers"
    return [float(i) for i in items]


def _number(text: str) -> float:
    """A real argument's value (NaN for one that is not a number: every bound refuses it)."""
    try:
        return float(text)
    except ValueError:
        return math.nan
