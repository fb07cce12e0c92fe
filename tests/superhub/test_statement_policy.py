"""The importer's statement policy: which statements and psql commands of a dump it lets through, without a database."""

from __future__ import annotations

import pytest

from fedload.errors import DumpError
from fedload.superhub.importer import _check_meta, _check_statement
from transforms import MetaCommand, Statement


@pytest.mark.parametrize(
    "text",
    [
        b"SET statement_timeout = 0;",
        b"SET lock_timeout = 0;",
        b"SET idle_in_transaction_session_timeout = 0;",
        b"SET client_encoding = 'UTF8';",
        b"SET standard_conforming_strings = on;",
        b"set Standard_Conforming_Strings TO ON;",
        b"SET SESSION check_function_bodies = false;",
        b"SET xmloption = content;",
        b"SET client_min_messages = warning;",
        b"SET row_security = off;",
        b"SET default_tablespace = '';",
        b"SET default_table_access_method = heap;",
        b"SELECT pg_catalog.set_config('search_path', '', false);",
        b"SELECT pg_catalog.setval('public.ticket_no_seq', 42, true);",
        b"SELECT pg_catalog.setval('public.\"we''ird\"', -1, false);",
    ],
)
def test_statements_pg_dump_writes_are_accepted(text: bytes) -> None:
    """The settings and calls pg_dump writes around the data pass the policy."""
    _check_statement(Statement(text, line=3, offset=40))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"SET standard_conforming_strings = off;", "dump line 7: the dump sets standard_conforming_strings = off"),
        (b"SET client_encoding = 'LATIN1';", "dump line 7: the dump sets client_encoding = 'latin1', which fedload"),
        (b"SET search_path = fedload_parts, public;", "statement fedload does not accept: 'SET search_path"),
        (b"SET SESSION AUTHORIZATION postgres;", "statement fedload does not accept: 'SET SESSION AUTHORIZATION"),
        (b"SET role = postgres;", "dump line 7: the dump sets role = postgres, which fedload refuses"),
        (b"COMMIT;", "dump line 7: the dump contains a statement fedload does not accept: 'COMMIT;'"),
        (b"DROP TABLE public.contexts;", "statement fedload does not accept: 'DROP TABLE public.contexts;'"),
        (b"DO $$ BEGIN PERFORM pg_sleep(1); END $$;", "does not accept: 'DO $$ BEGIN PERFORM pg_sleep(1); END $$;'"),
        (b"SELECT pg_catalog.set_config('search_path', 'evil', false);", 'does not accept: "SELECT pg_catalog'),
        (b"SELECT pg_catalog.setval('s', 1, true); DROP TABLE t;", 'does not accept: "SELECT pg_catalog.setval'),
        (b"SELECT pg_sleep(30);", "does not accept: 'SELECT pg_sleep(30);'"),
        (b"SELECT 1 /*" + b"x" * 100 + b"*/;", "does not accept: 'SELECT 1 /*" + "x" * 49 + "...'"),
    ],
)
def test_other_statements_are_refused_naming_the_line(text: bytes, message: str) -> None:
    """Anything else is a DumpError naming the dump line and showing the statement's start."""
    with pytest.raises(DumpError) as caught:
        _check_statement(Statement(text, line=7, offset=100))
    assert message in str(caught.value)
    assert str(caught.value).startswith("dump line 7: the dump ")


@pytest.mark.parametrize("text", [b"\\restrict abcDEF123\n", b"\\unrestrict abcDEF123\n", b"\\restrict K"])
def test_pg_dumps_restrict_commands_are_accepted(text: bytes) -> None:
    """pg_dump's `\\restrict KEY` and `\\unrestrict KEY` lines pass."""
    _check_meta(MetaCommand(text, line=1, offset=0))


@pytest.mark.parametrize(
    "text",
    [
        b"\\copy public.hosts from '/etc/passwd'\n",
        b"\\i /etc/passwd\n",
        b"\\! touch /tmp/x\n",
        b"\\restrict abc; DROP TABLE t\n",
        b"\\restrict\n",
        b"\\gexec\n",
    ],
)
def test_other_psql_commands_are_refused(text: bytes) -> None:
    """Every other psql backslash command is a DumpError naming its line and the command."""
    with pytest.raises(DumpError) as caught:
        _check_meta(MetaCommand(text, line=12, offset=300))
    first = text.decode().splitlines()[0]
    assert str(caught.value) == f"dump line 12: the dump contains a psql command fedload does not accept: {first!r}"
