"""The translated relations: what a translated session reads in place of the host's events table.

A session of major 2 (or 1) never reads the events table itself.  The classifier
(:mod:`proxy.readpath.classify`) replaces every read reference to it with
``openwop_seat.events_m2`` (``events_m1``), a view that ``migrate`` generates
from the pinned artifacts and from the table's own columns.  The view yields
the table's columns, in the table's order and under the same names, already
translated by the reader rule:

* the era comes from a join on the era store (``run_era``, or ``host.era_column``
  of the runs table), read in the statement's own snapshot; for a page of one
  run the planner probes it once, not once per row;
* ``type`` is mapped through one jsonb constant (a binary search, not a chain
  of comparisons), a registered vendor type passes unchanged, and any other
  type raises ``event_type_unmapped`` through ``refuse_text``;
* ``payload`` is projected by ``payload_v2`` (carry or fail; compiled per stored type,
  :mod:`proxy.db.projection_compiled`), except where the
  run is stamped era 3 or is marked *payloads clean* (``payloads_clean``: every
  stored payload of the run is already v2-clean; kept by a trigger and by
  ``mark_payloads_clean``), where the stored bytes are the answer.

Whatever the statement then does with the columns (expressions, DISTINCT,
GROUP BY, USING, predicates, window functions) works on translated values, so
there is nothing left for the seat to track, and no row ever passes through
Python.  A column that is not selected is not computed: reading only
``run_id, sequence`` costs nothing extra and checks nothing, as before.

Writes stay on the base table.  A ``RETURNING`` list is evaluated over the
written rows with ``type_m2``/``payload_m2`` (``_m1``) applied, the era read
with a fresh snapshot (``era_now``), as the append trigger saw it; a column the
list does not name is not computed.  An ``INSERT … RETURNING`` writes through
``events_insert_m2``/``_m1``, which apply them in the view (ADR 0019).

Everything here is generated SQL: the functions and views are (re)installed by
``migrate`` with the other artifact objects and fingerprinted with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.config import HostConfig
from proxy.db import store_sql
from proxy.db.layout import TRIGGER_PREFIX
from proxy.db.net_sql import NET_CODE, NET_SQLSTATE
from proxy.db.projection_compiled import compiled_sql
from proxy.db.sql import jsonb_literal, quote_ident, quote_literal, quote_relation, relation_name, text_array_literal

SCHEMA = "openwop_seat"
EQ = "OPERATOR(pg_catalog.=)"
VIEW = {2: "events_m2", 1: "events_m1"}
LOCK_VIEW = {2: "events_m2_lock", 1: "events_m1_lock"}  # what a row lock of a translated read reads (ADR 0017)
INSERT_VIEW = {2: "events_insert_m2", 1: "events_insert_m1"}  # what INSERT … RETURNING writes through (ADR 0019)
TYPE_OUT, PAYLOAD_OUT = "openwop_seat_type", "openwop_seat_payload"  # the written row's, translated, in INSERT_VIEW
SYSTEM_COLUMNS = ("xmax", "xmin", "ctid", "cmin", "cmax", "tableoid")  # carried by INSERT_VIEW (ADR 0017, 0019)
SYSTEM_PREFIX = "openwop_seat_sys_"
E, X, C = "openwop_seat_e", "openwop_seat_x", "openwop_seat_c"  # aliases inside the views


def net_gate(major: int) -> str:
    """The gate of a translated relation of ``major`` (ADR 0019): true in a session of that major, a raw or an
    unclaimed one; net_view refuses a session of the other major. Evaluated once per statement (an InitPlan). Only
    a claim of the other major for this pid needs net_view, which checks that the claim is this backend's and
    refuses: the common page asks claims once, in the view (read as the view's owner), and makes no call of a
    SECURITY DEFINER function with its own search_path (about 20 µs of backend CPU each, three per page of
    events_m2_run: issue 22)."""
    return (f"(SELECT CASE WHEN EXISTS (SELECT FROM {SCHEMA}.claims openwop_seat_net WHERE openwop_seat_net.pid "
            f"{EQ} pg_catalog.pg_backend_pid() AND openwop_seat_net.major {EQ} {3 - major}::pg_catalog.int2) "
            f"THEN {SCHEMA}.net_view({major}::pg_catalog.int2) ELSE true END)")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # as format_type prints it


def _vendor(t: str, orgs) -> str:
    if not orgs:
        return "false"
    return (f"(pg_catalog.strpos({t}, '.') OPERATOR(pg_catalog.>) 0 AND "
            f"pg_catalog.split_part({t}, '.', 1) {EQ} ANY ({text_array_literal(orgs)}))")


def clean_mark_sql(artifacts, host: HostConfig) -> str:
    """PL/pgSQL that removes the payloads-clean mark of the run ``v_run`` when the row ``NEW`` (type ``v_type``;
    its payload into the declared jsonb ``v_p``) breaks it: a type the reader rule cannot read, or a payload that
    is not v2-clean. The UPDATE trigger's body (``on_event_clean``) and part of the append's final check
    (``on_event_inserted``, ADR 0020)."""
    orgs = sorted(set(artifacts.vendor_orgs) - set(artifacts.reserved_orgs))
    # relations_sql's forward map; filtered, so that a vocabulary a test narrowed stays one vocabulary
    forward = {v1: v2 for v1, v2 in artifacts.v1_to_v2.items() if v1 in artifacts.v1_types}
    # the payload as jsonb for every row, as the clean trigger always read it (a text column's bad JSON fails here)
    return f"""v_p := (NEW.{quote_ident(host.payload_column)})::jsonb;
    IF EXISTS (SELECT 1 FROM {SCHEMA}.payloads_clean WHERE run_id {EQ} v_run)
       AND NOT (({jsonb_literal(forward)} OPERATOR(pg_catalog.?) v_type OR {_vendor('v_type', orgs)})
                AND (v_p IS NULL OR {SCHEMA}.fast_v2(v_type, v_p))) THEN
        DELETE FROM {SCHEMA}.payloads_clean WHERE run_id {EQ} v_run;
    END IF;"""


class _Era:
    """How one view finds a row's era: the join, and the conditions over it."""

    def __init__(self, host: HostConfig, run: str, run_type: str):
        runs_key_cast = "" if run_type == "text" else "::text"
        if host.era_column is None:
            self.join = (f"LEFT JOIN {SCHEMA}.run_era {X} ON {X}.run_id {EQ} {run}{runs_key_cast}")
            self.three = f"{X}.run_id IS NOT NULL"
            self.malformed = None
        else:
            col = f"{X}.{quote_ident(host.era_column)}"
            self.join = (f"LEFT JOIN {quote_relation(host.runs_table)} {X} "
                         f"ON {X}.{quote_ident(host.run_id_column)} {EQ} {run}")
            self.three = f"{col} {EQ} 3"
            self.malformed = f"{col} IS NOT NULL AND {col} OPERATOR(pg_catalog.<>) 3"


def relations_sql(artifacts, host: HostConfig, columns: list[Column],
                  declared_types: frozenset[str] = frozenset(), runs_table: bool = True) -> str:
    """The DDL of the translated relations over the events table with these ``columns`` (attnum order);
    ``declared_types``: the v2 types the operator's declarations name (ADR 0010), whose compiled branches
    apply ``declared_v2`` first. ``runs_table``: whether the runs table exists; the v2 store (ADR 0015) needs
    it, and the era in ``run_era`` (no ``era_column``)."""
    names = [c.name for c in columns]
    store = runs_table and host.era_column is None and host.store
    for needed in (host.run_id_column, host.type_column, host.payload_column, "sequence"):
        if needed not in names:
            raise ValueError(f"the events table has no column {needed!r}")
    types = {c.name: c.type for c in columns}
    orgs = sorted(set(artifacts.vendor_orgs) - set(artifacts.reserved_orgs))
    forward = {v1: artifacts.v1_to_v2[v1] for v1 in artifacts.v1_types}
    backward = artifacts.v2_to_v1  # None: the codemap is not a bijection

    def col(name: str | None, alias: str = E) -> str:
        return f"({alias}.{quote_ident(name)})::text" if name else "NULL::text"

    t, p = f"{E}.{quote_ident(host.type_column)}", f"{E}.{quote_ident(host.payload_column)}"
    run, seq = f"{E}.{quote_ident(host.run_id_column)}", f"({E}.sequence)::bigint"
    run_text = col(host.run_id_column)
    era = _Era(host, f"{E}.{quote_ident(host.run_id_column)}", types[host.run_id_column])
    malformed_era = (f"{SCHEMA}.refuse_text('event_row_malformed', NULL, {run_text}, NULL)")
    type_ok = f"({jsonb_literal(forward)} OPERATOR(pg_catalog.?) {t} OR {_vendor(t, orgs)})"
    malformed_arm = f"\n        WHEN {era.malformed} THEN {malformed_era}" if era.malformed else ""

    def cast(expr: str, name: str) -> str:
        return f"({expr})::{types[name]}"

    # major 2: an era-2 row's type and payload over a row alias (the host's table, or the v2 store's raw rows)
    def era2_type(a: str) -> str:
        ta, run_a, seq_a = (f"{a}.{quote_ident(host.type_column)}", col(host.run_id_column, a),
                            f"({a}.sequence)::bigint")
        refused = (f"{SCHEMA}.refuse_text(CASE WHEN {ta} IS NULL THEN 'event_row_malformed' "
                   f"ELSE 'event_type_unmapped' END, {ta}, {run_a}, {seq_a})")
        return (f"COALESCE({jsonb_literal(forward)} OPERATOR(pg_catalog.->>) {ta},\n"
                f"                      CASE WHEN {_vendor(ta, orgs)} THEN {ta} ELSE {refused} END)")

    def era2_payload_tail(a: str) -> str:
        ta, pa = f"{a}.{quote_ident(host.type_column)}", f"{a}.{quote_ident(host.payload_column)}"
        type_ok_a = f"({jsonb_literal(forward)} OPERATOR(pg_catalog.?) {ta} OR {_vendor(ta, orgs)})"
        return (f"WHEN {pa} IS NULL AND {type_ok_a} THEN NULL\n"
                f"        ELSE {SCHEMA}.payload_v2({ta}, ({pa})::jsonb, {col(host.run_id_column, a)}, "
                f"({a}.sequence)::bigint, {col(host.event_id_column, a)},\n"
                f"                                 {col(host.node_id_column, a)})")

    type_m2 = cast(f"""CASE
        WHEN {era.three} THEN {t}{malformed_arm}
        ELSE {era2_type(E)}
    END""", host.type_column)
    payload_m2 = cast(f"""CASE
        WHEN {era.three} THEN {p}{malformed_arm.replace(malformed_era, malformed_era + '::jsonb')}
        WHEN {C}_clean.run_id IS NOT NULL THEN {p}
        {era2_payload_tail(E)}
    END""", host.payload_column)
    # major 1; a row that backfill rewrote reads as it was before (its original, preserved byte for byte)
    o = f"{C}_orig"
    original = f"{o}.run_id IS NOT NULL"
    if backward is not None:
        era3_type = f"COALESCE({jsonb_literal(backward)} OPERATOR(pg_catalog.->>) {t}, {t})"
        era3_payload = p
    else:
        era3_type = (f"{SCHEMA}.refuse_text('v1_representation_refused', {t}, {run_text}, {seq})")
        era3_payload = f"({era3_type})::jsonb"
    type_m1 = cast(f"""CASE
        WHEN {era.three} THEN CASE WHEN {original} THEN {o}.type
                                    WHEN {t} IS NULL
                                    THEN {SCHEMA}.refuse_text('event_row_malformed', {t}, {run_text}, {seq})
                                    ELSE {era3_type} END{malformed_arm}
        ELSE {t}
    END""", host.type_column)
    payload_m1 = cast(f"""CASE
        WHEN {era.three} THEN CASE WHEN {original} THEN ({o}.payload)::jsonb ELSE {era3_payload} END{
            malformed_arm.replace(malformed_era, malformed_era + '::jsonb')}
        ELSE {p}
    END""", host.payload_column)
    original_join = (f"LEFT JOIN {SCHEMA}.events_v1_original {o} ON {o}.run_id {EQ} {run_text} "
                     f"AND {o}.sequence {EQ} {seq}")

    clean_join = (f"LEFT JOIN {SCHEMA}.payloads_clean {C}_clean ON {C}_clean.run_id {EQ} "
                  f"{run}{'' if types[host.run_id_column] == 'text' else '::text'}")
    events = quote_relation(host.events_table)
    events_name = relation_name(events)  # the name the classifier guards (proxy.readpath.classify)
    may_read = (f"(SELECT pg_catalog.has_table_privilege({quote_literal(quote_relation(host.events_table))}::regclass, "
                f"'SELECT'))")

    def gate(major: int) -> str:
        """A translated relation of ``major`` reads only in a session of that major, a raw or an unclaimed one
        (ADR 0019): the seat's relations read the table as their owner, past the net, so server-side code of a
        session of the other major (dynamic SQL) must not reach them. One InitPlan per statement."""
        return f"{may_read} AND {net_gate(major)}"

    def translated_columns(major: int) -> list[str]:
        """The table's columns in order, type and payload translated for ``major``, the rest as stored."""
        out = []
        for c in columns:
            if c.name == host.type_column:
                out.append(f"{type_m2 if major == 2 else type_m1} AS {quote_ident(c.name)}")
            elif c.name == host.payload_column:
                out.append(f"{payload_m2 if major == 2 else payload_m1} AS {quote_ident(c.name)}")
            else:
                out.append(f"{E}.{quote_ident(c.name)}")
        return out

    def lock_view(major: int) -> str:
        """``events_m2_lock`` (``_m1``): the same translated columns over the host's table alone, the era and the
        marks read by scalar sub-selects instead of outer joins, and no v2 store (ADR 0017). A row lock of a
        translated read (``FOR UPDATE`` …) is applied to it: PostgreSQL pushes the lock into a simple view and
        locks the events table's rows, which the view's owner may lock (the net's SELECT policy is ``true`` for
        it); the sub-selects are not in its ``FROM``, so nothing else is locked. The reader needs the table's
        ``UPDATE`` privilege, as for a lock on the table itself (``lock_privilege``)."""
        out = translated_columns(major)
        text = (','+chr(10)+'       ').join(out)
        key = f"{run}{'' if types[host.run_id_column] == 'text' else '::text'}"
        lx, lc, lo = f"{X}_l", f"{C}_lclean", f"{C}_lorig"
        if host.era_column is None:
            swaps = [(era.three, f"EXISTS (SELECT FROM {SCHEMA}.run_era {lx} WHERE {lx}.run_id {EQ} {key})")]
        else:
            swaps = [(f"{X}.{quote_ident(host.era_column)}",
                      f"(SELECT {lx}.{quote_ident(host.era_column)} FROM {quote_relation(host.runs_table)} {lx} "
                      f"WHERE {lx}.{quote_ident(host.run_id_column)} {EQ} {run})")]
        if major == 2:
            swaps.append((f"{C}_clean.run_id IS NOT NULL",
                          f"EXISTS (SELECT FROM {SCHEMA}.payloads_clean {lc} WHERE {lc}.run_id {EQ} {key})"))
        else:
            where_orig = f"WHERE {lo}.run_id {EQ} {run_text} AND {lo}.sequence {EQ} {seq}"
            swaps += [(original, f"EXISTS (SELECT FROM {SCHEMA}.events_v1_original {lo} {where_orig})"),
                      (f"{o}.type", f"(SELECT {lo}.type FROM {SCHEMA}.events_v1_original {lo} {where_orig})"),
                      (f"{o}.payload", f"(SELECT {lo}.payload FROM {SCHEMA}.events_v1_original {lo} {where_orig})")]
        for old, new in swaps:
            if old not in text:  # pragma: no cover - the expressions above changed
                raise AssertionError(f"lock view: {old!r} not in the translated columns")
            text = text.replace(old, new)
        for alias in (f"{X}.", f"{C}_clean.", f"{o}."):
            if alias in text:  # pragma: no cover - an outer join's column left in the lock view
                raise AssertionError(f"lock view: {alias!r} left in the translated columns")
        name = LOCK_VIEW[major]
        return f"""
DROP VIEW IF EXISTS {SCHEMA}.{name};
CREATE VIEW {SCHEMA}.{name} AS
SELECT {text}
FROM {events} {E}
WHERE {gate(major)} AND (SELECT {SCHEMA}.lock_privilege());
COMMENT ON VIEW {SCHEMA}.{name} IS
    'the events table as a major-{major} reader sees it, lockable: what a translated row lock reads (openwop-seat, '
    'ADR 0017); generated by migrate';
GRANT SELECT, UPDATE ON {SCHEMA}.{name} TO PUBLIC;
"""

    def insert_view(major: int) -> str:
        """``events_insert_m2`` (``_m1``): what the seat's rewrite of an ``INSERT … RETURNING`` writes through (ADR
        0019). A simple view of the table's columns, so PostgreSQL writes the table (its defaults, identity and
        generated columns, ``ON CONFLICT``, the writer rule's triggers) as the view's owner, whose SELECT policy is
        ``true``: the net, which refuses the new row of any other ``INSERT … RETURNING`` in a translated session,
        does not hold it. What it returns is translated: ``type`` and ``payload`` are not granted for reading
        (a ``RETURNING`` naming them is refused, ``42501``), ``openwop_seat_type``/``_payload`` are the written
        row's for this major (the era read with a fresh snapshot, as the append trigger saw it; each computed only
        when named), the system columns are carried as ``openwop_seat_sys_<name>``. Its check option asks for the
        reader's own ``INSERT`` privilege on the table (and ``UPDATE`` for a row an ``ON CONFLICT … DO UPDATE``
        changed: its ``xmax`` is set) and the session's major (``net_view``)."""
        type_fn, payload_fn = ("type_m2", "payload_m2") if major == 2 else ("type_m1", "payload_m1")
        era_now = f"{SCHEMA}.era_now({run_text})"
        keep = [c.name for c in columns if c.name not in (host.type_column, host.payload_column)]
        out = [f"{E}.{quote_ident(c.name)}" for c in columns]
        out.append(f"{SCHEMA}.{type_fn}({col(host.type_column)}, {era_now}, {run_text}, {seq}) AS {TYPE_OUT}")
        out.append(f"{SCHEMA}.{payload_fn}({col(host.type_column)}, ({p})::jsonb, {era_now}, {run_text}, {seq}, "
                   f"{col(host.event_id_column)}, {col(host.node_id_column)}) AS {PAYLOAD_OUT}")
        out += [f"{E}.{c} AS {SYSTEM_PREFIX}{c}" for c in SYSTEM_COLUMNS]
        readable = ", ".join([quote_ident(c) for c in keep] + [TYPE_OUT, PAYLOAD_OUT]
                             + [SYSTEM_PREFIX + c for c in SYSTEM_COLUMNS])
        name = INSERT_VIEW[major]
        return f"""
DROP VIEW IF EXISTS {SCHEMA}.{name};
CREATE VIEW {SCHEMA}.{name} AS
SELECT {(','+chr(10)+'       ').join(out)}
FROM {events} {E}
WHERE (SELECT {SCHEMA}.write_privilege('INSERT'))
  AND ({E}.xmax {EQ} 0 OR (SELECT {SCHEMA}.write_privilege('UPDATE')))
  AND {net_gate(major)}
WITH CASCADED CHECK OPTION;
COMMENT ON VIEW {SCHEMA}.{name} IS
    'what a major-{major} session''s INSERT … RETURNING writes through, returning the written rows translated '
    '(openwop-seat, ADR 0019); generated by migrate';
GRANT INSERT ON {SCHEMA}.{name} TO PUBLIC;
GRANT SELECT ({readable}) ON {SCHEMA}.{name} TO PUBLIC;
GRANT UPDATE ({", ".join(quote_ident(c) for c in keep)}) ON {SCHEMA}.{name} TO PUBLIC;
"""

    def view(major: int) -> str:
        out = translated_columns(major)
        joins = f"{era.join}\n{clean_join}" if major == 2 else f"{era.join}\n{original_join}"
        body = f"""SELECT {(','+chr(10)+'       ').join(out)}
FROM {events} {E}
{joins}
WHERE {gate(major)};"""
        if major == 2 and store:
            in_force = store_sql.in_force_sql(host.events_table, TRIGGER_PREFIX)
            # ADR 0015: the translation computed at read time for runs not in the v2 store, the store for the rest
            return f"""
DROP FUNCTION IF EXISTS {SCHEMA}.{store_sql.RUN_FUNCTION};
DROP FUNCTION IF EXISTS {SCHEMA}.{store_sql.RUN_LIVE_FUNCTION};
DROP FUNCTION IF EXISTS {SCHEMA}.{store_sql.ERA3_FUNCTION};
DROP VIEW IF EXISTS {store_sql.ERA3_VIEW};
DROP VIEW IF EXISTS {store_sql.FILLED};
DROP VIEW IF EXISTS {store_sql.MARKED};
DROP VIEW IF EXISTS {SCHEMA}.events_m2;
DROP VIEW IF EXISTS {SCHEMA}.events_m2_live;
CREATE VIEW {SCHEMA}.events_m2_live AS
{body}
COMMENT ON VIEW {SCHEMA}.events_m2_live IS
    'events_m2 computed at read time (ADR 0011): read by events_m2 for runs not in the v2 store (ADR 0015)';
REVOKE ALL ON {SCHEMA}.events_m2_live FROM PUBLIC;
{store_sql.store_tables_sql(host, columns, types[host.run_id_column])}{
    store_sql.store_view_sql(host, columns, events, (E, C), era, clean_join, gate(2), in_force, era2_type,
                             era2_payload_tail)}{
    store_sql.store_run_sql(host, columns, types[host.run_id_column], gate(2), in_force, may_read, events)}"""
        drop_run = (f"DROP FUNCTION IF EXISTS {SCHEMA}.{store_sql.RUN_FUNCTION};\n"
                    f"DROP FUNCTION IF EXISTS {SCHEMA}.{store_sql.RUN_LIVE_FUNCTION};\n"
                    f"DROP FUNCTION IF EXISTS {SCHEMA}.{store_sql.ERA3_FUNCTION};\n"
                    f"DROP VIEW IF EXISTS {store_sql.ERA3_VIEW};\n"
                    f"DROP VIEW IF EXISTS {store_sql.FILLED};\nDROP VIEW IF EXISTS {store_sql.MARKED};\n"
                    if major == 2 else "")
        return f"""
{drop_run}DROP VIEW IF EXISTS {SCHEMA}.{VIEW[major]};
CREATE VIEW {SCHEMA}.{VIEW[major]} AS
{body}
COMMENT ON VIEW {SCHEMA}.{VIEW[major]} IS
    'the events table as a major-{major} reader sees it (openwop-seat reader rule); generated by migrate';
GRANT SELECT ON {SCHEMA}.{VIEW[major]} TO PUBLIC;
"""

    # qualified throughout, types included: payload_v2 runs without a pinned search_path
    tenant_sql = "NULL::pg_catalog.text"
    if host.tenant_column:
        tenant_sql = (f"(SELECT ({C}.{quote_ident(host.tenant_column)})::pg_catalog.text "
                      f"FROM {quote_relation(host.runs_table)} {C} "
                      f"WHERE ({C}.{quote_ident(host.run_id_column)})::pg_catalog.text {EQ} run LIMIT 1)")
    compiled = compiled_sql(SCHEMA, artifacts, host.payload_carrier, orgs, tenant_sql, declared_types)
    if backward is not None:
        m1_three = (f"IF t IS NULL THEN PERFORM {SCHEMA}.refuse_row('event_row_malformed', t, run, seq); END IF;\n"
                    f"        RETURN COALESCE({jsonb_literal(backward)} OPERATOR(pg_catalog.->>) t, t);")
        m1_payload = ""
    else:
        m1_three = (f"PERFORM {SCHEMA}.refuse_row(CASE WHEN t IS NULL THEN 'event_row_malformed' "
                    f"ELSE 'v1_representation_refused' END, t, run, seq);")
        m1_payload = f"IF era {EQ} 3 THEN\n        {m1_three}\n    END IF;"
    return f"""
-- The classifier's guard on an unqualified name of the events table (issue 23): the name is the host's table
-- only where this session's search_path finds it there. No SET search_path (the caller's is the point), so
-- everything here is qualified with its schema. events_named is the guard every such statement calls: SQL,
-- so that PostgreSQL inlines it into the caller's plan (a PL/pgSQL call cost a page about 8 µs of backend CPU,
-- its set-up for each new transaction included, docs/performance.md); pg_table_is_visible of the host's table
-- is true exactly where its unqualified name finds it (the same walk of the search path). Anywhere else,
-- events_named_refuse asks again and refuses, naming what the name finds.
CREATE OR REPLACE FUNCTION {SCHEMA}.events_named_refuse(name text)
RETURNS boolean LANGUAGE plpgsql STABLE
AS $ow$
DECLARE
    v_found pg_catalog.regclass := pg_catalog.to_regclass(pg_catalog.quote_ident(name));
BEGIN
    IF v_found IS NULL OR v_found OPERATOR(pg_catalog.<>) {quote_literal(events)}::pg_catalog.regclass THEN
        PERFORM {SCHEMA}.refuse_statement('search_path', pg_catalog.format(
            'in this session the name %s finds %s, not the host''s events table %s that the seat translates: '
            'name the table with its schema, or set search_path so that it finds the host''s table',
            pg_catalog.quote_ident(name),
            COALESCE((SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) FROM pg_catalog.pg_class c
                      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                      WHERE c.oid OPERATOR(pg_catalog.=) v_found), 'no table'), {quote_literal(events)}));
    END IF;
    RETURN true;
END
$ow$;

CREATE OR REPLACE FUNCTION {SCHEMA}.events_named(name text)
RETURNS boolean LANGUAGE sql STABLE
AS $ow$
SELECT CASE WHEN name OPERATOR(pg_catalog.=) {quote_literal(events_name)}
                 AND pg_catalog.pg_table_is_visible({quote_literal(events)}::pg_catalog.regclass)
            THEN true ELSE {SCHEMA}.events_named_refuse(name) END
$ow$;

CREATE OR REPLACE FUNCTION {SCHEMA}.refuse_text(code text, t text, run text, seq bigint)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    -- STABLE (it only ever raises): a volatile call would keep PostgreSQL from flattening the views.
    PERFORM {SCHEMA}.refuse_row(code, t, run, seq);
    RETURN NULL;
END
$ow$;

{compiled}
-- RETURNING of a write: the written row's type and payload by the era the append trigger saw (era_now, a
-- fresh snapshot, passed in). STABLE, so that a column the RETURNING list does not name is not computed.
CREATE OR REPLACE FUNCTION {SCHEMA}.type_m2(t text, era smallint, run text, seq bigint)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    IF era {EQ} 3 THEN
        RETURN t;
    END IF;
    RETURN COALESCE({jsonb_literal(forward)} OPERATOR(pg_catalog.->>) t,
                    CASE WHEN {_vendor('t', orgs)} THEN t
                         ELSE {SCHEMA}.refuse_text(CASE WHEN t IS NULL THEN 'event_row_malformed'
                                                   ELSE 'event_type_unmapped' END, t, run, seq) END);
END
$ow$;

CREATE OR REPLACE FUNCTION {SCHEMA}.payload_m2(t text, p jsonb, era smallint, run text, seq bigint, eid text,
                                               node text)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    IF era {EQ} 3 THEN
        RETURN p;
    END IF;
    RETURN {SCHEMA}.payload_v2(t, p, run, seq, eid, node);
END
$ow$;

CREATE OR REPLACE FUNCTION {SCHEMA}.type_m1(t text, era smallint, run text, seq bigint)
RETURNS text LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    IF era {EQ} 3 THEN
        {m1_three}
    END IF;
    RETURN t;
END
$ow$;

CREATE OR REPLACE FUNCTION {SCHEMA}.payload_m1(t text, p jsonb, era smallint, run text, seq bigint, eid text,
                                               node text)
RETURNS jsonb LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    {m1_payload}
    RETURN p;
END
$ow$;

-- The payloads-clean marker: a run whose stored payloads all need no projection reads them as stored.
-- Any write that could break that (an append or update of a payload that is not v2-clean, or of a type
-- the reader rule cannot read) removes the mark in the same transaction: an update here, an append in the
-- append's final check (on_event_inserted, ADR 0020), one trigger per row.
CREATE OR REPLACE FUNCTION {SCHEMA}.on_event_clean()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_run text := (NEW.{quote_ident(host.run_id_column)})::text;
    v_type text := (NEW.{quote_ident(host.type_column)})::text;
    v_p jsonb;
BEGIN
    {clean_mark_sql(artifacts, host)}
    RETURN NULL;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.on_event_clean() FROM PUBLIC;

CREATE OR REPLACE FUNCTION {SCHEMA}.mark_payloads_clean(run text)
RETURNS boolean LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    -- Exclusive against the appends' shared run lock: no payload lands while the run is checked.
    PERFORM pg_advisory_xact_lock({SCHEMA}.run_lock_key(run));
    IF {SCHEMA}.era_now(run) {EQ} 3 THEN
        RETURN false;  -- an era-3 run is read as stored anyway
    END IF;
    IF EXISTS (SELECT 1 FROM {events} {E}
               WHERE {run_text} {EQ} run
                 AND NOT ({type_ok} AND ({p} IS NULL OR {SCHEMA}.fast_v2({t}, ({p})::jsonb)))) THEN
        RETURN false;
    END IF;
    INSERT INTO {SCHEMA}.payloads_clean (run_id) VALUES (run) ON CONFLICT (run_id) DO NOTHING;
    RETURN true;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.mark_payloads_clean(text) FROM PUBLIC;

-- A row lock of a translated read (ADR 0017) needs the table's UPDATE privilege, as on the table itself.
CREATE OR REPLACE FUNCTION {SCHEMA}.lock_privilege()
RETURNS boolean LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    IF NOT pg_catalog.has_table_privilege({quote_literal(events)}::pg_catalog.regclass, 'UPDATE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = pg_catalog.format('permission denied for table %s', {quote_literal(events)}),
            HINT = 'a row lock (FOR UPDATE, FOR SHARE …) needs the UPDATE privilege on the table';
    END IF;
    RETURN true;
END
$ow$;
GRANT EXECUTE ON FUNCTION {SCHEMA}.lock_privilege() TO PUBLIC;

-- ADR 0019: the seat's translated relations read the table as their owner, past the net; each reads only in a
-- session of its own major, a raw one (0) or an unclaimed one (NULL). Called once per statement (an InitPlan).
CREATE OR REPLACE FUNCTION {SCHEMA}.net_view(major smallint)
RETURNS boolean LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_major smallint;
    v_message text;
BEGIN
    -- The claim of this pid first (one index probe): none, or this major, is the page's path and needs no more.
    -- Only a claim of the other major is checked to be this backend's (session_major compares the backend's start,
    -- which reads the server's activity snapshot: a claim left by an earlier backend with the same pid is none).
    SELECT c.major INTO v_major FROM {SCHEMA}.claims c WHERE c.pid {EQ} pg_catalog.pg_backend_pid();
    IF v_major IN (1, 2) AND v_major {EQ} net_view.major IS NOT TRUE THEN
        v_major := {SCHEMA}.session_major();
    END IF;
    IF v_major IN (1, 2) AND v_major {EQ} net_view.major IS NOT TRUE THEN
        v_message := pg_catalog.format('{NET_CODE}: this session reads the events table through openwop-seat as '
                                       'major %s; the seat''s relations of major %s are not read in it', v_major,
                                       net_view.major);
        RAISE EXCEPTION USING ERRCODE = '{NET_SQLSTATE}', MESSAGE = v_message,
            DETAIL = pg_catalog.jsonb_build_object('error', '{NET_CODE}', 'message', v_message,
                                                   'details', pg_catalog.jsonb_build_object('major', v_major))::text,
            HINT = 'read the events table by its own name: the seat reads it through the relations of the session''s '
                   'major; see docs/refusals-and-errors.md#ow008-stored_read_refused';
    END IF;
    RETURN true;
END
$ow$;
GRANT EXECUTE ON FUNCTION {SCHEMA}.net_view(smallint) TO PUBLIC;

-- A write through the seat's insert views (ADR 0019) needs the privilege the same write on the table needs.
CREATE OR REPLACE FUNCTION {SCHEMA}.write_privilege(privilege text)
RETURNS boolean LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    IF NOT pg_catalog.has_table_privilege({quote_literal(events)}::pg_catalog.regclass, privilege) THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = pg_catalog.format('permission denied for table %s', {quote_literal(events)});
    END IF;
    RETURN true;
END
$ow$;
GRANT EXECUTE ON FUNCTION {SCHEMA}.write_privilege(text) TO PUBLIC;

{view(2)}{view(1)}{lock_view(2)}{lock_view(1)}{insert_view(2)}{insert_view(1)}{
    store_sql.store_functions_sql(host, columns, host.events_table) if store else ""}"""


# ------------------------------------------------------------------ catalog


async def qualified_tables(conn, host: HostConfig) -> HostConfig:
    """``host`` with the events and runs tables schema-qualified as the connected role finds them: the
    functions here pin their search_path, and a view must not depend on the reader's."""
    from dataclasses import replace

    out = {}
    for key in ("events_table", "runs_table"):
        # every part quoted, as quote_relation takes a name that starts with a quote (PostgreSQL's quote_ident
        # quotes only where needed: app."Events", which quote_relation would quote again)
        name = await conn.fetchval(
            "SELECT '\"' || pg_catalog.replace(n.nspname, '\"', '\"\"') || '\".\"' "
            "|| pg_catalog.replace(c.relname, '\"', '\"\"') || '\"' "
            "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = pg_catalog.to_regclass($1)", quote_relation(getattr(host, key)))
        if name is not None:
            out[key] = name
    return replace(host, **out)


async def events_columns(conn, host: HostConfig) -> list[Column] | None:
    """The events table's columns in attnum order, or None when the table does not exist."""
    rows = await conn.fetch(
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type "
        "FROM pg_catalog.pg_attribute a WHERE a.attrelid = pg_catalog.to_regclass($1) "
        "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum", quote_relation(host.events_table))
    return [Column(r["attname"], r["type"]) for r in rows] or None


# The columns of the seat's view and of the events table, compared by serve and the runtime check: a view
# that no longer matches the table (a column added, renamed or retyped after migrate) is stale.
VIEW_COLUMNS = """
SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = pg_catalog.to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


async def relation_problems(conn, host: HostConfig) -> list[str]:
    """Why the translated relations do not match the events table as it is now ([] when they do)."""
    table = [tuple(r) for r in await conn.fetch(VIEW_COLUMNS, quote_relation(host.events_table))]
    if not table:
        return [f"the events table {host.events_table!r} does not exist"]
    problems = []
    for name in [VIEW[m] for m in sorted(VIEW)] + [LOCK_VIEW[m] for m in sorted(LOCK_VIEW)]:
        view = [tuple(r) for r in await conn.fetch(VIEW_COLUMNS, f"{SCHEMA}.{name}")]
        if not view:
            problems.append(f"{SCHEMA}.{name} is missing")
        elif view != table:
            problems.append(f"{SCHEMA}.{name} no longer matches the columns of {host.events_table!r} "
                            f"(the table was altered after migrate)")
    return problems
