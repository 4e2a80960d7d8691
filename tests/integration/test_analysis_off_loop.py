"""A long statement is parsed off the event loop: other sessions are served meanwhile (issue 23, item 6).

No wall-clock assertion: the seat's analysis thread is held on a test hook (OPENWOP_SEAT_TEST_HOLD_ANALYSIS, a
directory: the thread creates "held" and waits for "release"), and the test shows the order of the answers.
"""

from __future__ import annotations

import socket
import time

import psycopg
from rawpg import RawConn, error_fields, msg, query

from proxy.serve.session import HOLD_ANALYSIS_ENV


def wait_for(path, seat) -> None:
    deadline = time.monotonic() + 60  # a guard against a hang, not a measurement
    while not path.exists():
        assert seat.alive() and time.monotonic() < deadline, f"the seat never started the analysis:\n{seat.log()}"
        time.sleep(0.02)


def nothing_received(c: RawConn) -> bool:
    """No byte waits on the socket now (a peek that does not block)."""
    c.sock.setblocking(False)
    try:
        c.sock.recv(1, socket.MSG_PEEK)
        return False
    except BlockingIOError:
        return not c.buf
    finally:
        c.sock.setblocking(True)


def test_another_session_is_answered_while_a_long_statement_is_analysed(start_seat, pg, tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv(HOLD_ANALYSIS_ENV, str(gate))
    seat = start_seat()
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:
        expected = direct.execute("SELECT count(*) FROM events").fetchone()[0]
    long = RawConn(seat.port, timeout=60)
    long.login(application_name="long-statement")
    # about 0.96 MiB over the events table (the size that stalled a worker for seconds), then a short one after it
    sql = "SELECT count(type) FROM events WHERE run_id NOT IN (" + ", ".join(f"'r{i:07d}'" for i in range(80_000)) + ")"
    assert 0.9 * (1 << 20) < len(sql) < 1 << 20
    long.send(query(sql) + query("SELECT 'after it'"))
    wait_for(gate / "held", seat)  # the seat is analysing it now, and holds it there
    # meanwhile another session of the same worker is served: a translated read and a plain statement
    with psycopg.connect(seat.dsn(application_name="other"), autocommit=True) as other:
        assert other.execute("SELECT count(type) FROM events").fetchone() == (expected,)
        assert other.execute("SELECT 42").fetchone() == (42,)
    assert nothing_received(long)  # the long statement (and the one after it) has no answer yet
    (gate / "release").touch()
    out = long.read_until(b"Z")
    assert not [error_fields(b) for t, b in out if t == b"E"]
    assert [b[6:] for t, b in out if t == b"D"] == [str(expected).encode()]
    out = long.read_until(b"Z")
    assert [b[6:] for t, b in out if t == b"D"] == [b"after it"]
    long.send(msg(b"X"))
    long.close()
