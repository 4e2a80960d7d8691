"""Go drivers through the seat: pgx v4 and lib/pq, Debian's packages (golang-github-jackc-pgx-v4-dev,
golang-github-lib-pq-dev), tests/drivers/go/seatgo built once per run in GOPATH mode, offline.

pgx runs on its defaults (statement_cache_mode=prepare: the page statement becomes a named statement on its
first use, its results binary for the types pgx knows) and with statement_cache_mode=describe (unnamed
statements, result formats chosen from a cached description). lib/pq reads with db.Query (an unnamed
statement each time, text results) and with a prepared *sql.Stmt (a named one). Each is checked as
tests/integration/drivers.py says: through the seat against the same program reading the seat's
translated view directly, the oracle and the fixtures; the host's append path against RETURNING, the stored
rows and the view.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import drivers
import pytest
from drivers import PAGE_SIZE, TRANSLATED_VIEW

SOURCE = drivers.DRIVERS_DIR / "go" / "seatgo"
GOPATH = "/usr/share/gocode"  # Debian's Go packages
VARIANTS = {
    "pgx-defaults": ("pgx", {}, False),
    "pgx-describe": ("pgx", {"statement_cache_mode": "describe"}, False),
    "pq-query": ("pq", {"sslmode": "disable"}, False),
    "pq-prepared": ("pq", {"sslmode": "disable"}, True),
}


@pytest.fixture(scope="module")
def seatgo(tmp_path_factory) -> Path:
    for pkg in ("github.com/jackc/pgx/v4", "github.com/lib/pq"):
        assert (Path(GOPATH) / "src" / pkg).is_dir(), f"{pkg} missing from {GOPATH}: see .ci/run's apt-get line"
    out = tmp_path_factory.mktemp("go") / "seatgo"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": GOPATH, "GOFLAGS": "",
           "GOCACHE": os.environ.get("GOCACHE") or str(Path.home() / ".cache" / "go-build")}
    build = subprocess.run([shutil.which("go"), "build", "-o", str(out), "."], cwd=SOURCE, env=env,
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    return out


def url(port: int, **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"postgres://postgres@127.0.0.1:{port}/postgres" + (f"?{query}" if query else "")


def run_go(seatgo: Path, request: dict) -> dict:
    proc = subprocess.run([str(seatgo)], input=json.dumps(request), capture_output=True, text=True, timeout=120)
    where = f"seatgo {request['driver']} {request['mode']}"
    assert proc.returncode == 0, f"{where} exited {proc.returncode}:\n{proc.stderr}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def era2_run(pg):
    return drivers.seed_read_run(pg, "drv-go")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_major2_read(pg, seat, seatgo, era2_run, variant):
    run_id, events = era2_run
    driver, params, prepared = VARIANTS[variant]
    request = {"driver": driver, "mode": "read", "runId": run_id, "pageSize": PAGE_SIZE, "prepared": prepared}
    direct = run_go(seatgo, {**request, "url": url(pg.port, **params), "table": TRANSLATED_VIEW})
    via = run_go(seatgo, {**request, "url": url(seat.port, **params), "table": "events"})
    drivers.check_read(pg, run_id, events, via["rows"], direct["rows"], variant)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_host_append(pg, seat, seatgo, variant):
    driver, params, _ = VARIANTS[variant]
    run_id = drivers.new_append_run(pg, f"drv-{variant}-append")
    sent = drivers.append_events(run_id)
    out = run_go(seatgo, {"driver": driver, "mode": "append", "url": url(seat.port, **params), "runId": run_id,
                          "events": drivers.wire_events(sent)})
    drivers.check_append(pg, run_id, sent, out["rows"], f"{variant} append")
