"""The suite's helpers (clusters, a federation of feeders, SSH servers, faults, shards, schemas, interpreters) and
its fixtures, as plugins that tests/conftest.py loads."""
