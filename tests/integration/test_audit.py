"""``openwop-seat audit`` (issue #7 item 1) on a real PostgreSQL, through the real command line.

The fixture database holds clean era-2 runs (renamed types, a run.started whose payload is projected), a
run.completed missing a required key (it reads, but is schema-invalid: issue 17 item 5), an event with an
unmapped type, an event with an unprojectable payload, events of registered vendor types (one failing the
v2 type grammar: flagged, not failed), and an era-3 run whose row would fail if it were read as era 2 (the
reader passes era-3 rows as stored: the audit skips the run).  The audit must report exactly those, with
exit status 1; 1 again, as schema-invalid only, once the two failing events are gone; and 0 once the
schema-invalid one is gone too.  It runs as a role that may only read, so it cannot have written anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness import HOST_SCHEMA
from proxy.artifacts.load import load_artifacts
from proxy.tools.common import EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
A = load_artifacts()
READER = "ow_audit_reader"

# (run, sequence, type, node_id, payload); runs "a-clean-*" read cleanly
EVENTS = [
    ("a-clean-1", 0, "run.started", None, {"workflowId": "wf"}),  # projected: the legacy owner Subject
    ("a-clean-1", 1, "agent.reasoning.delta", "n", {"agentId": "a", "delta": "x", "sequence": 1}),  # renamed
    ("a-clean-1", 2, "node.started", "n", {"nodeId": "n", "typeId": "t"}),
    ("a-invalid", 0, "run.completed", None, {"output": {"answer": 42}}),  # boxed; required `outputs` missing
    ("a-clean-2", 0, "run.started", None, {"workflowId": "wf"}),
    ("a-clean-2", 1, "node.completed", "n", {"nodeId": "n"}),
    ("a-clean-3", 0, "node.started", "n", {"nodeId": "n", "typeId": "t"}),
    ("a-unmapped", 0, "run.started", None, {"workflowId": "wf"}),
    ("a-unmapped", 1, "foo.bar", None, {}),  # no codemap row, no registered org
    ("a-payload", 0, "run.started", None, {"workflowId": "wf", "engineVersion": "2.1.0"}),  # not an integer
    ("a-vendor", 0, "example.thing-happened", None, {"anything": 1}),  # passed by its org
    ("a-vendor", 1, "node.started", "n", {"nodeId": "n", "typeId": "t"}),
    ("a-vendor", 2, "example.Bad_Type", None, {}),  # registered org, fails the v2 type grammar: flagged
    ("a-era3", 0, "bar.baz", None, {}),  # would fail as era 2; the run is stamped era 3
]
STORED = {e[2] for e in EVENTS if e[0] != "a-era3"}


def audit(pg, db: str, *args: str, user: str = READER) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
    return subprocess.run([sys.executable, "-m", "proxy", "audit", "--dsn", pg.dsn(user=user, dbname=db), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


@pytest.fixture(scope="module")
def audit_db(pg):
    db = f"ow_audit_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    pg.psql(HOST_SCHEMA, dbname=db)
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=db)],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    pg.psql(f"DO $$ BEGIN CREATE ROLE {READER} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;"
            f"GRANT SELECT ON runs, events TO {READER};", dbname=db)
    values = ",".join(
        f"('ev-{run}-{seq}', '{run}', {seq}, '{t}', {('NULL' if node is None else repr(node))}, "
        f"'{json.dumps(payload)}', now())" for run, seq, t, node, payload in EVENTS)
    runs = sorted({e[0] for e in EVENTS})
    pg.psql("INSERT INTO runs (run_id, tenant_id) VALUES " + ",".join(f"('{r}', 'acme')" for r in runs)
            + "; INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) VALUES "
            + values + "; INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES ('a-era3', 3, 'test');",
            dbname=db)
    yield db
    pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)


def test_audit_reports_exactly_what_would_fail(pg, audit_db, tmp_path):
    report = tmp_path / "audit.json"
    # --batch 2: the eight runs take four transactions, so batch edges are crossed
    out = audit(pg, audit_db, "--json", str(report), "--batch", "2", "--samples", "3")
    assert out.returncode == EXIT_REFUSED, out.stderr
    r = json.loads(report.read_text())
    assert r["ok"] is False
    assert r["artifacts"] == {"tag": A.tag, "digest": A.digest}
    assert r["runs"] == {"era2Scanned": 7, "era3Skipped": 1, "wouldFail": 2, "schemaInvalid": 1, "era3SchemaInvalid": 0}
    assert r["events"]["scanned"] == len(EVENTS) - 1 and r["events"]["wouldFail"] == 2
    assert r["events"]["schemaInvalid"] == 1
    assert r["failures"] == [
        {"code": "event_type_unmapped", "type": "foo.bar", "key": None, "count": 1,
         "samples": [{"runId": "a-unmapped", "sequence": 1}]},
        {"code": "payload_unprojectable", "type": "run.started", "key": "engineVersion", "count": 1,
         "samples": [{"runId": "a-payload", "sequence": 0}]},
    ]
    assert r["schemaInvalid"] == [{"type": "run.completed", "key": "outputs", "reason": "required key missing",
                                   "count": 1, "samples": [{"runId": "a-invalid", "sequence": 0}]}]
    assert r["vendorTypesByOrg"] == {"example": {"example.Bad_Type": 1, "example.thing-happened": 1}}
    assert r["vendorTypesOffGrammar"] == {"example.Bad_Type": 1}
    assert r["typesNeverSeen"] == sorted(A.v1_types - STORED)
    assert r["requiredKeysMissing"] == [{"type": "run.completed", "key": "outputs", "count": 1}]
    # every run.started of the clean, unmapped runs gets the legacy Subject; run.completed boxes `output`
    assert r["projectedByType"] == {"run.completed": 1, "run.started": 3}
    assert r["boxedKeysByType"] == {"run.completed": 1}
    assert r["typesSeen"]["agent.reasoning.delta"] == 1 and "bar.baz" not in r["typesSeen"]
    # the human report on stdout says the same
    assert "would fail: 2 events in 2 runs" in out.stdout
    assert "event_type_unmapped: type foo.bar: 1 events (e.g. a-unmapped@1)" in out.stdout
    assert "payload_unprojectable: type run.started, key engineVersion: 1 events (e.g. a-payload@0)" in out.stdout
    assert "example: example.Bad_Type (1), example.thing-happened (1)" in out.stdout
    assert "flagged: 1 of them fail the v2 event-type grammar" in out.stdout
    assert "schema-invalid (read, but would not validate against the v2 definition): 1 events in 1 runs" in out.stdout
    assert "type run.completed, required key missing outputs: 1 events (e.g. a-invalid@0)" in out.stdout
    assert out.stdout.rstrip().endswith("result: SOME EVENTS WOULD FAIL the reader rule; some payloads would not "
                                        "validate")
    assert "audit:" in out.stderr and "events" in out.stderr  # the progress line


def _held(pg, db, keys: str):
    pg.psql("CREATE TABLE IF NOT EXISTS held AS SELECT * FROM events WHERE false", dbname=db)
    pg.psql(f"WITH d AS (DELETE FROM events WHERE (run_id, sequence) IN ({keys}) RETURNING *) "
            "INSERT INTO held SELECT * FROM d", dbname=db)


def test_audit_exits_1_for_schema_invalid_payloads_alone(pg, audit_db, tmp_path):
    """Nothing would fail the reader rule, but a payload would not validate: not clean (issue 17 item 5)."""
    _held(pg, audit_db, "('a-unmapped', 1), ('a-payload', 0)")
    try:
        report = tmp_path / "invalid.json"
        out = audit(pg, audit_db, "--json", str(report), "--no-progress")
        assert out.returncode == EXIT_REFUSED, out.stdout + out.stderr
        r = json.loads(report.read_text())
        assert r["ok"] is False and r["failures"] == [] and r["events"]["wouldFail"] == 0
        assert r["runs"] == {"era2Scanned": 6, "era3Skipped": 1, "wouldFail": 0, "schemaInvalid": 1,
                            "era3SchemaInvalid": 0}
        assert [(i["type"], i["key"], i["count"]) for i in r["schemaInvalid"]] == [("run.completed", "outputs", 1)]
        assert out.stdout.rstrip().endswith("result: SOME PAYLOADS WOULD NOT VALIDATE (schema-invalid); nothing "
                                            "would fail the reader rule")
    finally:
        pg.psql("INSERT INTO events SELECT * FROM held; DROP TABLE held", dbname=audit_db)


def test_audit_exits_0_when_nothing_would_fail(pg, audit_db, tmp_path):
    _held(pg, audit_db, "('a-unmapped', 1), ('a-payload', 0), ('a-invalid', 0)")
    try:
        report = tmp_path / "clean.json"
        out = audit(pg, audit_db, "--json", str(report), "--no-progress")
        assert out.returncode == EXIT_OK, out.stdout + out.stderr
        r = json.loads(report.read_text())
        assert r["ok"] is True and r["failures"] == [] and r["events"]["wouldFail"] == 0
        assert r["schemaInvalid"] == [] and r["events"]["schemaInvalid"] == 0
        # a-payload and a-invalid had one event each
        assert r["runs"] == {"era2Scanned": 5, "era3Skipped": 1, "wouldFail": 0, "schemaInvalid": 0,
                            "era3SchemaInvalid": 0}
        assert r["vendorTypesOffGrammar"] == {"example.Bad_Type": 1}  # flagged, not failed
        assert out.stdout.rstrip().endswith("result: nothing would fail")
        assert out.stderr == ""  # --no-progress
    finally:
        pg.psql("INSERT INTO events SELECT * FROM held; DROP TABLE held", dbname=audit_db)


def test_audit_refuses_a_database_not_migrated_for_these_artifacts(pg, audit_db, tmp_path):
    bare = f"ow_audit_bare_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {bare}")
    try:
        out = audit(pg, bare, user="postgres")
        assert out.returncode == EXIT_UNAVAILABLE
        assert "openwop-seat migrate" in out.stderr and out.stdout == ""
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {bare} WITH (FORCE)", check=False)
    pg.psql("UPDATE openwop_seat.meta SET value = 'f00' WHERE key = 'artifact_digest'", dbname=audit_db)
    try:
        out = audit(pg, audit_db)
        assert out.returncode == EXIT_UNAVAILABLE
        assert "records spec-artifact digest f00" in out.stderr
    finally:
        pg.psql(f"UPDATE openwop_seat.meta SET value = '{A.digest}' WHERE key = 'artifact_digest'", dbname=audit_db)


def test_audit_usage_and_connection_errors(pg, audit_db, tmp_path):
    out = audit(pg, audit_db, "--json", str(tmp_path / "no-such-dir" / "r.json"))
    assert out.returncode == EXIT_USAGE and "no such directory" in out.stderr
    out = audit(pg, audit_db, "--batch", "0")
    assert out.returncode == EXIT_USAGE and "--batch must be at least 1" in out.stderr
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
    out = subprocess.run([sys.executable, "-m", "proxy", "audit", "--dsn",
                          "host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=5"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert out.returncode == EXIT_UNAVAILABLE and "cannot connect to the database" in out.stderr
    out = subprocess.run([sys.executable, "-m", "proxy", "audit"], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=60)
    assert out.returncode == EXIT_USAGE and "--dsn" in out.stderr


def test_era_column_store_malformed_stamp_is_reported_and_never_converted(pg, tmp_path):
    """With ``[host] era_column`` a run whose column holds neither NULL nor 3 is refused by the reader
    (``event_row_malformed``): audit counts every event of it as failing, and backfill skips it."""
    from harness import render_config

    db = f"ow_audit_era_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    try:
        pg.psql(HOST_SCHEMA + "ALTER TABLE runs ADD COLUMN era smallint;", dbname=db)
        config = tmp_path / "era.toml"
        config.write_text(render_config({"host": {"era_column": "era"}}))
        env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
        base = [sys.executable, "-m", "proxy"]
        out = subprocess.run(base + ["migrate", "--config", str(config), "--dsn", pg.dsn(dbname=db)],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        # the events first (the append guard refuses a run with a malformed stamp), then the stamps: as the
        # owner of openwop_seat, whom the guard of the era column admits
        pg.psql("INSERT INTO runs (run_id, tenant_id) VALUES ('m-bad', 'acme'), ('m-good', 'acme'), ('m-3', 'acme');"
                "INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) VALUES "
                "('b0', 'm-bad', 0, 'node.started', '{\"nodeId\": \"n\", \"typeId\": \"t\"}', now()), "
                "('b1', 'm-bad', 1, 'node.started', '{\"nodeId\": \"n\", \"typeId\": \"t\"}', now()), "
                "('g0', 'm-good', 0, 'node.started', '{\"nodeId\": \"n\", \"typeId\": \"t\"}', now()), "
                "('t0', 'm-3', 0, 'node-started', '{}', now());"
                "UPDATE runs SET era = 7 WHERE run_id = 'm-bad'; UPDATE runs SET era = 3 WHERE run_id = 'm-3';",
                dbname=db)
        report = tmp_path / "era.json"
        out = subprocess.run(base + ["audit", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--json",
                                     str(report)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert out.returncode == EXIT_REFUSED, out.stderr
        r = json.loads(report.read_text())
        assert r["runs"] == {"era2Scanned": 1, "era3Skipped": 1, "wouldFail": 1, "schemaInvalid": 0,
                            "era3SchemaInvalid": 0}
        assert r["events"]["scanned"] == 3 and r["events"]["wouldFail"] == 2
        assert r["failures"] == [{"code": "event_row_malformed", "type": None, "key": None, "count": 2,
                                  "samples": [{"runId": "m-bad", "sequence": 0}, {"runId": "m-bad", "sequence": 1}]}]
        out = subprocess.run(base + ["backfill", "--config", str(config), "--dsn", pg.dsn(dbname=db), "--all",
                                     "--no-progress"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert out.returncode == EXIT_REFUSED, out.stdout + out.stderr
        assert "skipped run m-bad: its era stamp is malformed" in out.stdout
        assert "converted 1 runs" in out.stdout and "already era 3: 1 runs" in out.stdout
        eras = pg.psql("SELECT run_id || '=' || coalesce(era::text, 'null') FROM runs ORDER BY run_id", dbname=db)
        assert eras.split() == ["m-3=3", "m-bad=7", "m-good=3"]
        assert pg.psql("SELECT count(*) FROM openwop_seat.events_v1_original WHERE run_id = 'm-bad'",
                       dbname=db).strip() == "0"
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)
