"""psql through the seat (psql 15 speaks the simple protocol only)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import pytest

from harness import PASSWORD


def psql(dsn: str, *args: str, password: str | None = None, input: str | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGCONNECT_TIMEOUT": "10"}
    env.pop("PGPASSWORD", None)
    if password:
        env["PGPASSWORD"] = password
    out = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-At", "-d", dsn, *args], input=input,
                         capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert out.returncode == 0, out.stderr
    return out


@pytest.mark.parametrize("user, password", [("host_user", None), ("md5_user", PASSWORD), ("scram_user", PASSWORD)])
def test_auth_methods(seat, user, password):
    assert psql(seat.dsn(user=user), "-c", "SELECT current_user", password=password).stdout == f"{user}\n"


def test_multi_statement_script_matches_direct(seat, pg, fresh_table):
    table = fresh_table("id int, v text")
    script = (f"INSERT INTO {table} SELECT g, md5(g::text) FROM generate_series(1, 50) g; "
              f"SELECT count(*), max(v) FROM {table}; UPDATE {table} SET v = 'x' WHERE id < 10; "
              f"SELECT string_agg(v, ',' ORDER BY id) FROM {table} WHERE id < 12; DELETE FROM {table};")
    via = psql(seat.dsn(), "-c", script).stdout
    direct = psql(pg.dsn(), "-c", script).stdout
    assert via == direct and "x,x,x" in via


def test_error_and_recovery_in_one_session(seat):
    out = psql(seat.dsn(), "-v", "ON_ERROR_STOP=0", input="SELECT 1/0;\nSELECT 'after';\n", check=False)
    assert "division by zero" in out.stderr and out.stdout == "after\n"


def test_copy_both_ways_100k_rows(seat, pg, fresh_table):
    table = fresh_table("id int, label text")
    query = r"\copy (SELECT g, md5(g::text) FROM generate_series(1, 100000) g) TO STDOUT"
    via = psql(seat.dsn(), "-c", query).stdout
    direct = psql(pg.dsn(), "-c", query).stdout
    assert hashlib.sha256(via.encode()).digest() == hashlib.sha256(direct.encode()).digest()
    assert via.count("\n") == 100_000
    psql(seat.dsn(), "-c", rf"\copy {table} FROM STDIN", input=via)
    back = psql(pg.dsn(), "-c", rf"\copy (SELECT * FROM {table} ORDER BY id) TO STDOUT").stdout
    assert back == via


def test_listen_notify(seat):
    out = psql(seat.dsn(), input="LISTEN psql_chan;\nNOTIFY psql_chan, 'hi';\nSELECT 'done';\n").stdout
    assert 'Asynchronous notification "psql_chan" with payload "hi"' in out


def test_sigint_cancels_pg_sleep(seat, pg):
    proc = subprocess.Popen(["psql", "-X", "-At", "-d", seat.dsn(), "-c", "SELECT pg_sleep(30.5)"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20  # until the statement runs: a SIGINT before it would cancel nothing
    while pg.psql("SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30.5)' "
                  "AND wait_event = 'PgSleep'").strip() != "1":
        assert time.monotonic() < deadline and proc.poll() is None, "the statement never started"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # psql answers SIGINT with a CancelRequest
    _, err = proc.communicate(timeout=60)
    assert "canceling statement due to user request" in err  # ended by the cancel, not after its 30.5 s


def test_tls_client_side_requires_certificate_config(seat):
    # The shared seat has no certificate: it answers 'N', so sslmode=require fails cleanly...
    out = psql(seat.dsn(sslmode="require"), "-c", "SELECT 1", check=False)
    assert out.returncode != 0 and "server does not support SSL" in out.stderr
    # ...and sslmode=prefer falls back to plaintext.
    assert psql(seat.dsn(sslmode="prefer"), "-c", "SELECT 1").stdout == "1\n"
