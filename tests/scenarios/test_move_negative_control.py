"""Negative control of the move's promise (docs/scale-out.md): a reader of the coordinator sees a moving feeder once
at every moment because the new shard is read through a filter view until the switch. With the filter taken out
(the coordinator reads the new shard's parent directly), the same reader sees the feeder twice."""

from __future__ import annotations

import asyncio

import pytest

from fedload.commands.move import move_feeder
from fedload.scaleout import coordinator
from fedload.superhub.schema import ParentTable
from tests.scenarios.test_feeder_move import AFTER, BEFORE, _moved_setup, _read_while
from tests.support.federation import Federation


def assert_seen_once(seen: list[str]) -> None:
    """Every query saw hub2 once: its rows from the old shard, then from the new one."""
    odd = [value for value in seen if value not in (BEFORE, AFTER)]
    assert odd == [], odd[:5]


async def test_negative_control_without_the_filter_a_moving_feeder_is_seen_twice(
    federation: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fedload feeder move hub2 --to s2` with the coordinator sabotaged to read every shard's parent directly (no
    filter view): while hub2 is loaded on s2 and still on s1, the reader sees it from both."""

    def unfiltered(self: object, parent: ParentTable, shard: str) -> tuple[str, str]:
        return parent.table.schema, parent.table.name

    monkeypatch.setattr(coordinator._Wanted, "relation", unfiltered)
    config, path = await _moved_setup(federation)
    code, seen = await _read_while(config, asyncio.to_thread(move_feeder, config, path, "hub2", "s2"))
    assert code == 0
    with pytest.raises(AssertionError):
        assert_seen_once(seen)
    assert "1:300,2:200,2:201,3:100" in seen, sorted(set(seen))
