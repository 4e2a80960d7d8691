"""The payload projection's choices where the spec is silent (issue 17, ADR 0007), each as a tested rule.

The fixture cases in payload-projection-v2 read the default carrier through the seat; this file pins the
carrier setting (validated against the hatch grammar and declaration.json, generated into the SQL), the
second carrier, and that the enums the generated SQL holds are the vendored schemas' own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from harness import HOST_SCHEMA, ROOT, render_config
from proxy.artifacts.load import load_artifacts
from proxy.db.projection_sql import projection_sql

ARTIFACTS = load_artifacts()
SCHEMAS = Path(__file__).resolve().parents[2] / "proxy" / "spec" / "schemas" / "v2"


@pytest.fixture(scope="module")
def vendor_carrier(pg):
    """The projection functions generated with carrier vendor.openwop-app, in a schema of their own (the
    seats of this test session use the default carrier in openwop_seat)."""
    with psycopg.connect(pg.dsn(dbname="postgres"), autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS pp_vendor_carrier CASCADE; CREATE SCHEMA pp_vendor_carrier")
        conn.execute(projection_sql("pp_vendor_carrier", ARTIFACTS, "vendor.openwop-app"))
        yield conn
        conn.execute("DROP SCHEMA pp_vendor_carrier CASCADE")


def _project(conn, t2: str, payload: dict, tenant: str | None = "acme"):
    return conn.execute("SELECT val::text, unseated, boxed FROM pp_vendor_carrier.project_v2(%s, %s::jsonb, "
                        "'n-1', 'r-1', %s)", (t2, json.dumps(payload), tenant)).fetchone()


def test_the_configured_carrier_boxes_keys_without_a_seat(vendor_carrier):
    val, unseated, boxed = _project(vendor_carrier, "variable.changed", {"name": "t", "value": 2, "x-v1": 1})
    assert (json.loads(val), unseated, boxed) == ({"name": "t", "x-v1": 1, "vendor.openwop-app": {"value": 2}}, [], 1)
    val, _, _ = _project(vendor_carrier, "node.suspended", {"nodeId": "n-1", "interruptId": "i", "kind": "timer"})
    assert json.loads(val)["vendor.openwop-app"] == {"kind": "timer"}


def test_a_carrier_the_host_wrote_is_left_alone_and_the_second_carrier_used(vendor_carrier):
    host = {"ui": True}
    val, unseated, boxed = _project(vendor_carrier, "variable.changed",
                                    {"name": "t", "value": 2, "vendor.openwop-app": host})
    assert json.loads(val) == {"name": "t", "vendor.openwop-app": host, "vendor.openwop-app.seat": {"value": 2}}
    assert (unseated, boxed) == ([], 1)
    _, unseated, _ = _project(vendor_carrier, "variable.changed",
                              {"name": "t", "value": 2, "vendor.openwop-app": host, "vendor.openwop-app.seat": 1})
    assert unseated == ["value"]  # both taken: refused, never merged into the host's value


def _migrate(pg, db: str, config) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
    return subprocess.run([sys.executable, "-m", "proxy", "migrate", "--config", str(config), "--dsn",
                           pg.dsn(dbname=db)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)


def test_migrate_writes_the_configured_carrier_and_refuses_an_unregistered_org(pg, tmp_path):
    """From the configuration file to the installed read function: a major-2 read of an era-2 row boxes
    under the configured carrier; an unregistered vendor.<org> carrier stops migrate, naming the key."""
    db = f"ow_carrier_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    try:
        pg.psql(HOST_SCHEMA, dbname=db)
        bad = tmp_path / "bad.toml"
        bad.write_text(render_config({"host": {"payload_carrier": "vendor.acme"}}))
        out = _migrate(pg, db, bad)
        assert out.returncode != 0 and "host.payload_carrier" in out.stderr and "not registered" in out.stderr
        good = tmp_path / "good.toml"
        good.write_text(render_config({"host": {"payload_carrier": "vendor.openwop-app"}}))
        out = _migrate(pg, db, good)
        assert out.returncode == 0, out.stderr
        got = pg.psql("SELECT openwop_seat.read_v2p(2::smallint, 'variable.changed', "
                      "'{\"name\": \"t\", \"value\": 2}'::jsonb, 'r', 1, 'e', NULL, 'acme')", dbname=db).strip()
        assert got.split("\x1e")[0] == '2{"name": "t", "vendor.openwop-app": {"value": 2}}'
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)
