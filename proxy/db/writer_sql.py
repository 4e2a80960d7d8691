"""SQL of the writer rule: claims, stamping, the append and update triggers, and every generated function."""


from __future__ import annotations

from dataclasses import dataclass

from proxy.config import HostConfig
from proxy.db import store_sql
from proxy.db.layout import (
    _PROBE_SQLSTATE,
    CLAIM_CLOCK_TOLERANCE_US,
    CLAIM_SECRET_ENV,
    REWRITE_SETTING,
    RUN_LOCK_SEED,
    SCHEMA,
    TRIGGER_PREFIX,
    UPDATE_REFUSED_SQLSTATE,
    SchemaError,
)
from proxy.db.reader_sql import (
    TRY_REFUSED,
    _era_of_sql,
    _read_v1_sql,
    _read_v2_sql,
    _refuse_row_sql,
    _refuse_statement_sql,
    era_sql,
)
from proxy.db.sql import quote_ident, quote_literal, quote_qualified, text_array_literal
from proxy.errors import ERRORS

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
    IF claim.major IS NULL OR claim.major NOT IN (0, 1, 2) THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('openwop_seat.claim: major must be 0 (raw), 1 or 2, got %s',
                             coalesce(claim.major::text, 'NULL'));
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


def _claim_once_sql() -> str:
    tol = f"'{CLAIM_CLOCK_TOLERANCE_US} microseconds'::pg_catalog.interval"
    # One round trip (ADR 0013): the seat makes a nonce and takes its clock's time, the proof binds them to the
    # backend's pid and the major. A proof is good once: the claims row of a pid keeps the seat time of its last
    # one-round-trip claim, and a claim of that pid with a time not after it is refused (a replay). It is good only
    # within CLAIM_CLOCK_TOLERANCE_US of the server's clock, and not before the tolerance has passed since claims
    # was last found empty (UNLOGGED: a crash empties it; the row of pid 0 says since when it is complete).
    # LANGUAGE sql: nothing to compile in a fresh backend (a PL/pgSQL function is compiled at its first call in
    # each backend). The verdict is returned, never raised: 'ok', 'pooler <pid>' (the pid is not this backend's:
    # nothing recorded), 'clock', 'ledger', 'replay', or why the claim is refused. Whatever the verdict, the seat can
    # still claim with the challenge of ADR 0006 (it does on all but 'pooler' for a translated or v2 session).
    # The HMAC is HMAC-SHA256 (RFC 2104) with the key sha256(salt || secret), padded: claim_secret.hmac_ipad, hmac_opad.
    # The seat's time is compared with the server's as a timestamptz (at_ts): no numeric, no EXTRACT (each operator,
    # function and cast is one more catalog look-up in a fresh backend, ADR 0013's addendum). at_us / 1e6 in float8,
    # rounded to the microsecond by to_timestamp, is exact until 2^31 s (the year 2038) and within a microsecond until
    # 2^53 us (2255); the clock and ledger checks are a minute wide, and the replay check compares the integers
    # (test_claim_once). at_ts is NULL (refused: clock) for a time not after 1970, which to_timestamp might not take; the
    # guard uses int8 < int8, the operator the replay check needs anyway. since: when claims was last found empty
    # (-infinity: never since the layout step); claims is UNLOGGED, so after a crash it is empty and complete only
    # from then on (restarted writes that row again).
    # No comments in the body, and keep it short: a pg_proc row over about 2 KB is moved to pg_proc's TOAST table,
    # which a fresh backend then opens to read the body (about 0.08 ms more per claim, measured).
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.claim_once(pid integer, at_us bigint, nonce text, major integer, proof text)
RETURNS text LANGUAGE sql VOLATILE SECURITY DEFINER
{_PINNED}
AS $ow$
WITH me AS (
    SELECT s.hmac_ipad AS ipad, s.hmac_opad AS opad,
           (SELECT a.backend_start FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a)
               AS backend_start,
           CASE WHEN '0'::pg_catalog.int8 OPERATOR(pg_catalog.<) claim_once.at_us
                THEN pg_catalog.to_timestamp(claim_once.at_us::pg_catalog.float8
                                             OPERATOR(pg_catalog./) '1000000'::pg_catalog.float8) END AS at_ts,
           (SELECT c.backend_start FROM {SCHEMA}.claims c WHERE c.pid OPERATOR(pg_catalog.=) 0) AS since
    FROM (SELECT) one LEFT JOIN {SCHEMA}.claim_secret s ON true
), verdict AS (
    SELECT me.backend_start, me.since, CASE
        WHEN claim_once.major IS NULL OR claim_once.major NOT IN (0, 1, 2)
            THEN 'major must be 0 (raw), 1 or 2, got ' || coalesce(claim_once.major::text, 'NULL')
        WHEN me.ipad IS NULL THEN 'no claim secret is installed: run openwop-seat migrate with '
                                  'host.claim_secret_file or {CLAIM_SECRET_ENV}'
        WHEN claim_once.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
            THEN 'pooler ' || pg_catalog.pg_backend_pid()::text
        WHEN me.backend_start IS NULL THEN 'the owner of openwop_seat cannot see this session''s backend_start '
                                           '(GRANT pg_read_all_stats TO it)'
        WHEN claim_once.at_us IS NULL OR claim_once.nonce IS NULL OR pg_catalog.length(claim_once.nonce) < 16
             OR claim_once.proof IS DISTINCT FROM pg_catalog.encode(pg_catalog.sha256(me.opad || pg_catalog.sha256(
                    me.ipad || pg_catalog.convert_to('openwop_seat.claim_once:' || claim_once.pid::text || ':'
                                                     || claim_once.at_us::text || ':' || claim_once.nonce || ':'
                                                     || claim_once.major::text, 'UTF8'))), 'hex')
            THEN 'wrong secret'
        WHEN me.at_ts IS NULL
          OR me.at_ts OPERATOR(pg_catalog.<) (pg_catalog.statement_timestamp() OPERATOR(pg_catalog.-) {tol})
          OR me.at_ts OPERATOR(pg_catalog.>) (pg_catalog.statement_timestamp() OPERATOR(pg_catalog.+) {tol})
            THEN 'clock'
        WHEN me.since IS NULL OR me.at_ts OPERATOR(pg_catalog.<) (me.since OPERATOR(pg_catalog.+) {tol}) THEN 'ledger'
        ELSE 'ok' END AS v
    FROM me
), restarted AS (
    INSERT INTO {SCHEMA}.claims (pid, backend_start, major, claimed_at)
    SELECT 0, pg_catalog.now(), NULL, pg_catalog.now() FROM verdict WHERE verdict.since IS NULL
    ON CONFLICT (pid) DO NOTHING
), claimed AS (
    INSERT INTO {SCHEMA}.claims AS c (pid, backend_start, major, claimed_at, challenge, seat_time)
    SELECT pg_catalog.pg_backend_pid(), verdict.backend_start, claim_once.major, pg_catalog.now(), NULL,
           claim_once.at_us
    FROM verdict WHERE verdict.v OPERATOR(pg_catalog.=) 'ok'
    ON CONFLICT (pid) DO UPDATE
        SET backend_start = EXCLUDED.backend_start, major = EXCLUDED.major, claimed_at = EXCLUDED.claimed_at,
            challenge = NULL, seat_time = EXCLUDED.seat_time
        WHERE c.seat_time IS NULL OR c.seat_time OPERATOR(pg_catalog.<) EXCLUDED.seat_time
    RETURNING 1
)
SELECT CASE WHEN verdict.v OPERATOR(pg_catalog.<>) 'ok' THEN verdict.v
            WHEN EXISTS (SELECT FROM claimed) THEN 'ok' ELSE 'replay' END
FROM verdict
$ow$;
"""


def _claim_lost_sql() -> str:
    # A claim taken from a live backend by another session ends that backend (ADR 0016, rule 5 as amended): it
    # never runs another statement without the claim it was given, and a pooled backend whose claim is gone dies
    # while idle, which the pool sees, instead of being handed out. The triggers' WHEN leaves out the backend's own
    # writes (a claim, a pid's row taken over by a new backend), rows without a claim (a challenge only) and pid 0
    # (the ledger's row). A row whose backend has ended (its pid free, or another backend's now) ends nothing.
    # A live pid whose start time the owner of openwop_seat cannot see (without pg_read_all_stats), or a backend it
    # may not signal (a superuser's, for a non-superuser owner: pg_terminate_backend raises): the write is refused,
    # never left to keep a backend without its claim.
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.on_claim_lost()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
{_PINNED}
AS $ow$
DECLARE
    v_pids integer[];
    v_starts timestamptz[];
    v_seen timestamptz;
    i integer;
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        v_pids := ARRAY[OLD.pid];
        v_starts := ARRAY[OLD.backend_start];
    ELSE
        SELECT array_agg(c.pid), array_agg(c.backend_start) INTO v_pids, v_starts FROM {SCHEMA}.claims c
        WHERE c.major IS NOT NULL AND c.pid <> 0 AND c.pid <> pg_backend_pid();
    END IF;
    FOR i IN 1 .. coalesce(array_length(v_pids, 1), 0) LOOP
        SELECT a.backend_start INTO v_seen FROM pg_stat_get_activity(v_pids[i]) a;
        -- ended: its pid free, or another backend's now
        CONTINUE WHEN NOT FOUND OR v_seen IS DISTINCT FROM v_starts[i] AND v_seen IS NOT NULL;
        IF v_seen IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
                MESSAGE = format('openwop_seat: backend %s holds a claim, and the owner of openwop_seat cannot see '
                                 'its start time to end it', v_pids[i]),
                HINT = 'GRANT pg_read_all_stats TO the role that owns openwop_seat (the one that runs migrate)';
        END IF;
        PERFORM pg_terminate_backend(v_pids[i]);
    END LOOP;
    RETURN NULL;
END
$ow$;
"""


CLAIMS_TABLE = f"{SCHEMA}.claims"
# What a trigger on claims may compare a row with (a WHEN holds no subquery): not the backend's own, a claim made.
_CLAIM_OF_ANOTHER = "OLD.major IS NOT NULL AND OLD.pid <> 0 AND OLD.pid <> pg_catalog.pg_backend_pid()"


def claims_triggers() -> tuple[Trigger, ...]:
    """The triggers that end a backend whose claim another session takes (``_claim_lost_sql``)."""
    fn = f"{SCHEMA}.on_claim_lost()"
    return (
        Trigger(CLAIMS_TABLE, TRIGGER_PREFIX + "claim_deleted", f"""
CREATE OR REPLACE TRIGGER {TRIGGER_PREFIX}claim_deleted AFTER DELETE ON {CLAIMS_TABLE} FOR EACH ROW
    WHEN ({_CLAIM_OF_ANOTHER}) EXECUTE FUNCTION {fn};"""),
        Trigger(CLAIMS_TABLE, TRIGGER_PREFIX + "claim_changed", f"""
CREATE OR REPLACE TRIGGER {TRIGGER_PREFIX}claim_changed AFTER UPDATE ON {CLAIMS_TABLE} FOR EACH ROW
    WHEN ({_CLAIM_OF_ANOTHER}
          AND (NEW.pid, NEW.backend_start, NEW.major) IS DISTINCT FROM (OLD.pid, OLD.backend_start, OLD.major))
    EXECUTE FUNCTION {fn};"""),
        Trigger(CLAIMS_TABLE, TRIGGER_PREFIX + "claims_truncated", f"""
CREATE OR REPLACE TRIGGER {TRIGGER_PREFIX}claims_truncated BEFORE TRUNCATE ON {CLAIMS_TABLE}
    FOR EACH STATEMENT EXECUTE FUNCTION {fn};"""),
    )


# The current backend's claim (pid and start time): session_major()'s query, and the append triggers' own copy of
# it (their functions are SECURITY DEFINER of the owner of openwop_seat with search_path pinned, as
# session_major() is): the same claim, without a nested SECURITY DEFINER call per row (ADR 0020).
_MAJOR = (f"(SELECT c.major FROM {SCHEMA}.claims c WHERE c.pid = pg_backend_pid() "
          "AND c.backend_start = (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a))")


def _session_major_sql() -> str:
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.session_major()
RETURNS smallint LANGUAGE plpgsql STABLE SECURITY DEFINER
{_PINNED}
AS $ow$
BEGIN
    -- plpgsql, not sql: a SECURITY DEFINER SQL function is never inlined, and its body would be
    -- parsed and planned again in every statement (every append) that calls it.
    RETURN {_MAJOR};
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
        IF ({source_expr}) = 'created' THEN
            v_type := NULL;  -- an era-2 spelling: not printed to the v2 writer that creates the run (issue 23)
        END IF;
        {_raise_sql("era2_write_refused",
                    "format('run %s cannot be stamped era 3: it already holds events written in era 2 (%sat "
                    "sequence %s)%s, and an era-3 log takes no era-2 write', quote_nullable(v_run), "
                    "CASE WHEN v_type IS NULL THEN '' ELSE 'type ' || quote_nullable(v_type) || ' ' END, "
                    "coalesce(v_seq::text, 'unknown'), CASE WHEN (" + source_expr + ") = "
                    "'created' THEN ' before its runs row was created' ELSE '' END)",
                    "convert the run with openwop-seat backfill (it rewrites its events and stamps it in one "
                    "transaction), or create the run under a new id")}
    END IF;"""


def _stamp_run_sql(host: HostConfig, run_id_type: str | None, artifacts=None, events: EventsRef | None = None,
                   orphans: bool = False) -> str:
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
    orphan_probe = ""
    if orphans and check:
        # REPEATABLE READ / SERIALIZABLE: the history check read the events in this transaction's snapshot; an
        # append that committed after it (before this lock) is invisible there, but its record in
        # era2_orphan_appends is not invisible to a uniqueness check: PostgreSQL raises serialization_failure,
        # and the retry sees the events and refuses the stamp. The probe's own row is rolled back.
        orphan_probe = f"""
    IF stamp_run.source = 'created' AND current_setting('transaction_isolation') <> 'read committed' THEN
        BEGIN
            INSERT INTO {ORPHAN_APPENDS} (run_id) VALUES (stamp_run.run) ON CONFLICT (run_id) DO NOTHING;
            RAISE EXCEPTION USING ERRCODE = {quote_literal(_PROBE_SQLSTATE)};
        EXCEPTION WHEN SQLSTATE {quote_literal(_PROBE_SQLSTATE)} THEN
            NULL;
        END;
    END IF;"""
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
    END IF;{check}{orphan_probe}
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


def _on_event_insert_sql(artifacts, host: HostConfig, orphans: bool = False) -> str:
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
    orphan = ""
    if orphans:
        orphan = f"""
    -- An append to a run whose runs row does not exist (yet): recorded, for a v2 writer that creates the run
    -- under REPEATABLE READ or SERIALIZABLE after this commits (its snapshot may not show this row; stamp_run).
    IF v_era = 2 AND v_run IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM {quote_qualified(host.runs_table)} r
            WHERE r.{quote_ident(host.run_id_column)} = {run}) THEN
        INSERT INTO {ORPHAN_APPENDS} (run_id) VALUES (v_run) ON CONFLICT (run_id) DO NOTHING;
    END IF;"""
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
    END IF;
{orphan}"""
    else:
        probe = ""
    unmapped = "has no codemap row and no registered vendor prefix"
    vendor = (f"pg_catalog.strpos(v_type, '.') > 0\n"
              f"            AND pg_catalog.split_part(v_type, '.', 1) = ANY ({text_array_literal(orgs)})")
    # a vendor-prefixed v2 name the codemap renames is translated for a v2 writer, not stored as sent
    renamed_vendor = frozenset(v2 for v2 in to_v1 if "." in v2 and v2.split(".", 1)[0] in orgs)
    not_renamed = f"\n            AND NOT (v_type = ANY ({text_array_literal(renamed_vendor)}))" if renamed_vendor else ""
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
    -- An era-2 row whose type every writer stores as sent (an identity name, a registered vendor's type): no need
    -- to ask who writes it (the claim's lookup is the costly part of the guard; ADR 0020).
    IF v_era IS DISTINCT FROM 3 AND (v_type = ANY ({text_array_literal(identity)})
        OR ({vendor}{not_renamed})) THEN
        RETURN NEW;
    END IF;
    v_major := {_MAJOR};
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
    """The append's one AFTER INSERT row trigger: the final check of the row as stored, then the payloads-clean mark.

    The final check (ADR 0006): a host trigger that fires after ``zz_openwop_seat_append`` (a name sorting later,
    or one added by a role with only TRIGGER on the table) may change the row's run or type after the append
    guard judged it.  This one judges what was stored: it takes the stored run's lock, reads its era again, and
    refuses an era-2 write into an era-3 run, a v2 writer's row outside v2 vocabulary in an era-3 run, and one
    outside the v1 spellings the guard stores in an era-2 run.  Then, for a row it lets through, what the
    ``zz_openwop_seat_clean`` trigger did for an append before ADR 0020: a row that breaks its run's
    payloads-clean mark removes the mark.  One AFTER trigger per appended row instead of two.
    """
    from proxy.db.relations import clean_mark_sql

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
    seq = """v_seq := CASE WHEN (to_jsonb(NEW) ->> 'sequence') ~ '^-?[0-9]{1,18}$'
                          THEN (to_jsonb(NEW) ->> 'sequence')::bigint END;"""
    vendor = (f"(pg_catalog.strpos(v_type, '.') > 0\n"
              f"                     AND pg_catalog.split_part(v_type, '.', 1) = ANY ({text_array_literal(orgs)}))")
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
    v_p jsonb;
BEGIN
{_RUN_LOCK_SHARED}    v_era := {era_sql(host, run)};
    -- An era-2 row in a spelling the guard stores for a v2 writer is right for every writer: no need to ask
    -- who wrote it (the claim's lookup is the costly part of the check).
    IF v_era IS DISTINCT FROM 3 AND (v_type = ANY ({text_array_literal(stored_v1)})
        OR {vendor}) THEN
        NULL;
    ELSE
        v_major := {_MAJOR};
        IF v_major IS DISTINCT FROM 2 THEN
            IF v_era = 3 THEN
                {seq}
                {_raise_sql("era2_write_refused",
                            where + "'era-3', quote_nullable(v_run), coalesce(v_seq::text, 'unknown')) || "
                            "' by a writer that is not a v2 writer (major 1, raw, or a session the seat has not "
                            "claimed): an era-3 log takes no era-2 write'",
                            "appends to an era-3 run come from a session the seat claimed as major 2; a trigger that "
                            "changes an event's run or type after the seat's check does not change that")}
            END IF;
        ELSIF v_type IS NULL THEN
            {seq}
            {_raise_sql("event_row_malformed",
                        "format('the event row stored in run %s at sequence %s has a NULL type', "
                        "quote_nullable(v_run), coalesce(v_seq::text, 'unknown'))")}
        ELSIF NOT (v_type = ANY (CASE WHEN v_era = 3 THEN {text_array_literal(v2_names)}
                                      ELSE {text_array_literal(stored_v1)} END)
                   OR {vendor}) THEN
            {seq}
            {_raise_sql("event_type_unmapped",
                        where + "CASE WHEN v_era = 3 THEN 'era-3' ELSE 'era-2' END, quote_nullable(v_run), "
                        "coalesce(v_seq::text, 'unknown')) || CASE WHEN v_era = 3 THEN ' is not in v2 vocabulary' "
                        "ELSE ' is not a v1 spelling the seat stores for a v2 writer' END || "
                        "' (a trigger changed the row after the seat''s check)'")}
        END IF;
    END IF;
    -- The payloads-clean mark (proxy.db.relations): a row that breaks it removes it.
    {clean_mark_sql(artifacts, host)}
    RETURN NULL;
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
        -- The stored type is not printed: it is a v2 name, and this writer is not a v2 reader (issue 23).
        v_type := NULL;
        {_raise_sql("era2_write_refused",
                    "format('UPDATE of the event in era-3 run %s at sequence %s by a writer that is not "
                    "a v2 writer (major 1, raw, or a session the seat has not claimed): an era-3 log takes no "
                    "era-2 write', quote_nullable(v_run), coalesce(v_seq::text, 'unknown'))",
                    "the events of an era-3 run change only through a session the seat claimed as major 2")}
    END IF;
    RETURN NULL;
END
$ow$;
"""


def _run_write_era3_sql(host: HostConfig) -> str:
    """An UPDATE or DELETE of an era-3 run's runs row, by a session not claimed major 2: refused (issue 23), so
    that a v1 action on an era-3 run (a cancel: the runs row, then an event) fails before it changes anything.
    host.maintenance_role and the owner of openwop_seat (stamp_run's own UPDATE of the era column) pass."""
    old_run = f"OLD.{quote_ident(host.run_id_column)}"
    if host.era_column is None:
        era3 = f"{era_sql(host, old_run)} = 3"
    else:  # the row itself says (an AFTER DELETE trigger cannot look it up any more)
        era3 = f"OLD.{quote_ident(host.era_column)} IS NOT DISTINCT FROM 3"
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.on_run_write_era3()
RETURNS trigger LANGUAGE plpgsql VOLATILE
{_PINNED}
AS $ow$
DECLARE
    v_run text := ({old_run})::text;
    v_type text := NULL;
    v_seq bigint := NULL;
    v_sentence text;
BEGIN
    IF {_owner_or_maintenance_sql(host)} THEN
        RETURN NULL;
    END IF;
    IF v_run IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared({SCHEMA}.run_lock_key(v_run));
    END IF;
    IF {era3} THEN
        {_raise_sql("era2_write_refused",
                    "format('%s of the runs row of era-3 run %s by a writer that is not a v2 writer (major 1, raw, "
                    "or a session the seat has not claimed): an era-3 run takes no era-2 write', TG_OP, "
                    "quote_nullable(v_run))",
                    "an era-3 run changes only through a session the seat claimed as major 2")}
    END IF;
    RETURN NULL;
END
$ow$;
"""


def _delete_era3_sql(host: HostConfig) -> str:
    """A DELETE of an event of an era-3 run, by a session not claimed major 2: refused (issue 23), with the
    exceptions as for the stamp: host.maintenance_role and the owner of openwop_seat (an operator's cleanup)."""
    old_run = f"OLD.{quote_ident(host.run_id_column)}"
    allow = f"""IF {_owner_or_maintenance_sql(host)} THEN
        RETURN NULL;
    END IF;
    """
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.on_event_delete_era3()
RETURNS trigger LANGUAGE plpgsql VOLATILE
{_PINNED}
AS $ow$
DECLARE
    v_run text := ({old_run})::text;
    v_type text := NULL;  -- never printed: the stored type of an era-3 event is a v2 name
    v_seq bigint;
    v_sentence text;
BEGIN
    {allow}IF v_run IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock_shared({SCHEMA}.run_lock_key(v_run));
    END IF;
    IF {era_sql(host, old_run)} = 3 THEN
        v_seq := CASE WHEN (to_jsonb(OLD) ->> 'sequence') ~ '^-?[0-9]{{1,18}}$'
                      THEN (to_jsonb(OLD) ->> 'sequence')::bigint END;
        {_raise_sql("era2_write_refused",
                    "format('DELETE of the event in era-3 run %s at sequence %s by a writer that is not a v2 writer "
                    "(major 1, raw, or a session the seat has not claimed): an era-3 log takes no era-2 write', "
                    "quote_nullable(v_run), coalesce(v_seq::text, 'unknown'))",
                    "the events of an era-3 run are deleted only through a session the seat claimed as major 2")}
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
    old_run = f"OLD.{quote_ident(host.run_id_column)}"
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
        -- the stored type is not printed: it may be the other era's spelling of what the session reads (issue 23)
        DETAIL = format('the event of run %s at sequence %s: an event''s type and run are fixed '
                        'when it is appended', quote_nullable(({old_run})::text),
                        coalesce(to_jsonb(OLD) ->> 'sequence', 'unknown')),
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
    if "runs" in tables:
        name = TRIGGER_PREFIX + "run_era3"
        out.append(Trigger(host.runs_table, name, f"""
CREATE OR REPLACE TRIGGER {name} AFTER UPDATE OR DELETE ON {quote_qualified(host.runs_table)} FOR EACH ROW
    WHEN ({SCHEMA}.session_major() IS DISTINCT FROM 2)
    EXECUTE FUNCTION {SCHEMA}.on_run_write_era3();"""))
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
        # The payloads-clean mark (proxy.db.relations): a write that breaks it removes it. An append's is kept by
        # the final check above (on_event_inserted, ADR 0020): one AFTER trigger per appended row.
        name = TRIGGER_PREFIX + "clean"
        out.append(Trigger(host.events_table, name, f"""
CREATE OR REPLACE TRIGGER {name} AFTER UPDATE ON {events} FOR EACH ROW
    EXECUTE FUNCTION {SCHEMA}.on_event_clean();"""))
        name = TRIGGER_PREFIX + "update_era3"
        out.append(Trigger(host.events_table, name, f"""
CREATE OR REPLACE TRIGGER {name} AFTER UPDATE ON {events} FOR EACH ROW
    WHEN ({SCHEMA}.session_major() IS DISTINCT FROM 2)
    EXECUTE FUNCTION {SCHEMA}.on_event_update_era3();"""))
        if host.era_column is None and host.store and "runs" in tables:  # the v2 store (ADR 0015, proxy.db.store_sql)
            out.extend(Trigger(*t) for t in store_sql.store_triggers_sql(host, TRIGGER_PREFIX))
        name = TRIGGER_PREFIX + "delete_era3"
        out.append(Trigger(host.events_table, name, f"""
CREATE OR REPLACE TRIGGER {name} AFTER DELETE ON {events} FOR EACH ROW
    WHEN ({SCHEMA}.session_major() IS DISTINCT FROM 2)
    EXECUTE FUNCTION {SCHEMA}.on_event_delete_era3();"""))
    out.extend(claims_triggers())
    return tuple(out)


ORPHAN_APPENDS = f"{SCHEMA}.era2_orphan_appends"


def _orphan_appends_sql(host: HostConfig, orphans: bool) -> str:
    """The runs an append reached before their runs row existed (the run_era store only): what a v2 writer that
    creates such a run under REPEATABLE READ or SERIALIZABLE probes, since its snapshot may not show the events.
    Kept across migrate (a row matters only while a transaction that predates it is open). ``orphans``: the runs
    table exists, and ``host.runs_table`` names it with its schema (the functions' search_path is pinned)."""
    if host.era_column is not None or not orphans:
        return ""
    return f"""
CREATE TABLE IF NOT EXISTS {ORPHAN_APPENDS} (
    run_id text PRIMARY KEY,
    appended_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE {ORPHAN_APPENDS} IS
    'runs appended to before their runs row existed (era 2): a v2 creation of one under REPEATABLE READ probes it';
REVOKE ALL ON TABLE {ORPHAN_APPENDS} FROM PUBLIC;
"""


def writer_rule_sql(artifacts, host: HostConfig, run_id_type: str | None = None,
                    events: EventsRef | None = None, orphans: bool = False) -> str:
    """The writer rule's functions (CREATE OR REPLACE; the triggers are :func:`writer_triggers`).

    Known limit: with ``[host] era_column``, an append under REPEATABLE READ or
    SERIALIZABLE to a run whose stamp committed after the append's snapshot but
    before the append took the run's lock reads the run as era 2 (a held lock
    is still detected).  The run_era store detects it (see the module
    docstring); the host's runs table cannot be probed the same way.
    """
    orphans = orphans and host.era_column is None
    return "".join((_orphan_appends_sql(host, orphans), _claim_sql(), _claim_once_sql(), _claim_lost_sql(),
                    _session_major_sql(),
                    _run_lock_key_sql(), _stamp_run_sql(host, run_id_type, artifacts, events, orphans),
                    _on_event_insert_sql(artifacts, host, orphans), _on_event_inserted_sql(artifacts, host),
                    _on_run_insert_sql(host, artifacts, events), _on_run_update_sql(host), _on_event_update_sql(host),
                    _update_era3_sql(host), _delete_era3_sql(host), _run_write_era3_sql(host)))


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
    "claim_once(integer, bigint, text, integer, text)",
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
    "on_event_delete_era3()",
    "on_run_write_era3()",
    "on_run_insert()",
    "on_run_update()",
    "on_claim_lost()",
)
FUNCTIONS = PUBLIC_FUNCTIONS + PRIVATE_FUNCTIONS


def artifact_objects_sql(artifacts, host: HostConfig, run_id_type: str | None = None,
                         writer_host: HostConfig | None = None, events: EventsRef | None = None,
                         orphans: bool = False) -> str:
    """The DDL of every artifact-dependent function (CREATE OR REPLACE; idempotent), and their grants.

    ``writer_host``: ``host`` with the runs table schema-qualified (see
    :func:`qualified_host`), for the writer rule's functions, whose search_path
    is pinned; default ``host``. ``orphans``: the runs table exists and
    ``writer_host`` names it with its schema (the appends then record runs they
    reach before their runs row, for a v2 creation under REPEATABLE READ).
    """
    grants = "\n".join([f"GRANT EXECUTE ON FUNCTION {SCHEMA}.{f} TO PUBLIC;" for f in PUBLIC_FUNCTIONS]
                       + [f"REVOKE ALL ON FUNCTION {SCHEMA}.{f} FROM PUBLIC;" for f in PRIVATE_FUNCTIONS])
    from proxy.artifacts.payload_shapes import CarrierError, check_carrier
    from proxy.db.projection_sql import projection_sql, read_v2p_sql

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
                    writer_rule_sql(artifacts, writer_host or host, run_id_type, events, orphans))) + "\n" + grants + "\n"
