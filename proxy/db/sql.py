"""Quoting for the SQL the seat generates: identifiers, qualified names, literals (the one quoting module)."""


from __future__ import annotations

# --- quoting -------------------------------------------------------------------


def quote_ident(name: str) -> str:
    """A double-quoted identifier (always quoted: names are literal and case-sensitive)."""
    if not name or "\0" in name:
        raise ValueError(f"not an identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def quote_qualified(name: str) -> str:
    """``table`` or ``schema.table``, each part quoted separately."""
    parts = name.split(".")
    if len(parts) > 2:
        raise ValueError(f"not a table name, optionally schema-qualified: {name!r}")
    return ".".join(quote_ident(p) for p in parts)


def quote_relation(name: str) -> str:
    """A relation name as the seat's catalog reads return it (already quoted, ``"s"."t"``), or
    ``table`` / ``schema.table`` to quote part by part."""
    if name.startswith('"'):
        return name
    return ".".join(quote_ident(p) for p in name.split("."))


def relation_name(name: str) -> str:
    """The table's own name, unquoted, in a relation name as :func:`quote_relation` takes it: ``"s"."t"`` and
    ``s.t`` give ``t``, ``"a.b"."x""y"`` gives ``x"y``."""
    if not name.endswith('"'):
        return name.rpartition(".")[2]
    i = len(name) - 2
    while i >= 0:  # back to the quote that opens the last part; "" inside it is a quote of the name
        if name[i] == '"':
            if i > 0 and name[i - 1] == '"':
                i -= 2
                continue
            return name[i + 1:-1].replace('""', '"')
        i -= 1
    raise ValueError(f"not a relation name: {name!r}")


def quote_literal(value: str) -> str:
    """A SQL string literal that reads the same whatever standard_conforming_strings says."""
    if "\0" in value:
        raise ValueError("a SQL literal cannot hold NUL")
    body = value.replace("'", "''")
    if "\\" in body:
        return "E'" + body.replace("\\", "\\\\") + "'"
    return "'" + body + "'"


def text_array_literal(values) -> str:
    """A ``text[]`` constant holding ``values`` (sorted, so the generated SQL is deterministic)."""
    items = ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in sorted(values))
    return quote_literal("{" + items + "}") + "::text[]"


def text_array_const(values, *, sort: bool = True) -> str:
    """A ``pg_catalog.text[]`` constant: for code that runs without a pinned search_path, where an
    unqualified type name could resolve to a temporary type of the caller's."""
    items = sorted(values) if sort else list(values)
    body = ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in items)
    return quote_literal("{" + body + "}") + "::pg_catalog.text[]"


def jsonb_literal(mapping: dict) -> str:
    """A ``jsonb`` constant of ``mapping`` (keys sorted, compact, so the generated SQL is deterministic)."""
    import json

    return quote_literal(json.dumps(dict(sorted(mapping.items())), separators=(",", ":"), ensure_ascii=False)) \
        + "::jsonb"


def jsonb_const(value_json: str) -> str:
    """A ``pg_catalog.jsonb`` constant from its JSON text (see :func:`text_array_const`)."""
    return quote_literal(value_json) + "::pg_catalog.jsonb"
