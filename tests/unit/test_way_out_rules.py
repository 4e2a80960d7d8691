"""What blocks retire and uninstall, the status report's text, and the commands' flags (issue 24), without a
database: the facts are built by hand."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

import pytest

from proxy.artifacts.load import load_artifacts
from proxy.cli import build_parser
from proxy.config import Config
from proxy.db.cutover import Facts, terminal_v1
from proxy.tools.lifecycle import addendum, status_json, status_text

NOW = datetime(2026, 12, 5, 3, 0, tzinfo=timezone.utc)


def facts(**kw) -> Facts:
    base = dict(state="installed", database="openwop", meta={"layout_version": "8"}, eras={"3": 0}, era2_open=0,
                now=NOW)
    base.update(kw)
    return Facts(**base)


def seat(age: float, stopped: bool = False) -> dict:
    return {"seat": "h/1/127.0.0.1:6543", "started_at": NOW, "last_seen": NOW, "stopped_at": NOW if stopped else None,
            "version": "0.1.0", "reported_by": "app", "age": age}


def seen(major: str, age: float, user: str = "app") -> dict:
    return {"major": major, "user": user, "first_seen": NOW, "last_seen": NOW, "sessions": 3, "last_seat": "h",
            "age": age}


def test_nothing_blocks_a_finished_cutover():
    f = facts(eras={"backfill": 4, "created": 1}, sightings=[seen("1", 100), seen("2", 1)], seats=[seat(100)])
    assert f.retire_blockers(quiet=60, allow_era2=False) == []
    assert f.uninstall_blockers(keep_era3=False) == []


def test_each_retire_blocker_alone():
    assert "2 era-2 runs remain (1 of them open)" in facts(eras={"2": 2}, era2_open=1).retire_blockers(60, False)[0]
    assert facts(eras={"2": 2}).retire_blockers(60, True) == []
    (b,) = facts(sightings=[seen("1", 5, "v1host")]).retire_blockers(60, False)
    assert "major-1 session of user 'v1host'" in b and "quiet period of 60 s" in b
    (b,) = facts(sightings=[seen("raw", 5)]).retire_blockers(60, False)
    assert "major-raw session" in b  # a raw session writes as a v1 writer
    assert facts(sightings=[seen("2", 5)]).retire_blockers(60, False) == []  # v2 hosts do not block
    (b,) = facts(seats=[seat(3)]).retire_blockers(60, False)
    assert "a seat is serving" in b
    assert facts(seats=[seat(3, stopped=True)]).retire_blockers(60, False) == []  # said it stopped
    assert facts(seats=[seat(31)]).retire_blockers(60, False) == []  # three heartbeats missed
    (b,) = facts(live_claims={2: 4, 1: 0}).retire_blockers(60, False)
    assert "claimed sessions are open now (major 2: 4)" in b


def test_retire_state_and_uninstall_blockers():
    assert facts(state="retired", eras={"2": 3}).retire_blockers(60, False) == []  # nothing left to do
    assert facts(state="uninstalling").retire_blockers(60, False) == ["the seat's schema is uninstalling"]
    assert "the way back is closed" in facts(state="retired").uninstall_blockers(keep_era3=True)[0]
    f = facts(era3_without_original=[("r1", "no v1 original (created by a v2 writer)")])
    (b,) = f.uninstall_blockers(keep_era3=False)
    assert b.startswith("1 era-3 runs have no v1 original") and "--keep-era3" in b
    assert f.uninstall_blockers(keep_era3=True) == []
    assert len(facts(seats=[seat(1)]).uninstall_blockers(keep_era3=True)) == 1


def test_status_report_names_every_fact_and_blocker():
    a = load_artifacts()
    f = facts(meta={"layout_version": "8", "artifact_digest": a.digest, "artifact_tag": a.tag,
                    "declarations_digest": "x", "updated_at": "2026-12-05"},
              eras={"2": 2, "created": 1, "backfill-repair": 1}, era2_open=1,
              newest_era2=("timestamp", NOW), era3_without_original=[("r9", "no v1 original (created by a v2 "
                                                                             "writer)")],
              sightings=[seen("1", 5)], seats=[seat(2)], live_claims={0: 1}, counters={"runs_stamped_created": 1})
    j = status_json(f, a, Config(), 3600)
    assert j["runs"] == {"total": 4, "era2": 2, "era2Open": 1, "era3": 2,
                         "era3BySource": {"backfill-repair": 1, "created": 1}}
    assert j["artifacts"]["match"] and not j["declarations"]["match"]
    assert j["liveClaims"] == {"raw": 1} and j["seats"][0]["serving"]
    assert not j["retire"]["possible"] and not j["retire"]["possibleWithAllowEra2"]
    assert not j["uninstall"]["possible"] and not j["uninstall"]["possibleWithKeepEra3"]  # the serving seat
    text = status_text(j)
    for line in ("the seat is installed (layout 8", "era 2 (v1 logs, unstamped): 2, open (no terminal event): 1",
                 "converted by backfill --repair 1, stamped by a seat (created by a v2 writer) 1",
                 "newest era-2 append: 2026-12-05T03:00:00+00:00 (by events.timestamp)",
                 "era-3 runs without a v1 original: 1: r9", "(this configuration's:", "major 1   user app",
                 "seats serving: h/1/127.0.0.1:6543", "claimed sessions open now: major raw: 1",
                 "retire: not possible now:", "  - 2 era-2 runs remain", "uninstall: not possible now:",
                 "audit: no verdict recorded"):
        assert line in text, (line, text)


def test_terminal_v1_spellings_come_from_the_codemap():
    a = load_artifacts()
    names = terminal_v1(a)
    assert names and all(a.v1_to_v2[n] in ("run.completed", "run.failed", "run.cancelled") for n in names)


def test_addendum_says_what_was_retired():
    text = addendum({"retiredAt": "2026-12-05T03:00:00+00:00", "version": "0.1.0", "role": "owner",
                     "database": "openwop", "artifactTag": "t", "artifactDigest": "d", "declarationsDigest": "e",
                     "runs": {"total": 5, "era2": 0, "era3": 5, "era3BySource": {"backfill": 4, "created": 1}},
                     "counters": Counter(), "lastV1Seen": None, "quietSeconds": 60.0,
                     "removed": ["views events_m2"], "kept": ["openwop_seat.run_era"]})
    assert text.startswith("## Addendum: the seat retired")
    assert "era 3: 5 (backfill 4, created 1)" in text and "digest `d`" in text and "openwop_seat.run_era" in text


@pytest.mark.parametrize("argv, ok", [
    (["status", "--dsn", "x"], True), (["status", "--dsn", "x", "--json", "--quiet", "5"], True),
    (["retire", "--dsn", "x", "--allow-era2", "--drop-evidence", "--adr", "f", "--quiet", "0"], True),
    (["uninstall", "--dsn", "x", "--keep-era3", "--no-progress"], True),
    (["status"], False), (["retire", "--dsn", "x", "--keep-era3"], False),
    (["uninstall", "--dsn", "x", "--allow-era2"], False), (["status", "--dsn", "x", "--quiet", "soon"], False),
])
def test_flags(argv, ok, capsys):
    parser = build_parser()
    if ok:
        assert parser.parse_args(argv).command == argv[0]
    else:
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 2
