"""Tests of fedload/superhub/bookkeeping/: the one connection a sync's run history goes through."""
