"""The reader rule at the wire: era-aware translation of event rows through the seat."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import psycopg
import pytest

from proxy.artifacts.load import load_artifacts

A = load_artifacts()
RENAMED = sorted(A.renamed)


@pytest.fixture(scope="module")
def read_seat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1},
                                         {"application_name": "ops", "major": "raw"}]})


@pytest.fixture
def runs(pg):
    """An era-2 run holding every renamed v1 type, and an era-3 run in v2 vocabulary.

    Era-2 payloads are `{}`, which payload projection (issue #4) never boxes or refuses; era-3 payloads are
    `{"k": 1}`, an undeclared key that a projection would box or refuse, so an era-3 read shows it untouched."""
    import uuid
    tag = uuid.uuid4().hex[:8]
    era2, era3 = f"run2-{tag}", f"run3-{tag}"
    rows = []
    for i, t in enumerate(RENAMED + ["run.started", "example.thing-happened"]):
        rows.append((f"e2-{tag}-{i}", era2, i, t, "{}"))
    for i, t in enumerate(RENAMED):
        rows.append((f"e3-{tag}-{i}", era3, i, A.v1_to_v2[t], '{"k": 1}'))
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO events VALUES (%s, %s, %s, %s, 'n1', %s::jsonb, now(), NULL)", rows)
        conn.execute("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES (%s, 3, 'test')", (era3,))
    yield era2, era3
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("DELETE FROM events WHERE run_id IN (%s, %s)", (era2, era3))
        conn.execute("DELETE FROM openwop_seat.run_era WHERE run_id = %s", (era3,))


PAGE = "SELECT * FROM events WHERE run_id = %s AND sequence >= %s ORDER BY sequence LIMIT %s"


def page(dsn, run, binary=False, **kw):
    with psycopg.connect(dsn, **kw) as conn:
        cur = conn.cursor(binary=binary)
        cur.execute(PAGE, (run, 0, 1000))
        return [d.name for d in cur.description], cur.fetchall()


@pytest.mark.parametrize("binary", [False, True])
def test_major_2_reads_era_2_translated_and_era_3_untouched(read_seat, pg, runs, binary):
    era2, era3 = runs
    cols, rows = page(read_seat.dsn(), era2, binary)
    dcols, direct = page(pg.dsn(), era2, binary)
    assert cols == dcols  # the hidden era column never shows
    assert [r[3] for r in rows] == [A.v1_to_v2[t] for t in RENAMED] + ["run.started", "example.thing-happened"]
    # every other column but the payload byte for byte
    assert [r[:3] + r[4:5] + r[6:] for r in rows] == [r[:3] + r[4:5] + r[6:] for r in direct]
    # the stored `{}` payloads read projected: at most a required nodeId/runId filled from the row's columns
    filled = set()
    for r, d in zip(rows, direct):
        assert d[5] == {}
        assert set(r[5]) <= {"nodeId", "runId"} and r[5] == {k: {"nodeId": r[4], "runId": r[1]}[k] for k in r[5]}, r
        filled |= set(r[5])
    assert filled == {"nodeId", "runId"}  # e.g. model.capability-substituted and run.dead-lettered require them
    # era 3: every column as stored, the payload with its undeclared key included
    cols3, rows3 = page(read_seat.dsn(), era3, binary)
    dcols3, direct3 = page(pg.dsn(), era3, binary)
    assert cols3 == dcols3
    assert [r[3] for r in rows3] == [A.v1_to_v2[t] for t in RENAMED]
    assert rows3 == direct3 and all(r[5] == {"k": 1} for r in rows3)


def test_major_1_maps_era_3_back_and_leaves_era_2(read_seat, runs):
    era2, era3 = runs
    _, rows3 = page(read_seat.dsn(application_name="v1-host"), era3)
    assert [r[3] for r in rows3] == RENAMED
    _, rows2 = page(read_seat.dsn(application_name="v1-host"), era2)
    assert [r[3] for r in rows2][:len(RENAMED)] == RENAMED


def test_raw_reads_stored_rows(read_seat, runs):
    era2, era3 = runs
    _, rows = page(read_seat.dsn(application_name="ops"), era2)
    assert [r[3] for r in rows][:len(RENAMED)] == RENAMED


def test_asyncpg_named_statements_binary(read_seat, runs):
    era2, _ = runs

    async def go():
        conn = await asyncpg.connect(read_seat.url())
        try:
            stmt = await conn.prepare("SELECT e.type, e.sequence, e.event_id FROM events e WHERE e.run_id = $1 "
                                      "ORDER BY e.sequence")
            out = []
            for _ in range(3):
                out.append([tuple(r) for r in await stmt.fetch(era2)])
            return out
        finally:
            await conn.close()

    results = asyncio.run(go())
    assert results[0] == results[1] == results[2]
    assert [r[0] for r in results[0]][:len(RENAMED)] == [A.v1_to_v2[t] for t in RENAMED]


def test_unmapped_type_fails_the_read_and_session_continues(read_seat, pg, runs):
    era2, _ = runs
    rows = [(f"u-{era2}-{i}", era2, 100 + i, "agent.reasoning.delta" if i != 500 else "foo.bar") for i in range(1000)]
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.cursor().executemany("INSERT INTO events VALUES (%s, %s, %s, %s, NULL, NULL, now(), NULL)", rows)
    with psycopg.connect(read_seat.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as e:
            conn.execute(PAGE, (era2, 100, 1000)).fetchall()
        assert e.value.sqlstate == "OW001"
        assert str(e.value).startswith("event_type_unmapped: ")
        envelope = json.loads(e.value.diag.message_detail)
        assert envelope["error"] == "event_type_unmapped"
        assert envelope["details"] == {"type": "foo.bar", "runId": era2, "sequence": 600}
        assert conn.execute("SELECT 'still usable'").fetchone() == ("still usable",)


def test_refused_statement_fails_the_server_transaction(read_seat, pg, fresh_table):
    table = fresh_table("id int")
    with psycopg.connect(read_seat.dsn()) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (1)")
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT * FROM events TABLESAMPLE SYSTEM (1)")  # not substitutable: refused
        assert e.value.sqlstate == "OW004" and "statement_untranslatable" in str(e.value)
        assert json.loads(e.value.diag.message_detail)["details"]["kind"]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.commit()  # COMMIT of a failed transaction rolls back
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_refused_in_simple_protocol_multi_statement(read_seat, fresh_table):
    table = fresh_table("id int")
    with psycopg.connect(read_seat.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as e:
            conn.execute(f"INSERT INTO {table} VALUES (1); SELECT query_to_xml('SELECT 1', true, false, '')",
                         prepare=False)
        assert e.value.sqlstate == "OW004"
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


def test_run_created_and_appended_in_one_transaction_reads_its_era(read_seat, pg):
    """A v2 host creates a run (stamped era 3 by the seat's trigger) and appends to it in one open
    transaction: its own reads see the stamp before COMMIT. Were the era read as 2, the v2 name
    would not be a v1 type and the read would fail with OW001."""
    import uuid
    run = f"tx-{uuid.uuid4().hex[:8]}"
    v2_name = A.v1_to_v2[RENAMED[0]]
    with psycopg.connect(read_seat.dsn()) as conn:
        conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", (run,))
        conn.execute("INSERT INTO events VALUES (%s, %s, 0, %s, NULL, NULL, now(), NULL)", (run + "-0", run, v2_name))
        assert conn.execute("SELECT type FROM events WHERE run_id = %s", (run,)).fetchone() == (v2_name,)
        assert conn.execute("SELECT era FROM openwop_seat.run_era WHERE run_id = %s", (run,)).fetchone() == (3,)
        # Another session does not see the uncommitted run at all.
        assert pg.psql(f"SELECT count(*) FROM events WHERE run_id = '{run}'").strip() == "0"
        conn.rollback()
    assert pg.psql(f"SELECT count(*) FROM openwop_seat.run_era WHERE run_id = '{run}'").strip() == "0"


def test_a_view_over_events_closes_the_session_instead_of_leaking(start_seat, pg, runs):
    era2, _ = runs
    # security_invoker: a superuser's view that is not would be refused by name first (it reads past the net,
    # test_net_views.py); these exercise the result's column check, for the superuser's session the net does not hold
    pg.psql("CREATE VIEW events_view WITH (security_invoker = true) AS SELECT * FROM events; "
            "GRANT SELECT ON events_view TO PUBLIC; "
            "CREATE VIEW events_view2 WITH (security_invoker = true) AS SELECT type AS t, run_id FROM events_view")
    try:
        seat = start_seat()  # learns the views over events.type at start
        for view in ("events_view", "events_view2"):
            with psycopg.connect(seat.dsn(), autocommit=True) as conn:
                with pytest.raises(psycopg.Error) as e:
                    conn.execute(f"SELECT * FROM {view} WHERE run_id = %s", (era2,)).fetchall()
                assert e.value.sqlstate == "OW007" and "type column" in str(e.value)
                assert conn.closed or conn.broken
        with psycopg.connect(seat.dsn(), autocommit=True) as conn:  # a view over other columns is fine
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pg.psql("DROP VIEW events_view2; DROP VIEW events_view")


def test_a_view_over_events_payload_closes_a_major_2_session_instead_of_leaking(start_seat, pg, runs):
    """A view that reads events.payload but not type: its payloads would reach a v2 reader unprojected."""
    era2, _ = runs
    pg.psql("CREATE VIEW payload_view WITH (security_invoker = true) AS SELECT run_id, payload FROM events; "
            "GRANT SELECT ON payload_view TO PUBLIC")  # security_invoker: as above
    try:
        seat = start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1}]})
        with psycopg.connect(seat.dsn(), autocommit=True) as conn:
            with pytest.raises(psycopg.Error) as e:
                conn.execute("SELECT payload FROM payload_view WHERE run_id = %s", (era2,)).fetchall()
            assert e.value.sqlstate == "OW007" and "payload column" in str(e.value)
        with psycopg.connect(seat.dsn(), autocommit=True, application_name="v1-host") as conn:
            # a v1 reader reads payloads as stored anyway: the view is fine for it
            direct = pg.psql(f"SELECT count(*) FROM events WHERE run_id = '{era2}'").strip()
            got = conn.execute("SELECT payload FROM payload_view WHERE run_id = %s", (era2,)).fetchall()
            assert len(got) == int(direct) > 0
    finally:
        pg.psql("DROP VIEW payload_view")


def test_refusal_inside_a_pipeline_discards_up_to_sync(read_seat, fresh_table):
    table = fresh_table("id int")
    with psycopg.connect(read_seat.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as e:
            with conn.pipeline() as p:
                conn.execute(f"INSERT INTO {table} VALUES (1)")
                conn.execute("SELECT * FROM events TABLESAMPLE SYSTEM (1)")  # refused
                conn.execute(f"INSERT INTO {table} VALUES (2)")  # skipped, like after any error
                p.sync()
        assert e.value.sqlstate == "OW004"
        # the implicit transaction of the batch was rolled back by the server itself
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_prepared_refusal_with_asyncpg(read_seat):
    async def go():
        conn = await asyncpg.connect(read_seat.url())
        try:
            with pytest.raises(asyncpg.PostgresError) as e:
                await conn.prepare("UPDATE events SET node_id = 'n' WHERE type = $1")
            after = await conn.fetchval("SELECT 1")
            return e.value, after
        finally:
            await conn.close()

    err, after = asyncio.run(go())
    assert err.sqlstate == "OW004" and after == 1


def test_an_unqualified_events_is_translated_only_where_the_search_path_finds_the_hosts_table(read_seat, pg, runs):
    """Issue 23: a schema per tenant (``search_path = tenant, public``) or a temporary table named ``events``:
    the unqualified name finds another table, so the seat's translation of ``public.events`` would answer for
    the wrong table. PostgreSQL checks it per execution and the statement is refused (OW004); the qualified
    name and the default search_path read translated as before."""
    import uuid

    era2, _era3 = runs
    schema = f"tenant_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.events (LIKE public.events); "
            f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC; GRANT SELECT ON {schema}.events TO PUBLIC")
    try:
        with psycopg.connect(read_seat.dsn(), autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM events WHERE run_id = %s", (era2,)).fetchone()[0] > 0
            conn.execute(f"SET search_path = {schema}, public")
            with pytest.raises(psycopg.Error) as refused:
                conn.execute("SELECT type FROM events WHERE run_id = %s", (era2,))
            assert refused.value.sqlstate == "OW004"
            assert f"the name events finds {schema}.events, not the host's events table" in str(refused.value)
            with pytest.raises(psycopg.Error) as refused:  # a prepared statement: checked per execution
                conn.execute("SELECT count(*) FROM events WHERE run_id = %s", (era2,), prepare=True)
            assert refused.value.sqlstate == "OW004"
            rows = conn.execute("SELECT type FROM public.events WHERE run_id = %s ORDER BY sequence",
                                (era2,)).fetchall()
            assert rows[0][0] == A.v1_to_v2[RENAMED[0]]  # the qualified name: translated
            conn.execute("RESET search_path")
            conn.execute("CREATE TEMP TABLE events (LIKE public.events)")
            with pytest.raises(psycopg.Error) as refused:
                conn.execute("SELECT type FROM events")
            assert refused.value.sqlstate == "OW004" and "pg_temp" in str(refused.value)
            conn.execute("DROP TABLE pg_temp.events")
            assert conn.execute("SELECT type FROM events WHERE run_id = %s ORDER BY sequence",
                                (era2,)).fetchone()[0] == A.v1_to_v2[RENAMED[0]]
    finally:
        pg.psql(f"DROP SCHEMA {schema} CASCADE")


def test_a_pages_search_path_guard_is_asked_at_every_execution_and_is_not_the_clients_to_shadow(read_seat, pg, runs):
    """The guard is SQL that PostgreSQL inlines into the page's plan, made once per session: the same page read
    finds the host's table, is refused once SET search_path finds a tenant's table first, and reads again after
    RESET. A schema of the client's first in the search path, before pg_catalog, with its own events table and
    its own pg_table_is_visible that always says true, is refused all the same (the guard names pg_catalog's)."""
    import uuid

    era2, _era3 = runs
    page = "SELECT * FROM events WHERE run_id = %s AND sequence > %s ORDER BY sequence ASC LIMIT %s"
    schema = f"evil_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.events (LIKE public.events); "
            f"CREATE FUNCTION {schema}.pg_table_is_visible(oid) RETURNS boolean LANGUAGE sql AS 'SELECT true'; "
            f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC; GRANT SELECT ON {schema}.events TO PUBLIC")
    try:
        with psycopg.connect(read_seat.dsn(), autocommit=True) as conn:
            first = conn.execute(page, (era2, -1, 100), prepare=True).fetchall()
            assert first and first[0][3] == A.v1_to_v2[RENAMED[0]]
            for path in (f"{schema}, pg_catalog, public", f"pg_catalog, {schema}, public"):
                conn.execute(f"SET search_path = {path}")
                with pytest.raises(psycopg.Error) as refused:
                    conn.execute(page, (era2, -1, 100), prepare=True)
                assert refused.value.sqlstate == "OW004", path
                assert f"the name events finds {schema}.events, not the host's events table" in str(refused.value)
                conn.execute("RESET search_path")
                assert conn.execute(page, (era2, -1, 100), prepare=True).fetchall() == first
    finally:
        pg.psql(f"DROP SCHEMA {schema} CASCADE")


def test_the_search_path_guard_is_inlined_into_the_callers_plan(read_seat, pg):
    """PostgreSQL inlines the guard (a SQL function, no PL/pgSQL call per statement): the plan of a guarded
    statement holds pg_table_is_visible of the host's table, and events_named_refuse only in the branch taken
    where it is not visible."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN (VERBOSE, COSTS OFF) "
            "SELECT count(*) FROM events WHERE (SELECT openwop_seat.events_named('events'))"))
    assert "pg_table_is_visible(" in plan and "events_named(" not in plan, plan
    assert "ELSE openwop_seat.events_named_refuse('events'::text)" in plan, plan


def test_row_locks_on_translated_reads_and_locks_elsewhere_work(read_seat, pg, runs):
    """Issue 23, ADR 0017: FOR UPDATE on the translated rows returns them translated (tests/integration/
    test_row_locks.py shows the stored rows locked); a lock OF the runs table on the same join, and a lock at a
    level that reads only the keys, lock and return."""
    era2, _era3 = runs
    pg.psql(f"INSERT INTO runs (run_id, tenant_id) VALUES ('{era2}', 'acme') ON CONFLICT DO NOTHING")
    try:
        with psycopg.connect(read_seat.dsn()) as conn:
            locked = conn.execute("SELECT type FROM events WHERE run_id = %s ORDER BY sequence FOR UPDATE SKIP LOCKED",
                                  (era2,)).fetchall()
            assert locked[0][0] == A.v1_to_v2[RENAMED[0]]
            conn.rollback()
            rows = conn.execute("SELECT e.type FROM events e JOIN runs r USING (run_id) WHERE r.run_id = %s "
                                "ORDER BY e.sequence FOR UPDATE OF r", (era2,)).fetchall()
            assert rows[0][0] == A.v1_to_v2[RENAMED[0]]  # translated, and the runs row is locked
            keys = conn.execute("SELECT run_id, sequence FROM events WHERE run_id = %s ORDER BY sequence "
                                "FOR UPDATE", (era2,)).fetchall()
            assert len(keys) == len(rows)
            with psycopg.connect(pg.dsn(), autocommit=True) as other:  # both locks are held by the session
                other.execute("SET lock_timeout = '200ms'")
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    other.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", (era2,))
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    other.execute("SELECT 1 FROM events WHERE run_id = %s FOR UPDATE", (era2,))
            conn.rollback()
    finally:
        pg.psql(f"DELETE FROM runs WHERE run_id = '{era2}'")
