"""The operator's declarations file (ADR 0010): the loader refuses every bad file naming its line, accepts the
reference host's example, has a stable digest; and the exact text of the generated ``declared_v2``.

No database: the SQL is checked as text here and run in tests/integration/test_declarations_db.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from proxy.artifacts.declarations import (
    EMPTY,
    DeclarationsError,
    declarations_for,
    digest_of,
    load_declarations,
    parse_declarations,
)
from proxy.artifacts.load import load_artifacts
from proxy.config import ConfigError, parse_config
from proxy.db.declarations_sql import declarations_sql

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "reference-host-declarations.toml"
EXAMPLE_DIGEST = "8f7d9bb4c9b41ece3229a3eb63fbf6a10fd6806368f18f80a574c5b75b549acd"


@pytest.fixture(scope="module")
def artifacts():
    return load_artifacts()


def parse(artifacts, text: str):
    return parse_declarations(textwrap.dedent(text).lstrip("\n").encode(), "decl.toml", artifacts)


def refused(artifacts, text: str) -> str:
    with pytest.raises(DeclarationsError) as e:
        parse(artifacts, text)
    return str(e.value)


# --- the example and the digest ------------------------------------------------------------------------------


def test_the_reference_host_example_is_accepted(artifacts):
    d = load_declarations(str(EXAMPLE), artifacts)
    assert d.version == "reference-host-1"
    assert d.listing() == [
        "artifact.created: alias artifactTypeId -> artifactType",
        "artifact.created: alias versionId -> version",
        'node.started: legacy typeId = "legacy.unrecorded"',
        "run.completed: alias output -> outputs",
    ]
    assert d.digest == EXAMPLE_DIGEST


def test_the_example_cites_the_reference_hosts_own_alias_table(artifacts):
    """artifact.created's aliases are the reference host's payloadKeyAliases.json row (6b105be9), verbatim."""
    d = load_declarations(str(EXAMPLE), artifacts)
    assert dict(d.types["artifact.created"].aliases) == {"artifactTypeId": "artifactType", "versionId": "version"}
    assert "payloadKeyAliases.json" in EXAMPLE.read_text()


def test_the_digest_is_of_what_is_declared_not_of_comments_or_layout(artifacts):
    a = parse(artifacts, """
        format = 1
        version = "v"
        [types."run.completed".aliases]
        output = "outputs"
        [types."node.started".legacy]
        typeId = "legacy.unrecorded"
        """)
    b = parse(artifacts, """
        # a comment
        version = "v"
        format = 1

        [types."node.started"]
        legacy = { typeId = "legacy.unrecorded" }   # inline

        [types."run.completed"]
        aliases.output = "outputs"
        """)
    assert a.digest == b.digest == digest_of("v", a.types)
    assert a.digest == parse(artifacts, 'format = 1\nversion = "v"\n[types."run.completed".aliases]\n'
                                        'output = "outputs"\n[types."node.started".legacy]\n'
                                        'typeId = "legacy.unrecorded"\n').digest
    c = parse(artifacts, 'format = 1\nversion = "w"\n[types."run.completed".aliases]\noutput = "outputs"\n'
                         '[types."node.started".legacy]\ntypeId = "legacy.unrecorded"\n')
    assert c.digest != a.digest  # the operator's version is part of what is pinned
    # sha256 of {"format":1,"types":{},"version":null}: fixed, so that replicas of every release agree
    assert EMPTY.digest == "c86fc083644e8fdd9c3aa42d630802c53058c83aff3af48dbbdebfa8395c7064"


def test_no_file_and_an_empty_file(artifacts):
    assert load_declarations(None, artifacts) is EMPTY and EMPTY.empty
    d = parse(artifacts, "format = 1\n")
    assert d.empty and d.digest == EMPTY.digest
    # a type table that declares nothing declares nothing
    assert parse(artifacts, 'format = 1\n[types."run.completed"]\n').digest == EMPTY.digest


def test_config_key_resolves_relative_to_the_config_file(tmp_path, artifacts):
    (tmp_path / "decl.toml").write_text(EXAMPLE.read_text())
    config = parse_config({"host": {"declarations_file": "decl.toml"}}, source=str(tmp_path / "seat.toml"))
    assert config.host.declarations_file == str(tmp_path / "decl.toml")
    assert declarations_for(config, artifacts).digest == EXAMPLE_DIGEST
    with pytest.raises(ConfigError, match="host.declarations_file: no such file"):
        parse_config({"host": {"declarations_file": "nope.toml"}}, source=str(tmp_path / "seat.toml"))


# --- every bad file is refused, naming the file and the line --------------------------------------------------

BAD = [
    pytest.param('format = 1\n[types."run.finished".aliases]\noutput = "outputs"\n', 2,
                 "types.'run.finished': unknown type: not a v2 event type", id="unknown-type"),
    pytest.param('format = 1\n[types."agent.toolCalled".aliases]\nfoo = "callId"\n', 2,
                 "a v1 spelling; declarations are keyed by the v2 type ('agent.tool-called')", id="v1-spelling"),
    pytest.param('format = 1\n[types."example.thing".aliases]\nfoo = "bar"\n', 2,
                 "a registered vendor type", id="vendor-type"),
    pytest.param('format = 1\n\n[types."run.completed".aliases]\noutput = "outputs"\nresult = "result"\n', 5,
                 "the target 'result' is not a declared property of run.completed's v2 definition",
                 id="alias-to-undeclared"),
    pytest.param('format = 1\n[types."artifact.created".aliases]\nartifactId = "artifactType"\n', 3,
                 "the source 'artifactId' is itself a declared property", id="alias-from-declared"),
    pytest.param('format = 1\n[types."run.completed".aliases]\n"x-out" = "outputs"\n', 3,
                 "is a hatch key", id="alias-from-hatch"),
    pytest.param('format = 1\n[types."run.completed".aliases]\noutput = "outputs"\nresult = "outputs"\n', 4,
                 "the target 'outputs' is already the target of 'output'", id="two-aliases-one-target"),
    pytest.param('format = 1\n[types."run.completed".aliases]\noutput = 3\n', 3,
                 "expected the v2 key as a string", id="alias-not-a-string"),
    pytest.param('format = 1\n[types."node.started".legacy]\ntypeId = 7\n', 3,
                 "expected JSON type string, got integer 7", id="wrong-json-type"),
    pytest.param('format = 1\n[types."node.started".legacy]\ntypeId = "Not A Type Id"\n', 3,
                 "does not match the pattern", id="pattern"),
    pytest.param('format = 1\n[types."run.completed".legacy]\noutputs = "done"\n', 3,
                 "expected JSON type object, got string", id="wrong-json-type-object"),
    pytest.param('format = 1\n[types."interrupt.requested".legacy]\nkind = "nope"\n', 3,
                 '"nope" is not one of ["approval",', id="enum"),
    pytest.param('format = 1\n[types."run.failed".legacy]\nerror = { code = "x" }\n', 3,
                 "the object lacks the required keys message", id="nested-required"),
    pytest.param('format = 1\n[types."run.failed".legacy]\nerror = { code = "x", message = "m", zz = 1 }\n', 3,
                 "the object does not admit the key 'zz'", id="nested-closed"),
    pytest.param('format = 1\n[types."node.suspended".legacy]\nkind = "approval"\n', 3,
                 "'kind' is not required by node.suspended's v2 definition", id="legacy-not-required"),
    pytest.param('format = 1\n[types."node.started".legacy]\nnodeType = "a.b"\n', 3,
                 "'nodeType' is not a declared property of node.started's v2 definition", id="legacy-undeclared"),
    pytest.param('format = 1\n[types."node.started".legacy]\nnodeId = "n"\n', 3,
                 "the projection fills 'nodeId' from the row itself", id="legacy-filled-from-row"),
    pytest.param('format = 1\n[types."interrupt.resolved".legacy]\ninterruptId = 12\n', 3,
                 "expected JSON type string", id="legacy-interrupt-id-type"),
    pytest.param('format = 1\n[types."node.started".legacy]\ntypeId = 1979-05-27\n', 3,
                 "is not a JSON value", id="toml-date"),
    pytest.param('format = 1\n[types."run.completed".aliases]\ntype = "outputs"\n', 3,
                 "an alias from 'type' is a type mapping in disguise", id="alias-from-type"),
    pytest.param('format = 1\n[types."run.completed".aliases]\nkind = "type"\n', 3,
                 "an alias to 'type' is a type mapping in disguise", id="alias-to-type"),
    pytest.param('format = 1\n[types."node.started".legacy]\ntype = "node.started"\n', 3,
                 "a legacy value for 'type' is a type mapping in disguise", id="legacy-type"),
    pytest.param('format = 1\n[types."node.started"]\ntype = "node.begun"\n', 3,
                 "unknown key 'type': expected aliases and legacy: a type mapping in disguise", id="type-key"),
    pytest.param('format = 1\n[types."run.completed".legacy]\noutputs = { type = "node.started" }\n', 3,
                 "holds type = 'node.started', an event type of the codemap: a type mapping in disguise",
                 id="nested-type"),
    pytest.param('format = 1\ntype = { "node.interrupt.resolved" = "interrupt.resolved" }\n', 2,
                 "unknown key 'type'", id="top-level-type-map"),
    pytest.param('format = 2\n', 1, "format: this openwop-seat reads format 1, got 2", id="format"),
    pytest.param('version = "x"\n', 1, "format: required", id="no-format"),
    pytest.param('format = 1\n\nversion = ""\n', 3, "version: expected a non-empty string", id="version"),
    pytest.param('format = 1\n[types."run.completed".renames]\noutput = "outputs"\n', 2,
                 "unknown key 'renames'", id="unknown-table"),
]


@pytest.mark.parametrize("text, line, message", BAD)
def test_a_bad_file_is_refused_naming_the_line(artifacts, text, line, message):
    why = refused(artifacts, text)
    assert why.startswith(f"decl.toml:{line}: "), why
    assert message in why, why


def test_invalid_toml_and_unreadable_files(artifacts, tmp_path):
    with pytest.raises(DeclarationsError, match=r"decl.toml: invalid TOML: .*line 2"):
        parse_declarations(b'format = 1\n[types.\n', "decl.toml", artifacts)
    with pytest.raises(DeclarationsError, match="not UTF-8"):
        parse_declarations(b'format = 1\n# \xff\n', "decl.toml", artifacts)
    with pytest.raises(DeclarationsError, match="cannot read"):
        load_declarations(str(tmp_path / "absent.toml"), artifacts)


# --- the generated function, exactly ----------------------------------------------------------------------------

# The exact text, as files: tests/fixtures/declarations/declared_v2.*.sql (checked by eye against the rules in
# proxy/db/declarations_sql.py; a change of the generator must change them on purpose).
GOLDEN = ROOT / "tests" / "fixtures" / "declarations"


def test_declared_v2_golden_without_declarations():
    assert declarations_sql("openwop_seat", EMPTY) == (GOLDEN / "declared_v2.empty.sql").read_text()


def test_declared_v2_golden_for_the_reference_host_example(artifacts):
    generated = declarations_sql("openwop_seat", load_declarations(str(EXAMPLE), artifacts))
    assert generated == (GOLDEN / "declared_v2.reference-host.sql").read_text()


def test_declared_v2_with_aliases_and_a_legacy_value_on_one_type(artifacts):
    d = parse(artifacts, """
        format = 1
        [types."run.completed".aliases]
        output = "outputs"
        [types."run.completed".legacy]
        outputs = {}
        """)
    sql = declarations_sql("openwop_seat", d)
    assert ("CASE WHEN COALESCE(pg_catalog.jsonb_typeof(p) OPERATOR(pg_catalog.<>) 'object', true) OR (NOT "
            "(p OPERATOR(pg_catalog.?|) '{\"output\"}'::pg_catalog.text[]) AND p OPERATOR(pg_catalog.?&) "
            "'{\"outputs\"}'::pg_catalog.text[]) THEN p") in sql
    assert "ELSE '{\"outputs\":{}}'::pg_catalog.jsonb OPERATOR(pg_catalog.||) ((p OPERATOR(pg_catalog.-) ARRAY[" in sql


def test_declared_v2_names_no_type_or_operator_without_its_schema(artifacts):
    """Inlined into payload_v2, the body is parsed under the caller's search_path, where a temporary type of
    the caller's named jsonb or text would come first: every type is pg_catalog's, every operator too."""
    import re

    sql = declarations_sql("openwop_seat", load_declarations(str(EXAMPLE), artifacts))
    body = sql.split("$ow$")[1]
    assert not re.search(r"::(?!pg_catalog\.)", body), body
    assert " IS DISTINCT FROM " not in body and not re.search(r"[^)] = ", body)


def test_a_key_holding_the_quote_tag_gets_another_tag(artifacts):
    d = parse(artifacts, 'format = 1\n[types."run.completed".aliases]\n"a$ow$b" = "outputs"\n')
    sql = declarations_sql("openwop_seat", d)
    assert "AS $ow1$\n" in sql and sql.count("$ow1$") == 2


def test_the_generator_is_pure_and_refuses_a_bad_schema_name(artifacts):
    d = load_declarations(str(EXAMPLE), artifacts)
    assert declarations_sql("openwop_seat", d) == declarations_sql("openwop_seat", d)
    with pytest.raises(ValueError):
        declarations_sql('x"; DROP', d)


def test_openwop_seat_config_checks_the_declarations_file(tmp_path, capsys):
    from proxy.cli import main

    (tmp_path / "decl.toml").write_text('format = 1\n[types."node.started".legacy]\ntypeId = 7\n')
    (tmp_path / "seat.toml").write_text('[host]\ndeclarations_file = "decl.toml"\n')
    assert main(["config", "--config", str(tmp_path / "seat.toml")]) == 2
    err = capsys.readouterr().err
    assert f"host.declarations_file: {tmp_path / 'decl.toml'}:3: types.'node.started'.legacy.'typeId': expected " \
           f"JSON type string, got integer 7" in err, err
    (tmp_path / "decl.toml").write_text(EXAMPLE.read_text())
    assert main(["config", "--config", str(tmp_path / "seat.toml")]) == 0
