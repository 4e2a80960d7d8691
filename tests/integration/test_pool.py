"""Pooled server connections ([pool], ADR 0016), against the real cluster with psycopg.

A client's backend is kept after it leaves, reset (DISCARD ALL and the claim's check) and handed to the next client
of the same pool, who proves its password to the seat (SCRAM-SHA-256 against pool.auth_file). Each test names the
backend by ``pg_backend_pid()`` (what the client sees as its pid is a seat-issued one) and waits for the pool's
state on /metrics: a reset runs after the client left, so the next client must not race it.

Users: ``scram_user`` (the conftest's, SCRAM at the server too) and ``pool_b`` (made here, SCRAM at the server
through a pg_hba line added before the cluster's trust line).
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
import urllib.request
import uuid

import psycopg
import pytest
import scram_client

from harness import PASSWORD
from proxy.dev.devcluster import free_port
from proxy.serve.scram import scram_secret

OTHER = "pool_b"
OTHER_PW = "pool-b-pw"
V1_APP = "v1-host"
ADMIN_PW = "admin-pw"


@pytest.fixture(scope="module")
def verifiers(pg) -> dict[str, str]:
    pg.psql(f"""
        DO $$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{OTHER}') THEN CREATE ROLE {OTHER} LOGIN; END IF;
        END $$;
        SET password_encryption = 'scram-sha-256';
        ALTER ROLE {OTHER} PASSWORD '{OTHER_PW}';
        GRANT ALL ON SCHEMA public TO {OTHER};
    """)
    hba = f"{pg.datadir}/pg_hba.conf"
    lines = open(hba).read().splitlines()
    line = f"host all {OTHER} 127.0.0.1/32 scram-sha-256"
    if line not in lines:
        lines.insert(lines.index("host all all 127.0.0.1/32 trust"), line)
        open(hba, "w").write("\n".join(lines) + "\n")
        pg.psql("SELECT pg_reload_conf()")
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        rows = conn.execute("SELECT rolname, rolpassword FROM pg_authid WHERE rolname IN ('scram_user', %s)",
                            (OTHER,)).fetchall()
    return dict(rows)


@pytest.fixture(scope="module")
def pooled(start_seat, verifiers, tmp_path_factory):
    d = tmp_path_factory.mktemp("pool")
    auth = d / "userlist.txt"
    auth.write_text("".join(f'"{u}" "{v}"\n' for u, v in verifiers.items()) + '"md5_user" "md5' + "0" * 32 + '"\n')
    (d / "admin.txt").write_text(f'"ops" "{scram_secret(ADMIN_PW)}"\n')
    admin_port = free_port()
    seat = start_seat(proxy={"clients": [{"application_name": V1_APP, "major": 1}]},
                      extra={"pool": {"enabled": True, "auth_file": str(auth), "server_idle_timeout": 600},
                             "admin": {"listen": f"127.0.0.1:{admin_port}", "users": ["ops"],
                                       "auth_file": str(d / "admin.txt")}})
    seat.admin_port = admin_port
    return seat


def userlist(tmp_path_factory, name: str, verifiers: dict[str, str]):
    """A pool.auth_file of the users' verifiers, in a directory of its own."""
    auth = tmp_path_factory.mktemp(name) / "userlist.txt"
    auth.write_text("".join(f'"{u}" "{v}"\n' for u, v in verifiers.items()))
    return auth


def connect(seat, user: str = "scram_user", password: str = PASSWORD, **params) -> psycopg.Connection:
    return psycopg.connect(seat.dsn(user=user, password=password, **params), autocommit=True)


def metrics(seat) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def pool_count(text: str, state: str, user: str = "scram_user", major: int = 2) -> int:
    m = re.search(r'^openwop_seat_pool_server_connections\{database="postgres",major="%d",state="%s",user="%s"\} '
                  r'(\S+)$' % (major, state, user), text, re.M)
    return int(float(m.group(1))) if m else 0


def counter(text: str, name: str, result: str | None = None) -> int:
    label = f'{{result="{result}"}}' if result else ""
    m = re.search(rf"^{name}_total{re.escape(label)} (\S+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


def wait_for(seat, check, what: str):
    """Poll /metrics until ``check(text)`` holds (a reset runs after the client left); fails after 20 s."""
    deadline = time.monotonic() + 20
    while True:
        text = metrics(seat)
        if check(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"the pool never reached: {what}\n{text}")
        time.sleep(0.02)


def settle(seat, user: str = "scram_user", major: int = 2) -> str:
    """Wait until no connection of the pool is released (its reset owed), being reset or checked, and return
    /metrics."""
    busy = ("released", "reset", "check", "active")
    return wait_for(seat, lambda t: all(pool_count(t, s, user, major) == 0 for s in busy), "no reset in flight")


def quiet(seat) -> str:
    """Wait until no server connection of any pool is connecting, in use, released, being reset or checked."""
    busy = re.compile(r'^openwop_seat_pool_server_connections\{[^}]*state="(?:active|check|login|released|reset)"'
                      r'[^}]*\} ([1-9]\S*)$', re.M)
    return wait_for(seat, lambda t: busy.search(t) is None, "every pool quiet")


@pytest.fixture(autouse=True)
def quiet_before(request):
    """Each test starts with the pools quiet: a reset of the previous test's last client still in flight could end
    after the first client of this one left, and its backend would then be the most recently used."""
    for name in ("pooled", "small", "short_lived", "pooled_tls", "queried", "checked", "delayed", "released"):
        if name in request.fixturenames:
            quiet(request.getfixturevalue(name))


def backend(conn) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def leave(seat, conn, user: str = "scram_user", major: int = 2) -> None:
    conn.close()
    settle(seat, user, major)


def first_and_next(seat, setup, **params):
    """A first client runs ``setup`` and leaves; the next client is on the same backend. Returns (pid, next)."""
    with connect(seat, **params) as first:
        pid = backend(first)
        setup(first)
    settle(seat)
    nxt = connect(seat, **params)
    assert backend(nxt) == pid, "the next client was not handed the first one's backend"
    return pid, nxt


def test_the_next_client_gets_the_same_backend_still_claimed(pooled):
    with connect(pooled) as first:
        pid = backend(first)
        assert first.info.backend_pid != pid  # the client's pid (and cancel key) are the seat's, never the backend's
    text = settle(pooled)
    assert pool_count(text, "idle") >= 1
    before = counter(text, "openwop_seat_pool_hand_overs")
    with connect(pooled) as nxt:
        assert backend(nxt) == pid
        assert nxt.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 2  # the claim survived the reset
        assert nxt.execute("SELECT current_user").fetchone()[0] == "scram_user"
    assert counter(metrics(pooled), "openwop_seat_pool_hand_overs") == before + 1


def test_set_does_not_reach_the_next_client(pooled):
    _, nxt = first_and_next(pooled, lambda c: c.execute("SET work_mem = '7777kB'; SET search_path = pg_catalog"))
    with nxt:
        assert nxt.execute("SHOW work_mem").fetchone()[0] != "7777kB"
        assert nxt.execute("SHOW search_path").fetchone()[0] == '"$user", public'


def test_prepared_statements_do_not_reach_the_next_client(pooled):
    def setup(c):
        c.execute("PREPARE leftover AS SELECT 1")
        c.execute("SELECT %s::int", (1,), prepare=True)  # a protocol-level named statement (psycopg's _pg3_…)
        assert c.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] >= 2

    _, nxt = first_and_next(pooled, setup)
    with nxt:
        assert nxt.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            nxt.execute("EXECUTE leftover")


def test_temp_tables_do_not_reach_the_next_client(pooled):
    _, nxt = first_and_next(pooled, lambda c: c.execute("CREATE TEMP TABLE leftover_tt (x int)"))
    with nxt:
        assert nxt.execute("SELECT to_regclass('pg_temp.leftover_tt')").fetchone()[0] is None


def test_listen_does_not_reach_the_next_client(pooled):
    _, nxt = first_and_next(pooled, lambda c: c.execute("LISTEN leftover_channel"))
    with nxt:
        assert nxt.execute("SELECT count(*) FROM pg_listening_channels()").fetchone()[0] == 0


def test_session_advisory_locks_do_not_reach_the_next_client(pooled, pg):
    _, nxt = first_and_next(pooled, lambda c: c.execute("SELECT pg_advisory_lock(424242)"))
    with nxt:
        assert nxt.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
                           ).fetchone()[0] == 0
        with psycopg.connect(pg.dsn(), autocommit=True) as direct:
            assert direct.execute("SELECT pg_try_advisory_lock(424242)").fetchone()[0] is True


def test_the_read_paths_plan_once_names_do_not_reach_the_next_client(pooled):
    run = f"pool-{uuid.uuid4()}"

    def read(c):
        c.execute("SELECT type FROM events WHERE run_id = %s", (run,)).fetchall()

    def setup(c):
        read(c)
        assert c.execute("SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'openwop\\_seat\\_%'"
                         ).fetchone()[0] >= 1

    _, nxt = first_and_next(pooled, setup)
    with nxt:
        assert nxt.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
        read(nxt)  # the next client's read path starts empty and prepares its own names again
        read(nxt)


def test_a_held_cursor_does_not_reach_the_next_client(pooled):
    """A cursor WITH HOLD outlives the transaction that declared it: committed and left open, it would be the next
    client's to FETCH from."""
    def setup(c):
        with c.transaction():
            c.execute("DECLARE leftover_cursor CURSOR WITH HOLD FOR SELECT 'first'")
        assert c.execute("SELECT count(*) FROM pg_cursors WHERE name = 'leftover_cursor'").fetchone()[0] == 1

    _, nxt = first_and_next(pooled, setup)
    with nxt:
        assert nxt.execute("SELECT count(*) FROM pg_cursors").fetchone()[0] == 0
        with pytest.raises(psycopg.errors.InvalidCursorName):
            nxt.execute("FETCH leftover_cursor")


def test_a_sequences_currval_does_not_reach_the_next_client(pooled, pg):
    """currval and lastval belong to the session: after the first client's nextval, the next client's are not yet
    defined (55000), as in a new session. The sequence is a permanent one (a temporary one would go with DISCARD
    TEMP alone), made and dropped here."""
    pg.psql("CREATE SEQUENCE pool_leftover_seq; GRANT USAGE ON SEQUENCE pool_leftover_seq TO scram_user;")

    def setup(c):
        assert c.execute("SELECT nextval('pool_leftover_seq')").fetchone()[0] == 1
        assert c.execute("SELECT currval('pool_leftover_seq'), lastval()").fetchone() == (1, 1)

    try:
        _, nxt = first_and_next(pooled, setup)
        with nxt:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                               match='currval of sequence "pool_leftover_seq" is not yet defined in this session'):
                nxt.execute("SELECT currval('pool_leftover_seq')")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                               match="lastval is not yet defined in this session"):
                nxt.execute("SELECT lastval()")
    finally:
        pg.psql("DROP SEQUENCE pool_leftover_seq")


def test_set_role_and_session_characteristics_do_not_reach_the_next_client(pooled, pg):
    """SET ROLE to a role scram_user is a member of (none is: one is made and granted here, revoked and dropped
    after) and the session's default isolation level: the next client is scram_user again, at read committed."""
    role = "pool_leftover_role"
    pg.psql(f"CREATE ROLE {role} NOLOGIN; GRANT {role} TO scram_user;")

    def setup(c):
        c.execute(f"SET ROLE {role}")
        c.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        assert c.execute("SELECT current_user, current_setting('transaction_isolation')").fetchone() \
            == (role, "serializable")

    try:
        _, nxt = first_and_next(pooled, setup)
        with nxt:
            assert nxt.execute("SELECT current_user, session_user").fetchone() == ("scram_user", "scram_user")
            assert nxt.execute("SHOW transaction_isolation").fetchone()[0] == "read committed"
            assert nxt.execute("SHOW default_transaction_isolation").fetchone()[0] == "read committed"
    finally:
        pg.psql(f"REVOKE {role} FROM scram_user; DROP ROLE {role};")


def test_a_custom_setting_does_not_reach_the_next_client(pooled):
    """set_config of a placeholder (a setting no module defines) at session level. PostgreSQL 15 keeps a placeholder
    once a session defined it: DISCARD ALL resets it to its empty default, so current_setting('myapp.tenant', true)
    on the reset backend is '' (a backend that never saw it answers NULL). Not the first client's 'acme'."""
    _, nxt = first_and_next(pooled, lambda c: c.execute("SELECT set_config('myapp.tenant', 'acme', false)"))
    with nxt:
        assert nxt.execute("SELECT current_setting('myapp.tenant', true)").fetchone()[0] == ""


def test_temp_functions_do_not_reach_the_next_client(pooled):
    def setup(c):
        c.execute("CREATE FUNCTION pg_temp.leftover_f() RETURNS text LANGUAGE sql AS $$SELECT 'first'$$")
        assert c.execute("SELECT pg_temp.leftover_f()").fetchone()[0] == "first"

    _, nxt = first_and_next(pooled, setup)
    with nxt:
        assert nxt.execute("SELECT to_regprocedure('pg_temp.leftover_f()')").fetchone()[0] is None
        with pytest.raises(psycopg.errors.UndefinedFunction):
            nxt.execute("SELECT pg_temp.leftover_f()")


def test_a_client_of_another_user_never_gets_the_backend(pooled):
    with connect(pooled) as first:
        pid = backend(first)
    settle(pooled)
    with connect(pooled, user=OTHER, password=OTHER_PW) as other:
        assert backend(other) != pid
        assert other.execute("SELECT session_user").fetchone()[0] == OTHER
    settle(pooled, OTHER)
    with connect(pooled) as again:
        assert backend(again) == pid


def test_a_client_of_another_major_never_gets_the_backend(pooled):
    with connect(pooled) as first:
        pid = backend(first)
    settle(pooled)
    with connect(pooled, application_name=V1_APP) as v1:
        assert backend(v1) != pid
        assert v1.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 1
    settle(pooled, major=1)
    with connect(pooled) as v2:
        assert backend(v2) == pid
        assert v2.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 2


def test_the_seat_refuses_a_wrong_password_and_accepts_the_right_one(pooled):
    with connect(pooled) as first:
        pid = backend(first)
    text = settle(pooled)
    assert pool_count(text, "idle") >= 1
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(pooled, password="wrong")
    # the idle backend was not used by the refused client: the right password gets it
    with connect(pooled) as right:
        assert backend(right) == pid


def test_a_user_without_a_scram_verifier_is_not_pooled(pooled):
    """md5_user's line is an md5 hash: its sessions are relayed as without a pool, their backends not kept."""
    with connect(pooled, user="md5_user") as first:
        pid = backend(first)
    with connect(pooled, user="md5_user") as second:
        assert backend(second) != pid
    assert pool_count(metrics(pooled), "idle", "md5_user") == 0


def _read_message(sock) -> tuple[bytes, bytes]:
    def exact(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the seat closed the connection"
            data += chunk
        return data

    head = exact(5)
    return head[:1], exact(int.from_bytes(head[1:], "big") - 4)


def seat_login(seat) -> socket.socket:
    """A raw client of ``scram_user`` whose startup packet the seat answered with AuthenticationSASL: a pooled
    backend is taken for it, and the test goes on with the SCRAM exchange, or leaves, message by message."""
    params = b"user\x00scram_user\x00database\x00postgres\x00\x00"
    raw = socket.create_connection(("127.0.0.1", seat.port))
    raw.sendall(struct.pack("!iI", 8 + len(params), 3 << 16) + params)
    kind, body = _read_message(raw)
    assert kind == b"R" and body[:4] == struct.pack("!I", 10), (kind, body)
    return raw


def test_a_backend_whose_claim_was_deleted_while_idle_is_ended_and_not_handed_out(pooled, pg):
    """The claims triggers end the backend (test_claim_lost.py); the pool closes it when its FATAL arrives, before
    any client could be handed it, and the next client gets a new backend, claimed."""
    with connect(pooled) as first:
        pid = backend(first)
    text = settle(pooled)
    idle = pool_count(text, "idle")
    lost = counter(text, "openwop_seat_pool_checks", "claim lost")
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:
        assert direct.execute("DELETE FROM openwop_seat.claims WHERE pid = %s", (pid,)).rowcount == 1
    gone(pg, pid)
    wait_for(pooled, lambda t: pool_count(t, "idle") == idle - 1, "the ended backend closed")
    with connect(pooled) as nxt:
        assert backend(nxt) != pid
        assert nxt.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 2
    assert counter(metrics(pooled), "openwop_seat_pool_checks", "claim lost") == lost  # no check needed


def test_a_backend_reset_a_moment_ago_is_handed_over_unchecked(pooled):
    """pool.server_check_delay (30 s by default): the reset checked the claim, the hand-over does not again."""
    with connect(pooled) as first:
        pid = backend(first)
    text = settle(pooled)
    skipped, ok = counter(text, "openwop_seat_pool_checks", "skipped"), counter(text, "openwop_seat_pool_checks", "ok")
    with connect(pooled) as nxt:
        assert backend(nxt) == pid
        assert nxt.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 2
    text = metrics(pooled)
    assert counter(text, "openwop_seat_pool_checks", "skipped") == skipped + 1
    assert counter(text, "openwop_seat_pool_checks", "ok") == ok


@pytest.fixture(scope="module")
def checked(start_seat, verifiers, tmp_path_factory):
    """pool.server_check_delay = 0: the claim checked before every hand-over; pool.server_reset_delay = 0: a backend
    reset as its client leaves."""
    auth = userlist(tmp_path_factory, "pool-checked", verifiers)
    return start_seat(extra={"pool": {"enabled": True, "auth_file": str(auth), "server_check_delay": 0,
                                      "server_reset_delay": 0}})


def delete_claim_unseen(pg, pid: int) -> None:
    """Delete ``pid``'s claims row without firing the claims triggers (session_replication_role = replica, as a
    superuser may): the claim is gone and the backend lives on, which only the pool's checks can find."""
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:
        direct.execute("SET session_replication_role = replica")
        assert direct.execute("DELETE FROM openwop_seat.claims WHERE pid = %s", (pid,)).rowcount == 1


@pytest.fixture(scope="module")
def delayed(start_seat, verifiers, tmp_path_factory):
    """pool.server_check_delay = 2: a hand-over more than 2 s after the backend's reset checks its claim."""
    auth = userlist(tmp_path_factory, "pool-delayed", verifiers)
    return start_seat(extra={"pool": {"enabled": True, "auth_file": str(auth), "server_check_delay": 2}})


def test_the_check_delay_runs_from_the_reset_not_from_a_refused_login(delayed):
    """A login refused at the seat puts the backend back idle, unchecked: the delay still counts from its reset."""
    with connect(delayed) as first:
        pid = backend(first)
    text = settle(delayed)
    ok, skipped = counter(text, "openwop_seat_pool_checks", "ok"), counter(text, "openwop_seat_pool_checks", "skipped")
    time.sleep(1.2)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(delayed, password="wrong")  # within the delay: handed over unchecked, then put back
    assert counter(metrics(delayed), "openwop_seat_pool_checks", "skipped") == skipped + 1
    time.sleep(1.2)  # 2.4 s after the reset, 1.2 s after the refused login
    with connect(delayed) as nxt:
        assert backend(nxt) == pid
    text = metrics(delayed)
    assert counter(text, "openwop_seat_pool_checks", "ok") == ok + 1
    assert counter(text, "openwop_seat_pool_checks", "skipped") == skipped + 1


def test_with_no_check_delay_each_hand_over_checks_the_claim(checked):
    with connect(checked) as first:
        pid = backend(first)
    text = settle(checked)
    ok, resets = counter(text, "openwop_seat_pool_checks", "ok"), counter(text, "openwop_seat_pool_resets", "ok")
    with connect(checked) as nxt:
        assert backend(nxt) == pid
        text = metrics(checked)  # before this client leaves (its reset then runs at once)
    assert counter(text, "openwop_seat_pool_checks", "ok") == ok + 1
    assert counter(text, "openwop_seat_pool_checks", "skipped") == 0
    # server_reset_delay = 0: reset as the first client left, not by the hand-over
    assert counter(text, "openwop_seat_pool_resets", "ok") == resets
    assert counter(text, "openwop_seat_pool_hand_over_resets") == 0


def test_the_check_finds_a_claim_lost_unseen_while_idle(checked, pg):
    with connect(checked) as first:
        pid = backend(first)
    lost = counter(settle(checked), "openwop_seat_pool_checks", "claim lost")
    delete_claim_unseen(pg, pid)
    with connect(checked) as nxt:
        assert backend(nxt) != pid
        assert nxt.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 2
    assert counter(metrics(checked), "openwop_seat_pool_checks", "claim lost") == lost + 1
    gone(pg, pid)


def test_a_backend_whose_claim_was_deleted_during_its_session_is_ended(pooled, pg):
    with connect(pooled) as first:
        pid = backend(first)
        with psycopg.connect(pg.dsn(), autocommit=True) as direct:
            assert direct.execute("DELETE FROM openwop_seat.claims WHERE pid = %s", (pid,)).rowcount == 1
        with pytest.raises(psycopg.OperationalError, match="terminating connection due to administrator command"):
            first.execute("SELECT 1")
    gone(pg, pid)
    settle(pooled)
    with connect(pooled) as nxt:
        assert backend(nxt) != pid


def test_the_reset_finds_a_claim_lost_unseen_during_the_session(pooled, pg):
    lost = counter(metrics(pooled), "openwop_seat_pool_resets", "claim lost")
    with connect(pooled) as first:
        pid = backend(first)
        delete_claim_unseen(pg, pid)
    text = settle(pooled)
    assert counter(text, "openwop_seat_pool_resets", "claim lost") == lost + 1
    with connect(pooled) as nxt:
        assert backend(nxt) != pid


# ---------------------------------------------------------------- the reset waits for the next client (ADR 0016)

RESET_DELAY = 3  # long enough that a client connecting right after another left takes its backend released


@pytest.fixture(scope="module")
def released(start_seat, verifiers, tmp_path_factory):
    """pool.server_reset_delay = 3: a backend whose client left waits 3 s for the next client before its own reset."""
    auth = userlist(tmp_path_factory, "pool-released", verifiers)
    return start_seat(extra={"pool": {"enabled": True, "auth_file": str(auth), "server_reset_delay": RESET_DELAY}})


def leave_released(seat, setup=None) -> int:
    """A client that leaves; returns its backend's pid once the pool holds that backend released."""
    with connect(seat) as first:
        pid = backend(first)
        if setup is not None:
            setup(first)
    wait_for(seat, lambda t: pool_count(t, "released") == 1, "the backend released")
    return pid


def test_the_next_client_takes_the_released_backend_and_finds_nothing_of_the_last(released, pg):
    """The hand-over runs the reset the backend owes while its client computes its proof: the next client gets the
    backend with nothing of the last client's session, claimed as before."""
    def setup(c):
        c.execute("SET work_mem = '7777kB'")
        c.execute("CREATE TEMP TABLE leftover_tt (x int)")
        c.execute("PREPARE leftover AS SELECT 1")
        c.execute("SELECT pg_advisory_lock(434343)")
        c.execute("LISTEN leftover_channel")

    text = metrics(released)
    resets, taken = counter(text, "openwop_seat_pool_resets", "ok"), counter(text, "openwop_seat_pool_hand_over_resets")
    pid = leave_released(released, setup)
    with connect(released) as nxt:
        assert backend(nxt) == pid
        assert nxt.execute("SHOW work_mem").fetchone()[0] != "7777kB"
        assert nxt.execute("SELECT to_regclass('pg_temp.leftover_tt')").fetchone()[0] is None
        assert nxt.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
        assert nxt.execute("SELECT count(*) FROM pg_listening_channels()").fetchone()[0] == 0
        assert nxt.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
                           ).fetchone()[0] == 0
        assert nxt.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 2
        text = metrics(released)
        assert counter(text, "openwop_seat_pool_hand_over_resets") == taken + 1
        assert counter(text, "openwop_seat_pool_resets", "ok") == resets + 1
        with psycopg.connect(pg.dsn(), autocommit=True) as direct:
            assert direct.execute("SELECT pg_try_advisory_lock(434343)").fetchone()[0] is True


def test_a_released_backend_nobody_takes_is_reset_on_its_own(released, pg):
    text = metrics(released)
    resets, taken = counter(text, "openwop_seat_pool_resets", "ok"), counter(text, "openwop_seat_pool_hand_over_resets")
    pid = leave_released(released, lambda c: c.execute("SELECT pg_advisory_lock(454545)"))
    text = wait_for(released, lambda t: pool_count(t, "idle") == 1 and pool_count(t, "released") == 0,
                    "the released backend reset after server_reset_delay")
    assert counter(text, "openwop_seat_pool_resets", "ok") == resets + 1
    assert counter(text, "openwop_seat_pool_hand_over_resets") == taken
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:
        assert direct.execute("SELECT pg_try_advisory_lock(454545)").fetchone()[0] is True
    with connect(released) as nxt:
        assert backend(nxt) == pid


def test_a_notification_to_a_released_backend_starts_its_reset_and_keeps_the_backend(released, pg):
    """What a released backend says (a NOTIFY on the last client's LISTEN) is read as the start of its reset's
    answer: the backend is reset and kept, not closed as an idle backend that speaks is."""
    resets = counter(metrics(released), "openwop_seat_pool_resets", "ok")
    pid = leave_released(released, lambda c: c.execute("LISTEN released_channel"))
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:
        direct.execute("NOTIFY released_channel, 'for the client that left'")
    text = settle(released)
    assert pool_count(text, "idle") == 1
    assert counter(text, "openwop_seat_pool_resets", "ok") == resets + 1
    with connect(released) as nxt:
        assert backend(nxt) == pid
        assert nxt.execute("SELECT count(*) FROM pg_listening_channels()").fetchone()[0] == 0


def test_a_released_backend_that_lost_its_claim_unseen_fails_the_login_that_took_it(released, pg):
    """The hand-over's reset finds the claim lost (deleted without the triggers, as only a superuser can): the backend
    is closed, never handed over, and with no other idle backend in the pool that login ends with 08006; the next one
    gets a new backend, claimed."""
    for _ in range(pool_count(settle(released), "idle")):  # the pool's idle backends taken and closed
        c = connect(released)
        c.execute("BEGIN")
        c.close()  # left inside a transaction: its backend is closed, not kept
    assert pool_count(settle(released), "idle") == 0
    lost = counter(metrics(released), "openwop_seat_pool_resets", "claim lost")

    pid = leave_released(released, lambda c: delete_claim_unseen(pg, backend(c)))
    with pytest.raises(psycopg.OperationalError, match="pooled server connection was lost during login"):
        connect(released)
    assert counter(metrics(released), "openwop_seat_pool_resets", "claim lost") == lost + 1
    gone(pg, pid)
    with connect(released) as nxt:
        assert backend(nxt) != pid
        assert nxt.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 2


def test_a_hand_over_whose_reset_finds_the_claim_lost_takes_the_next_idle_backend(released, pg):
    """Two backends released, the most recent (taken first) with its claim lost unseen: the hand-over's reset closes
    it, and the same login takes the other one, reset; the client sees nothing of it."""
    first, second = connect(released), connect(released)
    lost_pid, kept_pid = backend(first), backend(second)
    delete_claim_unseen(pg, lost_pid)
    second.close()
    first.close()  # released last: taken first
    wait_for(released, lambda t: pool_count(t, "released") == 2, "both backends released")
    lost = counter(metrics(released), "openwop_seat_pool_resets", "claim lost")
    with connect(released) as nxt:
        assert backend(nxt) == kept_pid
        assert nxt.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 2
        assert counter(metrics(released), "openwop_seat_pool_resets", "claim lost") == lost + 1
    gone(pg, lost_pid)


def test_a_wrong_password_on_a_released_backend_leaves_it_reset_for_the_next_client(released):
    text = metrics(released)
    taken = counter(text, "openwop_seat_pool_hand_over_resets")
    pid = leave_released(released, lambda c: c.execute("SET work_mem = '6666kB'"))
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(released, password="wrong")
    text = settle(released)
    assert pool_count(text, "idle") == 1
    assert counter(text, "openwop_seat_pool_hand_over_resets") == taken + 1  # reset during the refused login
    with connect(released) as nxt:
        assert backend(nxt) == pid
        assert nxt.execute("SHOW work_mem").fetchone()[0] != "6666kB"


@pytest.mark.parametrize("how", ["leaves", "another mechanism"])
def test_a_login_that_ends_before_its_proof_leaves_the_released_backend_reset(released, how):
    """Taken released and given back before the hand-over's reset started (the client left after
    AuthenticationSASL, or sent a SASLInitialResponse the seat refuses): the reset it owes runs at once, not after
    server_reset_delay."""
    text = metrics(released)
    resets, taken = counter(text, "openwop_seat_pool_resets", "ok"), counter(text, "openwop_seat_pool_hand_over_resets")
    pid = leave_released(released, lambda c: c.execute("SET work_mem = '5555kB'"))
    with seat_login(released) as raw:
        if how == "another mechanism":
            body = b"SCRAM-SHA-1\x00" + struct.pack("!i", 4) + b"n,,x"
            raw.sendall(b"p" + struct.pack("!i", 4 + len(body)) + body)
            kind, error = _read_message(raw)
            assert kind == b"E" and b"SCRAM-SHA-256" in error
    text = wait_for(released, lambda t: pool_count(t, "idle") == 1, "the backend reset and idle")
    assert counter(text, "openwop_seat_pool_resets", "ok") == resets + 1
    assert counter(text, "openwop_seat_pool_hand_over_resets") == taken
    with connect(released) as nxt:
        assert backend(nxt) == pid
        assert nxt.execute("SHOW work_mem").fetchone()[0] != "5555kB"


def test_a_client_that_leaves_mid_transaction_does_not_return_its_backend(pooled, pg):
    with psycopg.connect(pooled.dsn(user="scram_user", password=PASSWORD)) as first:  # not autocommit
        pid = backend(first)
        first.execute("CREATE TEMP TABLE in_txn (x int)")
        first.pgconn.finish()  # leaves inside the transaction (Terminate, then the socket closes)
    settle(pooled)
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:
        wait = time.monotonic() + 20  # the backend ends when the seat closes its socket
        while direct.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]:
            assert time.monotonic() < wait, "the backend of a client that left mid-transaction is still there"
            time.sleep(0.02)
    with connect(pooled) as nxt:
        assert backend(nxt) != pid


def test_a_client_that_leaves_mid_copy_does_not_return_its_backend(pooled):
    conn = connect(pooled)
    pid = backend(conn)
    conn.execute("CREATE TEMP TABLE copied (x int)")
    pgconn = conn.pgconn
    pgconn.send_query(b"COPY copied FROM STDIN")  # libpq's own calls: psycopg would end the COPY on its way out
    assert pgconn.get_result().status == psycopg.pq.ExecStatus.COPY_IN
    assert pgconn.put_copy_data(b"1\n") == 1 and pgconn.flush() == 0
    pgconn.finish()  # leaves mid-COPY
    settle(pooled)
    with connect(pooled) as nxt:
        assert backend(nxt) != pid


def cancel_a_sleep(seat, conn) -> bool:
    """Run ``SELECT pg_sleep(60)`` on ``conn`` in a thread, cancel it with the client's own key once its backend is
    sleeping (watched from a raw session), and say whether the statement ended cancelled within 20 s."""
    pid = backend(conn)
    errors = []

    def sleep():
        try:
            conn.execute("SELECT pg_sleep(60)")
        except psycopg.errors.QueryCanceled as e:
            errors.append(e)

    t = threading.Thread(target=sleep)
    t.start()
    wait_active = time.monotonic() + 20
    with psycopg.connect(seat.dsn(user="postgres"), autocommit=True) as watch:
        while watch.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] \
                != "PgSleep":
            assert time.monotonic() < wait_active
            time.sleep(0.01)
    conn.cancel()
    t.join(20)
    return not t.is_alive() and len(errors) == 1


def test_a_cancel_reaches_the_clients_own_statement(pooled):
    with connect(pooled) as conn:
        before = counter(metrics(pooled), "openwop_seat_pool_cancels", "mapped")
        assert cancel_a_sleep(pooled, conn)
    assert counter(metrics(pooled), "openwop_seat_pool_cancels", "mapped") == before + 1


def test_a_former_clients_cancel_key_cancels_nothing(pooled, pg):
    with connect(pooled) as first:
        pid = backend(first)
        stale = first.pgconn.get_cancel()  # the seat-issued key the first client holds
    settle(pooled)
    with psycopg.connect(pg.dsn(), autocommit=True) as holder, connect(pooled) as nxt:
        assert backend(nxt) == pid
        holder.execute("SELECT pg_advisory_lock(515151)")
        result = []
        t = threading.Thread(target=lambda: result.append(
            nxt.execute("SELECT pg_advisory_lock(515151)").fetchone()))
        t.start()
        deadline = time.monotonic() + 20
        while not holder.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                                 (pid,)).fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        before = counter(metrics(pooled), "openwop_seat_pool_cancels", "mapped")
        stale.cancel()  # through the seat: a key of a session that ended maps to nothing
        assert counter(metrics(pooled), "openwop_seat_pool_cancels", "mapped") == before
        holder.execute("SELECT pg_advisory_unlock(515151)")
        t.join(30)
        assert result == [("",)]  # it got its lock (void), not a cancel
        nxt.execute("SELECT pg_advisory_unlock_all()")


def test_another_startup_parameter_is_another_pool(pooled):
    with connect(pooled, options="'-c lock_timeout=5s'") as first:
        pid = backend(first)
        assert first.execute("SHOW lock_timeout").fetchone()[0] == "5s"
        first.execute("SET lock_timeout = '9s'")
    settle(pooled)
    with connect(pooled) as plain:
        assert backend(plain) != pid
        assert plain.execute("SHOW lock_timeout").fetchone()[0] != "5s"
    with connect(pooled, options="'-c lock_timeout=5s'") as again:
        assert backend(again) == pid
        assert again.execute("SHOW lock_timeout").fetchone()[0] == "5s"  # its own startup's default, after the reset


def test_the_admin_console_shows_the_idle_pooled_connections(pooled):
    with connect(pooled) as first:
        pid = backend(first)
    settle(pooled)
    with psycopg.connect(f"host=127.0.0.1 port={pooled.admin_port} dbname=pgbouncer user=ops password={ADMIN_PW}",
                         autocommit=True) as admin:
        servers = admin.pgconn.exec_(b"SHOW SERVERS")
        columns = [servers.fname(i).decode() for i in range(servers.nfields)]
        rows = [dict(zip(columns, (servers.get_value(r, i).decode() if servers.get_value(r, i) is not None
                                   else None for i in range(servers.nfields)))) for r in range(servers.ntuples)]
        idle = [r for r in rows if r["remote_pid"] == str(pid)]
        assert len(idle) == 1 and idle[0]["state"] == "idle" and idle[0]["user"] == "scram_user"
        assert int(idle[0]["id"]) < 0 and idle[0]["link"] is None
        pools = admin.pgconn.exec_(b"SHOW POOLS")
        columns = [pools.fname(i).decode() for i in range(pools.nfields)]
        row = next(dict(zip(columns, (pools.get_value(r, i).decode() for i in range(pools.nfields))))
                   for r in range(pools.ntuples) if pools.get_value(r, 1) == b"scram_user")
        assert int(row["sv_idle"]) >= 1


@pytest.fixture(scope="module")
def small(start_seat, verifiers, tmp_path_factory):
    """One server connection per pool; a client waits 5 s for it."""
    auth = userlist(tmp_path_factory, "pool-small", verifiers)
    return start_seat(extra={"pool": {"enabled": True, "auth_file": str(auth), "pool_size": 1,
                                      "query_wait_timeout": 5}})


def test_a_client_of_a_full_pool_waits_for_the_backend(small):
    first = connect(small)
    pid = backend(first)
    waits = counter(metrics(small), "openwop_seat_pool_waits")
    got = []
    t = threading.Thread(target=lambda: got.append(connect(small)))
    t.start()
    wait_for(small, lambda text: counter(text, "openwop_seat_pool_waits") == waits + 1, "a client waiting")
    first.close()
    t.join(30)
    assert len(got) == 1
    with got[0] as second:
        assert backend(second) == pid


def test_a_client_of_a_full_pool_is_refused_after_query_wait_timeout(small):
    with connect(small):
        with pytest.raises(psycopg.OperationalError, match="pool.query_wait_timeout"):
            connect(small)


@pytest.fixture(scope="module")
def short_lived(start_seat, verifiers, tmp_path_factory):
    auth = userlist(tmp_path_factory, "pool-short", verifiers)
    return start_seat(extra={"pool": {"enabled": True, "auth_file": str(auth), "server_idle_timeout": 0.2,
                                      "server_lifetime": 1}})


def gone(pg, pid: int) -> None:
    """Wait until backend ``pid`` has ended (fails after 20 s)."""
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:
        deadline = time.monotonic() + 20
        while direct.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]:
            assert time.monotonic() < deadline, f"backend {pid} is still there"
            time.sleep(0.02)


def test_server_idle_timeout_closes_an_idle_backend(short_lived, pg):
    with connect(short_lived) as first:
        pid = backend(first)
    gone(pg, pid)
    with connect(short_lived) as nxt:
        assert backend(nxt) != pid


def test_server_lifetime_closes_an_old_backend_when_its_client_leaves(short_lived, pg):
    resets = counter(metrics(short_lived), "openwop_seat_pool_resets", "ok")
    with connect(short_lived) as first:
        pid = backend(first)
        time.sleep(1.2)  # older than server_lifetime when it leaves
    gone(pg, pid)
    assert counter(metrics(short_lived), "openwop_seat_pool_resets", "ok") == resets  # closed, not reset


def test_a_wrong_password_without_an_idle_backend_is_refused_by_postgresql_and_frees_its_place(small):
    """No idle backend: the client is relayed to PostgreSQL, which refuses it; its place in the pool of one is free
    again (else the right password would wait for it and time out)."""
    settle(small)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(small, password="wrong")
    settle(small)
    with connect(small) as right:
        assert right.execute("SELECT current_user").fetchone()[0] == "scram_user"


def test_a_client_that_leaves_during_its_seat_login_leaves_the_backend_idle(pooled):
    """A client that sends its startup packet and goes away in the middle of the SCRAM exchange at the seat: the
    backend it was to get stays in the pool, untouched."""
    with connect(pooled) as first:
        pid = backend(first)
    settle(pooled)
    with seat_login(pooled):  # AuthenticationSASL from the seat: then the client leaves
        pass
    settle(pooled)
    with connect(pooled) as nxt:
        assert backend(nxt) == pid


def test_a_backend_lost_during_a_seat_login_fails_it_and_frees_its_place(small, pg):
    """The backend a hand-over took ends while its client computes its proof: the login ends with 08006, and the
    backend's place in the pool (of one) is free again, so the next client gets a new backend at once instead of
    waiting for pool.query_wait_timeout."""
    with connect(small) as first:
        pid = backend(first)
    settle(small)
    nonce = "lost-during-login-nonce"
    with seat_login(small) as raw:  # the idle backend is taken for this client
        body, bare = scram_client.initial_response(nonce)
        raw.sendall(b"p" + struct.pack("!i", 4 + len(body)) + body)
        kind, cont = _read_message(raw)
        assert kind == b"R" and cont[:4] == struct.pack("!I", 11)
        with psycopg.connect(pg.dsn(), autocommit=True) as direct:
            assert direct.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0] is True
        gone(pg, pid)
        final, _ = scram_client.final_message(PASSWORD, bare, cont[4:].decode(), nonce)
        raw.sendall(b"p" + struct.pack("!i", 4 + len(final)) + final.encode())
        kind, error = _read_message(raw)
        assert kind == b"E" and b"C08006\x00" in error and b"lost during login" in error
    with connect(small) as nxt:
        assert backend(nxt) != pid


@pytest.fixture(scope="module")
def pooled_tls(start_seat, verifiers, certs, tmp_path_factory):
    auth = userlist(tmp_path_factory, "pool-tls", verifiers)
    return start_seat(tls={"cert_file": certs["server_crt"], "key_file": certs["server_key"]},
                      extra={"pool": {"enabled": True, "auth_file": str(auth)}})


def test_a_tls_client_is_handed_over_with_scram_and_no_channel_binding(pooled_tls):
    """On TLS libpq tells the seat it could bind the channel (gs2 header "y"); the seat offers SCRAM-SHA-256 only,
    and the exchange succeeds. A client that requires channel binding is refused at the hand-over."""
    with connect(pooled_tls, sslmode="require") as first:
        pid = backend(first)
        assert first.info.pgconn.ssl_in_use
    quiet(pooled_tls)
    with connect(pooled_tls, sslmode="require") as nxt:
        assert backend(nxt) == pid and nxt.info.pgconn.ssl_in_use
    quiet(pooled_tls)
    with pytest.raises(psycopg.OperationalError, match="channel binding"):
        connect(pooled_tls, sslmode="require", channel_binding="require")
    quiet(pooled_tls)
    with connect(pooled_tls, sslmode="require") as again:  # the refused client did not take the backend with it
        assert backend(again) == pid


@pytest.fixture(scope="module")
def queried(start_seat, verifiers, tmp_path_factory):
    """Verifiers from pool.auth_query only (the seat's own connection is the cluster's superuser here)."""
    return start_seat(extra={"pool": {"enabled": True,
                                      "auth_query": "SELECT rolpassword FROM pg_authid WHERE rolname = $1"}})


def test_auth_query_gives_the_verifier_of_a_user_without_an_auth_file(queried):
    with connect(queried) as first:
        pid = backend(first)
    quiet(queried)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(queried, password="wrong")
    with connect(queried) as nxt:
        assert backend(nxt) == pid  # handed over: the seat checked the password against the queried verifier
    quiet(queried)
    # md5_user's rolpassword is an md5 hash: not pooled, relayed each time
    with connect(queried, user="md5_user") as a:
        first_md5 = backend(a)
    with connect(queried, user="md5_user") as b:
        assert backend(b) != first_md5


def test_pools_with_two_workers(start_seat, verifiers, tmp_path_factory):
    """Each worker has its own pools; the supervisor's /metrics sums them. Whichever worker a client lands on, it
    gets a claimed backend of its major, and a backend is reused by the worker that keeps it."""
    auth = userlist(tmp_path_factory, "pool-workers", verifiers)
    seat = start_seat(proxy={"workers": 2}, extra={"pool": {"enabled": True, "auth_file": str(auth)}})
    pids = set()
    for _ in range(6):
        with connect(seat) as conn:
            pids.add(backend(conn))
            assert conn.execute("SELECT openwop_seat.session_major()").fetchone()[0] == 2
        quiet(seat)
    assert len(pids) <= 2  # at most one backend per worker: every later client was handed one
    text = metrics(seat)
    assert pool_count(text, "idle") == len(pids)
    assert counter(text, "openwop_seat_pool_hand_overs") == 6 - len(pids)


def test_a_cancel_reaches_the_pooled_session_whichever_worker_receives_it(start_seat, verifiers, tmp_path_factory):
    """With two workers the kernel gives each cancel connection to either: the worker that holds the session sends
    it as its backend's key ("mapped"), the other asks the others through the supervisor ("routed"). Every cancel
    must end the statement; the loop runs until both paths were taken (each cancel lands on the other worker with
    probability about one half, so 40 tries miss one path with odds of 2^-39)."""
    auth = userlist(tmp_path_factory, "pool-cancel", verifiers)
    seat = start_seat(proxy={"workers": 2}, extra={"pool": {"enabled": True, "auth_file": str(auth)}})
    with connect(seat) as conn:
        for attempt in range(40):
            assert cancel_a_sleep(seat, conn), f"cancel {attempt + 1} was lost"
            text = metrics(seat)
            if counter(text, "openwop_seat_pool_cancels", "routed") and counter(text, "openwop_seat_pool_cancels",
                                                                                "mapped"):
                break
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on after each cancel
    text = metrics(seat)
    assert counter(text, "openwop_seat_pool_cancels", "routed") >= 1
    assert counter(text, "openwop_seat_pool_cancels", "mapped") >= 1
    assert counter(text, "openwop_seat_pool_cancels", "forwarded") == 0
    assert counter(text, "openwop_seat_pool_cancels", "routed") + counter(text, "openwop_seat_pool_cancels",
                                                                          "mapped") == attempt + 1


def test_a_cancel_with_a_key_no_worker_holds_cancels_nothing_with_two_workers(start_seat, verifiers,
                                                                              tmp_path_factory):
    """A CancelRequest whose (pid, key) no worker issued, sent right after the seat starts (while the second worker
    may not be linked to the supervisor yet, when a cancel waits for the link) and again later: each is forwarded as
    it came, and cancels no statement of a pooled session."""
    auth = userlist(tmp_path_factory, "pool-bogus-cancel", verifiers)
    seat = start_seat(proxy={"workers": 2}, extra={"pool": {"enabled": True, "auth_file": str(auth)}})
    with connect(seat) as conn:
        result = []
        t = threading.Thread(target=lambda: result.append(conn.execute("SELECT pg_sleep(1.5), 'slept'").fetchone()))
        t.start()
        for _ in range(8):  # the kernel spreads the connections over both workers
            with socket.create_connection(("127.0.0.1", seat.port)) as c:
                c.sendall(struct.pack("!IIII", 16, 80877102, 0x7FFFFFF0, 0x12345678))
                c.settimeout(10)  # a hang fails here (socket.timeout): the wait for the link is bounded at 2 s
                assert c.recv(1) == b""  # the seat closes it, and says nothing, as PostgreSQL does
        t.join(30)
        assert result == [("", "slept")]  # nothing was cancelled
    text = wait_for(seat, lambda t: counter(t, "openwop_seat_pool_cancels", "forwarded") == 8, "8 cancels forwarded")
    assert counter(text, "openwop_seat_pool_cancels", "mapped") == counter(text, "openwop_seat_pool_cancels",
                                                                         "routed") == 0


def test_a_terminate_ends_the_pooled_session_even_if_the_client_keeps_its_socket(pooled):
    """PostgreSQL closes a connection on Terminate; the seat, which keeps the backend, does the same: a client that
    sends Terminate and keeps its socket open does not hold the backend."""
    with connect(pooled) as first:
        pid = backend(first)
        fd = socket.socket(fileno=first.pgconn.socket)  # the client's own socket, Terminate sent on it by hand
        try:
            fd.settimeout(20)  # a bound against hanging: without the seat closing it, recv times out and fails
            fd.sendall(b"X\x00\x00\x00\x04")
            assert fd.recv(1) == b""  # the seat closed the connection
        finally:
            fd.detach()
    quiet(pooled)
    with connect(pooled) as nxt:
        assert backend(nxt) == pid


# --- log.connections, log.disconnections: the two lines a connect logs (issue 26) ------------------------------

START = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00 info session start session=(\d+) "
                   r"client=127\.0\.0\.1:\d+ user=scram_user database=postgres application_name=(\S+) major=2 "
                   r"tls=False protocol=3\.0( pooled_backend=\d+)?$")
END = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00 info session end session=(\d+) "
                 r"client=127\.0\.0\.1:\d+ user=scram_user database=postgres application_name=(\S+) major=2 "
                 r'tls=False reason=(?:"[^"]*"|\S+) duration_s=\d+(?:\.\d+)? bytes_in=\d+ bytes_out=\d+$')


def test_connection_lines_follow_log_connections_and_log_disconnections(start_seat, verifiers, tmp_path):
    """Off: no session start or end line, pooled or not; a reload turns them on for the sessions after it, with the
    lines the seat always wrote (a first connect's, then a hand-over's with pooled_backend); each switch alone."""
    import signal

    auth = tmp_path / "userlist.txt"
    auth.write_text(f'"scram_user" "{verifiers["scram_user"]}"\n')
    pool = {"enabled": True, "auth_file": str(auth), "server_idle_timeout": 600}
    seat = start_seat(log={"connections": False, "disconnections": False}, extra={"pool": pool})
    base = seat.config_path.read_text()

    def two_connects(app: str) -> str:
        """A connect on a new backend (application_name is in the pool's key: a pool of its own), then a hand-over
        of that backend; the log lines they wrote (a session's end line is written before its backend's reset)."""
        before = len(seat.log())
        for _ in range(2):
            with connect(seat, application_name=app) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            quiet(seat)
        return seat.log()[before:]

    def reload(connections: bool, disconnections: bool) -> None:
        text = re.sub(r"^connections = false$", f"connections = {str(connections).lower()}", base, flags=re.M)
        text = re.sub(r"^disconnections = false$", f"disconnections = {str(disconnections).lower()}", text,
                      flags=re.M)
        assert text.count("connections = ") == 2 and text != base or not (connections or disconnections), text
        seat.config_path.write_text(text)
        before = len(seat.log())
        seat.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 15
        while "reloaded" not in seat.log()[before:]:
            assert time.monotonic() < deadline and "reload rejected" not in seat.log()[before:], seat.log()[before:]
            time.sleep(0.05)
        assert "log.connections" in seat.log()[before:] or "log.disconnections" in seat.log()[before:]

    off = two_connects("logs-off")
    assert "session start" not in off and "session end" not in off, off
    assert "logs-off" not in seat.log()

    reload(True, True)
    on = [line for line in two_connects("logs-on").splitlines() if " session " in line]
    starts = [START.match(line) for line in on if " session start " in line]
    ends = [END.match(line) for line in on if " session end " in line]
    assert len(starts) == 2 and len(ends) == 2 and all(starts) and all(ends), on
    assert [m.group(2) for m in starts + ends] == ["logs-on"] * 4
    assert starts[0].group(3) is None and starts[1].group(3) is not None, on  # a new backend, then a hand-over
    assert sorted(m.group(1) for m in starts) == sorted(m.group(1) for m in ends)

    reload(False, True)
    only_ends = [line for line in two_connects("ends-only").splitlines() if " session " in line]
    assert len(only_ends) == 2 and all(END.match(line) for line in only_ends), only_ends

    reload(True, False)
    only_starts = [line for line in two_connects("starts-only").splitlines() if " session " in line]
    assert len(only_starts) == 2 and all(START.match(line) for line in only_starts), only_starts
    assert seat.alive()
