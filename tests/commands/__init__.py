"""Tests of the operator's commands: the command line, status, admin, check-config, the demo."""
