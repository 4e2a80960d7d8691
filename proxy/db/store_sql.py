"""The v2 store: era-2 rows kept beside the host's, already read as a major-2 reader reads them (ADR 0015).

A major-2 page of an era-2 run costs a payload projection per row when it is computed at read time
(:mod:`proxy.db.projection_compiled`). The store keeps that work out of the read: for every era-2 run it has
*filled*, ``events_v2_store`` holds each of the run's event rows with the table's own columns, and
``events_v2_runs`` marks the run as filled. ``events_m2`` is then a ``UNION ALL`` of

* ``events_m2_live`` (the translation computed at read time, ADR 0011) for every run not marked filled, and
* the store's rows for the runs marked filled,

so a page of a filled run reads one index range of the store, as a direct read reads the host's table.

A store row has a form (``openwop_seat_form``):

* ``p``: projected: type and payload as a major-2 reader reads them (filled from ``events_m2_live``);
* ``r``: raw, waiting: the row as stored, written by the store trigger on an append or update; read through
  the same translation as ``events_m2_live`` (so it is never wrong, only not yet cheap), and projected by the
  next fill of its run;
* ``s``: raw, staying: a row the reader rule refuses (read through the live translation, it raises exactly
  as the live read does);
* ``d``: a deleted row, written instead of a DELETE by a writer under REPEATABLE READ or SERIALIZABLE
  (a DELETE under that snapshot would miss a row a fill committed after it): never read.

Why it is never stale:

* every write of an era-2 event row upserts its store row (raw) in the same transaction, whether or not its
  run is filled; the upsert's conflict check serialises it with a fill committed after a writer's snapshot
  (REPEATABLE READ and SERIALIZABLE writers get a serialization failure and retry, as they would on the row);
* a fill takes the run's lock exclusively (``run_lock_key``; the store trigger takes it shared), deletes the
  run's store rows and writes them again from the host's rows in one transaction, then marks the run;
* stamping a run era 3 (``run_era``) deletes its store rows and mark in the same transaction; ``TRUNCATE``
  of the events table empties the store;
* ``run.started`` reads the run's tenant from the runs table (ADR 0007): a runs row inserted, deleted, or
  updated in its id or tenant unmarks its run (``store_unmark``, serialised with a fill as above);
* the store is read only while its two triggers on the events table are enabled (checked once per statement
  from ``pg_trigger``): ``ALTER TABLE … DISABLE TRIGGER`` turns every read back to ``events_m2_live``. Like the
  writer rule's triggers, they do not fire in a session with ``session_replication_role = replica`` (a
  superuser's, logical replication's apply worker, ``pg_restore --disable-triggers``): rows written that way
  into a filled run are not in the store until the run is filled again (docs/operations.md);
* ``migrate`` empties the store whenever it installs the generated objects again (the codemap, the
  declarations or the table's columns changed), and ``serve`` fills it again in the background.

Only with ``[host] era_column`` unset (the era in ``run_era``): with the era in the host's runs table, a
stamp is an update the seat does not see in its own tables, and ``events_m2`` stays ``events_m2_live``.
"""

from __future__ import annotations

from proxy.db.sql import quote_ident, quote_literal, quote_relation

SCHEMA = "openwop_seat"
EQ = "OPERATOR(pg_catalog.=)"
STORE = f"{SCHEMA}.events_v2_store"
RUNS = f"{SCHEMA}.events_v2_runs"
FORM = "openwop_seat_form"
S, M = "openwop_seat_s", "openwop_seat_m"  # aliases inside events_m2

# The triggers that keep the store current (created by migrate with the writer rule's).
ROW_TRIGGER = "store"
TRUNCATE_TRIGGER = "store_truncate"
RUN_TRIGGER = "store_run"
RUN_UPDATE_TRIGGER = "store_run_update"
ERA_TRIGGER = "store_era"


def in_force_sql(events_table: str, trigger_prefix: str) -> str:
    """True while both store triggers on the events table fire always; evaluated once per statement."""
    names = ", ".join(quote_literal(trigger_prefix + n) for n in (ROW_TRIGGER, TRUNCATE_TRIGGER))
    return (f"(SELECT pg_catalog.count(*) {EQ} 2 FROM pg_catalog.pg_trigger {M}_t "
            f"WHERE {M}_t.tgrelid {EQ} {quote_literal(quote_relation(events_table))}::regclass "
            f"AND {M}_t.tgname {EQ} ANY (ARRAY[{names}]::name[]) AND {M}_t.tgenabled {EQ} ANY ('{{O,A}}'::\"char\"[]))")


def store_tables_sql(host, columns, run_type: str) -> str:
    """The store and its marks, created empty (run after events_m2 is dropped: the view reads them)."""
    cols = ",\n    ".join(f"{quote_ident(c.name)} {c.type}" for c in columns)
    run = quote_ident(host.run_id_column)
    return f"""
DROP TABLE IF EXISTS {STORE};
DROP TABLE IF EXISTS {RUNS};
CREATE TABLE {STORE} (
    {cols},
    {FORM} "char" NOT NULL CHECK ({FORM} IN ('p', 'r', 's', 'd')),
    PRIMARY KEY ({run}, sequence)
);
CREATE INDEX events_v2_store_waiting ON {STORE} ({run}) WHERE {FORM} {EQ} 'r';
COMMENT ON TABLE {STORE} IS
    'era-2 event rows as a major-2 reader reads them, for the runs in events_v2_runs (ADR 0015); written only '
    'by openwop_seat.store_fill and the store triggers; emptied by migrate';
REVOKE ALL ON TABLE {STORE} FROM PUBLIC;
CREATE TABLE {RUNS} (
    run_id {run_type} PRIMARY KEY,
    filled_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE {RUNS} IS
    'the era-2 runs whose every event row is in events_v2_store (ADR 0015): events_m2 reads them from there';
REVOKE ALL ON TABLE {RUNS} FROM PUBLIC;
"""


def store_view_sql(host, columns, may_read: str, in_force: str, type_expr, payload_tail) -> str:
    """events_m2: the live translation for runs not filled, the store for filled ones.

    ``type_expr(alias)``: the era-2 type translation over ``alias``; ``payload_tail(alias)``: the era-2 payload
    translation's ``WHEN … ELSE …`` arms over ``alias``."""
    run = quote_ident(host.run_id_column)
    out = []
    for c in columns:
        q = quote_ident(c.name)
        if c.name == host.type_column:
            out.append(f"(CASE WHEN {S}.{FORM} {EQ} 'p' THEN {S}.{q} ELSE {type_expr(S)} END)::{c.type} AS {q}")
        elif c.name == host.payload_column:
            out.append(f"(CASE WHEN {S}.{FORM} {EQ} 'p' THEN {S}.{q} {payload_tail(S)} END)::{c.type} AS {q}")
        else:
            out.append(f"{S}.{q}")
    sep = ",\n       "
    return f"""
CREATE VIEW {SCHEMA}.events_m2 AS
SELECT {SCHEMA}_l.* FROM {SCHEMA}.events_m2_live {SCHEMA}_l
WHERE NOT EXISTS (SELECT 1 FROM {RUNS} {M} WHERE {M}.run_id {EQ} {SCHEMA}_l.{run} AND {in_force})
UNION ALL
SELECT {sep.join(out)}
FROM {STORE} {S} JOIN {RUNS} {M} ON {M}.run_id {EQ} {S}.{run}
WHERE {in_force} AND {S}.{FORM} OPERATOR(pg_catalog.<>) 'd' AND {may_read};
COMMENT ON VIEW {SCHEMA}.events_m2 IS
    'the events table as a major-2 reader sees it (openwop-seat reader rule; ADR 0011, 0012); generated by migrate';
GRANT SELECT ON {SCHEMA}.events_m2 TO PUBLIC;
"""


def store_functions_sql(host, columns, events_table: str) -> str:
    """store_fill, store_pending and the store triggers' functions."""
    events = quote_relation(events_table)
    run = quote_ident(host.run_id_column)
    names = [quote_ident(c.name) for c in columns]
    col_list = ", ".join(names)
    new_values = ", ".join(f"NEW.{n}" for n in names)
    old_values = ", ".join(f"OLD.{n}" for n in names)
    updates = ", ".join(f"{n} = EXCLUDED.{n}" for n in names) + f", {FORM} = EXCLUDED.{FORM}"
    e = f"{SCHEMA}_e"
    e_cols = ", ".join(f"{e}.{n}" for n in names)
    l_cols = ", ".join(f"{SCHEMA}_l.{n}" for n in names)
    runs_src = quote_relation(host.runs_table)
    run_type = _run_type_cast(columns, host)
    refusals = "SQLSTATE 'OW001' OR SQLSTATE 'OW002' OR SQLSTATE 'OW003'"
    return f"""
-- The v2 store (ADR 0015). store_fill: one run's rows written again from the host's rows, projected where
-- the projection reads nothing but the row, then the run marked filled. Takes the run's lock exclusively,
-- or returns 'busy' at once when an append holds it.
CREATE OR REPLACE FUNCTION {SCHEMA}.store_fill(run text)
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_seq bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock({SCHEMA}.run_lock_key(run)) THEN
        RETURN 'busy';
    END IF;
    DELETE FROM {STORE} WHERE ({run})::text {EQ} run;
    DELETE FROM {RUNS} WHERE (run_id)::text {EQ} run;
    IF {SCHEMA}.era_now(run) {EQ} 3 THEN
        RETURN 'era3';
    END IF;
    BEGIN
        INSERT INTO {STORE} ({col_list}, {FORM})
        SELECT {l_cols}, 'p' FROM {SCHEMA}.events_m2_live {SCHEMA}_l
        JOIN {events} {e} ON {e}.{run} {EQ} {SCHEMA}_l.{run} AND {e}.sequence {EQ} {SCHEMA}_l.sequence
        WHERE ({SCHEMA}_l.{run})::text {EQ} run;
    EXCEPTION WHEN {refusals} THEN
        -- a row the reader rule refuses: the others one by one, the refused ones kept raw (they raise when read)
        FOR v_seq IN SELECT ({e}.sequence)::bigint FROM {events} {e}
                     WHERE ({e}.{run})::text {EQ} run LOOP
            BEGIN
                INSERT INTO {STORE} ({col_list}, {FORM})
                SELECT {l_cols}, 'p' FROM {SCHEMA}.events_m2_live {SCHEMA}_l
                WHERE ({SCHEMA}_l.{run})::text {EQ} run AND ({SCHEMA}_l.sequence)::bigint {EQ} v_seq;
            EXCEPTION WHEN {refusals} THEN
                NULL;
            END;
        END LOOP;
    END;
    INSERT INTO {STORE} ({col_list}, {FORM})
    SELECT {e_cols}, 's' FROM {events} {e}
    WHERE ({e}.{run})::text {EQ} run
      AND NOT EXISTS (SELECT 1 FROM {STORE} {S} WHERE {S}.{run} {EQ} {e}.{run} AND {S}.sequence {EQ} {e}.sequence);
    INSERT INTO {RUNS} (run_id) VALUES ((run)::{run_type});
    RETURN 'filled';
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.store_fill(text) FROM PUBLIC;

-- Runs to fill: era-2 runs of the runs table not filled yet, then filled runs with rows waiting ('r').
CREATE OR REPLACE FUNCTION {SCHEMA}.store_pending(n integer)
RETURNS SETOF text LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
    (SELECT ({e}.{run})::text FROM {runs_src} {e}
     WHERE NOT EXISTS (SELECT 1 FROM {RUNS} {M} WHERE ({M}.run_id)::text {EQ} ({e}.{run})::text)
       AND NOT EXISTS (SELECT 1 FROM {SCHEMA}.run_era x WHERE x.run_id {EQ} ({e}.{run})::text)
     LIMIT n)
    UNION ALL
    (SELECT DISTINCT ({S}.{run})::text FROM {STORE} {S} WHERE {S}.{FORM} {EQ} 'r' LIMIT n)
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.store_pending(integer) FROM PUBLIC;

-- Every write of an era-2 event row reaches the store in its transaction (raw; the next fill projects it).
CREATE OR REPLACE FUNCTION {SCHEMA}.on_event_store()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_old text;
    v_new text;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        v_old := (OLD.{run})::text;
        IF v_old IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock_shared({SCHEMA}.run_lock_key(v_old));
        END IF;
        IF TG_OP = 'DELETE' OR OLD.{run} IS DISTINCT FROM NEW.{run} OR OLD.sequence IS DISTINCT FROM NEW.sequence THEN
            IF current_setting('transaction_isolation') = 'read committed' THEN
                DELETE FROM {STORE} WHERE {run} {EQ} OLD.{run} AND sequence {EQ} OLD.sequence;
            ELSE  -- a DELETE under this snapshot could miss a row a fill wrote since: a tombstone conflicts instead
                INSERT INTO {STORE} ({col_list}, {FORM}) VALUES ({old_values}, 'd')
                ON CONFLICT ({run}, sequence) DO UPDATE SET {updates};
            END IF;
        END IF;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        v_new := (NEW.{run})::text;
        IF v_new IS NOT NULL AND v_new IS DISTINCT FROM v_old THEN
            PERFORM pg_advisory_xact_lock_shared({SCHEMA}.run_lock_key(v_new));
        END IF;
        IF v_new IS NOT NULL AND {SCHEMA}.era_now(v_new) IS DISTINCT FROM 3 THEN
            INSERT INTO {STORE} ({col_list}, {FORM}) VALUES ({new_values}, 'r')
            ON CONFLICT ({run}, sequence) DO UPDATE SET {updates};
        END IF;
    END IF;
    RETURN NULL;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.on_event_store() FROM PUBLIC;

-- A run leaves the store's marks (its rows are then read at read time until it is filled again). Under READ
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
    IF current_setting('transaction_isolation') {EQ} 'read committed' THEN
        DELETE FROM {RUNS} WHERE (run_id)::text {EQ} run;
    ELSE
        INSERT INTO {RUNS} (run_id) VALUES ((run)::{run_type})
        ON CONFLICT (run_id) DO UPDATE SET filled_at = EXCLUDED.filled_at;
        DELETE FROM {RUNS} WHERE (run_id)::text {EQ} run;
    END IF;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.store_unmark(text) FROM PUBLIC;

-- run.started reads the run's tenant (ADR 0007): a runs row written or removed unmarks its run.
CREATE OR REPLACE FUNCTION {SCHEMA}.on_run_store()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM {SCHEMA}.store_unmark((OLD.{run})::text);
    END IF;
    IF TG_OP <> 'DELETE' AND (TG_OP = 'INSERT' OR OLD.{run} IS DISTINCT FROM NEW.{run}) THEN
        PERFORM {SCHEMA}.store_unmark((NEW.{run})::text);
    END IF;
    RETURN NULL;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.on_run_store() FROM PUBLIC;

CREATE OR REPLACE FUNCTION {SCHEMA}.on_events_truncate_store()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
BEGIN
    TRUNCATE {STORE}, {RUNS};
    RETURN NULL;
END
$ow$;
REVOKE ALL ON FUNCTION {SCHEMA}.on_events_truncate_store() FROM PUBLIC;

-- A run stamped era 3 (or unstamped by backfill --restore) leaves the store in the same transaction.
CREATE OR REPLACE FUNCTION {SCHEMA}.on_run_era_store()
RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_run text := CASE WHEN TG_OP = 'DELETE' THEN OLD.run_id ELSE NEW.run_id END;
BEGIN
    DELETE FROM {STORE} WHERE ({run})::text {EQ} v_run;
    DELETE FROM {RUNS} WHERE (run_id)::text {EQ} v_run;
    IF TG_OP = 'UPDATE' AND OLD.run_id IS DISTINCT FROM NEW.run_id THEN
        DELETE FROM {STORE} WHERE ({run})::text {EQ} OLD.run_id;
        DELETE FROM {RUNS} WHERE (run_id)::text {EQ} OLD.run_id;
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
         f"    EXECUTE FUNCTION {SCHEMA}.on_run_store();"),
        (host.runs_table, prefix + RUN_UPDATE_TRIGGER,
         f"\nCREATE OR REPLACE TRIGGER {prefix + RUN_UPDATE_TRIGGER} AFTER UPDATE ON {runs} FOR EACH ROW\n"
         f"    WHEN ({when})\n    EXECUTE FUNCTION {SCHEMA}.on_run_store();"),
        (f"{SCHEMA}.run_era", prefix + ERA_TRIGGER,
         f"\nCREATE OR REPLACE TRIGGER {prefix + ERA_TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON {SCHEMA}.run_era "
         f"FOR EACH ROW\n    EXECUTE FUNCTION {SCHEMA}.on_run_era_store();"),
    ]
