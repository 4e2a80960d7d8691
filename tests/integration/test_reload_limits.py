"""SIGHUP reloads the configuration and artifacts; max_client_conn and client_idle_timeout.

Reload: the config file is re-read and checked (TOML, validation, TLS files, the host
database's schema against the re-read artifacts) in a task; only when everything checks out
is it swapped in, for new sessions. Live sessions keep the config they started under.
proxy.listen, metrics.listen and log.format need a restart: logged and kept.

client_idle_timeout behaves like PostgreSQL's idle_session_timeout: it closes a session
that is idle outside a transaction (57P05); sessions idle inside a transaction, or waiting
for a statement's result, are left alone.
"""

from __future__ import annotations

import signal
import time
import urllib.request

import psycopg
import pytest
from rawpg import RawConn, error_fields, query, startup

from harness import render_config
from proxy.dev.devcluster import free_port


def write_config(seat, pg, proxy: dict | None = None, listen: str | None = None, text: str | None = None,
                 tls: dict | None = None) -> None:
    """Rewrite the seat's config file with the same listen/upstream/metrics/host sections plus `proxy`."""
    if text is None:
        sections = {
            "proxy": {"listen": listen or f"127.0.0.1:{seat.port}", "upstream": f"127.0.0.1:{pg.port}",
                      "shutdown_timeout": 5, **(proxy or {})},
            "metrics": {"listen": f"127.0.0.1:{seat.metrics_port}"},
            "host": {"dsn": pg.dsn()},
        }
        if tls:
            sections["tls"] = tls
        text = render_config(sections)
    seat.config_path.write_text(text)


def sighup(seat, expect: str, timeout: float = 15) -> str:
    """Send SIGHUP and wait for the reload's outcome line; returns the log written since."""
    before = len(seat.log())
    seat.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = seat.log()[before:]
        if "reloaded" in new or "reload rejected" in new:
            assert expect in new, new
            return new
        time.sleep(0.05)
    raise AssertionError(f"no reload outcome logged: {seat.log()[before:]}")


def major(conn) -> int | None:
    return conn.execute("SELECT openwop_seat.session_major()").fetchone()[0]


def test_reload_applies_client_rules_to_new_sessions_only(start_seat, pg):
    seat = start_seat()
    old = psycopg.connect(seat.dsn(application_name="reload-app"), autocommit=True)
    assert major(old) == 2
    write_config(seat, pg, {"clients": [{"application_name": "reload-app", "major": 1}]})
    out = sighup(seat, "reloaded")
    assert "changed=proxy.clients" in out
    assert old.execute("SELECT 41 + 1").fetchone() == (42,) and major(old) == 2  # untouched
    with psycopg.connect(seat.dsn(application_name="reload-app"), autocommit=True) as new:
        assert major(new) == 1
    with psycopg.connect(seat.dsn(application_name="other"), autocommit=True) as other:
        assert major(other) == 2
    assert "application_name=reload-app major=1" in seat.log()
    old.close()
    # A reload with nothing changed says so.
    assert "changed=nothing" in sighup(seat, "reloaded")
    assert seat.alive()


@pytest.mark.parametrize("broken, reason", [
    ("bad toml", "invalid TOML"),
    ("unknown key", "unknown key proxy.bogus"),
    ("bad value", "proxy.max_client_conn: expected an integer >= 1, got 0"),
])
def test_reload_rejects_an_invalid_config_and_keeps_the_old(start_seat, pg, broken, reason):
    seat = start_seat(proxy={"clients": [{"application_name": "keep", "major": 1}]})
    live = psycopg.connect(seat.dsn(), autocommit=True)
    if broken == "bad toml":
        write_config(seat, pg, text="[proxy\nlisten = ")
    elif broken == "unknown key":
        write_config(seat, pg, {"bogus": 1})
    else:
        write_config(seat, pg, {"max_client_conn": 0})
    out = sighup(seat, "reload rejected")
    assert reason in out
    assert "reloaded" not in out
    assert seat.alive() and live.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(seat.dsn(application_name="keep"), autocommit=True) as new:
        assert major(new) == 1  # the old rule is still in force
    # Once fixed, the next SIGHUP applies it.
    write_config(seat, pg, {})
    sighup(seat, "reloaded")
    with psycopg.connect(seat.dsn(application_name="keep"), autocommit=True) as new:
        assert major(new) == 2
    live.close()


def test_reload_of_a_listen_change_needs_a_restart(start_seat, pg):
    seat = start_seat()
    other_port = free_port()
    write_config(seat, pg, {"clients": [{"application_name": "after", "major": 1}]},
                 listen=f"127.0.0.1:{other_port}")
    out = sighup(seat, "reloaded")
    assert "needs a restart: proxy.listen" in out
    assert "proxy.listen" not in out.split("reloaded", 1)[1].splitlines()[0]  # not among the applied keys
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"host=127.0.0.1 port={other_port} user=postgres dbname=postgres connect_timeout=2")
    with psycopg.connect(seat.dsn(application_name="after"), autocommit=True) as conn:  # the rest applies
        assert major(conn) == 1


def test_reload_refuses_artifacts_that_do_not_match_the_database(start_seat, pg):
    seat = start_seat()
    recorded = pg.psql("SELECT value FROM openwop_seat.meta WHERE key = 'artifact_digest'").strip()
    write_config(seat, pg, {"clients": [{"application_name": "never", "major": 1}]})
    pg.psql("UPDATE openwop_seat.meta SET value = repeat('0', 64) WHERE key = 'artifact_digest'")
    try:
        out = sighup(seat, "reload rejected")
    finally:
        pg.psql(f"UPDATE openwop_seat.meta SET value = '{recorded}' WHERE key = 'artifact_digest'")
    assert "digest" in out
    with psycopg.connect(seat.dsn(application_name="never"), autocommit=True) as conn:
        assert major(conn) == 2  # nothing was swapped
    assert "changed=proxy.clients" in sighup(seat, "reloaded")  # the database matches again


def test_reload_swaps_the_client_certificate_for_new_sessions(start_seat, pg, certs):
    seat = start_seat(tls={"cert_file": certs["server_crt"], "key_file": certs["server_key"]})

    def tls_dsn(root: str) -> str:
        return seat.dsn(sslmode="verify-full", sslrootcert=root).replace("host=127.0.0.1", "host=localhost")

    live = psycopg.connect(tls_dsn(certs["server_crt"]), autocommit=True)
    write_config(seat, pg, tls={"cert_file": certs["other_crt"], "key_file": certs["other_key"]})
    assert "changed=tls.cert_file,tls.key_file" in sighup(seat, "reloaded")
    with psycopg.connect(tls_dsn(certs["other_crt"])) as conn:
        assert conn.pgconn.ssl_in_use and conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(tls_dsn(certs["server_crt"]))
    assert live.execute("SELECT 2").fetchone() == (2,)  # the live session keeps its TLS connection
    live.close()
    # A key that does not belong to the certificate is refused; the running certificate stays.
    write_config(seat, pg, tls={"cert_file": certs["server_crt"], "key_file": certs["other_key"]})
    assert "tls:" in sighup(seat, "reload rejected")
    with psycopg.connect(tls_dsn(certs["other_crt"])) as conn:
        assert conn.execute("SELECT 3").fetchone() == (3,)


def refusal(port: int) -> dict[str, str]:
    raw = RawConn(port)
    raw.send(startup({"user": "postgres", "database": "postgres"}))
    messages = raw.read_all_until_closed()
    raw.close()
    assert [t for t, _ in messages] == [b"E"], messages
    return error_fields(messages[0][1])


def metric(seat, name: str) -> str:
    body = urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=5).read().decode()
    return "\n".join(line for line in body.splitlines() if line.startswith(name))


def test_max_client_conn_refuses_the_connection_beyond_it(start_seat):
    seat = start_seat(proxy={"max_client_conn": 3})
    conns = [psycopg.connect(seat.dsn(), autocommit=True) for _ in range(3)]
    fields = refusal(seat.port)
    assert fields["S"] == "FATAL" and fields["C"] == "53300"
    assert fields["M"] == "too many client connections (max_client_conn 3)"
    with pytest.raises(psycopg.OperationalError, match="too many client connections"):
        psycopg.connect(seat.dsn())
    for i, conn in enumerate(conns):  # the others keep working
        assert conn.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    conns.pop().close()
    deadline = time.monotonic() + 5
    while True:  # the seat notices the close asynchronously
        try:
            conns.append(psycopg.connect(seat.dsn(), autocommit=True))
            break
        except psycopg.OperationalError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert conns[-1].execute("SELECT 1").fetchone() == (1,)
    assert 'sqlstate="53300"} 2.0' in metric(seat, "openwop_seat_session_errors")
    assert "connection refused: too many client connections" in seat.log()
    for conn in conns:
        conn.close()


def test_max_client_conn_reload_applies_to_new_connections(start_seat, pg):
    seat = start_seat()
    conns = [psycopg.connect(seat.dsn(), autocommit=True) for _ in range(2)]
    write_config(seat, pg, {"max_client_conn": 2})
    assert "proxy.max_client_conn" in sighup(seat, "reloaded")
    assert refusal(seat.port)["C"] == "53300"
    assert all(c.execute("SELECT 1").fetchone() == (1,) for c in conns)
    for conn in conns:
        conn.close()


def test_client_idle_timeout(start_seat):
    seat = start_seat(proxy={"client_idle_timeout": 1})
    # Idle outside a transaction: closed with 57P05.
    idle = RawConn(seat.port)
    idle.login()
    idle.send(query("SELECT 1"))
    idle.read_until(b"Z")
    started = time.monotonic()
    messages = idle.read_all_until_closed(timeout=10)
    assert 0.9 <= time.monotonic() - started < 5
    assert [t for t, _ in messages] == [b"E"]
    fields = error_fields(messages[0][1])
    assert (fields["S"], fields["C"]) == ("FATAL", "57P05")
    assert fields["M"] == "terminating connection due to idle-session timeout"
    idle.close()

    in_txn = psycopg.connect(seat.dsn())  # not autocommit: the SELECT opens a transaction
    assert in_txn.execute("SELECT 1").fetchone() == (1,)
    busy = psycopg.connect(seat.dsn(), autocommit=True)
    assert busy.execute("SELECT pg_sleep(2.5)").fetchone() is not None  # a statement longer than the timeout
    time.sleep(0.5)  # in_txn has now been idle in its transaction for about 3 s
    assert busy.execute("SELECT 2").fetchone() == (2,)  # and busy has been idle for less than 1 s
    assert in_txn.execute("SELECT 3").fetchone() == (3,)
    in_txn.commit()
    time.sleep(2)  # now in_txn is idle outside a transaction, as is busy
    for conn in (in_txn, busy):
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 4")
        conn.close()
    assert "reason=client_idle_timeout" in seat.log()
    assert 'sqlstate="57P05"} 3.0' in metric(seat, "openwop_seat_session_errors")
