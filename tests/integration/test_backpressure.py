"""Bounded buffers: a slow reader on either side stalls the other side instead of growing the seat."""

from __future__ import annotations

import socket
import time

import psycopg
import pytest
from rawpg import RawConn, msg, query

from proxy.serve.context import RELATION_CHECK_SECONDS


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


def _pipeline_without_reading(seat, pg, chunk: bytes, app: str, seconds: float = 8) -> int:
    """Send ``chunk`` (each holding Syncs) until the seat stops taking them or ``seconds`` pass, reading nothing;
    the growth of the seat's RSS then."""
    # a session of the same kind first, reading its answers: what every session loads (the parser, the plans) is
    # not counted against the one that does not read
    warm = RawConn(seat.port)
    warm.login(application_name=app)
    warm.send(query("SELECT count(*) FROM events") + chunk[:len(chunk) // 10])
    while True:
        warm.read_until(b"Z")
        if not warm.buf:
            warm.sock.settimeout(0.5)
            try:
                if not warm._fill():
                    break
            except socket.timeout:
                break
    warm.close()
    baseline = rss_bytes(seat.proc.pid)
    c = RawConn(seat.port)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    c.login(application_name=app)
    c.sock.settimeout(3)
    sent = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            c.sock.sendall(chunk)
            sent += len(chunk)
    except socket.timeout:
        pass  # the seat (and behind it PostgreSQL) stopped reading: backpressure reached the client
    grown = rss_bytes(seat.proc.pid) - baseline
    print(f"{app}: sent {sent / 1024 / 1024:.1f} MiB of pipelined messages, seat RSS grew "
          f"{grown / 1024 / 1024:.1f} MiB")
    c.close()
    return grown


# The bound these tests state: a session that reads nothing holds about buffer_limit (1 MiB) in each direction's
# write buffer, as much again in bookkeeping of the answers it is owed (buffer_limit / 64 answers), and the objects of
# one framed chunk (a 32 KiB slice with a read path; a raw session's whole 256 KiB read). Measured: 0-9 MiB alone, and
# once over 16 MiB on a loaded machine (the allocator's high-water mark, which RSS never gives back); before the
# owed-answers bound and the slices a translated session grew 80-95 MiB here with pipelined Syncs (raw 19 MiB, which
# this bound does not tell apart: the translated sessions are what it holds).
PIPELINE_RSS_BOUND = 32 * 1024 * 1024
SYNCS = msg(b"S") * 20000
EXTENDED = (msg(b"P", b"\0SELECT 1\0\0\0") + msg(b"B", b"\0\0\0\0\0\0\0") + msg(b"E", b"\0\0\0\0\0")
            + msg(b"S")) * 2000


@pytest.fixture
def pipe_seat(start_seat):
    """A seat of its own per test: RSS does not shrink after a session ends, so a shared seat would let one test's
    high-water mark hide another's growth."""
    seat = start_seat(proxy={"buffer_limit": 1 << 20, "clients": [{"application_name": "pipe-1", "major": 1},
                                                                  {"application_name": "pipe-raw", "major": "raw"}]})
    # what the process loads once, not per session: its catalog connection and the first catalog checks
    time.sleep(2 * RELATION_CHECK_SECONDS + 0.5)
    return seat


@pytest.mark.parametrize("major", [2, 1, "raw"])
@pytest.mark.parametrize("kind", ["syncs", "extended"])
def test_pipelined_syncs_never_read_stay_within_the_buffer_limit(pipe_seat, pg, major, kind):
    seat = pipe_seat
    app = {2: "pipe-2", 1: "pipe-1", "raw": "pipe-raw"}[major]
    grown = _pipeline_without_reading(seat, pg, SYNCS if kind == "syncs" else EXTENDED, app)
    assert grown < PIPELINE_RSS_BOUND
    # the seat still serves others
    with psycopg.connect(seat.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
