"""Tests of the superhub's load path: import, swap, schema files, shards, faults and hostile dumps."""
