"""Payload projection for major-2 readers of era-2 rows, generated as SQL from the compiled v2 shapes.

The projection runs *inside the database*, in the reading statement itself,
for the same reasons the era check does (see :mod:`proxy.db`): a row that
cannot be projected fails the statement exactly as a PostgreSQL error would
(transaction, pipeline and ReadyForQuery as PostgreSQL leaves them), and the
run's tenant, needed for the legacy Subject, is read in the statement's own
snapshot.  No row passes through the seat's Python.

What is generated here is data plus one generic engine, not per-type code.  The engine is the
projection's definition; the major-2 view reads through the compiled projection
(:mod:`proxy.db.projection_compiled`), which runs the engine only for the payloads its per-type
branches do not cover, and the tests compare the two row by row.

* ``payload_shapes()`` returns the compiled shape graph of
  :mod:`proxy.artifacts.payload_shapes` as one jsonb constant (types → shape ids; per shape:
  declared keys with their nested/item shapes, required keys, open / closed /
  closed-and-hatched, union branches, ``kind``-style discriminators).
* ``project_obj(shape, value, path)`` walks one object against one shape:
  a declared key stays (its nested object is walked against its own shape);
  a key the shape's own patterns admit stays; in an open shape any key stays;
  in a closed, hatched shape the other keys are boxed under the carrier
  (``[host] payload_carrier``, default ``"x-v1"``; ``"<carrier>.seat"`` when
  the host wrote the carrier itself); in a closed shape without the hatch
  they are *unseated* (their dotted paths are returned).  The hatch belongs to
  each shape: a nested closed object without it refuses even ``x-`` keys (spec
  digest §2.2 step 5).  A hatch key's value is opaque: nothing under it is
  looked at.  The choices where the spec is silent are ADR 0007's.
* ``project_v2(type, payload, node, run, tenant)`` applies the value
  transformations the spec names, then the walk, then fills required
  ``nodeId``/``runId`` from the row's own columns; it reports the unseated
  keys, the number of boxed keys and the required keys still missing.
* ``read_v2p(...)`` is the engine's whole-row entry, an inlined SQL
  expression (its twin ``try_v2p`` is what ``audit`` and ``backfill`` read;
  the property tests call it): the era check of ``read_v2``, then
  ``fast_v2`` (a generated per-type test that the payload needs nothing), and
  only otherwise ``project_row`` (plpgsql), which raises ``payload_unprojectable``
  or returns ``<era>[<projected jsonb>][\\x1e<boxed>\\x1e<type>\\x1e<missing,…>]`` as
  text; the part after the era is present when the payload changed or a
  required key is missing (see :mod:`proxy.tools.audit`).

Serialisation.  The projected payload is a jsonb value and reaches the client
as PostgreSQL prints jsonb (``jsonb_out``): keys in jsonb's storage order
(shorter keys first, then bytewise), ``", "`` and ``": "`` separators,
numbers and strings as jsonb prints them, and, in binary format, the jsonb
version byte 1 before that text.  That is the only order a jsonb column can
hold, so a projected payload re-appended elsewhere (a fork) reads back with
the same bytes.  A payload the projection leaves equal is not sent again:
the row keeps the server's original bytes.
"""

from __future__ import annotations

import orjson

from proxy.artifacts.payload_shapes import HATCH_PATTERN, ObjectShape, check_carrier
from proxy.db.sql import quote_literal, text_array_literal

CARRIER = "x-v1"  # the default carrier: the key, admitted by the hatch, that holds a hatched object's unseated keys
SECOND_CARRIER_SUFFIX = ".seat"  # the carrier when the host itself wrote a key of the carrier's name (ADR 0007)
# The v2 interrupt kind enum (nodeSuspended.kind, interruptResolved.kind, suspend-request kind); a stored kind
# outside it reads as "custom", the original carried (ADR 0007).
INTERRUPT_KINDS = ("approval", "clarification", "external-event", "custom", "conversation.start",
                   "conversation.exchange", "conversation.close", "low-confidence", "credential")
INTERRUPT_KIND_DEFS = ("run-event-payloads.schema.json#/$defs/nodeSuspended",
                       "run-event-payloads.schema.json#/$defs/interruptResolved")
SUBJECT_KINDS = ("user", "agent", "anonymous", "workload")  # subject.schema.json kind
KEY_CLASS_LANES = ("saml", "scim")  # subject.schema.json: keyClass is required on these lanes, forbidden on others
LEGACY_ISSUER = "urn:openwop:legacy"
LEGACY_SUBJECT_ID = "legacy"
# RFC 0186 §A.3: the stored approval.requested keys with a named seat outside ApprovalData's own names.
APPROVAL_RENAMES = {"message": "description"}
APPROVAL_TOP = {"timeout": "timeoutMs"}
FILLED_FROM_COLUMNS = ("nodeId", "runId")
META_SEPARATOR = "\x1e"  # never in jsonb_out text (control characters are escaped there)


def shape_table(shapes: dict[str, ObjectShape]) -> dict:
    """The shape graph as plain data: ``{"types": {v2type: id}, "shapes": {id: {...}}}``.

    Per shape: ``k`` declared keys in schema order, each ``[nested id | null, items id | null]``;
    ``m`` ``"o"`` open, ``"h"`` closed with the hatch, ``"c"`` closed; ``r`` required keys; ``p``
    patterns other than the hatch (none in the pinned set); ``u`` union branch ids; ``x``
    discriminators ``{property: [sibling key, {value: id}]}``.
    """
    ids: dict[int, str] = {}
    table: dict[str, dict] = {}

    def visit(shape: ObjectShape) -> str:
        sid = ids.get(id(shape))
        if sid is not None:
            return sid
        sid = ids[id(shape)] = str(len(ids))
        entry: dict = {}
        table[sid] = entry  # before the children: the graph can be cyclic
        entry["k"] = {k: [visit(shape.nested[k]) if k in shape.nested else None,
                          visit(shape.items[k]) if k in shape.items else None] for k in shape.declared}
        entry["m"] = "o" if shape.open else ("h" if shape.hatched else "c")
        entry["r"] = sorted(shape.required)
        others = [p for p in shape.patterns if p != HATCH_PATTERN]
        if others:
            entry["p"] = others
        if shape.union:
            entry["u"] = [visit(b) for b in shape.union]
        if shape.discriminated:
            entry["x"] = {prop: [key, {value: visit(s) for value, s in bound.items()}]
                          for prop, (key, bound) in shape.discriminated.items()}
        return sid

    types = {t: visit(s) for t, s in sorted(shapes.items())}
    return {"types": types, "shapes": table}


def approval_data_keys(shapes: dict[str, ObjectShape]) -> tuple[str, ...]:
    """The keys ApprovalData declares (the ``data`` bound to ``kind: "approval"`` of approval.requested)."""
    shape = shapes.get("approval.requested")
    if shape is None or "data" not in shape.discriminated:
        return ()
    key, bound = shape.discriminated["data"]
    approval = bound.get("approval")
    return approval.declared if approval is not None else ()


def second_carrier(carrier: str) -> str:
    return carrier + SECOND_CARRIER_SUFFIX


def interrupt_kind_types(shapes: dict[str, ObjectShape]) -> tuple[str, ...]:
    """The v2 types whose (hatched) definition is nodeSuspended or interruptResolved: their ``kind`` is the
    interrupt kind enum, and a stored kind outside it can be carried."""
    return tuple(sorted(t for t, sh in shapes.items()
                        if sh.ref in INTERRUPT_KIND_DEFS and sh.hatched and "kind" in sh.declared))


def projection_sql(schema: str, artifacts, carrier: str = CARRIER) -> str:
    """The DDL of the projection functions (CREATE OR REPLACE; idempotent); ``carrier`` is checked with
    :func:`check_carrier` against the artifacts' org registry."""
    check_carrier(carrier, artifacts.vendor_orgs)
    carrier2 = second_carrier(carrier)
    shapes = artifacts.payload_shapes
    kind_types = text_array_literal(interrupt_kind_types(shapes))
    interrupt_kinds = text_array_literal(INTERRUPT_KINDS)
    subject_kinds = text_array_literal(SUBJECT_KINDS)
    key_class_lanes = text_array_literal(KEY_CLASS_LANES)
    graph = shape_table(shapes)
    # One flat object, so each lookup is one `->` on the constant (a nested `-> 'shapes'` would copy the
    # whole shape table out for every row): "t:<type>" -> shape id, "<id>" -> shape.
    table = orjson.dumps({**{f"t:{t}": sid for t, sid in graph["types"].items()}, **graph["shapes"]}).decode()
    renamed = orjson.dumps({v1: artifacts.v1_to_v2[v1] for v1 in sorted(artifacts.renamed)}).decode()
    hatch = quote_literal(HATCH_PATTERN)
    renames = " ".join(f"WHEN k = {quote_literal(a)} THEN {quote_literal(b)}" for a, b in APPROVAL_RENAMES.items())
    approval_keys = text_array_literal(approval_data_keys(shapes))
    top_keys = text_array_literal(APPROVAL_TOP)
    top = " ".join(f"WHEN {quote_literal(a)} THEN {quote_literal(b)}" for a, b in APPROVAL_TOP.items())
    s = schema
    return f"""
CREATE OR REPLACE FUNCTION {s}.payload_shapes() RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $ow$ SELECT {quote_literal(table)}::jsonb $ow$;

CREATE OR REPLACE FUNCTION {s}.renamed_types() RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $ow$ SELECT {quote_literal(renamed)}::jsonb $ow$;

-- A value under a `type` key, at any depth, that is a renamed v1 event type is mapped like the row's type.
-- A key the hatch admits is carried opaquely (RFC 0185 §B): nothing under it is looked at, at any depth.
CREATE OR REPLACE FUNCTION {s}.map_nested_types(v jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    k text;
    x jsonb;
    y jsonb;
    out jsonb := v;
    i integer;
BEGIN
    IF jsonb_typeof(v) = 'object' THEN
        FOR k, x IN SELECT e.key, e.value FROM jsonb_each(v) e LOOP
            IF k ~ {hatch} THEN
                CONTINUE;
            ELSIF k = 'type' AND jsonb_typeof(x) = 'string' THEN
                y := {s}.renamed_types() -> (x #>> '{{}}');
                IF y IS NOT NULL THEN
                    out := out || jsonb_build_object(k, y);
                END IF;
            ELSIF jsonb_typeof(x) IN ('object', 'array') THEN
                y := {s}.map_nested_types(x);
                IF y <> x THEN
                    out := out || jsonb_build_object(k, y);
                END IF;
            END IF;
        END LOOP;
    ELSIF jsonb_typeof(v) = 'array' THEN
        FOR i IN 0 .. jsonb_array_length(v) - 1 LOOP
            x := v -> i;
            IF jsonb_typeof(x) IN ('object', 'array') THEN
                y := {s}.map_nested_types(x);
                IF y <> x THEN
                    out := jsonb_set(out, ARRAY[i::text], y);
                END IF;
            END IF;
        END LOOP;
    END IF;
    RETURN out;
END
$ow$;

-- One object against one shape (module docstring of proxy.db.projection_sql).
-- (project_obj below) with `box0` already to carry (what a named transformation moved out of a seat it cannot keep).
CREATE OR REPLACE FUNCTION {s}.project_obj_with(sid text, v jsonb, path text, box0 jsonb,
                                               OUT val jsonb, OUT unseated text[], OUT boxed integer)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    sh jsonb := {s}.payload_shapes() -> sid;
    decl jsonb := sh -> 'k';
    mode text := sh ->> 'm';
    k text;
    x jsonb;
    spec jsonb;
    child text;
    items text;
    box jsonb := box0;
    sub record;
    i integer;
    b text;
    carrier text;
    first boolean := true;
    arr jsonb;
BEGIN
    val := v;
    unseated := '{{}}';
    boxed := 0;
    IF jsonb_typeof(v) IS DISTINCT FROM 'object' THEN
        RETURN;  -- not an object: the schema's business, not the projection's
    END IF;
    IF sh ? 'u' THEN
        -- A union: the first branch that seats every key; else the first branch's verdict.
        FOR b IN SELECT jsonb_array_elements_text(sh -> 'u') LOOP
            SELECT * INTO sub FROM {s}.project_obj(b, v, path);
            IF cardinality(sub.unseated) = 0 THEN
                val := sub.val; boxed := sub.boxed; unseated := sub.unseated;  -- not an earlier branch's verdict
                RETURN;
            END IF;
            IF first THEN
                first := false;
                unseated := sub.unseated;
            END IF;
        END LOOP;
        RETURN;
    END IF;
    FOR k, x IN SELECT e.key, e.value FROM jsonb_each(v) e LOOP
        spec := decl -> k;
        IF spec IS NOT NULL THEN
            child := spec ->> 0;
            items := spec ->> 1;
            IF sh ? 'x' AND (sh -> 'x') ? k THEN
                -- the shape of this property is bound to a sibling's value (suspend-request's data by kind)
                child := COALESCE(sh -> 'x' -> k -> 1 ->> (v ->> (sh -> 'x' -> k ->> 0)), child);
            END IF;
            IF child IS NOT NULL AND jsonb_typeof(x) = 'object' THEN
                SELECT * INTO sub FROM {s}.project_obj(child, x, path || k || '.');
                IF sub.val <> x THEN
                    val := val || jsonb_build_object(k, sub.val);
                END IF;
                unseated := unseated || sub.unseated;
                boxed := boxed + sub.boxed;
            ELSIF items IS NOT NULL AND jsonb_typeof(x) = 'array' THEN
                arr := x;
                FOR i IN 0 .. jsonb_array_length(x) - 1 LOOP
                    SELECT * INTO sub FROM {s}.project_obj(items, x -> i, path || k || '[' || i || '].');
                    IF sub.val <> x -> i THEN
                        arr := jsonb_set(arr, ARRAY[i::text], sub.val);
                    END IF;
                    unseated := unseated || sub.unseated;
                    boxed := boxed + sub.boxed;
                END LOOP;
                IF arr <> x THEN
                    val := val || jsonb_build_object(k, arr);
                END IF;
            END IF;
        ELSIF mode = 'o' THEN
            NULL;
        ELSIF mode = 'h' AND k ~ {hatch} THEN
            NULL;
        ELSIF sh ? 'p' AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(sh -> 'p') p WHERE k ~ p) THEN
            NULL;
        ELSIF mode = 'h' THEN
            box := box || jsonb_build_object(k, x);
            val := val - k;
        ELSE
            unseated := unseated || (path || k);
        END IF;
    END LOOP;
    IF box <> '{{}}'::jsonb THEN
        -- The carrier, or the second carrier when the host itself wrote a key of the carrier's name: the
        -- host's value is a hatch property, carried opaquely, never merged into (ADR 0007). Both taken: refuse.
        carrier := CASE WHEN NOT v ? {quote_literal(carrier)} THEN {quote_literal(carrier)}
                        WHEN NOT v ? {quote_literal(carrier2)} THEN {quote_literal(carrier2)} END;
        IF carrier IS NULL THEN
            FOR k IN SELECT jsonb_object_keys(box) LOOP
                unseated := unseated || (path || k);
            END LOOP;
        ELSIF mode <> 'h' THEN
            FOR k IN SELECT jsonb_object_keys(box) LOOP
                unseated := unseated || (path || k);  -- box0 given to a shape without the hatch
            END LOOP;
        ELSE
            val := val || jsonb_build_object(carrier, box);
            boxed := boxed + (SELECT count(*) FROM jsonb_object_keys(box))::integer;
        END IF;
    END IF;
END
$ow$;

-- One object against one shape, nothing carried beforehand.
CREATE OR REPLACE FUNCTION {s}.project_obj(sid text, v jsonb, path text,
                                          OUT val jsonb, OUT unseated text[], OUT boxed integer)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $ow$ SELECT * FROM {s}.project_obj_with(sid, v, path, '{{}}'::jsonb) $ow$;

-- The named transformations, the walk, and the fill from the row's own columns, for one v2 type.
CREATE OR REPLACE FUNCTION {s}.project_v2(t2 text, p jsonb, node text, run text, tenant text,
                                         OUT val jsonb, OUT unseated text[], OUT boxed integer,
                                         OUT missing text[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    sid text := {s}.payload_shapes() ->> ('t:' || t2);
    req jsonb;
    pre text[] := '{{}}';
    x jsonb;
    o jsonb;
    who text;
    subject_tenant text;
    data jsonb;
    rest jsonb;
    k text;
    seat text;
    sub record;
    rt text;
    owner_tenant text;
    pk text;
    sk text;
    subj jsonb;
    gone jsonb := '{{}}'::jsonb;
    extra jsonb := '{{}}'::jsonb;
BEGIN
    val := p;
    unseated := '{{}}';
    boxed := 0;
    missing := '{{}}';
    IF sid IS NULL OR jsonb_typeof(p) IS DISTINCT FROM 'object' THEN
        RETURN;  -- a vendor type (no definition) or a non-object payload: carried unchanged
    END IF;
    IF jsonb_path_exists(p, 'lax $.**.type') THEN
        val := {s}.map_nested_types(val);
    END IF;
    IF t2 = 'run.started' THEN
        -- versioning.md §2.1: engineVersion is an integer; a string of digits is that integer.
        x := val -> 'engineVersion';
        IF jsonb_typeof(x) = 'string' THEN
            IF (x #>> '{{}}') ~ '^(0|[1-9][0-9]*)$' THEN
                val := val || jsonb_build_object('engineVersion', (x #>> '{{}}')::numeric);
            ELSE
                pre := pre || 'engineVersion'::text;
            END IF;
        END IF;
        -- identity.md §1.1, §1.2; persistence.md: the owner block is {{tenant, workspace?, subject}}; the stored
        -- owner fields are projected to the Subject, and a run without one (no owner, "owner": null, no or a
        -- null subject) reads with the legacy Subject. The tenant is the run row's (ADR 0007).
        o := val -> 'owner';
        rt := NULLIF(tenant, '');
        IF jsonb_typeof(o) = 'null' THEN
            o := NULL;
        ELSIF jsonb_typeof(o) = 'object' AND jsonb_typeof(o -> 'subject') = 'null'
              AND COALESCE(rt, o ->> 'tenant') IS NOT NULL THEN
            o := o - 'subject';  -- a null subject is no Subject: stamped below
        END IF;
        IF o IS NULL THEN
            IF rt IS NOT NULL THEN
                val := val || jsonb_build_object('owner', jsonb_build_object('tenant', rt,
                    'subject', jsonb_build_object('issuer', {quote_literal(LEGACY_ISSUER)}, 'subjectId', {quote_literal(LEGACY_SUBJECT_ID)},
                                                  'tenant', rt, 'lane', 'api-key', 'kind', 'user')));
            END IF;  -- no tenant to stamp with: left as stored (ADR 0007)
        ELSIF jsonb_typeof(o) = 'object'
              AND (NOT o ? 'principal' OR jsonb_typeof(o -> 'principal') = 'string')
              AND (NOT o ? 'principalKind' OR jsonb_typeof(o -> 'principalKind') = 'string')
              AND (NOT o ? 'subject' OR jsonb_typeof(o -> 'subject') = 'object') THEN
            IF o ? 'tenant' AND rt IS NOT NULL AND o -> 'tenant' IS DISTINCT FROM to_jsonb(rt) THEN
                pre := pre || 'owner.tenant'::text;  -- the stored owner names another tenant than the run row
            END IF;
            owner_tenant := COALESCE(rt, o ->> 'tenant');
            IF NOT o ? 'subject' AND owner_tenant IS NOT NULL THEN
                pk := o ->> 'principalKind';
                sk := CASE WHEN pk = ANY ({subject_kinds}) THEN pk ELSE 'user' END;
                subj := jsonb_build_object('issuer', {quote_literal(LEGACY_ISSUER)},
                                           'subjectId', COALESCE(o ->> 'principal', {quote_literal(LEGACY_SUBJECT_ID)}),
                                           'tenant', owner_tenant,
                                           'lane', CASE sk WHEN 'anonymous' THEN 'anonymous' ELSE 'api-key' END,
                                           'kind', sk);
                IF pk IS NOT NULL AND pk <> sk THEN
                    gone := gone || jsonb_build_object('principalKind', pk);  -- a kind the Subject cannot hold
                END IF;
                o := (o - 'principal' - 'principalKind') || jsonb_build_object('subject', subj);
            ELSIF o ? 'subject' THEN
                subj := o -> 'subject';
                -- principal / principalKind beside a subject are removed; what the subject does not say is carried
                IF o ? 'principal' AND o -> 'principal' IS DISTINCT FROM subj -> 'subjectId' THEN
                    gone := gone || jsonb_build_object('principal', o -> 'principal');
                END IF;
                IF o ? 'principalKind' AND o -> 'principalKind' IS DISTINCT FROM subj -> 'kind' THEN
                    gone := gone || jsonb_build_object('principalKind', o -> 'principalKind');
                END IF;
                o := o - 'principal' - 'principalKind';
                -- subject.schema.json forbids keyClass outside the saml / scim lanes: carried, not kept
                IF subj ? 'keyClass' AND NOT COALESCE(subj ->> 'lane' = ANY ({key_class_lanes}), false) THEN
                    gone := gone || jsonb_build_object('subject', jsonb_build_object('keyClass', subj -> 'keyClass'));
                    o := o || jsonb_build_object('subject', subj - 'keyClass');
                END IF;
            END IF;
            IF NOT o ? 'tenant' AND owner_tenant IS NOT NULL THEN
                o := o || jsonb_build_object('tenant', owner_tenant);
            END IF;
            val := val || jsonb_build_object('owner', o);
            IF gone <> '{{}}'::jsonb THEN
                extra := jsonb_build_object('owner', gone);
            END IF;
        END IF;
    ELSIF t2 = ANY ({kind_types}) AND jsonb_typeof(val -> 'kind') = 'string'
          AND NOT (val ->> 'kind') = ANY ({interrupt_kinds}) THEN
        -- an interrupt kind outside the v2 enum reads as "custom", the stored kind carried (ADR 0007)
        extra := jsonb_build_object('kind', val -> 'kind');
        val := val || jsonb_build_object('kind', 'custom');
    ELSIF t2 = 'approval.requested' AND NOT val ? 'data' AND NOT val ? 'kind' THEN
        -- RFC 0186 §A.3: a stored v1 approval.requested seats into the interrupt request's ApprovalData.
        data := '{{}}'::jsonb;
        rest := '{{}}'::jsonb;
        FOR k, x IN SELECT e.key, e.value FROM jsonb_each(val) e LOOP
            seat := CASE {renames} WHEN k = ANY ({approval_keys}) THEN k END;
            IF k = ANY ({top_keys}) THEN
                seat := CASE k {top} END;
                IF val ? seat THEN
                    pre := pre || k;  -- two stored keys for one seat
                ELSE
                    rest := rest || jsonb_build_object(seat, x);
                END IF;
            ELSIF seat IS NULL THEN
                rest := rest || jsonb_build_object(k, x);  -- no seat in ApprovalData: the walk decides
            ELSIF seat <> k AND val ? seat THEN
                pre := pre || k;  -- two stored keys for one seat
            ELSE
                data := data || jsonb_build_object(seat, x);
            END IF;
        END LOOP;
        val := rest || jsonb_build_object('kind', 'approval', 'data', data);
    END IF;
    SELECT * INTO sub FROM {s}.project_obj_with(sid, val, '', extra);
    val := sub.val;
    unseated := pre || sub.unseated;
    boxed := sub.boxed;
    req := {s}.payload_shapes() -> sid -> 'r';
    IF req ? 'nodeId' AND NOT val ? 'nodeId' AND node IS NOT NULL THEN
        val := val || jsonb_build_object('nodeId', node);
    END IF;
    IF req ? 'runId' AND NOT val ? 'runId' AND run IS NOT NULL THEN
        val := val || jsonb_build_object('runId', run);
    END IF;
    SELECT COALESCE(array_agg(r ORDER BY r), '{{}}') INTO missing
      FROM jsonb_array_elements_text(req) r WHERE NOT val ? r;
END
$ow$;
"""


# Types whose named transformations apply (their rows always take the full projection).
TRANSFORMED = ("run.started", "approval.requested")


def _fast_condition(shape: ObjectShape, kind_enum: bool = False) -> str:
    """A pure-SQL test that a payload of this shape needs nothing: every key declared (when closed), no
    value under a key with a nested shape, every required key present, no `type` key at any depth, and
    (``kind_enum``) no ``kind`` outside the interrupt kind enum."""
    parts = ["pg_catalog.jsonb_typeof(p) OPERATOR(pg_catalog.=) 'object'"]
    if kind_enum:
        parts.append(f"COALESCE((p OPERATOR(pg_catalog.->>) 'kind') OPERATOR(pg_catalog.=) "
                     f"ANY ({text_array_literal(INTERRUPT_KINDS)}), NOT (p OPERATOR(pg_catalog.?) 'kind'))")
    if shape.closed:
        parts.append(f"(p OPERATOR(pg_catalog.-) {text_array_literal(shape.declared)}) OPERATOR(pg_catalog.=) '{{}}'::jsonb")
    nested = sorted(set(shape.nested) | set(shape.items) | set(shape.discriminated))
    if nested:
        parts.append(f"NOT (p OPERATOR(pg_catalog.?|) {text_array_literal(nested)})")
    if shape.required:
        parts.append(f"p OPERATOR(pg_catalog.?&) {text_array_literal(sorted(shape.required))}")
    parts.append("NOT pg_catalog.jsonb_path_exists(p, 'lax $.**.type')")
    return " AND ".join(parts)


def read_v2p_sql(schema: str, artifacts, sqlstate: str, *, raising: bool = True, refused_prefix: str = "E") -> str:
    """The per-row entry point of a major-2 read that outputs payloads (see the module docstring).

    ``read_v2p`` is a single-expression SQL function, inlined into the statement: the era check, then
    ``fast_v2`` (generated per stored type: the payload needs nothing), and only when that fails the
    plpgsql projection ``project_row``, which costs tens of microseconds per row.

    ``fast_v2`` is plpgsql on purpose, so that it is *not* inlined: PostgreSQL parses the body of an
    inlined SQL function again at every planning, and this body (a branch per v1 type) made each
    unprepared page spend ~5 ms in the planner. plpgsql parses and plans it once per session and costs
    about 1 µs per row instead.

    With ``raising`` false the same functions are generated as the cutover tools' twins ``try_project_row``
    and ``try_v2p`` (over ``try_v2``, see :mod:`proxy.db`): where ``read_v2p`` raises a refusal they
    return ``refused_prefix`` followed by the refusal's envelope, so that one statement can report every row
    that would fail (a caught exception would cost a subtransaction per row, and PL/pgSQL evaluates an
    expression that raised the slow way for the rest of the transaction).  ``fast_v2`` is generated once,
    with ``raising``."""
    forward = "\n".join(f"        WHEN {quote_literal(v1)} THEN {quote_literal(artifacts.v1_to_v2[v1])}"
                         for v1 in sorted(artifacts.renamed)) or "        WHEN NULL THEN NULL"
    shapes = artifacts.payload_shapes
    kinds = set(interrupt_kind_types(shapes))
    fast = "\n".join(f"    WHEN {quote_literal(v1)} THEN {_fast_condition(shapes[v2], v2 in kinds)}"
                      for v1, v2 in sorted(artifacts.v1_to_v2.items())
                      if v2 in shapes and v2 not in TRANSFORMED) or "    WHEN NULL THEN false"
    s = schema
    envelope = """jsonb_build_object(
                'error', 'payload_unprojectable',
                'message', sentence,
                'details', jsonb_build_object('type', t2, 'keys', to_jsonb(r.unseated), 'eventId', eid,
                                              'sequence', seq, 'runId', run))::text"""
    if raising:
        project, entry, check = "project_row", "read_v2p", "read_v2"
        refuse = f"""RAISE EXCEPTION USING
            ERRCODE = {quote_literal(sqlstate)},
            MESSAGE = 'payload_unprojectable: ' || sentence,
            DETAIL = {envelope},
            HINT = 'the row is stored untouched; see docs/payload-projection.md in the openwop-seat repository';"""
        fast_fn = f"""
CREATE OR REPLACE FUNCTION {s}.fast_v2(t text, p jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $ow$
BEGIN
    RETURN CASE t
{fast}
    ELSE false
    END;
END
$ow$;
"""
        body = f"""SELECT CASE {s}.{check}(era, t, run, seq)
    WHEN 3 THEN '3'
    ELSE CASE WHEN p IS NULL OR {s}.fast_v2(t, p) THEN '2'
              ELSE {s}.{project}(t, p, run, seq, eid, node, tenant) END
END"""
    else:
        project, entry, check = "try_project_row", "try_v2p", "try_v2"
        refuse = f"RETURN {quote_literal(refused_prefix)} || {envelope};"
        fast_fn = ""
        # try_v2 is '3', '2' or a refusal; a refused row (rare) evaluates it a second time for its text
        body = f"""SELECT CASE {s}.{check}(era, t, run, seq)
    WHEN '3' THEN '3'
    WHEN '2' THEN CASE WHEN p IS NULL OR {s}.fast_v2(t, p) THEN '2'
              ELSE {s}.{project}(t, p, run, seq, eid, node, tenant) END
    ELSE {s}.{check}(era, t, run, seq)
END"""
    return f"""{fast_fn}
CREATE OR REPLACE FUNCTION {s}.{project}(t text, p jsonb, run text, seq bigint,
                                          eid text, node text, tenant text)
RETURNS text LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    t2 text;
    r record;
    out text;
    sentence text;
BEGIN
    t2 := CASE t
{forward}
        ELSE t END;
    SELECT * INTO r FROM {s}.project_v2(t2, p, node, run, tenant);
    IF cardinality(r.unseated) > 0 THEN
        sentence := format('the payload of %s in era-2 run %s at sequence %s holds %s, which the v2 '
                           'definition can neither carry nor seat', t2, quote_nullable(run),
                           coalesce(seq::text, 'unknown'), array_to_string(r.unseated, ', '));
        {refuse}
    END IF;
    out := '2';
    IF r.val <> p THEN
        out := out || r.val::text;
    ELSIF cardinality(r.missing) = 0 THEN
        RETURN out;  -- unchanged and complete: the row keeps its bytes and counts nothing
    END IF;
    out := out || {quote_literal(META_SEPARATOR)} || r.boxed || {quote_literal(META_SEPARATOR)} || t2
           || {quote_literal(META_SEPARATOR)} || array_to_string(r.missing, ',');
    RETURN out;
END
$ow$;

CREATE OR REPLACE FUNCTION {s}.{entry}(era smallint, t text, p jsonb, run text, seq bigint,
                                       eid text, node text, tenant text)
RETURNS text LANGUAGE sql VOLATILE
AS $ow$
{body}
$ow$;
"""
