"""The admin console's PgBouncer commands with psql, with one process and with `workers = 2`: the admin login,
PAUSE holding live sessions at their transaction boundaries until RESUME, KILL, RELOAD applying a changed client
rule, WAIT_CLOSE, SHOW CLIENTS / SERVERS / POOLS / STATS, SHUTDOWN; and the gauges the supervisor does not sum."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import threading
import time

import psycopg
import pytest
from test_metrics import get, metric
from test_psql import psql
from test_workers import worker_pids

from proxy.dev.devcluster import free_port
from proxy.serve.admin import CLIENT_COLUMNS, POOL_COLUMNS, SERVER_COLUMNS, STATS_COLUMNS, scram_secret

ADMIN_PW = "console-pw"


def console(start_seat, tmp_path, workers: int = 1, auth: str | None = None, lines: list[str] | None = None,
            users: list[str] | None = None, **proxy):
    """A seat with its admin console on TCP; the auth file holds `ops` with a SCRAM-SHA-256 secret by default."""
    auth_file = tmp_path / "admin-users.txt"
    auth_file.write_text("\n".join(lines or ['; admin users', f'"ops" "{scram_secret(ADMIN_PW)}"']) + "\n")
    port = free_port()
    admin = {"listen": f"127.0.0.1:{port}", "users": users or ["ops"], "auth_file": str(auth_file)}
    if auth:
        admin["auth"] = auth
    seat = start_seat(proxy={"workers": workers, **proxy}, extra={"admin": admin})
    return seat, f"host=127.0.0.1 port={port} dbname=pgbouncer"


def run(dsn: str, sql: str, user: str = "ops", password: str = ADMIN_PW, check: bool = True):
    return psql(f"{dsn} user={user}", "-c", sql, password=password, check=check)


def table(dsn: str, sql: str, columns: list[str]) -> list[dict[str, str]]:
    """A SHOW answer as dicts by column name (psql -At: one row a line, `|` between values)."""
    out = psql(f"{dsn} user=ops", "-F", "\t", "-c", sql, password=ADMIN_PW).stdout
    rows = [line.split("\t") for line in out.splitlines()]
    assert all(len(r) >= len(columns) for r in rows), out
    return [dict(zip(columns, r)) for r in rows]


def background(dsn: str, sql: str) -> subprocess.Popen:
    """psql running one admin command that waits (PAUSE, WAIT_CLOSE)."""
    return subprocess.Popen(["psql", "-X", "-At", "-d", f"{dsn} user=ops", "-c", sql],
                            env={**os.environ, "PGPASSWORD": ADMIN_PW}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def until(check, what: str, timeout: float = 30):
    """Poll ``check`` until it returns a true value (a bound against hanging, not a timed assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def clients(dsn: str) -> list[dict[str, str]]:
    return table(dsn, "SHOW CLIENTS", CLIENT_COLUMNS)


def client_of(dsn: str, app: str) -> dict[str, str]:
    (row,) = [r for r in clients(dsn) if r["application_name"] == app]
    return row


def on_every_worker(seat, workers: int, app: str) -> list[psycopg.Connection]:
    """Connections until each worker holds one (worker W of N numbers its sessions W, W + N, …)."""
    conns, seen = [], set()
    for i in range(200):
        conn = psycopg.connect(seat.dsn(application_name=f"{app}-{i}"), autocommit=True)
        conn.execute("SELECT 1")
        conns.append(conn)
        seen.add(int(client_of(seat._admin, f"{app}-{i}")["id"]) % workers)
        if len(seen) == workers:
            return conns
    raise AssertionError("the kernel gave every connection to one worker")


@pytest.fixture(params=[1, 2], ids=["workers=1", "workers=2"])
def workers(request) -> int:
    return request.param


def test_login_needs_an_admin_user_and_its_password(start_seat, tmp_path):
    seat, dsn = console(start_seat, tmp_path, users=["ops", "plain"],
                        lines=[f'"ops" "{scram_secret(ADMIN_PW)}"', '"plain" "plain-pw"', '"other" "other-pw"'])
    assert run(dsn, "SHOW VERSION").stdout.strip()
    assert run(dsn, "SHOW VERSION", user="plain", password="plain-pw").stdout.strip()  # plain text: SCRAM too
    for user, password in (("ops", "wrong"), ("other", "other-pw"), ("nobody", ADMIN_PW)):
        bad = run(dsn, "SHOW VERSION", user=user, password=password, check=False)
        assert bad.returncode != 0 and f'password authentication failed for user "{user}"' in bad.stderr
    assert "admin login refused" in seat.log()


def test_md5_login(start_seat, tmp_path):
    md5 = "md5" + hashlib.md5(b"md5-pwops").hexdigest()
    seat, dsn = console(start_seat, tmp_path, auth="md5", users=["ops", "scram"],
                        lines=[f'"ops" "{md5}"', f'"scram" "{scram_secret("scram-pw")}"'])
    assert run(dsn, "SHOW VERSION", password="md5-pw").stdout.strip()
    assert run(dsn, "SHOW VERSION", user="scram", password="scram-pw").stdout.strip()
    bad = run(dsn, "SHOW VERSION", password="wrong", check=False)
    assert bad.returncode != 0 and "password authentication failed" in bad.stderr


def test_show_clients_servers_pools_stats(start_seat, tmp_path, workers):
    seat, dsn = console(start_seat, tmp_path, workers=workers)
    seat._admin = dsn
    conns = on_every_worker(seat, workers, "shown")
    with psycopg.connect(seat.dsn(application_name="txn")) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        mine = client_of(dsn, "txn")
        assert mine["type"] == "C" and mine["user"] == "postgres" and mine["database"] == "postgres"
        assert mine["state"] == "active" and mine["addr"] == "127.0.0.1" and mine["local_port"] == str(seat.port)
        assert mine["major"] == "2" and mine["held"] == "f" and mine["close_needed"] == "0"
        (server,) = [r for r in table(dsn, "SHOW SERVERS", SERVER_COLUMNS) if r["link"] == mine["id"]]
        assert server["type"] == "S" and server["remote_pid"] == str(pid) and server["state"] == "active"
        pools = table(dsn, "SHOW POOLS", POOL_COLUMNS)
        (pool,) = [p for p in pools if (p["database"], p["user"]) == ("postgres", "postgres")]
        # one row per database and user over every worker: the counts are summed
        assert int(pool["cl_active"]) == len(conns) + 1 and int(pool["sv_active"]) == len(conns) + 1
        assert pool["cl_waiting"] == "0" and pool["pool_mode"] == "session"
        before = {r["database"]: r for r in table(dsn, "SHOW STATS", STATS_COLUMNS)}["postgres"]
        conn.commit()
        conn.execute("SELECT 1").fetchone()
        conn.commit()
        after = {r["database"]: r for r in table(dsn, "SHOW STATS", STATS_COLUMNS)}["postgres"]
        assert int(after["total_xact_count"]) == int(before["total_xact_count"]) + 2
        assert int(after["total_query_count"]) > int(before["total_query_count"])
        assert int(after["total_received"]) > int(before["total_received"])
        # the first minute: per-second rates since the process started (every worker's, summed)
        assert int(after["avg_query_count"]) > 0 and int(after["avg_recv"]) > 0 and int(after["avg_sent"]) > 0
    for conn in conns:
        conn.close()
    stats = {r["database"]: r for r in table(dsn, "SHOW STATS", STATS_COLUMNS)}["postgres"]
    assert int(stats["total_xact_count"]) >= int(after["total_xact_count"])  # ended sessions stay counted
    help_ = run(dsn, "SHOW HELP").stdout
    for command in ("SHOW CLIENTS", "PAUSE", "RESUME", "RELOAD", "KILL", "WAIT_CLOSE", "SHUTDOWN", "SUSPEND"):
        assert command in help_
    suspend = run(dsn, "SUSPEND", check=False)
    assert suspend.returncode != 0 and "SUSPEND is not supported" in suspend.stderr
    if workers == 2:  # one set of rows per worker, with its id
        config = run(dsn, "SHOW CONFIG").stdout.splitlines()
        assert {line.rsplit("|", 1)[1] for line in config} == {"1", "2"}


def test_pause_holds_live_sessions_until_resume(start_seat, pg, tmp_path, workers):
    seat, dsn = console(start_seat, tmp_path, workers=workers)
    seat._admin = dsn
    table_name = f"paused_{workers}"
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:
        direct.execute(f"DROP TABLE IF EXISTS {table_name}; CREATE TABLE {table_name} (v text)")
    idle = on_every_worker(seat, workers, "idle")
    busy = psycopg.connect(seat.dsn(application_name="busy"))  # a transaction open across the PAUSE
    busy.execute(f"INSERT INTO {table_name} VALUES ('busy')")
    pause = background(dsn, "PAUSE")
    # PAUSE holds the idle sessions at once, and waits for the one in a transaction
    until(lambda: all(client_of(dsn, c.info.parameter_status("application_name"))["held"] == "t" for c in idle),
          "idle sessions held")
    assert client_of(dsn, "busy")["held"] == "f"
    assert pause.poll() is None, "PAUSE returned while a session was in a transaction"
    state = dict(line.split("|")[:2] for line in run(dsn, "SHOW STATE").stdout.splitlines())
    assert state["accepting"] == "no (paused: PAUSE)"
    status, why = get(seat.metrics_port, "/readyz")
    assert status == 503 and "paused (PAUSE on the admin console)" in why
    busy.commit()  # the transaction ends: now every session is at a boundary
    out, err = pause.communicate(timeout=60)
    assert pause.returncode == 0 and out.strip() == "PAUSE", err
    assert client_of(dsn, "busy")["held"] == "t"
    # the next statement of a live session waits in the seat, unsent, until RESUME
    done = []
    writer = threading.Thread(target=lambda: done.append(
        idle[-1].execute(f"INSERT INTO {table_name} VALUES ('held') RETURNING v").fetchone()))
    writer.start()
    app = idle[-1].info.parameter_status("application_name")
    until(lambda: client_of(dsn, app)["state"] == "waiting", "the statement waiting")
    pools = table(dsn, "SHOW POOLS", POOL_COLUMNS)
    assert sum(int(p["cl_waiting"]) for p in pools) == 1
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:
        assert direct.execute(f"SELECT v FROM {table_name} ORDER BY v").fetchall() == [("busy",)]
    _, text = get(seat.metrics_port, "/metrics")
    assert metric(text, "openwop_seat_paused") == 1.0  # a flag: the maximum over the workers, never 2
    # a setting is not summed over the workers either; a count is
    assert metric(text, "openwop_seat_buffer_limit_bytes") == 1 << 20
    assert metric(text, "openwop_seat_max_client_connections") == 1000 * workers  # a limit per process
    assert metric(text, "openwop_seat_sessions_held") == len(idle) + 1
    assert done == [] and writer.is_alive()
    assert run(dsn, "RESUME").stdout.strip() == "RESUME"
    writer.join(60)
    assert done == [("held",)]
    assert busy.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(seat.dsn()) as fresh:  # accepting again
        assert fresh.execute("SELECT 2").fetchone() == (2,)
    _, text = get(seat.metrics_port, "/metrics")
    assert metric(text, "openwop_seat_paused") == 0.0 and metric(text, "openwop_seat_sessions_held") == 0.0
    for conn in (*idle, busy):
        conn.close()


def test_resume_ends_a_pause_that_waits(start_seat, tmp_path, workers):
    """RESUME while PAUSE still waits for a transaction: the PAUSE fails, the transaction goes on, new connections
    are accepted again."""
    seat, dsn = console(start_seat, tmp_path, workers=workers)
    busy = psycopg.connect(seat.dsn(application_name="busy"))
    busy.execute("SELECT 1")  # psycopg: a transaction is open
    pause = background(dsn, "PAUSE")
    until(lambda: "no (paused: PAUSE)" in run(dsn, "SHOW STATE").stdout, "paused")
    assert pause.poll() is None
    assert run(dsn, "RESUME").stdout.strip() == "RESUME"
    out, err = pause.communicate(timeout=60)
    assert pause.returncode != 0 and "PAUSE ended: RESUME came before every session was held" in err
    assert busy.execute("SELECT 2").fetchone() == (2,)
    busy.commit()
    with psycopg.connect(seat.dsn()) as fresh:
        assert fresh.execute("SELECT 3").fetchone() == (3,)
    assert "no (paused" not in run(dsn, "SHOW STATE").stdout
    busy.close()


def test_kill_a_session_and_a_database(start_seat, tmp_path, workers):
    seat, dsn = console(start_seat, tmp_path, workers=workers)
    seat._admin = dsn
    conns = on_every_worker(seat, workers, "victim")
    for conn in conns:  # one on each worker, killed by its id
        victim = client_of(dsn, conn.info.parameter_status("application_name"))
        assert run(dsn, f"{'KILL_CLIENT' if conn is conns[0] else 'KILL'} {victim['id']}").stdout.strip() == "KILL"
        with pytest.raises(psycopg.OperationalError, match="administrator command"):
            conn.execute("SELECT 1")
    missing = run(dsn, "KILL 999999999", check=False)
    assert missing.returncode != 0 and "no session with id 999999999" in missing.stderr
    others = on_every_worker(seat, workers, "bystander")
    assert run(dsn, "KILL postgres").stdout.strip() == "KILL"  # PgBouncer's KILL db
    for conn in others:
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    assert [r for r in clients(dsn) if r["database"] == "postgres"] == []
    last = on_every_worker(seat, workers, "last")
    invalid = run(dsn, "KILL_CLIENT someone", check=False)
    assert invalid.returncode != 0 and "KILL_CLIENT takes a client id" in invalid.stderr
    assert run(dsn, "KILL").stdout.strip() == "KILL"  # every session
    for conn in last:
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    assert clients(dsn) == []


def test_reload_applies_a_changed_rule(start_seat, tmp_path, workers):
    seat, dsn = console(start_seat, tmp_path, workers=workers)
    seat._admin = dsn
    before = on_every_worker(seat, workers, "legacy-before")
    assert {client_of(dsn, c.info.parameter_status("application_name"))["major"] for c in before} == {"2"}
    text = seat.config_path.read_text()
    seat.config_path.write_text(text + '[[proxy.clients]]\napplication_name = "legacy-after-0"\nmajor = 1\n'
                                '[[proxy.clients]]\napplication_name = "legacy-after-1"\nmajor = 1\n')
    assert run(dsn, "RELOAD").stdout.strip() == "RELOAD"
    after = [psycopg.connect(seat.dsn(application_name=f"legacy-after-{i}"), autocommit=True) for i in range(2)]
    assert {client_of(dsn, f"legacy-after-{i}")["major"] for i in range(2)} == {"1"}
    # the sessions that started before keep their major, and are marked as needing a close
    for conn in before:
        row = client_of(dsn, conn.info.parameter_status("application_name"))
        assert row["major"] == "2" and row["close_needed"] == "1"
    waiter = background(dsn, "WAIT_CLOSE")
    until(lambda: seat.log().count("WAIT_CLOSE waiting") == workers, "WAIT_CLOSE waiting in every process")
    assert waiter.poll() is None, "WAIT_CLOSE returned while sessions of the old configuration were open"
    for conn in before:
        conn.close()
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0 and out.strip() == "WAIT_CLOSE", err
    # a broken file: RELOAD says why, and the running configuration stays
    seat.config_path.write_text(text + "[proxy.nonsense\n")
    bad = run(dsn, "RELOAD", check=False)
    assert bad.returncode != 0 and "RELOAD rejected" in bad.stderr and "invalid TOML" in bad.stderr
    config = dict(line.split("|")[:2] for line in run(dsn, "SHOW CONFIG").stdout.splitlines())
    assert "application_name=legacy-after-0, major=1" in config["proxy.clients"]
    for conn in after:
        conn.close()


def test_reload_applies_new_admin_users(start_seat, tmp_path, workers):
    seat, dsn = console(start_seat, tmp_path, workers=workers)
    refused = run(dsn, "SHOW VERSION", user="second", password="second-pw", check=False)
    assert refused.returncode != 0 and "password authentication failed" in refused.stderr
    auth_file = tmp_path / "admin-users.txt"
    auth_file.write_text(auth_file.read_text() + '"second" "second-pw"\n')
    text = seat.config_path.read_text()
    assert 'users = ["ops"]' in text
    seat.config_path.write_text(text.replace('users = ["ops"]', 'users = ["ops", "second"]'))
    assert run(dsn, "RELOAD").stdout.strip() == "RELOAD"
    assert run(dsn, "SHOW VERSION", user="second", password="second-pw").stdout.strip()


def test_shutdown(start_seat, tmp_path, workers):
    seat, dsn = console(start_seat, tmp_path, workers=workers)
    conn = psycopg.connect(seat.dsn(), autocommit=True)
    out = run(dsn, "SHUTDOWN", check=False)
    assert "SHUTDOWN" in out.stdout or out.returncode != 0  # the reply may race the process's exit
    assert seat.proc.wait(30) == 0, seat.log()
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")
    assert "admin SHUTDOWN" in seat.log()


def test_shutdown_wait_for_clients(start_seat, tmp_path, workers):
    """SHUTDOWN WAIT_FOR_CLIENTS: stop accepting, serve the sessions there are until their clients leave, then
    exit 0 (a drain in shutdown_mode "drain", whatever proxy.shutdown_mode says); also out of a PAUSE."""
    seat, dsn = console(start_seat, tmp_path, workers=workers, shutdown_mode="idle", shutdown_timeout=60)
    seat._admin = dsn
    conns = on_every_worker(seat, workers, "staying")
    assert run(dsn, "PAUSE").stdout.strip() == "PAUSE"
    assert run(dsn, "SHUTDOWN WAIT_FOR_CLIENTS").stdout.strip() == "SHUTDOWN"
    processes = workers + (workers > 1)  # each worker logs "draining", and the supervisor
    until(lambda: seat.log().count("draining") >= processes, "every process draining")
    for i, conn in enumerate(conns):  # released from the PAUSE, and not ended while idle
        assert conn.execute("SELECT %s::int", (i,)).fetchone() == (i,)
    assert seat.alive()
    for conn in conns:
        conn.close()
    assert seat.proc.wait(30) == 0


def test_console_is_never_open_by_default(start_seat, tmp_path, workers):
    """A console without admin users, or whose users have no secret, stops the start with exit 2, naming why."""
    seat = start_seat(proxy={"workers": workers}, extra={"admin": {"listen": f"127.0.0.1:{free_port()}"}},
                      wait=False)
    assert seat.proc.wait(60) == 2
    assert "admin.users and admin.auth_file: required" in seat.log()
    auth_file = tmp_path / "users.txt"
    auth_file.write_text('"someone" "pw"\n')
    seat = start_seat(proxy={"workers": workers}, wait=False, extra={"admin": {
        "listen": f"127.0.0.1:{free_port()}", "users": ["ops"], "auth_file": str(auth_file)}})
    assert seat.proc.wait(60) == 2
    assert "admin.users: 'ops' has no line in admin.auth_file" in seat.log()
    assert seat.log().count("has no line") == 1  # said once, by the process that runs the console


def test_a_worker_restarted_during_a_pause_is_paused_too(start_seat, tmp_path):
    seat, dsn = console(start_seat, tmp_path, workers=2)
    assert run(dsn, "PAUSE").stdout.strip() == "PAUSE"
    os.kill(worker_pids(seat)[1], signal.SIGKILL)
    until(lambda: len(re.findall(r"worker started worker=1 ", seat.log())) == 2, "worker 1 restarted")

    def accepting() -> dict[str, str]:  # SHOW STATE with workers: key, value, worker
        lines = [line.split("|") for line in run(dsn, "SHOW STATE").stdout.splitlines()]
        return {w: v for k, v, w in lines if k == "accepting"}

    until(lambda: accepting() == {"1": "no (paused: PAUSE)", "2": "no (paused: PAUSE)"}, "both workers paused")
    assert run(dsn, "RESUME").stdout.strip() == "RESUME"
    assert accepting() == {"1": "yes", "2": "yes"}
    with psycopg.connect(seat.dsn()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_sighup_applies_admin_users_in_the_supervisor(start_seat, tmp_path):
    seat, dsn = console(start_seat, tmp_path, workers=2,
                        lines=[f'"ops" "{scram_secret(ADMIN_PW)}"', '"second" "second-pw"'])
    text = seat.config_path.read_text()
    seat.config_path.write_text(text.replace('users = ["ops"]', 'users = ["ops", "second"]'))
    seat.proc.send_signal(signal.SIGHUP)  # to the supervisor, which runs the console
    until(lambda: run(dsn, "SHOW VERSION", user="second", password="second-pw", check=False).returncode == 0,
          "the new admin user let in")
    seat.config_path.write_text(text)
    seat.proc.send_signal(signal.SIGHUP)
    until(lambda: run(dsn, "SHOW VERSION", user="second", password="second-pw", check=False).returncode != 0,
          "the removed admin user refused")


def test_session_ids_are_not_reused_after_a_worker_restart(start_seat, tmp_path):
    seat, dsn = console(start_seat, tmp_path, workers=2)
    seat._admin = dsn
    before = on_every_worker(seat, 2, "before")
    ids_before = {int(r["id"]) for r in clients(dsn)}
    for conn in before:
        conn.close()
    os.kill(worker_pids(seat)[1], signal.SIGKILL)
    until(lambda: len(re.findall(r"worker started worker=1 ", seat.log())) == 2, "worker 1 restarted")
    after = on_every_worker(seat, 2, "after")
    ids_after = {int(r["id"]) for r in clients(dsn) if r["application_name"].startswith("after-")}
    assert len(ids_after) == len(after)
    assert not ids_after & ids_before, (ids_before, ids_after)  # the restarted worker numbers past its earlier ids
    (restarted,) = {i % 2 for i in ids_after} & {1}  # worker 1 numbers 1, 3, 5, …
    assert min(i for i in ids_after if i % 2 == restarted) > max(ids_before)
    for conn in after:
        conn.close()
