"""The systemd notify protocol (sd_notify) over $NOTIFY_SOCKET: readiness, watchdog, reload, stopping.

Written out rather than pulled in: it is one datagram per message, and a no-op outside systemd.
"""

from __future__ import annotations

import contextlib
import os
import socket

__all__ = ["notify", "watchdog_interval_s"]


def notify(*states: str) -> bool:
    """Send states such as "READY=1" to systemd; False when not run by systemd (or it did not answer)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract socket namespace
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall("\n".join(states).encode())
        return True
    return False


def watchdog_interval_s() -> float | None:
    """How often to send WATCHDOG=1 (half of WatchdogSec), or None when no watchdog is set for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2
