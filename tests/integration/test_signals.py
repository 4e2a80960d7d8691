"""SIGTERM drains (bounded by shutdown_timeout; shutdown_mode "drain" waits for each session, "idle" ends idle ones),
SIGINT and SIGQUIT close at once, SIGHUP reloads, SIGUSR1 pauses and SIGUSR2 resumes."""

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
    seat = start_seat(proxy={"shutdown_timeout": 30, "shutdown_mode": "drain"})
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
    seat = start_seat(proxy={"shutdown_timeout": 1, "shutdown_mode": "drain"})
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
    seat = start_seat(proxy={"shutdown_timeout": 30, "shutdown_mode": "drain"})
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


def _readyz(seat) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/readyz", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _wait_log(seat, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while text not in seat.log():
        assert time.monotonic() < deadline, f"{text!r} not logged: {seat.log()}"
        time.sleep(0.05)


def _connect_in_background(dsn: str):
    """Start psycopg.connect + SELECT 1 in a thread; returns (thread, result dict)."""
    import threading

    result: dict = {}

    def run():
        try:
            with psycopg.connect(dsn, connect_timeout=30) as c:
                result["value"] = c.execute("SELECT 42").fetchone()[0]
        except Exception as e:  # noqa: BLE001 - the test reads it
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_sigusr1_pauses_accepting_and_sigusr2_resumes(start_seat):
    seat = start_seat(proxy={"shutdown_timeout": 30})
    live = psycopg.connect(seat.dsn(), autocommit=True)
    seat.proc.send_signal(signal.SIGUSR1)
    _wait_log(seat, "paused")
    assert seat.alive()
    thread, result = _connect_in_background(seat.dsn())
    time.sleep(1.0)
    assert thread.is_alive() and not result, "a new connection was served while paused"
    assert live.execute("SELECT 1").fetchone() == (1,)  # the live session goes on
    status, body = _readyz(seat)
    assert status == 503 and "paused" in body
    seat.proc.send_signal(signal.SIGUSR1)  # a second pause changes nothing
    time.sleep(0.2)
    seat.proc.send_signal(signal.SIGUSR2)
    thread.join(15)
    assert result.get("value") == 42, result  # the waiting connection is served, not refused
    _wait_log(seat, "resumed")
    assert _readyz(seat)[0] == 200
    live.close()
    assert seat.stop(signal.SIGTERM) == 0


def test_sigquit_closes_at_once_and_exits_0(start_seat):
    seat = start_seat(proxy={"shutdown_timeout": 60})
    conn = psycopg.connect(seat.dsn(), autocommit=True)
    conn.execute("BEGIN")  # even a transaction in progress does not hold it
    seat.proc.send_signal(signal.SIGQUIT)
    assert seat.proc.wait(10) == 0
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    assert "stopping signal=SIGQUIT" in seat.log()


def test_sigterm_ends_idle_sessions_at_once_and_waits_for_transactions(start_seat, pg, fresh_table):
    """shutdown_mode "idle" (the default): idle pooled connections do not hold the drain for shutdown_timeout."""
    table = fresh_table("id int")
    seat = start_seat(proxy={"shutdown_timeout": 60})
    idle = [psycopg.connect(seat.dsn(), autocommit=True) for _ in range(3)]
    for conn in idle:
        conn.execute("SELECT 1")
    busy = psycopg.connect(seat.dsn())
    busy.execute(f"INSERT INTO {table} VALUES (1)")  # a transaction is open
    time.sleep(1.1)  # the idle ones have been idle for the grace already
    started = time.monotonic()
    seat.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not refuses_connections(seat.port):
        assert time.monotonic() < deadline, "still accepting after SIGTERM"
        time.sleep(0.05)
    for conn in idle:
        with pytest.raises(psycopg.OperationalError) as e:
            conn.execute("SELECT 1")
        assert "shutting down" in str(e.value) or "closed" in str(e.value)
    assert seat.alive()  # the transaction holds the drain...
    busy.execute(f"INSERT INTO {table} VALUES (2)")
    busy.commit()  # ...until it commits
    assert seat.proc.wait(15) == 0
    assert time.monotonic() - started < 15
    assert pg.psql(f"SELECT count(*) FROM {table}").strip() == "2"
    assert "shutdown timeout reached" not in seat.log()
    busy.close()
    for conn in idle:
        conn.close()

