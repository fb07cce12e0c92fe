"""The bounds of carried column statistics (fedload.superhub.statistics_bounds), value by value: a number that is
no number (NaN, which every comparison calls false), infinite, negative or out of its range is refused, whichever
argument holds it. Through PostgreSQL: tests/superhub/test_statistics_carried.py."""

from __future__ import annotations

import pytest

from fedload.superhub.statistics_bounds import ColumnLimits, column_refusal

LIMITS = ColumnLimits(target=100, string_values=True, string_elements=True, rows=1000, table_bytes=1 << 20)
WITHIN = {  # what ANALYZE could write for a text[] column of 1000 rows
    "null_frac": "0.1",
    "avg_width": "9",
    "n_distinct": "-0.5",
    "most_common_vals": "{a,b}",
    "most_common_freqs": "{0.3,0.2}",
    "correlation": "0.5",
    "most_common_elems": "{x,y}",
    "most_common_elem_freqs": "{0.4,0.3,0.3,0.4,0}",
    "elem_count_histogram": "{1,1.5,2}",
    "range_empty_frac": "0",
    "version": "180000",
}
BEYOND = [
    *(
        ("version", value)
        for value in ("99999999999", "-180000", "0", "90100", "1" + "0" * 5000, "\uff11\uff18\uff10\uff10\uff10\uff10")
    ),
    *((name, value) for name in ("null_frac", "range_empty_frac") for value in ("NaN", "Infinity", "-0.1", "1.5")),
    *(("correlation", value) for value in ("NaN", "-Infinity", "1.01", "1e999")),
    *(("n_distinct", value) for value in ("NaN", "Infinity", "-1.5", "1001")),
    *(("avg_width", value) for value in ("-1", "9999999999")),
    *(("most_common_freqs", value) for value in ("{NaN,0.2}", "{Infinity,0.2}", "{-0.1,0.2}", "{0.3,1e999}")),
    *(("most_common_elem_freqs", v) for v in ("{NaN,0.3,0.3,0.4,0}", "{0.4,0.3,-Infinity,0.4,0}", "{2,0,0,0,0}")),
    *(("elem_count_histogram", value) for value in ("{1,NaN,2}", "{1,Infinity,2}", "{-1,1,2}")),
]


def test_statistics_within_analyzes_bounds_are_kept() -> None:
    """The control: every value of WITHIN is one ANALYZE could write, so each refusal below is its value's."""
    assert column_refusal(WITHIN, LIMITS) is None


@pytest.mark.parametrize(("name", "value"), BEYOND)
def test_a_value_out_of_its_range_is_refused(name: str, value: str) -> None:
    """NaN, an infinity, a negative or a too large value in any argument refuses the column's statistics, and the
    reason names the argument (the table is then analyzed instead, logged as `statistics.refused`)."""
    reason = column_refusal({**WITHIN, name: value}, LIMITS)
    assert reason is not None
    assert name in reason


def test_a_refused_numbers_text_is_not_logged_whole() -> None:
    """A real argument's digits have no length in the call's grammar: the reason shows their start only."""
    reason = column_refusal({**WITHIN, "null_frac": "2" + "0" * 1_000_000}, LIMITS)
    assert reason is not None
    assert len(reason) < 200
