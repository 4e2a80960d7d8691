"""The payload projection's choices where the spec is silent (issue 17, ADR 0007), each as a tested rule.

The fixture cases in payload-projection-v2 read the default carrier through the seat; this file pins the
carrier setting (validated against the hatch grammar and declaration.json, generated into the SQL), the
second carrier, and that the enums the generated SQL holds are the vendored schemas' own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.artifacts.load import load_artifacts
from proxy.artifacts.payload_shapes import CarrierError, check_carrier
from proxy.config import ConfigError, HostConfig, parse_config
from proxy.db.layout import SchemaError
from proxy.db.projection_sql import CARRIER, INTERRUPT_KINDS, KEY_CLASS_LANES, SUBJECT_KINDS, interrupt_kind_types
from proxy.db.writer_sql import artifact_objects_sql

ARTIFACTS = load_artifacts()
SCHEMAS = Path(__file__).resolve().parents[2] / "proxy" / "spec" / "schemas" / "v2"


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


def test_the_default_carrier_is_x_v1_and_the_example_config_documents_the_key():
    assert CARRIER == "x-v1" and HostConfig().payload_carrier == "x-v1"
    text = (Path(__file__).resolve().parents[2] / "config" / "openwop-seat.toml").read_text()
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
    with pytest.raises(SchemaError, match="host.payload_carrier: .*'acme' is not registered"):
        artifact_objects_sql(ARTIFACTS, HostConfig(payload_carrier="vendor.acme"))
    sql = artifact_objects_sql(ARTIFACTS, HostConfig(payload_carrier="vendor.openwop-app"))
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
