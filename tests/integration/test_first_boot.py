"""First boot: a translating seat starts on a database where the host has not created its tables yet, relays the
host's own migrations, refuses every statement that reads or writes event rows until `migrate` has run, then
translates without a restart (docs/operations.md#first-boot)."""

from __future__ import annotations

import time
import urllib.request
import uuid

import psycopg
import pytest

from harness import HOST_SCHEMA, seat_cli
from proxy.artifacts.load import load_artifacts

A = load_artifacts()


@pytest.fixture
def empty_db(pg):
    name = f"fb_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {name}")
    yield name
    pg.psql(f"DROP DATABASE {name} WITH (FORCE)", check=False)


def metric(seat, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name}")


def refused(conn, sql: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as e:
        conn.execute(sql)
    return e.value


def test_host_boots_its_schema_through_the_seat_then_migrate_turns_translation_on(pg, empty_db, start_seat):
    seat = start_seat(host={"dsn": pg.dsn(dbname=empty_db)})  # default major 2: a v2 host
    assert "first boot" in seat.log()
    with urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/readyz", timeout=10) as r:
        assert r.status == 200 and "first boot" in r.read().decode()
    assert metric(seat, "openwop_seat_first_boot") == 1

    host = psycopg.connect(seat.dsn(dbname=empty_db), autocommit=True)
    for statement in filter(str.strip, HOST_SCHEMA.split(";")):  # the host's own migrations, through the seat
        host.execute(statement)
    host.execute("CREATE INDEX events_type_idx ON events (type)")  # DDL on the events table passes
    host.execute("INSERT INTO runs (run_id, tenant_id) VALUES ('r0', 't')")  # not an event row
    # Until migrate has run, no statement reads or writes event rows, in this session or a new one.
    for conn in (host, psycopg.connect(seat.dsn(dbname=empty_db), autocommit=True)):
        for sql in ("SELECT * FROM events", "SELECT count(*) FROM events",
                    "INSERT INTO events VALUES ('e', 'r0', 0, 'run.started', NULL, '{}', now(), NULL)",
                    "UPDATE events SET node_id = 'x'", "DELETE FROM events", "COPY events TO STDOUT"):
            e = refused(conn, sql)
            assert e.sqlstate == "OW004" and "first boot" in str(e), (sql, e)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on
    time.sleep(2.5)  # the seat notices the events table; still waiting for migrate
    assert refused(host, "SELECT * FROM events").sqlstate == "OW004"
    assert "first boot: waiting for openwop-seat migrate" in seat.log()
    assert pg.psql("SELECT count(*) FROM events", dbname=empty_db).strip() == "0"

    out = seat_cli("migrate", "--dsn", pg.dsn(dbname=empty_db))
    assert out.returncode == 0, out.stderr
    # An era-2 run in v1 vocabulary, written directly: a v2 reader must read it in v2 vocabulary.
    v1 = sorted(A.renamed)[0]
    pg.psql(f"INSERT INTO events VALUES ('e1', 'r0', 0, '{v1}', 'n1', '{{}}', now(), NULL)", dbname=empty_db)
    deadline = time.monotonic() + 15
    while True:  # without a restart: within the seat's 2 s catalog check
        try:
            with psycopg.connect(seat.dsn(dbname=empty_db)) as conn:
                rows = conn.execute("SELECT type FROM events WHERE run_id = 'r0'").fetchall()
                major = conn.execute("SELECT openwop_seat.session_major()").fetchone()[0]
            break
        except psycopg.Error as e:
            # OW004 while first boot lasts; a session that began during it and is idle when the rules come into
            # force is ended (57P01, or the connection closed under the statement): the retry reconnects.
            assert (e.sqlstate in ("OW004", "57P01") or isinstance(e, psycopg.OperationalError)) \
                and time.monotonic() < deadline, e
            time.sleep(0.2)
    assert rows == [(A.v1_to_v2[v1],)] and major == 2  # translated, and the session is claimed
    assert "rules are in force" in seat.log() and seat.alive()
    assert metric(seat, "openwop_seat_first_boot") == 0
    # The sessions that began at first boot (unclaimed) are ended once idle; their pool reconnects.
    e = refused(host, "SELECT 1")
    assert isinstance(e, psycopg.OperationalError)
    host.close()
