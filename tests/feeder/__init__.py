"""Tests of fedload/feeder/: the agent, its forced command, its zipapp and pg_dump's command line."""
