"""Running and scheduling: worker processes, the daemon, `fedload sync`, the schedule, systemd."""
