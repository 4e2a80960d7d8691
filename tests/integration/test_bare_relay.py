"""The bench's floor (issue 27), bench/bare_relay.py: a bare uvloop relay that forwards bytes both ways unread.

`make bench` measures it beside the seat and PgBouncer; here only that it relays: psql's SELECT 1, a TLS session
(the relay never reads the bytes, so PostgreSQL's own TLS passes through it), and a short pgbench run, then a
clean stop on SIGINT.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from harness import ROOT, wait_listening
from proxy.dev.devcluster import free_port


@pytest.fixture
def relay(pg, tmp_path):
    port = free_port()
    log = open(tmp_path / "bare_relay.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "bench.bare_relay", "--listen", str(port),
                             "--upstream", f"127.0.0.1:{pg.port}"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_listening(port, proc)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(10)
        log.close()


def psql(port: int, sql: str, **params: str) -> subprocess.CompletedProcess:
    dsn = " ".join([f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                    *(f"{k}={v}" for k, v in params.items())])
    return subprocess.run(["psql", "-X", "-At", "-d", dsn, "-c", sql], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PGCONNECT_TIMEOUT": "10"})


def test_psql_select_1_through_the_bare_relay(relay):
    proc, port = relay
    done = psql(port, "SELECT 1", sslmode="disable")
    assert done.returncode == 0 and done.stdout == "1\n", done.stderr
    # TLS end to end: the relay forwards the SSLRequest and the handshake as bytes
    done = psql(port, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", sslmode="require")
    assert done.returncode == 0 and done.stdout == "t\n", done.stderr
    proc.send_signal(signal.SIGINT)
    assert proc.wait(10) == 0


def test_pgbench_through_the_bare_relay(relay, pg):
    _, port = relay
    pgbench = os.path.join(pg.bin, "pgbench")
    done = subprocess.run([pgbench if os.path.exists(pgbench) else "pgbench", "-n", "-c", "4", "-j", "2", "-t", "50",
                           "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-M", "extended",
                           "-f", "/dev/stdin", "postgres"], input="SELECT 1;\n", capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^number of transactions actually processed: 200/200$", done.stdout, re.M), done.stdout
