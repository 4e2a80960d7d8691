"""First boot: a translating seat starts on a database where the host has not created its tables yet, relays the
host's own migrations, refuses every statement of a v2 session that reads or writes event rows until `migrate` has
run (a v1 session reads and writes them as stored), then translates without a restart
(docs/operations.md#first-boot)."""

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


def test_a_v1_host_writes_and_reads_its_events_at_first_boot_and_they_are_era_2_after_migrate(pg, empty_db, start_seat):
    """A v1 host (major 1) is not held up by first boot: no run can be era 3 before the rules are in force, so its
    event rows pass as stored, and the runs it creates then are era 2. When the rules come into force its sessions
    end at once, in a transaction too: from then on a run can be era 3, which a v1 reader must read translated."""
    seat = start_seat(proxy={"default_major": 1}, host={"dsn": pg.dsn(dbname=empty_db)})
    host = psycopg.connect(seat.dsn(dbname=empty_db), autocommit=True)
    for statement in filter(str.strip, HOST_SCHEMA.split(";")):
        host.execute(statement)
    v1 = sorted(A.renamed)[0]
    host.execute("INSERT INTO runs (run_id, tenant_id) VALUES ('r1', 't')")
    host.execute("INSERT INTO events VALUES ('e1', 'r1', 1, %s, 'n1', '{}', now(), NULL)", (v1,))
    time.sleep(2.5)  # the seat has learnt the events table's columns: the leak check does not end the v1 session
    for prepare in (False, True):
        assert host.execute("SELECT type FROM events WHERE run_id = %s", ("r1",), prepare=prepare).fetchall() \
            == [(v1,)]
    in_txn = psycopg.connect(seat.dsn(dbname=empty_db))
    assert in_txn.execute("SELECT 1").fetchone() == (1,)  # a transaction left open (on neither table: migrate waits
    # for the locks of one that read them)

    out = seat_cli("migrate", "--dsn", pg.dsn(dbname=empty_db))
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 15
    while "rules are in force" not in seat.log():
        assert time.monotonic() < deadline, seat.log()
        time.sleep(0.1)
    # the session in its transaction was ended at once, and nothing it could still send reaches the server
    with pytest.raises(psycopg.OperationalError):
        in_txn.execute("SELECT type FROM events").fetchall()
    in_txn.close()
    with pytest.raises(psycopg.OperationalError):
        host.execute("SELECT 1")
    host.close()
    # the run written at first boot is era 2: stored in v1 spelling, read by a v2 session in v2 spelling
    assert pg.psql("SELECT type FROM events WHERE run_id = 'r1'", dbname=empty_db).strip() == v1
    second = start_seat(host={"dsn": pg.dsn(dbname=empty_db)})  # default major 2
    with psycopg.connect(second.dsn(dbname=empty_db)) as v2:
        assert v2.execute("SELECT type FROM events WHERE run_id = 'r1'").fetchall() == [(A.v1_to_v2[v1],)]
        assert pg.psql("SELECT count(*) FROM openwop_seat.run_era WHERE run_id = 'r1'", dbname=empty_db).strip() == "0"
    with psycopg.connect(seat.dsn(dbname=empty_db)) as v1_again:  # a new v1 session is claimed now
        assert v1_again.execute("SELECT openwop_seat.session_major()").fetchone() == (1,)
        assert v1_again.execute("SELECT type FROM events WHERE run_id = 'r1'").fetchall() == [(v1,)]
