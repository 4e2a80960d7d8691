"""Issue 25's friction, the parts that need a cluster: `serve` refusing a major 2 without a claim secret, a start
error said once with workers > 1, `migrate` and the cutover tools naming every missing GRANT before they start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from harness import HOST_SCHEMA, ROOT, render_config, wait_listening
from proxy.dev.devcluster import free_port

SECRET_ENV = "OPENWOP_SEAT_CLAIM_SECRET"


@pytest.fixture
def host_db(pg):
    name = f"f_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {name}")
    pg.psql(HOST_SCHEMA, dbname=name)
    yield name
    pg.psql(f"DROP DATABASE {name} WITH (FORCE)", check=False)


def _env(secret: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret:
        env[SECRET_ENV] = os.environ[SECRET_ENV]
    return env


def _config(tmp_path, pg, dbname: str, **proxy) -> str:
    path = tmp_path / f"seat-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(render_config({
        "proxy": {"listen": f"127.0.0.1:{free_port()}", "upstream": f"127.0.0.1:{pg.port}", "workers": 1,
                  **proxy},
        "host": {"dsn": pg.dsn(dbname=dbname)},
    }))
    return str(path)


def _serve(config: str, secret: bool, timeout: float = 40) -> subprocess.CompletedProcess:
    # A seat that does start would run forever: the timeout turns that into a failure.
    return subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", config], cwd=ROOT, env=_env(secret),
                          capture_output=True, text=True, timeout=timeout)


def _migrate(pg, dbname: str, user: str = "postgres", secret: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=dbname, user=user)],
                          cwd=ROOT, env=_env(secret), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("proxy,why", [
    ({}, "proxy.default_major = 2"),
    ({"default_major": 1, "clients": [{"user": "v2host", "major": 2}]}, "proxy.clients[0] (major = 2)"),
    ({"workers": 2}, "proxy.default_major = 2"),
])
def test_serve_refuses_major_2_without_a_claim_secret(pg, host_db, tmp_path, proxy, why):
    assert _migrate(pg, host_db).returncode == 0
    out = _serve(_config(tmp_path, pg, host_db, **proxy), secret=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("openwop-seat: configuration error: claim secret: none configured") == 1, out.stderr
    assert f"but {why} gives sessions major 2" in out.stderr


def test_serve_without_a_secret_starts_when_no_session_gets_major_2(pg, host_db, tmp_path):
    assert _migrate(pg, host_db).returncode == 0
    config = _config(tmp_path, pg, host_db, default_major=1, clients=[{"user": "ops", "major": "raw"}])
    port = int(open(config).read().split('listen = "127.0.0.1:')[1].split('"')[0])
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", config], cwd=ROOT,
                            env=_env(False), stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, proc)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)


def test_serve_with_workers_says_its_start_error_once(pg, host_db, tmp_path):
    out = _serve(_config(tmp_path, pg, host_db, workers=2), secret=True)  # not migrated
    assert out.returncode == 1
    assert out.stderr.count("openwop-seat serve:") == 1, out.stderr
    assert "migrate" in out.stderr
