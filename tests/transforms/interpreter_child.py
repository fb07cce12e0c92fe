"""What the transformer makes of each dump of a corpus: run by the test's own Python and, as a script, by others.

    python -E -s interpreter_child.py REPOSITORY CASES_PICKLE RESULTS_PICKLE

Standard library and `transforms` only, and Python 3.9 syntax: it runs on every interpreter the transformer claims.
"""

from __future__ import annotations

import pickle
import sys
from typing import Any, Optional

# dump, chunk size, rows per statement, statement bytes (also where a long INSERT goes on in pieces), remap document
Case = tuple[bytes, int, int, int, Optional[dict[str, Any]]]
Result = tuple[Any, ...]


def transformed(case: Case) -> Result:
    """The output and counts of the transform, or the error it raised; and the values of every tuple."""
    from transforms import Transformer, TransformError, TransformOptions, parse_remap  # noqa: PLC0415

    dump, chunk, rows_per_statement, statement_bytes, remap = case
    options = TransformOptions(rows_per_statement, statement_bytes, parse_remap(remap) if remap is not None else None)
    transformer = Transformer(options)
    out: list[bytes] = []
    try:
        for start in range(0, len(dump), chunk):
            out += transformer.feed(dump[start : start + chunk])
        out += transformer.close()
    except TransformError as exc:
        return ("error", type(exc).__name__, str(exc), values(dump, chunk))
    stats = transformer.stats
    return ("ok", b"".join(out), sorted(stats.rows.items()), sorted(stats.tables), values(dump, chunk))


def values(dump: bytes, chunk: int) -> list[object]:
    """Each INSERT's table and columns, and the values of each of its tuples, as the splitter finds them."""
    from transforms import DumpSplitter, TransformError, split_tuple  # noqa: PLC0415

    splitter = DumpSplitter()
    found: list[object] = []
    try:
        for start in range(0, len(dump), chunk):
            found += [_values(item, split_tuple) for item in splitter.feed(dump[start : start + chunk])]
        found += [_values(item, split_tuple) for item in splitter.close()]
    except TransformError as exc:
        found.append(str(exc))
    return [f for f in found if f is not None]


def _values(item: object, split_tuple: Any) -> object:
    insert = getattr(item, "insert", None)
    if insert is None:
        return None
    return (insert.table, insert.columns, [split_tuple(row) for row in insert.tuples])


def main(repository: str, cases_path: str, results_path: str) -> None:
    """Transform each case of the pickled list with `transforms` from `repository`; pickle the results."""
    sys.path.insert(0, repository)
    with open(cases_path, "rb") as file:
        cases = pickle.load(file)  # noqa: S301 - written by the test that runs this
    with open(results_path, "wb") as file:
        pickle.dump([transformed(case) for case in cases], file, protocol=4)


if __name__ == "__main__":
    main(*sys.argv[1:4])
