"""The seat's schema in a real PostgreSQL: layout steps, artifact objects, and the era check of reads.

Every test that changes the seat's schema gets a database of its own (created
with ``CREATE DATABASE`` on the shared test cluster and dropped afterwards), so
tests do not disturb each other or the rest of the suite.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from proxy.artifacts.load import load_artifacts
from proxy.config import Config, HostConfig
from proxy.db.declarations_sql import SIGNATURE as DECLARED_V2
from proxy.db.layout import (
    LAYOUT_VERSION,
    STEP_FUNCTIONS,
    STEPS,
    DigestMismatch,
    SchemaError,
    SchemaGap,
    SchemaMissing,
    SchemaTooNew,
)
from proxy.db.migrate import migrate as db_migrate
from proxy.db.migrate import verify as db_verify
from proxy.db.reader_sql import era_sql, read_check_sql
from proxy.db.sql import quote_literal, text_array_literal
from proxy.db.writer_sql import FUNCTIONS
from proxy.errors import ERRORS

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()

ARTIFACTS = load_artifacts()
V1_TYPE = sorted(ARTIFACTS.v1_types)[0]
VENDOR_TYPE = "example.thing-happened"

EVENTS_DDL = """(event_id text PRIMARY KEY, run_id text, sequence int, type text, node_id text, payload jsonb,
                 "timestamp" timestamptz, causation_id text, UNIQUE (run_id, sequence))"""

ERA_COLUMN_CONFIG = Config(host=HostConfig(era_column="era"))


def run(coro):
    return asyncio.run(coro)


def quiet(line: str) -> None:
    pass


def code_of(sqlstate: str) -> str:
    return next(e.code for e in ERRORS.values() if e.sqlstate == sqlstate)


@pytest.fixture
def make_db(pg):
    """Factory: a fresh database owned by host_user; every one made is dropped at the end."""
    made = []

    def make() -> str:
        name = f"ow_schema_{os.getpid()}_{next(_names)}"
        pg.psql(f"CREATE DATABASE {name} OWNER host_user")
        made.append(name)
        return name

    yield make
    for name in made:
        pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


def migrate(pg, db: str, config: Config = Config(), artifacts=ARTIFACTS) -> list[str]:
    return run(db_migrate(pg.dsn(dbname=db), config, artifacts, out=quiet))


def verify(pg, db: str, config: Config = Config(), artifacts=ARTIFACTS) -> None:
    run(db_verify(pg.dsn(dbname=db), config, artifacts))


def meta(pg, db: str) -> dict[str, str]:
    rows = pg.psql("SELECT key, value FROM openwop_seat.meta ORDER BY key", dbname=db)
    return dict(line.split("|", 1) for line in rows.splitlines())


# --- pure string builders ----------------------------------------------------------


def test_literals_round_trip(pg):
    values = ['q"x', "back\\slash", "it's", "a,b", "{}", "plain.type-name"]
    got = pg.psql(f"SELECT v FROM unnest({text_array_literal(values)}) v ORDER BY v", dbname="postgres")
    assert got.splitlines() == sorted(values)
    got = pg.psql(f"SET standard_conforming_strings = off; SELECT {quote_literal(values[1])}")
    assert got.splitlines()[-1] == values[1]


# --- layout --------------------------------------------------------------------------


def test_first_migrate_then_noop(pg, make_db):
    db = make_db()
    with pytest.raises(SchemaMissing):
        verify(pg, db)
    actions = migrate(pg, db)
    assert actions[:len(STEPS) + 1] == [
        f"applied step {step.version}: {step.description}" for step in STEPS] + [
        f"installed artifact objects for digest {ARTIFACTS.digest} (tag {ARTIFACTS.tag})"]
    # the test run's claim secret (conftest) is installed too
    assert actions[len(STEPS) + 1:] in ([], ["installed the claim secret (its salted SHA-256: the secret "
                                                     "itself is not stored)"])
    m = meta(pg, db)
    assert m["layout_version"] == str(LAYOUT_VERSION)
    assert m["artifact_digest"] == ARTIFACTS.digest and m["artifact_tag"] == ARTIFACTS.tag
    assert m["updated_at"]
    functions = pg.psql("SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = 'openwop_seat'::regnamespace "
                        "ORDER BY 1::text", dbname=db).split()
    assert sorted(functions) == sorted(f"openwop_seat.{f}".replace(" ", "") for f in (*FUNCTIONS, DECLARED_V2,
                                                                                      *STEP_FUNCTIONS))
    verify(pg, db)

    assert migrate(pg, db) == ["nothing to do"]
    assert meta(pg, db)["updated_at"] == m["updated_at"]
    verify(pg, db)


def test_dropped_function_is_reinstalled(pg, make_db):
    db = make_db()
    migrate(pg, db)
    pg.psql("DROP FUNCTION openwop_seat.era_of(text)", dbname=db)
    assert migrate(pg, db) == [f"installed artifact objects for digest {ARTIFACTS.digest} (tag {ARTIFACTS.tag})"]
    assert pg.psql("SELECT openwop_seat.era_of('nope')", dbname=db).strip() == "2"


def test_concurrent_cli_migrates_apply_each_step_once(pg, make_db):
    db = make_db()
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
    procs = [subprocess.Popen([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=db)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
             for _ in range(3)]
    results = [p.communicate(timeout=60) + (p.returncode,) for p in procs]
    for out, err, rc in results:
        assert rc == 0, err
    lines = [line for out, _, _ in results for line in out.splitlines()]
    for step in STEPS:
        assert sum(line.startswith(f"applied step {step.version}:") for line in lines) == 1, lines
    assert sum(line.startswith("installed artifact objects") for line in lines) == 1, lines
    assert sum(line == "nothing to do" for line in lines) == 2, lines
    assert meta(pg, db)["layout_version"] == str(LAYOUT_VERSION)
    verify(pg, db)


def test_too_new_is_refused(pg, make_db):
    db = make_db()
    migrate(pg, db)
    pg.psql(f"UPDATE openwop_seat.meta SET value = '{LAYOUT_VERSION + 1}' WHERE key = 'layout_version'", dbname=db)
    with pytest.raises(SchemaTooNew, match=f"version {LAYOUT_VERSION + 1}, newer"):
        migrate(pg, db)
    with pytest.raises(SchemaTooNew):
        verify(pg, db)
    assert meta(pg, db)["layout_version"] == str(LAYOUT_VERSION + 1)  # untouched

    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=db)],
                         capture_output=True, text=True, cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"})
    assert out.returncode == 1
    assert out.stderr.startswith("openwop-seat migrate: the database's openwop_seat layout is version")


# The realistic gaps: a hand-edited or partially restored meta that lost its
# layout_version row (the schema and its tables are there, but nothing says
# which layout they are), a version below the first step, and a schema named
# openwop_seat that migrate did not make (no meta table at all).
@pytest.mark.parametrize("damage", [
    "DELETE FROM openwop_seat.meta WHERE key = 'layout_version'",
    "UPDATE openwop_seat.meta SET value = '0' WHERE key = 'layout_version'",
    "UPDATE openwop_seat.meta SET value = 'one' WHERE key = 'layout_version'",
    "DROP TABLE openwop_seat.meta",
])
def test_gap_is_refused(pg, make_db, damage):
    db = make_db()
    migrate(pg, db)
    pg.psql(damage, dbname=db)
    with pytest.raises(SchemaGap, match="no step path"):
        migrate(pg, db)
    with pytest.raises(SchemaGap):
        verify(pg, db)


def test_schema_made_by_hand_is_a_gap(pg, make_db):
    db = make_db()
    pg.psql("CREATE SCHEMA openwop_seat", dbname=db)
    with pytest.raises(SchemaGap, match="has no meta table"):
        migrate(pg, db)


def test_digest_mismatch(pg, make_db):
    db = make_db()
    migrate(pg, db)
    pg.psql("UPDATE openwop_seat.meta SET value = repeat('0', 64) WHERE key = 'artifact_digest'", dbname=db)
    mismatch = f"records spec-artifact digest {'0' * 64}.*runs digest {ARTIFACTS.digest}"
    with pytest.raises(DigestMismatch, match=mismatch):
        verify(pg, db)
    actions = migrate(pg, db)
    assert actions == [f"installed artifact objects for digest {ARTIFACTS.digest} (tag {ARTIFACTS.tag}), replacing "
                       f"digest {'0' * 64} (tag {ARTIFACTS.tag}): seats still running the old artifacts now refuse "
                       f"to serve"]
    verify(pg, db)
    pg.psql("DELETE FROM openwop_seat.meta WHERE key = 'artifact_digest'", dbname=db)
    with pytest.raises(DigestMismatch, match="no artifact digest"):
        verify(pg, db)


def test_cli_connection_error():
    from proxy.dev.devcluster import free_port

    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn",
                          f"host=127.0.0.1 port={free_port()} user=nobody dbname=x connect_timeout=5"],
                         capture_output=True, text=True, cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"})
    assert out.returncode == 1
    assert out.stderr.startswith("openwop-seat migrate: cannot connect to the database:"), out.stderr


# --- the era column store: migrate's checks ---------------------------------------------


@pytest.mark.parametrize("ddl, expected", [
    ("CREATE TABLE runs (run_id text PRIMARY KEY)",
     'run: ALTER TABLE "runs" ADD COLUMN "era" smallint CHECK ("era" = 3);'),
    ("CREATE TABLE runs (run_id text PRIMARY KEY, era smallint NOT NULL DEFAULT 3)",
     'run: ALTER TABLE "runs" ALTER COLUMN "era" DROP NOT NULL;'),
    ("CREATE TABLE runs (run_id text PRIMARY KEY, era text)",
     'run: ALTER TABLE "runs" ALTER COLUMN "era" TYPE smallint USING "era"::smallint;'),
    ("CREATE TABLE runs (run_id text, era smallint)",
     'run: ALTER TABLE "runs" ADD UNIQUE ("run_id");'),
    ("CREATE TABLE other (x int)", "does not exist"),
])
def test_era_column_must_fit(pg, make_db, ddl, expected):
    db = make_db()
    pg.psql(ddl, dbname=db)
    with pytest.raises(SchemaError) as info:
        migrate(pg, db, ERA_COLUMN_CONFIG)
    assert expected in str(info.value)
    assert not pg.psql("SELECT 1 FROM pg_namespace WHERE nspname = 'openwop_seat'", dbname=db)  # nothing changed


def test_era_column_with_qualified_case_sensitive_names(pg, make_db):
    db = make_db()
    host = HostConfig(runs_table="Host.Runs", run_id_column="Id", era_column="Era")
    pg.psql('CREATE SCHEMA "Host"; CREATE TABLE "Host"."Runs" ("Id" text PRIMARY KEY, "Era" integer); '
            """INSERT INTO "Host"."Runs" VALUES ('q1', NULL), ('q2', 3)""", user="host_user", dbname=db)
    migrate(pg, db, Config(host=host))
    verify(pg, db, Config(host=host))
    s = Store(pg, db, Config(host=host))
    table = s.events([("q1", 1, V1_TYPE), ("q2", 1, "foo.bar"), ("q3", 1, V1_TYPE)])
    assert s.read(table) == [(V1_TYPE, 2), ("foo.bar", 3), (V1_TYPE, 2)]
    assert s.fetch("SELECT openwop_seat.era_of('q2') AS a, openwop_seat.era_of('q3') AS b")[0] == (3, 2)
    pg.psql('UPDATE "Host"."Runs" SET "Era" = 3; ALTER TABLE "Host"."Runs" ALTER COLUMN "Era" SET NOT NULL',
            dbname=db)
    with pytest.raises(SchemaError, match='DROP NOT NULL'):
        verify(pg, db, Config(host=host))


def test_events_and_runs_tables_with_qualified_case_sensitive_names(pg, make_db):
    """host.events_table and host.runs_table in a schema and with names that need quotes: migrate finds them
    (PostgreSQL's quote_ident quotes only the part that needs it, app."Events", where the generators take every
    part quoted) and installs the translated relations over them; a major-2 view reads a renamed type translated,
    and the guard on the unqualified name is true only where the search path finds that table."""
    db = make_db()
    host = HostConfig(events_table="app.Events", runs_table="app.Runs")
    pg.psql('CREATE SCHEMA app; '
            'CREATE TABLE app."Runs" (run_id text PRIMARY KEY, tenant_id text NOT NULL); '
            'CREATE TABLE app."Events" (event_id text PRIMARY KEY, run_id text NOT NULL, sequence integer NOT NULL, '
            'type text NOT NULL, node_id text, payload jsonb, timestamp timestamptz NOT NULL, causation_id text, '
            'UNIQUE (run_id, sequence))', user="host_user", dbname=db)
    migrate(pg, db, Config(host=host))
    verify(pg, db, Config(host=host))
    renamed = sorted(ARTIFACTS.renamed)[0]
    pg.psql(f"""INSERT INTO app."Events" VALUES ('e1', 'q1', 1, {quote_literal(renamed)}, 'n', '{{}}', now())""",
            dbname=db)
    got = pg.psql("SELECT type FROM openwop_seat.events_m2 WHERE run_id = 'q1'", dbname=db).strip()
    assert got == ARTIFACTS.v1_to_v2[renamed]

    import psycopg

    with psycopg.connect(pg.dsn(dbname=db), autocommit=True) as conn:
        conn.execute('SET search_path = app')
        found = conn.execute("SELECT openwop_seat.events_named('Events')").fetchone()[0]
        conn.execute("RESET search_path")
        with pytest.raises(psycopg.Error) as error:
            conn.execute("SELECT openwop_seat.events_named('Events')")
        refused = str(error.value)
    assert found is True and 'finds no table, not the host\'s events table "app"."Events"' in refused, refused


# --- the read path on real rows -----------------------------------------------------------


class Store:
    """A migrated database with one era store, and the host role's view of it."""

    def __init__(self, pg, db: str, config: Config):
        self.pg, self.db, self.config = pg, db, config
        self.tables = itertools.count()

    def stamp(self, run_id: str) -> None:
        """Mark a run era 3, as the seat's triggers will."""
        if self.config.host.era_column is None:
            self.pg.psql(f"INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES ('{run_id}', 3, 'test')",
                         dbname=self.db)
        else:
            self.pg.psql(f"INSERT INTO runs (run_id, era) VALUES ('{run_id}', 3) "
                         f"ON CONFLICT (run_id) DO UPDATE SET era = 3", user="host_user", dbname=self.db)

    def events(self, rows: list[tuple[str, int, str | None]]) -> str:
        """A fresh host-shaped events table (owned by host_user) holding (run_id, sequence, type) rows."""
        name = f"events_{next(self.tables)}"
        values = ", ".join(
            f"('{name}-{run}-{seq}', '{run}', {seq}, {'NULL' if t is None else repr(t)}, 'n', '{{}}', now(), NULL)"
            for run, seq, t in rows)
        self.pg.psql(f"CREATE TABLE {name} {EVENTS_DDL}; INSERT INTO {name} VALUES {values}",
                     user="host_user", dbname=self.db)
        return name

    def query(self, table: str, major: int = 2, where: str = "") -> str:
        check = read_check_sql(major, era_sql(self.config.host, "e.run_id"), "e.type", "e.run_id", "e.sequence")
        return f"SELECT e.type, {check} AS era FROM {table} e {where} ORDER BY e.run_id, e.sequence"

    def fetch(self, sql: str, *args, user: str = "host_user"):
        async def go():
            conn = await asyncpg.connect(**self.connect_args(user))
            try:
                return await conn.fetch(sql, *args)
            finally:
                await conn.close()

        return run(go())

    def connect_args(self, user: str = "host_user") -> dict:
        return {"host": "127.0.0.1", "port": self.pg.port, "user": user, "database": self.db}

    def read(self, table: str, major: int = 2) -> list[tuple[str | None, int]]:
        return [(r["type"], r["era"]) for r in self.fetch(self.query(table, major))]

    def refusal(self, table: str, major: int = 2) -> asyncpg.PostgresError:
        with pytest.raises(asyncpg.PostgresError) as info:
            self.fetch(self.query(table, major))
        return info.value


@pytest.fixture(scope="module", params=["run_era", "era_column"])
def store(request, pg):
    name = f"ow_schema_{os.getpid()}_store_{request.param}"
    pg.psql(f"CREATE DATABASE {name} OWNER host_user")
    config = Config()
    if request.param == "era_column":
        config = ERA_COLUMN_CONFIG
        # No CHECK (era = 3) here, so that test_bad_era_value_in_era_column_is_malformed can store a 2.
        pg.psql("CREATE TABLE runs (run_id text PRIMARY KEY, era smallint)", user="host_user", dbname=name)
    migrate(pg, name, config)
    yield Store(pg, name, config)
    pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


def assert_envelope(err: asyncpg.PostgresError, code: str, t: str | None, run_id: str, seq: int) -> dict:
    assert err.sqlstate == ERRORS[code].sqlstate
    assert err.message.startswith(f"{code}: ")
    detail = json.loads(err.detail)
    assert detail["error"] == code
    assert detail["message"] == err.message[len(code) + 2:]
    assert detail["details"] == {"type": t, "runId": run_id, "sequence": seq}
    return detail


def test_eras_of_runs(store):
    table = store.events([("a1", 1, V1_TYPE), ("a2", 1, V1_TYPE), ("a2", 2, VENDOR_TYPE)])
    assert store.read(table) == [(V1_TYPE, 2), (V1_TYPE, 2), (VENDOR_TYPE, 2)]
    if store.config.host.era_column is not None:  # a runs row with a NULL era reads as 2, like no row at all
        store.pg.psql("INSERT INTO runs (run_id) VALUES ('a1')", user="host_user", dbname=store.db)
        assert store.read(table) == [(V1_TYPE, 2), (V1_TYPE, 2), (VENDOR_TYPE, 2)]
    store.stamp("a2")
    assert store.read(table) == [(V1_TYPE, 2), (V1_TYPE, 3), (VENDOR_TYPE, 3)]
    assert store.fetch("SELECT openwop_seat.era_of('a1') AS a, openwop_seat.era_of('a2') AS b")[0] == (2, 3)


def test_unmapped_type_in_era2_run_is_refused(store):
    table = store.events([("b1", 1, V1_TYPE), ("b1", 2, "foo.bar")])
    err = store.refusal(table)
    detail = assert_envelope(err, "event_type_unmapped", "foo.bar", "b1", 2)
    assert "'foo.bar'" in detail["message"] and "'b1'" in detail["message"]
    assert err.sqlstate == "OW001"


def test_unmapped_type_in_era3_run_passes_for_v2(store):
    table = store.events([("c1", 1, "foo.bar"), ("c1", 2, "run.started")])
    store.stamp("c1")
    assert store.read(table) == [("foo.bar", 3), ("run.started", 3)]


def test_vendor_and_reserved_prefixes(store):
    assert "example" in ARTIFACTS.vendor_orgs
    reserved = sorted(ARTIFACTS.reserved_orgs)[0]
    assert store.read(store.events([("d1", 1, VENDOR_TYPE)])) == [(VENDOR_TYPE, 2)]
    assert store.refusal(store.events([("d2", 1, f"{reserved}.thing")])).sqlstate == "OW001"
    assert store.refusal(store.events([("d3", 1, "example")])).sqlstate == "OW001"  # no dot: no prefix


def test_null_type_is_malformed(store):
    table = store.events([("f1", 7, None)])
    err = store.refusal(table)
    assert_envelope(err, "event_row_malformed", None, "f1", 7)
    assert err.sqlstate == "OW003"


def test_refusal_aborts_the_transaction(store):
    table = store.events([("g1", 1, "foo.bar")])
    store.pg.psql(f"CREATE TABLE {table}_log (x int); GRANT ALL ON {table}_log TO host_user", dbname=store.db)

    async def go():
        conn = await asyncpg.connect(**store.connect_args())
        try:
            await conn.execute("BEGIN")
            await conn.execute(f"INSERT INTO {table}_log VALUES (1)")
            with pytest.raises(asyncpg.PostgresError) as info:
                await conn.fetch(store.query(table))
            assert info.value.sqlstate == "OW001"
            with pytest.raises(asyncpg.InFailedSQLTransactionError):
                await conn.execute("SELECT 1")
            status = await conn.execute("COMMIT")
            assert status == "ROLLBACK"
            return await conn.fetchval(f"SELECT count(*) FROM {table}_log")
        finally:
            await conn.close()

    assert run(go()) == 0


def test_major1_reads(store):
    table = store.events([("h1", 1, "foo.bar"), ("h1", 2, None), ("h2", 1, "run.started"), ("h2", 2, "foo.bar")])
    store.stamp("h2")
    assert store.read(table, major=1) == [("foo.bar", 2), (None, 2), ("run.started", 3), ("foo.bar", 3)]
    table = store.events([("h3", 1, None)])
    store.stamp("h3")
    assert_envelope(store.refusal(table, major=1), "event_row_malformed", None, "h3", 1)


@pytest.mark.parametrize("major", [1, 2])
def test_read_functions_are_inlined(store, major):
    table = store.events([("i1", 1, V1_TYPE)])
    plan = "\n".join(r[0] for r in store.fetch(f"EXPLAIN (VERBOSE) {store.query(table, major)}"))
    assert "CASE WHEN" in plan
    assert "read_v" not in plan, plan
    assert "SubPlan" in plan  # the era lookup, once per row


def test_host_role_reads_but_cannot_write_the_era_store(store):
    assert store.fetch("SELECT count(*) AS n FROM openwop_seat.run_era")[0]["n"] >= 0
    assert store.fetch("SELECT value FROM openwop_seat.meta WHERE key = 'artifact_digest'")[0][0] == ARTIFACTS.digest
    for sql in ("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES ('evil', 3, 'host')",
                "DELETE FROM openwop_seat.run_era",
                "UPDATE openwop_seat.meta SET value = 'x'",
                "CREATE TABLE openwop_seat.mine (x int)"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            store.fetch(sql)


def test_refuse_statement(store):
    with pytest.raises(asyncpg.PostgresError) as info:
        store.fetch("SELECT openwop_seat.refuse_statement('copy-to', 'COPY events TO cannot be translated')")
    err = info.value
    assert err.sqlstate == ERRORS["statement_untranslatable"].sqlstate
    assert err.message == "statement_untranslatable: COPY events TO cannot be translated"
    assert json.loads(err.detail) == {"error": "statement_untranslatable",
                                      "message": "COPY events TO cannot be translated",
                                      "details": {"kind": "copy-to"}}


def test_era_other_than_3_is_impossible_or_refused(store):
    if store.config.host.era_column is None:
        # run_era holds rows only for era 3: an explicit 2 (or anything else) is refused by its CHECK.
        with pytest.raises(asyncpg.CheckViolationError):
            store.fetch("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES ('j1', 2, 'test')",
                        user="postgres")
        return
    # The host's column can hold anything its type allows: a value other than NULL or 3 is refused, not guessed.
    table = store.events([("j1", 4, V1_TYPE)])
    store.pg.psql("INSERT INTO runs (run_id, era) VALUES ('j1', 2)", user="host_user", dbname=store.db)
    err = store.refusal(table)
    assert err.sqlstate == "OW003"
    assert json.loads(err.detail)["details"] == {"type": None, "runId": "j1", "sequence": None}
    assert "neither 3 nor absent" in err.message


# --- the codemap is not a bijection ------------------------------------------------------


def test_non_bijection_refuses_v1_reads_of_era3(pg, make_db):
    db = make_db()
    broken = dataclasses.replace(ARTIFACTS, v2_to_v1=None, bijection_problem="v2 name 'x.y' has two v1 names")
    migrate(pg, db, artifacts=broken)
    s = Store(pg, db, Config())
    table = s.events([("m1", 1, "foo.bar"), ("m2", 1, "run.started")])
    assert s.read(table, major=1) == [("foo.bar", 2), ("run.started", 2)]
    s.stamp("m2")
    err = s.refusal(table, major=1)
    assert_envelope(err, "v1_representation_refused", "run.started", "m2", 1)
    assert err.sqlstate == "OW006"
    assert s.refusal(table, major=2).sqlstate == "OW001"
    plan = "\n".join(r[0] for r in s.fetch(f"EXPLAIN (VERBOSE) {s.query(table, 1)}"))
    assert "read_v1" not in plan


# --- the net (ADR 0009) -----------------------------------------------------------------------------


def test_migrate_installs_the_net_and_says_what_it_cannot_enforce(pg, make_db):
    """Row-level security forced on the events table with the seat's five policies; the notes name the login role
    that owns the table (the reference host's default deployment) and the roles that bypass row-level security."""
    from harness import HOST_SCHEMA

    db = make_db()
    pg.psql(HOST_SCHEMA, user="host_user", dbname=db)  # the host's login role owns its tables
    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=db)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "note: the events table public.events is owned by host_user, a role that can log in: the net holds " \
           "for its sessions too (FORCE ROW LEVEL SECURITY)" in out.stdout, out.stdout
    assert "give the table to a role the host does not log in as" in out.stdout
    assert "bypass row-level security, so the net does not hold for sessions logged in as them (only the seat's " \
           "rewrite does): postgres" in out.stdout, out.stdout
    assert pg.psql("SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = 'events'::regclass",
                   dbname=db).strip() == "t|t"
    assert pg.psql("SELECT string_agg(policyname || ':' || cmd, ',' ORDER BY policyname) FROM pg_policies "
                   "WHERE tablename = 'events'", dbname=db).strip() == (
        "openwop_seat_net:SELECT,openwop_seat_net_delete:DELETE,openwop_seat_net_insert:INSERT,"
        "openwop_seat_net_seat:SELECT,openwop_seat_net_update:UPDATE")
    assert migrate(pg, db) == ["nothing to do"]  # installed as recorded: nothing to redo
    verify(pg, db)
    # the owner adds a permissive policy: it would open the net (policies are OR-ed), so verify refuses it and
    # migrate installs again (its own policies; the foreign one is named in the refusal, not dropped)
    pg.psql("CREATE POLICY host_wide_open ON events FOR SELECT USING (true)", user="host_user", dbname=db)
    with pytest.raises(SchemaError, match="also there: host_wide_open: a permissive policy opens the net"):
        verify(pg, db)
    pg.psql("DROP POLICY host_wide_open ON events", user="host_user", dbname=db)
    verify(pg, db)
