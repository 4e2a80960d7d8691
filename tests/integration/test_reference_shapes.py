"""Issue 17 items 4 and 5 on logs shaped as the reference host (v1) stores them, on a real PostgreSQL.

The reference host writes ``node.interrupt.resolved`` (the codemap has ``interrupt.resolved``) in every
approved approval-gate run, ``node.started`` without the required ``typeId``, and ``run.completed`` with a
singular ``output`` instead of the required ``outputs``. The seat refuses the first at read time and maps no
private spelling; the operator's way out is ``backfill --repair FILE``: explicit, per run, originals
preserved, stamped and listed. The other two read, but are schema-invalid: audit reports them as their own
class, and backfill will not write them unless told to (``--allow-schema-invalid``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from test_backfill import (  # noqa: F401
    ROOT,
    backfill,
    bseat,
    config_file,
    direct,
    era,
    make_run,
    originals,
    raw_read_v1,
    rid,
    seat_reads,
    whole_rows,
)

from harness import HOST_SCHEMA
from proxy.errors import ERRORS
from proxy.tools.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE

APPROVAL_GATE = [  # an approved approval-gate run, as the reference host stores it (era 2)
    ("run.started", None, {"workflowId": "approval-gate",
                           "owner": {"tenant": "acme", "principal": "u1", "principalKind": "user"}}),
    ("node.started", "gate-1", {"nodeId": "gate-1"}),  # no typeId
    ("node.suspended", "gate-1", {"nodeId": "gate-1", "interruptId": "int-1", "kind": "approval", "key": "approve"}),
    ("node.interrupt.resolved", "gate-1", {"nodeId": "gate-1", "interruptId": "int-1",
                                           "resumeValue": {"approved": True}}),  # off-spec spelling
    ("node.completed", "gate-1", {"nodeId": "gate-1"}),
    ("run.completed", None, {"output": {"approved": True}}),  # output, not outputs
]
REPAIR = {"node.interrupt.resolved": "interrupt.resolved"}
UNMAPPED = ERRORS["event_type_unmapped"].sqlstate


def _types(pg, run: str) -> list[str]:
    return [r[0] for r in direct(pg, "SELECT type FROM events WHERE run_id = %s ORDER BY sequence", run)]


@pytest.fixture
def repair_file(tmp_path):
    path = tmp_path / "repair.json"
    path.write_text(json.dumps(REPAIR))
    return str(path)


def test_audit_reports_each_class_on_the_reference_hosts_runs(pg, tmp_path):
    db = f"ow_ref_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    try:
        pg.psql(HOST_SCHEMA, dbname=db)
        env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
        base = [sys.executable, "-m", "proxy"]
        out = subprocess.run(base + ["migrate", "--dsn", pg.dsn(dbname=db)], capture_output=True, text=True,
                             cwd=ROOT, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        with psycopg.connect(pg.dsn(dbname=db), autocommit=True) as conn, conn.transaction():
            for i in range(3):
                run = f"ref-gate-{i}"
                conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (run,))
                for seq, (t, node, payload) in enumerate(APPROVAL_GATE):
                    conn.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                                 "VALUES (%s, %s, %s, %s, %s, %s::jsonb, now())",
                                 (f"{run}-{seq}", run, seq, t, node, json.dumps(payload)))
        report = tmp_path / "ref.json"
        out = subprocess.run(base + ["audit", "--dsn", pg.dsn(dbname=db), "--json", str(report), "--no-progress"],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert out.returncode == EXIT_REFUSED, out.stdout + out.stderr
        r = json.loads(report.read_text())
        assert r["runs"] == {"era2Scanned": 3, "era3Skipped": 0, "wouldFail": 3, "schemaInvalid": 3,
                            "era3SchemaInvalid": 0}
        assert [(f["code"], f["type"], f["count"]) for f in r["failures"]] == [
            ("event_type_unmapped", "node.interrupt.resolved", 3)]
        assert [(i["type"], i["key"], i["count"]) for i in r["schemaInvalid"]] == [
            ("node.started", "typeId", 3), ("run.completed", "outputs", 3)]
        assert r["events"] == {"scanned": 18, "wouldFail": 3, "schemaInvalid": 6, "projected": 6,
                               "declared": 0, "era3SchemaInvalid": 0}
        assert r["repairedRuns"] == 0
        # after a repairing backfill of one run the audit counts it, and reads the other two as before
        path = tmp_path / "repair.json"
        path.write_text(json.dumps(REPAIR))
        out = subprocess.run(base + ["backfill", "--dsn", pg.dsn(dbname=db), "--runs", "ref-gate-1", "--repair",
                                     str(path), "--allow-schema-invalid", "--no-progress"],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert out.returncode == EXIT_OK, out.stdout + out.stderr
        out = subprocess.run(base + ["audit", "--dsn", pg.dsn(dbname=db), "--json", str(report), "--no-progress"],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        r = json.loads(report.read_text())
        assert r["repairedRuns"] == 1 and r["runs"]["era3Skipped"] == 1 and r["runs"]["wouldFail"] == 2
        assert "runs converted by backfill --repair (run_era.source backfill-repair): 1" in out.stdout
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)


def test_repair_converts_an_approval_gate_run_explicitly_and_restore_undoes_it(pg, bseat, config_file,
                                                                             repair_file):
    run = rid("gate")
    make_run(pg, run, APPROVAL_GATE)
    before = whole_rows(pg, run)
    v1_before = [raw_read_v1(bseat, run, binary) for binary in (False, True)]  # what the v1 host reads
    # a major-2 read refuses the run: the seat maps no private spelling
    with psycopg.connect(bseat.dsn(), autocommit=True) as conn, pytest.raises(psycopg.Error) as e:
        conn.execute("SELECT * FROM events WHERE run_id = %s", (run,)).fetchall()
    assert e.value.sqlstate == UNMAPPED
    # without --repair backfill skips it; with it, the schema-invalid rows still stop it
    out = backfill(pg, config_file, "--runs", run)
    assert out.returncode == EXIT_REFUSED and "event_type_unmapped: 1 runs" in out.stdout
    out = backfill(pg, config_file, "--runs", run, "--repair", repair_file)
    assert out.returncode == EXIT_REFUSED and "schema_invalid: 1 runs" in out.stdout
    assert whole_rows(pg, run) == before and era(pg, run) == 2
    # the dry run lists the repair and changes nothing
    out = backfill(pg, config_file, "--runs", run, "--repair", repair_file, "--allow-schema-invalid", "--dry-run")
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert "  node.interrupt.resolved -> interrupt.resolved: 1 events in 1 runs" in out.stdout
    assert whole_rows(pg, run) == before and era(pg, run) == 2
    out = backfill(pg, config_file, "--runs", run, "--repair", repair_file, "--allow-schema-invalid")
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    digest = __import__("hashlib").sha256(open(repair_file, "rb").read()).hexdigest()
    assert (f"repaired under --repair (file sha256 {digest}): 1 events; each original preserved in "
            f"openwop_seat.events_v1_original, each run stamped with source backfill-repair") in out.stdout
    assert "  node.interrupt.resolved -> interrupt.resolved: 1 events in 1 runs" in out.stdout
    assert "schema-invalid payloads written (--allow-schema-invalid): 2 events" in out.stdout
    assert era(pg, run) == 3
    assert direct(pg, "SELECT source FROM openwop_seat.run_era WHERE run_id = %s", run) == [("backfill-repair",)]
    assert _types(pg, run)[3] == "interrupt.resolved"
    held = originals(pg, run)
    assert [h[3] for h in held] == before and held[3][1] == "node.interrupt.resolved"  # the original spelling
    # the run now reads for major 2
    text, _ = seat_reads(bseat, run)
    assert [r[3].decode() for r in text][3] == "interrupt.resolved"
    # and the v1 host still reads exactly what it read before the backfill, its own spelling included
    assert [raw_read_v1(bseat, run, binary) for binary in (False, True)] == v1_before
    # and --restore puts the stored spelling back, byte for byte
    out = backfill(pg, config_file, "--restore", run)
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert whole_rows(pg, run) == before and era(pg, run) == 2 and originals(pg, run) == []


@pytest.mark.parametrize("content, message", [
    ("not json", "not JSON"),
    ('["node.interrupt.resolved"]', "expected a JSON object"),
    ("{}", "expected a JSON object"),
    ('{"node.started": "interrupt.resolved"}', "'node.started' is a codemap type"),
    ('{"agent.tool-called": "interrupt.resolved"}', "'agent.tool-called' is a codemap type"),
    ('{"example.thing": "interrupt.resolved"}', "'example.thing' is a registered vendor type"),
    ('{"node.interrupt.resolved": "interrupt.done"}', "'interrupt.done' is not a codemap type"),
    ('{"node.interrupt.resolved": 3}', "the codemap type must be a string"),
])
def test_a_repair_file_that_names_no_repair_is_refused_before_anything_changes(pg, config_file, tmp_path,
                                                                               content, message):
    run = rid("repair-file")
    make_run(pg, run, APPROVAL_GATE)
    before = whole_rows(pg, run)
    path = tmp_path / "repair.json"
    path.write_text(content)
    out = backfill(pg, config_file, "--runs", run, "--repair", str(path), "--allow-schema-invalid")
    assert out.returncode == EXIT_USAGE and message in out.stderr, out.stderr
    assert whole_rows(pg, run) == before and era(pg, run) == 2


def test_repair_accepts_a_v2_name_and_stores_the_run_in_v2_vocabulary(pg, config_file, tmp_path):
    """A target given by its v2 name is the codemap row's v1 name in the era-2 log, then mapped as any row."""
    run = rid("repair-v2")
    make_run(pg, run, [("run.started", None, {"workflowId": "wf"}),
                       ("agent.toolcalled", "n-1", {"agentId": "a", "toolName": "t", "callId": "c"})])
    path = tmp_path / "repair.json"
    path.write_text(json.dumps({"agent.toolcalled": "agent.tool-called"}))
    out = backfill(pg, config_file, "--runs", run, "--repair", str(path))
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert "  agent.toolcalled -> agent.toolCalled: 1 events in 1 runs" in out.stdout
    assert _types(pg, run) == ["run.started", "agent.tool-called"]
