"""SQL of the reader rule: the era of a run, the read checks, and the generated read functions."""


from __future__ import annotations

from proxy.config import HostConfig
from proxy.db.layout import ERA_ALIAS, SCHEMA
from proxy.db.sql import quote_ident, quote_literal, quote_qualified, text_array_literal
from proxy.errors import ERRORS

# --- read-path SQL builders ---------------------------------------------------------

EQ = "OPERATOR(pg_catalog.=)"


def era_sql(host: HostConfig, run_id_expr: str) -> str:
    """A scalar SQL expression: the era (smallint 2 or 3) of the run whose id is ``run_id_expr``.

    Default store: the ``run_era`` row (absent means 2).  With ``host.era_column``:
    that column of the runs table, keyed by ``host.run_id_column``; NULL or no
    runs row means 2, 3 means 3, any other value refuses the statement with
    ``event_row_malformed`` (see the module docstring).
    """
    a = ERA_ALIAS
    if host.era_column is None:
        return (f"COALESCE((SELECT {a}.era FROM {SCHEMA}.run_era {a} "
                f"WHERE {a}.run_id {EQ} ({run_id_expr})::text), 2::smallint)")
    col = f"{a}.{quote_ident(host.era_column)}"
    key = f"{a}.{quote_ident(host.run_id_column)}"
    return (f"COALESCE((SELECT CASE WHEN {col} IS NULL THEN 2::smallint "
            f"WHEN {col} {EQ} 3 THEN 3::smallint "
            f"ELSE {SCHEMA}.refuse_row('event_row_malformed', NULL, ({key})::text, NULL) END "
            f"FROM {quote_qualified(host.runs_table)} {a} WHERE {key} {EQ} ({run_id_expr})), 2::smallint)")


def read_project_sql(host: HostConfig, era_expr: str, alias: str, function: str = "read_v2p",
                     payload: str | None = None) -> str:
    """The per-row check *and payload projection* of a major-2 read that outputs the payload column of the
    events table under ``alias`` (quoted): text, see :mod:`proxy.db.projection_sql`.

    ``function``: ``read_v2p`` (a refused row fails the statement), or ``try_v2p``, which takes the same
    arguments and returns the refusal instead (the cutover tools).  ``payload``: a jsonb expression projected
    instead of the stored payload (the cutover tools pass the stored payload with the operator's declarations
    applied, :func:`declared_payload_sql`)."""
    if function not in ("read_v2p", "try_v2p"):
        raise ValueError(f"read_project_sql: function must be read_v2p or try_v2p, got {function!r}")
    row, tail = _project_args(host, alias)
    if payload is not None:
        stored = f"({alias}.{quote_ident(host.payload_column)})::jsonb"
        assert row.count(stored) == 1
        row = row.replace(stored, f"({payload})")
    return f"{SCHEMA}.{function}({era_expr}, {row}, {tail})"


def declared_payload_sql(host: HostConfig, alias: str) -> str:
    """The stored payload of the row under ``alias`` with the operator's declarations applied for its v2 type
    (``declared_v2``, ADR 0010; the type mapped by the codemap as the reader maps it): jsonb."""
    t = f"({alias}.{quote_ident(host.type_column)})::text"
    return (f"{SCHEMA}.declared_v2(COALESCE({SCHEMA}.renamed_types() OPERATOR(pg_catalog.->>) {t}, {t}), "
            f"({alias}.{quote_ident(host.payload_column)})::jsonb)")


def returned_project_sql(host: HostConfig, alias: str) -> str:
    """:func:`read_project_sql` for a RETURNING list (the host's append): ``returned_v2p`` reads the era with
    a fresh snapshot (``era_now``) and projects, as ``read_v2p(era_now(run), …)`` would, but as one plpgsql
    call that PostgreSQL plans once per session instead of inlining it into every append's plan."""
    row, tail = _project_args(host, alias)
    return f"{SCHEMA}.returned_v2p({row}, {tail})"


def _project_args(host: HostConfig, alias: str) -> tuple[str, str]:
    """The arguments of read_v2p after the era: (type, payload, run, sequence) and (event id, node, tenant)."""
    def col(name: str | None) -> str:
        return f"({alias}.{quote_ident(name)})::text" if name else "NULL::text"

    run = f"{alias}.{quote_ident(host.run_id_column)}"
    tenant = "NULL::text"
    if host.tenant_column:
        r = "openwop_seat_tenant"
        # Only run.started needs it: the CASE keeps the lookup off every other row.
        tenant = (f"CASE WHEN {alias}.{quote_ident(host.type_column)} {EQ} 'run.started' THEN "
                  f"(SELECT ({r}.{quote_ident(host.tenant_column)})::text FROM {quote_qualified(host.runs_table)} {r} "
                  f"WHERE {r}.{quote_ident(host.run_id_column)} {EQ} {run} LIMIT 1) END")
    return (f"{col(host.type_column)}, ({alias}.{quote_ident(host.payload_column)})::jsonb, ({run})::text, "
            f"({alias}.sequence)::bigint", f"{col(host.event_id_column)}, {col(host.node_id_column)}, {tenant}")


def read_check_sql(major: int, era_expr: str, type_expr: str, run_id_expr: str, seq_expr: str) -> str:
    """The per-row check of a translated read: yields the row's era, or fails the statement."""
    if major == 2:
        fn = "read_v2"
    elif major == 1:
        fn = "read_v1"
    else:
        raise ValueError(f"read_check_sql: major must be 1 or 2, got {major!r}")
    return f"{SCHEMA}.{fn}({era_expr}, ({type_expr})::text, ({run_id_expr})::text, ({seq_expr})::bigint)"


# --- artifact objects ---------------------------------------------------------------

# What the non-raising twins (refusal_of, try_v2, try_project_row, try_v2p) return for a row the reader
# rule refuses: this prefix, then the refusal's envelope (JSON: error, message, details).
TRY_REFUSED = "E"


# The sentence of each refusal raised per row (MESSAGE is "<code>: <sentence>").
# Codes without an entry use their meaning from proxy.errors.
_ROW_SENTENCES = {
    "event_type_unmapped":
        "format('event type %s in era-2 run %s at sequence %s has no codemap row and no registered vendor prefix', "
        "quote_nullable(t), quote_nullable(run), coalesce(seq::text, 'unknown'))",
    "v1_representation_refused":
        "format('event type %s in era-3 run %s at sequence %s cannot be read in the v1 representation: "
        "the pinned codemap is not a bijection', "
        "quote_nullable(t), quote_nullable(run), coalesce(seq::text, 'unknown'))",
}


def _refuse_row_sql(raising: bool = True) -> str:
    """``refuse_row`` (raises the refusal of one row), or with ``raising`` false its twin ``refusal_of``, which
    returns ``TRY_REFUSED`` followed by the same envelope instead (for ``try_v2``: see :func:`_read_v2_sql`)."""
    sqlstates = "\n".join(f"        WHEN {quote_literal(e.code)} THEN {quote_literal(e.sqlstate)}"
                          for e in ERRORS.values())
    sentences = "\n".join(f"        WHEN {quote_literal(code)} THEN {expr}" for code, expr in _ROW_SENTENCES.items())
    meanings = "\n".join(f"            WHEN {quote_literal(e.code)} THEN {quote_literal(e.meaning)}"
                         for e in ERRORS.values())
    envelope = """jsonb_build_object(
            'error', code,
            'message', v_sentence,
            'details', jsonb_build_object('type', t, 'runId', run, 'sequence', seq))::text"""
    if raising:
        name, returns = "refuse_row", "smallint"
        finish = f"""RAISE EXCEPTION USING
        ERRCODE = v_sqlstate,
        MESSAGE = code || ': ' || v_sentence,
        DETAIL = {envelope};"""
    else:
        name, returns = "refusal_of", "text"
        finish = f"RETURN {quote_literal(TRY_REFUSED)} || {envelope};"
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.{name}(code text, t text, run text, seq bigint)
RETURNS {returns} LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_sqlstate text;
    v_sentence text;
BEGIN
    v_sqlstate := CASE code
{sqlstates}
    END;
    IF v_sqlstate IS NULL THEN
        RAISE EXCEPTION 'openwop_seat.{name}: unknown refusal code %', quote_nullable(code);
    END IF;
    v_sentence := CASE
        WHEN code = 'event_row_malformed' AND seq IS NULL THEN
            format('run %s has an era stamp that is neither 3 nor absent (absent means era 2)', quote_nullable(run))
        WHEN code = 'event_row_malformed' THEN
            format('the event row of run %s at sequence %s has a NULL type', quote_nullable(run),
                   coalesce(seq::text, 'unknown'))
    END;
    IF v_sentence IS NULL THEN
        v_sentence := CASE code
{sentences}
        END;
    END IF;
    IF v_sentence IS NULL THEN
        v_sentence := format('%s (type %s, run %s, sequence %s)', CASE code
{meanings}
            END, quote_nullable(t), quote_nullable(run), coalesce(seq::text, 'unknown'));
    END IF;
    {finish}
END
$ow$;
"""


def _read_v2_sql(artifacts, raising: bool = True) -> str:
    """``read_v2`` (the era check of a major-2 read: the row's era, or a raised refusal), or with ``raising``
    false its twin ``try_v2``: ``'3'``, ``'2'``, or the refusal as ``refusal_of`` returns it."""
    orgs = frozenset(artifacts.vendor_orgs) - frozenset(artifacts.reserved_orgs)
    if raising:
        name, returns, three, two, refuse = "read_v2", "smallint", "3::smallint", "2::smallint", "refuse_row"
    else:
        name, returns, three, two, refuse = "try_v2", "text", "'3'", "'2'", "refusal_of"
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.{name}(era smallint, t text, run text, seq bigint)
RETURNS {returns} LANGUAGE sql VOLATILE
AS $ow$
SELECT CASE
    WHEN era {EQ} 3 THEN {three}
    WHEN t {EQ} ANY ({text_array_literal(artifacts.v1_types)}) THEN {two}
    WHEN pg_catalog.strpos(t, '.') OPERATOR(pg_catalog.>) 0
         AND pg_catalog.split_part(t, '.', 1) {EQ} ANY ({text_array_literal(orgs)}) THEN {two}
    ELSE {SCHEMA}.{refuse}(CASE WHEN t IS NULL THEN 'event_row_malformed' ELSE 'event_type_unmapped' END,
                             t, run, seq)
END
$ow$;
"""


def _read_v1_sql(artifacts) -> str:
    if artifacts.v2_to_v1 is not None:
        body = f"""SELECT CASE
    WHEN era {EQ} 2 THEN 2::smallint
    WHEN t IS NULL THEN {SCHEMA}.refuse_row('event_row_malformed', t, run, seq)
    ELSE 3::smallint
END"""
    else:
        body = f"""SELECT CASE
    WHEN era {EQ} 2 THEN 2::smallint
    ELSE {SCHEMA}.refuse_row(CASE WHEN t IS NULL THEN 'event_row_malformed' ELSE 'v1_representation_refused' END,
                             t, run, seq)
END"""
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.read_v1(era smallint, t text, run text, seq bigint)
RETURNS smallint LANGUAGE sql VOLATILE
AS $ow$
{body}
$ow$;
"""


def _refuse_statement_sql() -> str:
    code = "statement_untranslatable"
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.refuse_statement(kind text, detail text)
RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = {quote_literal(ERRORS[code].sqlstate)},
        MESSAGE = {quote_literal(code + ': ')} || detail,
        DETAIL = jsonb_build_object(
            'error', {quote_literal(code)},
            'message', detail,
            'details', jsonb_build_object('kind', kind))::text;
END
$ow$;
"""


def _era_of_sql(host: HostConfig, run_id_type: str | None) -> str:
    arg = "$1" if host.era_column is None or run_id_type is None else f"CAST($1 AS {run_id_type})"
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.era_of(run text)
RETURNS smallint LANGUAGE sql STABLE
AS $ow$
SELECT {era_sql(host, arg)}
$ow$;
-- The same, VOLATILE: under READ COMMITTED it reads with a fresh snapshot. An INSERT's RETURNING
-- must see the era its append trigger saw after waiting for the run's lock (a stamp may have
-- committed while it waited), not the era of the statement's own, older snapshot.
-- plpgsql, not sql: a volatile SQL function with a sub-select is not inlined, and PostgreSQL then
-- parses and plans its body again in every statement that calls it (about 0.3 ms per append);
-- plpgsql plans it once per session.
CREATE OR REPLACE FUNCTION {SCHEMA}.era_now(run text)
RETURNS smallint LANGUAGE plpgsql VOLATILE
AS $ow$
BEGIN
    RETURN {era_sql(host, arg)};
END
$ow$;
-- read_v2p(era_now(run), …) for a RETURNING list, as one call planned once per session (see
-- returned_project_sql): inlined, read_v2p's body is parsed again in every append's plan.
CREATE OR REPLACE FUNCTION {SCHEMA}.returned_v2p(t text, p jsonb, run text, seq bigint,
                                            eid text, node text, tenant text)
RETURNS text LANGUAGE plpgsql VOLATILE
AS $ow$
BEGIN
    RETURN {SCHEMA}.read_v2p({SCHEMA}.era_now(run), t, p, run, seq, eid, node, tenant);
END
$ow$;
"""


def era_now_sql(run_id_expr: str) -> str:
    """The era of a run read with a fresh snapshot (for RETURNING of appends; see era_now)."""
    return f"{SCHEMA}.era_now(({run_id_expr})::text)"
