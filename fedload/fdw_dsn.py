"""A shard's dsn as the coordinator's postgres_fdw options (docs/scale-out.md, "The coordinator").

postgres_fdw takes every libpq connection option as a server option but `user` and the secret ones, which belong to
user mappings, and but those it sets itself (`client_encoding`, `fallback_application_name`). So a shard's dsn
carries to its foreign server what it says of where and how to connect (host, port, dbname, TLS, timeouts,
keepalives, GSSAPI, target_session_attrs, application_name ...), and its user to the PUBLIC user mapping. Not
carried: the password and the passfile (the password reaches the coordinator's server only through
`coordinator.fdw_passfile`, a file on its host). Refused, by `check-config`: a secret fedload never writes
(`sslpassword`), the options postgres_fdw sets itself, and anything libpq does not know (asyncpg takes unknown
parameters as server settings; postgres_fdw cannot).

    server, user = fdw_options("postgresql://loader@db1/hub?sslmode=verify-full")
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["SERVER_OPTIONS", "dsn_problems", "fdw_options"]

SERVER_OPTIONS = frozenset(  # libpq's connection options postgres_fdw accepts on a server (PostgreSQL 13 to 18)
    [
        "host",
        "hostaddr",
        "port",
        "dbname",
        "options",
        "application_name",
        "connect_timeout",
        "service",
        "target_session_attrs",
        "load_balance_hosts",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "sslmode",
        "sslnegotiation",
        "sslcompression",
        "sslcert",
        "sslkey",
        "sslcertmode",
        "sslrootcert",
        "sslcrl",
        "sslcrldir",
        "sslsni",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "min_protocol_version",
        "max_protocol_version",
        "requirepeer",
        "require_auth",
        "channel_binding",
        "gssencmode",
        "krbsrvname",
        "gsslib",
        "gssdelegation",
    ]
)
_ALIASES = {"database": "dbname"}  # asyncpg's spelling
_NOT_CARRIED = frozenset({"user", "password", "passfile"})  # user: the mapping; the others: fdw_passfile
_REFUSED = {
    "sslpassword": "a secret fedload never writes into the coordinator",
    "client_encoding": "postgres_fdw sets it itself",
    "fallback_application_name": "postgres_fdw sets it itself",
    "replication": "postgres_fdw reads tables, not a replication stream",
}


def _parts(dsn: str) -> tuple[dict[str, str], str]:
    """The dsn's settings (the URI's parts and its query), and its scheme."""
    url = urlsplit(dsn)
    query = {_ALIASES.get(k, k): v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
    netloc = url.netloc.rpartition("@")[2]
    host, _, port = netloc.rpartition(":") if ":" in netloc and not netloc.endswith("]") else (netloc, "", "")
    parts = {
        "host": unquote(host).removeprefix("[").removesuffix("]"),
        "port": port,
        "dbname": unquote(url.path.lstrip("/")),
        "user": unquote(url.username or ""),
    }
    return {k: v for k, v in parts.items() if v} | {k: v for k, v in query.items() if v}, url.scheme


def dsn_problems(dsn: str) -> list[str]:
    """Why the dsn cannot be carried to a foreign server as written; one sentence each, none if it can."""
    settings, scheme = _parts(dsn)
    if scheme not in ("postgresql", "postgres"):
        return [f"a shard's dsn must be a postgresql:// URI for the coordinator, not {scheme or dsn[:20]}..."]
    problems = []
    for key in sorted(settings):
        if key in _REFUSED:
            problems.append(f"{key} cannot be carried to the coordinator's foreign server: {_REFUSED[key]}")
        elif key not in SERVER_OPTIONS | _NOT_CARRIED:
            problems.append(f"{key} is not a libpq connection option, so the coordinator's postgres_fdw cannot use it")
    return problems


def fdw_options(dsn: str) -> tuple[dict[str, str], str | None]:
    """The foreign server's options the dsn carries, and its user (for the user mapping), if any."""
    settings, _ = _parts(dsn)
    first = [k for k in ("host", "hostaddr", "port", "dbname") if k in settings]  # where, then how
    order = first + [k for k in settings if k not in first and k in SERVER_OPTIONS]
    return {k: settings[k] for k in order}, settings.get("user")
