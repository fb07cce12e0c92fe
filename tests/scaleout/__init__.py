"""Tests of fedload/scaleout/: the coordinator's upkeep and its login to shards that want a password."""
