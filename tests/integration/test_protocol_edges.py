"""Byte-level behaviour through a running seat: encryption requests, protocol 3.2, bad input, faults."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import time

import asyncpg
import psycopg
import pytest
from rawpg import RawConn, error_fields, msg, query, startup

from proxy.dev.devcluster import DevCluster, free_port


def assert_fatal_then_closed(conn: RawConn, sqlstate: str, text: str) -> dict:
    msgs = conn.read_all_until_closed()
    errors = [error_fields(body) for t, body in msgs if t == b"E"]
    assert errors, f"no ErrorResponse before close; got {msgs!r}"
    fields = errors[-1]
    assert fields["S"] == "FATAL" and fields["C"] == sqlstate and text in fields["M"], fields
    return fields


@pytest.fixture
def bystander(seat):
    """A session that must stay healthy while other clients misbehave."""
    conn = psycopg.connect(seat.dsn(), autocommit=True)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    yield conn
    assert conn.execute("SELECT 'still fine'").fetchone() == ("still fine",)
    conn.close()


def test_gssenc_request_answered_n_then_startup(seat):
    c = RawConn(seat.port)
    c.send(struct.pack("!II", 8, 80877104))
    assert c.read_bytes(1) == b"N"
    msgs = c.login()
    assert msgs[0] == (b"R", struct.pack("!I", 0)) and msgs[-1] == (b"Z", b"I")
    c.close()


def test_ssl_request_answered_n_without_certificate(seat):
    c = RawConn(seat.port)
    c.send(struct.pack("!II", 8, 80877103))
    assert c.read_bytes(1) == b"N"
    assert c.login()[-1] == (b"Z", b"I")
    c.close()


def test_protocol_3_2_startup_gets_negotiate_protocol_version_passed_through(seat):
    c = RawConn(seat.port)
    c.send(startup({"user": "postgres", "database": "postgres", "_pq_.unknown_ext": "1"}, version=(3 << 16) | 2))
    msgs = c.read_until(b"Z")
    nego = [body for t, body in msgs if t == b"v"]
    assert nego, msgs
    newest, n_unknown = struct.unpack_from("!II", nego[0])
    assert newest == 3 << 16 and n_unknown == 1 and nego[0][8:] == b"_pq_.unknown_ext\x00"
    c.send(query("SELECT 41 + 1"))
    rows = [body for t, body in c.read_until(b"Z") if t == b"D"]
    assert rows == [struct.pack("!HI", 1, 2) + b"42"]
    c.close()


def test_backend_key_data_passes_through_untouched(seat, pg):
    c = RawConn(seat.port)
    key = [body for t, body in c.login() if t == b"K"][0]
    pid = struct.unpack("!i", key[:4])[0]
    c.send(query("SELECT pg_backend_pid()"))
    rows = [body for t, body in c.read_until(b"Z") if t == b"D"]
    assert rows[0][6:] == str(pid).encode()
    c.close()


def test_cancel_request_with_wrong_key_cancels_nothing(seat):
    with psycopg.connect(seat.dsn()) as conn:
        pid = conn.info.backend_pid
        c = RawConn(seat.port)
        c.send(struct.pack("!IIi", 16, 80877102, pid) + b"\x00\x00\x00\x00")
        assert c.read_all_until_closed() == []
        assert conn.execute("SELECT pg_sleep(0.3), 'not cancelled'").fetchone()[1] == "not cancelled"


@pytest.mark.parametrize("junk, sqlstate, text", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "08P01", "invalid length of startup packet"),
    (struct.pack("!II", 20000, 3 << 16) + b"user\x00", "08P01", "invalid length of startup packet"),
    (struct.pack("!II", 9, 3 << 16) + b"\x00", "28000", "no PostgreSQL user name"),
    (struct.pack("!II", 8, 1234 << 16), "0A000", "unsupported frontend protocol"),
])
def test_garbage_instead_of_startup(seat, bystander, junk, sqlstate, text):
    c = RawConn(seat.port)
    c.send(junk)
    assert_fatal_then_closed(c, sqlstate, text)


@pytest.mark.parametrize("bad, sqlstate, text", [
    (msg(b"\x01", b"garbage"), "08P01", "invalid frontend message type 1"),
    (b"Q" + struct.pack("!I", (1 << 30) + 100), "54000", "too long"),
    (b"Q\x00\x00\x00\x02", "08P01", "invalid message length"),
    (os.urandom(0) + b"\xff\xff\xff\xff\xff\xff", "08P01", "invalid frontend message type 255"),
])
def test_bad_message_after_login_closes_only_that_client(seat, bystander, bad, sqlstate, text):
    c = RawConn(seat.port)
    c.login()
    c.send(bad)
    assert_fatal_then_closed(c, sqlstate, text)
    # A new session still works.
    c2 = RawConn(seat.port)
    assert c2.login()[-1] == (b"Z", b"I")
    c2.close()


def test_valid_messages_before_garbage_still_reach_the_server(seat, bystander, fresh_table):
    """Like PostgreSQL itself, the complete messages before the bad one are processed."""
    table = fresh_table("id int")
    c = RawConn(seat.port)
    c.login()
    c.send(query(f"INSERT INTO {table} VALUES (7)") + msg(b"\x02", b"x"))
    assert_fatal_then_closed(c, "08P01", "invalid frontend message type 2")
    deadline = time.monotonic() + 10
    while bystander.execute(f"SELECT array_agg(id) FROM {table}").fetchone() != ([7],):
        assert time.monotonic() < deadline, "the valid INSERT before the garbage was lost"
        time.sleep(0.05)


def test_truncated_message_then_eof(seat, bystander):
    c = RawConn(seat.port)
    c.login()
    c.send(query("SELECT 1")[:7])
    c.sock.shutdown(socket.SHUT_WR)
    assert_fatal_then_closed(c, "08P01", "unexpected EOF within message")


def test_plain_eof_mid_startup_is_harmless(seat, bystander):
    c = RawConn(seat.port)
    c.send(startup({"user": "postgres"})[:10])
    c.close()
    c = RawConn(seat.port)
    assert c.login()[-1] == (b"Z", b"I")
    c.close()


def test_upstream_unreachable_gives_class_08_error_naming_it(start_seat):
    dead_port = free_port()
    seat = start_seat(upstream_port=dead_port, proxy={"connect_timeout": 3})
    c = RawConn(seat.port)
    c.send(startup({"user": "postgres"}))
    fields = assert_fatal_then_closed(c, "08006", f"127.0.0.1:{dead_port}")
    assert "could not connect to upstream" in fields["M"]

    async def via_asyncpg():
        with pytest.raises(asyncpg.PostgresError) as e:
            await asyncpg.connect(seat.url())
        return e.value

    err = asyncio.run(via_asyncpg())
    assert err.sqlstate.startswith("08") and f"127.0.0.1:{dead_port}" in str(err)
    assert seat.alive()


def test_client_disconnect_mid_transaction_rolls_back(seat, pg, fresh_table):
    table = fresh_table("id int")
    c = RawConn(seat.port)
    c.login(application_name="vanishing-client")
    c.send(query(f"BEGIN; INSERT INTO {table} VALUES (1); SELECT pg_backend_pid()"))
    rows = [body for t, body in c.read_until(b"Z") if t == b"D"]
    pid = int(rows[-1][6:])
    c.sock.close()  # no Terminate: the client just vanishes
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if pg.psql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}").strip() == "0":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the upstream backend outlived its client")
    assert pg.psql(f"SELECT count(*) FROM {table}").strip() == "0"


def test_terminate_closes_upstream_too(seat, pg):
    c = RawConn(seat.port)
    c.login()
    c.send(query("SELECT pg_backend_pid()"))
    pid = int([b for t, b in c.read_until(b"Z") if t == b"D"][0][6:])
    c.send(msg(b"X"))
    assert c.read_all_until_closed() == []
    deadline = time.monotonic() + 10
    while pg.psql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}").strip() != "0":
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.fixture
def crashable_pg():
    """A cluster of its own, so killing a backend (which restarts the whole cluster) disturbs nobody."""
    cluster = DevCluster(settings={"restart_after_crash": "on"})
    cluster.start()
    yield cluster
    cluster.stop()


def test_upstream_dies_mid_result(start_seat, crashable_pg):
    seat = start_seat(upstream_port=crashable_pg.port)
    c = RawConn(seat.port, timeout=20)
    c.login()
    c.send(query("SELECT pg_backend_pid()"))
    pid = int([b for t, b in c.read_until(b"Z") if t == b"D"][0][6:])
    # A result far bigger than the socket buffers, so the backend is mid-result when it dies.
    c.send(query("SELECT repeat('x', 1000) FROM generate_series(1, 5000000)"))
    first = c.read_message()
    assert first[0] == b"T"
    os.kill(pid, signal.SIGKILL)
    msgs = c.read_all_until_closed(timeout=20)  # must not hang
    assert all(t in (b"D", b"E") for t, _ in msgs)
    rows = sum(1 for t, _ in msgs if t == b"D")
    assert rows < 5_000_000 and not any(t == b"C" for t, _ in msgs)
    assert seat.alive()
    crashable_pg.wait_ready()
    c2 = RawConn(seat.port)
    deadline = time.monotonic() + 30
    while True:  # the cluster restarts after the crash; the seat serves it again
        try:
            assert c2.login()[-1] == (b"Z", b"I")
            break
        except (AssertionError, EOFError, ConnectionError):
            assert time.monotonic() < deadline
            time.sleep(0.2)
            c2 = RawConn(seat.port)
    c2.close()
