"""Payload projection (issues #4, #17): the frozen payload-projection-v1 and -v2 fixtures through the seat,
with real drivers. payload-projection-v2 names the v1 cases whose expectation it supersedes (ADR 0007); the
v1 test reads every other v1 case, and each superseded one is read with its new expectation from v2.

Each fixture case is one era-2 run of one event, stored directly (no seat: a v1 writer). A major-2 reader
through the seat must read the expected type and the expected payload *bytes* (expected-major2.json, which
is PostgreSQL's own jsonb text of the hand-written expectation in cases.json), or the expected refusal.
A major-1 reader reads every payload as stored.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import asyncpg
import psycopg
import pytest
from psycopg.adapt import Loader
from psycopg.types.json import Jsonb

FIXTURE_ROOT = Path(__file__).resolve().parents[1] / "fixtures"
SETS = {"pp1": "payload-projection-v1", "pp2": "payload-projection-v2"}


def _fixture(name: str) -> tuple[dict, dict]:
    return (json.loads((FIXTURE_ROOT / name / "cases.json").read_text()),
            json.loads((FIXTURE_ROOT / name / "expected-major2.json").read_text()))


FIXTURES = {prefix: _fixture(name) for prefix, name in SETS.items()}
SUPERSEDED = {(prefix, case) for doc, _ in FIXTURES.values()
              for old, cases in doc.get("supersedes", {}).items()
              for prefix in [p for p, n in SETS.items() if n == old] for case in cases}
# Every case read, with its run id and expected result: v1 minus what v2 supersedes, then v2.
CASES = [dict(c, rid=f"{prefix}.{c['name']}", want=expected[c["name"]])
         for prefix, (doc, expected) in FIXTURES.items() for c in doc["cases"] if (prefix, c["name"]) not in SUPERSEDED]
NODE_DIR = Path(__file__).resolve().parents[1] / "node"
PAGE = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
SQLSTATE = "OW002"


def run_id(case: dict) -> str:
    return case["rid"]


def stored_payload_text(pg, case: dict) -> str:
    return pg.psql(f"SELECT payload::text FROM events WHERE run_id = '{run_id(case)}'").strip()


class TextJsonb(Loader):
    def load(self, data):
        return bytes(data).decode()


@pytest.fixture(scope="module")
def loaded(pg):
    """The fixture runs, stored directly (era 2: no run_era row), replacing any earlier copy."""
    ids = [run_id(c) for c in CASES]
    with psycopg.connect(pg.dsn(dbname="postgres"), autocommit=True) as conn:
        with conn.transaction():
            conn.execute("DELETE FROM events WHERE run_id = ANY(%s)", (ids,))
            conn.execute("DELETE FROM runs WHERE run_id = ANY(%s)", (ids,))
            conn.execute("DELETE FROM openwop_seat.run_era WHERE run_id = ANY(%s)", (ids,))
            for c in CASES:
                e = c["event"]
                if c["tenantId"] is not None:
                    conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, %s)", (run_id(c), c["tenantId"]))
                conn.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                             "VALUES (%s, %s, %s, %s, %s, %s, '2026-09-03T08:00:00Z')",
                             (f"ev.{run_id(c)}", run_id(c), e["sequence"], e["type"], e["nodeId"], Jsonb(e["payload"])))
    return ids


@pytest.fixture(scope="module")
def pp_seat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1}]})


# ---------------------------------------------------------------- readers
# {run_id: ("ok", type, text) | ("error", ...)}


def read_asyncpg(url: str, app: str | None, ids: list[str]) -> dict:
    async def go():
        conn = await asyncpg.connect(url, server_settings={"application_name": app} if app else {})
        out = {}
        try:
            stmt = await conn.prepare(PAGE)  # binary results: jsonb arrives with its version byte
            for rid in ids:
                try:
                    rows = await stmt.fetch(rid, -1, 1000)
                    out[rid] = ("ok", rows[0]["type"], rows[0]["payload"])
                except asyncpg.PostgresError as e:
                    out[rid] = ("error", e.sqlstate, str(e), e.detail)
        finally:
            await conn.close()
        return out

    return asyncio.run(go())


def read_psycopg(dsn: str, app: str | None, ids: list[str]) -> dict:
    out = {}
    with psycopg.connect(dsn, autocommit=True, application_name=app or "") as conn:
        conn.adapters.register_loader("jsonb", TextJsonb)
        for rid in ids:
            try:
                row = conn.execute(PAGE.replace("$1", "%s").replace("$2", "%s").replace("$3", "%s"),
                                   (rid, -1, 1000)).fetchone()
                out[rid] = ("ok", row[3], row[5])
            except psycopg.Error as e:
                out[rid] = ("error", e.sqlstate, e.diag.message_primary, e.diag.message_detail)
    return out


def read_node(url: str, app: str | None, ids: list[str]) -> dict:
    request = {"mode": "page", "url": url, "applicationName": app, "runs": ids}
    proc = subprocess.run(["node", str(NODE_DIR / "golden.js")], input=json.dumps(request), cwd=NODE_DIR,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = {}
    for rid, got in json.loads(proc.stdout).items():
        if "error" in got:
            e = got["error"]
            out[rid] = ("error", e["code"], e["message"], e["detail"])
        else:
            row = dict(zip(got["fields"], got["rows"][0]))
            out[rid] = ("ok", row["type"], row["payload"])
    return out


READERS = {"asyncpg-binary": read_asyncpg, "psycopg-text": read_psycopg, "node-postgres-text": read_node}


def _connect_args(reader: str, seat, app):
    return (seat.url() if reader != "psycopg-text" else seat.dsn()), app


# ---------------------------------------------------------------- tests


def test_superseded_cases_are_restated_in_the_newer_fixture():
    """A v1 case v2 supersedes is in v2 under the same name, with an expectation that differs."""
    assert SUPERSEDED == {("pp1", "variable-changed-carrier-taken")}
    for prefix, name in SUPERSEDED:
        old = FIXTURES[prefix][1][name]
        new = FIXTURES["pp2"][1][name]
        assert old != new, name


@pytest.mark.parametrize("prefix", list(SETS))
def test_expected_bytes_are_postgres_text_of_the_hand_written_expectations(pg, prefix):
    """expected-major2.json holds exactly what PostgreSQL prints for each expectation in cases.json."""
    doc, expected = FIXTURES[prefix]
    assert [c["name"] for c in doc["cases"]] == list(expected)
    with psycopg.connect(pg.dsn(dbname="postgres"), autocommit=True) as conn:
        for c in doc["cases"]:
            c = dict(c, rid=f"{prefix}.{c['name']}")
            want, exp = expected[c["name"]], c["expect"]
            if "error" in exp:
                assert want == {"error": exp["error"], "type": exp["type"], "keys": exp["keys"]}, c["name"]
                continue
            payload = json.dumps(exp["payload"]).replace("<run>", run_id(c))
            text = conn.execute("SELECT %s::jsonb::text", (payload,)).fetchone()[0]
            assert want == {"type": exp["type"], "payloadText": text}, c["name"]
            if not exp["changed"]:
                stored = conn.execute("SELECT %s::jsonb::text", (json.dumps(c["event"]["payload"]),)).fetchone()[0]
                assert stored == text, f"{c['name']}: an unchanged case must expect the stored bytes"


@pytest.mark.parametrize("reader", list(READERS))
def test_major_2_reads_the_expected_projection_bytes_or_refusal(loaded, pp_seat, reader):
    url, app = _connect_args(reader, pp_seat, None)
    got = READERS[reader](url, app, loaded)
    for c in CASES:
        rid, want = run_id(c), c["want"]
        result = got[rid]
        where = f"{reader} {c['name']}"
        if "error" in want:
            assert result[0] == "error", f"{where}: read {result}"
            _, sqlstate, message, detail = result
            assert sqlstate == SQLSTATE and message.startswith("payload_unprojectable: "), where
            envelope = json.loads(detail)
            assert envelope["error"] == "payload_unprojectable"
            assert envelope["details"] == {"type": want["type"], "keys": want["keys"], "eventId": f"ev.{rid}",
                                           "sequence": c["event"]["sequence"], "runId": rid}, where
            for key in want["keys"]:
                assert key in message, f"{where}: the message names {key}"
        else:
            assert result[0] == "ok", f"{where}: {result}"
            assert result[1] == want["type"], where
            assert result[2] == want["payloadText"], f"{where}: payload bytes differ: {result[2]}"


@pytest.mark.parametrize("reader", list(READERS))
def test_major_1_reads_every_payload_as_stored(loaded, pp_seat, pg, reader):
    url, app = _connect_args(reader, pp_seat, "v1-host")
    got = READERS[reader](url, app, loaded)
    for c in CASES:
        result = got[run_id(c)]
        assert result[0] == "ok", f"{reader} {c['name']}: {result}"
        assert result[1] == c["event"]["type"]
        assert result[2] == stored_payload_text(pg, c), f"{reader} {c['name']}"


def test_unchanged_payloads_keep_the_servers_bytes(loaded, pp_seat, pg):
    """A payload the projection leaves equal is the stored text, byte for byte (not re-serialised)."""
    got = read_psycopg(pp_seat.dsn(), None, loaded)
    unchanged = [c for c in CASES if "error" not in c["expect"] and not c["expect"]["changed"]]
    assert len(unchanged) >= 8
    for c in unchanged:
        assert got[run_id(c)][2] == stored_payload_text(pg, c), c["name"]


def test_numbers_and_strings_are_jsonb_s_own_in_projected_payloads(pg, pp_seat):
    """A projected payload is PostgreSQL's jsonb text: 1.50 keeps its scale, big integers their digits."""
    rid = "pp1.numbers"
    stored = '{"name": "x", "next": 1.50, "value": 123456789012345678901234567890, "s": "\\u00e9\\n"}'
    pg.psql(f"DELETE FROM events WHERE run_id = '{rid}'; INSERT INTO events (event_id, run_id, sequence, type, "
            f"payload, timestamp) VALUES ('ev.{rid}', '{rid}', 1, 'variable.changed', '{stored}', now())")
    got = read_psycopg(pp_seat.dsn(), None, [rid])[rid]
    assert got[0] == "ok", got
    assert got[2] == ('{"name": "x", "next": 1.50, '
                      '"x-v1": {"s": "é\\n", "value": 123456789012345678901234567890}}')


def test_a_refused_row_leaves_the_transaction_as_postgres_would(loaded, pp_seat):
    with psycopg.connect(pp_seat.dsn()) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT * FROM events WHERE run_id = %s", ("pp2.variable-changed-both-carriers-taken",))
        assert e.value.sqlstate == SQLSTATE
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.rollback()
        assert conn.execute("SELECT type FROM events WHERE run_id = %s",
                            ("pp2.variable-changed-both-carriers-taken",)).fetchone() == ("variable.changed",)


def test_fork_of_a_projected_prefix_reads_back_byte_equal(pg, pp_seat):
    """Fork as the host does it: read the parent (era 2) as major 2, append each event to a new run through the
    seat (stamped era 3), read the child: type, sequence and payload bytes equal the parent's projected read."""
    parent, child = "pp1.fork-parent", "pp1.fork-child"
    ok = [c for c in CASES if "error" not in c["expect"] and c["event"]["type"] != "run.started"]
    started = next(c for c in CASES if c["name"] == "run-started-without-owner")
    with psycopg.connect(pg.dsn(dbname="postgres"), autocommit=True) as conn, conn.transaction():
        for rid in (parent, child):
            conn.execute("DELETE FROM events WHERE run_id = %s", (rid,))
            conn.execute("DELETE FROM runs WHERE run_id = %s", (rid,))
            conn.execute("DELETE FROM openwop_seat.run_era WHERE run_id = %s", (rid,))
        conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (parent,))
        for seq, c in enumerate([started] + ok):
            e = c["event"]
            conn.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                         "VALUES (%s, %s, %s, %s, %s, %s, now())",
                         (f"ev.{parent}.{seq}", parent, seq, e["type"], e["nodeId"], Jsonb(e["payload"])))
    page = "SELECT sequence, type, payload FROM events WHERE run_id = %s ORDER BY sequence"
    with psycopg.connect(pp_seat.dsn(), autocommit=True) as conn:
        conn.adapters.register_loader("jsonb", TextJsonb)
        prefix = conn.execute(page, (parent,)).fetchall()
        assert len(prefix) == len(ok) + 1
        assert '"subjectId": "legacy"' in prefix[0][2]  # the legacy Subject is in the prefix the fork copies
        with conn.transaction():
            conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (child,))
            for seq, t, payload in prefix:
                conn.execute("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
                             "VALUES (%s, %s, %s, %s, %s::jsonb, now())", (f"ev.{child}.{seq}", child, seq, t, payload))
        copy = conn.execute(page, (child,)).fetchall()
    assert pg.psql(f"SELECT era FROM openwop_seat.run_era WHERE run_id = '{child}'").strip() == "3"
    assert copy == prefix
    # and the child is stored in v2 vocabulary, its payloads as read (nothing left to project)
    stored = pg.psql(f"SELECT string_agg(type, ',' ORDER BY sequence) FROM events WHERE run_id = '{child}'").strip()
    assert stored.split(",") == [t for _, t, _ in prefix]


def test_an_append_whose_returned_payload_cannot_be_seated_fails_and_stores_nothing(pg, pp_seat):
    """RETURNING is a read: a major-2 append to an era-2 run returns the projected row, and a payload its
    v2 definition cannot seat fails the append (OW002) instead of being stored for every later read to fail."""
    rid = "pp1.append-era2"
    pg.psql(f"DELETE FROM events WHERE run_id = '{rid}'; DELETE FROM runs WHERE run_id = '{rid}'; "
            f"INSERT INTO runs (run_id, tenant_id) VALUES ('{rid}', 'acme')")
    append = ("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
              "VALUES (%s, %s, %s, %s, 'n-1', %s::jsonb, now()) RETURNING *")
    with psycopg.connect(pp_seat.dsn(), autocommit=True) as conn:
        conn.adapters.register_loader("jsonb", TextJsonb)
        row = conn.execute(append, (f"ev.{rid}.1", rid, 1, "variable.changed", '{"name": "n", "value": 1}')).fetchone()
        assert row[5] == '{"name": "n", "x-v1": {"value": 1}}'  # returned as a major-2 page would read it
        with pytest.raises(psycopg.Error) as e:
            conn.execute(append, (f"ev.{rid}.2", rid, 2, "provider.usage",
                                  '{"provider": "p", "model": "m", "inputTokens": 1, "outputTokens": 1, '
                                  '"latencyMs": 3}'))
        assert e.value.sqlstate == SQLSTATE
        assert json.loads(e.value.diag.message_detail)["details"]["keys"] == ["latencyMs"]
    assert pg.psql(f"SELECT string_agg(sequence::text, ',') FROM events WHERE run_id = '{rid}'").strip() == "1"


def test_the_translated_relation_is_flattened_and_projects_by_one_call(pg, loaded):
    """The read relation is a view PostgreSQL flattens into the statement: the page's run filter reaches the
    index of both arms of the union (the host's table for runs not in the v2 store, the store for filled ones,
    ADR 0015); its payload check is one plpgsql call per era-2 row, planned once per session, with no per-type
    branch inlined into the statement's plan."""
    from proxy.config import HostConfig
    from proxy.readpath.classify import Classifier

    sql = Classifier(HostConfig(), 2).classify(
        "SELECT * FROM events WHERE run_id = 'pp1.provider-usage' ORDER BY sequence").text
    plan = pg.psql(f"EXPLAIN (VERBOSE) {sql}")
    assert "openwop_seat.payload_v2(" in plan, plan
    assert "Index Cond: (openwop_seat_e.run_id = 'pp1.provider-usage'::text)" in plan, plan
    # the store's arm reads a filled run's rows up to its mark (ADR 0015's prefix-filled runs): the run's filter is the
    # first column of its index condition
    assert re.search(r"Index Cond: \(+openwop_seat_s\.run_id = 'pp1\.provider-usage'::text\)", plan), plan
    assert "Seq Scan on public.events" not in plan and "Seq Scan on openwop_seat.events_v2_store" not in plan, plan
    assert "fast_v2" not in plan and "agent.toolCalled'::text THEN" not in plan, plan


def test_per_statement_helpers_are_plpgsql_planned_once_per_session(pg):
    """era_now and returned_v2p (RETURNING of appends), session_major (the append trigger) and fast_v2 are not
    inlined; as SQL functions PostgreSQL would parse and plan their bodies again in every statement that
    calls them."""
    langs = pg.psql("SELECT string_agg(p.proname || '=' || l.lanname, ',' ORDER BY p.proname) FROM pg_proc p "
                    "JOIN pg_language l ON l.oid = p.prolang JOIN pg_namespace n ON n.oid = p.pronamespace "
                    "WHERE n.nspname = 'openwop_seat' AND p.proname IN "
                    "('era_now', 'fast_v2', 'returned_v2p', 'session_major')").strip()
    assert langs == "era_now=plpgsql,fast_v2=plpgsql,returned_v2p=plpgsql,session_major=plpgsql"
