"""The tests' shared fixtures, and the tally of the fault and adversarial tests.

Fixtures: `cluster` (a PostgreSQL cluster per module), `federation` (a superhub and three feeder databases on it),
`start_daemon` (`fedload daemon` processes, killed at the end), `sshd` (a real SSH server on loopback: each test
runs against OpenSSH's sshd, skipped where it is not installed unless FEDLOAD_REQUIRE_SSHD=1, and against
asyncssh's server, which needs no system package).

Tally: each fault or adversarial test names its category; the summary prints tried / survived.

A test asks for the `category` fixture and calls it with a name such as "fault:superhub-restart"; fuzz tests
may also count the inputs they tried with `category.inputs(n)`. A test "survived" when none of its phases failed;
a skipped test (say, a mount that is not allowed here) is not tried, and its category says how many were skipped.
"""

from __future__ import annotations

pytest_plugins = (
    "tests.support.fix_pg",
    "tests.support.fix_federation",
    "tests.support.fix_ssh",
    "tests.support.fix_tally",
    "tests.support.fix_skips",
)
