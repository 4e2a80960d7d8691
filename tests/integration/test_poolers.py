"""PgBouncer and the seat, in every arrangement, and a session's identity changing under its major (issue #18).

Behind the seat (seat -> PgBouncer -> PostgreSQL), a pooler's backends outlive the seat's sessions (session
pooling) or change under them (transaction pooling), so a claim would reach other clients and the plans
prepared once per session would be lost: the seat sees it (the challenge's backend pid is not the one the
BackendKeyData named) and refuses translated and v2 sessions before anything is claimed; raw sessions pass,
claimed as major 0 once the seat has seen the pooler (ADR 0013).

In front of the seat (PgBouncer -> seat -> PostgreSQL), each of the pooler's server connections is a seat
session whose major comes from what the pooler sends: safe when [[proxy.clients]] key on user or database.
Keyed on application_name, which the pooler (like pgjdbc) sets with SET per client, a change that would select
another major ends the seat's session instead of serving it with the wrong major.

Every run id is fresh; the shared `postgres` database (runs and events, migrated by conftest) needs no cleanup.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from proxy.dev.pgbouncer import PgBouncer, find_pgbouncer

HOST = "host_user"
V1_APP = "v1-host"


@pytest.fixture(scope="module")
def renamed():
    from proxy.artifacts.load import load_artifacts

    a = load_artifacts()
    v1 = sorted(a.renamed)[0]
    return v1, a.v1_to_v2[v1]


@pytest.fixture(scope="module")
def bouncer_binary():
    return find_pgbouncer()


@pytest.fixture(scope="module")
def roles(pg):
    pg.psql("DO $$ BEGIN CREATE ROLE v1_user LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$; "
            "GRANT ALL ON runs, events TO v1_user;")


def rid() -> str:
    return f"pool-{uuid.uuid4().hex[:10]}"


def query(pg, sql: str, *params) -> list[tuple]:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql, params or None).fetchall()]


def claims(pg) -> set[tuple]:
    """The recorded claims (a challenge alone records none: its row has no major)."""
    return set(query(pg, "SELECT pid, backend_start, major FROM openwop_seat.claims WHERE major IS NOT NULL"))


def era2_run(pg, v1_type: str) -> str:
    """An era-2 run with one event, written directly (a v1 writer)."""
    run = rid()
    pg.psql(f"INSERT INTO runs (run_id, tenant_id) VALUES ('{run}', 't'); "
            f"INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
            f"VALUES ('{run}-1', '{run}', 1, '{v1_type}', '{{}}', now())")
    return run


# ---------------------------------------------------------------- seat -> PgBouncer -> PostgreSQL


@pytest.mark.parametrize("pool_mode", ["session", "transaction"])
def test_behind_the_seat_a_pooler_is_seen_and_translated_sessions_are_refused_before_any_claim(
        pg, start_seat, bouncer_binary, pool_mode):
    bouncer = PgBouncer(bouncer_binary, pg.port, pool_mode=pool_mode, users=("postgres", HOST), run_as=pg.user)
    try:
        seat = start_seat(upstream_port=bouncer.port, host={"dsn": pg.dsn()},
                          proxy={"clients": [{"application_name": "ops", "major": "raw"}]})
        before = claims(pg)
        for dsn in (seat.dsn(user=HOST), seat.dsn(user=HOST, application_name="x")):  # major 2, default
            with pytest.raises(psycopg.OperationalError) as e:
                psycopg.connect(dsn, autocommit=True).execute("SELECT 1")
            assert "through a connection pooler" in str(e.value)
        assert claims(pg) == before  # nothing recorded on the pooler's backends
        # a raw session is relayed; having seen the pooler, the seat claims it as 0 (ADR 0013), so that it never
        # keeps an earlier session's major on the pooler's backend
        with psycopg.connect(seat.dsn(user=HOST, application_name="ops"), autocommit=True) as conn:
            assert conn.execute("SELECT count(*) >= 0 FROM events").fetchone() == (True,)
            assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (0,)
        assert "pooler between the seat and PostgreSQL" in seat.log()
    finally:
        bouncer.stop()


# ---------------------------------------------------------------- PgBouncer -> seat -> PostgreSQL


@pytest.mark.parametrize("pool_mode", ["session", "transaction"])
def test_in_front_of_the_seat_keyed_on_user_each_pool_reads_and_writes_with_its_own_major(
        pg, start_seat, bouncer_binary, roles, renamed, pool_mode):
    v1, v2 = renamed
    seat = start_seat(proxy={"clients": [{"user": "v1_user", "major": 1}]})
    bouncer = PgBouncer(bouncer_binary, seat.port, pool_mode=pool_mode, users=(HOST, "v1_user"), run_as=pg.user)
    try:
        old = era2_run(pg, v1)
        url = f"host=127.0.0.1 port={bouncer.port} dbname=postgres"
        with psycopg.connect(f"{url} user={HOST}", autocommit=True) as v2_host:
            assert v2_host.execute("SELECT type FROM events WHERE run_id = %s", (old,)).fetchone() == (v2,)
            new = rid()
            v2_host.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", (new,))  # stamped era 3
        with psycopg.connect(f"{url} user=v1_user", autocommit=True) as v1_host:
            assert v1_host.execute("SELECT type FROM events WHERE run_id = %s", (old,)).fetchone() == (v1,)
            with pytest.raises(psycopg.Error) as e:
                v1_host.execute("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
                                "VALUES (%s, %s, 1, %s, '{}', now())", (f"{new}-1", new, v1))
            assert e.value.sqlstate == "OW005"
        assert query(pg, "SELECT count(*) FROM events WHERE run_id = %s", new) == [(0,)]
    finally:
        bouncer.stop()


def test_in_front_of_the_seat_keyed_on_application_name_a_client_of_another_major_is_never_served(
        pg, start_seat, bouncer_binary, renamed):
    """PgBouncer puts no application_name in the startup packets it sends the seat, and SETs the client's
    before its first query: the seat ends that session rather than serve a v1 host as major 2."""
    v1, _ = renamed
    seat = start_seat(proxy={"clients": [{"application_name": V1_APP, "major": 1}]})
    bouncer = PgBouncer(bouncer_binary, seat.port, pool_mode="session", users=(HOST,), run_as=pg.user)
    try:
        with psycopg.connect(seat.dsn(user=HOST), autocommit=True) as v2_host:
            new = rid()
            v2_host.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", (new,))  # era 3
        dsn = f"host=127.0.0.1 port={bouncer.port} dbname=postgres user={HOST} application_name={V1_APP}"
        with pytest.raises(psycopg.Error):
            with psycopg.connect(dsn, autocommit=True) as v1_host:
                v1_host.execute("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
                                "VALUES (%s, %s, 1, %s, '{}', now())", (f"{new}-1", new, v1))
        assert query(pg, "SELECT count(*) FROM events WHERE run_id = %s", new) == [(0,)]
        assert "application_name changed to one of major 1" in seat.log()
    finally:
        bouncer.stop()


# ---------------------------------------------------------------- a driver that SETs application_name


def test_a_set_of_application_name_that_selects_another_major_ends_the_session(pg, start_seat, renamed):
    """pgjdbc on its defaults (and any client) may set application_name after connecting: the session was
    given its major by the startup packet, so a SET that selects another one ends it with a FATAL."""
    v1, v2 = renamed
    seat = start_seat(proxy={"clients": [{"application_name": V1_APP, "major": 1}]})
    old = era2_run(pg, v1)
    with psycopg.connect(seat.dsn(user=HOST), autocommit=True) as conn:
        assert conn.execute("SELECT type FROM events WHERE run_id = %s", (old,)).fetchone() == (v2,)
        conn.execute("SET application_name = 'reporting'")  # the same major: nothing happens
        with pytest.raises(psycopg.Error) as e:
            conn.execute(f"SET application_name = '{V1_APP}'")
        assert e.value.sqlstate == "0A000" and e.value.diag.severity == "FATAL"
        assert "selects major 1" in str(e.value) and "connect again" in str(e.value)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")  # the session is over
    # with the name in the startup packet, the v1 host gets major 1
    with psycopg.connect(seat.dsn(user=HOST, application_name=V1_APP), autocommit=True) as conn:
        assert conn.execute("SELECT type FROM events WHERE run_id = %s", (old,)).fetchone() == (v1,)
