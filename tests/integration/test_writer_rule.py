"""The writer rule in the database: claims, era-3 stamping of new runs, the append guard, the lock.

Everything here talks to PostgreSQL directly (psycopg), as the seat's own
sessions will: a *v2 writer* is a session that called
``openwop_seat.claim_challenge()`` and ``claim(proof, 2)`` with a proof made from the secret; a
session without a claim (one that bypasses the seat) is a *v1 writer*.  The
host's role is ``host_user``, which owns the host's tables but not
``openwop_seat``.  Each store (``run_era`` and ``[host] era_column``) gets a
fresh database for the module, migrated through the CLI with the claim secret
in the environment.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import psycopg
import pytest

from harness import HOST_SCHEMA, ROOT, render_config
from proxy.artifacts.load import load_artifacts
from proxy.config import Config, ConfigError, HostConfig, parse_config
from proxy.db.claims import claim_proof, load_claim_secret
from proxy.db.layout import CLAIM_SECRET_ENV, RUN_LOCK_SEED, UPDATE_REFUSED_SQLSTATE, SchemaError
from proxy.db.migrate import migrate as db_migrate
from proxy.db.migrate import verify
from proxy.db.writer_sql import writer_rule_sql
from proxy.errors import ERRORS

A = load_artifacts()
SECRET = f"claim-secret-{uuid.uuid4().hex}"
WRONG = f"claim-guess-{uuid.uuid4().hex}"
ERA_COLUMN = "event_log_schema_version"
RENAMED = sorted(A.renamed)  # v1 names the codemap renames
VENDOR = "example.thing-happened"
RESERVED = f"{sorted(A.reserved_orgs)[0]}.thing-happened"
_ids = itertools.count()


def rid(prefix: str = "r") -> str:
    return f"{prefix}-{next(_ids)}-{uuid.uuid4().hex[:6]}"


class Store:
    """A migrated host database with one era store."""

    def __init__(self, pg, name: str, kind: str, config: Config):
        self.pg, self.name, self.kind, self.config = pg, name, kind, config

    def connect(self, major: int | None = None, user: str = "host_user", secret: str = SECRET,
                **kwargs) -> psycopg.Connection:
        conn = psycopg.connect(self.pg.dsn(user=user, dbname=self.name), autocommit=True, **kwargs)
        if major is not None:
            claim(conn, secret, major)
        return conn

    def sql(self, query: str, params=()) -> list[tuple]:
        """As the superuser (the owner of openwop_seat)."""
        with psycopg.connect(self.pg.dsn(dbname=self.name), autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def era(self, run: str) -> int:
        return self.sql("SELECT openwop_seat.era_of(%s)", (run,))[0][0]

    def stored(self, run: str) -> list[str]:
        return [t for (t,) in self.sql("SELECT type FROM events WHERE run_id = %s ORDER BY sequence", (run,))]

    def run_era_rows(self, run: str) -> list[tuple]:
        return self.sql("SELECT era, source FROM openwop_seat.run_era WHERE run_id = %s", (run,))


def claim(conn, secret: str, major: int) -> None:
    """Claim ``major`` as the seat does: a challenge of this backend, then the proof made with ``secret``."""
    (challenge,), = conn.execute("SELECT openwop_seat.claim_challenge()").fetchall()
    conn.execute("SELECT openwop_seat.claim(%s, %s)", (claim_proof(secret, challenge, major), major))


def create_run(conn, run: str) -> None:
    conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", (run,))


def append(conn, run: str, seq: int, etype: str | None) -> None:
    conn.execute("INSERT INTO events (event_id, run_id, sequence, type, \"timestamp\") VALUES (%s, %s, %s, %s, now())",
                 (f"{run}-{seq}", run, seq, etype))


def refusal(fn, sqlstate: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        fn()
    assert info.value.sqlstate == sqlstate, info.value
    return info.value


def assert_envelope(err: psycopg.Error, code: str, etype: str | None, run: str, seq: int) -> str:
    assert err.sqlstate == ERRORS[code].sqlstate
    message = err.diag.message_primary
    assert message.startswith(f"{code}: ")
    detail = json.loads(err.diag.message_detail)
    assert detail == {"error": code, "message": message[len(code) + 2:],
                      "details": {"type": etype, "runId": run, "sequence": seq}}
    return detail["message"]


def wait_for_lock(store: Store, pid: int, timeout: float = 10) -> None:
    """Wait until backend ``pid`` waits on an advisory lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = store.sql("SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,))
        if rows and rows[0] == ("Lock", "advisory"):
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited on an advisory lock")


class Background:
    """Run ``fn`` in a thread; ``result()`` returns its value or raises its exception."""

    def __init__(self, fn):
        self.value = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def result(self, timeout: float = 10):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the background statement did not finish"
        if self.error is not None:
            raise self.error
        return self.value


@pytest.fixture(scope="module")
def maintenance_role(pg):
    name = f"ow_maint_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE ROLE {name} NOLOGIN")
    yield name
    pg.psql(f"DROP ROLE IF EXISTS {name}", check=False)


@pytest.fixture(scope="module", params=["run_era", "era_column"])
def store(request, pg, maintenance_role, tmp_path_factory):
    name = f"wr_{request.param}_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {name} OWNER host_user")
    host = {"maintenance_role": maintenance_role}
    ddl = HOST_SCHEMA
    if request.param == "era_column":
        host["era_column"] = ERA_COLUMN
        ddl += f"ALTER TABLE runs ADD COLUMN {ERA_COLUMN} smallint CHECK ({ERA_COLUMN} = 3);"
    pg.psql(ddl, user="host_user", dbname=name)
    pg.psql(f"GRANT SELECT, UPDATE ON events TO {maintenance_role}", dbname=name)
    config_file = tmp_path_factory.mktemp("wr") / "migrate.toml"
    config_file.write_text(render_config({"host": dict(host)}))
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
    env[CLAIM_SECRET_ENV] = SECRET
    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--config", str(config_file), "--dsn",
                          pg.dsn(dbname=name)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "installed the claim secret (its salted SHA-256: the secret itself is not stored)" in out.stdout
    assert SECRET not in out.stdout + out.stderr
    yield Store(pg, name, request.param, Config(host=HostConfig(**host)))
    pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


# --- stamping: a run created by a v2 writer is era 3, whatever SQL created it ---------------------


def test_stamp_by_insert_values(store):
    run = rid()
    with store.connect(2) as v2:
        assert v2.execute("SELECT openwop_seat.session_major()").fetchone() == (2,)
        create_run(v2, run)
    assert store.era(run) == 3
    if store.kind == "run_era":
        assert store.run_era_rows(run) == [(3, "created")]
    else:
        assert store.sql(f"SELECT {ERA_COLUMN} FROM runs WHERE run_id = %s", (run,)) == [(3,)]
        assert store.run_era_rows(run) == []


def test_stamp_by_multi_row_insert_and_insert_select(store):
    many, selected = [rid() for _ in range(3)], rid("sel")
    with store.connect(2) as v2:
        v2.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't'), (%s, 't'), (%s, 't')", many)
        v2.execute("INSERT INTO runs (run_id, tenant_id) SELECT %s || '-' || g, 't' FROM generate_series(1, 4) g",
                   (selected,))
    assert [store.era(r) for r in many] == [3, 3, 3]
    assert [store.era(f"{selected}-{g}") for g in range(1, 5)] == [3, 3, 3, 3]


def test_stamp_by_copy_from(store):
    runs = [rid("copy") for _ in range(3)]
    with store.connect(2) as v2:
        with v2.cursor().copy("COPY runs (run_id, tenant_id) FROM STDIN") as copy:
            for run in runs:
                copy.write_row((run, "t"))
    assert [store.era(r) for r in runs] == [3, 3, 3]


def test_stamp_by_a_function(store):
    with store.connect() as host:
        host.execute("CREATE OR REPLACE FUNCTION host_new_run(id text) RETURNS void LANGUAGE plpgsql AS "
                     "$$ BEGIN EXECUTE 'INSERT INTO runs (run_id, tenant_id) VALUES ($1, ''t'')' USING id; END $$")
    by_v2, by_v1 = rid("fn"), rid("fn")
    with store.connect(2) as v2:
        v2.execute("SELECT host_new_run(%s)", (by_v2,))
    with store.connect() as v1:
        v1.execute("SELECT host_new_run(%s)", (by_v1,))
    assert (store.era(by_v2), store.era(by_v1)) == (3, 2)


def test_rolled_back_insert_leaves_no_stamp(store):
    run = rid()
    with store.connect(2) as v2:
        v2.execute("BEGIN")
        create_run(v2, run)
        assert v2.execute("SELECT openwop_seat.era_of(%s)", (run,)).fetchone() == (3,)  # its own stamp
        v2.execute("ROLLBACK")
    assert store.era(run) == 2
    assert store.run_era_rows(run) == []
    assert store.sql("SELECT count(*) FROM runs WHERE run_id = %s", (run,)) == [(0,)]


def test_no_stamp_for_v1_writers(store):
    unclaimed, major1 = rid(), rid()
    with store.connect() as v1:
        assert v1.execute("SELECT openwop_seat.session_major()").fetchone() == (None,)
        create_run(v1, unclaimed)
    with store.connect(1) as m1:
        assert m1.execute("SELECT openwop_seat.session_major()").fetchone() == (1,)
        create_run(m1, major1)
    assert (store.era(unclaimed), store.era(major1)) == (2, 2)
    assert store.run_era_rows(unclaimed) == store.run_era_rows(major1) == []


def test_upsert_of_an_existing_run_does_not_stamp_it(store):
    run = rid()
    with store.connect() as v1:
        create_run(v1, run)
    with store.connect(2) as v2:
        v2.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't') "
                   "ON CONFLICT (run_id) DO UPDATE SET status = 'running'", (run,))
    assert store.era(run) == 2
    assert store.sql("SELECT status FROM runs WHERE run_id = %s", (run,)) == [("running",)]


def test_update_of_runs_never_changes_an_era(store):
    era3, era2 = rid(), rid()
    with store.connect(2) as v2:
        create_run(v2, era3)
    with store.connect() as v1:
        create_run(v1, era2)
        v1.execute("UPDATE runs SET status = 'done' WHERE run_id = %s", (era2,))
    with store.connect(2) as v2:
        v2.execute("UPDATE runs SET status = 'done' WHERE run_id = %s", (era3,))
    assert (store.era(era3), store.era(era2)) == (3, 2)
    if store.kind == "era_column":
        for conn in (store.connect(), store.connect(2)):
            with conn:
                conn.execute(f"UPDATE runs SET {ERA_COLUMN} = 3 WHERE run_id = %s", (era2,))
        with store.connect(2) as v2:  # (a v1 writer may not write an era-3 run's row at all: below)
            v2.execute(f"UPDATE runs SET {ERA_COLUMN} = NULL WHERE run_id = %s", (era3,))
            v2.execute(f"UPDATE runs SET {ERA_COLUMN} = NULL, status = 'x' WHERE run_id = %s", (era3,))
        assert (store.era(era3), store.era(era2)) == (3, 2)
        assert store.sql("SELECT status FROM runs WHERE run_id = %s", (era3,)) == [("x",)]  # the rest is updated
        # stamp_run (a backfill's stamp) runs as the owner of openwop_seat: it may.
        assert store.sql("SELECT openwop_seat.stamp_run(%s, 'test')", (era2,)) == [(True,)]
        assert store.era(era2) == 3


# --- appends: the writer rule by era and major -----------------------------------------------------


def test_v2_append_to_era2_stores_the_v1_spelling(store):
    run, orphan = rid(), rid("orphan")  # an orphan has no runs row: era 2
    with store.connect() as v1:
        create_run(v1, run)
    names = [A.v1_to_v2[v1] for v1 in RENAMED] + ["run.started", VENDOR]
    with store.connect(2) as v2:
        for seq, name in enumerate(names):
            append(v2, run, seq, name)
        append(v2, orphan, 0, "agent.reasoning-delta")
    assert store.stored(run) == RENAMED + ["run.started", VENDOR]
    assert "agent.reasoning.delta" in store.stored(run)
    assert store.stored(orphan) == ["agent.reasoning.delta"]
    assert store.era(run) == 2  # an append does not promote the run


@pytest.mark.parametrize("etype, why", [
    ("agent.reasoning.delta", "is a v1 spelling (its v2 name is 'agent.reasoning-delta')"),
    ("foo.bar", "has no codemap row and no registered vendor prefix"),
    (RESERVED, "has no codemap row and no registered vendor prefix"),
    ("example", "has no codemap row and no registered vendor prefix"),
])
def test_v2_append_to_era2_refuses_what_has_no_v1_spelling(store, etype, why):
    run = rid()
    with store.connect(2) as v2:
        err = refusal(lambda: append(v2, run, 7, etype), "OW001")
    message = assert_envelope(err, "event_type_unmapped", etype, run, 7)
    assert f"event type '{etype}' appended to era-2 run '{run}' at sequence 7 by a v2 writer " in message
    assert why in message
    assert store.stored(run) == []


def test_v2_append_to_era3_is_stored_as_is(store):
    run = rid()
    names = sorted(A.v2_types) + [VENDOR]
    with store.connect(2) as v2:
        create_run(v2, run)
        with v2.cursor() as cur:
            cur.executemany("INSERT INTO events (event_id, run_id, sequence, type, \"timestamp\") "
                            "VALUES (%s, %s, %s, %s, now())",
                            [(f"{run}-{i}", run, i, t) for i, t in enumerate(names)])
    assert store.stored(run) == names


@pytest.mark.parametrize("etype, why", [
    ("agent.reasoning.delta", "is a v1 spelling (its v2 name is 'agent.reasoning-delta'): an era-3 log is written "
                              "in v2 vocabulary"),
    ("foo.bar", "has no codemap row and no registered vendor prefix"),
])
def test_v2_append_to_era3_refuses_v1_spellings_and_unknown_types(store, etype, why):
    run = rid()
    with store.connect(2) as v2:
        create_run(v2, run)
        err = refusal(lambda: append(v2, run, 0, etype), "OW001")
    message = assert_envelope(err, "event_type_unmapped", etype, run, 0)
    assert message == f"event type '{etype}' appended to era-3 run '{run}' at sequence 0 {why}"


def test_v2_append_of_a_null_type_is_malformed(store):
    run = rid()
    with store.connect(2) as v2:
        err = refusal(lambda: append(v2, run, 3, None), "OW003")
    assert_envelope(err, "event_row_malformed", None, run, 3)


@pytest.mark.parametrize("major", [None, 1])
def test_v1_append_to_era3_is_refused(store, major):
    run, era2_run = rid(), rid()
    with store.connect(2) as v2:
        create_run(v2, run)
    with store.connect(major) as v1:
        for etype in ("agent.reasoning-delta", "agent.reasoning.delta"):
            err = refusal(lambda: append(v1, run, 4, etype), "OW005")
            message = assert_envelope(err, "era2_write_refused", etype, run, 4)
            assert message.startswith(f"event type '{etype}' appended to era-3 run '{run}' at sequence 4 by a "
                                      f"writer that is not a v2 writer")
            assert err.diag.message_hint
        # one era-3 row fails the whole statement, COPY included
        refusal(lambda: v1.execute(
            "INSERT INTO events (event_id, run_id, sequence, type, \"timestamp\") VALUES "
            "(%s, %s, 0, 'run.started', now()), (%s, %s, 0, 'run.started', now())",
            (f"{era2_run}-0", era2_run, f"{run}-0", run)), "OW005")

    # COPY FROM: PostgreSQL refuses it under row-level security (the net, ADR 0009) for roles the policies
    # apply to, so it is a role that bypasses them (here the superuser) that copies; the triggers still fire.
    with store.connect(major, user="postgres") as copier:
        def copy():
            with copier.cursor().copy("COPY events (event_id, run_id, sequence, type, \"timestamp\") FROM STDIN") as cp:
                cp.write_row((f"{run}-9", run, 9, "run.started", "2026-01-01T00:00:00Z"))

        refusal(copy, "OW005")
    with store.connect(major) as v1:
        def copy_as_host():
            with v1.cursor().copy("COPY events (event_id, run_id, sequence, type, \"timestamp\") FROM STDIN") as cp:
                cp.write_row((f"{era2_run}-9", era2_run, 9, "run.started", "2026-01-01T00:00:00Z"))

        refusal(copy_as_host, "0A000")  # COPY FROM not supported with row-level security
    assert store.stored(run) == store.stored(era2_run) == []


@pytest.mark.parametrize("major", [None, 1])
def test_v1_append_to_era2_is_stored_as_is(store, major):
    run = rid()
    names = ["agent.reasoning.delta", "agent.reasoning-delta", "foo.bar", VENDOR]
    with store.connect(major) as v1:
        create_run(v1, run)
        for seq, name in enumerate(names):
            append(v1, run, seq, name)
    assert store.stored(run) == names


def test_run_created_and_appended_in_one_transaction(store):
    run = rid()
    with store.connect(2) as v2:
        with v2.transaction():
            create_run(v2, run)
            append(v2, run, 0, "agent.reasoning-delta")  # sees its own stamp: era 3, stored as is
    assert store.stored(run) == ["agent.reasoning-delta"]
    assert store.era(run) == 3


# --- UPDATE of events.type / run_id --------------------------------------------------------------


def test_update_of_type_or_run_is_refused_except_for_the_maintenance_role(store, maintenance_role):
    run = rid()
    with store.connect() as v1:
        append(v1, run, 0, "agent.reasoning.delta")
    with store.connect(2) as v2:  # a translated session: the UPDATE reads stored rows, and the net refuses first
        refusal(lambda: v2.execute("UPDATE events SET type = 'run.started' WHERE run_id = %s", (run,)), "OW008")
    for conn in (store.connect(), store.connect(2, user="postgres"), store.connect(user="postgres")):
        with conn:
            for assignment in ("type = 'run.started'", "run_id = 'elsewhere'"):
                err = refusal(lambda: conn.execute(f"UPDATE events SET {assignment} WHERE run_id = %s", (run,)),
                              UPDATE_REFUSED_SQLSTATE)
                assert err.diag.message_primary == "openwop_seat: UPDATE of events.type/run_id is refused"
                assert f"run '{run}' at sequence 0" in err.diag.message_detail
                assert maintenance_role in err.diag.message_hint
            conn.execute("UPDATE events SET payload = '{\"k\": 1}', type = type WHERE run_id = %s", (run,))
    assert store.stored(run) == ["agent.reasoning.delta"]
    with store.connect(user="postgres") as admin:
        admin.execute(f"SET ROLE {maintenance_role}")
        admin.execute("UPDATE events SET type = 'agent.reasoning-delta' WHERE run_id = %s", (run,))
    assert store.stored(run) == ["agent.reasoning-delta"]


# --- spoofing the claim --------------------------------------------------------------------------


def claims_of(store: Store, pid: int) -> list[tuple]:
    return store.sql("SELECT major FROM openwop_seat.claims WHERE pid = %s", (pid,))


def test_wrong_secret_is_refused_and_records_nothing(store):
    run = rid()
    with store.connect() as conn:
        pid = conn.info.backend_pid
        for secret in (WRONG, SECRET.upper(), SECRET + " "):
            err = refusal(lambda: claim(conn, secret, 2), "42501")
            assert err.diag.message_primary == "openwop_seat.claim: wrong secret"
        for proof in (SECRET, None, ""):  # the secret itself is no proof
            conn.execute("SELECT openwop_seat.claim_challenge()")
            err = refusal(lambda: conn.execute("SELECT openwop_seat.claim(%s, 2)", (proof,)), "42501")
            assert err.diag.message_primary == "openwop_seat.claim: wrong secret"
        assert claims_of(store, pid) in ([], [(None,)])  # at most a pending challenge, no major
        assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (None,)
        create_run(conn, run)
        refusal(lambda: claim(conn, SECRET, 3), "22023")
        assert claims_of(store, pid) in ([], [(None,)])
    assert store.era(run) == 2


def test_session_settings_claim_nothing(store):
    run = rid()
    with store.connect() as conn:
        conn.execute("SET openwop_seat.major = '2'")
        conn.execute("SELECT set_config('openwop_seat.major', '2', false), "
                     "set_config('openwop_seat.claim', '2', false)")
        assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (None,)
        create_run(conn, run)
        assert claims_of(store, conn.info.backend_pid) == []
    assert store.era(run) == 2


def test_dynamic_sql_with_a_wrong_secret_fails(store):
    with store.connect() as conn:
        err = refusal(lambda: conn.execute(
            "DO $$ BEGIN EXECUTE 'SELECT openwop_seat.claim($1, 2)' USING 'a-literal-guess-in-dynamic-sql'; END $$"),
            "42501")
        assert "wrong secret" in err.diag.message_primary
        assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (None,)


def test_a_claim_of_an_earlier_backend_with_the_same_pid_is_not_inherited(store):
    run = rid()
    with store.connect() as conn:
        pid = conn.info.backend_pid
        # As if an earlier backend with this pid had claimed major 2 and exited.
        store.sql("INSERT INTO openwop_seat.claims (pid, backend_start, major) "
                  "SELECT %s, backend_start - interval '1 hour', 2 FROM pg_stat_activity WHERE pid = %s "
                  "ON CONFLICT (pid) DO UPDATE SET backend_start = EXCLUDED.backend_start, major = 2", (pid, pid))
        assert claims_of(store, pid) == [(2,)]
        assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (None,)
        create_run(conn, run)
        assert store.era(run) == 2
        claim(conn, SECRET, 2)
        assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (2,)
        # Another session that changes the claim ends the backend (test_claim_lost.py): never on without it.
        store.sql("UPDATE openwop_seat.claims SET backend_start = backend_start + interval '1 second' "
                  "WHERE pid = %s", (pid,))
        with pytest.raises(psycopg.OperationalError, match="terminating connection due to administrator command"):
            conn.execute("SELECT openwop_seat.session_major()")


@pytest.mark.parametrize("major", [None, 2])
def test_the_host_role_cannot_read_the_secret_or_write_the_records(store, major):
    run = rid()
    statements = [
        "SELECT * FROM openwop_seat.claim_secret",
        "UPDATE openwop_seat.claim_secret SET hash = 'x'",
        "SELECT * FROM openwop_seat.claims",
        "INSERT INTO openwop_seat.claims (pid, backend_start, major) VALUES (pg_backend_pid(), now(), 2)",
        "UPDATE openwop_seat.claims SET major = 2",
        "DELETE FROM openwop_seat.claims",
        f"INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES ('{run}', 3, 'host')",
        "DELETE FROM openwop_seat.run_era",
        f"SELECT openwop_seat.stamp_run('{run}', 'host')",
        "CREATE FUNCTION openwop_seat.mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    ]
    # (host_user owns events, so it could disable the triggers: the guard is as strong as the roles.)
    with store.connect(major) as conn:
        for sql in statements:
            refusal(lambda: conn.execute(sql), "42501")
    assert store.era(run) == 2


def test_the_secret_stays_out_of_pg_stat_activity_and_the_log(store):
    with store.connect(2) as v2, store.connect() as other:
        refusal(lambda: other.execute("SELECT openwop_seat.claim(%s, 1)", (WRONG,)), "42501")
        rows = store.sql("SELECT pid, query FROM pg_stat_activity")
        assert not [q for _, q in rows if q and (SECRET in q or WRONG in q)]
        assert dict(rows)[v2.info.backend_pid] == "SELECT openwop_seat.claim($1, $2)"
    (salt, digest), = store.sql("SELECT salt, hash FROM openwop_seat.claim_secret")
    assert digest == hashlib.sha256((salt + SECRET).encode()).hexdigest() and SECRET not in salt + digest
    with open(store.pg.logfile, errors="replace") as log:
        text = log.read()
    assert SECRET not in text and WRONG not in text  # the secret is never sent (a DO block's literal would be logged)


# --- guards that hold whatever other triggers exist (ADR 0006) ---------------------------------------


@pytest.fixture
def trigger_role(store):
    """A role with only the TRIGGER privilege on events (and a function of its own to fire)."""
    role = f"trig_{uuid.uuid4().hex[:8]}"
    store.sql(f"CREATE ROLE {role}; GRANT TRIGGER ON events TO {role}; GRANT USAGE, CREATE ON SCHEMA public TO {role}")
    yield role
    store.sql(f"DROP TRIGGER IF EXISTS zzzz_{role} ON events; DROP OWNED BY {role}; DROP ROLE {role}")


def add_late_trigger(store: Store, role: str, body: str) -> None:
    """A BEFORE INSERT trigger on events whose name sorts after the seat's, made by ``role``."""
    store.sql(f"SET ROLE {role}; "
              f"CREATE FUNCTION public.{role}_fn() RETURNS trigger LANGUAGE plpgsql "
              f"AS $$ BEGIN {body} RETURN NEW; END $$; "
              f"CREATE TRIGGER zzzz_{role} BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION public.{role}_fn(); "
              f"RESET ROLE")


def test_a_trigger_after_the_guard_cannot_move_a_v1_row_into_an_era3_run(store, trigger_role):
    era3, era2 = rid("e3"), rid("e2")
    with store.connect(2) as v2:
        create_run(v2, era3)
    add_late_trigger(store, trigger_role, f"IF NEW.run_id = '{era2}' THEN NEW.run_id := '{era3}'; END IF;")
    with store.connect() as v1:
        err = refusal(lambda: append(v1, era2, 0, RENAMED[0]), ERRORS["era2_write_refused"].sqlstate)
        sentence = assert_envelope(err, "era2_write_refused", RENAMED[0], era3, 0)
        assert sentence.startswith(f"event type '{RENAMED[0]}' stored in era-3 run '{era3}' at sequence 0")
    assert store.stored(era3) == [] and store.stored(era2) == []


def test_a_trigger_after_the_guard_cannot_put_a_v1_spelling_into_a_v2_writers_rows(store, trigger_role):
    era3, era2 = rid("e3"), rid("e2")
    with store.connect(2) as v2:
        create_run(v2, era3)
    add_late_trigger(store, trigger_role, f"NEW.type := '{RENAMED[0]}';")
    with store.connect(2) as v2:
        err = refusal(lambda: append(v2, era3, 0, A.v1_to_v2[RENAMED[0]]), ERRORS["event_type_unmapped"].sqlstate)
        assert "is not in v2 vocabulary" in assert_envelope(err, "event_type_unmapped", RENAMED[0], era3, 0)
        # in an era-2 run the v1 spelling is what the seat stores: the same late change passes there
        append(v2, era2, 0, A.v1_to_v2[RENAMED[0]])
    assert store.stored(era3) == [] and store.stored(era2) == [RENAMED[0]]


def test_stamping_at_creation_is_refused_for_a_run_that_already_has_events(store):
    run = rid()
    with store.connect() as v1:
        append(v1, run, 0, RENAMED[0])  # a v1 writer's event before the run's row exists
    with store.connect(2) as v2:
        err = refusal(lambda: create_run(v2, run), ERRORS["era2_write_refused"].sqlstate)
        # the stored (era-2) type is not printed to the v2 writer (issue 23)
        sentence = assert_envelope(err, "era2_write_refused", None, run, 0)
        assert "cannot be stamped era 3" in sentence and "before its runs row was created" in sentence
        assert RENAMED[0] not in str(err) + (err.diag.message_detail or "")
        assert "backfill" in err.diag.message_hint
    assert store.era(run) == 2 and store.sql("SELECT count(*) FROM runs WHERE run_id = %s", (run,)) == [(0,)]
    assert store.stored(run) == [RENAMED[0]]


def test_a_later_stamp_is_refused_while_events_are_not_v2_clean(store):
    run = rid()
    with store.connect() as v1:
        create_run(v1, run)
        append(v1, run, 0, "run.started")  # a name v2 shares
        append(v1, run, 1, RENAMED[0])  # a v1-only spelling
    with pytest.raises(psycopg.Error) as info:
        store.sql("SELECT openwop_seat.stamp_run(%s, 'operator')", (run,))
    assert info.value.sqlstate == ERRORS["era2_write_refused"].sqlstate
    assert f"(type '{RENAMED[0]}' at sequence 1)" in info.value.diag.message_primary
    assert store.era(run) == 2
    store.sql("DELETE FROM events WHERE run_id = %s AND sequence = 1", (run,))
    assert store.sql("SELECT openwop_seat.stamp_run(%s, 'operator')", (run,)) == [(True,)]
    assert store.era(run) == 3


def test_a_v1_writer_cannot_update_any_column_of_an_era3_event(store):
    era3, era2 = rid("e3"), rid("e2")
    with store.connect(2) as v2:
        create_run(v2, era3)
        append(v2, era3, 0, "run.started")
    with store.connect() as v1:
        create_run(v1, era2)
        append(v1, era2, 0, "run.started")
        for column, value in (("payload", '{"v1": "shape"}'), ("node_id", "n"), ("causation_id", "c")):
            err = refusal(lambda: v1.execute(f"UPDATE events SET {column} = %s WHERE run_id = %s", (value, era3)),
                          ERRORS["era2_write_refused"].sqlstate)
            # the stored type (a v2 name) is not printed to a writer that is not a v2 reader (issue 23)
            sentence = assert_envelope(err, "era2_write_refused", None, era3, 0)
            assert sentence.startswith(f"UPDATE of the event in era-3 run '{era3}' at sequence 0")
            assert "run.started" not in str(err)
        v1.execute("UPDATE events SET payload = '{\"a\": 1}' WHERE run_id = %s", (era2,))  # era 2: as before
    with store.connect(1, user="postgres") as major1:  # a role past the net: the trigger refuses
        refusal(lambda: major1.execute("UPDATE events SET payload = '{}' WHERE run_id = %s", (era3,)),
                ERRORS["era2_write_refused"].sqlstate)
    with store.connect(1) as major1:  # a translated session: the net refuses the read of the rows first
        refusal(lambda: major1.execute("UPDATE events SET payload = '{}' WHERE run_id = %s", (era3,)), "OW008")
    with store.connect(2, user="postgres") as v2:
        v2.execute("UPDATE events SET payload = '{\"b\": 2}' WHERE run_id = %s", (era3,))  # a v2 writer may
    assert store.sql("SELECT payload FROM events WHERE run_id = %s", (era3,)) == [({"b": 2},)]


# --- the lock: stamping and appending exclude each other --------------------------------------


def test_an_append_waits_for_a_stamp_in_flight_then_reads_the_era_again(store):
    run = rid()
    with store.connect(2) as creator, store.connect() as v1, store.connect(2) as v2:
        creator.execute("BEGIN")
        create_run(creator, run)  # holds the run's lock exclusively until it commits
        refused = Background(lambda: append(v1, run, 0, "run.started"))
        wait_for_lock(store, v1.info.backend_pid)
        translated = Background(lambda: append(v2, run, 1, "agent.reasoning-delta"))
        wait_for_lock(store, v2.info.backend_pid)
        creator.execute("COMMIT")
        with pytest.raises(psycopg.Error) as info:
            refused.result()
        assert info.value.sqlstate == "OW005"
        translated.result()
    assert store.stored(run) == ["agent.reasoning-delta"]  # era 3 by then: as is, not the v1 spelling


def test_a_stamp_waits_for_appends_in_flight(store):
    run = rid()
    with store.connect() as v1, psycopg.connect(store.pg.dsn(dbname=store.name), autocommit=True) as admin:
        create_run(v1, run)
        v1.execute("BEGIN")
        append(v1, run, 0, "run.started")  # era 2: stored; holds the run's lock shared (a name v2 shares)
        stamp = Background(lambda: admin.execute("SELECT openwop_seat.stamp_run(%s, 'backfill')", (run,)).fetchone())
        wait_for_lock(store, admin.info.backend_pid)
        v1.execute("COMMIT")
        assert stamp.result() == (True,)
    assert store.era(run) == 3
    assert store.stored(run) == ["run.started"]
    assert store.sql("SELECT openwop_seat.stamp_run(%s, 'backfill')", (run,)) == [(False,)]  # once


def test_repeatable_read_append_fails_while_a_stamp_is_in_flight(store):
    run = rid()
    with store.connect(2) as creator, store.connect() as rr:
        creator.execute("BEGIN")
        create_run(creator, run)
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        err = refusal(lambda: append(rr, run, 0, "run.started"), "40001")  # at once, without waiting
        assert "retry the transaction" in err.diag.message_primary
        rr.execute("ROLLBACK")
        creator.execute("COMMIT")


# Only the run_era store can be probed for a stamp the snapshot does not show (the era_column
# store cannot: a documented limit, see docs/writer-rule.md, "REPEATABLE READ and SERIALIZABLE").
@pytest.mark.parametrize("store", ["run_era"], indirect=True)
def test_repeatable_read_append_detects_a_stamp_committed_after_its_snapshot(store):
    run, quiet_run = rid(), rid()
    with store.connect(2) as creator, store.connect() as rr:
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT 1 FROM events LIMIT 1")  # takes the snapshot
        create_run(creator, run)  # commits after the snapshot
        append(rr, quiet_run, 0, "run.started")  # no stamp anywhere: the probe rolls itself back
        refusal(lambda: append(rr, run, 0, "run.started"), "40001")
        rr.execute("ROLLBACK")
    assert store.run_era_rows(quiet_run) == []
    assert store.sql("SELECT count(*) FROM openwop_seat.run_era WHERE source = 'openwop_seat.snapshot-probe'") == [(0,)]
    with store.connect() as rr:
        with rr.transaction():
            rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            append(rr, quiet_run, 0, "run.started")
    assert store.stored(quiet_run) == ["run.started"]


@pytest.mark.parametrize("store", ["run_era"], indirect=True)
@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_v2_creation_under_repeatable_read_sees_an_append_committed_after_its_snapshot(store, isolation):
    """Events appended to a run before its runs row exists are era 2; a v2 writer that then creates the run must
    not stamp it era 3. Its snapshot may predate the append: the stamp probes the append's record and the
    creation fails with serialization_failure; the retry sees the events and refuses, as in READ COMMITTED."""
    run, fresh = rid(), rid()
    with store.connect(2) as creator, store.connect() as v1:
        creator.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        creator.execute("SELECT 1 FROM runs LIMIT 1")  # takes the snapshot
        append(v1, run, 1, "run.started")  # a v1 writer's event, before the run's row, committed after it
        refusal(lambda: create_run(creator, run), "40001")
        creator.execute("ROLLBACK")
        err = refusal(lambda: create_run(creator, run), ERRORS["era2_write_refused"].sqlstate)  # the retry
        assert "before its runs row was created" in err.diag.message_primary
        creator.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        create_run(creator, fresh)  # a run nobody appended to: the probe rolls itself back
        creator.execute("COMMIT")
    assert store.era(run) == 2 and store.era(fresh) == 3
    assert store.stored(run) == ["run.started"]
    assert store.sql("SELECT run_id FROM openwop_seat.era2_orphan_appends WHERE run_id IN (%s, %s)",
                     (run, fresh)) == [(run,)]


@pytest.mark.parametrize("store", ["run_era"], indirect=True)
def test_an_append_to_a_run_with_its_row_records_nothing(store):
    run = rid()
    with store.connect() as v1:
        create_run(v1, run)
        append(v1, run, 1, "run.started")
    assert store.sql("SELECT count(*) FROM openwop_seat.era2_orphan_appends WHERE run_id = %s", (run,)) == [(0,)]


# --- migrate: the claim secret, the triggers, the owner ------------------------------------------


@pytest.fixture
def make_db(pg):
    made = []

    def make(ddl: str = HOST_SCHEMA) -> str:
        name = f"wr_{uuid.uuid4().hex[:10]}"
        pg.psql(f"CREATE DATABASE {name} OWNER host_user")
        if ddl:
            pg.psql(ddl, user="host_user", dbname=name)
        made.append(name)
        return name

    yield make
    for name in made:
        pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


def migrate(pg, db: str, config: Config = Config(), user: str | None = None) -> tuple[list[str], list[str]]:
    """(what migrate returned, every line it printed)."""
    lines: list[str] = []
    done = asyncio.run(db_migrate(pg.dsn(user=user, dbname=db), config, A, out=lines.append))
    return done, lines


def claim_state(pg, db: str, secret: str) -> str | None:
    """None when ``secret`` claims major 2 on ``db``; else the refusal's SQLSTATE."""
    with psycopg.connect(pg.dsn(user="host_user", dbname=db), autocommit=True) as conn:
        try:
            claim(conn, secret, 2)
        except psycopg.Error as e:
            return e.sqlstate
        assert conn.execute("SELECT openwop_seat.session_major()").fetchone() == (2,)
        return None


def test_claim_secret_lifecycle(pg, make_db, monkeypatch):
    db = make_db()
    monkeypatch.delenv(CLAIM_SECRET_ENV, raising=False)
    _, lines = migrate(pg, db)
    assert "no claim secret installed: every session is a v1 writer" in lines
    assert claim_state(pg, db, SECRET) == "42501"

    monkeypatch.setenv(CLAIM_SECRET_ENV, SECRET)
    done, _ = migrate(pg, db)
    assert done == ["installed the claim secret (its salted SHA-256: the secret itself is not stored)"]
    assert claim_state(pg, db, SECRET) is None

    monkeypatch.delenv(CLAIM_SECRET_ENV)
    done, lines = migrate(pg, db)
    assert done == ["nothing to do"] and "no claim secret given: the existing one is kept" in lines
    assert claim_state(pg, db, SECRET) is None

    monkeypatch.setenv(CLAIM_SECRET_ENV, SECRET)
    done, lines = migrate(pg, db)
    assert done == ["nothing to do"] and "the claim secret given is the one installed: kept" in lines

    other = f"another-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv(CLAIM_SECRET_ENV, other)
    done, _ = migrate(pg, db)
    assert done == ["replaced the claim secret: seats still holding the old one can no longer claim a major"]
    assert claim_state(pg, db, SECRET) == "42501" and claim_state(pg, db, other) is None
    assert pg.psql("SELECT count(*) FROM openwop_seat.claim_secret", dbname=db).strip() == "1"


def test_load_claim_secret(tmp_path, monkeypatch):
    monkeypatch.delenv(CLAIM_SECRET_ENV, raising=False)
    assert load_claim_secret(Config()) is None
    monkeypatch.setenv(CLAIM_SECRET_ENV, SECRET)
    assert load_claim_secret(Config()) == SECRET
    secret_file = tmp_path / "claim-secret"
    secret_file.write_text("from-the-file-0123456789\n")
    config = parse_config({"host": {"claim_secret_file": "claim-secret"}}, source=str(tmp_path / "seat.toml"))
    assert config.host.claim_secret_file == str(secret_file)  # relative to the config file
    assert load_claim_secret(config) == "from-the-file-0123456789"  # the file wins over the environment
    for content, what in (("\n", "empty"), (b"", "empty"), ("short\n", "fewer than 16"), (b"\xff" * 20, "UTF-8")):
        secret_file.write_bytes(content.encode() if isinstance(content, str) else content)
        with pytest.raises(ConfigError, match=f"host.claim_secret_file: .*{what}"):
            load_claim_secret(config)
    secret_file.unlink()
    with pytest.raises(ConfigError, match="host.claim_secret_file: no such file"):
        load_claim_secret(config)
    monkeypatch.setenv(CLAIM_SECRET_ENV, "")
    with pytest.raises(ConfigError, match=f"{CLAIM_SECRET_ENV}: the claim secret is empty"):
        load_claim_secret(Config())
    assert parse_config({"host": {"maintenance_role": "ops"}}).host.maintenance_role == "ops"
    with pytest.raises(ConfigError, match="host.maintenance_role"):
        parse_config({"host": {"maintenance_role": ""}})


def test_a_bad_secret_file_changes_nothing(pg, make_db, tmp_path):
    db = make_db()
    config = Config(host=HostConfig(claim_secret_file=str(tmp_path / "absent")))
    with pytest.raises(ConfigError, match="host.claim_secret_file"):
        migrate(pg, db, config)
    assert not pg.psql("SELECT 1 FROM pg_namespace WHERE nspname = 'openwop_seat'", dbname=db)


def test_verify_refuses_missing_disabled_or_foreign_triggers(pg, make_db, monkeypatch):
    monkeypatch.delenv(CLAIM_SECRET_ENV, raising=False)
    db = make_db(HOST_SCHEMA + f"ALTER TABLE runs ADD COLUMN {ERA_COLUMN} smallint;")
    migrate(pg, db)
    run_verify = lambda config=Config(): asyncio.run(verify(pg.dsn(dbname=db), config, A))  # noqa: E731
    run_verify()
    pg.psql("DROP TRIGGER zz_openwop_seat_append ON events", dbname=db)
    with pytest.raises(SchemaError, match="zz_openwop_seat_append on events is missing"):
        run_verify()
    assert migrate(pg, db)[0] == [f"installed artifact objects for digest {A.digest} (tag {A.tag})"]
    run_verify()
    pg.psql("ALTER TABLE runs DISABLE TRIGGER zz_openwop_seat_stamp", dbname=db)
    with pytest.raises(SchemaError, match="zz_openwop_seat_stamp on runs is disabled"):
        run_verify()
    migrate(pg, db)
    run_verify()
    # Another [host] configuration: its triggers replace the old ones.
    column = Config(host=HostConfig(era_column=ERA_COLUMN))
    with pytest.raises(SchemaError, match="not in force"):
        run_verify(column)
    migrate(pg, db, column)
    run_verify(column)
    pg.psql("CREATE TRIGGER zz_openwop_seat_stamp AFTER INSERT ON runs FOR EACH ROW "
            "EXECUTE FUNCTION openwop_seat.on_run_insert()", dbname=db)
    with pytest.raises(SchemaError, match="another \\[host\\] configuration"):
        run_verify(column)
    migrate(pg, db, column)
    names = pg.psql("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1", dbname=db).split()
    assert names == ["zz_openwop_seat_append", "zz_openwop_seat_append_check", "zz_openwop_seat_claim_changed",
                     "zz_openwop_seat_claim_deleted", "zz_openwop_seat_claims_truncated", "zz_openwop_seat_clean",
                     "zz_openwop_seat_delete_era3", "zz_openwop_seat_keep_era_column", "zz_openwop_seat_run_era3",
                     "zz_openwop_seat_stamp_era_column", "zz_openwop_seat_update", "zz_openwop_seat_update_era3"]


def test_missing_host_tables_are_reported_and_installed_later(pg, make_db, monkeypatch):
    monkeypatch.delenv(CLAIM_SECRET_ENV, raising=False)
    db = make_db("")
    _, lines = migrate(pg, db)
    assert any(line.startswith("the events table 'events' (host.events_table) does not exist") for line in lines)
    asyncio.run(verify(pg.dsn(dbname=db), Config(), A))  # nothing to guard yet
    pg.psql(HOST_SCHEMA, user="host_user", dbname=db)
    with pytest.raises(SchemaError, match="not in force"):
        asyncio.run(verify(pg.dsn(dbname=db), Config(), A))
    assert migrate(pg, db)[0] == [f"installed artifact objects for digest {A.digest} (tag {A.tag})"]
    asyncio.run(verify(pg.dsn(dbname=db), Config(), A))
    pg.psql("ALTER TABLE events RENAME COLUMN type TO kind", user="host_user", dbname=db)
    with pytest.raises(SchemaError, match="no column 'type' \\(host.type_column\\)"):
        migrate(pg, db)


def test_an_owner_that_cannot_see_sessions_is_refused_a_secret(pg, make_db, monkeypatch):
    owner = f"ow_owner_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE ROLE {owner} LOGIN")
    made_here = []
    try:
        db = make_db()
        made_here.append(db)  # dropped before the role that owns its objects
        pg.psql(f"GRANT CREATE ON DATABASE {db} TO {owner}; GRANT TRIGGER ON runs, events TO {owner}; "
                f"GRANT SELECT ON events TO {owner}", dbname=db)
        monkeypatch.setenv(CLAIM_SECRET_ENV, SECRET)
        with pytest.raises(SchemaError) as info:
            migrate(pg, db, user=owner)
        # every grant it needs, at once, each as the exact GRANT (ADR 0009: the net needs the table owner's rights)
        grants = [line.split("--")[0].strip() for line in str(info.value).splitlines()[1:]]
        assert grants == [f"GRANT pg_read_all_stats TO {owner};", f"GRANT host_user TO {owner};"]
        assert not pg.psql("SELECT 1 FROM pg_namespace WHERE nspname = 'openwop_seat'", dbname=db)
        pg.psql(f"GRANT pg_read_all_stats TO {owner}")
        with pytest.raises(SchemaError, match=f"GRANT host_user TO {owner};"):
            migrate(pg, db, user=owner)
        pg.psql(f"GRANT host_user TO {owner}")
        migrate(pg, db, user=owner)
        assert claim_state(pg, db, SECRET) is None  # a non-superuser owner works once it can see sessions
        run = rid()
        with psycopg.connect(pg.dsn(user="host_user", dbname=db), autocommit=True) as v2:
            claim(v2, SECRET, 2)
            create_run(v2, run)
            append(v2, run, 0, "agent.reasoning-delta")
            assert v2.execute("SELECT openwop_seat.era_of(%s)", (run,)).fetchone() == (3,)
    finally:
        for db in made_here:
            pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)
        pg.psql(f"DROP ROLE IF EXISTS {owner}", check=False)


# --- the generated SQL ---------------------------------------------------------------------------


def test_generated_writer_sql_comes_from_the_artifacts():
    rows = {"a.one": "a.one", "a.old-two": "a.two", "b.x": "b.merged", "b.y": "b.merged"}
    fake = dataclasses.replace(A, v1_to_v2=rows, v1_types=frozenset(rows), v2_types=frozenset(rows.values()),
                               renamed=frozenset({"a.old-two", "b.x", "b.y"}), v2_to_v1=None)
    sql = writer_rule_sql(fake, HostConfig())
    assert "WHEN 'a.two' THEN 'a.old-two'" in sql  # v2 -> v1 for an era-2 append
    assert "WHEN 'a.old-two' THEN 'a.two'" in sql  # the v1 spelling named in a refusal
    assert "'b.merged'" in sql and "THEN 'b.x'" not in sql and "THEN 'b.y'" not in sql  # no one v1 spelling
    for name in A.v1_types - {"a.one"}:
        assert f"'{name}'" not in sql
    assert str(RUN_LOCK_SEED) in sql
    column = writer_rule_sql(fake, HostConfig(runs_table="app.Runs", run_id_column="Id", era_column="Era",
                                                     events_table="app.Events", type_column="Kind",
                                                     maintenance_role="ops"))
    assert 'NEW."Kind" := v_other' in column and 'UPDATE "app"."Runs" SET "Era" = 3' in column
    assert "current_user = 'ops'" in column
    assert "openwop_seat: UPDATE of app.Events.Kind/Id is refused" in column


# --- DELETE of an era-3 run's events (issue 23) ---------------------------------------------------


def test_a_non_v2_writer_cannot_delete_an_era3_runs_events(store, maintenance_role):
    era3, era2 = rid("d3"), rid("d2")
    with store.connect(2) as v2:
        create_run(v2, era3)
        append(v2, era3, 0, "run.started")
        append(v2, era3, 1, "agent.reasoning-delta")
    with store.connect() as v1:
        create_run(v1, era2)
        append(v1, era2, 0, "run.started")
    for major in (None, 0):  # host_user unclaimed, or claimed raw
        with store.connect(major) as v1:
            err = refusal(lambda: v1.execute("DELETE FROM events WHERE run_id = %s", (era3,)), "OW005")
            sentence = assert_envelope(err, "era2_write_refused", None, era3, 0)
            assert sentence.startswith(f"DELETE of the event in era-3 run '{era3}' at sequence 0 by a writer that "
                                       f"is not a v2 writer")
            assert "agent.reasoning-delta" not in str(err) and "run.started" not in str(err)
            refusal(lambda: v1.execute("DELETE FROM events"), "OW005")  # a DELETE with no WHERE too
    with store.connect(1) as major1:
        # a translated session: a DELETE with a WHERE reads stored rows, and the net refuses first; without one
        # it reads nothing, and the trigger refuses
        refusal(lambda: major1.execute("DELETE FROM events WHERE run_id = %s", (era3,)), "OW008")
        refusal(lambda: major1.execute("DELETE FROM events"), "OW005")
    assert store.stored(era3) == ["run.started", "agent.reasoning-delta"]
    with store.connect() as v1:  # an era-2 run's events: as before
        v1.execute("DELETE FROM events WHERE run_id = %s", (era2,))
    assert store.stored(era2) == []
    with store.connect(2, user="postgres") as v2:  # a v2 writer may
        v2.execute("DELETE FROM events WHERE run_id = %s AND sequence = 1", (era3,))
    assert store.stored(era3) == ["run.started"]
    store.sql(f"GRANT DELETE ON events TO {maintenance_role}")
    with store.connect(user="postgres") as admin:  # and so may host.maintenance_role
        admin.execute(f"SET ROLE {maintenance_role}")
        admin.execute("DELETE FROM events WHERE run_id = %s", (era3,))
    assert store.stored(era3) == []


def test_a_non_v2_writer_cannot_write_an_era3_runs_row(store, maintenance_role):
    """A v1 action on an era-3 run (a cancel: the runs row, then an event) fails before it changes anything."""
    era3, era2 = rid("r3"), rid("r2")
    with store.connect(2) as v2:
        create_run(v2, era3)
    with store.connect() as v1:
        create_run(v1, era2)
    for major in (None, 0, 1):
        with store.connect(major) as v1:
            for sql, op in (("UPDATE runs SET status = 'cancelled' WHERE run_id = %s", "UPDATE"),
                            ("DELETE FROM runs WHERE run_id = %s", "DELETE")):
                err = refusal(lambda: v1.execute(sql, (era3,)), "OW005")
                sentence = assert_envelope(err, "era2_write_refused", None, era3, None)
                assert sentence.startswith(f"{op} of the runs row of era-3 run '{era3}' by a writer that is not a "
                                           f"v2 writer")
            v1.execute("UPDATE runs SET status = 'cancelled' WHERE run_id = %s", (era2,))  # era 2: as before
    assert store.sql("SELECT status FROM runs WHERE run_id = %s", (era3,)) == [(None,)]
    assert store.era(era3) == 3
    with store.connect(2) as v2:  # a v2 writer may
        v2.execute("UPDATE runs SET status = 'cancelled' WHERE run_id = %s", (era3,))
    assert store.sql("SELECT status FROM runs WHERE run_id = %s", (era3,)) == [("cancelled",)]
