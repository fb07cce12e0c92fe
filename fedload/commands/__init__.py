"""The operator's commands behind the command line: status, admin, check-config, demo, and their output."""
