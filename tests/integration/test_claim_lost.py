"""A claim another session takes ends its backend (ADR 0016, rule 5 as amended): the triggers on
``openwop_seat.claims`` (``on_claim_lost``).

Sessions are claimed here directly with ``claim_once``, as the seat claims them, with proofs made from the test run's
secret. A session whose claims row another session deletes, changes or truncates is ended
(``pg_terminate_backend``); the backend's own writes, rows without a claim and rows of backends that have ended
end nothing. The pooled side (an idle backend ended, never handed out) is in test_pool.py.
"""

from __future__ import annotations

import re
import time

import psycopg
import pytest

from harness import CLAIM_SECRET
from proxy.db.claims import claim_once_params
from proxy.db.layout import CLAIM_ONCE_SQL

SQL = re.sub(r"\$\d", "%s", CLAIM_ONCE_SQL)


@pytest.fixture(scope="module")
def salt(pg) -> str:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        return conn.execute("SELECT salt FROM openwop_seat.claim_secret").fetchone()[0]


@pytest.fixture
def claimed(pg, salt):
    """Factory: a new session claimed as ``major``; every one is closed at the end."""
    opened = []

    def make(major: int = 2) -> psycopg.Connection:
        conn = psycopg.connect(pg.dsn(), autocommit=True)
        opened.append(conn)
        params = claim_once_params(CLAIM_SECRET, salt, conn.info.backend_pid, major)
        assert conn.execute(SQL, params).fetchone()[0] == "ok"
        return conn

    yield make
    for conn in opened:
        conn.close()


def alive(pg, pid: int) -> bool:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 1


def ended(pg, conn: psycopg.Connection) -> None:
    """``conn``'s backend was ended: its next statement fails, and it is gone from pg_stat_activity."""
    pid = conn.info.backend_pid
    with pytest.raises(psycopg.OperationalError, match="terminating connection due to administrator command"):
        conn.execute("SELECT 1")
    deadline = time.monotonic() + 10
    while alive(pg, pid):
        assert time.monotonic() < deadline, f"backend {pid} is still there"
        time.sleep(0.02)


def still_claimed(conn: psycopg.Connection, major: int) -> None:
    assert conn.execute("SELECT openwop_seat.session_major()").fetchone()[0] == major


def test_a_deleted_claim_ends_its_backend(pg, claimed):
    victim, other = claimed(2), claimed(1)
    with psycopg.connect(pg.dsn(), autocommit=True) as op:
        assert op.execute("DELETE FROM openwop_seat.claims WHERE pid = %s",
                          (victim.info.backend_pid,)).rowcount == 1
    ended(pg, victim)
    still_claimed(other, 1)


@pytest.mark.parametrize("change", ["major = 1", "backend_start = backend_start - interval '1 second'",
                                    "pid = pid + 1000000"])
def test_a_changed_claim_ends_its_backend(pg, claimed, change):
    victim = claimed(2)
    with psycopg.connect(pg.dsn(), autocommit=True) as op:
        op.execute(f"UPDATE openwop_seat.claims SET {change} WHERE pid = %s", (victim.info.backend_pid,))
        op.execute("DELETE FROM openwop_seat.claims WHERE pid > 1000000")
    ended(pg, victim)


def test_a_write_that_keeps_the_claim_ends_nothing(pg, claimed):
    victim = claimed(2)
    with psycopg.connect(pg.dsn(), autocommit=True) as op:
        assert op.execute("UPDATE openwop_seat.claims SET claimed_at = now(), challenge = 'x' WHERE pid = %s",
                          (victim.info.backend_pid,)).rowcount == 1
    still_claimed(victim, 2)


def test_a_backend_that_deletes_its_own_claim_goes_on(pg, claimed):
    """The backend's own write (a new backend's claim over a pid's old row is one) ends nothing; the pool's reset
    then finds the claim gone (test_pool.py)."""
    me = claimed(2)
    assert me.execute("DELETE FROM openwop_seat.claims WHERE pid = pg_backend_pid()").rowcount == 1
    assert me.execute("SELECT openwop_seat.session_major()").fetchone()[0] is None


def test_the_row_of_an_ended_backend_ends_nothing(pg, claimed):
    """A row whose pid is now another backend's (its start time is not that backend's) ends nothing."""
    with psycopg.connect(pg.dsn(), autocommit=True) as bystander, \
            psycopg.connect(pg.dsn(), autocommit=True) as op:
        pid = bystander.info.backend_pid
        op.execute("INSERT INTO openwop_seat.claims (pid, backend_start, major) VALUES (%s, '2000-01-01', 2) "
                   "ON CONFLICT (pid) DO UPDATE SET backend_start = '2000-01-01', major = 2", (pid,))
        assert op.execute("DELETE FROM openwop_seat.claims WHERE pid = %s", (pid,)).rowcount == 1
        assert bystander.execute("SELECT 1").fetchone() == (1,)


def test_a_row_without_a_claim_ends_nothing(pg):
    """A pending challenge (major NULL) is no claim yet."""
    with psycopg.connect(pg.dsn(), autocommit=True) as pending, \
            psycopg.connect(pg.dsn(), autocommit=True) as op:
        pending.execute("SELECT openwop_seat.claim_challenge()")
        assert op.execute("DELETE FROM openwop_seat.claims WHERE pid = %s AND major IS NULL",
                          (pending.info.backend_pid,)).rowcount == 1
        assert pending.execute("SELECT 1").fetchone() == (1,)


def test_truncating_the_claims_ends_every_claimed_backend_but_the_truncating_one(pg, claimed):
    first, second = claimed(2), claimed(1)
    with psycopg.connect(pg.dsn(), autocommit=True) as unclaimed, \
            psycopg.connect(pg.dsn(), autocommit=True) as op:
        try:
            op.execute("TRUNCATE openwop_seat.claims")
        finally:  # as after a crash: claim_once writes the ledger's row again, but the suite's other tests read it
            op.execute("INSERT INTO openwop_seat.claims (pid, backend_start, major, claimed_at) "
                       "VALUES (0, '-infinity', NULL, now()) ON CONFLICT (pid) DO NOTHING")
        assert unclaimed.execute("SELECT 1").fetchone() == (1,)
        assert op.execute("SELECT 1").fetchone() == (1,)
    ended(pg, first)
    ended(pg, second)


@pytest.mark.parametrize("sees", [False, True], ids=["cannot see its start", "may not signal it"])
def test_an_owner_that_cannot_end_the_backend_refuses_the_write(pg, claimed, sees):
    """The trigger's function owned by a role without pg_read_all_stats (it cannot tell the backend from another of
    the same pid), or with it but not allowed to signal a superuser's backend: the DELETE is refused, the claim
    stays, the backend goes on. A claim is never taken from a live backend that then goes on without it."""
    victim = claimed(2)
    pid = victim.info.backend_pid
    with psycopg.connect(pg.dsn(), autocommit=True) as op:
        op.execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'claims_weak') THEN "
                   "CREATE ROLE claims_weak; END IF; END $$")
        op.execute("BEGIN")
        try:
            op.execute("GRANT USAGE ON SCHEMA openwop_seat TO claims_weak")
            op.execute("GRANT SELECT ON openwop_seat.claims TO claims_weak")
            if sees:
                op.execute("GRANT pg_read_all_stats TO claims_weak")
            op.execute("ALTER FUNCTION openwop_seat.on_claim_lost() OWNER TO claims_weak")
            match = "cannot see its start time" if not sees else "terminate"
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=match):
                op.execute("DELETE FROM openwop_seat.claims WHERE pid = %s", (pid,))
        finally:
            op.execute("ROLLBACK")
    still_claimed(victim, 2)
