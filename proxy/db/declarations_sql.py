"""The SQL of the operator's declarations (ADR 0010): ``<schema>.declared_v2(t2 text, p jsonb) RETURNS jsonb``.

For the v2 type ``t2`` (the row's type *after* the codemap mapped it), it
applies the declarations of :mod:`proxy.artifacts.declarations` to the payload
``p``, before the projection walks it:

1. each alias ``a -> b``: when ``p`` holds ``a`` and not ``b``, ``a``'s value
   moves to ``b``; when both are present nothing moves (the projection then
   decides about ``a``, as without declarations);
2. each legacy value ``k = v``: when ``k`` is still absent, it is added.

A payload that is not a JSON object, a type without declarations, and every
type when there are none at all get ``p`` back, the same datum.  Aliases of one
type are independent by construction (a source is never a declared key, a
target always is, and no two aliases share a target), so each is decided on
the stored payload and all are applied at once.

The body is one SQL ``CASE`` expression over the parameters (no ``SET``, not
``STRICT``, ``IMMUTABLE``), so PostgreSQL inlines the call into the statement
that makes it, as long as the argument for ``p`` is cheap (a column, or a
parameter): ``p`` is read more than once, and PostgreSQL does not inline a
function whose argument used twice is an expensive expression (it then calls
it, with the same result).  An inlined body is parsed under the *caller's* search_path, in which the
caller's temporary schema comes first for type names: so every operator, function and type is
schema-qualified (``pg_catalog.jsonb``, ``pg_catalog.text[]``), and every one is immutable
(``jsonb_set``, not the stable ``jsonb_build_object``): PostgreSQL inlines an IMMUTABLE function only when its
body is immutable too.
"""

from __future__ import annotations

import json
import re

from proxy.db.sql import quote_literal, text_array_const

FUNCTION = "declared_v2"
SIGNATURE = "declared_v2(text, jsonb)"


def _jsonb(value) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return f"{quote_literal(text)}::pg_catalog.jsonb"


def _has(key: str) -> str:
    return f"p OPERATOR(pg_catalog.?) {quote_literal(key)}"


def _type_expr(d) -> str:
    """The declarations of one type applied to ``p`` (an object): ``p`` itself when none of them applies."""
    sources = [a for a, _ in d.aliases]
    legacy = [k for k, _ in d.legacy]
    keep = ["COALESCE(pg_catalog.jsonb_typeof(p) OPERATOR(pg_catalog.<>) 'object', true)"]
    nothing = []
    if sources:
        nothing.append(f"NOT (p OPERATOR(pg_catalog.?|) {text_array_const(sources)})")
    if legacy:
        nothing.append(f"p OPERATOR(pg_catalog.?&) {text_array_const(legacy)}")
    keep.append(" AND ".join(nothing) if len(nothing) == 1 else "(" + " AND ".join(nothing) + ")")
    moved = "p"
    if d.aliases:
        applies = [f"{_has(a)} AND NOT {_has(b)}" for a, b in d.aliases]
        removed = ", ".join(f"CASE WHEN {c} THEN {quote_literal(a)} END" for c, (a, _) in zip(applies, d.aliases))
        added = " OPERATOR(pg_catalog.||) ".join(
            f"CASE WHEN {c} THEN pg_catalog.jsonb_set('{{}}'::pg_catalog.jsonb, {text_array_const([b])}, "
            f"p OPERATOR(pg_catalog.->) {quote_literal(a)}) ELSE '{{}}'::pg_catalog.jsonb END" for c, (a, b) in zip(applies, d.aliases))
        moved = f"(p OPERATOR(pg_catalog.-) ARRAY[{removed}]::pg_catalog.text[]) OPERATOR(pg_catalog.||) {added}"
    if d.legacy:
        moved = f"{_jsonb(dict(d.legacy))} OPERATOR(pg_catalog.||) ({moved})"
    return f"CASE WHEN {' OR '.join(keep)} THEN p\n         ELSE {moved} END"


def declared_v2_body(decl) -> str:
    """The function's body: ``SELECT p`` without declarations, else one ``CASE`` over ``t2``."""
    if not decl.types:
        return "SELECT p"
    branches = "\n".join(f"    WHEN t2 OPERATOR(pg_catalog.=) {quote_literal(t)} THEN {_type_expr(d)}"
                         for t, d in sorted(decl.types.items()))
    return f"SELECT CASE\n{branches}\n    ELSE p END"


def declarations_sql(schema: str, decl) -> str:
    """``CREATE OR REPLACE FUNCTION <schema>.declared_v2(t2 text, p jsonb)`` for the declarations ``decl``.

    Pure: the same declarations give the same text.  ``schema`` is a plain lower-case identifier
    (``openwop_seat``), written unquoted as the rest of the seat's generated SQL writes it."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", schema):
        raise ValueError(f"declarations_sql: schema must be a plain lower-case identifier, got {schema!r}")
    body = declared_v2_body(decl)
    tag, n = "$ow$", 0
    while tag in body:  # a declared key or value holding the quote's tag: another tag
        n += 1
        tag = f"$ow{n}$"
    return (f"\nCREATE OR REPLACE FUNCTION {schema}.{FUNCTION}(t2 text, p jsonb)\n"
            f"RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE\n"
            f"AS {tag}\n{body}\n{tag};\n"
            f"COMMENT ON FUNCTION {schema}.{SIGNATURE} IS {quote_literal('openwop-seat declarations ' + decl.digest)};\n")


__all__ = ["FUNCTION", "SIGNATURE", "declarations_sql", "declared_v2_body"]
