"""Transports from the superhub to its feeders: SSH (asyncssh) and a local subprocess."""

from fedload.transport.base import FeederProcess, Transport

__all__ = ["FeederProcess", "Transport"]
