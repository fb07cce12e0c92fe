"""Scenarios across the sides, each a whole federation at work: faults mid-run, hostile dumps, no run that can
hang, shards and the coordinator's invariant, feeder moves (and their negative control), and round trips of
every pg_dump major through the transformer."""
