"""The writer rule's guard at run time (ADR 0006): a running seat notices tampering with its triggers and
functions, periodically and on SIGHUP, reports it on /readyz and a metric, and refuses new sessions on the
host database meanwhile.  Each test gets its own host database, so that other seats never see the tampering."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import psycopg
import pytest

from harness import CLAIM_SECRET, HOST_SCHEMA, ROOT

HOST = "host_user"


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def broken_metric(port: int) -> float:
    _, text = get(port, "/metrics")
    m = re.search(r"^openwop_seat_writer_rule_broken (\S+)$", text, re.M)
    assert m, "openwop_seat_writer_rule_broken not exported"
    return float(m.group(1))


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def host_db(pg):
    name = f"wg_{uuid.uuid4().hex[:10]}"
    pg.psql(f"CREATE DATABASE {name} OWNER {HOST}")
    pg.psql(HOST_SCHEMA, user=HOST, dbname=name)
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
    env["OPENWOP_SEAT_CLAIM_SECRET"] = CLAIM_SECRET
    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=name)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    yield name
    pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


def session_refused(seat, db: str) -> str | None:
    """None when a new session on ``db`` through the seat is accepted (and claimed); else its FATAL text."""
    try:
        with psycopg.connect(seat.dsn(user=HOST, dbname=db), autocommit=True) as conn:
            assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (2,)
        return None
    except psycopg.OperationalError as e:
        return str(e)


TAMPERING = [
    ("disable a trigger", "ALTER TABLE events DISABLE TRIGGER zz_openwop_seat_append",
     "ALTER TABLE events ENABLE TRIGGER zz_openwop_seat_append"),
    ("replace a trigger", "CREATE OR REPLACE TRIGGER zz_openwop_seat_append_check AFTER INSERT ON events "
                          "FOR EACH ROW WHEN (false) EXECUTE FUNCTION openwop_seat.on_event_inserted()", None),
    ("replace a function", "CREATE OR REPLACE FUNCTION openwop_seat.session_major() RETURNS smallint "
                           "LANGUAGE sql AS 'SELECT 2::smallint'", None),
    # a claim taken would no longer end its backend (ADR 0016's addendum): pooled backends are handed over unchecked
    ("disable a claims trigger", "ALTER TABLE openwop_seat.claims DISABLE TRIGGER zz_openwop_seat_claim_deleted",
     "ALTER TABLE openwop_seat.claims ENABLE TRIGGER zz_openwop_seat_claim_deleted"),
    ("drop a claims trigger", "DROP TRIGGER zz_openwop_seat_claims_truncated ON openwop_seat.claims", None),
    # the net (ADR 0009), by the table's owner (host_user here, as in the reference host's deployment)
    ("turn the net off", "ALTER TABLE events DISABLE ROW LEVEL SECURITY",
     "ALTER TABLE events ENABLE ROW LEVEL SECURITY"),
    ("stop forcing the net", "ALTER TABLE events NO FORCE ROW LEVEL SECURITY",
     "ALTER TABLE events FORCE ROW LEVEL SECURITY"),
    ("open the net with a policy", "CREATE POLICY wide_open ON events FOR SELECT USING (true)",
     "DROP POLICY wide_open ON events"),
    ("drop the net's policy", "DROP POLICY openwop_seat_net ON events", None),
    # the table under the seat rebuilt (issue 23 item 4): the views and the net stay on the old one
    ("rebuild the events table", "ALTER TABLE events RENAME TO events_old; "
                                 "CREATE TABLE events (LIKE events_old INCLUDING ALL)",
     "DROP TABLE events; ALTER TABLE events_old RENAME TO events"),
]


@pytest.mark.parametrize("what, tamper, undo", TAMPERING, ids=[t[0] for t in TAMPERING])
def test_a_running_seat_notices_tampering_and_refuses_new_sessions(start_seat, pg, host_db, what, tamper, undo):
    seat = start_seat(host={"dsn": pg.dsn(dbname=host_db), "check_interval": 0.5})
    assert session_refused(seat, host_db) is None
    assert get(seat.metrics_port, "/readyz")[0] == 200 and broken_metric(seat.metrics_port) == 0
    held = psycopg.connect(seat.dsn(user=HOST, dbname=host_db), autocommit=True)  # open before the tampering
    held.execute("SELECT 1")
    owner = "TABLE events" in tamper or "POLICY" in tamper
    pg.psql(tamper, dbname=host_db, user=HOST if owner else None)  # the table's owner, else the superuser
    wait_for(lambda: broken_metric(seat.metrics_port) == 1, what="the periodic check to notice")
    # the open session is ended too (issue 23), not only new ones
    with pytest.raises(psycopg.OperationalError):
        held.execute("SELECT 1")
    held.close()
    status, body = get(seat.metrics_port, "/readyz")
    assert status == 503 and "writer rule not in force" in body, body
    fatal = session_refused(seat, host_db)
    assert fatal is not None and "accepts no new session on the host database while the writer rule is not in force" \
        in fatal, fatal
    # sessions on other databases are not the writer rule's business
    with psycopg.connect(seat.dsn(user=HOST, dbname="postgres"), autocommit=True) as other:
        assert other.execute("SELECT 1").fetchone() == (1,)
    if undo is not None:
        pg.psql(undo, dbname=host_db, user=HOST if owner else None)
    else:  # migrate puts back what it installed
        env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
        out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=host_db)], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "installed artifact objects" in out.stdout, out.stdout + out.stderr
    wait_for(lambda: broken_metric(seat.metrics_port) == 0, what="the periodic check to see it repaired")
    assert session_refused(seat, host_db) is None
    assert get(seat.metrics_port, "/readyz")[0] == 200
    _, text = get(seat.metrics_port, "/metrics")
    assert re.search(r'^openwop_seat_writer_rule_checks_total\{result="broken"\} [1-9]', text, re.M), text


def test_sighup_checks_the_writer_rule(start_seat, pg, host_db):
    seat = start_seat(host={"dsn": pg.dsn(dbname=host_db), "check_interval": 0})  # no periodic check
    assert session_refused(seat, host_db) is None
    pg.psql("ALTER TABLE events DISABLE TRIGGER zz_openwop_seat_update_era3", dbname=host_db)
    time.sleep(1.0)
    assert broken_metric(seat.metrics_port) == 0  # nothing looked yet
    seat.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: broken_metric(seat.metrics_port) == 1, what="SIGHUP's check")
    assert "is disabled" in get(seat.metrics_port, "/readyz")[1]
    assert session_refused(seat, host_db) is not None
    pg.psql("ALTER TABLE events ENABLE TRIGGER zz_openwop_seat_update_era3", dbname=host_db)
    seat.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: broken_metric(seat.metrics_port) == 0, what="SIGHUP's check after the repair")
    assert session_refused(seat, host_db) is None
