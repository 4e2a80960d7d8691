"""Real drivers over TLS on either leg of the seat: psql, psycopg, asyncpg and node-postgres.

Four seats: TLS to clients only (the database's own certificate), TLS to the
upstream only, TLS on both legs with the database's certificate, and TLS on
both legs with an unrelated certificate. For each driver the test checks what
the driver itself reports about its connection (libpq's \\conninfo and
ssl_in_use, the asyncio transport's SSL object, node's TLSSocket) and, for the
upstream leg, what the server reports in pg_stat_ssl; trust, md5 and SCRAM
roles log in over each. `tls_only` may log in over hostssl only, so its login
succeeding proves the upstream leg is encrypted.

SCRAM channel binding (SCRAM-SHA-256-PLUS) binds to the certificate the
client saw, so through the relay it can work only when the seat presents the
database's own certificate; with the other certificate, logins use md5 or
SCRAM without binding, and binding is shown to fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
from pathlib import Path

import asyncpg
import psycopg
import pytest

from harness import PASSWORD

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
NODE = shutil.which("node")
def needs_node(test):
    """node and node-postgres are required (conftest checks them once for the whole run)."""
    return test

PASSWORDS = {"host_user": None, "tls_only": None, "md5_user": PASSWORD, "scram_user": PASSWORD}
CLIENT_USERS = ["host_user", "md5_user", "scram_user"]
UPSTREAM_USERS = ["tls_only", "md5_user", "scram_user"]
QUERY = "SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


@pytest.fixture(scope="module")
def client_tls(start_seat, certs):
    """TLS to clients with the database's certificate; plaintext to the upstream."""
    return start_seat(tls={"cert_file": certs["server_crt"], "key_file": certs["server_key"]})


@pytest.fixture(scope="module")
def upstream_tls(start_seat, certs):
    """Plaintext to clients; verified TLS to the upstream."""
    return start_seat(tls={"upstream_sslmode": "verify-full", "upstream_ca_file": certs["server_crt"]})


@pytest.fixture(scope="module")
def both_tls(start_seat, certs):
    """TLS on both legs; the seat presents the database's own certificate."""
    return start_seat(tls={"cert_file": certs["server_crt"], "key_file": certs["server_key"],
                           "upstream_sslmode": "require"})


@pytest.fixture(scope="module")
def both_tls_other_cert(start_seat, certs):
    """TLS on both legs; the seat presents a certificate unrelated to the database's."""
    return start_seat(tls={"cert_file": certs["other_crt"], "key_file": certs["other_key"],
                           "upstream_sslmode": "require"})


# -- psql

def psql(dsn: str, user: str, password: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSSL") and k != "PGPASSWORD"}
    env["PGCONNECT_TIMEOUT"] = "10"
    if password:
        env["PGPASSWORD"] = password
    out = subprocess.run(["psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", "\\conninfo", "-c", QUERY],
                         capture_output=True, text=True, env=env, timeout=60)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def localhost(dsn: str) -> str:
    """The dsn with host=localhost, the name verify-full checks the certificate against."""
    return dsn.replace("host=127.0.0.1", "host=localhost")


@pytest.mark.parametrize("user", CLIENT_USERS)
def test_psql_client_leg_tls(client_tls, certs, user):
    out = psql(localhost(client_tls.dsn(user=user, sslmode="verify-full", sslrootcert=certs["server_crt"])),
               user, PASSWORDS[user])
    info, row = out.stdout.splitlines()[:-1], out.stdout.splitlines()[-1]
    assert any(line.startswith("SSL connection (protocol: TLSv1.3") for line in info), out.stdout
    assert row == f"{user}|f"  # the upstream leg is plaintext


@pytest.mark.parametrize("user", UPSTREAM_USERS)
def test_psql_upstream_leg_tls(upstream_tls, user):
    # libpq's default sslmode=prefer: the seat declines the SSLRequest and the session goes on in plaintext
    out = psql(upstream_tls.dsn(user=user), user, PASSWORDS[user])
    assert "SSL connection" not in out.stdout and out.stdout.startswith("You are connected"), out.stdout
    assert out.stdout.splitlines()[-1] == f"{user}|t"


@pytest.mark.parametrize("user, params", [
    ("tls_only", {}), ("md5_user", {}), ("scram_user", {"channel_binding": "require"})])
def test_psql_both_legs_tls(both_tls, certs, user, params):
    out = psql(localhost(both_tls.dsn(user=user, sslmode="verify-full", sslrootcert=certs["server_crt"], **params)),
               user, PASSWORDS[user])
    assert "SSL connection (protocol: TLSv1.3" in out.stdout
    assert out.stdout.splitlines()[-1] == f"{user}|t"


def test_psql_both_legs_tls_other_certificate(both_tls_other_cert, certs):
    seat = both_tls_other_cert
    # verify-full against the other certificate, then logins without channel binding
    for user, params in [("tls_only", {}), ("md5_user", {}), ("scram_user", {"channel_binding": "disable"})]:
        out = psql(localhost(seat.dsn(user=user, sslmode="verify-full", sslrootcert=certs["other_crt"], **params)),
                   user, PASSWORDS[user])
        assert "SSL connection (protocol: TLSv1.3" in out.stdout and out.stdout.splitlines()[-1] == f"{user}|t"
    # libpq's default channel_binding=prefer picks SCRAM-SHA-256-PLUS, bound to the certificate it saw
    out = psql(seat.dsn(user="scram_user", sslmode="require"), "scram_user", PASSWORD, check=False)
    assert out.returncode != 0 and "SCRAM channel binding check failed" in out.stderr, out.stderr


# -- psycopg (libpq)

@pytest.mark.parametrize("user", CLIENT_USERS)
def test_psycopg_client_leg_tls(client_tls, certs, user):
    dsn = localhost(client_tls.dsn(user=user, sslmode="verify-full", sslrootcert=certs["server_crt"]))
    with psycopg.connect(dsn, password=PASSWORDS[user]) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute(QUERY).fetchone() == (user, False)


@pytest.mark.parametrize("user", UPSTREAM_USERS)
def test_psycopg_upstream_leg_tls(upstream_tls, user):
    with psycopg.connect(upstream_tls.dsn(user=user), password=PASSWORDS[user]) as conn:
        assert not conn.pgconn.ssl_in_use
        assert conn.execute(QUERY).fetchone() == (user, True)


# -- asyncpg

async def asyncpg_probe(port: int, user: str, ssl_arg, host: str = "127.0.0.1") -> dict:
    conn = await asyncpg.connect(host=host, port=port, user=user, password=PASSWORDS[user], database="postgres",
                                 ssl=ssl_arg, timeout=10)
    try:
        tls = conn._transport.get_extra_info("ssl_object")
        cert = tls.getpeercert() if tls else None  # {} when the certificate was not verified
        row = await conn.fetchrow(QUERY)
        return {"tls": tls.version() if tls else None,
                "peer": dict(x[0] for x in cert["subject"])["commonName"] if cert else None,
                "user": row[0], "upstream_ssl": row[1]}
    finally:
        await conn.close()


def verifying(certs, name: str = "server") -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certs[f"{name}_crt"])


@pytest.mark.parametrize("user", CLIENT_USERS)
def test_asyncpg_client_leg_tls(client_tls, certs, user):
    # a verifying context, hostname included
    got = asyncio.run(asyncpg_probe(client_tls.port, user, verifying(certs), host="localhost"))
    assert got == {"tls": "TLSv1.3", "peer": "server", "user": user, "upstream_ssl": False}
    # ssl='require': encrypted, nothing verified
    got = asyncio.run(asyncpg_probe(client_tls.port, user, "require"))
    assert got == {"tls": "TLSv1.3", "peer": None, "user": user, "upstream_ssl": False}


@pytest.mark.parametrize("user", UPSTREAM_USERS)
def test_asyncpg_upstream_leg_tls(upstream_tls, user):
    # asyncpg's default ssl='prefer': the seat declines, the session goes on in plaintext
    got = asyncio.run(asyncpg_probe(upstream_tls.port, user, "prefer"))
    assert got == {"tls": None, "peer": None, "user": user, "upstream_ssl": True}


@pytest.mark.parametrize("user", UPSTREAM_USERS)
def test_asyncpg_both_legs_tls(both_tls, certs, user):
    # asyncpg does not implement SCRAM-SHA-256-PLUS: it answers the PLUS offer with plain SCRAM
    got = asyncio.run(asyncpg_probe(both_tls.port, user, verifying(certs), host="localhost"))
    assert got == {"tls": "TLSv1.3", "peer": "server", "user": user, "upstream_ssl": True}


@pytest.mark.parametrize("user", UPSTREAM_USERS)
def test_asyncpg_both_legs_tls_other_certificate(both_tls_other_cert, certs, user):
    got = asyncio.run(asyncpg_probe(both_tls_other_cert.port, user, verifying(certs, "other"), host="localhost"))
    assert got == {"tls": "TLSv1.3", "peer": "other", "user": user, "upstream_ssl": True}


# -- node-postgres

def node_tls(port: int, user: str, ssl_opts: dict | None = None, channel_binding: bool = False,
             check: bool = True) -> dict | subprocess.CompletedProcess:
    """Run the `tls` scenario of tests/node/scenarios.js against a port; its JSON, or the process if not check."""
    password = PASSWORDS[user]
    url = f"postgresql://{user}{':' + password if password else ''}@127.0.0.1:{port}/postgres"
    env = {**os.environ, "PG_CHANNEL_BINDING": "1" if channel_binding else "0"}
    env.pop("PG_SSL", None)
    if ssl_opts is not None:
        env["PG_SSL"] = json.dumps(ssl_opts)
    proc = subprocess.run([NODE, "scenarios.js", "tls", url], cwd=NODE_DIR, capture_output=True, text=True,
                          env=env, timeout=60)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def node_auth(user: str, offered: list[str] | None, chosen: str | None = None) -> dict:
    if user == "md5_user":
        return {"offered": None, "chosen": "md5"}
    if user == "scram_user":
        return {"offered": offered, "chosen": chosen or "SCRAM-SHA-256"}
    return {"offered": None, "chosen": None}


TLS_CLIENT = {"encrypted": True, "protocol": "TLSv1.3"}
PLAIN_CLIENT = {"encrypted": False, "protocol": None, "authorized": None, "peerCN": None}
ROUND_TRIP = [{"echo": "over tls \u2713"}]


@needs_node
@pytest.mark.parametrize("user, binding", [(u, False) for u in CLIENT_USERS] + [("scram_user", True)])
def test_node_client_leg_tls(client_tls, certs, user, binding):
    got = node_tls(client_tls.port, user, {"caFile": certs["server_crt"]}, channel_binding=binding)
    # the upstream leg is plaintext, so the server offers no -PLUS mechanism, even to a binding-capable client
    assert got == {**TLS_CLIENT, "authorized": True, "peerCN": "server", "user": user, "upstreamSsl": False,
                   "upstreamVersion": None, "auth": node_auth(user, ["SCRAM-SHA-256"]), "roundTrip": ROUND_TRIP}


@needs_node
@pytest.mark.parametrize("user", UPSTREAM_USERS)
def test_node_upstream_leg_tls(upstream_tls, user):
    got = node_tls(upstream_tls.port, user)
    # the server offers SCRAM-SHA-256-PLUS on its TLS leg; the seat strips it for this plaintext client
    assert got == {**PLAIN_CLIENT, "user": user, "upstreamSsl": True, "upstreamVersion": "TLSv1.3",
                   "auth": node_auth(user, ["SCRAM-SHA-256"]), "roundTrip": ROUND_TRIP}


@needs_node
def test_node_channel_binding_client_on_plaintext_leg_with_tls_upstream(upstream_tls, pg):
    """A known limitation, pinned: node-postgres with enableChannelBinding on a plaintext socket.

    node-postgres answers a SCRAM-SHA-256-only offer with the gs2 header 'y'
    ("I could bind, I believe you cannot"). Directly against the database on
    plaintext that is accepted; through a seat whose upstream leg is TLS the
    server did offer -PLUS (the seat stripped it), so it takes 'y' for a
    downgrade and refuses the login. The header is covered by the client's
    proof, so the seat cannot rewrite it.
    """
    direct = node_tls(pg.port, "scram_user", channel_binding=True)
    assert direct["auth"] == {"offered": ["SCRAM-SHA-256"], "chosen": "SCRAM-SHA-256"}
    assert direct["upstreamSsl"] is False
    proc = node_tls(upstream_tls.port, "scram_user", channel_binding=True, check=False)
    assert proc.returncode != 0
    assert "SCRAM channel binding negotiation error" in proc.stderr and "sqlstate 28000" in proc.stderr, proc.stderr


@needs_node
@pytest.mark.parametrize("user, binding", [("tls_only", False), ("md5_user", False), ("scram_user", True)])
def test_node_both_legs_tls(both_tls, certs, user, binding):
    got = node_tls(both_tls.port, user, {"caFile": certs["server_crt"]}, channel_binding=binding)
    # the seat presents the database's certificate, so SCRAM-SHA-256-PLUS verifies end to end
    assert got == {**TLS_CLIENT, "authorized": True, "peerCN": "server", "user": user, "upstreamSsl": True,
                   "upstreamVersion": "TLSv1.3",
                   "auth": node_auth(user, ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"], "SCRAM-SHA-256-PLUS"),
                   "roundTrip": ROUND_TRIP}


@needs_node
def test_node_both_legs_tls_other_certificate(both_tls_other_cert, certs):
    seat = both_tls_other_cert
    for user in UPSTREAM_USERS:
        got = node_tls(seat.port, user, {"rejectUnauthorized": False})
        assert got == {**TLS_CLIENT, "authorized": False, "peerCN": "other", "user": user, "upstreamSsl": True,
                       "upstreamVersion": "TLSv1.3",
                       "auth": node_auth(user, ["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]), "roundTrip": ROUND_TRIP}
    # verified against the other certificate's CA (by IP, which its subjectAltName lists)
    got = node_tls(seat.port, "md5_user", {"caFile": certs["other_crt"]})
    assert got["authorized"] is True and got["peerCN"] == "other" and got["upstreamSsl"] is True
    # and refused against the database's
    proc = node_tls(seat.port, "md5_user", {"caFile": certs["server_crt"]}, check=False)
    assert proc.returncode != 0 and "self-signed certificate" in proc.stderr, proc.stderr
    # binding to the certificate node saw (the other one) cannot match what the database checks
    proc = node_tls(seat.port, "scram_user", {"rejectUnauthorized": False}, channel_binding=True, check=False)
    assert proc.returncode != 0 and "SCRAM channel binding check failed" in proc.stderr, proc.stderr
