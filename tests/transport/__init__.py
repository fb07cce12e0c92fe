"""Tests of fedload/transport/: the SSH and local transports against real servers, and SSH through a bastion."""
