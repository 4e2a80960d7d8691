"""The operator's declarations (ADR 0010) on a real PostgreSQL: ``declared_v2`` on the reference host's shapes,
the replica digest check, ``adr`` and ``audit`` listing them, ``backfill`` converting with them, ``audit`` failing
over schema-invalid payloads stored in era-3 runs, the JSON summary with rate and ETA, and the ``--repair`` example.

Each test gets a database of its own with the host's tables (``HOST_SCHEMA``), migrated through the command line
with a configuration naming ``config/reference-host-declarations.toml`` (or none), as an operator would.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from harness import HOST_SCHEMA, render_config
from proxy.artifacts.declarations import EMPTY, load_declarations
from proxy.artifacts.load import load_artifacts
from proxy.config import HostConfig, load_config
from proxy.db.layout import DeclarationsMismatch
from proxy.db.migrate import verify
from proxy.db.reader_sql import declared_payload_sql
from proxy.dev.devcluster import free_port
from proxy.tools.common import EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "reference-host-declarations.toml"
REPAIR_EXAMPLE = ROOT / "config" / "reference-host-repair.json"
A = load_artifacts()
DECL = load_declarations(str(EXAMPLE), A)
ENV = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}

# The common workflow of the reference host, one run as it stores it (issue 22): (type, node_id, payload)
COMMON = [
    ("run.started", None, {"workflowId": "openwop-app.uppercase"}),
    ("node.started", "upper", {}),  # no typeId; nodeId only in the node_id column
    ("node.completed", "upper", {"outputs": {"text": "HELLO SEAT"}}),
    ("memory.written", "upper", {"tags": ["t"], "memoryId": "mem_1", "memoryRef": "tenant-memory"}),
    ("run.completed", None, {"output": {"text": "HELLO SEAT"}}),  # singular output
]
# An approved approval-gate run, as the reference host stores it
GATE = [
    ("run.started", None, {"workflowId": "openwop-app.approval-gate"}),
    ("node.started", "gate", {}),
    ("node.suspended", "gate", {"kind": "approval", "interruptId": "60f9a1b2c3d4e5f6a7b8"}),
    ("node.interrupt.resolved", "gate", {"kind": "approval", "interruptId": "60f9a1b2c3d4e5f6a7b8"}),
    ("node.completed", "gate", {"outputs": {"approved": True}}),
    ("run.completed", None, {"output": {"approved": True}}),
]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=120)


@pytest.fixture
def make_db(pg, tmp_path):
    """Factory: (database, config file) with the host's tables, migrated with ``declarations`` (a path or None)."""
    made = []

    def make(declarations: str | None = str(EXAMPLE), name: str = "seat") -> tuple[str, Path]:
        db = f"ow_decl_{uuid.uuid4().hex[:10]}"
        pg.psql(f"CREATE DATABASE {db}")
        made.append(db)
        pg.psql(HOST_SCHEMA, dbname=db)
        config = write_config(tmp_path, name, declarations)
        out = cli("migrate", "--config", str(config), "--dsn", pg.dsn(dbname=db))
        assert out.returncode == 0, out.stdout + out.stderr
        return db, config

    yield make
    for db in made:
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)


def write_config(tmp_path: Path, name: str, declarations: str | None) -> Path:
    path = tmp_path / f"{name}.seat.toml"
    path.write_text(render_config({"host": {"declarations_file": declarations}} if declarations else {}))
    return path


def seed(pg, db: str, run: str, log) -> None:
    with psycopg.connect(pg.dsn(dbname=db), autocommit=True) as conn, conn.transaction():
        conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (run,))
        for seq, (t, node, payload) in enumerate(log):
            conn.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                         "VALUES (%s, %s, %s, %s, %s, %s::jsonb, now())",
                         (f"{run}-{seq}", run, seq, t, node, json.dumps(payload)))


def q(pg, db: str, sql: str, *params):
    with psycopg.connect(pg.dsn(dbname=db), autocommit=True) as conn:
        return conn.execute(sql, params or None).fetchall()


def declared(pg, db: str, t: str, payload) -> object:
    return q(pg, db, "SELECT openwop_seat.declared_v2(%s, %s::jsonb)", t,
             None if payload is None else json.dumps(payload))[0][0]


# --- declared_v2 ------------------------------------------------------------------------------------------------


def test_declared_v2_on_the_reference_hosts_shapes(pg, make_db):
    db, _ = make_db()
    assert declared(pg, db, "run.completed", {"output": {"text": "HELLO SEAT"}}) == {"outputs": {"text": "HELLO SEAT"}}
    assert declared(pg, db, "node.started", {}) == {"typeId": "legacy.unrecorded"}
    assert declared(pg, db, "node.started", {"typeId": "core.x", "attempt": 0}) == {"typeId": "core.x", "attempt": 0}
    assert declared(pg, db, "artifact.created", {"artifactId": "a", "artifactTypeId": "prd", "versionId": "3"}) == {
        "artifactId": "a", "artifactType": "prd", "version": "3"}
    # only the alias whose target is absent moves; with both present the payload is left to the projection
    assert declared(pg, db, "artifact.created", {"artifactTypeId": "prd", "artifactType": "x", "versionId": "3"}) \
        == {"artifactTypeId": "prd", "artifactType": "x", "version": "3"}
    assert declared(pg, db, "run.completed", {"output": 1, "outputs": {}}) == {"output": 1, "outputs": {}}
    # a JSON null moves as a value; types without declarations, non-objects and NULL come back as they are
    assert declared(pg, db, "run.completed", {"output": None}) == {"outputs": None}
    assert declared(pg, db, "node.completed", {"output": 1}) == {"output": 1}
    assert declared(pg, db, "run.completed", [1, "output"]) == [1, "output"]
    assert declared(pg, db, "node.started", "x") == "x"
    assert declared(pg, db, "node.started", None) is None
    # idempotent: applying it to its own result changes nothing
    once = declared(pg, db, "run.completed", {"output": {"a": 1}, "durationMs": 3})
    assert declared(pg, db, "run.completed", once) == once
    # PostgreSQL inlines it: the plan computes the CASE, and never calls the function; also as the cutover
    # tools call it, with the type mapped by the codemap
    for call in ("openwop_seat.declared_v2(type, payload)", declared_payload_sql(HostConfig(), "events")):
        plan = "\n".join(r[0] for r in q(pg, db, f"EXPLAIN (VERBOSE, COSTS OFF) SELECT {call} FROM events"))
        assert "declared_v2" not in plan and "CASE" in plan, plan
    assert q(pg, db, "SELECT value FROM openwop_seat.meta WHERE key = 'declarations_digest'") == [(DECL.digest,)]


def test_without_declarations_declared_v2_returns_the_payload_as_it_is(pg, make_db):
    db, _ = make_db(None)
    for t, payload in (("run.completed", {"output": {"a": 1}}), ("node.started", {}), ("x.y", [1])):
        assert declared(pg, db, t, payload) == payload
    assert "SELECT p\n" in q(pg, db, "SELECT pg_get_functiondef('openwop_seat.declared_v2(text, jsonb)'::regprocedure)"
                              )[0][0]
    assert q(pg, db, "SELECT value FROM openwop_seat.meta WHERE key = 'declarations_digest'") == [(EMPTY.digest,)]


# --- the digest: every replica runs the same declarations -------------------------------------------------------


def test_a_replica_with_other_declarations_refuses_to_serve(pg, make_db, tmp_path):
    db, config = make_db()
    asyncio.run(verify(pg.dsn(dbname=db), load_config(str(config)), A))  # the same file: fine
    other = tmp_path / "other-declarations.toml"
    other.write_text(EXAMPLE.read_text().replace('typeId = "legacy.unrecorded"', 'typeId = "legacy.other"'))
    for name, decl in (("none", None), ("other", str(other))):
        with pytest.raises(DeclarationsMismatch, match=f"records declarations digest {DECL.digest}"):
            asyncio.run(verify(pg.dsn(dbname=db), load_config(str(write_config(tmp_path, name, decl))), A))
    # serve refuses at start, naming both digests
    seat = tmp_path / "serve.toml"
    seat.write_text(render_config({"proxy": {"listen": f"127.0.0.1:{free_port()}", "upstream": f"127.0.0.1:{pg.port}"},
                                   "host": {"dsn": pg.dsn(dbname=db), "declarations_file": str(other)}}))
    out = subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", str(seat)], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and f"records declarations digest {DECL.digest}" in out.stderr, out.stderr
    # and so do the cutover tools (exit 3: the database is not migrated for this configuration)
    out = cli("audit", "--config", str(write_config(tmp_path, "none", None)), "--dsn", pg.dsn(dbname=db),
              "--no-progress")
    assert out.returncode == EXIT_UNAVAILABLE and "declarations digest" in out.stderr, out.stderr
    # migrate with the other file switches the database; the first file is then the one refused
    out = cli("migrate", "--config", str(write_config(tmp_path, "other", str(other))), "--dsn", pg.dsn(dbname=db))
    assert out.returncode == 0 and f"replacing digest {DECL.digest}" in out.stdout, out.stdout + out.stderr
    with pytest.raises(DeclarationsMismatch):
        asyncio.run(verify(pg.dsn(dbname=db), load_config(str(config)), A))


def test_a_bad_declarations_file_is_refused_by_migrate_and_the_tools_naming_the_line(pg, make_db, tmp_path):
    db, _ = make_db()
    bad = tmp_path / "bad.toml"
    bad.write_text('format = 1\n\n[types."run.completed".aliases]\noutput = "result"\n')
    config = write_config(tmp_path, "bad", str(bad))
    out = cli("migrate", "--config", str(config), "--dsn", pg.dsn(dbname=db))
    assert out.returncode == 1 and f"{bad}:4: types.'run.completed'.aliases.'output': the target 'result'" \
        in out.stderr, out.stderr
    for tool in (["audit"], ["backfill", "--all"]):
        out = cli(*tool, "--config", str(config), "--dsn", pg.dsn(dbname=db), "--no-progress")
        assert out.returncode == EXIT_USAGE and f"{bad}:4:" in out.stderr, out.stderr
    out = cli("adr", "--config", str(config), "--dsn", pg.dsn(dbname=db))
    assert out.returncode == 2 and f"{bad}:4:" in out.stderr, out.stderr
    assert q(pg, db, "SELECT value FROM openwop_seat.meta WHERE key = 'declarations_digest'") == [(DECL.digest,)]


# --- adr and audit list them ------------------------------------------------------------------------------------


def test_adr_lists_the_declarations_and_their_digest(pg, make_db):
    db, config = make_db()
    out = cli("adr", "--config", str(config), "--dsn", pg.dsn(dbname=db))
    assert out.returncode == 0, out.stderr
    assert "## Decision: the host's own payload names (declarations)" in out.stdout
    assert f"`{DECL.digest}`, recorded in the database (matches)" in out.stdout
    for line in ("run.completed: alias output -> outputs", "artifact.created: alias artifactTypeId -> artifactType",
                 "artifact.created: alias versionId -> version", 'node.started: legacy typeId = "legacy.unrecorded"'):
        assert f"- `{line}`" in out.stdout


def test_audit_with_declarations_reads_the_reference_hosts_runs_as_schema_valid(pg, make_db, tmp_path):
    db, config = make_db()
    for i in range(3):
        seed(pg, db, f"ref-{i}", COMMON)
    report = tmp_path / "audit.json"
    out = cli("audit", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--json", str(report), "--no-progress")
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    r = json.loads(report.read_text())
    assert r["ok"] and r["schemaInvalid"] == [] and r["failures"] == []
    assert r["declarations"] == {"file": str(EXAMPLE), "version": "reference-host-1", "digest": DECL.digest,
                                 "types": {"artifact.created": {"aliases": {"artifactTypeId": "artifactType",
                                                                            "versionId": "version"}, "legacy": {}},
                                           "node.started": {"aliases": {}, "legacy": {"typeId": "legacy.unrecorded"}},
                                           "run.completed": {"aliases": {"output": "outputs"}, "legacy": {}}}}
    assert r["declaredByType"] == {"node.started": 3, "run.completed": 3}
    assert f"declarations: {EXAMPLE} (version reference-host-1, digest {DECL.digest})" in out.stdout
    assert "  run.completed: alias output -> outputs" in out.stdout
    # the same runs without declarations read exactly as before: schema-invalid, exit 1
    bare, bare_config = make_db(None, "bare")
    for i in range(3):
        seed(pg, bare, f"ref-{i}", COMMON)
    out = cli("audit", "--config", str(bare_config), "--dsn", pg.dsn(dbname=bare), "--json", str(report),
              "--no-progress")
    assert out.returncode == EXIT_REFUSED, out.stdout + out.stderr
    r = json.loads(report.read_text())
    assert [(i["type"], i["key"], i["count"]) for i in r["schemaInvalid"]] == [
        ("node.started", "typeId", 3), ("run.completed", "outputs", 3)]
    assert r["declaredByType"] == {} and r["declarations"]["digest"] == EMPTY.digest


# --- backfill: the way out --------------------------------------------------------------------------------------


def test_backfill_with_declarations_converts_without_allow_schema_invalid(pg, make_db, tmp_path):
    db, config = make_db()
    for i in range(4):
        seed(pg, db, f"ref-{i}", COMMON)
    summary = tmp_path / "backfill.json"
    out = cli("backfill", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--all", "--batch", "2",
              "--json", str(summary))
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert "converted 4 runs to era 3" in out.stdout
    assert (f"declarations {EXAMPLE} (version reference-host-1, digest {DECL.digest}): 8 payloads changed by them "
            f"(node.started 4, run.completed 4)") in out.stdout
    assert "schema-invalid" not in out.stdout
    # the progress line says the rate and what is left
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("backfill: [") and "4 of 4 runs" in last and " runs/s, ETA 0:00:00 [" in last, out.stderr
    s = json.loads(summary.read_text())
    assert s["ok"] and not s["dryRun"] and s["runs"] == {"asked": 4, "converted": 4, "alreadyEra3": 0, "skipped": 0}
    assert s["events"] == {"rewritten": 16, "preserved": 20, "schemaInvalidWritten": 0, "declared": 8}
    assert s["declaredByType"] == {"node.started": 4, "run.completed": 4}
    assert s["declarations"]["digest"] == DECL.digest and s["repairs"] is None and s["skipped"] == []
    assert s["elapsedSeconds"] > 0 and s["runsPerSecond"] > 0
    # what is stored now is what a v2 reader reads (era 3: as stored), schema-valid
    rows = dict(q(pg, db, "SELECT type, payload FROM events WHERE run_id = 'ref-0' AND type IN "
                          "('node.started', 'run.completed')"))
    assert rows == {"node.started": {"nodeId": "upper", "typeId": "legacy.unrecorded"},
                    "run.completed": {"outputs": {"text": "HELLO SEAT"}}}
    out = cli("audit", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--no-progress")
    assert out.returncode == EXIT_OK and "stored in era-3 runs (read as stored by every v2 reader): 0 events" \
        in out.stdout, out.stdout
    # --restore puts the stored payloads back
    out = cli("backfill", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--restore", "ref-0")
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert q(pg, db, "SELECT payload FROM events WHERE run_id = 'ref-0' AND type = 'run.completed'") == [
        ({"output": {"text": "HELLO SEAT"}},)]


def test_audit_never_passes_schema_invalid_payloads_stored_in_era3_runs(pg, make_db, tmp_path):
    db, config = make_db(None)
    seed(pg, db, "ref-0", COMMON)
    seed(pg, db, "ref-1", COMMON)
    out = cli("backfill", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--runs", "ref-0", "--no-progress")
    assert out.returncode == EXIT_REFUSED and "schema_invalid: 1 runs" in out.stdout, out.stdout
    out = cli("backfill", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--runs", "ref-0",
              "--allow-schema-invalid", "--no-progress")
    assert out.returncode == EXIT_OK and "schema-invalid payloads written (--allow-schema-invalid): 2 events" \
        in out.stdout, out.stdout
    report = tmp_path / "audit.json"
    out = cli("audit", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--json", str(report), "--no-progress")
    assert out.returncode == EXIT_REFUSED, out.stdout
    r = json.loads(report.read_text())
    assert not r["ok"]
    assert r["runs"]["era3Skipped"] == 1 and r["runs"]["era3SchemaInvalid"] == 1
    assert [(i["type"], i["key"], i["count"], i["samples"]) for i in r["era3SchemaInvalid"]] == [
        ("node.started", "typeId", 1, [{"runId": "ref-0", "sequence": 1}]),
        ("run.completed", "outputs", 1, [{"runId": "ref-0", "sequence": 4}])]
    assert "schema-invalid payloads stored in era-3 runs (read as stored by every v2 reader): 2 events in 1 runs" \
        in out.stdout
    # with the era-2 run backfilled too, only era-3 rows are left, and the audit still fails over them
    out = cli("backfill", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--runs", "ref-1",
              "--allow-schema-invalid", "--no-progress")
    assert out.returncode == EXIT_OK
    out = cli("audit", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--json", str(report), "--no-progress")
    r = json.loads(report.read_text())
    assert out.returncode == EXIT_REFUSED and r["runs"]["era2Scanned"] == 0 and r["events"]["era3SchemaInvalid"] == 4
    assert "result: SOME PAYLOADS WOULD NOT VALIDATE" in out.stdout


def test_the_repair_example_converts_the_reference_hosts_approval_gate_run(pg, make_db, tmp_path):
    """config/reference-host-repair.json with the declarations: the approval-gate run converts, no
    --allow-schema-invalid, its off-spec node.interrupt.resolved rewritten as interrupt.resolved."""
    db, config = make_db()
    seed(pg, db, "gate-0", GATE)
    out = cli("backfill", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--runs", "gate-0", "--no-progress")
    assert out.returncode == EXIT_REFUSED and "event_type_unmapped: 1 runs" in out.stdout, out.stdout
    summary = tmp_path / "repair.json"
    out = cli("backfill", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--runs", "gate-0", "--repair",
              str(REPAIR_EXAMPLE), "--json", str(summary), "--no-progress")
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert "  node.interrupt.resolved -> interrupt.resolved: 1 events in 1 runs" in out.stdout
    s = json.loads(summary.read_text())
    digest = __import__("hashlib").sha256(REPAIR_EXAMPLE.read_bytes()).hexdigest()
    assert s["repairs"] == {"fileSha256": digest, "repaired": [
        {"stored": "node.interrupt.resolved", "type": "interrupt.resolved", "events": 1, "runs": 1}]}
    assert s["events"]["schemaInvalidWritten"] == 0
    assert q(pg, db, "SELECT source FROM openwop_seat.run_era WHERE run_id = 'gate-0'") == [("backfill-repair",)]
    rows = q(pg, db, "SELECT type, payload FROM events WHERE run_id = 'gate-0' ORDER BY sequence")
    assert rows[3] == ("interrupt.resolved", {"kind": "approval", "interruptId": "60f9a1b2c3d4e5f6a7b8",
                                              "nodeId": "gate"})
    assert rows[5] == ("run.completed", {"outputs": {"approved": True}})
    out = cli("audit", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--no-progress")
    assert out.returncode == EXIT_OK, out.stdout
