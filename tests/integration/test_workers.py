"""[proxy] workers = 2: processes sharing the port (SO_REUSEPORT) under a supervisor.

Which worker holds a connection is read from the kernel (/proc: the accepted socket's inode in
/proc/net/tcp, found among a worker's open files), so a test can pick a connection on a given
worker before it sends a byte; a CancelRequest is the first and only packet of its connection.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

import psycopg
import pytest
from rawpg import RawConn, error_fields, query
from test_metrics import get, metric
from test_signals import refuses_connections

from harness import ROOT
from proxy.config import ConfigError, parse_config

# Linux only (reads /proc; SO_REUSEPORT balancing), like the project's machines.

CANCEL_CODE = 80877102


def worker_pids(seat, count: int = 2, timeout: float = 20, exclude: set[int] = frozenset()) -> dict[int, int]:
    """{worker id: pid} from the supervisor's "worker started" lines, once `count` workers (not in exclude) are up."""
    deadline = time.monotonic() + timeout
    while True:
        pids = {int(w): int(p) for w, p in re.findall(r"worker started worker=(\d+) pid=(\d+)", seat.log())}
        if len(pids) >= count and not set(pids.values()) & set(exclude):
            return pids
        assert time.monotonic() < deadline, f"workers not started: {seat.log()}"
        time.sleep(0.05)


def holder(seat, sock: socket.socket, pids, timeout: float = 5) -> int:
    """The pid of the worker that accepted the seat side of this client socket."""
    local = f"0100007F:{seat.port:04X}"
    remote = f"0100007F:{sock.getsockname()[1]:04X}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/net/tcp") as f:
            inodes = [fields[9] for fields in (line.split() for line in f.readlines()[1:])
                      if fields[1] == local and fields[2] == remote]
        for inode in inodes:
            if inode == "0":  # still in the accept queue
                continue
            for pid in pids:
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except OSError:
                    continue
                for fd in fds:
                    try:
                        if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                            return pid
                    except OSError:
                        pass
        time.sleep(0.02)
    raise AssertionError("no worker holds the connection")


def sessions_on_each_worker(seat, pids) -> dict[int, RawConn]:
    """Logged-in raw sessions, one held by each worker pid."""
    found: dict[int, RawConn] = {}
    spare = []
    for _ in range(100):
        conn = RawConn(seat.port)
        conn.login()
        pid = holder(seat, conn.sock, pids)
        if pid in found:
            spare.append(conn)
        else:
            found[pid] = conn
        if len(found) == len(pids):
            break
    for conn in spare:
        conn.close()
    assert len(found) == len(pids), "connections never reached every worker"
    return found


def select_one(conn: RawConn, value: int = 1) -> None:
    conn.send(query(f"SELECT {value}"))
    messages = conn.read_until(b"Z")
    assert [t for t, _ in messages] == [b"T", b"D", b"C", b"Z"], messages


def test_workers_key():
    assert parse_config({"proxy": {"workers": 3}}).workers == 3
    cpus = len(os.sched_getaffinity(0))
    assert parse_config({}).workers == cpus  # the default is one worker per CPU this process may use
    assert parse_config({"proxy": {"workers": "auto"}}).workers == cpus
    assert parse_config({"proxy": {"workers": 1}}).workers == 1
    for bad in (0, -1, 1.5, True, "many"):
        with pytest.raises(ConfigError, match="proxy.workers"):
            parse_config({"proxy": {"workers": bad}})


def test_connections_spread_over_both_workers(start_seat):
    seat = start_seat(proxy={"workers": 2})
    pids = worker_pids(seat)
    assert len(set(pids.values())) == 2 and seat.proc.pid not in pids.values()
    conns = []
    for _ in range(16):
        conn = RawConn(seat.port)
        conn.login()
        conns.append(conn)
    ports = {conn.sock.getsockname()[1] for conn in conns}
    logged = {}
    for line in seat.log().splitlines():
        m = re.search(r"session start .*client=127\.0\.0\.1:(\d+) .*worker=(\d+) pid=(\d+)", line)
        if m and int(m.group(1)) in ports:
            logged[int(m.group(1))] = (int(m.group(2)), int(m.group(3)))
    assert len(logged) == 16
    assert set(logged.values()) == set(pids.items())  # both workers, each logging its id and pid
    for conn in conns:
        select_one(conn)
        conn.close()


def sleeping(pg, backend_pid: int, timeout: float = 20) -> None:
    """Wait until the backend runs its pg_sleep: a cancel that came before the statement would cancel nothing."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(pg.dsn(), autocommit=True) as watch:
        while watch.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                            (backend_pid,)).fetchone() != ("PgSleep",):
            assert time.monotonic() < deadline, "the statement never started"
            time.sleep(0.01)


def test_cancel_from_one_worker_reaches_a_query_on_the_other(start_seat, pg):
    seat = start_seat(proxy={"workers": 2})
    pids = set(worker_pids(seat).values())
    conn = RawConn(seat.port, timeout=30)
    key = next(body for t, body in conn.login() if t == b"K")
    backend_pid, secret = struct.unpack("!II", key)
    serving = holder(seat, conn.sock, pids)
    conn.send(query("SELECT pg_sleep(30)"))
    sleeping(pg, backend_pid)
    for _ in range(100):  # a fresh connection that the other worker accepted
        cancel = socket.create_connection(("127.0.0.1", seat.port))
        if holder(seat, cancel, pids) != serving:
            break
        cancel.close()
    else:
        pytest.fail("no connection reached the other worker")
    started = time.monotonic()
    cancel.sendall(struct.pack("!IIII", 16, CANCEL_CODE, backend_pid, secret))
    cancel.close()
    messages = conn.read_until(b"Z")
    errors = [error_fields(body) for t, body in messages if t == b"E"]
    assert errors and errors[0]["C"] == "57014", messages
    assert time.monotonic() - started < 10
    select_one(conn)  # the session goes on
    conn.close()


def test_a_killed_worker_is_restarted_while_the_other_serves(start_seat):
    seat = start_seat(proxy={"workers": 2})
    pids = worker_pids(seat)
    sessions = sessions_on_each_worker(seat, set(pids.values()))
    victim_id, victim = next(iter(pids.items()))
    survivor = next(pid for pid in pids.values() if pid != victim)
    for pid, conn in sessions.items():
        if pid == victim:
            conn.close()
    conn = sessions[survivor]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 20
    i = 0
    while True:  # the survivor's session keeps working throughout the restart
        i += 1
        select_one(conn, i)
        new = {int(w): int(p) for w, p in re.findall(r"worker started worker=(\d+) pid=(\d+)", seat.log())}
        if new.get(victim_id) not in (None, victim):
            break
        assert time.monotonic() < deadline, "the killed worker was not restarted"
        time.sleep(0.02)
    assert i > 1
    replacement = new[victim_id]
    assert new[next(w for w in pids if w != victim_id)] == survivor
    assert "worker exited: restarting" in seat.log() and seat.alive()
    # Both the survivor and the replacement take new connections.
    sessions = sessions_on_each_worker(seat, {survivor, replacement})
    for c in sessions.values():
        select_one(c)
        c.close()
    select_one(conn)
    conn.close()
    _, text = get(seat.metrics_port, "/metrics")
    assert metric(text, "openwop_seat_worker_restarts_total") == 1
    assert metric(text, "openwop_seat_workers_up") == 2


def test_sigterm_drains_both_workers_and_exits_0(start_seat):
    seat = start_seat(proxy={"workers": 2, "shutdown_timeout": 30, "shutdown_mode": "drain"})
    pids = worker_pids(seat)
    sessions = sessions_on_each_worker(seat, set(pids.values()))
    seat.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not refuses_connections(seat.port):
        assert time.monotonic() < deadline, "still accepting after SIGTERM"
        time.sleep(0.05)
    assert get(seat.metrics_port, "/readyz")[0] == 503
    for i in range(3):  # the live sessions on both workers keep working while they drain
        for conn in sessions.values():
            select_one(conn, i)
    assert seat.alive() and all(os.path.exists(f"/proc/{pid}") for pid in pids.values())
    for conn in sessions.values():
        conn.close()
    assert seat.proc.wait(10) == 0
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()
    log = seat.log()
    assert log.count("draining") >= 3 and "stopped" in log  # the supervisor and both workers


def test_sigint_closes_at_once_and_sighup_is_forwarded(start_seat):
    seat = start_seat(proxy={"workers": 2, "shutdown_timeout": 60})
    pids = worker_pids(seat)
    with psycopg.connect(seat.dsn(), autocommit=True) as conn:
        seat.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert seat.alive() and conn.execute("SELECT 1").fetchone() == (1,)
        assert "SIGHUP received: forwarding" in seat.log()
        assert all(os.path.exists(f"/proc/{pid}") for pid in pids.values())
        seat.proc.send_signal(signal.SIGINT)
        assert seat.proc.wait(10) == 0
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")


def test_metrics_aggregate_both_workers(start_seat):
    seat = start_seat(proxy={"workers": 2})
    pids = worker_pids(seat)
    _, before = get(seat.metrics_port, "/metrics")
    sessions = sessions_on_each_worker(seat, set(pids.values()))
    status, text = get(seat.metrics_port, "/metrics")
    assert status == 200
    assert metric(text, "openwop_seat_client_connections_open") == 2
    assert metric(text, "openwop_seat_upstream_connections_open") == 2
    assert metric(text, "openwop_seat_sessions_total") >= metric(before, "openwop_seat_sessions_total") + 2
    assert metric(text, "openwop_seat_workers") == 2 and metric(text, "openwop_seat_workers_up") == 2
    assert "# TYPE openwop_seat_sessions_total counter" in text
    assert len(re.findall(r"^openwop_seat_build_info\{.*\} 1\.0$", text, re.M)) == 1
    assert get(seat.metrics_port, "/healthz") == (200, "ok\n")
    assert get(seat.metrics_port, "/readyz") == (200, "ready\n")
    for conn in sessions.values():
        conn.close()
    deadline = time.monotonic() + 5
    while metric(get(seat.metrics_port, "/metrics")[1], "openwop_seat_client_connections_open") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_second_seat_cannot_join_the_port(start_seat, tmp_path):
    seat = start_seat(proxy={"workers": 2})
    worker_pids(seat)
    relay = tmp_path / "relay.toml"
    relay.write_text('[proxy]\ndefault_major = "raw"\nworkers = 2\n')
    out = subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", str(relay), "--listen",
                          f"127.0.0.1:{seat.port}", "--upstream", "127.0.0.1:1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 1 and "cannot listen on" in out.stderr and "in use" in out.stderr


def test_sigusr1_pauses_every_worker_sigusr2_resumes_and_sigquit_stops(start_seat):
    """The supervisor handles every signal: it forwards SIGUSR1/SIGUSR2 (pause/resume) and SIGQUIT (close now) to
    its workers and exits only once they have, leaving none behind."""
    from test_signals import _connect_in_background, _readyz

    seat = start_seat(proxy={"workers": 2, "shutdown_timeout": 60})
    pids = worker_pids(seat)
    sessions = sessions_on_each_worker(seat, set(pids.values()))
    seat.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while seat.log().count("paused: new connections wait") < 2:
        assert time.monotonic() < deadline, seat.log()
        time.sleep(0.05)
    assert seat.alive() and all(os.path.exists(f"/proc/{pid}") for pid in pids.values())
    status, body = _readyz(seat)
    assert status == 503 and "paused" in body
    waiting = [_connect_in_background(seat.dsn()) for _ in range(4)]
    time.sleep(1.0)
    assert all(thread.is_alive() and not result for thread, result in waiting)
    for i, conn in enumerate(sessions.values()):  # live sessions on both workers go on
        select_one(conn, i)
    seat.proc.send_signal(signal.SIGUSR2)
    for thread, result in waiting:
        thread.join(15)
        assert result.get("value") == 42, result
    assert _readyz(seat)[0] == 200
    seat.proc.send_signal(signal.SIGQUIT)
    assert seat.proc.wait(10) == 0
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()
    for conn in sessions.values():
        conn.close()
