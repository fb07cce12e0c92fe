"""Tests of fedload/superhub/: the load path (import, literals, swap, parents, pipeline), schema files and
bookkeeping in their own folders."""
