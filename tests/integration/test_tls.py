"""TLS on the client leg (the seat terminates it) and on the upstream leg (the seat negotiates it)."""

from __future__ import annotations

import socket
import ssl
import struct

import psycopg
import pytest
from rawpg import RawConn, error_fields, startup

from harness import PASSWORD
from proxy.dev.devcluster import DevCluster


def upstream_ssl(conn) -> bool:
    return conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()[0]


@pytest.fixture(scope="module")
def tls_seat(start_seat, certs):
    """Client-side TLS with the test certificate; plaintext to the upstream."""
    return start_seat(tls={"cert_file": certs["server_crt"], "key_file": certs["server_key"]})


def test_client_tls_terminated_by_seat(tls_seat, certs):
    dsn = tls_seat.dsn(sslmode="verify-full", sslrootcert=certs["server_crt"])
    with psycopg.connect(dsn.replace("host=127.0.0.1", "host=localhost")) as conn:
        assert conn.pgconn.ssl_in_use
        assert not upstream_ssl(conn)  # the upstream leg stays plaintext here
        assert conn.execute("SELECT 'over tls'").fetchone() == ("over tls",)


def test_client_tls_with_scram(tls_seat):
    with psycopg.connect(tls_seat.dsn(user="scram_user", sslmode="require"), password=PASSWORD) as conn:
        assert conn.pgconn.ssl_in_use and conn.execute("SELECT current_user").fetchone() == ("scram_user",)


def test_client_tls_with_a_certificate_the_client_does_not_trust(tls_seat, certs):
    with pytest.raises(psycopg.OperationalError) as e:
        psycopg.connect(tls_seat.dsn(sslmode="verify-full", sslrootcert=certs["other_crt"]))
    assert "certificate verify failed" in str(e.value)
    with psycopg.connect(tls_seat.dsn()) as conn:  # and the seat keeps serving
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_plaintext_after_ssl_request_is_refused(tls_seat):
    c = RawConn(tls_seat.port)
    # SSLRequest and a plaintext startup in one write: must not be accepted as if encrypted.
    c.send(struct.pack("!II", 8, 80877103) + struct.pack("!II", 9, 3 << 16) + b"\x00")
    assert c.read_bytes(1) == b"S"
    msgs = c.read_all_until_closed()
    assert error_fields(msgs[-1][1])["M"] == "received unencrypted data after SSL request"


def test_raw_tls_handshake_then_startup(tls_seat, certs):
    sock = socket.create_connection(("127.0.0.1", tls_seat.port), timeout=10)
    sock.sendall(struct.pack("!II", 8, 80877103))
    assert sock.recv(1) == b"S"
    ctx = ssl.create_default_context(cafile=certs["server_crt"])
    with ctx.wrap_socket(sock, server_hostname="localhost") as tls:
        body = struct.pack("!I", 3 << 16) + b"user\x00postgres\x00\x00"
        tls.sendall(struct.pack("!I", len(body) + 4) + body)
        data = b""
        while not data.endswith(b"Z\x00\x00\x00\x05I"):
            chunk = tls.recv(4096)
            assert chunk
            data += chunk
        assert data.startswith(b"R\x00\x00\x00\x08\x00\x00\x00\x00")


@pytest.mark.parametrize("mode", ["require", "prefer", "verify-full"])
def test_upstream_tls(start_seat, certs, mode):
    tls = {"upstream_sslmode": mode}
    if mode == "verify-full":
        tls["upstream_ca_file"] = certs["server_crt"]
    seat = start_seat(tls=tls)
    # tls_only may log in over hostssl only: success proves the upstream leg is encrypted.
    with psycopg.connect(seat.dsn(user="tls_only")) as conn:
        assert upstream_ssl(conn)
    with psycopg.connect(seat.dsn(user="scram_user"), password=PASSWORD) as conn:
        assert upstream_ssl(conn) and conn.execute("SELECT current_user").fetchone() == ("scram_user",)


def test_upstream_verify_full_with_wrong_ca_fails_with_class_08(start_seat, certs):
    seat = start_seat(tls={"upstream_sslmode": "verify-full", "upstream_ca_file": certs["other_crt"]})
    c = RawConn(seat.port)
    c.send(startup({"user": "postgres"}))
    fields = error_fields(c.read_all_until_closed()[-1][1])
    assert fields["C"] == "08006" and "TLS handshake with upstream" in fields["M"]


def test_upstream_require_with_ca_file_verifies_the_chain(start_seat, certs):
    good = start_seat(tls={"upstream_sslmode": "require", "upstream_ca_file": certs["server_crt"]})
    with psycopg.connect(good.dsn(user="tls_only")) as conn:
        assert upstream_ssl(conn)
    bad = start_seat(tls={"upstream_sslmode": "require", "upstream_ca_file": certs["other_crt"]})
    c = RawConn(bad.port)
    c.send(startup({"user": "postgres"}))
    fields = error_fields(c.read_all_until_closed()[-1][1])
    assert fields["C"] == "08006" and "CERTIFICATE_VERIFY_FAILED" in fields["M"]


def test_both_legs_tls(start_seat, certs):
    seat = start_seat(tls={"cert_file": certs["server_crt"], "key_file": certs["server_key"],
                           "upstream_sslmode": "verify-full", "upstream_ca_file": certs["server_crt"]})
    with psycopg.connect(seat.dsn(user="tls_only", sslmode="require")) as conn:
        assert conn.pgconn.ssl_in_use and upstream_ssl(conn)
    # md5 has no channel binding, so it works across two TLS legs.
    with psycopg.connect(seat.dsn(user="md5_user", sslmode="require"), password=PASSWORD) as conn:
        assert upstream_ssl(conn)
    # SCRAM-SHA-256-PLUS binds to the certificate the client saw: it works through the relay
    # only because this seat presents the database's own certificate.
    with psycopg.connect(seat.dsn(user="scram_user", sslmode="require", channel_binding="require"),
                         password=PASSWORD) as conn:
        assert upstream_ssl(conn) and conn.execute("SELECT current_user").fetchone() == ("scram_user",)


def test_both_legs_tls_scram_binding_to_a_different_certificate_fails(start_seat, certs):
    seat = start_seat(tls={"cert_file": certs["other_crt"], "key_file": certs["other_key"],
                           "upstream_sslmode": "require"})
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(seat.dsn(user="scram_user", sslmode="require", channel_binding="require"),
                        password=PASSWORD)
    # Without channel binding the same login works.
    with psycopg.connect(seat.dsn(user="md5_user", sslmode="require"), password=PASSWORD) as conn:
        assert conn.pgconn.ssl_in_use and upstream_ssl(conn)


@pytest.fixture(scope="module")
def plain_pg():
    cluster = DevCluster()
    cluster.start()
    yield cluster
    cluster.stop()


def test_upstream_without_tls(start_seat, plain_pg):
    strict = start_seat(upstream_port=plain_pg.port, tls={"upstream_sslmode": "require"})
    c = RawConn(strict.port)
    c.send(startup({"user": "postgres"}))
    fields = error_fields(c.read_all_until_closed()[-1][1])
    assert fields["C"] == "08006" and "does not support TLS" in fields["M"]
    lenient = start_seat(upstream_port=plain_pg.port, tls={"upstream_sslmode": "prefer"})
    with psycopg.connect(lenient.dsn()) as conn:
        assert not upstream_ssl(conn)
