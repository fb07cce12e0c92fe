"""A binary section's head held to what the superhub asked of its table (fedload.superhub.binary_request): binary
data only for a table asked in binary, only for columns asked with a type binary COPY may load here, in the order
asked, each once (docs/trust.md, "Binary mode").

An honest agent (fedload/feeder/binary_plan.py) sends the columns asked that the feeder has, in the order asked (the
ones it lacks take the superhub's defaults), and names as unsent only feeder columns that were not asked. It falls
back to a text section wherever a column's type is not the one asked, and for a table asked as text.
"""

from __future__ import annotations

from fedload.errors import DumpError
from fedload.superhub.binary_receive import BinaryStart
from fedload.superhub.binary_request import AskedColumns

__all__ = ["check_binary_head"]


def check_binary_head(start: BinaryStart, asked: AskedColumns, *, feeder: str) -> None:
    """DumpError naming the feeder and the table if `start` is not a binary section the superhub could have been
    sent for a table it asked as `asked`."""
    if (problem := _problem(start, asked)) is not None:
        raise DumpError(
            f"table {start.table}: feeder {feeder} sent binary data {problem}: refused (the superhub checks a binary "
            "section against what it asked)"
        )


def _problem(start: BinaryStart, asked: AskedColumns) -> str | None:
    """What is wrong with the head, in words that follow "sent binary data"; None if nothing is."""
    if asked is None:
        return "for a table the superhub asked as text"
    if not start.columns:
        return "with no column list (a feeder table that shares no column with the superhub's must go in copy mode)"
    order = {name: i for i, (name, _) in enumerate(asked)}
    return _columns_problem(start.columns, asked, order) or _unsent_problem(start.unsent, order)


def _columns_problem(columns: tuple[str, ...], asked: tuple[tuple[str, int], ...], order: dict[str, int]) -> str | None:
    """Each column sent must be asked, in binary (a type OID other than 0), once, in the order asked."""
    oids = dict(asked)
    last, seen = -1, set()
    for name in columns:
        if name not in order:
            return f"for column {name}, which the superhub did not ask for"
        if oids[name] == 0:
            return f"for column {name}, whose type the superhub takes only as text"
        if name in seen:
            return f"with column {name} twice"
        if order[name] < last:
            return f"with column {name} out of the order asked ({', '.join(n for n, _ in asked)})"
        last = order[name]
        seen.add(name)
    return None


def _unsent_problem(unsent: tuple[str, ...], order: dict[str, int]) -> str | None:
    """An unsent column must be one of the feeder's that the superhub did not ask for, named once."""
    seen: set[str] = set()
    for name in unsent:
        if name in order:
            return f"naming column {name} unsent, which the superhub asked for"
        if name in seen:
            return f"naming column {name} unsent twice"
        seen.add(name)
    return None
