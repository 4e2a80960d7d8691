"""The pinned spec artifacts: the real set loads, and every load-time check refuses a corrupted copy."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from proxy.artifacts.load import ArtifactError, Artifacts, check_report, default_directory, load_artifacts
from proxy.cli import cmd_check
from proxy.config import ConfigError

SPEC = Path(default_directory())
PROXY_SRC = Path(__file__).resolve().parents[2] / "proxy"


@pytest.fixture(scope="module")
def real() -> Artifacts:
    return load_artifacts()


@pytest.fixture
def spec_copy(tmp_path: Path) -> Path:
    """A writable copy of the packaged set."""
    d = tmp_path / "spec"
    shutil.copytree(SPEC, d, ignore=shutil.ignore_patterns("__pycache__"))
    return d


def read_json(d: Path, rel: str):
    return json.loads((d / rel).read_text(encoding="utf-8"))


def write_json(d: Path, rel: str, doc) -> None:
    (d / rel).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def edit_json(d: Path, rel: str, change) -> None:
    doc = read_json(d, rel)
    change(doc)
    write_json(d, rel, doc)


def refused(d: Path, *fragments: str) -> str:
    with pytest.raises(ArtifactError) as info:
        load_artifacts(str(d))
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def digest_by_rule(d: Path) -> str:
    """The documented rule, computed independently of proxy.artifacts."""
    h = hashlib.sha256()
    for rel in read_json(d, "MANIFEST.json")["files"]:
        content = (d / rel).read_bytes()
        h.update(rel.encode() + b"\0" + str(len(content)).encode() + b"\0" + content)
    return h.hexdigest()


# --- the real set ------------------------------------------------------------------


def test_real_set_counts(real: Artifacts) -> None:
    assert real.rows == 117 and len(real.v1_to_v2) == 117
    assert real.renamed_count == 36 and len(real.renamed) == 36
    assert len(real.v1_types) == 117 and len(real.v2_types) == 117
    assert real.vendor_orgs == {"example", "openwop-app", "myndhyve"}
    assert {"openwop", "vendor"} <= real.reserved_orgs
    assert real.tag == read_json(SPEC, "MANIFEST.json")["tag"]
    assert real.directory == default_directory()


def test_real_set_mapping(real: Artifacts) -> None:
    assert real.bijection_problem is None
    assert real.v2_to_v1 is not None
    assert real.v1_to_v2["agent.reasoning.delta"] == "agent.reasoning-delta"
    assert real.v2_to_v1["agent.reasoning-delta"] == "agent.reasoning.delta"
    assert real.v1_to_v2["run.started"] == "run.started"  # identity rows are in the full map
    assert "agent.reasoning.delta" in real.renamed and "run.started" not in real.renamed
    assert all(real.v2_to_v1[v2] == v1 for v1, v2 in real.v1_to_v2.items())


def test_real_set_byte_maps(real: Artifacts) -> None:
    assert real.type_map_v2_to_v1 is not None
    assert real.type_map_v1_to_v2[b"agent.reasoning.delta"] == b"agent.reasoning-delta"
    assert real.type_map_v2_to_v1[b"agent.reasoning-delta"] == b"agent.reasoning.delta"
    assert b"run.started" not in real.type_map_v1_to_v2  # only renamed rows
    assert len(real.type_map_v1_to_v2) == len(real.type_map_v2_to_v1) == 36
    assert real.type_map_v1_to_v2 == {v1.encode(): real.v1_to_v2[v1].encode() for v1 in real.renamed}


def test_real_set_errors(real: Artifacts) -> None:
    assert len(real.errors) == 101
    assert real.errors["event_type_unmapped"]["httpStatus"] == 500
    assert real.errors["event_type_unmapped"]["retriable"] is False
    assert real.errors["payload_unprojectable"]["httpStatus"] == 500


def test_digest_is_stable_and_follows_the_rule(real: Artifacts) -> None:
    again = load_artifacts()
    assert re.fullmatch(r"[0-9a-f]{64}", real.digest)
    assert again.digest == real.digest
    assert real.digest == digest_by_rule(SPEC)


def test_is_vendor_type(real: Artifacts) -> None:
    assert real.is_vendor_type("example.thing-happened")
    assert real.is_vendor_type("myndhyve.run-indexed")
    # Registration only; the grammar is not checked here (spec digest §6 Q14).
    assert real.is_vendor_type("openwop-app.conversation.recall_used")
    assert not real.is_vendor_type("foo.bar")
    assert not real.is_vendor_type("openwop.x")
    assert not real.is_vendor_type("vendor.thing")
    assert not real.is_vendor_type("node.startd")
    assert not real.is_vendor_type("example")  # no prefix without a dot
    assert not real.is_vendor_type("examples.thing")


def test_manifest_lists_exactly_the_json_files() -> None:
    manifest = read_json(SPEC, "MANIFEST.json")
    on_disk = sorted(p.relative_to(SPEC).as_posix() for p in SPEC.rglob("*.json") if p.name != "MANIFEST.json")
    assert manifest["files"] == on_disk
    assert "payloadKeyAliases.json" not in on_disk  # a host's non-normative table, not part of the set
    assert {"event-codemap.json", "declaration.json", "errors.json",
            "schemas/v2/run-event-payloads.schema.json"} <= set(on_disk)
    assert (SPEC / "SOURCES.md").is_file()


def test_no_mapping_in_python_source(real: Artifacts) -> None:
    """No Python file under proxy/ spells both sides of a renamed row (persistence.md: no private mapping)."""
    for path in PROXY_SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for v1 in real.renamed:
            v2 = real.v1_to_v2[v1]
            both = [q + v1 + q in text and q + v2 + q in text for q in ("'", '"')]
            assert not any(both), f"{path.name} spells {v1!r} and {v2!r}"


def test_check_report(real: Artifacts) -> None:
    report = check_report(real)
    assert real.tag in report and real.digest in report
    assert "rows: 117" in report and "renamed: 36" in report
    assert "vendor orgs: 3 (example, myndhyve, openwop-app)" in report
    assert "bijection: holds" in report


# --- validation: each rule refuses a corrupted copy ----------------------------------------------


def codemap_row(d: Path, number: int) -> dict:
    return read_json(d, "event-codemap.json")["rows"][number - 1]


def test_copy_loads_with_the_same_digest(spec_copy: Path, real: Artifacts) -> None:
    assert load_artifacts(str(spec_copy)).digest == real.digest


def test_status_not_decided(spec_copy: Path) -> None:
    v1 = codemap_row(spec_copy, 12)["v1"]
    edit_json(spec_copy, "event-codemap.json", lambda doc: doc["rows"][11].update(status="proposed"))
    message = refused(spec_copy)
    assert message == f"event-codemap.json row 12 (v1 {v1!r}): status is 'proposed', expected 'decided'"


def test_duplicate_v1(spec_copy: Path) -> None:
    first = codemap_row(spec_copy, 3)
    edit_json(spec_copy, "event-codemap.json", lambda doc: doc["rows"][19].update(v1=first["v1"], v2=first["v2"]))
    refused(spec_copy, "event-codemap.json row 20", repr(first["v1"]), "duplicate v1", "row 3")


@pytest.mark.parametrize("bad", ["Run.ResumeStarted", "run.resume_started", "run", "openwop.run-started",
                                 "run.resume-started\n", "-run.x"])
def test_v2_breaks_the_event_type_grammar(spec_copy: Path, bad: str) -> None:
    row = codemap_row(spec_copy, 5)

    def change(doc):
        doc["rows"][4]["v2"] = bad
        doc["rows"][4].pop("v2Override", None)

    edit_json(spec_copy, "event-codemap.json", change)
    refused(spec_copy, f"event-codemap.json row 5 (v1 {row['v1']!r})", repr(bad), "v2 event-type grammar")


def test_v2_breaks_the_codemaps_own_grammar(spec_copy: Path) -> None:
    # Three segments: valid on the wire, but the codemap's own `grammar` admits two only.
    edit_json(spec_copy, "event-codemap.json", lambda doc: doc["rows"][0].update(v2="run.really.started"))
    refused(spec_copy, "event-codemap.json row 1 (v1 'run.started')", "'run.really.started'", "codemap's own grammar")


def test_v2_override_disagrees(spec_copy: Path) -> None:
    row = codemap_row(spec_copy, 5)
    assert "v2Override" in row
    edit_json(spec_copy, "event-codemap.json", lambda doc: doc["rows"][4].update(v2Override="run.other-name"))
    refused(spec_copy, "event-codemap.json row 5", "v2Override 'run.other-name'")


def test_wrong_row_count(spec_copy: Path) -> None:
    edit_json(spec_copy, "event-codemap.json", lambda doc: doc["counts"].update(rows=118))
    refused(spec_copy, "event-codemap.json", "counts.rows is 118", "117 rows")


def test_wrong_renamed_count(spec_copy: Path) -> None:
    edit_json(spec_copy, "event-codemap.json", lambda doc: doc["counts"].update(renamed=35))
    refused(spec_copy, "event-codemap.json", "counts.renamed is 35", "36 rows")


def test_a_rename_without_updating_counts(spec_copy: Path) -> None:
    edit_json(spec_copy, "event-codemap.json", lambda doc: doc["rows"][0].update(v2="run.begun"))
    refused(spec_copy, "event-codemap.json", "counts.renamed is 36", "37 rows")


@pytest.mark.parametrize("rel", ["errors.json", "event-codemap.json", "schemas/v2/part.schema.json"])
def test_missing_file(spec_copy: Path, rel: str) -> None:
    (spec_copy / rel).unlink()
    refused(spec_copy, rel, "missing")


def test_missing_manifest(spec_copy: Path) -> None:
    (spec_copy / "MANIFEST.json").unlink()
    refused(spec_copy, "MANIFEST.json", "missing")


@pytest.mark.parametrize("rel", ["declaration.json", "schemas/v2/ids.schema.json", "MANIFEST.json"])
def test_invalid_json(spec_copy: Path, rel: str) -> None:
    content = (spec_copy / rel).read_bytes()
    (spec_copy / rel).write_bytes(content[: len(content) // 2])
    refused(spec_copy, rel, "invalid JSON")


def test_duplicate_json_key(spec_copy: Path) -> None:
    text = (spec_copy / "errors.json").read_text(encoding="utf-8")
    (spec_copy / "errors.json").write_text(text.replace('"version":', '"updated": "x", "version":', 1),
                                           encoding="utf-8")
    refused(spec_copy, "errors.json", "duplicate object key 'updated'")


def test_not_utf8(spec_copy: Path) -> None:
    content = (spec_copy / "errors.json").read_bytes()
    (spec_copy / "errors.json").write_bytes(content.replace(b"{", b"{\xff", 1))
    refused(spec_copy, "errors.json", "not UTF-8")


@pytest.mark.parametrize("org", ["vendor", "openwop", "events"])
def test_reserved_org_registered(spec_copy: Path, org: str) -> None:
    entry = {"name": "Someone", "registered": "2026-09-20"}
    edit_json(spec_copy, "declaration.json", lambda doc: doc["extensions"].update({org: entry}))
    refused(spec_copy, "declaration.json", repr(org), "reservedOrgs")


@pytest.mark.parametrize("org", ["Bad_Org", "acme.corp", "-acme", "9acme"])
def test_org_key_breaks_the_pattern(spec_copy: Path, org: str) -> None:
    entry = {"name": "Someone", "registered": "2026-09-20"}
    edit_json(spec_copy, "declaration.json", lambda doc: doc["extensions"].update({org: entry}))
    refused(spec_copy, "declaration.json", repr(org), "extensionsKeyPattern")


def test_org_entry_without_name(spec_copy: Path) -> None:
    edit_json(spec_copy, "declaration.json", lambda doc: doc["extensions"].update(acme={"registered": "2026-09-20"}))
    refused(spec_copy, "declaration.json extensions 'acme'", "name")


def test_new_org_is_a_vendor(spec_copy: Path) -> None:
    entry = {"name": "Acme", "registered": "2026-09-20"}
    edit_json(spec_copy, "declaration.json", lambda doc: doc["extensions"].update(acme=entry))
    a = load_artifacts(str(spec_copy))
    assert "acme" in a.vendor_orgs and a.is_vendor_type("acme.widget-made")


@pytest.mark.parametrize("code", ["event_type_unmapped", "payload_unprojectable"])
def test_required_error_code_missing(spec_copy: Path, code: str) -> None:
    edit_json(spec_copy, "errors.json",
              lambda doc: doc.update(rows=[r for r in doc["rows"] if r["code"] != code]))
    refused(spec_copy, "errors.json", repr(code))


def test_duplicate_error_code(spec_copy: Path) -> None:
    def change(doc):
        doc["rows"].append(dict(doc["rows"][0]))

    edit_json(spec_copy, "errors.json", change)
    code = read_json(spec_copy, "errors.json")["rows"][0]["code"]
    refused(spec_copy, "errors.json row 102", repr(code), "duplicate code", "row 1")


def test_unlisted_json_file(spec_copy: Path) -> None:
    (spec_copy / "payloadKeyAliases.json").write_text("{}\n", encoding="utf-8")
    refused(spec_copy, "payloadKeyAliases.json", "not listed in MANIFEST.json")


def test_manifest_unsorted(spec_copy: Path) -> None:
    edit_json(spec_copy, "MANIFEST.json", lambda doc: doc["files"].reverse())
    refused(spec_copy, "MANIFEST.json", "sorted")


@pytest.mark.parametrize("rel", ["../secrets.json", "/etc/x.json", "schemas//v2.json"])
def test_manifest_path_outside(spec_copy: Path, rel: str) -> None:
    edit_json(spec_copy, "MANIFEST.json", lambda doc: doc.update(files=sorted(doc["files"] + [rel])))
    refused(spec_copy, "MANIFEST.json", repr(rel))


def test_manifest_must_list_the_registries(spec_copy: Path) -> None:
    (spec_copy / "errors.json").unlink()
    edit_json(spec_copy, "MANIFEST.json", lambda doc: doc["files"].remove("errors.json"))
    refused(spec_copy, "MANIFEST.json", "errors.json")


def test_schema_grammar_drift(spec_copy: Path) -> None:
    rel = "schemas/v2/run-event.schema.json"
    edit_json(spec_copy, rel, lambda doc: doc["properties"]["type"]["oneOf"][1].update(pattern="^[a-z.]+$"))
    refused(spec_copy, rel, "v2 event-type grammar")


# --- a codemap that is not a bijection ---------------------------------------------------------


def test_non_bijective_codemap_loads_without_an_inverse(spec_copy: Path) -> None:
    rows = read_json(spec_copy, "event-codemap.json")["rows"]
    number = next(i for i, r in enumerate(rows) if r["v1"] == "run.resuming")

    def change(doc):
        doc["rows"][number]["v2"] = "run.started"  # folds onto the identity row run.started
        doc["rows"][number].pop("v2Override", None)

    edit_json(spec_copy, "event-codemap.json", change)
    a = load_artifacts(str(spec_copy))
    assert a.v2_to_v1 is None and a.type_map_v2_to_v1 is None
    assert a.bijection_problem is not None
    assert "'run.started'" in a.bijection_problem
    assert "'run.started', 'run.resuming'" in a.bijection_problem
    assert a.v1_to_v2["run.resuming"] == "run.started"  # the v1 -> v2 direction still works
    assert a.type_map_v1_to_v2[b"run.resuming"] == b"run.started"
    assert len(a.v2_types) == 116
    assert "bijection: FAILS" in check_report(a) and a.bijection_problem in check_report(a)


# --- the digest covers every byte --------------------------------------------------------------


def test_one_byte_of_any_file_changes_the_digest(spec_copy: Path, real: Artifacts) -> None:
    files = read_json(spec_copy, "MANIFEST.json")["files"]
    assert len(files) == 18
    seen = {real.digest}
    for rel in files:
        path = spec_copy / rel
        original = path.read_bytes()
        assert original[1:2] == b"\n"
        path.write_bytes(original[:1] + b"\t" + original[2:])  # still the same JSON
        digest = load_artifacts(str(spec_copy)).digest
        assert digest not in seen, rel
        assert digest == digest_by_rule(spec_copy)
        seen.add(digest)
        path.write_bytes(original)
    assert load_artifacts(str(spec_copy)).digest == real.digest


def test_digest_covers_the_path(spec_copy: Path, real: Artifacts) -> None:
    (spec_copy / "schemas" / "v2" / "part.schema.json").rename(spec_copy / "schemas" / "v2" / "part2.schema.json")
    edit_json(spec_copy, "MANIFEST.json", lambda doc: doc.update(
        files=sorted(f.replace("part.schema", "part2.schema") for f in doc["files"])))
    assert load_artifacts(str(spec_copy)).digest != real.digest


def test_digest_ignores_the_manifest_tag(spec_copy: Path, real: Artifacts) -> None:
    edit_json(spec_copy, "MANIFEST.json", lambda doc: doc.update(tag="another-name"))
    a = load_artifacts(str(spec_copy))
    assert a.tag == "another-name" and a.digest == real.digest


# --- openwop-seat check ------------------------------------------------------------------------


def test_cmd_check_ok(capsys, real: Artifacts) -> None:
    assert cmd_check(None) == 0
    out = capsys.readouterr()
    assert real.digest in out.out and real.tag in out.out and out.err == ""


def test_cmd_check_loads_the_config(tmp_path: Path, capsys) -> None:
    good = tmp_path / "seat.toml"
    good.write_text("", encoding="utf-8")
    assert cmd_check(str(good)) == 0
    capsys.readouterr()
    with pytest.raises(ConfigError):
        cmd_check(str(tmp_path / "absent.toml"))


def test_cmd_check_refuses_a_broken_set(spec_copy: Path, monkeypatch, capsys) -> None:
    edit_json(spec_copy, "event-codemap.json", lambda doc: doc["rows"][11].update(status="proposed"))
    monkeypatch.setattr("proxy.artifacts.load.default_directory", lambda: str(spec_copy))
    assert cmd_check(None) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("openwop-seat check: event-codemap.json row 12 ")
    assert "proposed" in out.err


def test_directory_accepts_a_path_object(spec_copy: Path) -> None:
    assert load_artifacts(spec_copy).directory == str(spec_copy)  # type: ignore[arg-type]
