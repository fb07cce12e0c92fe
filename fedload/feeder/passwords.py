"""Connection string passwords out of logged text: standard library only, for the agent (zipapp) and the superhub."""

from __future__ import annotations

import re

__all__ = ["without_passwords"]

# A libpq connection string's password: keyword `password=value` (quoted or not, also in a URI's query), or a URI's
# `user:password@`.
_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&']+)|(://[^:/@\s]*:)[^\s/]*@", re.IGNORECASE)


def without_passwords(text: str) -> str:
    """`text` with every connection string password in it replaced by `***`: for command lines that are logged."""
    return _PASSWORD.sub(lambda m: f"{m[1]}***" if m[1] else f"{m[3]}***@", text)
