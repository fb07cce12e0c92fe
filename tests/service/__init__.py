"""Tests of running and scheduling: worker processes, the daemon, the schedule, metrics, runs that cannot hang."""
