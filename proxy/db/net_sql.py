"""The net in the database (ADR 0009): no read of the stored events rows in a translated session.

The classifier substitutes the seat's translated relations for the events table; this is what holds when
it did not (a statement it misread, server-side code of any kind, a temp object, a type or domain lookup).
``migrate`` installs, on the host's events table:

* ``ENABLE`` and ``FORCE ROW LEVEL SECURITY`` (``FORCE``: the table's owner is held too);
* ``openwop_seat_net_seat``: ``FOR SELECT TO <the owner of openwop_seat> USING (true)``.  The seat's views
  (``events_m2``/``_m1``, ``events_keys``) read the table as their owner, so their reads pass; PostgreSQL
  folds ``true OR …`` away when it plans them, so the translated read path carries no filter at all;
* ``openwop_seat_net``: ``FOR SELECT TO PUBLIC USING ((SELECT net_read()))``.
  ``net_read()`` (one call per statement: an InitPlan) returns true in a raw or unclaimed session and
  raises ``stored_read_refused`` (``OW008``) in a session claimed as major 1 or 2.  PostgreSQL checks the
  SELECT policies against the new row of an ``INSERT … RETURNING`` as well, so in a translated session that
  row meets the net too, whoever wrote the statement (ADR 0019; ADR 0009 let it pass by its unset tuple id,
  and dynamic SQL could read a stored spelling back through it).  The seat's own rewrite of an ``INSERT …
  RETURNING`` writes through ``openwop_seat.events_insert_m2``/``_m1`` (:mod:`proxy.db.relations`), whose
  owner's policy is ``true`` and which returns the written rows translated;
* ``openwop_seat_net_insert``/``_update``/``_delete``: permissive ``true`` policies for the writes (with
  row-level security on, a command without a policy is denied).  A write that must read stored rows
  (a ``WHERE`` or ``RETURNING`` naming the table's columns in ``UPDATE``/``DELETE``, ``ON CONFLICT … DO
  UPDATE``) gets the SELECT policies as well, so in a translated session it meets the net too.

and ``openwop_seat.events_keys``: the events table without ``type`` and ``payload``, owned by the seat's
owner, which the classifier substitutes where a query level reads none of them (``max(sequence)`` stays
one index probe: the view has no join); ``openwop_seat.events_delete``, the same columns as the target of a
``DELETE`` that reads neither (the host deletes a run's events by ``run_id``): an updatable view, so the
delete runs on the table as the view's owner, only for a reader with ``DELETE`` on the table itself.

This module only generates SQL; migrate decides whether it may run it (the table's owner's rights).
"""

from __future__ import annotations

import json

from proxy.db.sql import quote_ident, quote_literal

SCHEMA = "openwop_seat"
KEYS_VIEW = "events_keys"
DELETE_VIEW = "events_delete"
POLICIES = ("openwop_seat_net_seat", "openwop_seat_net", "openwop_seat_net_insert", "openwop_seat_net_update",
            "openwop_seat_net_delete")
NET_CODE, NET_SQLSTATE = "stored_read_refused", "OW008"


def net_function_sql() -> str:
    """``net_read()``: true unless this session is claimed as a translated major (then it raises OW008)."""
    message = ("stored_read_refused: this session reads the events table through openwop-seat as major %s; a "
               "read of the stored rows that does not go through the seat''s translated relations is refused")
    envelope = ("pg_catalog.jsonb_build_object('error', 'stored_read_refused', 'message', v_message, "
                "'details', pg_catalog.jsonb_build_object('major', v_major))::text")
    return f"""
CREATE OR REPLACE FUNCTION {SCHEMA}.net_read()
RETURNS boolean LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $ow$
DECLARE
    v_major smallint;
    v_message text;
BEGIN
    -- The net of ADR 0009: called once per statement (an InitPlan of the events table's SELECT policy) by a
    -- role that is not the owner of openwop_seat.  Major 0 is a raw session, NULL one the seat did not claim.
    v_major := {SCHEMA}.session_major();
    IF v_major IN (1, 2) THEN
        v_message := pg_catalog.format('{message}', v_major);
        RAISE EXCEPTION USING ERRCODE = '{NET_SQLSTATE}', MESSAGE = v_message, DETAIL = {envelope},
            HINT = 'read the events table through openwop-seat as an ordinary statement (the seat reads it through '
                   'its translated relations), or from a raw session; see docs/refusals-and-errors.md#ow008-stored_read_refused';
    END IF;
    RETURN true;
END
$ow$;
GRANT EXECUTE ON FUNCTION {SCHEMA}.net_read() TO PUBLIC;
"""


def keys_view_sql(events: str, columns: list[str], stored: tuple[str, str]) -> str:
    """``events_keys``: the events table's columns but ``type``/``payload``, as stored (both eras store them
    alike), filtered like the translated views on the reader's own SELECT privilege on the table."""
    keep = [c for c in columns if c not in stored]
    cols = ", ".join(quote_ident(c) for c in keep)
    may_read = f"(SELECT pg_catalog.has_table_privilege({quote_literal(events)}::regclass, 'SELECT'))"
    may_delete = f"(SELECT pg_catalog.has_table_privilege({quote_literal(events)}::regclass, 'DELETE'))"
    return f"""
DROP VIEW IF EXISTS {SCHEMA}.{KEYS_VIEW};
CREATE VIEW {SCHEMA}.{KEYS_VIEW} AS
SELECT {cols}
FROM {events}
WHERE {may_read};
COMMENT ON VIEW {SCHEMA}.{KEYS_VIEW} IS
    'the events table without type and payload (what both eras store alike), read by a translated session where '
    'it names neither (openwop-seat, ADR 0009); generated by migrate';
GRANT SELECT ON {SCHEMA}.{KEYS_VIEW} TO PUBLIC;

-- The same columns for a DELETE that reads neither type nor payload (the host deletes a run's events by run_id):
-- the delete runs on the table as this view's owner, whose SELECT policy passes, and only for a reader that
-- may delete from the table itself. The writer rule's triggers fire on the table as for any delete.
DROP VIEW IF EXISTS {SCHEMA}.{DELETE_VIEW};
CREATE VIEW {SCHEMA}.{DELETE_VIEW} AS
SELECT {cols}
FROM {events}
WHERE {may_delete};
COMMENT ON VIEW {SCHEMA}.{DELETE_VIEW} IS
    'the events table without type and payload, the target of a translated session''s DELETE that reads neither '
    '(openwop-seat, ADR 0009); generated by migrate';
GRANT SELECT, DELETE ON {SCHEMA}.{DELETE_VIEW} TO PUBLIC;
"""


def policies_sql(events: str, seat_owner: str) -> str:
    """Row-level security on the events table: the seat's views read it, nothing else in a translated session."""
    drops = "\n".join(f"DROP POLICY IF EXISTS {p} ON {events};" for p in POLICIES)
    return f"""
{drops}
CREATE POLICY openwop_seat_net_seat ON {events} AS PERMISSIVE FOR SELECT TO {quote_ident(seat_owner)} USING (true);
CREATE POLICY openwop_seat_net ON {events} AS PERMISSIVE FOR SELECT TO PUBLIC
    USING ((SELECT {SCHEMA}.net_read()));
CREATE POLICY openwop_seat_net_insert ON {events} AS PERMISSIVE FOR INSERT TO PUBLIC WITH CHECK (true);
CREATE POLICY openwop_seat_net_update ON {events} AS PERMISSIVE FOR UPDATE TO PUBLIC USING (true) WITH CHECK (true);
CREATE POLICY openwop_seat_net_delete ON {events} AS PERMISSIVE FOR DELETE TO PUBLIC USING (true);
ALTER TABLE {events} ENABLE ROW LEVEL SECURITY;
ALTER TABLE {events} FORCE ROW LEVEL SECURITY;
"""


def net_sql(events: str, columns: list[str], stored: tuple[str, str], seat_owner: str) -> str:
    return net_function_sql() + keys_view_sql(events, columns, stored) + policies_sql(events, seat_owner)


# What the runtime check compares (ADR 0009): the events table's row-level security flags and every policy on
# it, the host's own included (a permissive policy anyone adds would open the net: policies are OR-ed).
NET_STATE_SQL = """
SELECT c.relrowsecurity AS rls, c.relforcerowsecurity AS force,
       COALESCE((SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(
                     p.polname::text, p.polcmd::text, p.polpermissive,
                     (SELECT pg_catalog.array_agg(CASE WHEN r OPERATOR(pg_catalog.=) 0 THEN 'public'
                                                  ELSE pg_catalog.pg_get_userbyid(r)::text END ORDER BY r)
                      FROM pg_catalog.unnest(p.polroles) r),
                     pg_catalog.pg_get_expr(p.polqual, p.polrelid), pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid))
                     ORDER BY p.polname)
                 FROM pg_catalog.pg_policy p WHERE p.polrelid OPERATOR(pg_catalog.=) c.oid), '[]'::jsonb)::text
           AS policies
FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) $1::pg_catalog.oid
"""


async def net_state(conn, events: str) -> dict | None:
    """The events table's row-level security as the database has it (None: no such table)."""
    oid = await conn.fetchval("SELECT pg_catalog.to_regclass($1)::pg_catalog.oid", events)
    if oid is None:
        return None
    if conn.is_in_transaction():  # migrate's: the path for this query only
        old = await conn.fetchval("SELECT pg_catalog.current_setting('search_path')")
        await conn.execute("SELECT pg_catalog.set_config('search_path', 'pg_catalog', true)")
        row = await conn.fetchrow(NET_STATE_SQL, oid)
        await conn.execute("SELECT pg_catalog.set_config('search_path', $1, true)", old)
    else:
        async with conn.transaction():
            await conn.execute("SET LOCAL search_path TO pg_catalog")
            row = await conn.fetchrow(NET_STATE_SQL, oid)
    if row is None:
        return None
    return {"rls": row["rls"], "force": row["force"], "policies": json.loads(row["policies"])}


def net_problems(state: dict | None, recorded: str | None) -> list[str]:
    """Why the net is not in force as migrate installed it ([] when it is)."""
    if state is None:
        return []
    problems = []
    if not state["rls"]:
        problems.append("row-level security is disabled on the events table")
    elif not state["force"]:
        problems.append("row-level security is not forced on the events table (its owner reads past it)")
    names = {p[0] for p in state["policies"]}
    missing = [p for p in POLICIES if p not in names]
    if missing:
        problems.append(f"the net's policies {', '.join(missing)} are missing on the events table")
    if recorded is not None and not problems and fingerprint(state) != recorded:
        others = sorted(names - set(POLICIES))
        problems.append("the events table's policies are not the ones migrate installed"
                        + (f" (also there: {', '.join(others)}: a permissive policy opens the net)" if others else ""))
    return problems


def fingerprint(state: dict) -> str:
    return json.dumps(state, sort_keys=True, separators=(",", ":"))
