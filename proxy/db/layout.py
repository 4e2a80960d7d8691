"""The seat's schema in the host database: its name, fixed keys, the layout steps and their errors."""


from __future__ import annotations

import hashlib
from dataclasses import dataclass

from proxy.errors import SeatException

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
# The challenge also returns the backend's pid: when it is not the pid of the BackendKeyData the seat
# relayed, a pooler sits between the seat and PostgreSQL (its backends outlive the seat's session).
CHALLENGE_SQL = "SELECT openwop_seat.claim_challenge(), pg_catalog.pg_backend_pid()"
CLAIM_SQL = ("SELECT openwop_seat.claim($1, $2), pg_catalog.pg_has_role(session_user, n.nspowner, 'MEMBER') "
             "FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'openwop_seat'")
CLAIM_PARAM_OIDS = (25, 23)  # text, integer
# The claim in one round trip (ADR 0013): the seat's nonce and time, the proof bound to the backend's pid; the same
# schema-qualified form. Parameters: pid, at_us, nonce, major, proof.
CLAIM_ONCE_SQL = ("SELECT openwop_seat.claim_once($1, $2, $3, $4, $5), "
                  "pg_catalog.pg_has_role(session_user, n.nspowner, 'MEMBER') "
                  "FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) 'openwop_seat'")
# The same without the question whether the session's role owns openwop_seat, when the seat knows the answer from an
# earlier claim of the role (pg_has_role is a fifth of the claim's time in a fresh backend).
CLAIM_ONCE_ONLY_SQL = "SELECT openwop_seat.claim_once($1, $2, $3, $4, $5)"
CLAIM_ONCE_PARAM_OIDS = (23, 20, 25, 23, 25)  # integer, bigint, text, integer, text
# How far the seat's clock may be from the server's for a one-round-trip claim (else the seat falls back to the
# challenge), and so how long a proof is good for, and how long after a crash emptied claims no proof is taken.
CLAIM_CLOCK_TOLERANCE_US = 60_000_000

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


class SchemaError(SeatException):
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


class DeclarationsMismatch(DigestMismatch):
    """The declarations digest recorded in the database differs from the configured declarations' (ADR 0010),
    or the configured declarations file is unusable."""


# --- layout steps ----------------------------------------------------------------


def _padded_key_sql(pad: str) -> str:
    """SQL of claim_secret's HMAC key (``hash``: 32 bytes in hex) zero-padded to 64 bytes and XOR-ed with ``pad``
    repeated: the key as a 256-bit string XOR the pad, written out in hex 64 bits at a time, then the pad itself."""
    xor = f"('x' || hash)::bit(256) # ('x' || repeat('{pad}', 32))::bit(256)"
    parts = [f"lpad(to_hex(substring({xor}, {start}, 64)::bigint), 16, '0')" for start in (1, 65, 129, 193)]
    return "decode(" + "\n        || ".join(parts) + f"\n        || repeat('{pad}', 32), 'hex')"



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
    Step(7, "claims: major 0 for a raw session (a v1 writer whose reads are not translated: the net lets them be)",
         """
ALTER TABLE openwop_seat.claims DROP CONSTRAINT IF EXISTS claims_major_check;
ALTER TABLE openwop_seat.claims ADD CONSTRAINT claims_major_check CHECK (major IN (0, 1, 2));
COMMENT ON COLUMN openwop_seat.claims.major IS
    '2: a v2 host; 1: a v1 host (reads translated); 0: a raw session (a v1 writer that reads as stored); '
    'NULL: a challenge without a claim yet';
"""),
    Step(8, "claims: the seat time of a pid's last one-round-trip claim; claim_secret: the HMAC key's pads", """
-- claim_once (ADR 0013): a pid's claims row keeps the seat's time of its last one-round-trip claim (a proof is good
-- once: a later claim of the pid must come with a later time), and the row of pid 0 says since when claims is
-- complete (-infinity; claims is UNLOGGED, and claim_once writes that row again when a crash has emptied it)
ALTER TABLE openwop_seat.claims ADD COLUMN seat_time bigint;
COMMENT ON COLUMN openwop_seat.claims.seat_time IS
    'the seat''s time (µs since 1970) of the last one-round-trip claim of this pid: the next must be later';
INSERT INTO openwop_seat.claims (pid, backend_start, major, claimed_at) VALUES (0, '-infinity', NULL, now())
ON CONFLICT (pid) DO NOTHING;
-- the HMAC key (hash, 32 bytes) zero-padded to SHA-256's 64-byte block and XOR-ed with the pads, for claim_once
ALTER TABLE openwop_seat.claim_secret
    ADD COLUMN hmac_ipad bytea GENERATED ALWAYS AS (""" + _padded_key_sql("36") + """) STORED,
    ADD COLUMN hmac_opad bytea GENERATED ALWAYS AS (""" + _padded_key_sql("5c") + """) STORED;
"""),
    Step(9, "add seats, sessions_seen and audit_verdicts (the cutover's progress: who connected, which seat serves, "
            "audit's verdicts) and their writers seen() and live_claims()", """
CREATE TABLE openwop_seat.seats (
    seat text PRIMARY KEY,
    started_at timestamptz NOT NULL,
    last_seen timestamptz NOT NULL,
    version text NOT NULL,
    reported_by name NOT NULL,
    stopped_at timestamptz
);
COMMENT ON TABLE openwop_seat.seats IS
    'each seat process''s heartbeat (every few seconds while it serves) and when it stopped serving; written only '
    'by openwop_seat.seen';
GRANT SELECT ON openwop_seat.seats TO PUBLIC;
CREATE TABLE openwop_seat.sessions_seen (
    major text NOT NULL CHECK (major IN ('1', '2', 'raw')),
    usename text NOT NULL,
    first_seen timestamptz NOT NULL,
    last_seen timestamptz NOT NULL,
    sessions bigint NOT NULL CHECK (sessions >= 0),
    last_seat text NOT NULL,
    PRIMARY KEY (major, usename)
);
COMMENT ON TABLE openwop_seat.sessions_seen IS
    'which majors have connected through a seat and when last (to within a heartbeat), per database user; '
    'written only by openwop_seat.seen, never moved back';
GRANT SELECT ON openwop_seat.sessions_seen TO PUBLIC;
CREATE TABLE openwop_seat.audit_verdicts (
    finished_at timestamptz NOT NULL DEFAULT now(),
    ok boolean NOT NULL,
    summary jsonb NOT NULL,
    artifact_digest text NOT NULL,
    declarations_digest text NOT NULL,
    by_role name NOT NULL DEFAULT current_user
);
COMMENT ON TABLE openwop_seat.audit_verdicts IS
    'the verdict of each openwop-seat audit run by a role that may insert here (the owner of openwop_seat)';
GRANT SELECT ON openwop_seat.audit_verdicts TO PUBLIC;
CREATE FUNCTION openwop_seat.seen(p_seat text, p_started text, p_version text, p_majors jsonb,
                                  p_stopping boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    -- A seat's heartbeat and its tally since the last one: [[major, user, new sessions], ...]. The time is the
    -- database's, and last_seen only moves forward: a caller can add a sighting, never hide one. The last
    -- beat of a seat that stops (p_stopping) says so, and a later beat of the same seat clears it.
    INSERT INTO openwop_seat.seats AS s (seat, started_at, last_seen, version, reported_by, stopped_at)
    VALUES (p_seat, p_started::timestamptz, pg_catalog.now(), p_version, session_user,
            CASE WHEN p_stopping THEN pg_catalog.now() END)
    ON CONFLICT (seat) DO UPDATE SET last_seen = GREATEST(s.last_seen, EXCLUDED.last_seen),
        version = EXCLUDED.version, reported_by = EXCLUDED.reported_by, stopped_at = EXCLUDED.stopped_at;
    INSERT INTO openwop_seat.sessions_seen AS t (major, usename, first_seen, last_seen, sessions, last_seat)
    SELECT m ->> 0, m ->> 1, pg_catalog.now(), pg_catalog.now(), GREATEST((m ->> 2)::bigint, 0), p_seat
    FROM pg_catalog.jsonb_array_elements(COALESCE(p_majors, '[]'::jsonb)) AS m
    WHERE (m ->> 0) IN ('1', '2', 'raw') AND (m ->> 1) IS NOT NULL
    ON CONFLICT (major, usename) DO UPDATE SET last_seen = GREATEST(t.last_seen, EXCLUDED.last_seen),
        sessions = t.sessions + EXCLUDED.sessions, last_seat = EXCLUDED.last_seat;
    DELETE FROM openwop_seat.seats s WHERE s.last_seen < pg_catalog.now() - interval '7 days';
END
$ow$;
GRANT EXECUTE ON FUNCTION openwop_seat.seen(text, text, text, jsonb, boolean) TO PUBLIC;
CREATE FUNCTION openwop_seat.live_claims()
RETURNS TABLE (major smallint, sessions bigint) LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
    -- The claims of backends alive now (the same pid and start time in pg_stat_activity), by major.
    SELECT c.major, count(*) FROM openwop_seat.claims c
    JOIN pg_catalog.pg_stat_activity a ON a.pid = c.pid AND a.backend_start = c.backend_start
    WHERE c.major IS NOT NULL GROUP BY c.major
$ow$;
GRANT EXECUTE ON FUNCTION openwop_seat.live_claims() TO PUBLIC;
"""),
    Step(10, "events_v2_runs: upto, how far the v2 store holds a filled run (an append above it keeps the mark)", """
-- events_v2_runs is a generated object (created by migrate with the relations, ADR 0015), so it may be absent.
-- A mark made before this step holds every row of its run as it was filled: upto takes the greatest value it may
-- (the greatest bigint but one), so a later append unmarks the run as before (but one at the greatest bigint,
-- which is read at read time), and the next fill of the run records its real upto.
-- (migrate then installs the generated objects again, which empties the store anyway: the step keeps the marks
-- correct between the two, and for a store installed by hand.)
DO $ow$
BEGIN
    IF pg_catalog.to_regclass('openwop_seat.events_v2_runs') IS NOT NULL THEN
        ALTER TABLE openwop_seat.events_v2_runs
            ADD COLUMN IF NOT EXISTS upto bigint NOT NULL DEFAULT 9223372036854775806;
    END IF;
END
$ow$;
"""),
)

LAYOUT_VERSION = 10

# The functions layout steps create (the generated ones are writer_sql.FUNCTIONS), as regprocedure prints them.
STEP_FUNCTIONS = ("seen(text,text,text,jsonb,boolean)", "live_claims()")

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
