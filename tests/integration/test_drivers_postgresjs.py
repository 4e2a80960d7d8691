"""postgres.js (npm `postgres`, tests/node) through the seat: tests/node/postgresjs.js.

Variants: the driver's defaults (``prepare: true``: each statement a named prepared statement), ``prepare:
false`` (unnamed, described before each run), and a ``.cursor(n)`` read (one portal executed n rows at a
time). Checked as tests/integration/drivers.py says.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import drivers
import pytest
from drivers import PAGE_SIZE, TRANSLATED_VIEW

NODE_DIR = drivers.ROOT / "tests" / "node"
SCRIPT = NODE_DIR / "postgresjs.js"
VARIANTS = {"prepare": {"prepare": True}, "no-prepare": {"prepare": False},
            "cursor": {"prepare": True, "cursor": True}}


def run_js(request: dict) -> dict:
    assert (NODE_DIR / "node_modules" / "postgres").is_dir(), "postgres.js is required (npm ci --prefix tests/node)"
    proc = subprocess.run([shutil.which("node"), str(SCRIPT)], input=json.dumps(request), cwd=NODE_DIR,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"postgresjs.js {request['mode']} exited {proc.returncode}:\n{proc.stderr}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def era2_run(pg):
    return drivers.seed_read_run(pg, "drv-postgresjs")


def url(port: int) -> str:
    return f"postgres://postgres@127.0.0.1:{port}/postgres"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_major2_read(pg, seat, era2_run, variant):
    run_id, events = era2_run
    request = {"mode": "read", "runId": run_id, "pageSize": PAGE_SIZE, **VARIANTS[variant]}
    direct = run_js({**request, "url": url(pg.port), "table": TRANSLATED_VIEW})
    via = run_js({**request, "url": url(seat.port), "table": "events"})
    assert all(list(r) == drivers.COLUMNS for r in via["rows"])
    drivers.check_read(pg, run_id, events, via["rows"], direct["rows"], f"postgres.js {variant}")


@pytest.mark.parametrize("variant", ["prepare", "no-prepare"])
def test_host_append(pg, seat, variant):
    run_id = drivers.new_append_run(pg, f"drv-postgresjs-{variant}")
    sent = drivers.append_events(run_id)
    out = run_js({"mode": "append", "url": url(seat.port), "runId": run_id, "events": drivers.wire_events(sent),
                  **VARIANTS[variant]})
    assert all(list(r) == drivers.COLUMNS for r in out["rows"])
    drivers.check_append(pg, run_id, sent, out["rows"], f"postgres.js append {variant}")
