"""SIGTERM drains (bounded by shutdown_timeout), SIGINT closes at once."""

from __future__ import annotations

import signal
import socket
import time

import psycopg
import pytest


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return False
    except OSError:
        return True


def test_sigterm_stops_accepting_and_waits_for_sessions(start_seat):
    seat = start_seat(proxy={"shutdown_timeout": 30})
    conn = psycopg.connect(seat.dsn(), autocommit=True)
    seat.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not refuses_connections(seat.port):
        assert time.monotonic() < deadline, "still accepting after SIGTERM"
        time.sleep(0.05)
    # The live session keeps working while the seat drains.
    for i in range(5):
        assert conn.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    assert seat.alive()
    conn.close()
    assert seat.proc.wait(10) == 0
    assert "draining" in seat.log() and "stopped" in seat.log()


def test_sigterm_closes_lingering_sessions_after_shutdown_timeout(start_seat):
    seat = start_seat(proxy={"shutdown_timeout": 1})
    conn = psycopg.connect(seat.dsn(), autocommit=True)
    started = time.monotonic()
    seat.proc.send_signal(signal.SIGTERM)
    assert seat.proc.wait(15) == 0
    assert time.monotonic() - started >= 0.9
    with pytest.raises(psycopg.OperationalError) as e:
        conn.execute("SELECT 1")
    assert "shutting down" in str(e.value) or "closed" in str(e.value)
    assert "shutdown timeout reached" in seat.log()


def test_sigint_closes_at_once(start_seat):
    seat = start_seat(proxy={"shutdown_timeout": 60})
    conn = psycopg.connect(seat.dsn(), autocommit=True)
    seat.proc.send_signal(signal.SIGINT)
    assert seat.proc.wait(10) == 0
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")


def test_sigterm_does_not_wait_for_connections_that_never_started(start_seat):
    seat = start_seat(proxy={"shutdown_timeout": 60})
    idle = socket.create_connection(("127.0.0.1", seat.port))  # connects, never sends a startup packet
    time.sleep(0.2)
    seat.proc.send_signal(signal.SIGTERM)
    assert seat.proc.wait(10) == 0
    idle.close()


def test_startup_timeout_closes_silent_connections(start_seat):
    seat = start_seat(proxy={"startup_timeout": 0.5})
    idle = socket.create_connection(("127.0.0.1", seat.port), timeout=10)
    data = b""
    while chunk := idle.recv(4096):
        data += chunk
    assert data[:1] == b"E" and b"timeout waiting for the startup packet" in data
    with psycopg.connect(seat.dsn()) as conn:  # a client that speaks at once is unaffected
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_sighup_reloads_without_stopping_the_seat(start_seat):
    seat = start_seat()
    with psycopg.connect(seat.dsn(), autocommit=True) as conn:
        seat.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reloaded" not in seat.log():
            assert time.monotonic() < deadline, seat.log()
            time.sleep(0.05)
        assert seat.alive() and conn.execute("SELECT 1").fetchone() == (1,)
    assert "changed=nothing" in seat.log()  # more in test_reload_limits.py


def test_sigterm_waits_for_an_open_transaction_and_metrics_answer_meanwhile(start_seat, pg, fresh_table):
    import urllib.request

    table = fresh_table("id int")
    seat = start_seat(proxy={"shutdown_timeout": 30})
    conn = psycopg.connect(seat.dsn())
    conn.execute(f"INSERT INTO {table} VALUES (1)")  # a transaction is open
    seat.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=10) as r:
        assert r.status == 200 and b"openwop_seat_client_connections_open 1.0" in r.read()
    assert seat.alive()
    conn.execute(f"INSERT INTO {table} VALUES (2)")
    conn.commit()
    conn.close()
    assert seat.proc.wait(15) == 0
    assert pg.psql(f"SELECT count(*) FROM {table}").strip() == "2"
