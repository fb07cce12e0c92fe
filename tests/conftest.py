"""The suite's plugins: its fixtures and hooks live in tests/support/fix_*.py, loaded here as psycopg's suite does.

- fix_pg: `cluster` (a PostgreSQL 15, else the lowest installed, cluster per module) and the `pg_major(N, ...)`
  marker: the test runs once per major named, as its module-scoped `pg_major` parameter (`pg_install` is that
  major's install, `major_cluster` a cluster of it for the module, `cluster` itself when of that major). A major
  that is not installed is skipped before any fixture starts, or fails where FEDLOAD_REQUIRE_MAJORS lists it.
- fix_federation: `federation` (a superhub and three feeder databases on `cluster`), `start_daemon` (`fedload
  daemon` processes, killed at the end).
- fix_ssh: `sshd`, a real SSH server on loopback: each test runs against OpenSSH's sshd (skipped where it is not
  installed, unless FEDLOAD_REQUIRE_SSHD=1) and against asyncssh's server, which needs no system package.
- fix_tally: `category`: each fault or adversarial test names its category ("fault:superhub-restart"; fuzz tests
  may count their inputs with `category.inputs(n)`) and the run ends with a tried / survived line per category.
  A test survived when none of its phases failed; a skipped test is not tried, and its category counts it skipped.
- fix_skips: where FEDLOAD_NO_SKIPS=1 (CI), a skipped test fails with its reason.

A test that awaits fedload is `async def` (pytest-asyncio's auto mode runs it on a loop of its own); helpers return
typed values (`superhub_int`, `psql_bool`, `last_outcome`) and runs are compared with `Outcome` members, psql's
text and the enum's strings being kept for the JSON and text the commands print, which are the contract.
"""

from __future__ import annotations

pytest_plugins = (
    "tests.support.fix_pg",
    "tests.support.fix_federation",
    "tests.support.fix_ssh",
    "tests.support.fix_tally",
    "tests.support.fix_skips",
)
