"""Bounded buffers: a slow reader on either side stalls the other side instead of growing the seat."""

from __future__ import annotations

import socket
import time

import psycopg
from rawpg import RawConn, msg, query


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_slow_client_stalls_the_upstream(start_seat, pg):
    seat = start_seat(proxy={"buffer_limit": 256 * 1024})
    baseline = rss_bytes(seat.proc.pid)
    c = RawConn(seat.port)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    c.login(application_name="slow-reader")
    # About 2 GB of result, and the client reads none of it.
    c.send(query("SELECT repeat('x', 2000) FROM generate_series(1, 1000000)"))
    deadline = time.monotonic() + 30
    while True:
        waiting = pg.psql("SELECT wait_event FROM pg_stat_activity WHERE application_name = 'slow-reader'").strip()
        if waiting == "ClientWrite":  # the backend is blocked writing to the seat
            break
        assert time.monotonic() < deadline, f"backend never blocked on the seat (wait_event={waiting!r})"
        time.sleep(0.1)
    time.sleep(1)  # give a leaking seat time to grow
    print(f"seat RSS growth while the client reads nothing: {(rss_bytes(seat.proc.pid) - baseline) / 1024:.0f} KiB")
    assert pg.psql("SELECT wait_event FROM pg_stat_activity WHERE application_name = 'slow-reader'").strip() \
        == "ClientWrite"
    assert rss_bytes(seat.proc.pid) - baseline < 64 * 1024 * 1024
    c.close()
    # Other sessions were never affected.
    with psycopg.connect(seat.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_slow_upstream_stalls_the_client(start_seat, pg, fresh_table):
    seat = start_seat(proxy={"buffer_limit": 256 * 1024})
    table = fresh_table("v text")
    baseline = rss_bytes(seat.proc.pid)
    with psycopg.connect(pg.dsn()) as locker:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # the COPY waits; the server stops reading
        c = RawConn(seat.port)
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        c.login()
        c.send(query(f"COPY {table} FROM STDIN"))
        c.sock.settimeout(2)
        row = msg(b"d", b"y" * 8000 + b"\n")
        sent = 0
        try:
            while sent < 2_000_000_000:
                c.sock.sendall(row)
                sent += len(row)
        except socket.timeout:
            pass
        assert sent < 100 * 1024 * 1024, "the seat kept accepting data the upstream did not read"
        assert rss_bytes(seat.proc.pid) - baseline < 64 * 1024 * 1024
        c.close()
        locker.rollback()
