"""The claim in one round trip (ADR 0013): a proof is good once, for one backend, near the server's clock.

``openwop_seat.claim_once(pid, at_us, nonce, major, proof)`` is called here directly, as the seat calls it, with
proofs made from the test run's secret: what it takes, what it refuses (and records nothing for), and that the
seat falls back to the challenge (ADR 0006) when the database does not take it. Raw sessions are relayed
unclaimed.

Every run id is fresh; the shared ``postgres`` database needs no cleanup, but the test that empties
``openwop_seat.claims`` (as a crash would) puts its row of pid 0 back.
"""

from __future__ import annotations

import re
import time
import urllib.request

import psycopg
import pytest

from harness import CLAIM_SECRET
from proxy.db.claims import claim_once_params
from proxy.db.layout import CLAIM_CLOCK_TOLERANCE_US, CLAIM_ONCE_SQL

SQL = re.sub(r"\$\d", "%s", CLAIM_ONCE_SQL)  # psycopg's placeholders


@pytest.fixture(scope="module")
def salt(pg) -> str:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        return conn.execute("SELECT salt FROM openwop_seat.claim_secret").fetchone()[0]


def claim(conn, params) -> str:
    return conn.execute(SQL, params).fetchone()[0]


def major_of(conn):
    return conn.execute("SELECT openwop_seat.session_major()").fetchone()[0]


def metrics(seat) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def test_claim_once_is_sql_not_plpgsql(pg):
    """Nothing to compile in a fresh backend."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        lang = conn.execute("SELECT l.lanname, p.prosecdef FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
                            "WHERE p.oid = 'openwop_seat.claim_once(integer, bigint, text, integer, text)'"
                            "::regprocedure").fetchone()
    assert lang == ("sql", True)


@pytest.mark.parametrize("major", [0, 1, 2])
def test_a_proof_claims_its_backend_once(pg, salt, major):
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        params = claim_once_params(CLAIM_SECRET, salt, conn.info.backend_pid, major)
        assert claim(conn, params) == "ok" and major_of(conn) == major
        # the same proof again, on the same backend: refused, the claim stays
        assert claim(conn, params) == "replay"
        # an earlier time of the same pid (a proof made before the last one): refused too
        earlier = claim_once_params(CLAIM_SECRET, salt, conn.info.backend_pid, 2, at_us=params[1] - 1)
        assert claim(conn, earlier) == "replay" and major_of(conn) == major


def test_a_proof_of_another_pid_records_nothing(pg, salt):
    with psycopg.connect(pg.dsn(), autocommit=True) as first:
        params = claim_once_params(CLAIM_SECRET, salt, first.info.backend_pid, 2)
        with psycopg.connect(pg.dsn(), autocommit=True) as other:
            assert claim(other, params) == f"pooler {other.info.backend_pid}"
            assert major_of(other) is None
        assert claim(first, params) == "ok"  # still good where it was made for


@pytest.mark.parametrize("how", ["secret", "major", "nonce", "time"])
def test_a_forged_proof_is_refused(pg, salt, how):
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        pid = conn.info.backend_pid
        pid_, at_us, nonce, major, proof = claim_once_params(CLAIM_SECRET, salt, pid, 1)
        forged = {"secret": claim_once_params("another-secret-of-16+", salt, pid, 2),
                  "major": (pid, at_us, nonce, 2, proof),
                  "nonce": (pid, at_us, "f" * 32, major, proof),
                  "time": (pid, at_us + 1, nonce, major, proof)}[how]
        assert claim(conn, forged) == "wrong secret" and major_of(conn) is None


@pytest.mark.parametrize("off", [-1, 1])
def test_a_time_off_the_servers_clock_is_refused(pg, salt, off):
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        at = time.time_ns() // 1000 + off * (CLAIM_CLOCK_TOLERANCE_US + 5_000_000)
        assert claim(conn, claim_once_params(CLAIM_SECRET, salt, conn.info.backend_pid, 2, at_us=at)) == "clock"
        assert major_of(conn) is None


@pytest.mark.parametrize("at", [0, -1, -(2 ** 62), 2 ** 53, 2 ** 63 - 1])
def test_a_time_out_of_any_range_is_refused_not_raised(pg, salt, at):
    """The seat's time becomes a timestamptz (to_timestamp) before it meets the server's: a time that function
    could not take, or far out, is the verdict 'clock', never an error, with a proof made for it."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        assert claim(conn, claim_once_params(CLAIM_SECRET, salt, conn.info.backend_pid, 2, at_us=at)) == "clock"
        assert major_of(conn) is None


def test_the_seat_time_becomes_a_timestamp_to_the_microsecond(pg):
    """claim_once compares to_timestamp(at_us / 1e6), in float8, with the server's clock: exact for every time from
    now until 2^31 seconds (the year 2038), within a microsecond until 2^53 microseconds (the year 2255). The checks
    it serves are a minute wide; the replay check compares the integers."""
    now = time.time_ns() // 1000
    off = "extract(epoch FROM pg_catalog.to_timestamp(t::float8 / '1000000'::float8)) * 1000000 - t"
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        exact = conn.execute(
            f"SELECT count(*) FILTER (WHERE {off} <> 0), count(*) FROM ("
            "SELECT %s::bigint + (random() * (2147483647000000 - %s))::bigint AS t FROM generate_series(1, 200000) "
            "UNION ALL SELECT %s::bigint + g FROM generate_series(0, 100000) g "
            "UNION ALL SELECT 2147483647000000 - g FROM generate_series(0, 1000) g) x", (now, now, now)).fetchone()
        near = conn.execute(
            f"SELECT max(abs({off})) FROM (SELECT (random() * 2 ^ 53)::bigint AS t FROM generate_series(1, 200000) "
            "UNION ALL SELECT 2 ^ 53 - 1 - g FROM generate_series(0, 1000) g) x").fetchone()[0]
    assert exact == (0, 301_002)
    assert near <= 1


def test_after_claims_was_emptied_one_round_trip_claims_wait_and_the_seat_falls_back(pg, salt, start_seat):
    """claims is UNLOGGED: a crash empties it, and with it the last seat time of every pid. Proofs made before
    must not be taken then: until the tolerance has passed, claim_once refuses every proof ('ledger')."""
    seat = start_seat()
    with psycopg.connect(seat.dsn(), autocommit=True) as conn:  # the seat learns the salt
        assert major_of(conn) == 2
    try:
        pg.psql("TRUNCATE openwop_seat.claims")  # what crash recovery does to an UNLOGGED table
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            assert claim(conn, claim_once_params(CLAIM_SECRET, salt, conn.info.backend_pid, 2)) == "ledger"
            assert claim(conn, claim_once_params(CLAIM_SECRET, salt, conn.info.backend_pid, 2)) == "ledger"
            assert major_of(conn) is None
        for _ in range(2):  # through the seat: claimed all the same, by the challenge
            with psycopg.connect(seat.dsn(), autocommit=True) as conn:
                assert major_of(conn) == 2
        assert 'openwop_seat_claims_total{path="challenge after ledger"} 2.0' in metrics(seat)
    finally:
        pg.psql("UPDATE openwop_seat.claims SET backend_start = '-infinity' WHERE pid = 0")


def test_the_seat_claims_in_one_round_trip_once_it_knows_the_salt(pg, start_seat):
    seat = start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1}]})
    for app in ("", "v1-host", "", "v1-host"):
        with psycopg.connect(seat.dsn(application_name=app), autocommit=True) as conn:
            assert major_of(conn) == (1 if app else 2)
    text = metrics(seat)
    assert 'openwop_seat_claims_total{path="challenge"} 1.0' in text  # the first: the salt was not known
    assert 'openwop_seat_claims_total{path="once"} 3.0' in text


def test_a_raw_session_is_relayed_unclaimed(pg, start_seat):
    """As the README says: byte for byte, no statement of the seat's own on its backend."""
    seat = start_seat(proxy={"clients": [{"application_name": "ops", "major": "raw"}]})
    with psycopg.connect(seat.dsn(application_name="ops"), autocommit=True) as conn:
        pid = conn.info.backend_pid
        with psycopg.connect(pg.dsn(), autocommit=True) as direct:
            # the backend has run nothing but what the client sent (psycopg sends nothing at connect)
            assert direct.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == ("",)
        assert major_of(conn) is None
        assert conn.execute("SELECT count(*) >= 0 FROM events").fetchone() == (True,)  # the net lets it read
    assert "openwop_seat_claims_total{" not in metrics(seat)  # nothing claimed
