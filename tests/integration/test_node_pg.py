"""node-postgres (the host service's driver) directly against PostgreSQL and through the seat.

Each scenario of tests/node/scenarios.js runs twice: once against the cluster's
own port and once against the seat's, each with its own freshly created tables
shaped like the host's. The two JSON documents the script prints must be
identical, and must also hold the values the scenario is known to produce
(checksums the script computes client-side from what it sent, a sha256 the
test computes itself, known SQLSTATEs), so a scenario that silently did
nothing, or data corrupted on the way in, fails too. Scenarios with a second
session (a contender, a monitor) open it on the database's own port (PEER_URL)
in both runs; top-level `_` keys (timings) are checked, not compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from harness import PASSWORD

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
SCRIPT = NODE_DIR / "scenarios.js"
NODE = shutil.which("node")

# node and node-postgres are required: conftest fails the run with the install command if they are missing.

DB = "app"
HOST_USER = "host_user"
PASSWORDS = {"host_user": None, "md5_user": PASSWORD, "scram_user": PASSWORD}
BASE_MS = 1704164645000  # 2024-01-02T03:04:05Z, the scenarios' fixed timestamp base


def direct_url(pg, user: str, dbname: str = DB, password: str | None = None) -> str:
    auth = f"{user}:{password}" if password else user
    return f"postgresql://{auth}@127.0.0.1:{pg.port}/{dbname}"


def run_node(scenario: str, url: str, env: dict[str, str] | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([NODE, str(SCRIPT), scenario, url], cwd=NODE_DIR, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        pytest.fail(f"node scenario {scenario!r} against {url} exited {proc.returncode}:\n{proc.stderr}")
    return proc


@pytest.fixture
def host_tables(pg):
    """Factory: a fresh set of the host's tables (runs, events, a COPY target), owned by host_user in `app`."""
    made: list[str] = []

    def make(tag: str) -> dict[str, str]:
        suffix = f"{os.getpid()}_{time.monotonic_ns() % 10**9}_{tag}"
        names = {"RUNS_TABLE": f"runs_{suffix}", "EVENTS_TABLE": f"events_{suffix}", "COPY_TABLE": f"copyt_{suffix}"}
        pg.psql(f"""
            CREATE TABLE {names['RUNS_TABLE']} (
                run_id text PRIMARY KEY, tenant_id text NOT NULL, status text, inputs jsonb, metadata jsonb,
                parent_run_id text, created_at timestamptz DEFAULT now());
            CREATE TABLE {names['EVENTS_TABLE']} (
                event_id text PRIMARY KEY, run_id text NOT NULL, sequence integer NOT NULL, type text NOT NULL,
                node_id text, payload jsonb, timestamp timestamptz NOT NULL, causation_id text,
                UNIQUE (run_id, sequence));
            CREATE TABLE {names['COPY_TABLE']} (id integer NOT NULL, label text, doc jsonb);
        """, user=HOST_USER, dbname=DB)
        made.extend(names.values())
        return names

    yield make
    for name in made:
        pg.psql(f"DROP TABLE IF EXISTS {name}", user=HOST_USER, dbname=DB, check=False)


def pair(pg, seat, host_tables, scenario: str, user: str = HOST_USER) -> tuple[dict, dict]:
    """Run the scenario directly and through the seat; return both documents.

    PEER_URL, the scenario's second session where it has one, is the database's
    own port in both runs.
    """
    password = PASSWORDS[user]
    peer = {"PEER_URL": direct_url(pg, user, password=password)}
    direct = run_node(scenario, direct_url(pg, user, password=password), {**host_tables("direct"), **peer})
    relayed = run_node(scenario, seat.url(user, DB, password), {**host_tables("seat"), **peer})
    return json.loads(direct.stdout), json.loads(relayed.stdout)


def deterministic(doc: dict) -> dict:
    """The document without its top-level `_` keys (timings), which differ run to run."""
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def both(pg, seat, host_tables, scenario: str, user: str = HOST_USER) -> dict:
    """Run the scenario directly and through the seat; assert identical output; return it."""
    d, s = pair(pg, seat, host_tables, scenario, user)
    assert deterministic(s) == deterministic(d), f"{scenario}: output through the seat differs from direct"
    return d


def iso(i: int) -> str:
    t = time.gmtime(BASE_MS // 1000 + i)
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", t)


# -- 1. authentication + simple and parameterised queries

@pytest.mark.parametrize("user", ["host_user", "md5_user", "scram_user"])
def test_auth_and_queries(pg, seat, host_tables, user):
    out = both(pg, seat, host_tables, "auth", user)
    assert out["simple"]["rows"] == [{"current_user": user}]
    assert out["simple"]["fields"] == [["current_user", 19, "text"]]
    assert out["param"]["rows"] == [{"n": 42}]
    assert out["param"]["fields"] == [["n", 23, "text"]]
    assert out["textParam"]["rows"] == [{"s": "abcd", "isnull": True}]


@pytest.mark.parametrize("user", ["md5_user", "scram_user"])
def test_wrong_password_fails_the_same(pg, seat, user):
    direct = run_node("auth", direct_url(pg, user, password="wrong"), check=False)
    relayed = run_node("auth", seat.url(user, DB, "wrong"), check=False)
    assert direct.returncode != 0 and relayed.returncode != 0
    assert "sqlstate 28P01" in direct.stderr
    assert "sqlstate 28P01" in relayed.stderr, relayed.stderr


# -- 2./3. the host's append hot path and log reads

def test_append_hot_path(pg, seat, host_tables):
    out = both(pg, seat, host_tables, "append")
    inserted = [a["insert"] for a in out["appends"]]
    assert [i["rowCount"] for i in inserted] == [1] * 6
    assert all(i["command"] == "INSERT" for i in inserted)
    rows = [i["rows"][0] for i in inserted]
    assert [r["sequence"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["event_id"] for r in rows] == [f"evt-{i}" for i in range(1, 7)]
    assert [r["timestamp"] for r in rows] == [iso(i) for i in range(6)]
    assert rows[1]["payload"] == {"i": 1, "note": "event 2 \u00e9\u00e8 \u2713",
                                  "nested": {"ok": False, "list": [1, 2]}}
    assert rows[0]["causation_id"] is None and rows[3]["causation_id"] == "evt-3"
    assert out["appends"][0]["lock"]["rows"] == [{"pg_advisory_xact_lock": ""}]
    assert out["other"]["insert"]["rows"][0]["sequence"] == 1
    assert [r["sequence"] for r in out["page"]["rows"]] == [3, 4, 5]
    assert out["fullPage"]["rows"] == rows
    assert out["head"]["rows"] == [{"coalesce": 6}]
    assert out["emptyHead"]["rows"] == [{"coalesce": 0}]
    # RETURNING * describes the table's own columns, types included (text, int4, jsonb, timestamptz)
    assert out["page"]["fields"] == [
        ["event_id", 25, "text"], ["run_id", 25, "text"], ["sequence", 23, "text"], ["type", 25, "text"],
        ["node_id", 25, "text"], ["payload", 3802, "text"], ["timestamp", 1184, "text"],
        ["causation_id", 25, "text"]]


# -- 4. 24,000 bind parameters in one statement

def test_bulk_insert_24000_parameters(pg, seat, host_tables):
    out = both(pg, seat, host_tables, "bulk")
    assert out["paramCount"] == 24000
    assert out["insert"]["command"] == "INSERT" and out["insert"]["rowCount"] == 3000
    check = out["check"]["rows"][0]
    assert (check["n"], check["lo"], check["hi"]) == (3000, 1, 3000)
    assert check["checksum"] == out["expectedChecksum"]


# -- 5. the runs table

def test_runs_shapes(pg, seat, host_tables):
    out = both(pg, seat, host_tables, "runs")
    assert [i["rows"][0]["run_id"] for i in out["inserts"]] == [f"run-{i}" for i in range(1, 6)]
    first = out["inserts"][1]["rows"][0]
    assert first == {"run_id": "run-2", "tenant_id": "tenant-0", "status": "queued",
                     "inputs": {"x": 2, "s": "in\u00fcts"}, "metadata": {"attempt": 0, "tags": ["a", "b"]},
                     "parent_run_id": "run-1", "created_at_is_date": True}
    assert out["lookup"]["rows"][0]["run_id"] == "run-3" and out["lookup"]["rowCount"] == 1
    assert out["missing"]["rows"] == [] and out["missing"]["rowCount"] == 0
    assert out["update"]["command"] == "UPDATE" and out["update"]["rowCount"] == 1
    # run-1 is running, run-2 is locked by another session: the sweeper skips both
    assert out["sweep1"]["held"] == [{"run_id": "run-2"}]
    assert [r["run_id"] for r in out["sweep1"]["rows"]] == ["run-3", "run-4"]
    assert all(r["metadata"]["claimedBy"] == "sweeper-1" for r in out["sweep1"]["rows"])
    assert [r["run_id"] for r in out["sweep2"]["rows"]] == ["run-2", "run-5"]
    assert [r["status"] for r in out["all"]["rows"]] == ["running", "claimed", "claimed", "claimed", "claimed"]


# -- 6. errors

def test_errors_keep_sqlstate_and_connection(pg, seat, host_tables):
    out = both(pg, seat, host_tables, "errors")
    codes = {k: out[k]["code"] for k in ("duplicateAppend", "duplicateSequence", "inTx", "aborted", "syntax",
                                         "badCast", "divByZero", "noTable", "multi")}
    assert codes == {"duplicateAppend": "23505", "duplicateSequence": "23505", "inTx": "23505", "aborted": "25P02",
                     "syntax": "42601", "badCast": "22P02", "divByZero": "22012", "noTable": "42P01",
                     "multi": "22012"}
    assert out["duplicateAppend"]["constraint"] == "<events>_pkey"
    assert out["duplicateAppend"]["detail"] == "Key (event_id)=(dup-1) already exists."
    assert out["duplicateSequence"]["constraint"] == "<events>_run_id_sequence_key"
    assert out["afterDuplicate"]["rows"] == [{"n": 2}]
    assert out["afterSequence"]["rows"] == [{"same": False}]
    assert out["rollback"]["command"] == "ROLLBACK"
    assert out["final"]["rows"] == [{"n": 1}]


# -- 7. COPY through pg-copy-streams

def test_copy_out_and_in(pg, seat, host_tables):
    out = both(pg, seat, host_tables, "copy")
    expected = b"".join(f"{g}\t{hashlib.md5(str(g).encode()).hexdigest()}\n".encode() for g in range(1, 100001))
    assert out["copyOut"] == {"sha256": hashlib.sha256(expected).hexdigest(), "bytes": len(expected),
                              "lines": 100000}
    assert out["copyIn"]["rowCount"] == 100000
    check = out["copyIn"]["check"]["rows"][0]
    assert check["n"] == 100000
    assert check["checksum"] == out["copyIn"]["expectedChecksum"]
    assert out["badError"]["code"] == "22P02"
    assert out["after"]["rows"] == [{"n": 100000}]


# -- 8. a pool of 10 with 200 concurrent queries

def test_pool_200_concurrent(pg, seat, host_tables):
    out = both(pg, seat, host_tables, "pool")
    assert out["values"] == [[i * 2, f"q{i}"] for i in range(200)]
    assert out["distinctBackends"] == 10
    assert out["totalCount"] == 10


# -- 9. a named prepared statement, 200 executions on one client

def test_named_prepared_statement_parsed_once(pg, seat, host_tables):
    out = both(pg, seat, host_tables, "prepared")
    assert out["values"] == [i * 2 for i in range(200)]
    assert out["last"]["rows"] == [{"v": 398}] and out["last"]["fields"] == [["v", 23, "text"]]
    # the driver sent one Parse, and the server answered it once: the other 199 runs are Bind/Execute only
    assert out["sent"] == {"parse": 1, "bind": 200, "execute": 200}
    assert out["received"] == {"parseComplete": 1, "bindComplete": 200, "rowDescription": 200, "dataRow": 200,
                               "commandComplete": 200, "readyForQuery": 200}
    # server side: one statement named get-one, prepared by the protocol (not SQL PREPARE) and never again
    stmt = {"name": "get-one", "statement": "select $1::int * 2 as v", "types": "{integer}", "from_sql": False}
    assert out["afterFirst"] == [{**stmt, "executions": 1}]
    assert out["afterLast"] == [{**stmt, "executions": 200}]
    assert out["prepareTimeUnchanged"] is True
    assert out["otherSession"] == []


# -- 10. LISTEN/NOTIFY between two clients

def test_listen_notify_between_two_clients(pg, seat, host_tables):
    out = both(pg, seat, host_tables, "notify")
    assert out["listen"]["command"] == "LISTEN"
    assert out["beforeCommit"] == 2  # the transaction's notifications wait for its COMMIT
    assert out["afterSelf"] == 6  # A's own NOTIFY is delivered by the time its statement completes
    assert out["notifications"] == [
        ["chan", "x", "B"],
        ["chan", "y \u00e9\u2713 " + "z" * 2000, "B"],
        ["chan", "tx-1", "B"], ["chan", "tx-2", "B"], ["chan", "tx-3", "B"],  # the repeated tx-1 is folded
        ["chan", "self", "A"],
        ["other", "end", "B"],  # and nothing on chan after UNLISTEN
    ]


# -- 11. a session-level advisory lock held across statements

def test_advisory_lock_held_across_statements(pg, seat, host_tables):
    out = both(pg, seat, host_tables, "advisory")
    assert out["lock"]["rows"] == [{"pg_advisory_lock": ""}]
    # B (on the database's own port) cannot take the lock while A holds it, whatever A runs in between
    assert out["trials"] == [["before", True], ["afterLock", False], ["afterSimple", False], ["afterExtended", False],
                             ["afterTransaction", False], ["afterError", False], ["afterUnlock", True]]
    assert out["error"] == "22012"
    assert out["holders"] == [["A", True]]
    assert out["waiting"] == [["A", True], ["other", False]]
    assert out["order"] == ["A unlocking", "B acquired"]
    assert out["samePid"] is True
    assert out["unlock"]["rows"] == [{"released": True}]


# -- 12. cancelling a running query with the driver's Client#cancel

def test_cancel_running_query(pg, start_seat, host_tables):
    seat = start_seat()  # its own seat, so the cancel counter is this test's alone
    d, s = pair(pg, seat, host_tables, "cancel")
    for where, out in (("direct", d), ("seat", s)):
        for label in ("simple", "extended"):
            run = out["runs"][label]
            assert run["sleeping"] == {"state": "active", "wait_event": "PgSleep"}, (where, label)
            assert run["error"] == {"code": "57014", "message": "canceling statement due to user request",
                                    "severity": "ERROR"}, (where, label)
            assert run["under2s"] is True, (where, label, out["_elapsedMs"])
            assert run["cancelErrors"] == []
            assert run["after"]["rows"] == [{"still_usable": 1}]
        assert out["samePid"] is True
    assert deterministic(s) == deterministic(d)
    with urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert re.search(r"^openwop_seat_cancel_requests(?:_total)? 2(?:\.0)?$", metrics, re.M), metrics
