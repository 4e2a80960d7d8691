"""Connecting to the host database from a libpq keyword/value or URI DSN."""


from __future__ import annotations

import re
from typing import Any

from proxy.db.layout import SchemaError

# --- connecting ----------------------------------------------------------------------

_KV = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*")


def parse_keyword_dsn(dsn: str) -> dict[str, str]:
    """Parse a libpq keyword/value connection string (``host=... port=... dbname='x y'``)."""
    out: dict[str, str] = {}
    i, n = 0, len(dsn)
    while True:
        while i < n and dsn[i].isspace():
            i += 1
        if i >= n:
            return out
        m = _KV.match(dsn, i)
        if not m:
            raise SchemaError(f"invalid connection string near {dsn[i:i + 20]!r}: expected keyword=value")
        key, i = m.group(1), m.end()
        value = []
        if i < n and dsn[i] == "'":
            i += 1
            while True:
                if i >= n:
                    raise SchemaError(f"invalid connection string: unterminated quoted value of {key}")
                c = dsn[i]
                if c == "\\" and i + 1 < n:
                    value.append(dsn[i + 1])
                    i += 2
                elif c == "'":
                    i += 1
                    break
                else:
                    value.append(c)
                    i += 1
        else:
            while i < n and not dsn[i].isspace():
                if dsn[i] == "\\" and i + 1 < n:
                    value.append(dsn[i + 1])
                    i += 2
                else:
                    value.append(dsn[i])
                    i += 1
        out[key] = "".join(value)


async def connect(dsn: str):
    """An asyncpg connection from a URL or a libpq keyword/value string."""
    import asyncpg

    if re.match(r"^postgres(ql)?://", dsn):
        return await asyncpg.connect(dsn)
    params = parse_keyword_dsn(dsn)
    kwargs: dict[str, Any] = {}
    if "connect_timeout" in params:
        kwargs["timeout"] = float(params.pop("connect_timeout"))
    if "dbname" in params:
        params["database"] = params.pop("dbname")
    for key in ("host", "port", "user", "password", "database", "passfile"):
        if key in params:
            kwargs[key] = params.pop(key)
    if "port" in kwargs:
        kwargs["port"] = int(kwargs["port"])
    if params:  # sslmode, sslrootcert, application_name, ...: asyncpg reads them from a URL's query
        from urllib.parse import urlencode

        return await asyncpg.connect("postgresql://?" + urlencode(params), **kwargs)
    return await asyncpg.connect(**kwargs)
