"""backfill's progress line (rate and ETA) and its JSON summary, as pure functions (no database)."""

from __future__ import annotations

from collections import Counter

from proxy.artifacts.declarations import EMPTY
from proxy.artifacts.load import load_artifacts
from proxy.tools.backfill import Summary, rate_eta, summary_json


def test_rate_and_eta():
    assert rate_eta(0, 100, 0.0) == ", ETA ?"
    assert rate_eta(0, 100, 3.0) == ", ETA ?"
    assert rate_eta(10, 100, 2.0) == ", 5.0 runs/s, ETA 0:00:18"
    assert rate_eta(100, 100, 8.0) == ", 12.5 runs/s, ETA 0:00:00"
    assert rate_eta(1, 5_000, 1.0) == ", 1.0 runs/s, ETA 1:23:19"
    assert rate_eta(3_000, 1_000_000, 2.0) == ", 1,500.0 runs/s, ETA 0:11:05"


def test_summary_json():
    a = load_artifacts()
    s = Summary(converted=3, events_rewritten=7, events_preserved=15, already=1, declarations=EMPTY, runs_asked=5,
                elapsed=2.0, declared=Counter({"node.started": 3}))
    s.skipped.append(("run-9", "schema_invalid", "why"))
    s.repair_digest = "ab" * 32
    s.repaired[("node.interrupt.resolved", "interrupt.resolved")] = 2
    s.repaired_runs[("node.interrupt.resolved", "interrupt.resolved")] = 1
    j = summary_json(s, False, a)
    assert j == {
        "ok": False, "dryRun": False, "artifacts": {"tag": a.tag, "digest": a.digest},
        "declarations": {"file": None, "version": None, "digest": EMPTY.digest, "types": {}},
        "runs": {"asked": 5, "converted": 3, "alreadyEra3": 1, "skipped": 1},
        "events": {"rewritten": 7, "preserved": 15, "schemaInvalidWritten": 0, "declared": 3},
        "declaredByType": {"node.started": 3}, "skippedByCode": {"schema_invalid": 1},
        "skipped": [{"runId": "run-9", "code": "schema_invalid", "reason": "why"}],
        "repairs": {"fileSha256": "ab" * 32, "repaired": [
            {"stored": "node.interrupt.resolved", "type": "interrupt.resolved", "events": 2, "runs": 1}]},
        "elapsedSeconds": 2.0, "runsPerSecond": 2.5}


def test_backfill_json_is_refused_before_anything_runs(tmp_path, capsys):
    """--json with --restore, into a missing directory, or onto a directory: exit 2 naming the problem, before
    any connection (the DSN points nowhere) and without writing a file."""
    from proxy.cli import main

    dsn = "host=127.0.0.1 port=1 dbname=none connect_timeout=1"
    cases = [(["--restore", "r1", "--json", str(tmp_path / "s.json")], "--json does not apply to --restore"),
             (["--all", "--json", str(tmp_path / "no" / "s.json")], "no such directory"),
             (["--all", "--json", str(tmp_path)], "is a directory")]
    for args, message in cases:
        assert main(["backfill", "--dsn", dsn, *args]) == 2, args
        assert message in capsys.readouterr().err, args
    assert list(tmp_path.iterdir()) == []


def test_audit_progress_has_rate_and_eta():
    from proxy.tools.audit import Report, _progress_text

    a = load_artifacts()
    report = Report(a.tag, a.digest, 5)
    report.events, report.era2_runs = 160_000, 40
    text = _progress_text(report, 1_000_000, 20.0)
    assert "160,000 of ~1,000,000 events" in text and text.endswith(", 8,000.0 events/s, ETA 0:01:45"), text
    assert _progress_text(report, 0, 20.0).endswith(", 8,000.0 events/s, ETA ?")  # no estimate: no ETA
