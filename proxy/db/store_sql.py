"""The v2 store: era-2 rows kept beside the host's, already read as a major-2 reader reads them (ADR 0015).

A major-2 page of an era-2 run costs a payload projection per row when it is computed at read time
(:mod:`proxy.db.projection_compiled`). The store keeps that work out of the read: for every era-2 run it has
*filled*, ``events_v2_store`` holds each of the run's event rows, with the table's own columns, as
``events_m2_live`` (the translation computed at read time, ADR 0011) reads them, and ``events_v2_runs`` marks
the run filled. ``events_m2`` reads a ``UNION ALL`` of

* the host's rows of every run not marked filled, and of marked runs above the mark's ``upto``, with the inputs
  of the translation (era, payloads-clean),
* the store's rows of the runs marked filled (those up to ``upto``: all it holds of them),

and translates above the union, so a row of a filled run costs one ``CASE`` test, and the translation (which
may refuse) runs only for rows the statement keeps, where the plain view ran it (a join above the view sees
the same rows and the same refusals as before). A page of a filled run reads one index range of the store, as
a direct read reads the host's table.

Why it is never stale: a run is marked only with every row of the run up to the mark's ``upto`` in the store
(and no other), and any change to what those rows read as removes the mark, and the run's rows in the store
with it, in the changing transaction (``store_unmark``). So the store holds exactly the marked runs' rows up to
their marks, and ``events_v2_filled`` (a page's store arm) reads it without a join to the marks:

* every INSERT, UPDATE or DELETE of an event row unmarks its run (old and new run id), but for an INSERT above
  the mark under READ COMMITTED (an append to an active run): the store still holds exactly the rows up to
  ``upto``, and the new row is read at read time until a fill copies it (an incremental fill: only the rows
  above the mark, and the mark moves up). An unmarked run is read at read time until it is filled again whole;
* ``run.started`` reads the run's tenant from the runs table (ADR 0007): a runs row inserted, deleted, or
  updated in its id or tenant unmarks its run;
* stamping a run era 3 (``run_era``, or unstamping it) unmarks it; ``TRUNCATE`` of the events table empties
  the store;
* a fill (``store_fill``) takes the run's lock exclusively (``run_lock_key``), where every unmark takes it
  shared; under READ COMMITTED an unmark's DELETE, after the lock, sees a fill that committed meanwhile;
  under REPEATABLE READ or SERIALIZABLE it would not, so the unmark upserts the mark first: a fill committed
  after the writer's snapshot is a conflict, and the writer gets a serialization failure and retries (so an
  append in those levels unmarks as before: only READ COMMITTED reads the mark after the lock, with a fresh
  snapshot, which the rule for an append above the mark needs); a fill runs in READ COMMITTED only, for the
  same reason;
* the store is read only while the store's triggers on the events table are enabled (checked once per
  statement from ``pg_trigger``): ``ALTER TABLE … DISABLE TRIGGER`` turns every read back to the live
  translation. Like the writer rule's triggers they do not fire in a session with
  ``session_replication_role = replica`` (a superuser's, logical replication's apply worker,
  ``pg_restore --disable-triggers``): rows updated or deleted that way in a filled run are not seen by
  readers of the store until the run is written again or its mark deleted (a fill of a marked run copies only
  rows above the mark), docs/operations.md;
* ``migrate`` empties the store whenever it installs the generated objects again (the codemap, the
  declarations or the table's columns changed), and ``serve`` fills it again in the background.

A run whose fill meets a row the reader rule refuses is recorded in ``events_v2_refused`` and read live (so it
is refused as before) until its next write. Only with ``[host] era_column`` unset (the era in ``run_era``):
with the era in the host's runs table, a stamp is an update the store cannot tell from any other, and
``events_m2`` stays the live translation.
"""

from __future__ import annotations

from proxy.db.sql import quote_ident, quote_literal, quote_relation

SCHEMA = "openwop_seat"
EQ = "OPERATOR(pg_catalog.=)"
GE, LE, GT = "OPERATOR(pg_catalog.>=)", "OPERATOR(pg_catalog.<=)", "OPERATOR(pg_catalog.>)"
LEAST_BIGINT = "(-9223372036854775807 - 1)"  # the upto of a run filled while it had no row
# upto stays below the greatest bigint, so that upto + 1 (where the live rows of a filled run start) is one: a run
# with a row at the greatest bigint keeps it read live (a fill never copies it: the store holds rows up to upto only)
UPTO_MAX = "9223372036854775806"
STORE = f"{SCHEMA}.events_v2_store"
RUNS = f"{SCHEMA}.events_v2_runs"
REFUSED = f"{SCHEMA}.events_v2_refused"
FILLED = f"{SCHEMA}.events_v2_filled"  # the store's rows of the filled runs (a view)
MARKED = f"{SCHEMA}.events_v2_marked"  # the filled runs' ids (a view)
RUN_FUNCTION = "events_m2_run"  # events_m2 for one run: what the classifier substitutes for a run's level
# events_m2_run's live arm alone: the live translation of a run's rows above its mark (every row of a run not
# marked); with events_v2_filled, the two arms the classifier merges for a run's page (ADR 0015, page plans)
RUN_LIVE_FUNCTION = "events_m2_run_live"
# A page's fast twin (ADR 0024): an era-3 run's rows as stored, else none; the seat sends the page statement again on
# an empty answer. The view reads the table as its owner, only the rows of runs stamped era 3.
ERA3_VIEW = f"{SCHEMA}.events_m2_era3"
ERA3_FUNCTION = "events_m2_run_era3"
S, M, U = "openwop_seat_s", "openwop_seat_m", "openwop_seat_u"  # aliases inside events_m2
E3, X3 = "openwop_seat_e", "openwop_seat_x"  # inside events_m2_era3
# The union's own columns (never seen by a reader): the inputs of the translation above it.
ERA3, CLEAN, STORED = "openwop_seat_era3", "openwop_seat_clean", "openwop_seat_stored"

# The triggers that keep the store current (created by migrate with the writer rule's).
ROW_TRIGGER = "store"
TRUNCATE_TRIGGER = "store_truncate"
RUN_TRIGGER = "store_run"
RUN_UPDATE_TRIGGER = "store_run_update"
ERA_TRIGGER = "store_era"


def in_force_sql(events_table: str, trigger_prefix: str) -> str:
    """True while both store triggers on the events table are enabled; evaluated once per statement."""
    names = ", ".join(quote_literal(trigger_prefix + n) for n in (ROW_TRIGGER, TRUNCATE_TRIGGER))
    return (f"(SELECT pg_catalog.count(*) {EQ} 2 FROM pg_catalog.pg_trigger {M}_t "
            f"WHERE {M}_t.tgrelid {EQ} {quote_literal(quote_relation(events_table))}::regclass "
            f"AND {M}_t.tgname {EQ} ANY (ARRAY[{names}]::name[]) AND {M}_t.tgenabled {EQ} ANY ('{{O,A}}'::\"char\"[]))")


def store_tables_sql(host, columns, run_type: str) -> str:
    """The store, its marks and its refused runs, created empty (after events_m2 is dropped: it reads them)."""
    cols = ",\n    ".join(f"{quote_ident(c.name)} {c.type}" for c in columns)
    run = quote_ident(host.run_id_column)
    return f"""
DROP TABLE IF EXISTS {STORE};
DROP TABLE IF EXISTS {RUNS};
DROP TABLE IF EXISTS {REFUSED};
CREATE TABLE {STORE} (
    {cols},
    PRIMARY KEY ({run}, sequence)
);
COMMENT ON TABLE {STORE} IS
    'era-2 event rows as a major-2 reader reads them (ADR 0015): read for the runs in events_v2_runs only; '
    'written only by openwop_seat.store_fill; emptied by migrate';
REVOKE ALL ON TABLE {STORE} FROM PUBLIC;
CREATE TABLE {RUNS} (
    run_id {run_type} PRIMARY KEY,
    filled_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    upto bigint NOT NULL CHECK (upto OPERATOR(pg_catalog.<=) {UPTO_MAX})
);
COMMENT ON TABLE {RUNS} IS
    'the era-2 runs whose every event row up to sequence upto is in events_v2_store as read, and no other '
    '(ADR 0015); an append above upto keeps the row (under READ COMMITTED), any other write to the run '
    'removes it in the same transaction';
COMMENT ON COLUMN {RUNS}.upto IS
    'the highest sequence the fills of the run copied (the least bigint for a run filled empty): rows above '
    'it are read at read time';
REVOKE ALL ON TABLE {RUNS} FROM PUBLIC;
CREATE TABLE {REFUSED} (
    run_id text PRIMARY KEY,
    refused_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE {REFUSED} IS
    'era-2 runs a fill left out: a row the reader rule refuses (read live, and refused, until the next write)';
REVOKE ALL ON TABLE {REFUSED} FROM PUBLIC;
"""


def store_view_sql(host, columns, events: str, aliases: tuple[str, str], era, clean_join: str, may_read: str,
                   in_force: str, type_expr, payload_tail) -> str:
    """events_m2 over the union of the host's rows of runs not filled and the store's rows of filled ones.

    ``era``: the era join and condition over the host's rows (``relations._Era``); ``type_expr(alias)``: the
    era-2 type translation over ``alias``; ``payload_tail(alias)``: the era-2 payload translation's
    ``WHEN … ELSE …`` arms over ``alias``; ``aliases``: the host table's alias and the payloads-clean join's
    prefix, as ``era`` and ``clean_join`` name them."""
    E, C = aliases  # noqa: N806 (relations' names for the same aliases)
    run = quote_ident(host.run_id_column)
    out = []
    for c in columns:
        q = quote_ident(c.name)
        if c.name == host.type_column:
            out.append(f"(CASE WHEN {U}.{STORED} OR {U}.{ERA3} THEN {U}.{q} ELSE {type_expr(U)} END)::{c.type} AS {q}")
        elif c.name == host.payload_column:
            out.append(f"(CASE WHEN {U}.{STORED} OR {U}.{ERA3} OR {U}.{CLEAN} THEN {U}.{q}\n        "
                       f"{payload_tail(U)}\n    END)::{c.type} AS {q}")
        else:
            out.append(f"{U}.{q}")
    host_cols = ", ".join(f"{E}.{quote_ident(c.name)}" for c in columns)
    store_cols = ", ".join(f"{S}.{quote_ident(c.name)}" for c in columns)
    sep = ",\n       "
    return f"""
CREATE VIEW {SCHEMA}.events_m2 AS
SELECT {sep.join(out)}
FROM (SELECT {host_cols},
             {era.three} AS {ERA3}, {C}_clean.run_id IS NOT NULL AS {CLEAN}, false AS {STORED}
      FROM {events} {E}
      {era.join}
      {clean_join}
      WHERE {may_read}
        AND NOT EXISTS (SELECT 1 FROM {RUNS} {M} WHERE {M}.run_id {EQ} {E}.{run} AND {M}.upto {GE} {E}.sequence
                        AND {in_force})
      UNION ALL
      SELECT {store_cols}, false, false, true
      FROM {STORE} {S} JOIN {RUNS} {M} ON {M}.run_id {EQ} {S}.{run} AND {S}.sequence {LE} {M}.upto
      WHERE {in_force} AND {may_read}) {U};
COMMENT ON VIEW {SCHEMA}.events_m2 IS
    'the events table as a major-2 reader sees it (openwop-seat reader rule; ADR 0011, 0015); generated by migrate';
GRANT SELECT ON {SCHEMA}.events_m2 TO PUBLIC;
"""


def store_run_sql(host, columns, run_type: str, may_read: str, in_force: str, marks_read: str,
                  events: str = "") -> str:
    """``events_m2_run(run)``: ``events_m2``'s rows of one run, for a query level that names the run by a
    parameter or a constant (the host's page statement, ``WHERE run_id = $1``; the classifier substitutes it,
    ADR 0015 decision 7).

    ``events_m2`` cannot tell before it reads a row which arm of its union the row's run is in, so a page of a
    filled run reads the host's rows of that run too (and drops them), sorts the union, and translates above it.
    Here the run is known when the statement starts: its mark is asked once per arm (an InitPlan), and the page
    reads the store's rows up to the mark as they are and ``events_m2_live``'s translation of the rows above it
    (``sequence >= upto + 1``, an index condition; every row for a run not marked), each arm an index range. ``LANGUAGE sql``, ``STABLE``, not strict, no ``SET``: PostgreSQL inlines the
    body into the caller's query, so the caller's ``sequence > $2 ORDER BY sequence LIMIT $3`` reaches the
    index scans, and its plan is cached with the statement. Inlined, the body runs with the caller's rights:
    the two views and ``events_m2_live`` are readable by PUBLIC and show, like ``events_m2``, nothing to a role
    without ``SELECT`` on the events table; everything is schema-qualified (no search_path of its own).

    ``events_m2_run_live(run)`` is the second arm alone. Inlined, the live arm is a join (the host's rows with
    the era and payloads-clean tables; the store's arm, ``events_v2_filled``, reads the store alone, which holds
    only the marked runs' rows up to their marks), which PostgreSQL plans as a subquery of the union
    without the caller's ``ORDER BY``: a page of a long run sorted every row of each arm from ``$2`` on. For a
    page (``WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3``) the classifier therefore reads a
    union of the two arms, ``events_v2_filled`` and ``events_m2_run_live(run)``, each with the page's own
    ``WHERE``, ``ORDER BY`` and ``LIMIT``: each arm an index range read in order and cut at the limit, merged
    in order (Merge Append), the level's own clauses above.

    ``events_m2_run_era3(run)`` is the page of an era-3 run alone: its rows as stored, what both arms give such a run
    (the store holds no era-3 run: stamping a run era 3 unmarks it, ``store_era``), through ``events_m2_era3``, the
    table's rows of the runs in ``run_era`` as its owner reads them, behind the live arm's gates; none for any other
    run. A function, so that a statement reading it describes its columns as the page's union does (PostgreSQL marks
    a column's origin from relations at parse analysis and inlines the body only after). The seat sends a page of
    a run it does not know to be of another era through it first, and the page statement where it returns no row
    (ADR 0024).

    ``may_read``: the gate of the store's rows (the reader's ``SELECT`` on the events table, and the net's: ADR
    0019); ``marks_read``: the marks' (the reader's privilege only: marks are run ids and sequence numbers, not
    event rows, and the live arm that reads them is behind the net's gate already; one InitPlan less a page)."""
    run = quote_ident(host.run_id_column)
    names = ", ".join(quote_ident(c.name) for c in columns)
    f_cols = ", ".join(f"f.{quote_ident(c.name)}" for c in columns)
    l_cols = ", ".join(f"l.{quote_ident(c.name)}" for c in columns)
    s_cols = ", ".join(f"{S}.{quote_ident(c.name)}" for c in columns)
    live_arm = f"""
SELECT {l_cols} FROM {SCHEMA}.events_m2_live l
WHERE l.{run} {EQ} $1
  AND l.sequence {GE} COALESCE((SELECT m.upto FROM {MARKED} m WHERE m.run_id {EQ} $1) OPERATOR(pg_catalog.+) 1,
                               {LEAST_BIGINT})"""
    return f"""
CREATE VIEW {FILLED} ({names}) AS
SELECT {s_cols}
FROM {STORE} {S}
WHERE {in_force} AND {may_read};
COMMENT ON VIEW {FILLED} IS
    'the v2 store''s rows of the filled runs (ADR 0015): what events_m2 reads for them; read by events_m2_run';
GRANT SELECT ON {FILLED} TO PUBLIC;
CREATE VIEW {MARKED} AS
SELECT {M}.run_id, {M}.upto FROM {RUNS} {M} WHERE {in_force} AND {marks_read};
COMMENT ON VIEW {MARKED} IS 'the runs events_m2 reads from the v2 store (ADR 0015); read by events_m2_run';
GRANT SELECT ON {MARKED} TO PUBLIC;
GRANT SELECT ON {SCHEMA}.events_m2_live TO PUBLIC;
CREATE FUNCTION {SCHEMA}.{RUN_FUNCTION}(run {run_type})
RETURNS SETOF {SCHEMA}.events_m2 LANGUAGE sql STABLE
AS $ow$
SELECT {f_cols} FROM {FILLED} f WHERE f.{run} {EQ} $1
UNION ALL{live_arm}
$ow$;
COMMENT ON FUNCTION {SCHEMA}.{RUN_FUNCTION}({run_type}) IS
    'events_m2 for one run, inlined into the caller''s query (ADR 0015): the store''s rows of a filled run and '
    'the live translation of its rows above the mark, or the live translation of an unfilled run';
GRANT EXECUTE ON FUNCTION {SCHEMA}.{RUN_FUNCTION}({run_type}) TO PUBLIC;
CREATE FUNCTION {SCHEMA}.{RUN_LIVE_FUNCTION}(run {run_type})
RETURNS SETOF {SCHEMA}.events_m2 LANGUAGE sql STABLE
AS $ow${live_arm}
$ow$;
COMMENT ON FUNCTION {SCHEMA}.{RUN_LIVE_FUNCTION}({run_type}) IS
    'events_m2_run''s live arm, inlined into the caller''s query (ADR 0015): the live translation of a run''s rows '
    'above its mark, or of every row of a run not marked; with events_v2_filled, the arms of a run''s page';
GRANT EXECUTE ON FUNCTION {SCHEMA}.{RUN_LIVE_FUNCTION}({run_type}) TO PUBLIC;
{_era3_sql(host, columns, run_type, may_read, events) if events else ""}"""


def _era3_sql(host, columns, run_type: str, may_read: str, events: str) -> str:
    run = quote_ident(host.run_id_column)
    e_cols = ", ".join(f"{E3}.{quote_ident(c.name)}" for c in columns)
    t_cols = ", ".join(f"t.{quote_ident(c.name)}" for c in columns)
    cast = "" if run_type == "text" else "::text"
    return f"""CREATE VIEW {ERA3_VIEW} AS
SELECT {e_cols}
FROM {events} {E3}
WHERE EXISTS (SELECT FROM {SCHEMA}.run_era {X3} WHERE {X3}.run_id {EQ} {E3}.{run}{cast}) AND {may_read};
COMMENT ON VIEW {ERA3_VIEW} IS
    'the rows of the runs stamped era 3, as stored: what a major-2 reader reads of them (ADR 0024)';
GRANT SELECT ON {ERA3_VIEW} TO PUBLIC;
CREATE FUNCTION {SCHEMA}.{ERA3_FUNCTION}(run {run_type})
RETURNS SETOF {SCHEMA}.events_m2 LANGUAGE sql STABLE
AS $ow$
SELECT {t_cols} FROM {ERA3_VIEW} t WHERE t.{run} {EQ} $1
$ow$;
COMMENT ON FUNCTION {SCHEMA}.{ERA3_FUNCTION}({run_type}) IS
    'an era-3 run''s rows as stored, else none: the fast page (ADR 0024), inlined into the caller''s query';
GRANT EXECUTE ON FUNCTION {SCHEMA}.{ERA3_FUNCTION}({run_type}) TO PUBLIC;
"""


def store_functions_sql(host, columns, events_table: str) -> str:
    """store_fill, store_pending, store_unmark and the store triggers' functions."""
    run = quote_ident(host.run_id_column)
    names = [quote_ident(c.name) for c in columns]
    col_list = ", ".join(names)
    live = f"{SCHEMA}_l"
    l_cols = ", ".join(f"{live}.{n}" for n in names)
    runs_src = quote_relation(host.runs_table)
    events = quote_relation(events_table)
    run_type = _run_type_cast(columns, host)
    e = f"{SCHEMA}_e"
    refusals = "SQLSTATE 'OW001' OR SQLSTATE 'OW002' OR SQLSTATE 'OW003'"
    return f"""
-- The v2 store (ADR 0015). store_fill: a run not marked is written again whole as events_m2_live reads it, then
-- marked filled up to its highest sequence; a marked run gets only its rows above the mark, and the mark moves
-- up (an incremental fill: 'extended', or 'current' when there was none). A run with a row the reader rule
-- refuses is recorded refused instead, and left unmarked. Takes the run's lock exclusively, or returns 'busy'
-- at once when a writer holds it; READ COMMITTED only (its reads must see every write committed before it took
-- the lock: a snapshot taken before the lock would miss one).
CREATE OR REPLACE FUNCTION {SCHEMA}.store_fill(run text)
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_upto bigint;
    v_max bigint;
BEGIN
    IF run IS NULL THEN
        RETURN 'missing';
    END IF;
    IF current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = '25000',
            MESSAGE = 'openwop_seat.store_fill runs in a READ COMMITTED transaction only',
            HINT = 'call it outside an explicit transaction, or in one begun ISOLATION LEVEL READ COMMITTED';
    END IF;
    IF NOT pg_try_advisory_xact_lock({SCHEMA}.run_lock_key(run)) THEN
        RETURN 'busy';
    END IF;
    IF {SCHEMA}.era_now(run) {EQ} 3 THEN
        DELETE FROM {RUNS} WHERE run_id {EQ} (run)::{run_type};
        DELETE FROM {REFUSED} WHERE run_id {EQ} run;
        DELETE FROM {STORE} WHERE {run} {EQ} (run)::{run_type};
        RETURN 'era3';
    END IF;
    -- Under the lock, with a fresh snapshot: no write to the run is in flight past its trigger, so a mark read
    -- here says which rows the store holds (every row up to upto, translated, and no other).
    SELECT {M}.upto INTO v_upto FROM {RUNS} {M} WHERE {M}.run_id {EQ} (run)::{run_type};
    IF FOUND THEN
        -- the store holds no row above the mark (an unmark deletes the run's rows); kept as a guard
        DELETE FROM {STORE} WHERE {run} {EQ} (run)::{run_type} AND sequence {GT} v_upto;
        BEGIN
            WITH {live}_new AS (
                INSERT INTO {STORE} ({col_list})
                SELECT {l_cols} FROM {SCHEMA}.events_m2_live {live}
                WHERE {live}.{run} {EQ} (run)::{run_type} AND {live}.sequence {GT} v_upto
                  AND {live}.sequence {LE} {UPTO_MAX}
                RETURNING sequence)
            SELECT pg_catalog.max(sequence) INTO v_max FROM {live}_new;
        EXCEPTION WHEN {refusals} THEN
            DELETE FROM {RUNS} WHERE run_id {EQ} (run)::{run_type};
            DELETE FROM {STORE} WHERE {run} {EQ} (run)::{run_type};
            INSERT INTO {REFUSED} (run_id) VALUES (run);
            RETURN 'refused';
        END;
        IF v_max IS NULL THEN
            RETURN 'current';
        END IF;
        UPDATE {RUNS} SET upto = LEAST(v_max, {UPTO_MAX}), filled_at = pg_catalog.now()
        WHERE run_id {EQ} (run)::{run_type};
        RETURN 'extended';
    END IF;
    DELETE FROM {REFUSED} WHERE run_id {EQ} run;
    DELETE FROM {STORE} WHERE {run} {EQ} (run)::{run_type};  -- the key's own type: its index
    BEGIN
        WITH {live}_new AS (
            INSERT INTO {STORE} ({col_list})
            SELECT {l_cols} FROM {SCHEMA}.events_m2_live {live} WHERE {live}.{run} {EQ} (run)::{run_type}
              AND {live}.sequence {LE} {UPTO_MAX}
            RETURNING sequence)
        SELECT pg_catalog.max(sequence) INTO v_max FROM {live}_new;
    EXCEPTION WHEN {refusals} THEN
        INSERT INTO {REFUSED} (run_id) VALUES (run);
        RETURN 'refused';
    END;
    INSERT INTO {RUNS} (run_id, upto)
    VALUES ((run)::{run_type}, LEAST(COALESCE(v_max, {LEAST_BIGINT}), {UPTO_MAX}));
    RETURN 'filled';
END
$ow$;
-- Callable by the role serve connects as (host.dsn, usually the host's role): it changes no answer, only its cost.
GRANT EXECUTE ON FUNCTION {SCHEMA}.store_fill(text) TO PUBLIC;

-- Runs to fill: era-2 runs of the runs table neither filled nor refused, then filled runs with rows above their
-- mark, least recently filled first; run ids only for a session whose login role may read the runs table.
CREATE OR REPLACE FUNCTION {SCHEMA}.store_pending(n integer)
RETURNS SETOF text LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
    (SELECT ({e}.{run})::text FROM {runs_src} {e}
     WHERE pg_catalog.has_table_privilege(session_user, {quote_literal(runs_src)}::regclass, 'SELECT')
       AND NOT EXISTS (SELECT 1 FROM {RUNS} {M} WHERE ({M}.run_id)::text {EQ} ({e}.{run})::text)
       AND NOT EXISTS (SELECT 1 FROM {REFUSED} {M} WHERE {M}.run_id {EQ} ({e}.{run})::text)
       AND NOT EXISTS (SELECT 1 FROM {SCHEMA}.run_era x WHERE x.run_id {EQ} ({e}.{run})::text)
     LIMIT n)
    UNION ALL
    (SELECT ({M}.run_id)::text FROM {RUNS} {M}
     WHERE pg_catalog.has_table_privilege(session_user, {quote_literal(runs_src)}::regclass, 'SELECT')
       AND EXISTS (SELECT 1 FROM {events} {e} WHERE {e}.{run} {EQ} {M}.run_id AND {e}.sequence {GT} {M}.upto)
     ORDER BY {M}.filled_at
     LIMIT n)
    LIMIT n
$ow$;
GRANT EXECUTE ON FUNCTION {SCHEMA}.store_pending(integer) TO PUBLIC;

-- A run leaves the store's marks, and its rows leave the store (the run is read at read time until it is filled
-- again). Under READ
-- COMMITTED the DELETE, after the run's lock, sees a fill that committed meanwhile; under REPEATABLE READ or
-- SERIALIZABLE it would not, so the mark is upserted first: a fill committed after this transaction's
-- snapshot is a conflict, and the writer gets a serialization failure and retries.
CREATE OR REPLACE FUNCTION {SCHEMA}.store_unmark(run text)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    IF run IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared({SCHEMA}.run_lock_key(run));
    IF current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        INSERT INTO {RUNS} (run_id, upto) VALUES ((run)::{run_type}, {LEAST_BIGINT})
        ON CONFLICT (run_id) DO UPDATE SET filled_at = EXCLUDED.filled_at;
    END IF;
    DELETE FROM {RUNS} WHERE run_id {EQ} (run)::{run_type};  -- the key's own type: its index
    DELETE FROM {STORE} WHERE {run} {EQ} (run)::{run_type};
    DELETE FROM {REFUSED} WHERE run_id {EQ} run;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.store_unmark(text) FROM PUBLIC;

-- Any write of an event row unmarks its run, old id and new, but for an append above the run's mark under READ
-- COMMITTED (the store still holds exactly the rows up to the mark). Also the runs table's trigger: run.started
-- reads the run's tenant (ADR 0007), so a runs row written or removed unmarks its run (the same column name).
-- A row deleted or updated also loses its copy in the store, in the same transaction: a host that deletes a
-- run's events (retention, erasure) leaves no translated copy of them behind. An insert (an append, the hot
-- path) runs store_unmark's body here rather than a nested SECURITY DEFINER call (ADR 0020).
CREATE OR REPLACE FUNCTION {SCHEMA}.on_event_store()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_run text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        v_run := (NEW.{run})::text;
        IF v_run IS NOT NULL THEN  -- store_unmark(v_run), inlined, but for an append above the mark
            PERFORM pg_advisory_xact_lock_shared({SCHEMA}.run_lock_key(v_run));
            IF current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
                INSERT INTO {RUNS} (run_id, upto) VALUES ((v_run)::{run_type}, {LEAST_BIGINT})
                ON CONFLICT (run_id) DO UPDATE SET filled_at = EXCLUDED.filled_at;
                DELETE FROM {RUNS} WHERE run_id {EQ} (v_run)::{run_type};
                DELETE FROM {STORE} WHERE {run} {EQ} (v_run)::{run_type};
            ELSIF TG_RELID {EQ} {quote_literal(events)}::regclass THEN
                -- READ COMMITTED: this statement's snapshot is taken after the lock, so it sees the mark of any
                -- fill committed meanwhile, and no fill can commit until this transaction ends. A row above the
                -- mark leaves it true (the store holds the run's rows up to upto, and no other): the row is read
                -- at read time until a fill copies it. A row at or below the mark removes it.
                DELETE FROM {RUNS} WHERE run_id {EQ} (v_run)::{run_type} AND upto {GE} NEW.sequence;
                IF FOUND THEN
                    DELETE FROM {STORE} WHERE {run} {EQ} (v_run)::{run_type};
                END IF;
            ELSE  -- a runs row: run.started reads its tenant
                DELETE FROM {RUNS} WHERE run_id {EQ} (v_run)::{run_type};
                DELETE FROM {STORE} WHERE {run} {EQ} (v_run)::{run_type};
            END IF;
            DELETE FROM {REFUSED} WHERE run_id {EQ} v_run;
        END IF;
        RETURN NULL;
    END IF;
    -- UPDATE or DELETE
    PERFORM {SCHEMA}.store_unmark((OLD.{run})::text);
    IF TG_RELID {EQ} {quote_literal(events)}::regclass THEN
        DELETE FROM {STORE} {S} WHERE {S}.{run} {EQ} OLD.{run} AND {S}.sequence {EQ} OLD.sequence;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.{run} IS DISTINCT FROM NEW.{run} THEN
        PERFORM {SCHEMA}.store_unmark((NEW.{run})::text);
    END IF;
    RETURN NULL;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.on_event_store() FROM PUBLIC;


CREATE OR REPLACE FUNCTION {SCHEMA}.on_events_truncate_store()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    TRUNCATE {STORE}, {RUNS}, {REFUSED};
    RETURN NULL;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.on_events_truncate_store() FROM PUBLIC;

-- A run stamped era 3 (or unstamped by backfill --restore) leaves the store in the same transaction.
CREATE OR REPLACE FUNCTION {SCHEMA}.on_run_era_store()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM {SCHEMA}.store_unmark(OLD.run_id);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND OLD.run_id IS DISTINCT FROM NEW.run_id) THEN
        PERFORM {SCHEMA}.store_unmark(NEW.run_id);
    END IF;
    RETURN NULL;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.on_run_era_store() FROM PUBLIC;
"""


def _run_type_cast(columns, host) -> str:
    return next(c.type for c in columns if c.name == host.run_id_column)


def store_triggers_sql(host, prefix: str) -> list[tuple[str, str, str]]:
    """The store's triggers, as (table, name, DDL): events rows and TRUNCATE, runs rows, and the seat's run_era."""
    events, runs = quote_relation(host.events_table), quote_relation(host.runs_table)
    changed = [host.run_id_column] + ([host.tenant_column] if host.tenant_column else [])
    when = " OR ".join(f"OLD.{quote_ident(c)} IS DISTINCT FROM NEW.{quote_ident(c)}" for c in changed)
    return [
        (host.events_table, prefix + ROW_TRIGGER,
         f"\nCREATE OR REPLACE TRIGGER {prefix + ROW_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON {events} "
         f"FOR EACH ROW\n    EXECUTE FUNCTION {SCHEMA}.on_event_store();"),
        (host.events_table, prefix + TRUNCATE_TRIGGER,
         f"\nCREATE OR REPLACE TRIGGER {prefix + TRUNCATE_TRIGGER} AFTER TRUNCATE ON {events} FOR EACH STATEMENT\n"
         f"    EXECUTE FUNCTION {SCHEMA}.on_events_truncate_store();"),
        (host.runs_table, prefix + RUN_TRIGGER,
         f"\nCREATE OR REPLACE TRIGGER {prefix + RUN_TRIGGER} AFTER INSERT OR DELETE ON {runs} FOR EACH ROW\n"
         f"    EXECUTE FUNCTION {SCHEMA}.on_event_store();"),
        (host.runs_table, prefix + RUN_UPDATE_TRIGGER,
         f"\nCREATE OR REPLACE TRIGGER {prefix + RUN_UPDATE_TRIGGER} AFTER UPDATE ON {runs} FOR EACH ROW\n"
         f"    WHEN ({when})\n    EXECUTE FUNCTION {SCHEMA}.on_event_store();"),
        (f"{SCHEMA}.run_era", prefix + ERA_TRIGGER,
         f"\nCREATE OR REPLACE TRIGGER {prefix + ERA_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON {SCHEMA}.run_era "
         f"FOR EACH ROW\n    EXECUTE FUNCTION {SCHEMA}.on_run_era_store();"),
    ]
