"""Configuration parsing (strict keys) and the command line."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

from harness import ROOT, render_config, wait_listening
from harness import seat_cli as cli
from proxy.dev.devcluster import free_port


def test_serve_port_in_use_fails_cleanly(seat, tmp_path):
    relay = tmp_path / "relay.toml"
    relay.write_text('[proxy]\ndefault_major = "raw"\n')
    out = cli("serve", "--config", str(relay), "--listen", f"127.0.0.1:{seat.port}", "--upstream", "127.0.0.1:1")
    assert out.returncode == 1 and "address already in use" in out.stderr.lower()


def test_env_config_and_flag_overrides_and_major_logged(pg, tmp_path):
    port, metrics_port = free_port(), free_port()
    path = tmp_path / "seat.toml"
    path.write_text(render_config({
        "proxy": {"listen": "127.0.0.1:1", "upstream": "127.0.0.1:1", "default_major": 2,
                  "clients": [{"application_name": "old-host", "major": 1}]},
        "host": {"dsn": pg.dsn()},
        "log": {"format": "json"},
    }))
    log = tmp_path / "seat.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}", "--upstream",
         f"127.0.0.1:{pg.port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"],
        cwd=ROOT, env={**os.environ, "OPENWOP_SEAT_CONFIG": str(path)}, stderr=open(log, "wb"))
    try:
        wait_listening(port, proc)
        wait_listening(metrics_port, proc)
        dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        with psycopg.connect(dsn, application_name="old-host") as conn:
            conn.execute("SELECT 1")
        with psycopg.connect(dsn, application_name="new-host") as conn:
            conn.execute("SELECT 1")
    finally:
        proc.terminate()
        proc.wait(15)
    import json
    starts = [json.loads(line) for line in log.read_text().splitlines() if '"session start"' in line]
    assert [(s["application_name"], s["major"]) for s in starts] == [("old-host", 1), ("new-host", 2)]
    assert all(s["user"] == "postgres" and s["database"] == "postgres" and s["client"] for s in starts)


