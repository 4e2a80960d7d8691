"""Lifecycle across seats: a rolling restart on one port (proxy.so_reuseport), and startup errors that name the
failing part (a listen address that cannot be bound is not a host-database error)."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time

import psycopg

from harness import ROOT, render_config
from proxy.dev.devcluster import free_port


def test_rolling_restart_on_one_port_refuses_no_client(start_seat):
    old = start_seat(proxy={"so_reuseport": True, "shutdown_timeout": 30})
    pooled = psycopg.connect(old.dsn(), autocommit=True)  # an idle pooled connection on the old seat
    pooled.execute("SELECT 1")
    errors: list[str] = []
    served = [0]
    stop = threading.Event()

    def clients():
        while not stop.is_set():
            try:
                with psycopg.connect(old.dsn(), connect_timeout=10) as c:
                    assert c.execute("SELECT 7").fetchone() == (7,)
                served[0] += 1
            except Exception as e:  # noqa: BLE001 - every failure is a refused client
                errors.append(repr(e))

    threads = [threading.Thread(target=clients, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        new = start_seat(proxy={"so_reuseport": True, "listen": f"127.0.0.1:{old.port}"})
        deadline = time.monotonic() + 20
        while "session start" not in new.log():  # the kernel hands the new seat its share
            assert time.monotonic() < deadline, "the new seat got no connection"
            time.sleep(0.05)
        old.proc.send_signal(signal.SIGTERM)
        assert old.proc.wait(20) == 0, old.log()  # drained: the idle pooled connection did not hold it
        before = served[0]
        time.sleep(1.0)
        assert served[0] > before  # the new seat alone serves on the port
    finally:
        stop.set()
        for t in threads:
            t.join(20)
    assert not errors, errors[:5]
    assert "draining" in old.log() and "stopped" in old.log()
    try:
        pooled.execute("SELECT 1")
        raise AssertionError("the idle pooled connection outlived the old seat")
    except psycopg.OperationalError:
        pass
    pooled.close()
    with psycopg.connect(new.dsn()) as c:  # the pool reconnects: to the new seat
        assert c.execute("SELECT 1").fetchone() == (1,)
    assert new.stop(signal.SIGTERM) == 0


def _serve(pg, tmp_path, listen: str, metrics: str, workers: int = 1) -> subprocess.CompletedProcess:
    config = tmp_path / "seat.toml"
    config.write_text(render_config({
        "proxy": {"listen": listen, "upstream": f"127.0.0.1:{pg.port}", "workers": workers},
        "metrics": {"listen": metrics},
        "host": {"dsn": pg.dsn()},
    }))
    return subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _occupied() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock, sock.getsockname()[1]


def test_a_metrics_port_in_use_is_named_as_metrics_listen(pg, tmp_path):
    for workers in (1, 2):
        sock, port = _occupied()
        try:
            out = _serve(pg, tmp_path, f"127.0.0.1:{free_port()}", f"127.0.0.1:{port}", workers)
        finally:
            sock.close()
        assert out.returncode == 1, out.stderr
        assert re.search(rf"cannot listen on 127\.0\.0\.1:{port} \(metrics\.listen\): .*in use", out.stderr), out.stderr
        assert "host database" not in out.stderr and "host.dsn" not in out.stderr


def test_a_listen_port_in_use_is_named_as_proxy_listen(pg, tmp_path):
    for workers in (1, 2):
        sock, port = _occupied()
        try:
            out = _serve(pg, tmp_path, f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}", workers)
        finally:
            sock.close()
        assert out.returncode == 1, out.stderr
        assert re.search(rf"cannot listen on 127\.0\.0\.1:{port} \(proxy\.listen\): .*in use", out.stderr), out.stderr
        assert "host database" not in out.stderr and "host.dsn" not in out.stderr
