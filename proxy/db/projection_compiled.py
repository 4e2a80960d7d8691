"""The compiled projection: per stored type, straight-line SQL for the payloads the walk would barely touch.

:mod:`proxy.db.projection_sql` holds the projection as one generic engine (``project_row`` →
``project_v2`` → ``project_obj_with``), a PL/pgSQL walk over a shape table: exact, and 35–130 µs per
era-2 row.  This module generates ``payload_v2``, the function the major-2 view calls per era-2 row,
as a *compiled* projection: for each stored type, the statements the walk would run for that
type's shape, specialised at generation time, behind a guard that holds exactly when that
specialisation is what the walk does.  A payload the guard does not admit goes to the engine
(``project_row``), so the two agree on every input by construction; the engine stays the
projection's definition, and the tests compare the two row by row.

What a type's compiled branch does, in the engine's order (``project_v2``):

* the operator's declarations for the v2 type (``declared_v2``: key aliases, legacy values), when
  the declarations name the type;
* ``run.started`` without ``owner``: the legacy Subject of the run's tenant (looked up only then);
* keys the shape does not declare: none (the common case: nothing to do); in a closed, hatched
  shape, all of them hatch keys (kept in place), or none of them (boxed under the carrier in one
  step: the declared keys picked out, the rest under the carrier); in a closed shape without the
  hatch: never (the engine refuses them);
* required ``nodeId`` / ``runId`` filled from the row's columns.

and the guard sends to the engine every payload where the walk does more: a ``type`` key at any
depth (nested type mapping), a declared key whose nested shape could change or refuse something
(computed from the shape graph), ``engineVersion`` as a string, a stored ``owner``, an interrupt
``kind`` outside the v2 enum, unions, patterns other than the hatch.  ``approval.requested`` in its
v1 shape (RFC 0186 §A.3) has a compiled path of its own (:func:`approval_v1`).  A non-object
payload is returned as stored, as the engine does.

The dispatch on the stored type is a balanced tree of ``IF`` over ``t COLLATE "C"`` (seven
comparisons for the pinned codemap, not a chain of 117), and every statement is a PL/pgSQL simple
expression, so a compiled row costs a few jsonb operations and no SPI call.  ``payload_v2`` is
PL/pgSQL on purpose: parsed and planned once per session, never inlined into the reading statement,
whose planning time it would otherwise grow (see docs/payload-projection.md).

Each compiled branch is a function of its own (``payload_v2__<type>``, :func:`type_function`), which
``payload_v2``'s tree calls: PostgreSQL compiles a PL/pgSQL function whole at its first call in a backend, and
the 117 branches in one function were 360 KB of source, about 10 ms of a fresh backend's first projected row
and 2 MiB of every projecting backend's memory. A backend now compiles the tree and the branches of the types
it meets (ADR 0011's addendum).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import orjson

from proxy.artifacts.payload_shapes import HATCH_PATTERN, ObjectShape
from proxy.db.projection_sql import (
    APPROVAL_RENAMES,
    APPROVAL_TOP,
    INTERRUPT_KINDS,
    LEGACY_ISSUER,
    LEGACY_SUBJECT_ID,
    interrupt_kind_types,
)
from proxy.db.sql import jsonb_const, quote_literal, text_array_const

# The hatch as jsonpath predicates over a key, equal to HATCH_PATTERN (``^(openwop-|x-|vendor\.)``).
HATCH_PREFIXES = ("openwop-", "x-", "vendor.")
assert HATCH_PATTERN == r"^(" + "|".join(p.replace(".", r"\.") for p in HATCH_PREFIXES) + ")"
_HATCH_KEY = " || ".join(f'@.key starts with "{p}"' for p in HATCH_PREFIXES)
HATCH_KEY_PATH = f"$.keyvalue() ? ({_HATCH_KEY})"  # some top-level key is a hatch key
OTHER_KEY_PATH = f"$.keyvalue() ? (!({_HATCH_KEY}))"  # some top-level key is not


def renamed_type_path(renamed) -> str:
    """A jsonpath that finds a renamed v1 type as the value of a ``type`` key at any depth: where the
    engine's ``map_nested_types`` could change something (it skips hatch values; this does not, so a
    renamed type under a hatch key goes to the engine, which leaves it)."""
    names = " || ".join(f"@ == {json.dumps(t)}" for t in sorted(renamed))
    return f"lax $.**.type ? ({names})" if names else "lax $.**.type ? (false)"


def trivial_shapes(shapes: dict[str, ObjectShape]) -> set[int]:
    """The ids of the shapes whose walk leaves every value as it is and refuses nothing.

    Such a shape is open, no union, and every nested, item and bound shape below it is trivial too.
    The graph can be cyclic: start from "every shape trivial" and remove until nothing changes.
    """
    every: dict[int, ObjectShape] = {}

    def collect(shape: ObjectShape) -> None:
        if id(shape) in every:
            return
        every[id(shape)] = shape
        for child in children(shape):
            collect(child)

    for shape in shapes.values():
        collect(shape)
    trivial = {i for i, s in every.items() if s.open and not s.union and not s.unprojectable}
    changed = True
    while changed:
        changed = False
        for i in list(trivial):
            if any(id(c) not in trivial for c in children(every[i])):
                trivial.discard(i)
                changed = True
    return trivial


def children(shape: ObjectShape) -> list[ObjectShape]:
    out = [*shape.nested.values(), *shape.items.values(), *shape.union]
    for _key, bound in shape.discriminated.values():
        out.extend(bound.values())
    return out


# A row the compiled branch does not cover: the engine, on the stored payload.
ENGINE = "RETURN {s}.project_live(t, p, run, seq, eid, node);"


@dataclass(frozen=True)
class Branch:
    """One stored type's compiled branch: the guard (SQL over ``d``) and the statements after it."""

    stored: str
    v2: str
    guard: str | None  # None: no compiled path, always the engine
    body: tuple[str, ...] = ()
    declared: bool = False  # the operator's declarations name this type: ``d := declared_v2(...)`` first
    needs_tenant: bool = False
    pre: tuple[str, ...] = ()  # statements before the guard (a stored shape with a compiled path of its own)


def branch(schema: str, stored: str, v2: str, shape: ObjectShape | None, trivial: set[int], kind_types: set[str],
           carrier: str, renamed_path: str, declared: bool = False) -> Branch:
    """What ``payload_v2`` does for rows stored as ``stored`` (v2 type ``v2``, definition ``shape``)."""
    if shape is None or shape.union or shape.unprojectable or set(shape.patterns) - {HATCH_PATTERN}:
        return Branch(stored, v2, None)
    guard = [f"NOT pg_catalog.jsonb_path_exists(d, {quote_literal(renamed_path)})"]
    body: list[str] = []
    needs_tenant = False
    pre: tuple[str, ...] = ()
    nontrivial = sorted({k for k, s in shape.nested.items() if id(s) not in trivial}
                        | {k for k, s in shape.items.items() if id(s) not in trivial}
                        | set(shape.discriminated))
    if v2 == "run.started":
        # versioning.md §2.1 (a string engineVersion) and a stored owner block: the engine's
        if "owner" in nontrivial:
            nontrivial.remove("owner")  # absent by the guard below; the stamped block is what the walk keeps
        guard.append("COALESCE(pg_catalog.jsonb_typeof(d OPERATOR(pg_catalog.->) 'engineVersion') "
                     "OPERATOR(pg_catalog.<>) 'string', true)")
        guard.append("NOT d OPERATOR(pg_catalog.?) 'owner'")
        needs_tenant = True
        # the legacy owner block is a constant but for the tenant, written twice: set into a template
        # (cheaper than building three objects with jsonb_build_object, which types each argument)
        template = json.dumps({"tenant": "", "subject": {"issuer": LEGACY_ISSUER, "subjectId": LEGACY_SUBJECT_ID,
                                                         "tenant": "", "lane": "api-key", "kind": "user"}})
        owner = (f"pg_catalog.jsonb_set(pg_catalog.jsonb_set({jsonb_const(template)}, '{{tenant}}', "
                 f"pg_catalog.to_jsonb(tenant)), '{{subject,tenant}}', pg_catalog.to_jsonb(tenant))")
        body.append(f"IF tenant IS NOT NULL THEN d := d OPERATOR(pg_catalog.||) "
                    f"pg_catalog.jsonb_build_object('owner', {owner}); END IF;")
    elif v2 in kind_types:
        guard.append(f"COALESCE(pg_catalog.jsonb_typeof(d OPERATOR(pg_catalog.->) 'kind') "
                     f"OPERATOR(pg_catalog.<>) 'string' OR (d OPERATOR(pg_catalog.->>) 'kind') "
                     f"OPERATOR(pg_catalog.=) ANY ({text_array_const(INTERRUPT_KINDS)}), true)")
    elif v2 == "approval.requested":
        guard.append("(d OPERATOR(pg_catalog.?) 'data' OR d OPERATOR(pg_catalog.?) 'kind')")
        pre = approval_v1(schema, shape, trivial, renamed_path)
    if nontrivial:
        guard.append(f"NOT (d OPERATOR(pg_catalog.?|) {text_array_const(nontrivial)})")
    if shape.closed:
        unknown = f"(d OPERATOR(pg_catalog.-) {text_array_const(shape.declared)})"
        if shape.hatched:
            # No undeclared key: nothing to do. None of them a hatch key: all boxed under the carrier (which is
            # not taken: it is a hatch key). All of them hatch keys: kept where they are. Both kinds: the
            # engine, which boxes around the hatch keys (and picks the second carrier when the first is taken).
            kept = _pick(shape.declared)
            body.append(f"u := {unknown};")
            body.append("IF u OPERATOR(pg_catalog.<>) '{}'::pg_catalog.jsonb THEN")
            body.append(f"    IF NOT pg_catalog.jsonb_path_exists(u, {quote_literal(HATCH_KEY_PATH)}) THEN")
            body.append(f"        d := ('{{}}'::pg_catalog.jsonb OPERATOR(pg_catalog.||) {kept}) "
                        f"OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object({quote_literal(carrier)}, u);")
            body.append(f"    ELSIF pg_catalog.jsonb_path_exists(u, {quote_literal(OTHER_KEY_PATH)}) THEN")
            body.append("        " + ENGINE.format(s=schema))
            body.append("    END IF;")
            body.append("END IF;")
        else:
            guard.append(f"{unknown} OPERATOR(pg_catalog.=) '{{}}'::pg_catalog.jsonb")
    for key, column in (("nodeId", "node"), ("runId", "run")):
        if key in shape.required:
            body.append(f"IF {column} IS NOT NULL AND NOT d OPERATOR(pg_catalog.?) {quote_literal(key)} THEN "
                        f"d := d OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object({quote_literal(key)}, "
                        f"{column}); END IF;")
    return Branch(stored, v2, " AND ".join(guard), tuple(body), declared, needs_tenant, pre)


def _pick(keys, seat=None) -> str:
    """The object of those of ``keys`` that ``d`` holds (under ``seat[k]`` when given), as jsonb."""
    seat = seat or {}
    return " OPERATOR(pg_catalog.||) ".join(
        f"CASE WHEN d OPERATOR(pg_catalog.?) {quote_literal(k)} THEN pg_catalog.jsonb_build_object("
        f"{quote_literal(seat.get(k, k))}, d OPERATOR(pg_catalog.->) {quote_literal(k)}) "
        f"ELSE '{{}}'::pg_catalog.jsonb END" for k in keys)


def approval_v1(schema: str, shape: ObjectShape, trivial: set[int], renamed_path: str) -> tuple[str, ...]:
    """``approval.requested`` stored in its v1 shape (no ``data``, no ``kind``): RFC 0186 §A.3 as the engine's
    ``project_v2`` does it, for the payloads where nothing is refused and no nested walk changes anything.

    ApprovalData's own keys and ``message`` (as ``description``) move into ``data``, ``timeout`` becomes
    ``timeoutMs``, ``kind`` is ``approval``; the other keys stay where they are and must be declared by the
    definition (else the engine refuses them). Two stored keys for one seat, an ApprovalData value the walk
    would enter (a nested shape that is not trivial), a renamed nested type: the engine.
    """
    key, bound = shape.discriminated.get("data", (None, {}))
    data_shape = bound.get("approval")
    if key != "kind" or data_shape is None or data_shape.union or data_shape.unprojectable:
        return ()
    data_keys = [k for k in data_shape.declared]
    moved = {**{k: k for k in data_keys}, **APPROVAL_RENAMES}  # stored key -> seat in data
    top = dict(APPROVAL_TOP)  # stored key -> seat at the top
    stays = [k for k in shape.declared if k not in ("data", "kind") and k not in moved and k not in top]
    inner = sorted({k for k, s in data_shape.nested.items() if id(s) not in trivial}
                   | {k for k, s in data_shape.items.items() if id(s) not in trivial} | set(data_shape.discriminated))
    outer = sorted({k for k, s in shape.nested.items() if id(s) not in trivial and k in stays}
                   | {k for k, s in shape.items.items() if id(s) not in trivial and k in stays})
    allowed = sorted(set(moved) | set(top) | set(stays))
    guard = [f"(d OPERATOR(pg_catalog.-) {text_array_const(allowed)}) OPERATOR(pg_catalog.=) '{{}}'::pg_catalog.jsonb",
             f"NOT pg_catalog.jsonb_path_exists(d, {quote_literal(renamed_path)})"]
    for stored, seat in {**APPROVAL_RENAMES, **top}.items():
        guard.append(f"NOT (d OPERATOR(pg_catalog.?) {quote_literal(stored)} AND d OPERATOR(pg_catalog.?) "
                     f"{quote_literal(seat)})")  # two stored keys for one seat: refused by the engine
    if inner or outer:
        guard.append(f"NOT (d OPERATOR(pg_catalog.?|) {text_array_const(inner + outer)})")
    data = f"('{{}}'::pg_catalog.jsonb OPERATOR(pg_catalog.||) {_pick(moved, moved)})"
    result = (f"(d OPERATOR(pg_catalog.-) {text_array_const(list(moved) + list(top))}) OPERATOR(pg_catalog.||) "
              f"{_pick(top, top)} OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object('kind', 'approval', "
              f"'data', {data})")
    return ("IF NOT d OPERATOR(pg_catalog.?) 'data' AND NOT d OPERATOR(pg_catalog.?) 'kind' THEN",
            f"    IF NOT ({' AND '.join(guard)}) THEN {ENGINE.format(s=schema)} END IF;",
            f"    RETURN {result};",
            "END IF;")


def branches(schema: str, artifacts, carrier: str, declared_types: frozenset[str] = frozenset()) -> list[Branch]:
    """One branch per stored (v1) type of the codemap, sorted by the stored name's bytes."""
    shapes = artifacts.payload_shapes
    trivial = trivial_shapes(shapes)
    kinds = set(interrupt_kind_types(shapes))
    path = renamed_type_path(artifacts.renamed)
    out = [branch(schema, v1, v2, shapes.get(v2), trivial, kinds, carrier, path, v2 in declared_types)
           for v1, v2 in artifacts.v1_to_v2.items()]
    return sorted(out, key=lambda b: b.stored.encode())



def type_function(stored: str) -> str:
    """The name of the function that holds ``stored``'s compiled branch: ``payload_v2__`` and the type in lower case,
    each run of other characters one underscore (``run.completed``: ``payload_v2__run_completed``)."""
    return "payload_v2__" + re.sub(r"[^a-z0-9]+", "_", stored.lower()).strip("_")


def type_functions(stored: list[str]) -> list[str]:
    """:func:`type_function` of each stored type; ValueError when two types get the same name or a name is longer
    than PostgreSQL keeps (63 bytes: it would cut it, and two cut names could be one)."""
    names = [type_function(t) for t in stored]
    seen: dict[str, str] = {}
    for t, name in zip(stored, names):
        if len(name) > 63:
            raise ValueError(f"the compiled branch of {t!r} would be the function {name}, longer than 63 bytes")
        if name in seen:
            raise ValueError(f"the compiled branches of {seen[name]!r} and {t!r} would both be the function {name}")
        seen[name] = t
    return names


def _leaf(b: Branch, s: str, indent: str) -> list[str]:
    """``payload_v2``'s leaf for ``b``: the engine, or the call of the type's own function."""
    if b.guard is None:
        return [indent + ENGINE.format(s=s)]
    return [f"{indent}RETURN {s}.{type_function(b.stored)}(t, p, run, seq, eid, node);"]


def _branch_lines(b: Branch, s: str, indent: str, tenant_sql: str) -> list[str]:
    """The statements of ``b``'s compiled branch (over ``d``, ``u`` and ``tenant``), ending with its RETURN."""
    engine = ENGINE.format(s=s)
    lines = []
    if b.declared:
        lines.append(f"{indent}d := {s}.declared_v2({quote_literal(b.v2)}, p);")
    lines += [indent + stmt for stmt in b.pre]
    lines.append(f"{indent}IF NOT ({b.guard}) THEN {engine} END IF;")
    if b.needs_tenant:
        lines.append(f"{indent}tenant := NULLIF({tenant_sql}, '');")
    lines += [indent + stmt for stmt in b.body]
    lines.append(f"{indent}RETURN d;")
    return lines


def _tree(items: list[Branch], s: str, indent: str) -> list[str]:
    """A balanced IF tree over ``t`` (byte order) with one leaf per branch. Every leaf returns: a row whose type
    has no leaf (or a NULL type) comes out of the tree, to the statements after it (one copy of them, not one
    at each of the tree's ends)."""
    if len(items) <= 2:
        out = []
        for i, b in enumerate(items):
            out.append(f"{indent}{'IF' if i == 0 else 'ELSIF'} t OPERATOR(pg_catalog.=) {quote_literal(b.stored)} THEN")
            out += _leaf(b, s, indent + "    ")
        out.append(f"{indent}END IF;")
        return out
    mid = len(items) // 2
    pivot = quote_literal(items[mid].stored)
    return ([f"{indent}IF (t COLLATE pg_catalog.\"C\") OPERATOR(pg_catalog.<) {pivot} THEN"]
            + _tree(items[:mid], s, indent + "    ")
            + [f"{indent}ELSE"]
            + _tree(items[mid:], s, indent + "    ")
            + [f"{indent}END IF;"])


def compiled_sql(schema: str, artifacts, carrier: str, vendor_orgs, tenant_sql: str,
                 declared_types: frozenset[str] = frozenset()) -> str:
    """The DDL of ``payload_v2`` (compiled), ``project_live`` (the engine's entry for one row),
    and ``run_tenant``.

    ``vendor_orgs``: the registered orgs whose types pass unchanged; ``tenant_sql``: a SQL expression
    of the run's tenant over ``run``, every name in it qualified (``NULL::pg_catalog.text`` without
    ``[host] tenant_column``); read in ``payload_v2`` itself for ``run.started`` rows, one SPI query.

    ``payload_v2`` runs once per era-2 row, so it has no ``SET search_path`` (a GUC save and restore
    per call, about 2 µs measured by hand): every name in it is schema-qualified instead, types included, since the
    caller's temporary schema is searched first for type names.
    """
    forward = {v1: artifacts.v1_to_v2[v1] for v1 in artifacts.v1_types}
    mapped = f"{jsonb_const(orjson.dumps(dict(sorted(forward.items()))).decode())} OPERATOR(pg_catalog.?) t"
    s = schema
    refuse = (f"PERFORM {s}.refuse_row(CASE WHEN t IS NULL THEN 'event_row_malformed' "
              f"ELSE 'event_type_unmapped' END, t, run, seq);")
    vendor = "false"
    if vendor_orgs:
        vendor = (f"pg_catalog.strpos(t, '.') OPERATOR(pg_catalog.>) 0 AND pg_catalog.split_part(t, '.', 1) "
                  f"OPERATOR(pg_catalog.=) ANY ({text_array_const(vendor_orgs)})")
    every = branches(s, artifacts, carrier, declared_types)
    tree = "\n".join(_tree(every, s, "    ")
                     + [f"    IF t IS NULL OR NOT ({vendor}) THEN {refuse} END IF;", "    " + ENGINE.format(s=s)])
    mapped = f"({mapped}) OR ({vendor})"
    compiled = [b for b in every if b.guard is not None]
    names = type_functions([b.stored for b in compiled])
    functions = "".join(f"""
-- payload_v2 of the rows stored as {b.stored} (v2: {b.v2}).
CREATE OR REPLACE FUNCTION {s}.{name}(t text, p jsonb, run text, seq bigint, eid text, node text)
RETURNS jsonb LANGUAGE plpgsql STABLE
AS $ow$
DECLARE
    d pg_catalog.jsonb := p;
    u pg_catalog.jsonb;
    tenant pg_catalog.text;
BEGIN
{chr(10).join(_branch_lines(b, s, "    ", tenant_sql))}
END
$ow$;
""" for b, name in zip(compiled, names))
    return f"""
-- The functions of the compiled branches of other artifacts (a migrate to another codemap): dropped.
DO $ow$
DECLARE
    f pg_catalog.regprocedure;
BEGIN
    FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) {quote_literal(s)}::pg_catalog.regnamespace
               AND p.proname::pg_catalog.text LIKE 'payload\\_v2\\_\\_%'
               AND p.proname::pg_catalog.text OPERATOR(pg_catalog.<>) ALL ({text_array_const(names)})
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', f);
    END LOOP;
END
$ow$;
{functions}
-- The run's tenant (empty counts as none), for run.started's legacy Subject.
CREATE OR REPLACE FUNCTION {s}.run_tenant(run text) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    RETURN NULLIF({tenant_sql}, '');
END
$ow$;

-- One era-2 row through the engine (project_row), after the operator's declarations (declared_v2): the
-- projected payload, or the declared payload when the engine leaves it unchanged.
CREATE OR REPLACE FUNCTION {s}.project_live(t text, p jsonb, run text, seq bigint, eid text, node text)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    r text;
    dp jsonb := {s}.declared_v2(COALESCE({s}.renamed_types() ->> t, t), p);
BEGIN
    r := {s}.project_row(t, dp, run, seq, eid, node,
                         CASE WHEN t OPERATOR(pg_catalog.=) 'run.started' THEN {s}.run_tenant(run) END);
    r := pg_catalog.split_part(pg_catalog.substr(r, 2), E'\\x1e', 1);  -- (project_row raised OW002 when unprojectable)
    IF r OPERATOR(pg_catalog.=) '' THEN
        RETURN dp;
    END IF;
    RETURN r::jsonb;
END
$ow$;

-- The major-2 payload of one era-2 row (module docstring of proxy.db.projection_compiled).
CREATE OR REPLACE FUNCTION {s}.payload_v2(t text, p jsonb, run text, seq bigint, eid text, node text)
RETURNS jsonb LANGUAGE plpgsql STABLE
AS $ow$
BEGIN
    IF p IS NULL OR pg_catalog.jsonb_typeof(p) OPERATOR(pg_catalog.<>) 'object' THEN
        IF t IS NULL OR NOT ({mapped}) THEN
            {refuse}
        END IF;
        RETURN p;
    END IF;
{tree}
END
$ow$;
"""
