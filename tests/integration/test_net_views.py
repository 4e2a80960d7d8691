"""Views past the net (issue 23): a view over the events table owned by a role that reads past row-level security (a
superuser, a BYPASSRLS role, a member of the owner of openwop_seat) runs its query with its owner's rights, so the
net does not apply to it, and a host role reading it in a translated session would see the stored spelling of the
other era (``type || ''``, ``to_jsonb(v)``, an aggregate: nothing the result's column check sees). The seat's watch
lists such relations (and materialized views owned past the net: their rows are stored rows), the classifier
refuses every statement of a translated session that names one (``OW004``), and while one exists dynamic SQL is
refused again, as for a ``SECURITY DEFINER`` function owned past the net (ADR 0019).

Each statement runs through the seat as ``host_user`` (no ``BYPASSRLS``), majors 2 and 1, psycopg text and binary
and asyncpg (binary): it is refused, or meets the net (``OW008``), never returns a stored spelling of the other era.
The views the net holds (owned by a host role, or ``security_invoker``) are unchanged: their reads meet the net. The
last test reads the same statements from a raw session and shows what they would leak."""

from __future__ import annotations

import time
import uuid

import pytest
from test_leaks import FORBIDDEN, assert_clean, logs, tokens  # noqa: F401
from test_net_new_rows import CLIENTS, USER, psycopg_run, run_as

from proxy.serve.context import RELATION_CHECK_SECONDS

SU_VIEW = "nv_su_view"  # owned by the superuser that created it
HOST_VIEW = "nv_host_view"  # owned by host_user: the net holds it (FORCE row-level security)
INVOKER_VIEW = "nv_invoker_view"  # owned by the superuser, security_invoker: the net holds it
CHAIN_VIEW = "nv_chain_view"  # owned by host_user, over SU_VIEW: still reads past the net through it
BYPASS_MV = "nv_bypass_mv"  # a materialized view owned by a BYPASSRLS role
BYPASS_ROLE = "nv_bypass"
DB_FUNCTION = "nv_reads_su_view"  # a function in the database whose body names SU_VIEW


@pytest.fixture(scope="module")
def past_net_objects(pg, logs):  # noqa: F811 - after the runs exist: the materialized view holds them
    pg.psql(f"""
        CREATE VIEW {SU_VIEW} AS SELECT run_id, sequence, type, payload FROM events;
        CREATE VIEW {HOST_VIEW} AS SELECT run_id, sequence, type, payload FROM events;
        ALTER VIEW {HOST_VIEW} OWNER TO {USER};
        CREATE VIEW {INVOKER_VIEW} WITH (security_invoker = true) AS SELECT run_id, sequence, type, payload
            FROM events;
        CREATE VIEW {CHAIN_VIEW} AS SELECT run_id, type FROM {SU_VIEW};
        ALTER VIEW {CHAIN_VIEW} OWNER TO {USER};
        CREATE ROLE {BYPASS_ROLE} NOLOGIN BYPASSRLS;
        CREATE MATERIALIZED VIEW {BYPASS_MV} AS SELECT run_id, type FROM events;
        ALTER MATERIALIZED VIEW {BYPASS_MV} OWNER TO {BYPASS_ROLE};
        CREATE FUNCTION {DB_FUNCTION}(r text) RETURNS text LANGUAGE sql AS
            $f$ SELECT string_agg(type, ',') FROM public.{SU_VIEW} WHERE run_id = r $f$;
        GRANT SELECT ON {SU_VIEW}, {HOST_VIEW}, {INVOKER_VIEW}, {CHAIN_VIEW}, {BYPASS_MV} TO PUBLIC;
    """)
    yield
    pg.psql(f"DROP FUNCTION IF EXISTS {DB_FUNCTION}(text); DROP VIEW IF EXISTS {CHAIN_VIEW}; "
            f"DROP VIEW IF EXISTS {SU_VIEW}, {HOST_VIEW}, {INVOKER_VIEW}; "
            f"DROP MATERIALIZED VIEW IF EXISTS {BYPASS_MV}; DROP ROLE IF EXISTS {BYPASS_ROLE}")


@pytest.fixture(scope="module")
def views_seat(start_seat, past_net_objects):
    """A seat started after the objects exist (it reads them at start); the late view is read by its watch."""
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1},
                                         {"application_name": "ops", "major": "raw"}]},
                      host={"check_interval": 3600})


def reads(view: str, run: str) -> list[tuple[str, str]]:
    """(name, statement) pairs reading ``view``'s stored type in ways the result's column check cannot see."""
    return [
        ("an expression", f"SELECT type || '' FROM {view} WHERE run_id = '{run}'"),
        ("the whole row", f"SELECT to_jsonb(v) FROM {view} v WHERE run_id = '{run}'"),
        ("an aggregate", f"SELECT string_agg(type, ',') FROM public.{view} WHERE run_id = '{run}'"),
        ("a join", f"SELECT r.run_id, v.type || '' FROM runs r JOIN {view} v USING (run_id) "
                   f"WHERE r.run_id = '{run}'"),
        ("a CTE", f"WITH x AS (SELECT type FROM {view} WHERE run_id = '{run}') SELECT type || '' FROM x"),
        ("a subquery", f"SELECT (SELECT string_agg(upper(type), ',') FROM {view} WHERE run_id = '{run}')"),
        ("a DO block, static", f"DO $do$ BEGIN RAISE EXCEPTION 'returned: %', (SELECT string_agg(type, ',') FROM "
                               f"{view} WHERE run_id = '{run}') USING ERRCODE = 'P0042'; END $do$"),
        ("a DO block, EXECUTE building the name",
         f"DO $do$ DECLARE t text; BEGIN EXECUTE 'SELECT string_agg(type, '','') FROM ' || "
         f"'{view[:4]}' || '{view[4:]} WHERE run_id = $1' INTO t USING '{run}'; "
         f"RAISE EXCEPTION 'returned: %', t USING ERRCODE = 'P0042'; END $do$"),
    ]


@pytest.mark.parametrize("major", [2, 1])
@pytest.mark.parametrize("client", CLIENTS)
def test_a_view_owned_past_the_net_is_refused_by_name(views_seat, logs, major, client):  # noqa: F811
    for view in (SU_VIEW, CHAIN_VIEW, BYPASS_MV):
        for name, sql in reads(view, logs[major]):
            code, got = run_as(client, views_seat, major, [], sql)
            assert code == "OW004", f"{view}, {name}: expected the seat's refusal, got {code}: {str(got)[:300]}"
            assert_clean(got, major)
            if "EXECUTE" not in sql:  # the static refusal names the relation and the fix
                assert view in got[0] and "past" in got[0], (view, name, got)
            else:  # dynamic SQL is refused while the database holds a relation past the net
                assert "dynamic SQL" in got[0] or "DO block" in got[0], got


@pytest.mark.parametrize("major", [2, 1])
def test_code_naming_a_view_past_the_net_is_refused(views_seat, logs, major):  # noqa: F811
    """A function in the database whose body names the view (the function watch), and a pg_temp one created in the
    session (its CREATE is refused)."""
    code, got = psycopg_run(views_seat, major, [], f"SELECT {DB_FUNCTION}('{logs[major]}')", False)
    assert code == "OW004" and "defined in the database" in got[0], (code, got)
    code, got = psycopg_run(views_seat, major, [], f"CREATE FUNCTION pg_temp.nv_f() RETURNS text LANGUAGE sql AS "
                                                   f"$f$ SELECT string_agg(type, ',') FROM {SU_VIEW} $f$", False)
    assert code == "OW004" and "past" in got[0], (code, got)


@pytest.mark.parametrize("major", [2, 1])
@pytest.mark.parametrize("client", CLIENTS)
def test_views_the_net_holds_meet_the_net(views_seat, logs, major, client):  # noqa: F811
    """A host-owned view and a security_invoker one are not refused by the seat: the net refuses their reads."""
    for view in (HOST_VIEW, INVOKER_VIEW):
        for name, sql in reads(view, logs[major])[:6]:
            code, got = run_as(client, views_seat, major, [], sql)
            assert code == "OW008", f"{view}, {name}: expected the net's refusal, got {code}: {str(got)[:300]}"
            assert_clean(got, major)


def refused(seat, major: int, sql: str, clean: bool) -> str | None:
    code, got = psycopg_run(seat, major, [], sql, False)
    if clean:
        assert_clean(got, major)
    return code


def settles(seat, major: int, sql: str, expected: str, clean: bool = True) -> None:
    """Poll until the statement gets ``expected`` (the watch re-reads the catalog every RELATION_CHECK_SECONDS);
    no timing is asserted, only that it happens before a generous deadline. ``clean``: no answer on the way may
    carry a stored spelling of the other era."""
    deadline = time.monotonic() + 15 * RELATION_CHECK_SECONDS
    while (code := refused(seat, major, sql, clean)) != expected:
        assert time.monotonic() < deadline, f"the watch never saw it (expected {expected}, got {code})"
        time.sleep(0.3)


@pytest.mark.parametrize("major", [2, 1])
def test_a_view_created_while_the_seat_runs_is_refused_after_the_watch_and_invoker_lets_the_net_hold_it(
        views_seat, pg, logs, major):  # noqa: F811
    view = f"nv_late_{uuid.uuid4().hex[:8]}"
    sql = f"SELECT type || '' FROM {view} WHERE run_id = '{logs[major]}'"
    pg.psql(f"CREATE VIEW {view} AS SELECT run_id, type FROM events; GRANT SELECT ON {view} TO PUBLIC")
    try:
        # until the watch has seen the new view, it reads past the net: the documented window (ADR 0019, addendum)
        settles(views_seat, major, sql, "OW004", clean=False)
        pg.psql(f"ALTER VIEW {view} SET (security_invoker = true)")
        settles(views_seat, major, sql, "OW008")  # the net holds it now
        pg.psql(f"ALTER VIEW {view} RESET (security_invoker)")
        settles(views_seat, major, sql, "OW004", clean=False)  # the same window: it reads past the net again
        pg.psql(f"ALTER VIEW {view} OWNER TO {USER}")
        settles(views_seat, major, sql, "OW008")
    finally:
        pg.psql(f"DROP VIEW IF EXISTS {view}")


def test_the_refused_views_would_leak_and_a_raw_session_reads_them_as_on_postgresql(views_seat, logs):  # noqa: F811
    """The proof that the refusal matters: a relation past the net hands a raw session of the same role the stored
    spelling of an era-2 run (the other era's, for major 2): the net would not have stopped a translated one."""
    for view in (SU_VIEW, CHAIN_VIEW, BYPASS_MV):
        for name, sql in reads(view, logs[2])[:6]:
            code, got = psycopg_run(views_seat, "raw", [], sql, False)
            assert code is None, (view, name, code, got)
            assert tokens(got) & {t.lower() for t in FORBIDDEN[2]}, (view, name, got)
