"""The writer rule through the seat: era-3 stamping, appends by era and major, spoofing, the secret.

test_writer_rule.py checks the rule in the database with sessions that claim
their major themselves.  Here the seat claims each session right after
authentication (major 2 by default; ``application_name`` ``v1-host`` is major
1 and ``ops`` is raw, which the seat relays unclaimed: ADR 0013), and the clients
are the host's own role (``host_user``: not a superuser, not the owner of
``openwop_seat``) speaking through real drivers: psycopg 3 and asyncpg for
every case, node-postgres with the host's append path for appends.  A
*direct* session connects to the database itself (psql, and psycopg for the
same attempts with bind parameters), so nobody claims it: a v1 writer.

Every run id is fresh, so the shared ``postgres`` database (tables ``runs`` and
``events``, migrated by conftest with ``CLAIM_SECRET``) needs no cleanup
between tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import asyncpg
import psycopg
import pytest

from harness import CLAIM_SECRET
from proxy.artifacts.load import load_artifacts
from proxy.db.layout import CLAIM_ONCE_ONLY_SQL, CLAIM_ONCE_SQL, CLAIM_SQL
from proxy.errors import ERRORS

A = load_artifacts()
HOST = "host_user"
RENAMED = sorted(A.renamed)  # v1 spellings the codemap renames
V2_RENAMED = [A.v1_to_v2[t] for t in RENAMED]  # their v2 names
UNCHANGED = "run.started"  # the same name in v1 and v2
VENDOR = "example.thing-happened"  # a registered vendor org, no codemap row
UNKNOWN = "foo.bar"  # neither
WRONG = f"not-the-secret-{uuid.uuid4().hex}"
NODE_DIR = Path(__file__).resolve().parents[1] / "node"
NODE = shutil.which("node")
HAVE_NODE = NODE is not None and (NODE_DIR / "node_modules" / "pg").is_dir()
APPS = {2: None, 1: "v1-host", "raw": "ops"}  # the seat's major -> the application_name that gets it
_ids = itertools.count()


def rid(prefix: str = "ws") -> str:
    return f"{prefix}-{next(_ids)}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def wseat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1},
                                         {"application_name": "ops", "major": "raw"}]})


@pytest.fixture(scope="module")
def host_function(pg):
    """A function of the host's that inserts a run: the seat parses only the call, so the stamp must come from
    the trigger. Its body runs no dynamic SQL and names no events table, so translated sessions may call it (a
    function that could read the events table is refused to them once the seat has seen it, within 2 s:
    test_leaks.py), and the result does not depend on when the seat looks."""
    pg.psql("CREATE OR REPLACE FUNCTION ws_new_run(id text) RETURNS void LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO runs (run_id, tenant_id) VALUES (id, 't'); END $$",
            user=HOST)
    yield "ws_new_run"
    pg.psql("DROP FUNCTION IF EXISTS ws_new_run(text)", check=False)


# --- the drivers, behind one small blocking interface ------------------------------------------


class Failed(Exception):
    """A server error, whichever driver got it."""

    def __init__(self, sqlstate: str | None, message: str, detail: str | None, hint: str | None):
        super().__init__(f"{sqlstate}: {message}")
        self.sqlstate, self.message, self.detail, self.hint = sqlstate, message, detail, hint


class Psycopg:
    name = "psycopg"

    def __init__(self, dsn: str):
        self.conn = psycopg.connect(dsn, autocommit=True)

    def q(self, sql: str, *params) -> list[tuple]:
        try:
            cur = self.conn.execute(sql, params or None)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []
        except psycopg.Error as e:
            raise Failed(e.sqlstate, e.diag.message_primary, e.diag.message_detail, e.diag.message_hint) from e

    def copy_runs(self, runs: list[str]) -> None:
        try:
            with self.conn.cursor().copy("COPY runs (run_id, tenant_id) FROM STDIN") as copy:
                for run in runs:
                    copy.write_row((run, "t"))
        except psycopg.Error as e:
            raise Failed(e.sqlstate, e.diag.message_primary, e.diag.message_detail, e.diag.message_hint) from e

    def close(self) -> None:
        self.conn.close()


class Asyncpg:
    name = "asyncpg"

    def __init__(self, url: str, app: str | None):
        self.loop = asyncio.new_event_loop()
        settings = {"application_name": app} if app else {}
        self.conn = self.loop.run_until_complete(asyncpg.connect(url, server_settings=settings))

    def _run(self, coro):
        try:
            return self.loop.run_until_complete(coro)
        except asyncpg.PostgresError as e:
            raise Failed(e.sqlstate, e.message, e.detail, e.hint) from e

    def q(self, sql: str, *params) -> list[tuple]:
        n = itertools.count(1)
        sql = re.sub(r"%s", lambda _: f"${next(n)}", sql)
        return [tuple(r) for r in self._run(self.conn.fetch(sql, *params))]

    def copy_runs(self, runs: list[str]) -> None:
        self._run(self.conn.copy_records_to_table("runs", records=[(r, "t") for r in runs],
                                                  columns=["run_id", "tenant_id"]))

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


DRIVERS = ["psycopg", "asyncpg"]


def via(seat, driver: str, major=2, user: str = HOST):
    """A session through the seat with that major (by its application_name)."""
    app = APPS[major]
    if driver == "psycopg":
        return Psycopg(seat.dsn(user=user, **({"application_name": app} if app else {})))
    return Asyncpg(seat.url(user), app)


def admin(pg) -> Psycopg:
    """The superuser, straight to the database (the owner of openwop_seat)."""
    return Psycopg(pg.dsn())


def sql1(pg, query: str, *params):
    conn = admin(pg)
    try:
        return conn.q(query, *params)
    finally:
        conn.close()


def psql(pg, script: str, user: str = HOST, stop: bool = True) -> subprocess.CompletedProcess:
    """psql straight to the database, the script on stdin, errors in verbose form (with SQLSTATE)."""
    return subprocess.run(
        [os.path.join(pg.bin, "psql"), "-X", "-At", "-v", "VERBOSITY=verbose", "-v", f"ON_ERROR_STOP={int(stop)}",
         "-d", pg.dsn(user=user), "-f", "-"], input=script, capture_output=True, text=True, timeout=60)


def psql_errors(stderr: str) -> list[Failed]:
    """The server errors psql printed (VERBOSITY verbose: ``ERROR:  CODE: message`` then DETAIL/HINT lines)."""
    out: list[Failed] = []
    for line in stderr.splitlines():
        line = re.sub(r"^psql:<stdin>:\d+: ", "", line)
        if m := re.match(r"ERROR:  ([0-9A-Z]{5}): (.*)$", line):
            out.append(Failed(m.group(1), m.group(2), None, None))
        elif out and line.startswith("DETAIL:  "):
            out[-1].detail = line[len("DETAIL:  "):]
        elif out and line.startswith("HINT:  "):
            out[-1].hint = line[len("HINT:  "):]
    return out


def refused(fn, sqlstate: str) -> Failed:
    with pytest.raises(Failed) as info:
        fn()
    assert info.value.sqlstate == sqlstate, info.value
    return info.value


def assert_envelope(err: Failed, code: str, etype: str, run: str, seq: int) -> str:
    """The writer rule's refusal: its SQLSTATE, ``code: sentence``, and the envelope as JSON in DETAIL."""
    assert err.sqlstate == ERRORS[code].sqlstate, err
    assert err.message.startswith(f"{code}: "), err.message
    sentence = err.message[len(code) + 2:]
    assert json.loads(err.detail) == {"error": code, "message": sentence,
                                      "details": {"type": etype, "runId": run, "sequence": seq}}
    return sentence


def era_rows(pg, run: str) -> list[tuple]:
    return sql1(pg, "SELECT era, source FROM openwop_seat.run_era WHERE run_id = %s", run)


def stored(pg, run: str) -> list[str]:
    return [t for (t,) in sql1(pg, "SELECT type FROM events WHERE run_id = %s ORDER BY sequence", run)]


def era2_run(pg) -> str:
    """A run created by a direct (unclaimed) session: era 2."""
    run = rid("e2")
    sql1(pg, "INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", run)
    assert era_rows(pg, run) == []
    return run


APPEND = ("INSERT INTO events (event_id, run_id, sequence, type, payload, \"timestamp\") "
          "VALUES (%s, %s, %s, %s, %s::jsonb, now()) RETURNING *")


def append(conn, run: str, seq: int, etype: str, payload=None) -> tuple:
    """One append; returns the RETURNING row (every column of events).

    The default payload has keys no v2 definition declares: fine where RETURNING is not projected (era 3,
    major 1, raw), but a major-2 append to an era-2 run reads it back projected, so those pass their own."""
    payload = {"seq": seq, "note": "\u00e9 \u2713"} if payload is None else payload
    rows = conn.q(APPEND, f"{run}-{seq}", run, seq, etype, json.dumps(payload))
    assert len(rows) == 1
    return rows[0]


def node(request: dict) -> object:
    """tests/node/golden.js: the host's append path (BEGIN; advisory lock; the next-sequence CTE; COMMIT)."""
    proc = subprocess.run([NODE, str(NODE_DIR / "golden.js")], input=json.dumps(request), cwd=NODE_DIR,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def needs_node(test):
    """node and node-postgres are required (conftest checks them once for the whole run)."""
    return test


def node_append(seat, major, run: str, types: list[str], payload=None) -> list[dict]:
    """The host's append of ``types``; each payload is ``payload``, or {"i": i} (see append() on why)."""
    evs = [{"eventId": f"{run}-n{i}", "type": t, "nodeId": None, "payload": {"i": i} if payload is None else payload,
            "timestamp": "2024-01-02T03:04:05.000Z", "causationId": None} for i, t in enumerate(types)]
    return node({"mode": "append", "url": seat.url(HOST), "applicationName": APPS[major], "runId": run,
                 "events": evs})


# --- stamping ----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_major2_insert_stamps_era3_in_the_same_transaction(wseat, pg, host_function, driver):
    values, many, selected, by_fn = rid(), [rid() for _ in range(3)], rid("sel"), rid("fn")
    copied = [rid("copy"), rid("copy")]
    conn = via(wseat, driver)
    try:
        assert conn.q("SELECT openwop_seat.session_major()") == [(2,)]
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", values)
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't'), (%s, 'u'), (%s, 'v')", *many)
        conn.q("INSERT INTO runs (run_id, tenant_id) SELECT %s || '-' || g, 't' FROM generate_series(1, 3) g",
               selected)
        conn.copy_runs(copied)
        conn.q(f"SELECT {host_function}(%s)", by_fn)
        # in an explicit transaction, the session sees its own stamp before COMMIT; nobody else does
        in_tx = rid("tx")
        conn.q("BEGIN")
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", in_tx)
        assert conn.q("SELECT openwop_seat.era_of(%s)", in_tx) == [(3,)]
        assert era_rows(pg, in_tx) == []
        conn.q("COMMIT")
    finally:
        conn.close()
    runs = [values, *many, *(f"{selected}-{g}" for g in (1, 2, 3)), *copied, by_fn, in_tx]
    for run in runs:
        assert era_rows(pg, run) == [(3, "created")], run
    # the stamp was written by the transaction that inserted the run
    same = sql1(pg, "SELECT r.run_id, r.xmin::text = e.xmin::text FROM runs r JOIN openwop_seat.run_era e "
                    "USING (run_id) WHERE r.run_id = ANY(%s)", runs)
    assert sorted(same) == sorted((r, True) for r in runs)


@pytest.mark.parametrize("driver", DRIVERS)
def test_rolled_back_insert_leaves_no_era_row(wseat, pg, driver):
    run, copied = rid(), rid("copy")
    conn = via(wseat, driver)
    try:
        conn.q("BEGIN")
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", run)
        conn.copy_runs([copied])
        assert conn.q("SELECT openwop_seat.era_of(%s), openwop_seat.era_of(%s)", run, copied) == [(3, 3)]
        conn.q("ROLLBACK")
        assert conn.q("SELECT openwop_seat.era_of(%s)", run) == [(2,)]
    finally:
        conn.close()
    for r in (run, copied):
        assert era_rows(pg, r) == []
        assert sql1(pg, "SELECT count(*) FROM runs WHERE run_id = %s", r) == [(0,)]


@pytest.mark.parametrize("major", [1, "raw"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_major1_and_raw_sessions_stamp_nothing(wseat, pg, host_function, driver, major):
    values, many, copied, by_fn = rid(), [rid(), rid()], rid("copy"), rid("fn")
    conn = via(wseat, driver, major)
    try:
        # raw is relayed unclaimed (ADR 0013): a v1 writer whose reads are not translated, as a claim of 0 records
        assert conn.q("SELECT openwop_seat.session_major()") == [(1 if major == 1 else None,)]
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", values)
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't'), (%s, 't')", *many)
        conn.copy_runs([copied])
        conn.q(f"SELECT {host_function}(%s)", by_fn)
    finally:
        conn.close()
    for run in (values, *many, copied, by_fn):
        assert sql1(pg, "SELECT count(*) FROM runs WHERE run_id = %s", run) == [(1,)]
        assert era_rows(pg, run) == [], run
        assert sql1(pg, "SELECT openwop_seat.era_of(%s)", run) == [(2,)]


def test_direct_psql_sessions_stamp_nothing(pg, host_function):
    values, many, copied, by_fn = rid("psql"), [rid("psql"), rid("psql")], rid("psql-copy"), rid("psql-fn")
    out = psql(pg, f"""
SELECT coalesce(openwop_seat.session_major()::text, 'unclaimed');
INSERT INTO runs (run_id, tenant_id) VALUES ('{values}', 't');
INSERT INTO runs (run_id, tenant_id) VALUES ('{many[0]}', 't'), ('{many[1]}', 't');
COPY runs (run_id, tenant_id) FROM STDIN;
{copied}\tt
\\.
SELECT {host_function}('{by_fn}');
""")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "unclaimed"
    for run in (values, *many, copied, by_fn):
        assert sql1(pg, "SELECT count(*) FROM runs WHERE run_id = %s", run) == [(1,)], run
        assert era_rows(pg, run) == [], run


@pytest.mark.parametrize("driver", DRIVERS)
def test_update_of_runs_never_changes_an_era(wseat, pg, driver):
    era3, era2 = rid("e3"), era2_run(pg)
    conn = via(wseat, driver)
    try:
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", era3)
    finally:
        conn.close()
    before = sql1(pg, "SELECT run_id, era, source, stamped_at FROM openwop_seat.run_era WHERE run_id = %s", era3)
    assert [r[1:3] for r in before] == [(3, "created")]
    for major in (2, 1, "raw"):
        conn = via(wseat, driver, major)
        # a v1 writer (major 1, raw) may not write an era-3 run's row at all (issue 23): its era-2 run's only
        runs = (era3, era2) if major == 2 else (era2, era2 + "-absent")
        try:
            conn.q("UPDATE runs SET status = %s, metadata = '{\"k\": 1}' WHERE run_id IN (%s, %s)", f"m{major}",
                   *runs)
            conn.q("UPDATE runs SET run_id = run_id, tenant_id = 'x' WHERE run_id IN (%s, %s)", *runs)
            conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't'), (%s, 't') "
                   "ON CONFLICT (run_id) DO UPDATE SET status = 'upserted'", *runs)
            if major != 2:
                refused(lambda: conn.q("UPDATE runs SET status = 'x' WHERE run_id = %s", era3), "OW005")
        finally:
            conn.close()
    out = psql(pg, f"UPDATE runs SET status = 'direct' WHERE run_id = '{era2}';")
    assert out.returncode == 0, out.stderr
    out = psql(pg, f"UPDATE runs SET status = 'direct' WHERE run_id = '{era3}';", stop=False)  # not a v2 writer
    assert [e.sqlstate for e in psql_errors(out.stderr)] == ["OW005"], out.stderr
    after = sql1(pg, "SELECT run_id, era, source, stamped_at FROM openwop_seat.run_era WHERE run_id = %s", era3)
    assert after == before  # the same row, stamped_at included
    assert era_rows(pg, era2) == []
    assert sql1(pg, "SELECT status, tenant_id FROM runs WHERE run_id = %s", era2) == [("direct", "x")]
    assert sql1(pg, "SELECT status, tenant_id FROM runs WHERE run_id = %s", era3) == [("upserted", "x")]  # by v2


# --- appends -----------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_major2_append_to_era2_stores_the_v1_spelling(wseat, pg, driver):
    """The payload is `{}`: RETURNING of a major-2 append to an era-2 run reads it as a major-2 page does,
    projected (issue #4), and no v2 definition boxes or refuses an empty object (at most run.started gains the
    owner block of the run's tenant, a required runId is filled from the row); this test is about types."""
    run = era2_run(pg)
    sent = V2_RENAMED + [UNCHANGED, VENDOR]
    conn = via(wseat, driver)
    try:
        returned = [append(conn, run, seq, t, {}) for seq, t in enumerate(sent)]
    finally:
        conn.close()
    assert [r[3] for r in returned] == sent  # RETURNING reads the v2 names back
    assert [r[:3] for r in returned] == [(f"{run}-{i}", run, i) for i in range(len(sent))]
    assert stored(pg, run) == RENAMED + [UNCHANGED, VENDOR]
    assert sql1(pg, "SELECT DISTINCT payload FROM events WHERE run_id = %s", run) == [({},)]  # stored as sent
    assert "agent.reasoning.delta" in stored(pg, run)
    assert era_rows(pg, run) == []  # an append does not promote the run


@pytest.mark.parametrize("etype, why", [
    ("agent.reasoning.delta", "is a v1 spelling (its v2 name is 'agent.reasoning-delta')"),
    (UNKNOWN, "has no codemap row and no registered vendor prefix"),
    ("openwop.thing-happened", "has no codemap row and no registered vendor prefix"),  # a reserved org
])
@pytest.mark.parametrize("driver", DRIVERS)
def test_major2_append_to_era2_refuses_a_type_without_a_v1_spelling(wseat, pg, driver, etype, why):
    run = era2_run(pg)
    conn = via(wseat, driver)
    try:
        err = refused(lambda: append(conn, run, 5, etype), "OW001")
        assert conn.q("SELECT 1") == [(1,)]  # the session goes on
    finally:
        conn.close()
    sentence = assert_envelope(err, "event_type_unmapped", etype, run, 5)
    assert sentence.startswith(f"event type '{etype}' appended to era-2 run '{run}' at sequence 5 by a v2 writer ")
    assert why in sentence
    assert stored(pg, run) == []


@pytest.mark.parametrize("driver", DRIVERS)
def test_major2_append_to_era3_is_stored_as_is(wseat, pg, driver):
    run = rid("e3")
    sent = sorted(A.v2_types) + [VENDOR]
    conn = via(wseat, driver)
    try:
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", run)
        returned = [append(conn, run, seq, t) for seq, t in enumerate(sent)]
        for seq, (etype, why) in enumerate([("agent.reasoning.delta", "is a v1 spelling (its v2 name is "
                                                                        "'agent.reasoning-delta')"),
                                            (UNKNOWN, "has no codemap row and no registered vendor prefix")],
                                           start=len(sent)):
            err = refused(lambda: append(conn, run, seq, etype), "OW001")
            sentence = assert_envelope(err, "event_type_unmapped", etype, run, seq)
            assert sentence.startswith(f"event type '{etype}' appended to era-3 run '{run}' at sequence {seq} {why}")
    finally:
        conn.close()
    assert era_rows(pg, run) == [(3, "created")]
    assert [r[3] for r in returned] == sent
    assert stored(pg, run) == sent


def assert_era2_write_refused(err: Failed, etype: str, run: str, seq: int) -> None:
    sentence = assert_envelope(err, "era2_write_refused", etype, run, seq)
    assert sentence.startswith(f"event type '{etype}' appended to era-3 run '{run}' at sequence {seq} by a writer "
                               f"that is not a v2 writer")
    assert err.hint


def era3_run(seat) -> str:
    run = rid("e3")
    conn = via(seat, "psycopg")
    try:
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", run)
        append(conn, run, 0, "agent.reasoning-delta")
    finally:
        conn.close()
    return run


@pytest.mark.parametrize("major", [1, "raw"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_v1_writers_through_the_seat_are_refused_in_era3(wseat, pg, driver, major):
    run = era3_run(wseat)
    conn = via(wseat, driver, major)
    try:
        for etype in ("agent.reasoning.delta", "agent.reasoning-delta", VENDOR):
            assert_era2_write_refused(refused(lambda: append(conn, run, 3, etype), "OW005"), etype, run, 3)
        assert conn.q("SELECT 1") == [(1,)]
    finally:
        conn.close()
    assert stored(pg, run) == ["agent.reasoning-delta"]


def test_direct_psql_is_refused_in_era3(wseat, pg):
    run = era3_run(wseat)
    out = psql(pg, f"""
INSERT INTO events (event_id, run_id, sequence, type, "timestamp")
    VALUES ('{run}-1', '{run}', 1, 'agent.reasoning.delta', now());
INSERT INTO events (event_id, run_id, sequence, type, "timestamp")
    VALUES ('{run}-2', '{run}', 2, 'agent.reasoning-delta', now());
""", stop=False)
    errors = psql_errors(out.stderr)
    assert len(errors) == 2, out.stderr
    assert_era2_write_refused(errors[0], "agent.reasoning.delta", run, 1)
    assert_era2_write_refused(errors[1], "agent.reasoning-delta", run, 2)
    assert stored(pg, run) == ["agent.reasoning-delta"]


@needs_node
@pytest.mark.parametrize("major", [1, "raw"])
def test_node_host_append_as_a_v1_writer_is_refused_in_era3(wseat, pg, major):
    run = era3_run(wseat)
    out = node_append(wseat, major, run, ["agent.reasoning.delta"])
    err = out[0]["error"]
    assert_era2_write_refused(Failed(err["code"], err["message"], err["detail"], "(not read)"),
                              "agent.reasoning.delta", run, 1)  # the CTE's next sequence: max (0) + 1
    assert stored(pg, run) == ["agent.reasoning-delta"]


@pytest.mark.parametrize("major", [1, "raw"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_v1_writers_through_the_seat_append_to_era2_as_is(wseat, pg, driver, major):
    run = era2_run(pg)
    sent = ["agent.reasoning.delta", "agent.reasoning-delta", UNKNOWN, VENDOR, UNCHANGED]
    conn = via(wseat, driver, major)
    try:
        returned = [append(conn, run, seq, t) for seq, t in enumerate(sent)]
    finally:
        conn.close()
    assert [r[3] for r in returned] == sent
    assert stored(pg, run) == sent
    assert era_rows(pg, run) == []


def test_direct_psql_appends_to_era2_as_is(pg):
    run = era2_run(pg)
    sent = ["agent.reasoning.delta", "agent.reasoning-delta", UNKNOWN, VENDOR]
    script = "".join(f"INSERT INTO events (event_id, run_id, sequence, type, \"timestamp\") "
                     f"VALUES ('{run}-{i}', '{run}', {i}, '{t}', now());\n" for i, t in enumerate(sent))
    out = psql(pg, script)
    assert out.returncode == 0, out.stderr
    assert stored(pg, run) == sent


UPDATES = ["UPDATE events SET type = 'run.started' WHERE run_id = %s",
           "UPDATE events SET run_id = run_id || '-moved' WHERE run_id = %s",
           "UPDATE events SET type = 'example.other-thing', payload = '{}' WHERE run_id = %s"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_update_of_type_or_run_id_is_refused_for_every_session(wseat, pg, driver):
    e2, e3 = era2_run(pg), era3_run(wseat)
    sql1(pg, "INSERT INTO events (event_id, run_id, sequence, type, \"timestamp\") "
             "VALUES (%s, %s, 0, 'agent.reasoning.delta', now())", f"{e2}-0", e2)
    for major in (2, 1):  # a translated session: these UPDATEs read stored rows, and the net refuses first
        conn = via(wseat, driver, major)
        try:
            for run in (e2, e3):
                for update in UPDATES + ["UPDATE events SET payload = '{\"updated\": true}' WHERE run_id = %s"]:
                    err = refused(lambda: conn.q(update, run), "OW008")
                    assert err.message.startswith("stored_read_refused: "), err
        finally:
            conn.close()
    for major in ("raw",):
        conn = via(wseat, driver, major)
        try:
            for run in (e2, e3):
                for update in UPDATES:
                    err = refused(lambda: conn.q(update, run), "42501")
                    assert err.message == "openwop_seat: UPDATE of events.type/run_id is refused", err
                other = "UPDATE events SET payload = '{\"updated\": true}' WHERE run_id = %s"
                if major == 2 or run == e2:
                    conn.q(other, run)  # other columns may change, except an era-3 event's for a v1 writer
                else:
                    err = refused(lambda: conn.q(other, run), "OW005")
                    assert err.message.startswith(f"era2_write_refused: UPDATE of the event in era-3 run '{e3}' "
                                                  f"at sequence 0"), err
                    assert "agent.reasoning-delta" not in str(err.message)
        finally:
            conn.close()
    direct = Psycopg(pg.dsn(user=HOST))
    try:
        for run in (e2, e3):
            for update in UPDATES:
                refused(lambda: direct.q(update, run), "42501")
    finally:
        direct.close()
    out = psql(pg, "".join(u.replace("%s", f"'{r}'") + ";\n" for r in (e2, e3) for u in UPDATES), stop=False)
    assert [e.sqlstate for e in psql_errors(out.stderr)] == ["42501"] * 6, out.stderr
    assert stored(pg, e2) == ["agent.reasoning.delta"] and stored(pg, e3) == ["agent.reasoning-delta"]


def wait_for_lock(pg, pid: int, timeout: float = 10) -> None:
    """Wait until backend ``pid`` waits on an advisory lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sql1(pg, "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", pid) == [
                ("Lock", "advisory")]:
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited on an advisory lock")


@pytest.mark.parametrize("driver", DRIVERS)
def test_major2_append_that_waits_for_a_stamp_reads_back_its_v2_name(wseat, pg, driver):
    """A stamp in flight: the append waits for it, stores the v2 name (era 3 by then) and RETURNING reads it.

    A regression test: the trigger re-reads the era after the run's lock (3) and stores
    ``agent.reasoning-delta`` as is; the hidden era column the seat adds to RETURNING
    once read the era in the statement's snapshot, taken before the wait (2),
    so read_v2 finds a v2 name in an "era-2" row and fails the whole statement with
    OW001 ``event type 'agent.reasoning-delta' in era-2 run … has no codemap row``:
    a legal append is refused and rolled back.
    """
    run = era2_run(pg)
    stamper = psycopg.connect(pg.dsn())
    conn = via(wseat, driver)
    try:
        pid = conn.q("SELECT pg_backend_pid()")[0][0]
        stamper.execute("SELECT openwop_seat.stamp_run(%s, 'test')", (run,))  # holds the run's lock
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(row=_try(lambda: append(conn, run, 0,
                                                                                       "agent.reasoning-delta"))))
        thread.start()
        wait_for_lock(pg, pid)
        stamper.commit()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        stamper.close()
        conn.close()
    assert era_rows(pg, run) == [(3, "test")]
    assert not isinstance(result["row"], Failed), result["row"]
    assert result["row"][3] == "agent.reasoning-delta"
    assert stored(pg, run) == ["agent.reasoning-delta"]


def _try(fn):
    try:
        return fn()
    except Failed as e:
        return e


# --- node-postgres: the reference host's append -------------------------------------------------


@needs_node
def test_node_host_append_as_major2_into_era2(wseat, pg):
    """BEGIN; SELECT pg_advisory_xact_lock(hashtext($1), 1); the next-sequence CTE … RETURNING *; COMMIT.

    The payloads are `{}` (see test_major2_append_to_era2_stores_the_v1_spelling): RETURNING is projected."""
    run = era2_run(pg)
    sent = ["agent.reasoning-delta"] + V2_RENAMED + [UNCHANGED, VENDOR, "agent.reasoning.delta", UNKNOWN]
    out = node_append(wseat, 2, run, sent, {})
    ok, bad = out[:-2], out[-2:]
    assert [o.get("error") for o in ok] == [None] * len(ok), ok
    returned = [dict(zip(o["fields"], o["row"])) for o in ok]
    assert returned[0]["type"] == "agent.reasoning-delta"
    assert [r["type"] for r in returned] == sent[:-2]
    assert [int(r["sequence"]) for r in returned] == list(range(1, len(ok) + 1))
    # the v1 spelling and the unknown type have no v1 spelling to store: OW001, the CTE's sequence in the envelope
    for o, etype in zip(bad, sent[-2:]):
        e = o["error"]
        assert_envelope(Failed(e["code"], e["message"], e["detail"], None), "event_type_unmapped", etype, run,
                        len(ok) + 1)
    assert stored(pg, run) == ["agent.reasoning.delta"] + RENAMED + [UNCHANGED, VENDOR]
    assert sql1(pg, "SELECT DISTINCT payload FROM events WHERE run_id = %s", run) == [({},)]  # stored as sent
    assert era_rows(pg, run) == []  # still era 2
    assert sql1(pg, "SELECT openwop_seat.era_of(%s)", run) == [(2,)]


# --- a fork: read an era-2 parent through the seat, write its prefix into a new run -------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_fork_of_an_era2_parent_is_an_era3_child_in_v2_names(wseat, pg, driver):
    """The parent's payloads are `{}`, which the major-2 read projects (issue #4) without boxing or refusing:
    unchanged, but for run.started, which gains the legacy owner block of the run's tenant. The fork copies
    the payloads as read, so the era-3 child stores them projected and reads them back as the parent reads."""
    parent, child = era2_run(pg), rid("child")
    history = RENAMED[:12] + [UNCHANGED, VENDOR] + RENAMED[12:20]
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO events (event_id, run_id, sequence, type, payload, \"timestamp\") "
                            "VALUES (%s, %s, %s, %s, '{}', now())",
                            [(f"{parent}-{i}", parent, i, t) for i, t in enumerate(history)])
    prefix = 16
    page = "SELECT type, sequence, payload FROM events WHERE run_id = %s AND sequence < %s ORDER BY sequence"
    conn = via(wseat, driver)
    try:
        read = conn.q(page, parent, prefix)
        assert [r[0] for r in read] == [A.v1_to_v2.get(t, t) for t in history[:prefix]]  # translated
        legacy = {"tenant": "t", "subject": {"issuer": "urn:openwop:legacy", "subjectId": "legacy", "tenant": "t",
                                             "lane": "api-key", "kind": "user"}}
        assert [json.loads(p) if isinstance(p, str) else p for _, _, p in read] == \
            [{"owner": legacy} if t == UNCHANGED else {} for t in history[:prefix]]  # projected
        conn.q("BEGIN")
        conn.q("INSERT INTO runs (run_id, tenant_id, parent_run_id) VALUES (%s, 't', %s)", child, parent)
        for etype, seq, payload in read:
            conn.q("INSERT INTO events (event_id, run_id, sequence, type, payload, \"timestamp\") "
                   "VALUES (%s, %s, %s, %s, %s::jsonb, now())", f"{child}-{seq}", child, seq, etype,
                   payload if isinstance(payload, str) else json.dumps(payload))
        conn.q("COMMIT")
        again = conn.q(page, child, prefix)
    finally:
        conn.close()
    assert era_rows(pg, child) == [(3, "created")]
    assert stored(pg, child) == [A.v1_to_v2.get(t, t) for t in history[:prefix]]  # v2 names as is
    assert again == read
    # the child stores the payloads as read (projected); the parent keeps its own
    assert [p for (p,) in sql1(pg, "SELECT payload FROM events WHERE run_id = %s ORDER BY sequence", child)] == \
        [json.loads(p) if isinstance(p, str) else p for _, _, p in read]
    assert sql1(pg, "SELECT DISTINCT payload FROM events WHERE run_id = %s", parent) == [({},)]
    # byte for byte: the server's text of (type, sequence, payload), both read through the seat
    with psycopg.connect(wseat.dsn(user=HOST)) as conn:
        raw = []
        for run in (parent, child):
            cur = conn.execute(page, (run, prefix))
            res = cur.pgresult
            raw.append([tuple(res.get_value(i, j) for j in range(3)) for i in range(res.ntuples)])
    assert raw[0] == raw[1] and len(raw[0]) == prefix
    assert stored(pg, parent) == history  # the parent is untouched, still era 2
    assert era_rows(pg, parent) == []


# --- spoofing: the host's credentials without the seat's secret --------------------------------


SEAT_SPOOFS = [
    ("SET openwop_seat.major = '2'", "SET openwop_seat.major: openwop_seat.* settings belong to the seat"),
    ("SELECT set_config('openwop_seat.major', '2', false)", "set_config('openwop_seat.major', …)"),
    ("SELECT openwop_seat.claim('a-guess-at-the-secret', 2)", "openwop_seat.claim is called by the seat itself"),
    ("SELECT openwop_seat.claim_once(1, 2, 'n', 2, 'guess')", "openwop_seat.claim_once is called by the seat itself"),
    ("SELECT 1; SET openwop_seat.major = '2'", "SET openwop_seat.major"),
]


@pytest.mark.parametrize("major", [1, 2])
@pytest.mark.parametrize("driver", DRIVERS)
def test_seat_refuses_a_client_setting_its_own_major(wseat, pg, driver, major):
    run = rid("spoof")
    e3 = era3_run(wseat)
    conn = via(wseat, driver, major)
    try:
        for statement, why in SEAT_SPOOFS:
            if driver == "asyncpg" and ";" in statement:
                continue  # asyncpg prepares: one statement only (psycopg sends it as one simple query)
            err = refused(lambda: conn.q(statement), ERRORS["statement_untranslatable"].sqlstate)
            assert err.message.startswith("statement_untranslatable: ") and why in err.message, err.message
            assert json.loads(err.detail)["details"] == {"kind": "openwop_seat setting"}
        # with a bind parameter too (extended protocol)
        refused(lambda: conn.q("SELECT openwop_seat.claim(%s, 2)", WRONG), "OW004")
        assert conn.q("SELECT openwop_seat.session_major()") == [(major,)]
        assert conn.q("SELECT current_setting('openwop_seat.major', true)") in ([(None,)], [("",)])
        if major == 1:  # still a v1 writer: stamps nothing, is refused in era 3
            conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", run)
            refused(lambda: append(conn, e3, 7, "agent.reasoning-delta"), "OW005")
    finally:
        conn.close()
    if major == 1:
        assert era_rows(pg, run) == []


@pytest.mark.parametrize("driver", DRIVERS)
def test_raw_session_spoofs_reach_the_database_and_claim_nothing(wseat, pg, driver):
    """A raw session is relayed untouched (no statement is classified), so the database alone says no."""
    run, e3 = rid("spoof"), era3_run(wseat)
    conn = via(wseat, driver, "raw")
    try:
        conn.q("SET openwop_seat.major = '2'")
        conn.q("SELECT set_config('openwop_seat.major', '2', false)")
        err = refused(lambda: conn.q("SELECT openwop_seat.claim(%s, 2)", WRONG), "42501")
        assert err.message == "openwop_seat.claim: wrong secret"
        assert conn.q("SELECT openwop_seat.session_major()") == [(None,)]  # relayed unclaimed (ADR 0013)
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", run)
        refused(lambda: append(conn, e3, 7, "agent.reasoning-delta"), "OW005")
    finally:
        conn.close()
    assert era_rows(pg, run) == []


SEAT_SETTING_SPELLINGS = [
    ("options", "-c openwop_seat.major=2"),
    ("options", r"-c openwop\_seat.major=2"),  # pg_split_opts reads the backslash as an escape: the same setting
    ("options", "-copenwop_seat.major=2"),
    ("options", "--openwop-seat.major=2"),  # '-' in a --name reads as '_'
    ("options", "-c search_path=public -c OPENWOP_SEAT.major=2"),
    ("parameter", "openwop_seat.major"),
    ("parameter", "OpenWOP_Seat.Major"),
]


@pytest.mark.parametrize("driver, how, spelling",
                         [("psycopg", how, s) for how, s in SEAT_SETTING_SPELLINGS if how == "options"]
                         + [("asyncpg", how, s) for how, s in SEAT_SETTING_SPELLINGS])  # libpq sends no others
def test_seat_refuses_openwop_seat_settings_at_startup_however_spelled(wseat, pg, driver, how, spelling):
    """``openwop_seat.*`` however PostgreSQL would read it: options split with escapes, -c, --name, any case."""
    before = sql1(pg, "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", HOST)[0][0]
    if driver == "psycopg":
        with pytest.raises(psycopg.OperationalError) as info:
            psycopg.connect(wseat.dsn(user=HOST, application_name="v1-host"), options=spelling).close()
        message = str(info.value)  # libpq reports no SQLSTATE for a failed connection, only the FATAL text
    else:
        settings = {"options": spelling} if how == "options" else {spelling: "2"}

        async def go():
            conn = await asyncpg.connect(wseat.url(HOST), server_settings={"application_name": "v1-host", **settings})
            await conn.close()

        with pytest.raises(asyncpg.PostgresError) as info:
            asyncio.run(go())
        assert info.value.sqlstate == "42501"
        message = info.value.message
    assert "openwop_seat.* settings belong to the seat and cannot be set by a client" in message, message
    assert message.count("startup ") == 1
    assert ("startup options" if how == "options" else "startup parameter") in message
    # refused before any upstream connection
    assert sql1(pg, "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", HOST)[0][0] <= before


@pytest.mark.parametrize("spelling", ["-c log_parameter_max_length_on_error=-1", "--client-min-messages=debug5",
                                      "-c debug_print_plan=on", "-d 5", "-c work_mem=1MB"])
def test_seat_refuses_startup_settings_outside_its_allowlist(wseat, spelling):
    with pytest.raises(psycopg.OperationalError) as info:
        psycopg.connect(wseat.dsn(user=HOST, application_name="v1-host"), options=spelling).close()
    message = str(info.value)
    assert "FATAL:  startup options" in message and "through openwop-seat" in message, message


def test_allowed_startup_settings_pass_and_apply(wseat):
    conn = psycopg.connect(wseat.dsn(user=HOST, application_name="v1-host"), autocommit=True,
                           options="-c search_path=public --statement-timeout=12345 -c TimeZone=UTC")
    try:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("12345ms",)
        assert conn.execute("SHOW search_path").fetchone() == ("public",)
        assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (1,)
    finally:
        conn.close()


def test_an_empty_database_parameter_is_the_users_database_and_is_claimed(wseat):
    """PostgreSQL connects an empty ``database`` to the database named like the user (here ``postgres``, the
    host database): the seat must claim and translate it as such, not take "" for another database."""
    from rawpg import RawConn, query

    conn = RawConn(wseat.port)
    try:
        answer = conn.login(user="postgres", database="")
        assert answer[-1][0] == b"Z", answer
        conn.send(query("SELECT current_database() || ':' || coalesce(openwop_seat.session_major()::text, 'none')"))
        rows = [body for t, body in conn.read_until(b"Z") if t == b"D"]
        assert len(rows) == 1 and rows[0].endswith(b"postgres:2"), rows  # claimed as the v2 host it is
    finally:
        conn.close()


SECRETLESS_FN = """CREATE OR REPLACE FUNCTION ws_try_claim(guess text) RETURNS void LANGUAGE plpgsql AS
$$ BEGIN PERFORM openwop_seat.claim(guess, 2); END $$"""


def test_direct_spoofs_leave_the_session_unclaimed(wseat, pg):
    """psql straight to the database as the host's role: nothing it can say makes it a v2 writer."""
    run, e3 = rid("dspoof"), era3_run(wseat)
    pg.psql(SECRETLESS_FN, user=HOST)
    try:
        # One psql session, ON_ERROR_STOP off: each attempt either fails or is a no-op for session_major().
        out = psql(pg, f"""
SET openwop_seat.major = '2';
SELECT 'a:' || coalesce(openwop_seat.session_major()::text, 'NULL');
SELECT set_config('openwop_seat.major', '2', false), set_config('openwop_seat.claim', '2', false);
SELECT 'b:' || coalesce(openwop_seat.session_major()::text, 'NULL');
SET openwop_seat.major = '2' \\; SELECT set_config('openwop_seat.major', '2', true) \\;
    SELECT openwop_seat.claim('{WRONG}', 2) \\; SELECT 'never';
SELECT 'c:' || coalesce(openwop_seat.session_major()::text, 'NULL');
DO $$ BEGIN EXECUTE 'SELECT openwop_seat.claim($1, 2)' USING '{WRONG}'; END $$;
SELECT 'd:' || coalesce(openwop_seat.session_major()::text, 'NULL');
SELECT ws_try_claim('{WRONG}');
SELECT 'e:' || coalesce(openwop_seat.session_major()::text, 'NULL');
SELECT openwop_seat.claim('{WRONG}', 2);
SELECT openwop_seat.claim(NULL, 2);
SELECT 'f:' || coalesce(openwop_seat.session_major()::text, 'NULL');
INSERT INTO runs (run_id, tenant_id) VALUES ('{run}', 't');
INSERT INTO events (event_id, run_id, sequence, type, "timestamp")
    VALUES ('{e3}-9', '{e3}', 9, 'agent.reasoning-delta', now());
""", stop=False)
        marks = [line for line in out.stdout.splitlines() if re.match(r"^[a-f]:", line)]
        assert marks == [f"{c}:NULL" for c in "abcdef"], out.stdout
        assert "never" not in out.stdout
        errors = psql_errors(out.stderr)
        assert [e.sqlstate for e in errors] == ["42501"] * 5 + ["OW005"], out.stderr
        assert all(e.message == "openwop_seat.claim: wrong secret" for e in errors[:5])
        assert_era2_write_refused(errors[5], "agent.reasoning-delta", e3, 9)
        assert era_rows(pg, run) == []
        assert sql1(pg, "SELECT count(*) FROM runs WHERE run_id = %s", run) == [(1,)]
    finally:
        pg.psql("DROP FUNCTION IF EXISTS ws_try_claim(text)", check=False)


def test_direct_psycopg_spoofs_leave_the_session_unclaimed(wseat, pg):
    run, e3 = rid("dspoof"), era3_run(wseat)
    conn = Psycopg(pg.dsn(user=HOST))
    try:
        conn.q("SET openwop_seat.major = '2'")
        conn.q("SELECT set_config('openwop_seat.major', '2', false)")
        refused(lambda: conn.q(f"SET openwop_seat.major = '2'; SELECT openwop_seat.claim('{WRONG}', 2)"), "42501")
        refused(lambda: conn.q("SELECT openwop_seat.claim(%s, 2)", WRONG), "42501")
        refused(lambda: conn.q("DO $$ BEGIN EXECUTE 'SELECT openwop_seat.claim($1, 2)' USING 'guess'; END $$"),
                "42501")
        assert conn.q("SELECT openwop_seat.session_major()") == [(None,)]
        conn.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", run)
        assert_era2_write_refused(refused(lambda: append(conn, e3, 4, "agent.reasoning-delta"), "OW005"),
                                  "agent.reasoning-delta", e3, 4)
    finally:
        conn.close()
    assert era_rows(pg, run) == []


# --- the secret stays the seat's -----------------------------------------------------------------


def redacted(text: str) -> str:
    """``text`` with the claim secret blotted out (a failing assertion must not print it)."""
    return text.replace(CLAIM_SECRET, "<the claim secret>")


def read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def test_the_secret_never_reaches_pg_stat_activity_the_log_or_the_tables(wseat, pg):
    assert len(CLAIM_SECRET) >= 16
    sessions = [via(wseat, "psycopg", 2), via(wseat, "asyncpg", 1), via(wseat, "psycopg", "raw")]
    try:
        # the first session has run nothing yet: its last statement is the seat's claim, the secret bound
        idle = sessions[0].conn.info.backend_pid
        rows = dict(sql1(pg, "SELECT pid, query FROM pg_stat_activity"))
        # the challenge's, or the one-round-trip claim (without pg_has_role when the seat knows the role's answer)
        assert redacted(rows[idle]) in (CLAIM_SQL, CLAIM_ONCE_SQL, CLAIM_ONCE_ONLY_SQL)
        pids = [s.q("SELECT pg_backend_pid()")[0][0] for s in sessions]
        rows = dict(sql1(pg, "SELECT pid, query FROM pg_stat_activity"))
        assert set(pids) <= set(rows)
        leaked = any(q and CLAIM_SECRET in q for q in rows.values())
        assert not leaked, "the claim secret is in pg_stat_activity"
        claims = dict(sql1(pg, "SELECT pid, major FROM openwop_seat.claims WHERE pid = ANY(%s)", pids))
        assert claims == {pids[0]: 2, pids[1]: 1}  # claimed; the raw session is not (ADR 0013)
    finally:
        for s in sessions:
            s.close()
    # one row: a salt and a salted hash, never the secret
    row = sql1(pg, "SELECT to_jsonb(s) FROM openwop_seat.claim_secret s")
    assert len(row) == 1
    (doc,), = row
    assert set(doc) == {"hash", "salt", "hmac_ipad", "hmac_opad"}  # the pads: the key padded for the HMAC
    assert doc["hash"] == hashlib.sha256((doc["salt"] + CLAIM_SECRET).encode()).hexdigest()
    for where, text in (("openwop_seat.claim_secret", json.dumps(doc)), ("the server log", read(pg.logfile)),
                        ("the seat's log", wseat.log())):
        leaked = CLAIM_SECRET in text
        assert not leaked, f"the claim secret is in {where}"
    pg_dump = os.path.join(pg.bin, "pg_dump")
    if os.path.exists(pg_dump):
        dump = subprocess.run([pg_dump, "-d", pg.dsn()], capture_output=True, text=True, timeout=120)
        assert dump.returncode == 0, dump.stderr
        assert "openwop_seat.claim_secret" in dump.stdout and doc["salt"] in dump.stdout  # the data is there
        leaked = CLAIM_SECRET in dump.stdout
        assert not leaked, "the claim secret is in a pg_dump of the database"


SPY = "ws_spy"
# Every way the spy's backend could be made to print the claim's statement, parameters or plan: set for its
# role by a superuser (ALTER ROLE … SET applies when the backend starts, before the claim; startup options
# cannot carry them through the seat).
SPY_SETTINGS = {"log_statement": "all", "log_min_duration_statement": "0", "log_parameter_max_length": "-1",
                "log_parameter_max_length_on_error": "-1", "log_min_error_statement": "debug5",
                "debug_print_parse": "on", "debug_print_rewritten": "on", "debug_print_plan": "on",
                "client_min_messages": "debug5", "log_error_verbosity": "verbose", "search_path": "ws_spy, public"}


@pytest.fixture
def spy(pg):
    """A role with its own schema, operators and functions shadowing what a claim could call."""
    pg.psql(f"DROP SCHEMA IF EXISTS {SPY} CASCADE; DROP ROLE IF EXISTS {SPY}; CREATE ROLE {SPY} LOGIN; "
            f"GRANT CREATE ON DATABASE postgres TO {SPY}; CREATE SCHEMA {SPY} AUTHORIZATION {SPY}; "
            + "".join(f"ALTER ROLE {SPY} SET {k} = '{v}'; " for k, v in SPY_SETTINGS.items()))
    pg.psql(f"""
CREATE TABLE {SPY}.seen (v text);
CREATE FUNCTION {SPY}.leak(a text, b text) RETURNS boolean LANGUAGE plpgsql AS
$$ BEGIN INSERT INTO {SPY}.seen VALUES (a), (b); RAISE NOTICE 'leak % %', a, b; RETURN a = b; END $$;
CREATE OPERATOR {SPY}.= (LEFTARG = text, RIGHTARG = text, FUNCTION = {SPY}.leak);
CREATE FUNCTION {SPY}.leakcat(a text, b text) RETURNS text LANGUAGE plpgsql AS
$$ BEGIN INSERT INTO {SPY}.seen VALUES (a), (b); RETURN a operator(pg_catalog.||) b; END $$;
CREATE OPERATOR {SPY}.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = {SPY}.leakcat);
CREATE FUNCTION {SPY}.claim(a text, b integer) RETURNS void LANGUAGE plpgsql AS
$$ BEGIN INSERT INTO {SPY}.seen VALUES (a); END $$;
CREATE FUNCTION {SPY}.pg_has_role(a name, b oid, c text) RETURNS boolean LANGUAGE plpgsql AS
$$ BEGIN INSERT INTO {SPY}.seen VALUES (c); RETURN false; END $$;
""", user=SPY)
    yield SPY
    pg.psql(f"DROP SCHEMA IF EXISTS {SPY} CASCADE; DROP OWNED BY {SPY}; DROP ROLE IF EXISTS {SPY}", check=False)


def test_a_client_learns_nothing_of_the_secret_from_its_claim_and_cannot_replay_it(wseat, pg, spy):
    logged_before = len(read(pg.logfile))
    notices: list[str] = []
    # the default major: 2; and every allowlisted setting the spy can put in its startup options
    conn = psycopg.connect(wseat.dsn(user=SPY), autocommit=True,
                           options=f"-c search_path={SPY},public -c statement_timeout=0 -c lock_timeout=0 "
                                   "-c extra_float_digits=3 -c DateStyle=SQL,DMY -c TimeZone=Pacific/Chatham "
                                   "-c IntervalStyle=sql_standard -c bytea_output=escape "
                                   "-c default_transaction_isolation=serializable -c geqo=off")
    conn.add_notice_handler(lambda d: notices.append(f"{d.message_primary} {d.message_detail} {d.context}"))
    try:
        assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (2,)
        assert conn.execute("SHOW debug_print_plan").fetchone() == ("on",)  # the role's settings are in force
        assert conn.execute("SHOW search_path").fetchone() == (f"{SPY},public",)  # and its startup options
        activity = sql1(pg, "SELECT string_agg(coalesce(query, ''), ' ') FROM pg_stat_activity")[0][0]
        seen = [v for (v,) in conn.execute(f"SELECT v FROM {SPY}.seen").fetchall()]
    finally:
        conn.close()
    (salt, key_hex), = sql1(pg, "SELECT salt, hash FROM openwop_seat.claim_secret")
    log = read(pg.logfile)[logged_before:]
    for where, text in (("the server log", log), ("notices", "\n".join(notices)), ("pg_stat_activity", activity),
                        ("the spy's own table", "\n".join(seen)), ("the seat's log", wseat.log())):
        for name, value in (("the claim secret", CLAIM_SECRET), ("the claim key", key_hex)):
            leaked = value in text
            assert not leaked, f"{name} is in {where}"
    assert seen == []  # nothing of the spy's ran in the claim
    # the server did log the spy's backend's statements: the claim in one round trip, or the challenge
    assert "openwop_seat.claim_once" in log or "openwop_seat.claim_challenge" in log
    # What the log did show (the challenge, the proof) claims nothing on another backend, nor again on this one.
    proofs = re.findall(r"\$1 = '([0-9a-f]{64})'", log)
    once = re.findall(r"\$1 = '(\d+)', \$2 = '(\d+)', \$3 = '([0-9a-f]+)', \$4 = '(\d)', \$5 = '([0-9a-f]{64})'", log)
    assert proofs or once, "the claim's proof was expected in a log that records every parameter"
    with psycopg.connect(pg.dsn(user=SPY), autocommit=True) as direct:
        for proof in proofs:
            direct.execute("SELECT openwop_seat.claim_challenge()")
            with pytest.raises(psycopg.Error) as info:
                direct.execute("SELECT openwop_seat.claim(%s, 2)", (proof,))
            assert info.value.sqlstate == "42501"
        for pid, at_us, nonce, major, proof in once:
            verdict = direct.execute("SELECT openwop_seat.claim_once(%s, %s, %s, %s, %s)",
                                     (int(pid), int(at_us), nonce, int(major), proof)).fetchone()[0]
            assert verdict != "ok"
            # the same proof made out for this backend's pid: the HMAC does not hold
            verdict = direct.execute("SELECT openwop_seat.claim_once(%s, %s, %s, %s, %s)",
                                     (direct.info.backend_pid, int(at_us), nonce, int(major), proof)).fetchone()[0]
            assert verdict == "wrong secret"
        assert direct.execute("SELECT openwop_seat.session_major()").fetchone() == (None,)


def test_nothing_a_client_pipelines_before_authentication_runs_before_its_claim(wseat):
    """A client (trust authentication) that sends queries right behind its startup packet: they run after the
    claim, on a claimed session, and no answer of theirs can be taken for the claim's (a forged challenge)."""
    from rawpg import RawConn, query, startup

    conn = RawConn(wseat.port)
    try:
        conn.send(startup({"user": HOST, "database": "postgres"})
                  + query("SELECT 'forged-salt:forged-challenge'")
                  + query("SELECT coalesce(openwop_seat.session_major()::text, 'none')"))
        messages = conn.read_until(b"Z")  # authentication, then the client's first ReadyForQuery
        assert not [b for t, b in messages if t == b"E"], messages
        first = [b for t, b in conn.read_until(b"Z") if t == b"D"]
        second = [b for t, b in conn.read_until(b"Z") if t == b"D"]
        assert first and first[0].endswith(b"forged-salt:forged-challenge"), first
        assert second and second[0].endswith(b"2"), second  # claimed as the v2 host it is, before it ran
    finally:
        conn.close()


def test_what_a_client_sends_before_its_session_is_ready_is_bounded(wseat):
    """``proxy.claim_buffer_limit`` (default 1 MiB): a client that sends more before its session is ready ends."""
    from rawpg import RawConn, error_fields, query, startup

    conn = RawConn(wseat.port)
    try:
        conn.send(startup({"user": HOST, "database": "postgres"}) + query("SELECT 1; -- " + "x" * (2 << 20)))
        messages = conn.read_all_until_closed()
        errors = [error_fields(b) for t, b in messages if t == b"E"]
        assert errors and errors[-1]["C"] == "54000", messages
        assert "proxy.claim_buffer_limit" in errors[-1]["M"]
    finally:
        conn.close()


# --- the guards through the seat (ADR 0006) ------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_v2_host_cannot_stamp_a_run_that_already_has_v1_events(wseat, pg, driver):
    run = rid("pre")
    v1 = via(wseat, driver, 1)
    try:
        append(v1, run, 0, RENAMED[0])  # before the run's row exists: an era-2 run
    finally:
        v1.close()
    v2 = via(wseat, driver, 2)
    try:
        err = refused(lambda: v2.q("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", run), "OW005")
        sentence = assert_envelope(err, "era2_write_refused", None, run, 0)  # the era-2 spelling is not printed
        assert sentence.startswith(f"run '{run}' cannot be stamped era 3: it already holds events written in era 2")
    finally:
        v2.close()
    assert era_rows(pg, run) == [] and stored(pg, run) == [RENAMED[0]]
    assert sql1(pg, "SELECT count(*) FROM runs WHERE run_id = %s", run) == [(0,)]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_late_host_trigger_cannot_move_a_v1_hosts_append_into_an_era3_run(wseat, pg, driver):
    e3, e2 = era3_run(wseat), era2_run(pg)
    name = f"zzzz_move_{uuid.uuid4().hex[:6]}"
    pg.psql(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN IF NEW.run_id = '{e2}' THEN NEW.run_id := '{e3}'; END IF; RETURN NEW; END $$; "
            f"CREATE TRIGGER {name} BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION {name}()")
    try:
        v1 = via(wseat, driver, 1)
        try:
            err = refused(lambda: append(v1, e2, 1, RENAMED[0]), "OW005")
            assert assert_envelope(err, "era2_write_refused", RENAMED[0], e3, 1).startswith(
                f"event type '{RENAMED[0]}' stored in era-3 run '{e3}'")
        finally:
            v1.close()
    finally:
        pg.psql(f"DROP TRIGGER IF EXISTS {name} ON events; DROP FUNCTION IF EXISTS {name}()")
    assert stored(pg, e3) == ["agent.reasoning-delta"] and stored(pg, e2) == []
