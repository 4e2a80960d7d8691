"""The admin console ([admin]): psql and raw protocol against a real seat; SHOW commands, refusals.
PgBouncer's commands (PAUSE, KILL, RELOAD, SHOW CLIENTS, …) and the login: test_admin_console.py."""

from __future__ import annotations

import socket
import struct

import psycopg
from test_psql import psql

from proxy.dev.devcluster import free_port
from proxy.serve.admin import scram_secret
from proxy.wire import messages

PW = "admin-pw"


def _seat(start_seat, tmp_path, **proxy):
    port = free_port()
    sock_dir = tmp_path / "admin"
    sock_dir.mkdir()
    (tmp_path / "users.txt").write_text(f'"ops" "{scram_secret(PW)}"\n')
    seat = start_seat(proxy=proxy or None, extra={"admin": {
        "listen": f"127.0.0.1:{port}", "unix_socket": str(sock_dir / ".s.PGSQL.6434"), "users": ["ops"],
        "auth_file": str(tmp_path / "users.txt")}})
    return seat, port, sock_dir


def ask(dsn: str, *args: str, check: bool = True):
    return psql(dsn, *args, password=PW, check=check)


def rows(text: str) -> list[list[str]]:
    return [line.split("|") for line in text.splitlines()]


def test_show_commands_through_psql(start_seat, pg, tmp_path):
    seat, port, sock_dir = _seat(start_seat, tmp_path)
    admin = f"host=127.0.0.1 port={port} user=ops dbname=openwop_seat"
    with psycopg.connect(seat.dsn(application_name="watched")) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # psycopg: now in a transaction
        out = rows(ask(admin, "-c", "SHOW SESSIONS").stdout)
        (mine,) = [r for r in out if r[4] == "watched"]
        assert mine[2:6] == ["postgres", "postgres", "watched", "2"]
        assert mine[6] == str(pid) and mine[7] == "in transaction" and mine[8] == "f"
        assert int(mine[9]) > 0 and int(mine[10]) > 0 and mine[11].endswith("+00:00") and "T" in mine[11]
        assert mine[1].startswith("127.0.0.1:")
        conn.commit()
        (mine,) = [r for r in rows(ask(admin, "-c", "SHOW SESSIONS").stdout) if r[4] == "watched"]
        assert mine[7] == "idle"
        conn.execute("SELECT type FROM events WHERE false").fetchall()
        caches = rows(ask(admin, "-c", "SHOW CACHES").stdout)
        plan = {r[1]: r for r in caches if r[0] == "plan"}
        assert set(plan) == {"1", "2"} and int(plan["2"][2]) >= 1 and int(plan["2"][4]) == 32 << 20
        assert caches[-1][0] == "prepared_statements"
    state = dict(rows(ask(admin, "-c", "SHOW STATE").stdout))
    assert state["writer_rule"].startswith("in force") and state["claim_secret"].startswith("present")
    assert state["read_context"].startswith("loaded: database postgres") and state["accepting"] == "yes"
    assert ask(admin, "-c", "SHOW CLAIMS").stdout == ask(admin, "-c", "show state;").stdout
    (version,) = rows(ask(admin, "-c", "SHOW VERSION").stdout)
    assert version[0] and len(version[2]) == 64
    config = dict(rows(ask(admin, "-c", "SHOW CONFIG").stdout))
    assert config["proxy.listen"] == f"127.0.0.1:{seat.port}" and config["admin.listen"] == f"127.0.0.1:{port}"
    assert config["metrics.database_user_labels"] == "100"
    helps = [r[0] for r in rows(ask(admin, "-c", "SHOW HELP").stdout)]
    assert {"SHOW SESSIONS", "SHOW CACHES", "SHOW STATE", "SHOW CLAIMS", "SHOW VERSION", "SHOW CONFIG",
            "SHOW HELP", "SHOW CLIENTS", "PAUSE"} <= set(helps)
    # over the Unix socket, named as libpq looks for it
    out = ask(f"host={sock_dir} port=6434 user=ops dbname=x", "-c", "SHOW VERSION")
    assert rows(out.stdout) == [version]
    assert oct((sock_dir / ".s.PGSQL.6434").stat().st_mode & 0o777) == "0o700"
    # an unknown command is an error; the console stays usable
    bad = ask(admin, "-c", "SELECT 1", check=False)
    assert bad.returncode != 0 and "unknown admin command" in bad.stderr


def test_secrets_are_redacted(start_seat, pg, tmp_path):
    from proxy.serve.admin import redact

    assert redact("host.dsn", "host=db user=u password=hunter2 dbname=x") == \
        "host=db user=u password=<redacted> dbname=x"
    assert redact("host.dsn", "host=db password='a b\\' c' dbname=x") == "host=db password=<redacted> dbname=x"
    assert redact("host.dsn", "postgresql://u:hunter2@db:5432/x") == "postgresql://u:<redacted>@db:5432/x"
    assert redact("proxy.listen", "password=x") == "password=x"


def _raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    s.sendall(messages.startup_message({"user": "ops", "database": "x"}))
    return s


def _read_until(s: socket.socket, last: bytes) -> list[tuple[bytes, bytes]]:
    data, out = b"", []
    while True:
        while len(data) < 5 or len(data) < 1 + struct.unpack("!i", data[1:5])[0]:
            chunk = s.recv(65536)
            if not chunk:
                return out
            data += chunk
        n = 1 + struct.unpack("!i", data[1:5])[0]
        out.append((data[:1], data[5:n]))
        data = data[n:]
        if out[-1][0] == last:
            return out


def test_raw_protocol(start_seat, tmp_path):
    # admin.auth = "trust": a console on a Unix socket alone (mode 0700), no password
    path = str(tmp_path / ".s.PGSQL.6434")
    start_seat(extra={"admin": {"unix_socket": path, "auth": "trust"}})
    with _raw(path) as s:
        startup = _read_until(s, b"Z")
        assert startup[0] == (b"R", b"\x00\x00\x00\x00")  # AuthenticationOk, no password
        assert {t for t, _ in startup} == {b"R", b"S", b"Z"}
        s.sendall(messages.query("SHOW VERSION; SHOW HELP"))
        reply = _read_until(s, b"Z")
        assert [t for t, _ in reply].count(b"T") == 2 and [t for t, _ in reply].count(b"C") == 2
        s.sendall(messages.query(""))
        assert [t for t, _ in _read_until(s, b"Z")] == [b"I", b"Z"]
        s.sendall(messages.query("SHOW NOTHING"))
        reply = _read_until(s, b"Z")
        assert reply[0][0] == b"E" and b"42601" in reply[0][1]
        # the extended protocol is refused: FATAL, and the connection ends
        s.sendall(messages.message(b"P", b"\x00SHOW HELP\x00\x00\x00") + messages.message(b"S"))
        reply = _read_until(s, b"never")
        assert reply[0][0] == b"E" and b"FATAL" in reply[0][1] and b"0A000" in reply[0][1]
        assert s.recv(1) == b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:  # SSLRequest: answered N
        s.settimeout(10)
        s.connect(path)
        s.sendall(messages.ssl_request())
        assert s.recv(1) == b"N"
