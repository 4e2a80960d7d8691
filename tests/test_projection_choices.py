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

from conftest import HOST_SCHEMA, ROOT, render_config
from proxy import schema
from proxy.artifacts import load_artifacts
from proxy.config import ConfigError, HostConfig, parse_config
from proxy.projection import (CARRIER, INTERRUPT_KINDS, KEY_CLASS_LANES, SUBJECT_KINDS, CarrierError,
                              check_carrier, interrupt_kind_types, projection_sql)

ARTIFACTS = load_artifacts()
SCHEMAS = Path(__file__).parent.parent / "proxy" / "spec" / "schemas" / "v2"


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


def test_the_default_carrier_is_x_v1_and_the_example_config_documents_the_key():
    assert CARRIER == "x-v1" and HostConfig().payload_carrier == "x-v1"
    text = (Path(__file__).parent.parent / "config" / "openwop-seat.toml").read_text()
    assert '# payload_carrier = "x-v1"' in text


@pytest.mark.parametrize("carrier", ["x-v1", "x-legacy-value", "openwop-v1", "vendor.openwop-app",
                                     "vendor.example.carried"])
def test_a_carrier_the_hatch_admits_is_accepted(carrier):
    assert parse_config({"host": {"payload_carrier": carrier}}).host.payload_carrier == carrier


@pytest.mark.parametrize("carrier", ["v1", "x-", "X-V1", "vendor.", "vendor.Org", "x-v1 ", "owner", "", 7,
                                     "vendor..x", "x-v1/a"])
def test_a_carrier_outside_the_hatch_grammar_is_a_config_error(carrier):
    with pytest.raises(ConfigError, match="host.payload_carrier"):
        parse_config({"host": {"payload_carrier": carrier}})


def test_a_vendor_carrier_needs_its_org_registered_in_the_declaration():
    assert "acme" not in ARTIFACTS.vendor_orgs
    with pytest.raises(CarrierError, match="not registered"):
        check_carrier("vendor.acme", ARTIFACTS.vendor_orgs)
    # where config meets the artifacts (migrate), the refusal names the key
    with pytest.raises(schema.SchemaError, match="host.payload_carrier: .*'acme' is not registered"):
        schema.artifact_objects_sql(ARTIFACTS, HostConfig(payload_carrier="vendor.acme"))
    sql = schema.artifact_objects_sql(ARTIFACTS, HostConfig(payload_carrier="vendor.openwop-app"))
    assert "'vendor.openwop-app'" in sql and "'vendor.openwop-app.seat'" in sql and "'x-v1'" not in sql


def test_the_enums_in_the_generated_sql_are_the_vendored_schemas():
    payloads = _schema("run-event-payloads.schema.json")["$defs"]
    for name in ("nodeSuspended", "interruptResolved"):
        assert tuple(payloads[name]["properties"]["kind"]["enum"]) == INTERRUPT_KINDS, name
    assert tuple(_schema("suspend-request.schema.json")["properties"]["kind"]["enum"]) == INTERRUPT_KINDS
    subject = _schema("subject.schema.json")
    assert tuple(subject["properties"]["kind"]["enum"]) == SUBJECT_KINDS
    key_class = [c for c in subject["allOf"] if "keyClass" in json.dumps(c)]
    assert tuple(key_class[0]["if"]["properties"]["lane"]["enum"]) == KEY_CLASS_LANES
    assert set(interrupt_kind_types(ARTIFACTS.payload_shapes)) == {
        "node.suspended", "interrupt.resolved", "approval.received", "approval.granted", "approval.rejected",
        "approval.overridden", "clarification.resolved"}


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
