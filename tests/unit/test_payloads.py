"""The v2 payload schemas compile into per-type shapes (no database)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.artifacts.load import load_artifacts
from proxy.artifacts.payload_shapes import (
    HATCH_PATTERN,
    ObjectShape,
    PayloadSchemaError,
    compile_payload_schemas,
    describe,
)


@pytest.fixture(scope="module")
def artifacts():
    return load_artifacts()


@pytest.fixture(scope="module")
def shapes(artifacts) -> dict[str, ObjectShape]:
    return compile_payload_schemas(artifacts.directory)


def payload_doc(artifacts) -> dict:
    return json.loads((Path(artifacts.directory) / "schemas/v2/run-event-payloads.schema.json").read_text("utf-8"))


# --- the vendored set ------------------------------------------------------------


def test_every_type_index_entry_compiles(artifacts, shapes):
    index = payload_doc(artifacts)["_typeIndex"]["properties"]
    assert len(index) == 118
    assert list(shapes) == list(index)
    for v2type, shape in shapes.items():
        assert isinstance(shape, ObjectShape), v2type
        assert describe(shape)


def test_hatch_pattern_is_the_files_spelling(artifacts):
    text = (Path(artifacts.directory) / "schemas/v2/run-event-payloads.schema.json").read_text("utf-8")
    assert json.dumps(HATCH_PATTERN) in text


def test_counts(shapes):
    hatched = [t for t, s in shapes.items() if s.hatched]
    closed_unhatched = [t for t, s in shapes.items() if s.closed and not s.hatched]
    open_ = [t for t, s in shapes.items() if s.open]
    assert all(shapes[t].closed for t in hatched)
    assert len(hatched) + len(closed_unhatched) + len(open_) == 118
    # The reference-host ADR counts 58 typed events mapping to an unhatched def (digest §2.2).
    assert len(closed_unhatched) == 58
    assert open_ == ["run.resumed"]


def test_codemap_types_all_have_shapes(artifacts, shapes):
    missing = sorted(artifacts.v2_types - set(shapes))
    assert missing == []
    # Reported, not required: _typeIndex types with no codemap row.
    assert sorted(set(shapes) - artifacts.v2_types) == ["negotiation.decided"]


def test_run_started(shapes):
    s = shapes["run.started"]
    assert s.ref == "run-event-payloads.schema.json#/$defs/runStarted"
    assert s.declared == ("workflowId", "inputs", "transport", "engineVersion", "owner", "tags", "metadata")
    assert s.required == {"workflowId"}
    assert s.hatched and s.closed
    owner = s.nested["owner"]
    assert owner.required == {"tenant", "subject"} and set(owner.declared) == {"tenant", "workspace", "subject"}
    assert owner.closed and not owner.hatched  # the hatch belongs to the def, not to nested objects
    subject = owner.nested["subject"]
    assert subject.ref == "subject.schema.json#"
    assert {"issuer", "subjectId", "tenant", "lane", "kind"} <= subject.required
    assert subject.closed and not subject.hatched
    assert s.nested["inputs"].open


def test_run_completed_requires_outputs(shapes):
    s = shapes["run.completed"]
    assert s.required == {"outputs"}
    assert s.declared == ("outputs", "durationMs")
    assert s.hatched


def test_run_failed_error_is_hatched(shapes):
    err = shapes["run.failed"].nested["error"]
    assert err.ref == "run-event-payloads.schema.json#/$defs/_errorObject"
    assert err.closed and err.hatched
    assert shapes["node.failed"].nested["error"] is err


def test_variable_changed_worked_example(shapes):
    # Digest §2.4 C: {name, value} -- `value` has no seat, the def is hatched.
    s = shapes["variable.changed"]
    assert s.declared == ("name", "previous", "next", "nodeId")
    assert s.closed and s.hatched
    assert not s.admits("value")
    assert s.admits("x-value") and s.admits("vendor.example") and s.admits("openwop-legacy")


def test_approval_requested_is_the_closed_suspend_request(shapes):
    s = shapes["approval.requested"]
    assert s.ref == "suspend-request.schema.json#"
    assert s.via == (
        "run-event-payloads.schema.json#/$defs/approvalRequested",
        "run-event-payloads.schema.json#/$defs/interruptRequested",
        "suspend-request.schema.json#",
    )
    assert s.required == {"kind", "key", "data"}
    assert set(s.declared) == {"kind", "key", "resumeSchema", "timeoutMs", "data"}
    assert s.closed and not s.hatched
    assert not s.admits("nodeId") and not s.admits("interruptId")
    kind, by_value = s.discriminated["data"]
    assert kind == "kind"
    approval = by_value["approval"]
    assert approval.ref == "suspend-request.schema.json#/$defs/ApprovalData"
    assert {"title", "description", "onTimeout", "actions"} <= set(approval.declared)
    assert approval.closed and not approval.hatched
    data = s.nested["data"]
    assert data.union_kind == "anyOf" and approval in data.union and len(data.union) == 9
    assert by_value["clarification"].items["questions"].required == {"id", "question"}


def test_cross_file_ref_interrupt_requested(shapes):
    s = shapes["interrupt.requested"]
    assert s.via[-2:] == ("run-event-payloads.schema.json#/$defs/interruptRequested", "suspend-request.schema.json#")
    assert shapes["channel.written"].ref == "channel-written-payload.schema.json#"
    assert shapes["channel.presence"].ref == "channel-presence-payload.schema.json#"


def test_interrupt_resolved_nested_refine_feedback_closed(shapes):
    s = shapes["approval.received"]
    assert s.ref == "run-event-payloads.schema.json#/$defs/interruptResolved"
    assert s.required >= {"nodeId", "interruptId"} and s.hatched
    rf = s.nested["refineFeedback"]
    assert rf.closed and not rf.hatched
    for t in ("approval.granted", "approval.rejected", "approval.overridden", "clarification.resolved"):
        assert shapes[t].ref == s.ref


@pytest.mark.parametrize("v2type", ["run.started", "run.completed", "run.failed", "run.cancelled",
                                    "run.resume-started", "run.paused", "node.started", "node.suspended",
                                    "artifact.created", "output.chunk", "variable.changed", "log.appended",
                                    "cap.breached", "lease.handed-off"])
def test_digest_hatched(shapes, v2type):
    assert shapes[v2type].hatched and shapes[v2type].closed


@pytest.mark.parametrize("v2type", ["run.dead-lettered", "authorization.decided", "proposal.created",
                                    "goal.evaluated", "import.applied", "voice.transcript", "context.summarized",
                                    "negotiation.decided", "interrupt.requested", "clarification.requested",
                                    "provider.usage", "orchestrator.decided", "node.dispatched"])
def test_digest_closed_unhatched(shapes, v2type):
    assert shapes[v2type].closed and not shapes[v2type].hatched


def test_orchestrator_decision_closed_root_is_flagged(shapes):
    # The root of orchestrator-decision.schema.json is additionalProperties:false with no
    # sibling properties, so strictly it admits no key at all; the compiler says so.
    d = shapes["orchestrator.decided"].nested["decision"]
    assert d.union_kind == "oneOf" and len(d.union) == 3
    assert d.unprojectable and "kind" in d.unprojectable
    # ... and (ADR 0007) the oneOf branches are taken as the seats: each declares its own keys, closed.
    assert [b.declared for b in d.union] == [("kind", "nextWorkerIds", "nextWorkerInputs", "confidence"),
                                             ("kind", "prompt"), ("kind", "reason", "confidence", "successCriteria")]
    assert all(b.closed and not b.hatched for b in d.union)
    assert "branches are taken as the seats" in d.unprojectable


# --- a synthetic set -------------------------------------------------------------


def write_set(tmp_path: Path, defs: dict, index: dict, others: dict[str, dict] | None = None) -> Path:
    folder = tmp_path / "spec" / "schemas" / "v2"
    folder.mkdir(parents=True)
    base = "https://example.test/v2/"
    doc = {"$id": base + "run-event-payloads.schema.json", "$defs": defs,
           "_typeIndex": {"type": "object", "properties": index}}
    (folder / "run-event-payloads.schema.json").write_text(json.dumps(doc), "utf-8")
    for name, other in (others or {}).items():
        other = {"$id": base + name, **other}
        (folder / name).write_text(json.dumps(other), "utf-8")
    return tmp_path / "spec"


HATCH = {HATCH_PATTERN: {}}


def test_synthetic_set(tmp_path):
    defs = {
        "hatched": {"type": "object", "additionalProperties": False, "patternProperties": HATCH,
                    "required": ["a"], "properties": {"a": {"type": "string"}, "child": {"$ref": "#/$defs/closed"}}},
        "closed": {"type": "object", "additionalProperties": False, "properties": {"x": {}}},
        "open": {"type": "object", "properties": {"o": {}}},
        "alias": {"$ref": "#/$defs/hatched", "description": "a plain reference"},
        "cross": {"$ref": "other.schema.json#/$defs/remote"},
        "merged": {"allOf": [{"$ref": "#/$defs/open"}, {"properties": {"m": {"type": "object"}},
                                                        "required": ["m"]}]},
        "tree": {"type": "object", "additionalProperties": False,
                 "properties": {"name": {}, "children": {"type": "array", "items": {"$ref": "#/$defs/tree"}},
                                "parent": {"$ref": "#/$defs/tree"}}},
        "union": {"type": "object", "properties": {"u": {"oneOf": [{"$ref": "#/$defs/closed"},
                                                                  {"$ref": "#/$defs/open"}]},
                                                   "s": {"anyOf": [{"enum": ["a"]}, {"pattern": "^x"}]}}},
    }
    index = {"t.hatched": {"$ref": "#/$defs/hatched"}, "t.closed": {"$ref": "#/$defs/closed"},
             "t.open": {"$ref": "#/$defs/open"}, "t.alias": {"$ref": "#/$defs/alias"},
             "t.cross": {"$ref": "#/$defs/cross"}, "t.merged": {"$ref": "#/$defs/merged"},
             "t.tree": {"$ref": "#/$defs/tree"}, "t.union": {"$ref": "#/$defs/union"}}
    other = {"$defs": {"remote": {"type": "object", "additionalProperties": False,
                                  "properties": {"r": {"$ref": "#/$defs/inner"}}},
                       "inner": {"type": "object", "patternProperties": HATCH,
                                 "additionalProperties": False, "properties": {"i": {}}}}}
    shapes = compile_payload_schemas(write_set(tmp_path, defs, index, {"other.schema.json": other}))

    h = shapes["t.hatched"]
    assert (h.hatched, h.open, h.declared, h.required) == (True, False, ("a", "child"), frozenset({"a"}))
    assert h.nested["child"] is shapes["t.closed"]
    c = shapes["t.closed"]
    assert (c.hatched, c.open) == (False, False)
    assert shapes["t.open"].open and not shapes["t.open"].hatched

    alias = shapes["t.alias"]  # $ref with a non-structural sibling is a plain reference
    assert alias.ref == h.ref and alias.via[-1] == "run-event-payloads.schema.json#/$defs/hatched"

    x = shapes["t.cross"]
    assert x.ref == "other.schema.json#/$defs/remote"
    assert x.nested["r"].ref == "other.schema.json#/$defs/inner" and x.nested["r"].hatched  # local ref in other file

    m = shapes["t.merged"]
    assert m.declared == ("o", "m") and m.required == {"m"} and m.open
    assert m.nested["m"].open

    t = shapes["t.tree"]  # recursion through properties: a shared, cyclic graph
    assert t.nested["parent"] is t and t.items["children"] is t
    assert "[cycle, see above]" in describe(t)

    u = shapes["t.union"]
    assert u.nested["u"].union_kind == "oneOf"
    assert [o.ref for o in u.nested["u"].union] == ["run-event-payloads.schema.json#/$defs/closed",
                                                    "run-event-payloads.schema.json#/$defs/open"]
    assert "s" not in u.nested  # a union of non-objects is not an object


def test_allof_with_closed_part_restricts(tmp_path):
    defs = {"d": {"allOf": [{"type": "object", "additionalProperties": False, "properties": {"a": {}}},
                            {"properties": {"b": {}}}]}}
    s = compile_payload_schemas(write_set(tmp_path, defs, {"t.d": {"$ref": "#/$defs/d"}}))["t.d"]
    assert s.declared == ("a",) and s.closed


def test_ref_cycle_is_an_error_not_a_loop(tmp_path):
    defs = {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}
    with pytest.raises(PayloadSchemaError, match=r"t\.a.*cycle.*\$defs/b"):
        compile_payload_schemas(write_set(tmp_path, defs, {"t.a": {"$ref": "#/$defs/a"}}))


def test_allof_cycle_is_an_error_not_a_loop(tmp_path):
    defs = {"a": {"type": "object", "allOf": [{"$ref": "#/$defs/b"}]},
            "b": {"type": "object", "allOf": [{"$ref": "#/$defs/a"}]}}
    with pytest.raises(PayloadSchemaError, match="cycle"):
        compile_payload_schemas(write_set(tmp_path, defs, {"t.a": {"$ref": "#/$defs/a"}}))


@pytest.mark.parametrize("ref, named", [
    ("#/$defs/nope", "#/$defs/nope"),
    ("missing.schema.json#/$defs/x", "missing.schema.json"),
    ("other.schema.json#/$defs/nope", "other.schema.json#/$defs/nope"),
])
def test_unresolvable_ref_names_type_and_ref(tmp_path, ref, named):
    defs = {"d": {"type": "object", "properties": {"p": {"$ref": ref}}}}
    folder = write_set(tmp_path, defs, {"t.broken": {"$ref": "#/$defs/d"}}, {"other.schema.json": {"$defs": {}}})
    with pytest.raises(PayloadSchemaError) as e:
        compile_payload_schemas(folder)
    assert "t.broken" in str(e.value) and named in str(e.value)


def test_non_object_type_index_entry_is_an_error(tmp_path):
    defs = {"s": {"type": "string"}}
    with pytest.raises(PayloadSchemaError, match="t.s"):
        compile_payload_schemas(write_set(tmp_path, defs, {"t.s": {"$ref": "#/$defs/s"}}))


def test_discriminator_binding(tmp_path):
    defs = {"d": {"type": "object", "additionalProperties": False, "required": ["kind", "data"],
                  "properties": {"kind": {"enum": ["a", "b"]}, "data": {"anyOf": [{"$ref": "#/$defs/A"},
                                                                                  {"$ref": "#/$defs/B"}]}},
                  "allOf": [{"if": {"properties": {"kind": {"const": "a"}}},
                             "then": {"properties": {"data": {"$ref": "#/$defs/A"}}}},
                            {"if": {"properties": {"kind": {"const": "b"}}},
                             "then": {"properties": {"data": {"$ref": "#/$defs/B"}}}}]},
            "A": {"type": "object", "properties": {"x": {}}},
            "B": {"type": "object", "additionalProperties": False, "properties": {"y": {}}}}
    s = compile_payload_schemas(write_set(tmp_path, defs, {"t.d": {"$ref": "#/$defs/d"}}))["t.d"]
    key, by_value = s.discriminated["data"]
    assert key == "kind" and by_value["a"].declared == ("x",) and by_value["b"].closed
    assert s.declared == ("kind", "data")  # conditionals add no keys
