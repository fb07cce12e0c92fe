"""Tests of fedload/superhub/: the load path (import, literals, swap, parents, pipeline), with schema files and
bookkeeping in folders of their own; the scenarios across the sides are in tests/scenarios/."""
