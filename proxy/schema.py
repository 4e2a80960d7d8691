"""The seat's own schema (``openwop_seat``) in the host database: layout steps, artifact objects, checks.

Layout versioning follows the seed on evolving stores:

* ``meta.layout_version`` records the layout the schema was migrated to.  The
  layout is changed only by the ordered :data:`STEPS`; a published step never
  changes (a later change is a new step), and each step runs in its own
  transaction under a session advisory lock, so replicas starting together
  migrate once.
* A layout newer than this code is refused (:class:`SchemaTooNew`); a layout the
  code has no step path from is refused (:class:`SchemaGap`) instead of guessed.

Separately from the layout, every ``migrate`` (re)installs the *artifact
objects*: SQL functions generated from the pinned spec artifacts (the v1 type
list, the registered vendor orgs, the bijection verdict) and from the
configured era store, in one transaction together with recording the artifact
digest and tag in ``meta``.  A proxy whose artifact digest differs from the
recorded one refuses to serve (:class:`DigestMismatch`), so every replica reads
one log one way.

The era of a run is read by the database itself, in the statement's own
snapshot: the read path appends :func:`read_check_sql` over :func:`era_sql` to
each translated statement.  ``read_v2``/``read_v1`` are single-expression SQL
functions that PostgreSQL inlines into the statement; a row the reader rule
cannot read makes ``refuse_row`` raise, which fails the statement (and aborts
an explicit transaction) exactly as any PostgreSQL error does, with the
dedicated SQLSTATE of :mod:`proxy.errors` and the OpenWOP error envelope as
JSON in DETAIL.

Era stores.  By default the era lives in ``openwop_seat.run_era``: a row only
for runs stamped 3, absent means 2, never an explicit 2 (the table's CHECK
enforces it).  With ``[host] era_column`` the era lives in a nullable integer
column of the host's runs table instead, with the same meaning: NULL, or no
runs row at all, means 2 (as an absent ``run_era`` row does), 3 means 3, and
any other value (including an explicit 2) is refused as ``event_row_malformed``
rather than guessed at: the seat only ever writes 3 there, so another value
means something else wrote the column, and the two stores must read alike.
``migrate`` suggests ``smallint CHECK (col = 3)`` for the column, which makes
such values impossible.

The writer rule lives in the database too (design §4), installed by ``migrate``:

* Who is writing.  Right after authentication the seat asks the session for
  a challenge (``openwop_seat.claim_challenge()``) and answers it with
  ``openwop_seat.claim(proof, major)``, the proof an HMAC under the salted
  SHA-256 of the secret that ``migrate`` stored in ``claim_secret`` (no other
  role can read it); the secret never reaches the session (ADR 0006).  The
  major is recorded in ``claims`` keyed by backend pid *and* backend start
  time, so a later backend that reuses the pid inherits nothing.
  ``session_major()`` is that record for the current backend, or NULL.  A
  session setting cannot stand in for it (any client can ``SET`` one), and no
  statement parsing can (dynamic SQL defeats it).  A session without a claim
  (one that bypasses the seat) is a v1 writer: the safe side.  The guard is
  as strong as the roles: the host must connect neither as a superuser nor as
  the owner of ``openwop_seat``.
* Stamping.  A run inserted by a major-2 session is stamped era 3 in the same
  transaction by a row trigger on the runs table, whatever SQL inserted it.
* Appends.  A row trigger on the events table applies the writer rule by the
  run's era and the session's major: a major-2 append to an era-2 run is stored
  in its v1 spelling (inverse codemap) or refused (``event_type_unmapped``), a
  major-2 append to an era-3 run must be in v2 vocabulary, and an append by any
  other session to an era-3 run is refused (``era2_write_refused``).  An
  UPDATE of an event's type or run is refused except for
  ``[host] maintenance_role``.
* Atomicity across replicas.  Every append takes a shared transaction-level
  advisory lock on ``run_lock_key(run)`` before it reads the run's era; every
  stamp (``stamp_run``, which the creation trigger and a backfill use) takes
  the same key exclusively before it writes.  A stamp therefore waits for the
  appends in flight to its run, and an append waits for a stamp in flight and
  then reads the era again in a fresh READ COMMITTED snapshot.  Under
  REPEATABLE READ or SERIALIZABLE the append reads the era in its transaction
  snapshot, so a stamp that commits after that snapshot was taken is detected
  instead and the append fails with ``serialization_failure`` (40001), to be
  retried as any such failure: a stamp still in flight is seen as a held lock,
  and one already committed, with the ``run_era`` store, by a probe of
  ``run_era``'s primary key (a uniqueness check sees rows no snapshot shows).
  With ``[host] era_column`` that second case is not detected (see
  :func:`writer_rule_sql`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import re
import secrets
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable

from . import __version__
from . import relations
from .config import Config, ConfigError, HostConfig
from .errors import ERRORS

SCHEMA = "openwop_seat"

# The session advisory lock every migrate takes: the first 8 bytes of
# sha256("openwop_seat.migrate") as a signed 64-bit integer.
LOCK_KEY = int.from_bytes(hashlib.sha256(b"openwop_seat.migrate").digest()[:8], "big", signed=True)

# The seed of run_lock_key (hashtextextended(run, seed)): the first 8 bytes of
# sha256("openwop_seat.run_lock") as a signed 64-bit integer.  Changing it would
# let seats of two releases stamp and append to one run without excluding each
# other: it is fixed, like LOCK_KEY.
RUN_LOCK_SEED = int.from_bytes(hashlib.sha256(b"openwop_seat.run_lock").digest()[:8], "big", signed=True)

# Where migrate (and serve) find the claim secret when [host] claim_secret_file is not set.
CLAIM_SECRET_ENV = "OPENWOP_SEAT_CLAIM_SECRET"
CLAIM_SECRET_MIN_LENGTH = 16

# What the seat sends right after authentication (ADR 0006): first the challenge, then the claim with the
# proof and the session's major as bind parameters (types given by OID in the Parse, no casts).  Every
# function and operator is schema-qualified, and the functions pin their search_path, so nothing the client
# set (search_path, its own operators or functions) changes what runs.  The claim also asks whether the
# session's role owns openwop_seat (such a role can bypass every in-database guard: warn about it).
CHALLENGE_SQL = "SELECT openwop_seat.claim_challenge()"
CLAIM_SQL = ("SELECT openwop_seat.claim($1, $2), pg_catalog.pg_has_role(session_user, n.nspowner, 'MEMBER') "
             "FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'openwop_seat'")
CLAIM_PARAM_OIDS = (25, 23)  # text, integer

# The SQLSTATE of the refusal of an UPDATE of events.type/run_id.  Not one of
# proxy.errors' codes: it is not a refusal of the OpenWOP writer rule but of a
# privilege (only host.maintenance_role may rewrite an event's type or run).
UPDATE_REFUSED_SQLSTATE = "42501"

# The transaction-local setting with which backfill names the one run whose event types it rewrites (the
# UPDATE guard admits that, for the owner of openwop_seat only: see _on_event_update_sql).
REWRITE_SETTING = "openwop_seat.rewrite_run"

# The triggers are named so that they fire after the host's own triggers of the
# same kind (PostgreSQL fires them in name order): the guard sees the row the
# host's triggers made.
TRIGGER_PREFIX = "zz_openwop_seat_"

# Raised and caught inside the append trigger only (the probe of run_era under
# REPEATABLE READ rolls its own insert back with it); never reaches a client.
_PROBE_SQLSTATE = "OW9PR"

# Alias of the era store inside era_sql's sub-select; chosen so that it cannot
# shadow an alias of the host's own statement (``r``, ``e``, ``x`` ...).
ERA_ALIAS = "openwop_seat_era"

INTEGER_TYPES = ("smallint", "integer", "bigint")


# --- errors --------------------------------------------------------------------


class SchemaError(Exception):
    """The seat's schema is absent, unusable by this code, or the host's tables do not fit."""


class SchemaMissing(SchemaError):
    """There is no ``openwop_seat`` schema (run ``openwop-seat migrate``)."""


class SchemaTooOld(SchemaMissing):
    """The layout is older than this code's: the objects this code needs are missing (run migrate)."""


class SchemaTooNew(SchemaError):
    """The database's layout is newer than this code knows: refused, never guessed at."""


class SchemaGap(SchemaError):
    """The database is at a layout this code has no step path from."""


class DigestMismatch(SchemaError):
    """The artifact digest recorded in the database differs from the running artifacts'."""


# --- layout steps ----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    version: int
    description: str
    sql: str


# Published steps never change; a later change is a new step appended here
# (and LAYOUT_VERSION bumped to it).
STEPS: tuple[Step, ...] = (
    Step(1, "create schema openwop_seat with meta and run_era", """
CREATE SCHEMA openwop_seat;
COMMENT ON SCHEMA openwop_seat IS 'owned by openwop-seat: change it only with openwop-seat migrate';
CREATE TABLE openwop_seat.meta (
    key text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE openwop_seat.run_era (
    run_id text PRIMARY KEY,
    era smallint NOT NULL CHECK (era = 3),
    stamped_at timestamptz NOT NULL DEFAULT now(),
    source text NOT NULL
);
COMMENT ON TABLE openwop_seat.run_era IS 'a row only for runs stamped era 3; absent means era 2 (never an explicit 2)';
GRANT USAGE ON SCHEMA openwop_seat TO PUBLIC;
GRANT SELECT ON openwop_seat.meta, openwop_seat.run_era TO PUBLIC;
"""),
    Step(2, "add claim_secret and claims (who is writing: the claimed major of each session)", """
CREATE TABLE openwop_seat.claim_secret (
    hash text NOT NULL,
    salt text NOT NULL
);
CREATE UNIQUE INDEX claim_secret_one_row ON openwop_seat.claim_secret ((true));
COMMENT ON TABLE openwop_seat.claim_secret IS
    'one row: hex sha256(salt || secret) of the secret a seat presents to openwop_seat.claim; never the secret';
REVOKE ALL ON TABLE openwop_seat.claim_secret FROM PUBLIC;
CREATE UNLOGGED TABLE openwop_seat.claims (
    pid integer PRIMARY KEY,
    backend_start timestamptz NOT NULL,
    major smallint NOT NULL CHECK (major IN (1, 2)),
    claimed_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE openwop_seat.claims IS
    'the major each seat session claimed, keyed by backend pid and start time; written only by openwop_seat.claim';
REVOKE ALL ON TABLE openwop_seat.claims FROM PUBLIC;
"""),
    Step(3, "add the writer rule's counters (database-wide, read by /metrics)", """
CREATE SEQUENCE openwop_seat.runs_stamped_created;
CREATE SEQUENCE openwop_seat.appends_translated;
COMMENT ON SEQUENCE openwop_seat.runs_stamped_created IS
    'counts runs stamped era 3 at creation by a v2 writer (nextval is not transactional: rolled-back stamps count)';
COMMENT ON SEQUENCE openwop_seat.appends_translated IS
    'counts v2 appends into era-2 runs stored under their v1 spelling (rolled-back appends count too)';
GRANT SELECT ON SEQUENCE openwop_seat.runs_stamped_created, openwop_seat.appends_translated TO PUBLIC;
"""),
    Step(4, "add events_v1_original (the rows backfill rewrote, as they were, for backfill --restore)", """
CREATE TABLE openwop_seat.events_v1_original (
    run_id text NOT NULL,
    sequence bigint NOT NULL,
    type text,
    payload text,
    original text NOT NULL,
    preserved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, sequence)
);
COMMENT ON TABLE openwop_seat.events_v1_original IS
    'each event row of a run backfill converted to era 3, as it was: type and payload in their text form, '
    'and the whole row in its row type''s text form; written and removed only by openwop-seat backfill';
REVOKE ALL ON TABLE openwop_seat.events_v1_original FROM PUBLIC;
"""),
    Step(5, "claims: a pending challenge per backend (the seat proves the secret without sending it)", """
ALTER TABLE openwop_seat.claims ALTER COLUMN major DROP NOT NULL, ADD COLUMN challenge text;
COMMENT ON TABLE openwop_seat.claims IS
    'the major each seat session claimed (NULL: none yet) and its pending challenge, keyed by backend pid and '
    'start time; written only by openwop_seat.claim_challenge and openwop_seat.claim';
"""),
    Step(6, "add payloads_clean (era-2 runs whose stored payloads need no projection: read as stored)", """
CREATE TABLE openwop_seat.payloads_clean (
    run_id text PRIMARY KEY,
    marked_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE openwop_seat.payloads_clean IS
    'era-2 runs every stored payload of which is already v2-clean, so that major-2 reads skip the projection; '
    'written by mark_payloads_clean, and a write that breaks it removes the row in the same transaction';
GRANT SELECT ON openwop_seat.payloads_clean TO PUBLIC;
"""),
)

LAYOUT_VERSION = 6

# Counters the writer rule keeps in the database (sequences: nextval neither blocks nor rolls back).
WRITER_COUNTERS = {
    "runs_stamped_created": "Runs stamped era 3 at creation by a v2 writer (database-wide)",
    "appends_translated": "v2 appends into era-2 runs stored under their v1 spelling (database-wide)",
}


def _check_steps() -> None:
    versions = [s.version for s in STEPS]
    if versions != list(range(1, LAYOUT_VERSION + 1)):  # pragma: no cover - a packaging mistake
        raise AssertionError(f"schema steps {versions} are not 1..{LAYOUT_VERSION}")


_check_steps()


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


def read_project_sql(host: HostConfig, era_expr: str, alias: str, function: str = "read_v2p") -> str:
    """The per-row check *and payload projection* of a major-2 read that outputs the payload column of the
    events table under ``alias`` (quoted): text, see :mod:`proxy.projection`.

    ``function``: ``read_v2p`` (a refused row fails the statement), or ``try_v2p``, which takes the same
    arguments and returns the refusal instead (the cutover tools)."""
    if function not in ("read_v2p", "try_v2p"):
        raise ValueError(f"read_project_sql: function must be read_v2p or try_v2p, got {function!r}")
    row, tail = _project_args(host, alias)
    return f"{SCHEMA}.{function}({era_expr}, {row}, {tail})"


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


# --- the writer rule: claims, stamping, appends ------------------------------------------

_PINNED = "SET search_path = pg_catalog, pg_temp"


def _claim_sql() -> str:
    no_secret = ("RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', "
                 "MESSAGE = 'openwop_seat.claim: wrong secret',\n"
                 "            HINT = 'no claim secret is installed: run openwop-seat migrate with "
                 f"host.claim_secret_file or {CLAIM_SECRET_ENV}';")
    no_start = ("RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',\n"
                "            MESSAGE = 'openwop_seat.claim: the owner of openwop_seat cannot see this session''s "
                "backend_start',\n"
                "            HINT = 'GRANT pg_read_all_stats TO the role that owns openwop_seat (the one that runs "
                "migrate)';")
    # A challenge and a proof (ADR 0006): the secret never reaches the session's backend.  claim_challenge()
    # records a fresh random challenge for this backend (pid and start time) and returns it with the salt;
    # the seat answers with HMAC-SHA256(sha256(salt || secret), 'openwop_seat.claim:' || challenge || ':' ||
    # major), which claim() verifies against the stored key and the pending challenge, then consumes it.  A
    # proof seen on one backend is worth nothing on another, nor twice on the same one.
    return f"""
DROP FUNCTION IF EXISTS {SCHEMA}.claim(text, integer);
CREATE OR REPLACE FUNCTION {SCHEMA}.claim_challenge()
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{_PINNED}
AS $ow$
DECLARE
    v_salt text;
    v_start timestamptz;
    v_challenge text;
BEGIN
    SELECT s.salt INTO v_salt FROM {SCHEMA}.claim_secret s;
    IF v_salt IS NULL THEN
        {no_secret}
    END IF;
    SELECT a.backend_start INTO v_start FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a;
    IF v_start IS NULL THEN
        {no_start}
    END IF;
    v_challenge := pg_catalog.pg_backend_pid()::text || '.'
        || ((EXTRACT(EPOCH FROM v_start) * 1000000)::bigint)::text || '.'
        || pg_catalog.translate(pg_catalog.gen_random_uuid()::text, '-', '')
        || pg_catalog.translate(pg_catalog.gen_random_uuid()::text, '-', '');
    INSERT INTO {SCHEMA}.claims AS c (pid, backend_start, major, claimed_at, challenge)
    VALUES (pg_catalog.pg_backend_pid(), v_start, NULL, pg_catalog.now(), v_challenge)
    ON CONFLICT (pid) DO UPDATE
        SET major = CASE WHEN c.backend_start = EXCLUDED.backend_start THEN c.major END,
            claimed_at = CASE WHEN c.backend_start = EXCLUDED.backend_start THEN c.claimed_at
                              ELSE EXCLUDED.claimed_at END,
            backend_start = EXCLUDED.backend_start, challenge = EXCLUDED.challenge;
    RETURN v_salt || ':' || v_challenge;
END
$ow$;
CREATE OR REPLACE FUNCTION {SCHEMA}.claim(proof text, major integer)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{_PINNED}
AS $ow$
DECLARE
    v_hash text;
    v_start timestamptz;
    v_challenge text;
    v_key bytea;
    v_ipad bytea;
    v_opad bytea;
    v_mac text;
BEGIN
    IF claim.major IS NULL OR claim.major NOT IN (1, 2) THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('openwop_seat.claim: major must be 1 or 2, got %s', coalesce(claim.major::text, 'NULL'));
    END IF;
    SELECT s.hash INTO v_hash FROM {SCHEMA}.claim_secret s;
    IF v_hash IS NULL THEN
        {no_secret}
    END IF;
    SELECT a.backend_start INTO v_start FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a;
    IF v_start IS NULL THEN
        {no_start}
    END IF;
    SELECT c.challenge INTO v_challenge FROM {SCHEMA}.claims c
    WHERE c.pid = pg_catalog.pg_backend_pid() AND c.backend_start = v_start FOR UPDATE;
    IF v_challenge IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = 'openwop_seat.claim: wrong secret',
            HINT = 'no challenge is pending for this backend: a claim answers openwop_seat.claim_challenge() '
                   'of the same backend, once';
    END IF;
    -- HMAC-SHA256 (RFC 2104) with the 32-byte key sha256(salt || secret), zero-padded to the 64-byte block.
    v_key := pg_catalog.decode(v_hash, 'hex') || pg_catalog.decode(pg_catalog.repeat('00', 32), 'hex');
    v_ipad := v_key;
    v_opad := v_key;
    FOR i IN 0..63 LOOP
        v_ipad := pg_catalog.set_byte(v_ipad, i, pg_catalog.get_byte(v_key, i) # 54);
        v_opad := pg_catalog.set_byte(v_opad, i, pg_catalog.get_byte(v_key, i) # 92);
    END LOOP;
    v_mac := pg_catalog.encode(pg_catalog.sha256(v_opad || pg_catalog.sha256(v_ipad || pg_catalog.convert_to(
        'openwop_seat.claim:' || v_challenge || ':' || claim.major::text, 'UTF8'))), 'hex');
    IF claim.proof IS NULL OR claim.proof IS DISTINCT FROM v_mac THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = 'openwop_seat.claim: wrong secret';
    END IF;
    UPDATE {SCHEMA}.claims c SET major = claim.major, claimed_at = pg_catalog.now(), challenge = NULL
    WHERE c.pid = pg_catalog.pg_backend_pid();
END
$ow$;
"""


def _session_major_sql() -> str:
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.session_major()
RETURNS smallint LANGUAGE plpgsql STABLE SECURITY DEFINER
{_PINNED}
AS $ow$
BEGIN
    -- plpgsql, not sql: a SECURITY DEFINER SQL function is never inlined, and its body would be
    -- parsed and planned again in every statement (every append) that calls it.
    RETURN (SELECT c.major FROM {SCHEMA}.claims c
            WHERE c.pid = pg_backend_pid()
              AND c.backend_start = (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a));
END
$ow$;
"""


def _run_lock_key_sql() -> str:
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.run_lock_key(run text)
RETURNS bigint LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $ow$
SELECT pg_catalog.hashtextextended(run, {RUN_LOCK_SEED}::bigint)
$ow$;
"""


@dataclass(frozen=True)
class EventsRef:
    """The host's events table as the writer rule's functions name it (their search_path is pinned)."""

    table: str  # schema-qualified and quoted
    run_id_type: str  # format_type of host.run_id_column in it


def _history_check_sql(artifacts, host: HostConfig, events: EventsRef | None, run_expr: str, source_expr: str) -> str:
    """plpgsql that refuses to stamp a run era 3 whose events are not all v2-clean (ADR 0006).

    At creation (source ``created``) a run must have no events at all: events that exist before a v2 writer
    creates the run were written in era 2 (by a v1 writer, or stored in their v1 spelling), and a stamp would
    make the reader take them for era-3 rows.  Any other stamp (``backfill``, an operator) is refused while an
    event's type is not in v2 vocabulary: backfill rewrites them in the same transaction before it stamps.
    Runs under the run's exclusive lock, so the appends in flight have committed.  Needs the declared
    variables v_type, v_run, v_seq, v_sentence.
    """
    if events is None:  # no events table yet: no history to check
        return ""
    rows = _codemap_rows(artifacts)
    v2_names = frozenset(rows.values())
    orgs = frozenset(artifacts.vendor_orgs) - frozenset(artifacts.reserved_orgs)
    run_col, typ = quote_ident(host.run_id_column), quote_ident(host.type_column)
    return f"""
    SELECT (e.{typ})::text, CASE WHEN (to_jsonb(e) ->> 'sequence') ~ '^-?[0-9]{{1,18}}$'
                                 THEN (to_jsonb(e) ->> 'sequence')::bigint END
    INTO v_type, v_seq
    FROM {events.table} e
    WHERE e.{run_col} = CAST(({run_expr}) AS {events.run_id_type})
      AND (({source_expr}) = 'created'
           OR e.{typ} IS NULL
           OR NOT ((e.{typ})::text = ANY ({text_array_literal(v2_names)})
                   OR (pg_catalog.strpos((e.{typ})::text, '.') > 0
                       AND pg_catalog.split_part((e.{typ})::text, '.', 1) = ANY ({text_array_literal(orgs)}))))
    LIMIT 1;
    IF FOUND THEN
        v_run := ({run_expr});
        {_raise_sql("era2_write_refused",
                    "format('run %s cannot be stamped era 3: it already holds events written in era 2 (type %s at "
                    "sequence %s)%s, and an era-3 log takes no era-2 write', quote_nullable(v_run), "
                    "quote_nullable(v_type), coalesce(v_seq::text, 'unknown'), CASE WHEN (" + source_expr + ") = "
                    "'created' THEN ' before its runs row was created' ELSE '' END)",
                    "convert the run with openwop-seat backfill (it rewrites its events and stamps it in one "
                    "transaction), or create the run under a new id")}
    END IF;"""


def _stamp_run_sql(host: HostConfig, run_id_type: str | None, artifacts=None, events: EventsRef | None = None) -> str:
    arg = "stamp_run.run" if run_id_type is None else f"CAST(stamp_run.run AS {run_id_type})"
    if host.era_column is None:
        write = f"""INSERT INTO {SCHEMA}.run_era (run_id, era, source)
    VALUES (stamp_run.run, 3, coalesce(stamp_run.source, 'unknown'))
    ON CONFLICT (run_id) DO NOTHING;"""
    else:
        col, key = quote_ident(host.era_column), quote_ident(host.run_id_column)
        write = f"""UPDATE {quote_qualified(host.runs_table)} SET {col} = 3
    WHERE {key} = {arg} AND {col} IS DISTINCT FROM 3;"""
    check = _history_check_sql(artifacts, host, events, "stamp_run.run", "stamp_run.source") if artifacts else ""
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.stamp_run(run text, source text)
RETURNS boolean LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{_PINNED}
AS $ow$
DECLARE
    v_type text;
    v_run text;
    v_seq bigint;
    v_sentence text;
BEGIN
    IF stamp_run.run IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'null_value_not_allowed', MESSAGE = 'openwop_seat.stamp_run: run is NULL';
    END IF;
    PERFORM pg_advisory_xact_lock({SCHEMA}.run_lock_key(stamp_run.run));
    IF {era_sql(host, arg)} = 3 THEN
        RETURN false;  -- stamped already: nothing to check, nothing to write
    END IF;{check}
    {write}
    RETURN FOUND;
END
$ow$;
"""


def stamp_run_sql(run_expr: str, source_expr: str) -> str:
    """SQL that stamps a run era 3 under the run's exclusive lock (a backfill's first statement).

    True when this call stamped it; false when it was stamped already (or, with
    ``[host] era_column``, has no runs row).  Only the owner of ``openwop_seat``
    may call it.  Call it before the backfill reads the run's events, in a
    READ COMMITTED transaction or as its first statement, so that the events it
    reads include every append that committed before the stamp.
    """
    return f"SELECT {SCHEMA}.stamp_run(({run_expr})::text, ({source_expr})::text)"


def host_append_lock_sql(host: HostConfig) -> str | None:
    """SQL taking the host's own per-run append lock (``[host] append_lock``) for the run bound as $1, or None.

    The configured expression names ``run_id``; it is evaluated over a one-row
    subquery that binds that name to $1 (text), so the expression is used as
    written, with no text substitution.
    """
    if host.append_lock is None:
        return None
    return f"SELECT ({host.append_lock}) FROM (SELECT $1::text AS run_id) AS openwop_seat_run"


def _codemap_rows(artifacts) -> dict[str, str]:
    # v1_types is the set of v1_to_v2's keys; filtering by it keeps a set whose
    # vocabulary was narrowed (by a test) one vocabulary.
    return {v1: v2 for v1, v2 in artifacts.v1_to_v2.items() if v1 in artifacts.v1_types}


def _case_sql(subject: str, mapping: dict[str, str]) -> str:
    """``CASE subject WHEN k THEN v ... END`` (NULL for an empty mapping), sorted for a stable text."""
    if not mapping:
        return "NULL::text"
    whens = "\n".join(f"        WHEN {quote_literal(k)} THEN {quote_literal(v)}" for k, v in sorted(mapping.items()))
    return f"CASE {subject}\n{whens}\n    END"


def _raise_sql(code: str, sentence: str, hint: str | None = None) -> str:
    """A RAISE of a writer-rule refusal: SQLSTATE of ``code``, MESSAGE ``code: sentence``, DETAIL the envelope."""
    e = ERRORS[code]
    hint_sql = f",\n        HINT = {quote_literal(hint)}" if hint else ""
    return f"""v_sentence := {sentence};
        RAISE EXCEPTION USING ERRCODE = {quote_literal(e.sqlstate)},
        MESSAGE = {quote_literal(code + ': ')} || v_sentence,
        DETAIL = jsonb_build_object('error', {quote_literal(code)}, 'message', v_sentence,
            'details', jsonb_build_object('type', v_type, 'runId', v_run, 'sequence', v_seq))::text{hint_sql};"""


# The append triggers' shared lock on the run (against a stamp in flight), in PL/pgSQL over v_run and v_key: under
# READ COMMITTED it waits; under a stricter isolation it asks for a retry, since the snapshot may predate the stamp.
_RUN_LOCK_SHARED = f"""    IF v_run IS NOT NULL THEN
        v_key := {SCHEMA}.run_lock_key(v_run);
        IF NOT pg_try_advisory_xact_lock_shared(v_key) THEN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION USING ERRCODE = 'serialization_failure',
                    MESSAGE = format('openwop_seat: run %s is being stamped era 3 by a concurrent transaction, '
                                     'so this %s transaction''s snapshot may not show its era: retry the transaction',
                                     quote_nullable(v_run), current_setting('transaction_isolation'));
            END IF;
            PERFORM pg_advisory_xact_lock_shared(v_key);
        END IF;
    END IF;
"""


def _on_event_insert_sql(artifacts, host: HostConfig) -> str:
    rows = _codemap_rows(artifacts)
    v2_names = frozenset(rows.values())
    identity = frozenset(v1 for v1, v2 in rows.items() if v1 == v2)
    preimages: dict[str, list[str]] = {}
    for v1, v2 in rows.items():
        preimages.setdefault(v2, []).append(v1)
    # The v1 spelling an era-2 log stores for a v2 name: the codemap's one v1
    # name for it.  A v2 name that is also its own v1 name is stored as is; a v2
    # name with several v1 names and none of them itself (the codemap is not a
    # bijection) has no spelling to store, and is refused.
    to_v1 = {v2: v1s[0] for v2, v1s in preimages.items() if v2 not in identity and len(v1s) == 1}
    ambiguous = frozenset(v2 for v2, v1s in preimages.items() if v2 not in identity and len(v1s) > 1)
    renamed = {v1: v2 for v1, v2 in rows.items() if v1 != v2 and v1 not in v2_names}  # v1-only spellings
    orgs = frozenset(artifacts.vendor_orgs) - frozenset(artifacts.reserved_orgs)
    run = f"NEW.{quote_ident(host.run_id_column)}"
    typ = f"NEW.{quote_ident(host.type_column)}"
    where = "format('event type %s appended to %s run %s at sequence %s', quote_nullable(v_type), "
    if host.era_column is None:
        probe = f"""
    -- REPEATABLE READ / SERIALIZABLE: a stamp that committed after this
    -- transaction's snapshot is invisible to the era read above, but not to a
    -- uniqueness check: insert the stamp's key and roll the insert back.  A
    -- committed conflicting row makes PostgreSQL raise serialization_failure.
    IF v_era = 2 AND v_run IS NOT NULL AND current_setting('transaction_isolation') <> 'read committed' THEN
        BEGIN
            INSERT INTO {SCHEMA}.run_era (run_id, era, source) VALUES (v_run, 3, 'openwop_seat.snapshot-probe')
                ON CONFLICT (run_id) DO NOTHING;
            RAISE EXCEPTION USING ERRCODE = {quote_literal(_PROBE_SQLSTATE)};
        EXCEPTION WHEN SQLSTATE {quote_literal(_PROBE_SQLSTATE)} THEN
            NULL;
        END;
    END IF;"""
    else:
        probe = ""
    unmapped = "has no codemap row and no registered vendor prefix"
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.on_event_insert()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{_PINNED}
AS $ow$
DECLARE
    v_run text := ({run})::text;
    v_type text := ({typ})::text;
    v_key bigint;
    v_era smallint;
    v_major smallint;
    v_other text;
    v_seq bigint;
    v_sentence text;
BEGIN
{_RUN_LOCK_SHARED}    -- READ COMMITTED: a fresh snapshot, taken after the lock (a stamp in flight has committed or rolled back).
    v_era := {era_sql(host, run)};{probe}
    v_major := {SCHEMA}.session_major();
    IF v_major IS DISTINCT FROM 2 THEN
        IF v_era = 3 THEN
            v_seq := CASE WHEN (to_jsonb(NEW) ->> 'sequence') ~ '^-?[0-9]{{1,18}}$'
                          THEN (to_jsonb(NEW) ->> 'sequence')::bigint END;
            {_raise_sql("era2_write_refused",
                        where + "'era-3', quote_nullable(v_run), coalesce(v_seq::text, 'unknown')) || "
                        "' by a writer that is not a v2 writer (major 1, raw, or a session the seat has not "
                        "claimed): an era-3 log takes no era-2 write'",
                        "appends to an era-3 run come from a session the seat claimed as major 2")}
        END IF;
        RETURN NEW;
    END IF;
    IF v_era = 3 THEN
        IF v_type = ANY ({text_array_literal(v2_names)}) THEN
            RETURN NEW;
        END IF;
    ELSE
        v_other := {_case_sql("v_type", to_v1)};
        IF v_other IS NOT NULL THEN
            NEW.{quote_ident(host.type_column)} := v_other;
            PERFORM pg_catalog.nextval('{SCHEMA}.appends_translated');
            RETURN NEW;
        END IF;
        IF v_type = ANY ({text_array_literal(identity)}) THEN
            RETURN NEW;
        END IF;
    END IF;
    IF pg_catalog.strpos(v_type, '.') > 0
       AND pg_catalog.split_part(v_type, '.', 1) = ANY ({text_array_literal(orgs)}) THEN
        RETURN NEW;
    END IF;
    v_seq := CASE WHEN (to_jsonb(NEW) ->> 'sequence') ~ '^-?[0-9]{{1,18}}$'
                  THEN (to_jsonb(NEW) ->> 'sequence')::bigint END;
    IF v_type IS NULL THEN
        {_raise_sql("event_row_malformed",
                    "format('the event row appended to run %s at sequence %s has a NULL type', "
                    "quote_nullable(v_run), coalesce(v_seq::text, 'unknown'))")}
    END IF;
    v_other := {_case_sql("v_type", renamed)};
    IF v_era = 3 THEN
        {_raise_sql("event_type_unmapped",
                    where + "'era-3', quote_nullable(v_run), coalesce(v_seq::text, 'unknown')) || CASE "
                    "WHEN v_other IS NOT NULL THEN format(' is a v1 spelling (its v2 name is %s): an era-3 log is "
                    "written in v2 vocabulary', quote_nullable(v_other)) "
                    f"ELSE ' {unmapped}' END")}
    END IF;
    {_raise_sql("event_type_unmapped",
                where + "'era-2', quote_nullable(v_run), coalesce(v_seq::text, 'unknown')) || CASE "
                "WHEN v_other IS NOT NULL THEN format(' by a v2 writer is a v1 spelling (its v2 name is %s): a v2 "
                "writer appends v2 names, and the seat stores their v1 spelling in an era-2 log', "
                "quote_nullable(v_other)) "
                f"WHEN v_type = ANY ({text_array_literal(ambiguous)}) THEN ' by a v2 writer has more than one v1 "
                "name in the codemap, so there is no v1 spelling to store in an era-2 log' "
                f"ELSE ' by a v2 writer {unmapped}, so it has no v1 spelling to store in an era-2 log' END")}
END
$ow$;
"""


def _on_event_inserted_sql(artifacts, host: HostConfig) -> str:
    """The final check of an append (AFTER INSERT): the stored row, whatever BEFORE triggers did to it.

    A host trigger that fires after ``zz_openwop_seat_append`` (a name sorting later, or one added by a role
    with only TRIGGER on the table) may change the row's run or type after the append guard judged it.  This
    one judges what was stored: it takes the stored run's lock, reads its era again, and refuses an era-2
    write into an era-3 run, a v2 writer's row outside v2 vocabulary in an era-3 run, and one outside the
    v1 spellings the guard stores in an era-2 run.
    """
    rows = _codemap_rows(artifacts)
    v2_names = frozenset(rows.values())
    identity = frozenset(v1 for v1, v2 in rows.items() if v1 == v2)
    preimages: dict[str, list[str]] = {}
    for v1, v2 in rows.items():
        preimages.setdefault(v2, []).append(v1)
    stored_v1 = frozenset(v1s[0] for v2, v1s in preimages.items() if v2 not in identity and len(v1s) == 1) | identity
    orgs = frozenset(artifacts.vendor_orgs) - frozenset(artifacts.reserved_orgs)
    run = f"NEW.{quote_ident(host.run_id_column)}"
    typ = f"NEW.{quote_ident(host.type_column)}"
    where = "format('event type %s stored in %s run %s at sequence %s', quote_nullable(v_type), "
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.on_event_inserted()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{_PINNED}
AS $ow$
DECLARE
    v_run text := ({run})::text;
    v_type text := ({typ})::text;
    v_key bigint;
    v_era smallint;
    v_major smallint;
    v_seq bigint;
    v_sentence text;
BEGIN
{_RUN_LOCK_SHARED}    v_era := {era_sql(host, run)};
    -- An era-2 row in a spelling the guard stores for a v2 writer is right for every writer: no need to ask
    -- who wrote it (session_major() is the costly part of the check).
    IF v_era IS DISTINCT FROM 3 AND (v_type = ANY ({text_array_literal(stored_v1)})
        OR (pg_catalog.strpos(v_type, '.') > 0
            AND pg_catalog.split_part(v_type, '.', 1) = ANY ({text_array_literal(orgs)}))) THEN
        RETURN NULL;
    END IF;
    v_major := {SCHEMA}.session_major();
    IF v_major IS DISTINCT FROM 2 AND v_era IS DISTINCT FROM 3 THEN
        RETURN NULL;
    END IF;
    IF v_major = 2 AND v_type IS NOT NULL AND (
        v_type = ANY (CASE WHEN v_era = 3 THEN {text_array_literal(v2_names)}
                           ELSE {text_array_literal(stored_v1)} END)
        OR (pg_catalog.strpos(v_type, '.') > 0
            AND pg_catalog.split_part(v_type, '.', 1) = ANY ({text_array_literal(orgs)}))) THEN
        RETURN NULL;
    END IF;
    v_seq := CASE WHEN (to_jsonb(NEW) ->> 'sequence') ~ '^-?[0-9]{{1,18}}$'
                  THEN (to_jsonb(NEW) ->> 'sequence')::bigint END;
    IF v_major IS DISTINCT FROM 2 THEN
        {_raise_sql("era2_write_refused",
                    where + "'era-3', quote_nullable(v_run), coalesce(v_seq::text, 'unknown')) || "
                    "' by a writer that is not a v2 writer (major 1, raw, or a session the seat has not "
                    "claimed): an era-3 log takes no era-2 write'",
                    "appends to an era-3 run come from a session the seat claimed as major 2; a trigger that "
                    "changes an event's run or type after the seat's check does not change that")}
    END IF;
    IF v_type IS NULL THEN
        {_raise_sql("event_row_malformed",
                    "format('the event row stored in run %s at sequence %s has a NULL type', "
                    "quote_nullable(v_run), coalesce(v_seq::text, 'unknown'))")}
    END IF;
    {_raise_sql("event_type_unmapped",
                where + "CASE WHEN v_era = 3 THEN 'era-3' ELSE 'era-2' END, quote_nullable(v_run), "
                "coalesce(v_seq::text, 'unknown')) || CASE WHEN v_era = 3 THEN ' is not in v2 vocabulary' "
                "ELSE ' is not a v1 spelling the seat stores for a v2 writer' END || "
                "' (a trigger changed the row after the seat''s check)'")}
END
$ow$;
"""


def _update_era3_sql(host: HostConfig) -> str:
    """An UPDATE of any column of an event of an era-3 run, by a session not claimed major 2: refused."""
    old_run, new_run = f"OLD.{quote_ident(host.run_id_column)}", f"NEW.{quote_ident(host.run_id_column)}"
    old_type = f"OLD.{quote_ident(host.type_column)}"
    allow = ""
    if host.maintenance_role is not None:
        allow = f"""IF current_user = {quote_literal(host.maintenance_role)} THEN
        RETURN NULL;
    END IF;
    """
    # backfill --restore (the owner of openwop_seat, naming the run in REWRITE_SETTING) puts an era-3 run's rows back.
    allow += f"""IF {old_run} IS NOT DISTINCT FROM {new_run}
       AND ({old_run})::text = current_setting({quote_literal(REWRITE_SETTING)}, true)
       AND {_owner_sql()} THEN
        RETURN NULL;
    END IF;
    """
    # SECURITY INVOKER: current_user is the role that runs the UPDATE (the era stores are readable by PUBLIC).
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.on_event_update_era3()
RETURNS trigger LANGUAGE plpgsql VOLATILE
{_PINNED}
AS $ow$
DECLARE
    v_run text := ({old_run})::text;
    v_type text := ({old_type})::text;
    v_seq bigint;
    v_sentence text;
BEGIN
    {allow}IF v_run IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared({SCHEMA}.run_lock_key(v_run));
    END IF;
    IF {era_sql(host, old_run)} = 3 OR {era_sql(host, new_run)} = 3 THEN
        v_seq := CASE WHEN (to_jsonb(OLD) ->> 'sequence') ~ '^-?[0-9]{{1,18}}$'
                      THEN (to_jsonb(OLD) ->> 'sequence')::bigint END;
        {_raise_sql("era2_write_refused",
                    "format('UPDATE of the event of type %s in era-3 run %s at sequence %s by a writer that is not "
                    "a v2 writer (major 1, raw, or a session the seat has not claimed): an era-3 log takes no "
                    "era-2 write', quote_nullable(v_type), quote_nullable(v_run), coalesce(v_seq::text, 'unknown'))",
                    "the events of an era-3 run change only through a session the seat claimed as major 2")}
    END IF;
    RETURN NULL;
END
$ow$;
"""


def _owner_sql() -> str:
    """A boolean SQL expression: current_user is the owner of stamp_run (the owner of openwop_seat)."""
    return (f"current_user = (SELECT pg_get_userbyid(p.proowner) FROM pg_proc p "
            f"WHERE p.oid = {quote_literal(SCHEMA + '.stamp_run(text,text)')}::regprocedure)")


def _owner_or_maintenance_sql(host: HostConfig) -> str:
    """A boolean SQL expression: current_user is the owner of stamp_run, or host.maintenance_role."""
    owner = _owner_sql()
    if host.maintenance_role is None:
        return owner
    return f"(current_user = {quote_literal(host.maintenance_role)} OR {owner})"


def _on_run_insert_sql(host: HostConfig, artifacts=None, events: EventsRef | None = None) -> str:
    key = f"NEW.{quote_ident(host.run_id_column)}"
    if host.era_column is None:
        # AFTER INSERT, only for major-2 sessions (the trigger's WHEN).
        body = f"""IF {key} IS NOT NULL THEN
        IF {SCHEMA}.stamp_run(({key})::text, 'created') THEN
            PERFORM pg_catalog.nextval('{SCHEMA}.runs_stamped_created');
        END IF;
    END IF;
    RETURN NULL;"""
    else:
        # BEFORE INSERT, only for major-2 sessions (the trigger's WHEN): stamp_run's lock, then the column.
        check = _history_check_sql(artifacts, host, events, f"({key})::text", "'created'") if artifacts else ""
        body = f"""IF {key} IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock({SCHEMA}.run_lock_key(({key})::text));{check}
    END IF;
    NEW.{quote_ident(host.era_column)} := 3;
    PERFORM pg_catalog.nextval('{SCHEMA}.runs_stamped_created');
    RETURN NEW;"""
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.on_run_insert()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{_PINNED}
AS $ow$
DECLARE
    v_type text;
    v_run text;
    v_seq bigint;
    v_sentence text;
BEGIN
    {body}
END
$ow$;
"""


def _on_run_update_sql(host: HostConfig) -> str:
    if host.era_column is None:
        body = "RETURN NEW;  -- no trigger uses it: with run_era an UPDATE of runs has no era to change"
    else:
        col = quote_ident(host.era_column)
        body = f"""-- An UPDATE of runs never changes a run's era, except stamp_run's own (it runs as the
    -- owner of openwop_seat) and one by host.maintenance_role.
    IF {_owner_or_maintenance_sql(host)} THEN
        RETURN NEW;
    END IF;
    NEW.{col} := OLD.{col};
    RETURN NEW;"""
    # SECURITY INVOKER: current_user is the role that runs the UPDATE.
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.on_run_update()
RETURNS trigger LANGUAGE plpgsql VOLATILE
{_PINNED}
AS $ow$
BEGIN
    {body}
END
$ow$;
"""


def _on_event_update_sql(host: HostConfig) -> str:
    events = f"{host.events_table}.{host.type_column}/{host.run_id_column}"
    message = f"openwop_seat: UPDATE of {events} is refused"
    allow = ""
    if host.maintenance_role is not None:
        allow = f"""IF current_user = {quote_literal(host.maintenance_role)} THEN
        RETURN NEW;
    END IF;
    """
    old_run, old_type = f"OLD.{quote_ident(host.run_id_column)}", f"OLD.{quote_ident(host.type_column)}"
    new_run = f"NEW.{quote_ident(host.run_id_column)}"
    # backfill (and backfill --restore), connected as the owner of openwop_seat, rewrites the types of the one
    # run it names in REWRITE_SETTING for its transaction; it never moves an event to another run.
    allow += f"""IF {old_run} IS NOT DISTINCT FROM {new_run}
       AND ({old_run})::text = current_setting({quote_literal(REWRITE_SETTING)}, true)
       AND {_owner_sql()} THEN
        RETURN NEW;
    END IF;
    """
    if host.maintenance_role is None:
        hint = "no role may rewrite them: host.maintenance_role is not set"
    else:
        hint = f"only the role {host.maintenance_role} (host.maintenance_role) may rewrite them"
    # SECURITY INVOKER: current_user is the role that runs the UPDATE.
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.on_event_update()
RETURNS trigger LANGUAGE plpgsql VOLATILE
{_PINNED}
AS $ow$
BEGIN
    {allow}RAISE EXCEPTION USING ERRCODE = {quote_literal(UPDATE_REFUSED_SQLSTATE)},
        MESSAGE = {quote_literal(message)},
        DETAIL = format('the event of run %s at sequence %s (type %s): an event''s type and run are fixed '
                        'when it is appended', quote_nullable(({old_run})::text),
                        coalesce(to_jsonb(OLD) ->> 'sequence', 'unknown'), quote_nullable(({old_type})::text)),
        HINT = {quote_literal(hint)};
END
$ow$;
"""


@dataclass(frozen=True)
class Trigger:
    table: str  # the host table (as configured; quoted when used)
    name: str
    sql: str


def writer_triggers(host: HostConfig, tables: frozenset[str]) -> tuple[Trigger, ...]:
    """The writer rule's triggers on those of the host's tables that exist (``tables``: ``{"runs", "events"}``).

    Row triggers, so every way a row arrives fires them: INSERT ... VALUES (one
    row or many), INSERT ... SELECT, COPY FROM, a function's INSERT, an upsert's
    insert.  ``session_replication_role = replica`` (logical replication's apply
    worker; ``pg_restore --disable-triggers``) does not fire them: the rows were
    checked where they were first written.
    """
    out = []
    if "runs" in tables:
        runs = quote_qualified(host.runs_table)
        if host.era_column is None:
            name = TRIGGER_PREFIX + "stamp"
            out.append(Trigger(host.runs_table, name, f"""
CREATE OR REPLACE TRIGGER {name} AFTER INSERT ON {runs} FOR EACH ROW
    WHEN ({SCHEMA}.session_major() = 2) EXECUTE FUNCTION {SCHEMA}.on_run_insert();"""))
        else:
            col = quote_ident(host.era_column)
            name = TRIGGER_PREFIX + "stamp_era_column"
            out.append(Trigger(host.runs_table, name, f"""
CREATE OR REPLACE TRIGGER {name} BEFORE INSERT ON {runs} FOR EACH ROW
    WHEN ({SCHEMA}.session_major() = 2) EXECUTE FUNCTION {SCHEMA}.on_run_insert();"""))
            name = TRIGGER_PREFIX + "keep_era_column"
            out.append(Trigger(host.runs_table, name, f"""
CREATE OR REPLACE TRIGGER {name} BEFORE UPDATE ON {runs} FOR EACH ROW
    WHEN (OLD.{col} IS DISTINCT FROM NEW.{col}) EXECUTE FUNCTION {SCHEMA}.on_run_update();"""))
    if "events" in tables:
        events = quote_qualified(host.events_table)
        run, typ = quote_ident(host.run_id_column), quote_ident(host.type_column)
        name = TRIGGER_PREFIX + "append"
        out.append(Trigger(host.events_table, name, f"""
CREATE OR REPLACE TRIGGER {name} BEFORE INSERT ON {events} FOR EACH ROW
    EXECUTE FUNCTION {SCHEMA}.on_event_insert();"""))
        # The final checks are AFTER ROW triggers: they see the row as stored, after every BEFORE trigger.
        name = TRIGGER_PREFIX + "append_check"
        out.append(Trigger(host.events_table, name, f"""
CREATE OR REPLACE TRIGGER {name} AFTER INSERT ON {events} FOR EACH ROW
    EXECUTE FUNCTION {SCHEMA}.on_event_inserted();"""))
        name = TRIGGER_PREFIX + "update"
        out.append(Trigger(host.events_table, name, f"""
CREATE OR REPLACE TRIGGER {name} AFTER UPDATE ON {events} FOR EACH ROW
    WHEN (OLD.{typ} IS DISTINCT FROM NEW.{typ} OR OLD.{run} IS DISTINCT FROM NEW.{run})
    EXECUTE FUNCTION {SCHEMA}.on_event_update();"""))
        # The payloads-clean mark (proxy.relations): a write that breaks it removes it.
        name = TRIGGER_PREFIX + "clean"
        out.append(Trigger(host.events_table, name, f"""
CREATE OR REPLACE TRIGGER {name} AFTER INSERT OR UPDATE ON {events} FOR EACH ROW
    EXECUTE FUNCTION {SCHEMA}.on_event_clean();"""))
        name = TRIGGER_PREFIX + "update_era3"
        out.append(Trigger(host.events_table, name, f"""
CREATE OR REPLACE TRIGGER {name} AFTER UPDATE ON {events} FOR EACH ROW
    WHEN ({SCHEMA}.session_major() IS DISTINCT FROM 2)
    EXECUTE FUNCTION {SCHEMA}.on_event_update_era3();"""))
    return tuple(out)


def writer_rule_sql(artifacts, host: HostConfig, run_id_type: str | None = None,
                    events: EventsRef | None = None) -> str:
    """The writer rule's functions (CREATE OR REPLACE; the triggers are :func:`writer_triggers`).

    Known limit: with ``[host] era_column``, an append under REPEATABLE READ or
    SERIALIZABLE to a run whose stamp committed after the append's snapshot but
    before the append took the run's lock reads the run as era 2 (a held lock
    is still detected).  The run_era store detects it (see the module
    docstring); the host's runs table cannot be probed the same way.
    """
    return "".join((_claim_sql(), _session_major_sql(), _run_lock_key_sql(), _stamp_run_sql(host, run_id_type, artifacts, events),
                    _on_event_insert_sql(artifacts, host), _on_event_inserted_sql(artifacts, host),
                    _on_run_insert_sql(host, artifacts, events), _on_run_update_sql(host), _on_event_update_sql(host),
                    _update_era3_sql(host)))


# Every role may call these (claim checks its secret; session_major tells a
# session only its own claim) ...
PUBLIC_FUNCTIONS = (
    "refuse_row(text, text, text, bigint)",
    "read_v2(smallint, text, text, bigint)",
    "read_v1(smallint, text, text, bigint)",
    "read_v2p(smallint, text, jsonb, text, bigint, text, text, text)",
    "fast_v2(text, jsonb)",
    "project_row(text, jsonb, text, bigint, text, text, text)",
    "payload_shapes()",
    "renamed_types()",
    "map_nested_types(jsonb)",
    "project_obj(text, jsonb, text)",
    "project_obj_with(text, jsonb, text, jsonb)",
    "project_v2(text, jsonb, text, text, text)",
    "refuse_statement(text, text)",
    "refusal_of(text, text, text, bigint)",
    "try_v2(smallint, text, text, bigint)",
    "try_project_row(text, jsonb, text, bigint, text, text, text)",
    "try_v2p(smallint, text, jsonb, text, bigint, text, text, text)",
    "era_of(text)",
    "era_now(text)",
    "returned_v2p(text, jsonb, text, bigint, text, text, text)",
    "claim(text, integer)",
    "claim_challenge()",
    "session_major()",
    "run_lock_key(text)",
)
# ... and only the owner of openwop_seat these (a trigger function fires whatever its grants).
PRIVATE_FUNCTIONS = (
    "stamp_run(text, text)",
    "on_event_insert()",
    "on_event_inserted()",
    "on_event_update()",
    "on_event_update_era3()",
    "on_run_insert()",
    "on_run_update()",
)
FUNCTIONS = PUBLIC_FUNCTIONS + PRIVATE_FUNCTIONS


def artifact_objects_sql(artifacts, host: HostConfig, run_id_type: str | None = None,
                         writer_host: HostConfig | None = None, events: EventsRef | None = None) -> str:
    """The DDL of every artifact-dependent function (CREATE OR REPLACE; idempotent), and their grants.

    ``writer_host``: ``host`` with the runs table schema-qualified (see
    :func:`qualified_host`), for the writer rule's functions, whose search_path
    is pinned; default ``host``.
    """
    grants = "\n".join([f"GRANT EXECUTE ON FUNCTION {SCHEMA}.{f} TO PUBLIC;" for f in PUBLIC_FUNCTIONS]
                       + [f"REVOKE ALL ON FUNCTION {SCHEMA}.{f} FROM PUBLIC;" for f in PRIVATE_FUNCTIONS])
    from .projection import CarrierError, check_carrier, projection_sql, read_v2p_sql

    try:
        check_carrier(host.payload_carrier, artifacts.vendor_orgs)
    except CarrierError as e:
        raise SchemaError(f"host.payload_carrier: {e}") from None
    sqlstate = ERRORS["payload_unprojectable"].sqlstate
    return "".join((_refuse_row_sql(), _read_v2_sql(artifacts), _read_v1_sql(artifacts),
                    projection_sql(SCHEMA, artifacts, host.payload_carrier), read_v2p_sql(SCHEMA, artifacts, sqlstate),
                    # the cutover tools' twins, which return refusals instead of raising them
                    _refuse_row_sql(raising=False), _read_v2_sql(artifacts, raising=False),
                    read_v2p_sql(SCHEMA, artifacts, sqlstate, raising=False, refused_prefix=TRY_REFUSED),
                    _refuse_statement_sql(), _era_of_sql(host, run_id_type),
                    writer_rule_sql(artifacts, writer_host or host, run_id_type, events))) + "\n" + grants + "\n"


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


# --- reading the layout ------------------------------------------------------------


async def _schema_exists(conn) -> bool:
    return await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)", SCHEMA)


async def read_meta(conn) -> dict[str, str] | None:
    """``meta`` as a dict; None when the schema is absent; SchemaGap when the schema has no meta table."""
    if not await _schema_exists(conn):
        return None
    if await conn.fetchval("SELECT pg_catalog.to_regclass('openwop_seat.meta') IS NULL"):
        raise SchemaGap(
            f"schema {SCHEMA} exists but has no meta table, so its layout is unknown (it was not made by "
            f"openwop-seat migrate, or has been damaged); this openwop-seat (layout {LAYOUT_VERSION}) has no step "
            f"path from it: restore the schema from a backup, or drop it if it holds nothing, then migrate")
    rows = await conn.fetch("SELECT key, value FROM openwop_seat.meta")
    return {r["key"]: r["value"] for r in rows}


def _layout_of(meta: dict[str, str] | None) -> int:
    """The layout version recorded in ``meta`` (0: no schema); SchemaTooNew/SchemaGap when unusable."""
    if meta is None:
        return 0
    raw = meta.get("layout_version")
    known = f"this openwop-seat ({__version__}) knows layouts 1..{LAYOUT_VERSION}"
    if raw is None or not re.fullmatch(r"[0-9]+", raw.strip()):
        what = "no layout_version" if raw is None else f"layout_version {raw!r}"
        raise SchemaGap(
            f"{SCHEMA}.meta records {what}: there is no step path from an unknown layout ({known}); "
            f"refusing to guess: restore the schema from a backup or repair meta by hand")
    version = int(raw)
    if version > LAYOUT_VERSION:
        raise SchemaTooNew(
            f"the database's {SCHEMA} layout is version {version}, newer than {known}: refusing to use it; "
            f"upgrade openwop-seat on every replica before (or together with) the first one that migrates")
    # STEPS is 1..LAYOUT_VERSION without holes (checked at import), so there is a
    # path from every version in that range and from none outside it.
    if version < 1:
        raise SchemaGap(
            f"{SCHEMA}.meta records layout_version {version}, and {known} with no step path from {version} "
            f"to {LAYOUT_VERSION}: refusing to guess: restore the schema from a backup or repair meta by hand")
    return version


async def read_layout(conn) -> int:
    """The database's layout version: 0 when the schema is absent; raises SchemaTooNew/SchemaGap."""
    return _layout_of(await read_meta(conn))


# --- the era column --------------------------------------------------------------------


async def check_era_column(conn, host: HostConfig) -> str:
    """Check ``host.era_column`` fits (nullable integer column of the runs table); returns the run id's type."""
    runs = quote_qualified(host.runs_table)
    col = quote_ident(host.era_column)
    suggestion = f"ALTER TABLE {runs} ADD COLUMN {col} smallint CHECK ({col} = 3);"
    oid = await conn.fetchval("SELECT pg_catalog.to_regclass($1)::oid", runs)
    if oid is None:
        raise SchemaError(
            f"host.era_column is {host.era_column!r}, but the runs table {host.runs_table!r} (host.runs_table) "
            f"does not exist in this database (as seen through the migrating role's search_path)")
    rows = await conn.fetch(
        """SELECT a.attname, a.attnum, a.attnotnull, pg_catalog.format_type(a.atttypid, a.atttypmod) AS type
           FROM pg_catalog.pg_attribute a
           WHERE a.attrelid = $1 AND a.attname = ANY($2::text[]) AND a.attnum > 0 AND NOT a.attisdropped""",
        oid, [host.era_column, host.run_id_column])
    cols = {r["attname"]: r for r in rows}
    key = cols.get(host.run_id_column)
    if key is None:
        raise SchemaError(
            f"the runs table {host.runs_table!r} has no column {host.run_id_column!r} (host.run_id_column), "
            f"so the era column cannot be looked up by run id: fix host.run_id_column")
    unique = await conn.fetchval(
        """SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                          WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL
                            AND i.indnkeyatts = 1 AND i.indkey[0] = $2)""", oid, key["attnum"])
    if not unique:
        raise SchemaError(
            f"{host.runs_table}.{host.run_id_column} has no unique index, so a run's era is not well defined; "
            f"run: ALTER TABLE {runs} ADD UNIQUE ({quote_ident(host.run_id_column)});")
    era = cols.get(host.era_column)
    if era is None:
        raise SchemaError(
            f"host.era_column is {host.era_column!r}, but the runs table {host.runs_table!r} has no such column; "
            f"run: {suggestion}")
    if era["type"] not in INTEGER_TYPES:
        raise SchemaError(
            f"{host.runs_table}.{host.era_column} is of type {era['type']}, expected an integer type "
            f"(smallint, integer or bigint); run: ALTER TABLE {runs} ALTER COLUMN {col} TYPE smallint "
            f"USING {col}::smallint;")
    if era["attnotnull"]:
        raise SchemaError(
            f"{host.runs_table}.{host.era_column} is NOT NULL, but NULL is how it says era 2; "
            f"run: ALTER TABLE {runs} ALTER COLUMN {col} DROP NOT NULL;")
    return key["type"]


# --- the host's tables and the writer rule's triggers ---------------------------------------

MIN_SERVER_VERSION = 140000  # CREATE OR REPLACE TRIGGER


async def writer_tables(conn, host: HostConfig) -> frozenset[str]:
    """Which of the host's tables exist (``"runs"``, ``"events"``); SchemaError when one lacks a configured column."""
    found = set()
    for kind, table, key, columns in (
            ("runs", host.runs_table, "host.runs_table", (("host.run_id_column", host.run_id_column),)),
            ("events", host.events_table, "host.events_table",
             (("host.run_id_column", host.run_id_column), ("host.type_column", host.type_column)))):
        oid = await conn.fetchval("SELECT pg_catalog.to_regclass($1)::oid", quote_qualified(table))
        if oid is None:
            continue
        have = {r["attname"] for r in await conn.fetch(
            "SELECT a.attname FROM pg_catalog.pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 "
            "AND NOT a.attisdropped", oid)}
        for column_key, column in columns:
            if column not in have:
                raise SchemaError(f"the {kind} table {table!r} ({key}) has no column {column!r} ({column_key}), "
                                  f"so the writer rule cannot be installed on it: fix {column_key}")
        found.add(kind)
    return frozenset(found)


async def qualified_host(conn, host: HostConfig) -> HostConfig:
    """``host`` with its runs table schema-qualified as the connected role's search_path finds it.

    The writer rule's functions pin their search_path (they are SECURITY
    DEFINER), so a host table they name must carry its schema.  Only the era
    column store names a host table in them (the runs table); it exists by then
    (check_era_column).
    """
    if host.era_column is None:
        return host
    row = await conn.fetchrow(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = pg_catalog.to_regclass($1)", quote_qualified(host.runs_table))
    if row is None:  # pragma: no cover - check_era_column refuses first
        raise SchemaError(f"the runs table {host.runs_table!r} (host.runs_table) does not exist")
    if "." in row["nspname"] or "." in row["relname"]:
        raise SchemaError(f"the runs table {host.runs_table!r} resolves to {row['nspname']}.{row['relname']}, "
                          f"whose names hold a dot: rename it, or name it in host.runs_table without one")
    return replace(host, runs_table=f"{row['nspname']}.{row['relname']}")


async def events_ref(conn, host: HostConfig) -> EventsRef:
    """The events table (which exists) schema-qualified, and the type of its run id column; SchemaError when the
    connected role (the owner of openwop_seat) cannot read it: stamp_run reads a run's events before it stamps."""
    row = await conn.fetchrow(
        "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS t, "
        "pg_catalog.format_type(a.atttypid, a.atttypmod) AS run_type, "
        "pg_catalog.has_table_privilege(c.oid, 'SELECT') AS readable "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = $2 AND NOT a.attisdropped "
        "WHERE c.oid = pg_catalog.to_regclass($1)", quote_qualified(host.events_table), host.run_id_column)
    if row is None:  # pragma: no cover - writer_tables found it with the column
        raise SchemaError(f"the events table {host.events_table!r} (host.events_table) does not exist")
    if not row["readable"]:
        role = await conn.fetchval("SELECT current_user")
        raise SchemaError(f"the migrating role (the owner of openwop_seat) cannot read the events table "
                          f"{host.events_table!r}: stamp_run reads a run's events before it stamps the run era 3 "
                          f"(a run with era-2 events is not stamped): GRANT SELECT ON {row['t']} TO {role}")
    return EventsRef(row["t"], row["run_type"])


# What the database runs for the writer rule, as text that does not depend on the session (search_path is set
# to pg_catalog for the query, so every name outside it comes out schema-qualified): one hash over every
# function of openwop_seat (signature, SECURITY DEFINER, its SET clauses, owner, body), and one per trigger
# that runs one (its definition and enabled state), keyed by table and name.  migrate records them in meta
# (installed_sha256, JSON); verify, the periodic check and SIGHUP compare (ADR 0006).
_INSTALLED_SQL = """
SELECT 'functions' AS k, pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
    COALESCE(pg_catalog.string_agg(
        p.proname::text || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')|'
        || p.prosecdef::text || '|' || COALESCE(pg_catalog.array_to_string(p.proconfig, ','), '')
        || '|' || pg_catalog.pg_get_userbyid(p.proowner)::text || '|' || p.prosrc,
        E'\\n' ORDER BY p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid)), ''), 'UTF8')), 'hex') AS v
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = 'openwop_seat')
UNION ALL
SELECT t.tgrelid::pg_catalog.regclass::text || ' ' || t.tgname::text,
       pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
           pg_catalog.pg_get_triggerdef(t.oid) || '|' || t.tgenabled::text, 'UTF8')), 'hex')
FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = 'openwop_seat')
  AND NOT t.tgisinternal"""


async def installed_objects(conn) -> dict[str, str]:
    """The hashes of the writer rule's functions and triggers as the database has them (see _INSTALLED_SQL)."""
    if conn.is_in_transaction():  # migrate's: set the path for this query only
        old = await conn.fetchval("SELECT pg_catalog.current_setting('search_path')")
        await conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog', true)")
        rows = await conn.fetch(_INSTALLED_SQL)  # (an error aborts the transaction: nothing to restore)
        await conn.execute("SELECT pg_catalog.set_config('search_path', $1, true)", old)
    else:
        async with conn.transaction():
            await conn.execute("SET LOCAL search_path TO pg_catalog")
            rows = await conn.fetch(_INSTALLED_SQL)
    return {r["k"]: r["v"] for r in rows}


async def installed_fingerprint(conn) -> str:
    """What meta.installed_sha256 holds: :func:`installed_objects` as canonical JSON."""
    return json.dumps(await installed_objects(conn), sort_keys=True, separators=(",", ":"))


async def check_installed(conn, meta: dict[str, str]) -> None:
    """SchemaError unless the functions, and each trigger that is there, are as migrate installed them.

    A trigger that is missing (or a table that is gone) is :func:`check_writer_rule`'s business; one that is
    there must be the one migrate installed, not replaced (``WHEN (false)``) or re-enabled otherwise.
    """
    raw = meta.get("installed_sha256")
    try:
        recorded = json.loads(raw) if raw is not None else None
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        raise SchemaTooOld(f"{SCHEMA}.meta records no usable installed_sha256 (the fingerprint of the writer "
                           f"rule's functions and triggers): run `openwop-seat migrate` with this release")
    now = await installed_objects(conn)
    changed = []
    if now.get("functions") != recorded.get("functions"):
        changed.append(f"a function of {SCHEMA} was replaced, added or removed")
    for key, value in sorted(now.items()):
        if key != "functions" and value != recorded.get(key):
            table, _, name = key.rpartition(" ")
            changed.append(f"trigger {name} on {table} is not the one migrate installed (replaced, or its "
                           f"enabled state changed)")
    if changed:
        raise SchemaError(
            f"the writer rule is not in force as `openwop-seat migrate` installed it: {'; '.join(changed)}; run "
            f"`openwop-seat migrate` and find out who changed it")


async def _seat_triggers(conn) -> dict[tuple[int, str], str]:
    """Every trigger that runs a function of openwop_seat: (table oid, name) -> tgenabled."""
    rows = await conn.fetch(
        "SELECT t.tgrelid::oid AS rel, t.tgname::text AS tgname, t.tgenabled::text AS tgenabled "
        "FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid "
        "WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = $1) "
        "AND NOT t.tgisinternal", SCHEMA)
    return {(r["rel"], r["tgname"]): r["tgenabled"] for r in rows}


async def _expected_triggers(conn, triggers) -> dict[tuple[int, str], Trigger]:
    out = {}
    for t in triggers:
        oid = await conn.fetchval("SELECT pg_catalog.to_regclass($1)::oid", quote_qualified(t.table))
        out[(oid, t.name)] = t
    return out


def _trigger_problems(expected: dict, present: dict[tuple[int, str], str]) -> tuple[list[str], list[tuple[int, str]]]:
    """(what is missing or disabled, the seat's triggers that should not be there)."""
    missing = []
    for key, t in expected.items():
        state = present.get(key)
        if state is None:
            missing.append(f"trigger {t.name} on {t.table} is missing")
        elif state not in ("O", "A"):
            missing.append(f"trigger {t.name} on {t.table} is disabled")
    return missing, sorted(k for k in present if k not in expected)


async def check_writer_rule(conn, config: Config) -> None:
    """SchemaError unless every writer-rule trigger is installed and enabled on the host's tables that exist."""
    host = config.host
    expected = await _expected_triggers(conn, writer_triggers(host, await writer_tables(conn, host)))
    missing, stray = _trigger_problems(expected, await _seat_triggers(conn))
    if missing:
        raise SchemaError(
            f"the writer rule is not in force: {'; '.join(missing)}: run `openwop-seat migrate` with this "
            f"configuration (it installs the triggers on the host's tables that exist)")
    if stray:
        names = []
        for rel, name in stray:
            names.append(f"{name} on {await conn.fetchval('SELECT $1::oid::regclass::text', rel)}")
        names = ", ".join(names)
        raise SchemaError(
            f"openwop_seat triggers that this configuration does not install are still in place ({names}): "
            f"the database was migrated with another [host] configuration; run `openwop-seat migrate` with this one")


# --- the claim secret ------------------------------------------------------------------------


def load_claim_secret(config: Config) -> str | None:
    """The secret of ``openwop_seat.claim``: ``[host] claim_secret_file``, else $OPENWOP_SEAT_CLAIM_SECRET, else None.

    The file's content is UTF-8 with any trailing newline removed.  A file that
    is missing, unreadable or empty, or a secret shorter than
    CLAIM_SECRET_MIN_LENGTH characters, is a ConfigError naming where it came
    from (never the secret).
    """
    path = config.host.claim_secret_file
    if path is not None:
        key = "host.claim_secret_file"
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise ConfigError(f"{key}: no such file {path!r}") from None
        except OSError as e:
            raise ConfigError(f"{key}: cannot read {path!r}: {e.strerror}") from None
        try:
            secret = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise ConfigError(f"{key}: {path!r} is not UTF-8") from None
    else:
        key = f"${CLAIM_SECRET_ENV}"
        secret = os.environ.get(CLAIM_SECRET_ENV)
        if secret is None:
            return None
    if not secret:
        raise ConfigError(f"{key}: the claim secret is empty")
    if "\0" in secret:
        raise ConfigError(f"{key}: the claim secret holds a NUL character")
    if len(secret) < CLAIM_SECRET_MIN_LENGTH:
        raise ConfigError(f"{key}: the claim secret has {len(secret)} characters, fewer than "
                          f"{CLAIM_SECRET_MIN_LENGTH} (make one with: openssl rand -hex 32)")
    return secret


def claim_key(salt: str, secret: str) -> bytes:
    """The claim's HMAC key: SHA-256 of ``salt || secret`` (UTF-8); its hex is what ``claim_secret.hash`` holds."""
    return hashlib.sha256((salt + secret).encode("utf-8")).digest()


def claim_proof(secret: str, challenge_answer: str, major: int) -> str:
    """The proof ``claim(proof, major)`` verifies, for what ``claim_challenge()`` returned (``salt:challenge``)."""
    salt, _, challenge = challenge_answer.partition(":")
    return hmac.new(claim_key(salt, secret), f"openwop_seat.claim:{challenge}:{major}".encode("utf-8"),
                    hashlib.sha256).hexdigest()


async def claim_async(conn, secret: str, major: int):
    """Claim ``major`` on an asyncpg connection as the seat does: the claim row ``(claim, owns openwop_seat)``."""
    challenge = await conn.fetchval(CHALLENGE_SQL)
    return await conn.fetchrow(CLAIM_SQL, claim_proof(secret, challenge, major), major)


def claim_secret_hash(salt: str, secret: str) -> str:
    """What ``claim_secret.hash`` holds: hex SHA-256 of ``salt || secret`` in UTF-8 (as ``claim`` computes it)."""
    return hashlib.sha256((salt + secret).encode("utf-8")).hexdigest()


async def _install_claim_secret(conn, secret: str | None, say: Callable[[str], None],
                                note: Callable[[str], None]) -> None:
    async with conn.transaction():
        row = await conn.fetchrow("SELECT hash, salt FROM openwop_seat.claim_secret")
        if secret is None:
            note("no claim secret given: the existing one is kept" if row is not None
                 else "no claim secret installed: every session is a v1 writer")
            return
        if row is not None and secrets.compare_digest(claim_secret_hash(row["salt"], secret), row["hash"]):
            note("the claim secret given is the one installed: kept")
            return
        salt = secrets.token_hex(16)
        await conn.execute("DELETE FROM openwop_seat.claim_secret")
        await conn.execute("INSERT INTO openwop_seat.claim_secret (hash, salt) VALUES ($1, $2)",
                           claim_secret_hash(salt, secret), salt)
    if row is None:
        say("installed the claim secret (its salted SHA-256: the secret itself is not stored)")
    else:
        say("replaced the claim secret: seats still holding the old one can no longer claim a major")


# --- migrate and verify --------------------------------------------------------------


def _objects_fingerprint(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


async def _upsert_meta(conn, values: dict[str, str]) -> None:
    await conn.executemany(
        "INSERT INTO openwop_seat.meta (key, value) VALUES ($1, $2) "
        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        list(values.items()))
    await conn.execute(
        "INSERT INTO openwop_seat.meta (key, value) VALUES ('updated_at', pg_catalog.now()::text) "
        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value")


async def _functions_present(conn) -> bool:
    return await conn.fetchval(
        "SELECT pg_catalog.bool_and(pg_catalog.to_regprocedure(f) IS NOT NULL) FROM pg_catalog.unnest($1::text[]) f",
        [f"{SCHEMA}.{f}" for f in FUNCTIONS])


async def migrate(dsn: str, config: Config, artifacts, *, out: Callable[[str], Any] = print) -> list[str]:
    """Bring the seat's schema to LAYOUT_VERSION and install the artifact objects; returns what was done."""
    done: list[str] = []

    def say(line: str) -> None:
        done.append(line)
        out(line)

    secret = load_claim_secret(config)  # before connecting: a bad secret file changes nothing
    conn = await connect(dsn)
    try:
        await conn.execute("SELECT pg_catalog.pg_advisory_lock($1)", LOCK_KEY)
        try:
            await _migrate_locked(conn, config, artifacts, secret, say, out)
        finally:
            if not conn.is_closed():
                await conn.execute("SELECT pg_catalog.pg_advisory_unlock($1)", LOCK_KEY)
    finally:
        await conn.close()
    if not done:
        say("nothing to do")
    return done


async def _migrate_locked(conn, config: Config, artifacts, secret: str | None, say: Callable[[str], None],
                          note: Callable[[str], None]) -> None:
    """``say``: something done (returned by migrate); ``note``: printed only."""
    current = await read_layout(conn)
    # Check the server and the host's tables before changing anything.
    version = int(await conn.fetchval("SELECT pg_catalog.current_setting('server_version_num')"))
    if version < MIN_SERVER_VERSION:
        raise SchemaError(f"PostgreSQL {await conn.fetchval('SHOW server_version')} is too old for openwop-seat: "
                          f"it needs PostgreSQL 14 or newer")
    run_id_type = await check_era_column(conn, config.host) if config.host.era_column is not None else None
    tables = await writer_tables(conn, config.host)
    events = await events_ref(conn, config.host) if "events" in tables else None  # before anything changes
    sees_sessions = await conn.fetchval(
        "SELECT pg_catalog.pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')")
    owner_problem = ("the migrating role (the owner of openwop_seat's functions) cannot see other roles' sessions "
                     "in pg_stat_activity, so openwop_seat.claim cannot tell one backend from a later one with the "
                     "same pid and refuses every claim: GRANT pg_read_all_stats TO " + (
                         await conn.fetchval("SELECT current_user")))
    if not sees_sessions and secret is not None:
        raise SchemaError(owner_problem)
    for step in STEPS[current:]:
        async with conn.transaction():
            # Re-read inside the step's transaction: a migrate that did not take
            # the lock (an older release) may have moved the layout meanwhile.
            now = await read_layout(conn)
            if now >= step.version:
                continue
            if now != step.version - 1:  # pragma: no cover - read_layout already refuses gaps
                raise SchemaGap(f"layout {now} cannot take step {step.version}")
            await conn.execute(step.sql)
            await _upsert_meta(conn, {"layout_version": str(step.version)})
        say(f"applied step {step.version}: {step.description}")

    for kind, table, key in (("runs", config.host.runs_table, "host.runs_table"),
                             ("events", config.host.events_table, "host.events_table")):
        if kind not in tables:
            note(f"the {kind} table {table!r} ({key}) does not exist in this database: the writer rule is not "
                 f"installed on it; create it and run migrate again")
    if not sees_sessions:
        note(owner_problem)

    triggers = writer_triggers(config.host, tables)
    writer_host = await qualified_host(conn, config.host)
    columns = await relations.events_columns(conn, config.host) if "events" in tables else None
    sql = (artifact_objects_sql(artifacts, config.host, run_id_type, writer_host, events)
           + (relations.relations_sql(artifacts, await relations.qualified_tables(conn, config.host), columns)
              if columns is not None else "")
           + "".join(t.sql for t in triggers) + "\n")
    fingerprint = _objects_fingerprint(sql)
    installed = False
    cleared = 0
    async with conn.transaction():
        meta = await read_meta(conn) or {}
        expected = await _expected_triggers(conn, triggers)
        missing, stray = _trigger_problems(expected, await _seat_triggers(conn))
        # A function or trigger changed since the last migrate (not by one): install again rather than bless it.
        tampered = await installed_fingerprint(conn) != meta.get("installed_sha256")
        if tampered or not (meta.get("artifact_digest") == artifacts.digest and meta.get("artifact_tag") == artifacts.tag
                and meta.get("objects_sha256") == fingerprint and await _functions_present(conn)
                and not missing and not stray
                and (columns is None or not await relations.relation_problems(conn, config.host))):
            for rel, name in stray:  # left by a migrate with another [host] configuration
                table = await conn.fetchval("SELECT $1::oid::regclass::text", rel)
                await conn.execute(f"DROP TRIGGER {quote_ident(name)} ON {table}")
            await conn.execute(sql)
            # The payloads-clean marks were made by the fast check being replaced: they are checked again by
            # the next mark_payloads_clean, never trusted across a change of the generated functions.
            cleared = await conn.fetchval(f"WITH d AS (DELETE FROM {SCHEMA}.payloads_clean RETURNING 1) "
                                          f"SELECT count(*) FROM d")
            await _upsert_meta(conn, {"artifact_digest": artifacts.digest, "artifact_tag": artifacts.tag,
                                      "objects_sha256": fingerprint})
            installed = True
        now = await installed_fingerprint(conn)
        if meta.get("installed_sha256") != now:
            await _upsert_meta(conn, {"installed_sha256": now})
    if installed:
        old = meta.get("artifact_digest")
        line = f"installed artifact objects for digest {artifacts.digest} (tag {artifacts.tag})"
        if old is not None and old != artifacts.digest:
            line += (f", replacing digest {old} (tag {meta.get('artifact_tag')}): seats still running the old "
                     f"artifacts now refuse to serve")
        say(line)
        if cleared:
            say(f"cleared {cleared} payloads-clean marks (the generated checks changed; mark the runs again)")
    await _install_claim_secret(conn, secret, say, note)


async def verify(conn_or_dsn, config: Config, artifacts) -> None:
    """Refuse to serve unless the schema is at LAYOUT_VERSION and records the running artifacts' digest.

    Raises SchemaMissing (no schema; SchemaTooOld, a subclass, when the layout is
    older than this code's), SchemaTooNew, SchemaGap, DigestMismatch, or a plain
    SchemaError when ``host.era_column`` does not fit or the writer rule's
    triggers are not in force on the host's tables that exist.
    """
    if isinstance(conn_or_dsn, str):
        conn = await connect(conn_or_dsn)
        try:
            return await verify(conn, config, artifacts)
        finally:
            await conn.close()
    conn = conn_or_dsn
    meta = await read_meta(conn)
    if meta is None:
        db = await conn.fetchval("SELECT pg_catalog.current_database()")
        raise SchemaMissing(
            f"database {db!r} has no {SCHEMA} schema: run `openwop-seat migrate --dsn ...` as the role "
            f"that is to own it (not the host's role) before serving")
    version = _layout_of(meta)
    if version < LAYOUT_VERSION:
        raise SchemaTooOld(
            f"the database's {SCHEMA} layout is version {version}, older than this openwop-seat's "
            f"({LAYOUT_VERSION}): run `openwop-seat migrate` with this release")
    recorded = meta.get("artifact_digest")
    if recorded is None:
        raise DigestMismatch(
            f"{SCHEMA}.meta records no artifact digest (a migrate did not finish installing the artifact "
            f"objects): run `openwop-seat migrate` with this release's artifacts (digest {artifacts.digest})")
    if recorded != artifacts.digest:
        raise DigestMismatch(
            f"the database records spec-artifact digest {recorded} (tag {meta.get('artifact_tag')}), but this "
            f"openwop-seat runs digest {artifacts.digest} (tag {artifacts.tag}); every replica must read one log "
            f"one way: run seats whose artifacts match, or switch the database to these artifacts with "
            f"`openwop-seat migrate` (seats on the old artifacts then refuse to serve)")
    if config.host.era_column is not None:
        await check_era_column(conn, config.host)
    await check_writer_rule(conn, config)
    await check_installed(conn, meta)


def cmd_migrate(config: Config, dsn: str) -> int:
    """``openwop-seat migrate --dsn DSN``: print what was done; 0, or 1 with the reason on stderr."""
    import asyncpg

    from .artifacts import ArtifactError, load_artifacts

    try:
        artifacts = load_artifacts()
        asyncio.run(migrate(dsn, config, artifacts, out=lambda line: print(line, flush=True)))
    except (SchemaError, ArtifactError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        print(f"openwop-seat migrate: {e}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as e:
        print(f"openwop-seat migrate: cannot connect to the database: {e}", file=sys.stderr)
        return 1
    return 0
