"""The compiled projection (``payload_v2``) against the engine it compiles (``project_live``), row by row.

The engine (``project_row``: the PL/pgSQL walk over the shape table) is the projection's definition and the
oracle here. ``payload_v2`` must return, for every row, exactly what the engine returns: the same bytes
of the same payload, or the same refusal (SQLSTATE, message and DETAIL). The rows:

* the property generators of ``test_projection_property`` (every v2 definition, declared / hatch /
  unknown keys, nested ``type`` values, every v1 owner shape, interrupt kinds in and out of the enum,
  ``engineVersion`` strings), for three tenants (a run row with one, with an empty one, none);
* the frozen fixtures ``payload-projection-v1`` and ``-v2`` (read, never written);
* the reference host's shapes (issue 22): ``run.started`` without owner, ``node.started {}``,
  ``node.completed {outputs}``, ``memory.written``, ``run.completed {output}``, ``node.suspended``.

A test also checks that the reference host's shapes take the compiled path (never the engine): the
engine is counted with ``pg_stat_user_functions``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_projection_property import KIND_TYPES, PROPERTY, RENAMED, rows, scalars

from proxy.artifacts.declarations import load_declarations
from proxy.artifacts.load import load_artifacts
from proxy.config import HostConfig
from proxy.db.declarations_sql import declarations_sql
from proxy.db.projection_compiled import branches
from proxy.db.relations import relations_sql
from proxy.db.render import REFERENCE_COLUMNS
from proxy.errors import ERRORS

ARTIFACTS = load_artifacts()

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = [ROOT / "tests" / "fixtures" / name / "cases.json"
            for name in ("payload-projection-v1", "payload-projection-v2")]
RUNS = {"acme": "oracle-run-acme", "": "oracle-run-empty", None: "oracle-run-none"}

REFERENCE_HOST = [  # (stored type, payload, node_id) as the unmodified reference host stores them
    ("run.started", {"workflowId": "openwop-app.uppercase"}, None),
    ("node.started", {}, "n1"),
    ("node.completed", {"outputs": {"text": "T0-49"}}, "n1"),
    ("memory.written", {"tags": ["a", "b"], "memoryId": "mem_1", "memoryRef": "tenant-memory"}, None),
    ("run.completed", {"output": {"text": "HELLO SEAT"}}, None),
    ("node.suspended", {"kind": "approval", "interruptId": "60f9a8"}, "n2"),
]


@pytest.fixture(scope="module")
def conn(pg):
    with psycopg.connect(pg.dsn(dbname="postgres"), autocommit=True) as c:
        for tenant, run in RUNS.items():
            c.execute("DELETE FROM runs WHERE run_id = %s", (run,))
            if tenant is not None:
                c.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, %s)", (run, tenant))
        yield c


def outcome(conn, function: str, t: str, payload, run: str, node: str | None):
    """('ok', jsonb text or None) or ('error', sqlstate, message, detail) of one call."""
    try:
        with conn.transaction():
            text = conn.execute(f"SELECT openwop_seat.{function}(%s, %s::jsonb, %s, 7, 'ev-oracle', %s)::text",
                                (t, None if payload is None else json.dumps(payload), run, node)).fetchone()[0]
    except psycopg.Error as e:
        return "error", e.sqlstate, e.diag.message_primary, e.diag.message_detail
    return "ok", text


def same(conn, t: str, payload, run: str, node: str | None):
    compiled = outcome(conn, "payload_v2", t, payload, run, node)
    engine = outcome(conn, "project_live", t, payload, run, node)
    assert compiled == engine, (t, payload, run, node)
    return compiled


@PROPERTY
@given(rows())
def test_the_compiled_projection_is_the_engine_on_generated_rows(conn, row):
    t, _v2, payload, node, tenant = row
    for run in RUNS.values():
        same(conn, t, payload, run, node)


@settings(PROPERTY, max_examples=200)
@given(rows(types=sorted({"run.started", "approval.requested"} | KIND_TYPES)))
def test_the_compiled_projection_is_the_engine_on_owner_blocks_and_interrupt_kinds(conn, row):
    t, _v2, payload, node, _tenant = row
    for run in RUNS.values():
        same(conn, t, payload, run, node)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
def test_the_compiled_projection_is_the_engine_on_the_frozen_fixtures(conn, path):
    cases = json.loads(path.read_text())["cases"]
    assert cases
    for case in cases:
        event = case["event"]
        run = RUNS.get(case.get("tenantId"), RUNS[None])
        same(conn, event["type"], event["payload"], run, event.get("nodeId"))


def test_the_compiled_projection_is_the_engine_on_edge_values(conn):
    """Non-object payloads, JSON null, a NULL payload and vendor types read as the engine reads them; an
    unmapped or NULL type is refused before any projection, as the view refused it before (the engine
    itself does not check types)."""
    for t, payload in [("node.started", [1, 2]), ("node.started", "text"), ("node.started", None),
                       ("run.completed", 3), ("example.custom", {"a": 1}), ("example.custom", None),
                       ("openwop-app.step", []), ("node.started", {"x-v1": 1, "zz": 2}),
                       ("node.started", {"x-v1": 1, "x-v1.seat": 2, "zz": 3}),
                       ("node.started", {"x-note": {"type": "agent.toolCalled"}, "vendor.acme.k": 1}),
                       ("node.started", {"x-note": 1, "zz": {"type": "agent.toolCalled"}}),
                       ("node.started", {"typeId": "t", "zz": {"type": "node.started"}, "yy": [{"type": 3}]}),
                       ("node.started", {"zz": {"type": ["agent.toolCalled"]}}),
                       ("run.completed", {"outputs": {"type": "agent.toolCalled", "x-a": 1}, "output": 2})]:
        for node in (None, "n1"):
            same(conn, t, payload, RUNS["acme"], node)
    for t, payload, code in [("no.such.type", {}, "event_type_unmapped"), ("no.such.type", None, "event_type_unmapped"),
                             ("vendor.nope.x", [], "event_type_unmapped"), (None, {}, "event_row_malformed"),
                             (None, None, "event_row_malformed")]:
        got = outcome(conn, "payload_v2", t, payload, RUNS["acme"], None)
        assert got[0] == "error" and got[1] == ERRORS[code].sqlstate and got[2].startswith(code), (t, got)


def test_the_reference_host_shapes_read_as_the_engine_reads_them_without_calling_it(conn, pg):
    """Issue 22: the reference host's common shapes are compiled; the engine is never entered (it is
    replaced, inside a transaction rolled back after, by a function that raises)."""
    for t, payload, node in REFERENCE_HOST:
        for run in RUNS.values():
            same(conn, t, payload, run, node)
    expected = {(t, run): outcome(conn, "payload_v2", t, payload, run, node)
                for t, payload, node in REFERENCE_HOST for run in RUNS.values()}
    with psycopg.connect(pg.dsn(dbname="postgres")) as c:
        c.execute(ENGINE_TRAP)
        for t, payload, node in REFERENCE_HOST:
            for run in RUNS.values():
                got = c.execute("SELECT openwop_seat.payload_v2(%s, %s::jsonb, %s, 7, 'ev-oracle', %s)::text",
                                (t, json.dumps(payload), run, node)).fetchone()[0]
                assert ("ok", got) == expected[(t, run)], (t, run)
        # the trap works: a row the compiled branch leaves to the engine enters it
        with pytest.raises(psycopg.errors.RaiseException, match="engine entered"):
            c.execute("SELECT openwop_seat.payload_v2('run.started', '{\"owner\": null}', %s, 7, 'e', NULL)",
                      (RUNS["acme"],))
        c.rollback()
    assert outcome(conn, "payload_v2", "run.completed", {"output": {"text": "HELLO"}}, RUNS["acme"], None) == \
        ("ok", '{"x-v1": {"output": {"text": "HELLO"}}}')


ENGINE_TRAP = """
CREATE OR REPLACE FUNCTION openwop_seat.project_live(t text, p jsonb, run text, seq bigint, eid text, node text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$ BEGIN RAISE EXCEPTION 'engine entered for %', t; END $$
"""


# --- with the operator's declarations (ADR 0010) ------------------------------------------------------------------

EXAMPLE = ROOT / "config" / "reference-host-declarations.toml"


def install_with_declarations(c, decl) -> None:
    """declared_v2 for ``decl`` and the translated relations compiled for its types, as migrate installs them
    (inside the caller's transaction, which the test rolls back)."""
    c.execute(declarations_sql("openwop_seat", decl))
    host = HostConfig()
    c.execute(relations_sql(ARTIFACTS, replace(host, events_table='"public"."events"', runs_table='"public"."runs"'),
                            REFERENCE_COLUMNS, frozenset(decl.types)))


def test_with_the_reference_declarations_the_host_shapes_read_as_valid_v2_and_as_the_engine_reads_them(pg):
    decl = load_declarations(str(EXAMPLE), ARTIFACTS)
    with psycopg.connect(pg.dsn(dbname="postgres")) as c:
        install_with_declarations(c, decl)
        got = {}
        for t, payload, node in REFERENCE_HOST + [("artifact.created", {"artifactId": "a1", "artifactTypeId": "doc",
                                                                          "versionId": 3}, "n3")]:
            for run in RUNS.values():
                compiled = outcome(c, "payload_v2", t, payload, run, node)
                assert compiled == outcome(c, "project_live", t, payload, run, node), (t, payload, run)
            got[t] = json.loads(compiled[1])
        assert got["node.started"] == {"nodeId": "n1", "typeId": "legacy.unrecorded"}
        assert got["run.completed"] == {"outputs": {"text": "HELLO SEAT"}}
        assert got["artifact.created"] == {"artifactId": "a1", "artifactType": "doc", "version": 3}  # nodeId optional
        # the view reads them so, in the statement a host sends
        run = "decl-run-1"
        c.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (run,))
        for seq, (t, payload, node) in enumerate(REFERENCE_HOST[:5], 1):
            c.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                      "VALUES (%s, %s, %s, %s, %s, %s::jsonb, now())", (f"{run}-{seq}", run, seq, t, node,
                                                                        json.dumps(payload)))
        rows = c.execute("SELECT type, payload::text FROM openwop_seat.events_m2 WHERE run_id = %s ORDER BY sequence",
                         (run,)).fetchall()
        assert [json.loads(p) for _, p in rows][1:5:3] == [got["node.started"], got["run.completed"]]
        c.rollback()


@settings(PROPERTY, max_examples=150)
@given(rows(types=["run.completed", "node.started", "artifact.created"]))
def test_with_declarations_the_compiled_projection_is_the_engine_on_generated_rows(pg, row):
    t, _v2, payload, node, _tenant = row
    if "output" not in payload and t == "run.completed":
        payload = {**payload, "output": {"text": "x"}}
    decl = load_declarations(str(EXAMPLE), ARTIFACTS)
    with psycopg.connect(pg.dsn(dbname="postgres")) as c:
        install_with_declarations(c, decl)
        for run in RUNS.values():
            assert outcome(c, "payload_v2", t, payload, run, node) == outcome(c, "project_live", t, payload, run, node)
        c.rollback()


APPROVAL = ARTIFACTS.payload_shapes["approval.requested"]
APPROVAL_V1_KEYS = sorted(set(APPROVAL.discriminated["data"][1]["approval"].declared)
                          | {"message", "timeout", "timeoutMs", "description", "key", "resumeSchema", "zzextra",
                             "x-note", "data", "kind"})
approval_values = st.one_of(scalars, st.fixed_dictionaries({"type": st.sampled_from(RENAMED + ["node.started"])}),
                            st.fixed_dictionaries({"kind": st.sampled_from(["user", "team"]), "id": scalars}),
                            st.lists(st.sampled_from(["accept", "reject"]), max_size=2))


@settings(PROPERTY, max_examples=300)
@given(st.dictionaries(st.sampled_from(APPROVAL_V1_KEYS), approval_values, max_size=7))
def test_approval_requested_in_its_v1_shape_reads_as_the_engine_reads_it(conn, payload):
    """RFC 0186 §A.3 compiled: every mix of ApprovalData keys, message/description, timeout/timeoutMs, keys
    with no seat, nested values (some the walk enters), and the v2 shape's own data/kind."""
    for node in (None, "n1"):
        same(conn, "approval.requested", payload, RUNS["acme"], node)


# --- one function a branch (ADR 0011's addendum) ----------------------------------------------------------------

def compiled_functions(c) -> list[str]:
    """The PL/pgSQL functions this backend has compiled whose name starts with payload_v2 (each has a memory
    context of its own, named by its signature)."""
    return sorted(r[0].split("(")[0].removeprefix("openwop_seat.") for r in c.execute(
        "SELECT ident FROM pg_backend_memory_contexts WHERE name = 'PL/pgSQL function' "
        "AND ident LIKE 'openwop\\_seat.payload\\_v2%'").fetchall())


def test_a_backend_compiles_the_dispatch_and_only_the_branches_of_the_types_it_meets(pg):
    """payload_v2 was one PL/pgSQL function of 360 KB that a backend compiled whole at its first projected row
    (about 10 ms and 2 MiB, whatever the row's type): now each compiled branch is a function of its own, and a
    fresh backend compiles the dispatch and the branches of the types it projects, nothing else."""
    with psycopg.connect(pg.dsn(dbname="postgres"), autocommit=True) as c:
        assert compiled_functions(c) == []
        for t, payload, node in REFERENCE_HOST[:2]:
            assert outcome(c, "payload_v2", t, payload, RUNS["acme"], node)[0] == "ok"
        assert compiled_functions(c) == ["payload_v2", "payload_v2__node_started", "payload_v2__run_started"]
        every = int(c.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'openwop_seat'::regnamespace "
                              "AND proname LIKE 'payload\\_v2\\_\\_%'").fetchone()[0])
        assert every == sum(1 for b in branches("openwop_seat", ARTIFACTS, "x-v1") if b.guard is not None) > 100


def test_the_functions_of_branches_no_codemap_has_are_dropped_when_the_projection_is_installed(pg):
    """A migrate to other artifacts installs the branches of the new codemap: a branch function of a type the
    codemap no longer has is dropped, not left behind (nothing calls it, but it is the seat's object)."""
    with psycopg.connect(pg.dsn(dbname="postgres")) as c:
        c.execute("CREATE FUNCTION openwop_seat.payload_v2__gone_type(t text, p jsonb, run text, seq bigint, "
                  "eid text, node text) RETURNS jsonb LANGUAGE sql AS 'SELECT p'")
        c.execute("CREATE FUNCTION openwop_seat.payload_v2_kept(x int) RETURNS int LANGUAGE sql AS 'SELECT x'")
        install_with_declarations(c, load_declarations(str(EXAMPLE), ARTIFACTS))
        left = [r[0] for r in c.execute("SELECT proname::text FROM pg_proc WHERE pronamespace = "
                                        "'openwop_seat'::regnamespace AND proname LIKE 'payload\\_v2%'").fetchall()]
        assert "payload_v2__gone_type" not in left and "payload_v2_kept" in left  # only the branches' prefix
        assert {"payload_v2", "payload_v2__run_completed", "payload_v2__node_started"} <= set(left)
        c.rollback()
