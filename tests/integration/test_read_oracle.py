"""A differential oracle for the reader rule: generated SELECTs through the seat against a translated copy.

The host database `oracle` holds era-2 runs (v1 spelling) and era-3 runs (v2 spelling).  Two plain copies
hold what each reader should see, translated ahead of time in Python from the pinned codemap, with no seat
schema at all: `oracle_m2` (era-2 types mapped to v2) and `oracle_m1` (era-3 types mapped back to v1).
Payloads are NULL, so the projection leaves them as they are (it has its own tests and oracle).

Every generated statement (joins, USING, CTEs, subqueries, aggregates, DISTINCT, window functions, ORDER BY
type, predicates on type in the reader's vocabulary) must return through the seat exactly what it returns
directly on the copy of the reader's major, in text and in binary results.
"""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import HOST_SCHEMA, ROOT
from proxy.artifacts.load import load_artifacts

A = load_artifacts()
assert A.v2_to_v1 is not None
RENAMED = sorted(A.renamed)
KEPT = sorted(set(A.v1_types) - set(A.renamed))[:10]
VENDOR = ["example.thing-happened"]
PREFIX = "orc"


def _seed_rows():
    """(runs, era-3 run ids, events) of the stored log: 3 era-2 and 3 era-3 runs."""
    runs, era3, events = [], [], []
    for r in range(6):
        run = f"{PREFIX}-{r}"
        runs.append((run, f"tenant-{r % 2}"))
        third = r >= 3
        if third:
            era3.append(run)
        names = RENAMED + KEPT + VENDOR
        for i in range(12):
            v1 = names[(r * 7 + i * 5) % len(names)]
            stored = A.v1_to_v2.get(v1, v1) if third else v1
            events.append((f"{run}-{i}", run, i, stored, f"n{i % 3}", None))
    return runs, era3, events


def _reader_type(stored: str, era3: bool, major: int) -> str:
    if major == 2:
        return stored if era3 else A.v1_to_v2.get(stored, stored)
    return A.v2_to_v1.get(stored, stored) if era3 else stored


@pytest.fixture(scope="module")
def oracle(pg, start_seat):
    for db in ("oracle", "oracle_m2", "oracle_m1"):
        pg.psql(f"DROP DATABASE IF EXISTS {db}")
        pg.psql(f"CREATE DATABASE {db}")
        pg.psql(HOST_SCHEMA + "GRANT ALL ON runs, events TO PUBLIC;", dbname=db)
    migrate = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname="oracle")],
                             capture_output=True, text=True, cwd=ROOT)
    assert migrate.returncode == 0, migrate.stderr
    runs, era3, events = _seed_rows()
    for db, major in (("oracle", None), ("oracle_m2", 2), ("oracle_m1", 1)):
        with psycopg.connect(pg.dsn(dbname=db), autocommit=True) as conn:
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO runs (run_id, tenant_id) VALUES (%s, %s)", runs)
                rows = [(e, r, s, t if major is None else _reader_type(t, r in era3, major), n, p)
                        for e, r, s, t, n, p in events]
                cur.executemany("INSERT INTO events VALUES (%s, %s, %s, %s, %s, %s::jsonb, "
                                "'2026-01-01T00:00:00Z'::timestamptz + %s * interval '1 s', NULL)",
                                [row + (row[2],) for row in rows])
            if major is None:
                conn.execute("INSERT INTO openwop_seat.run_era (run_id, era, source) "
                             "SELECT unnest(%s::text[]), 3, 'test'", (era3,))
    seat = start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1}]},
                      host={"dsn": pg.dsn(dbname="oracle")})
    yield seat
    seat.stop()
    for db in ("oracle", "oracle_m2", "oracle_m1"):
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def names_of(major: int) -> list[str]:
    return sorted({_reader_type(t, r in _seed_rows()[1], major) for _, r, _, t, _, _ in _seed_rows()[2]})


FILTER = f"LIKE '{PREFIX}-%%'"

PROJECTIONS = [
    "e.*", "e.type", "e.type, e.sequence", "upper(e.type), e.payload", "e.type || '/' || e.run_id",
    "lag(e.type) OVER (PARTITION BY e.run_id ORDER BY e.sequence) AS prev",
    "row_number() OVER (ORDER BY e.type, e.run_id, e.sequence), e.type",
]
AGGREGATES = [
    "SELECT e.type, count(*) FROM {src} WHERE {where} GROUP BY e.type",
    "SELECT DISTINCT e.type FROM {src} WHERE {where}",
    "SELECT string_agg(e.type, ',' ORDER BY e.run_id, e.sequence) FROM {src} WHERE {where}",
    "SELECT e.run_id, array_agg(DISTINCT e.type ORDER BY e.type) FROM {src} WHERE {where} GROUP BY e.run_id",
    "SELECT count(DISTINCT e.type), max(e.type), min(e.type) FROM {src} WHERE {where}",
]
SOURCES = [
    "events e",
    "(SELECT * FROM events WHERE run_id {f}) e",
    "events e JOIN runs r USING (run_id)",
    "events e JOIN events e2 USING (run_id, sequence)",
    "events e JOIN events e2 USING (type, run_id)",
    "events e NATURAL JOIN (SELECT run_id, sequence, type FROM events) e2",
]


LOCKS = ["", " FOR UPDATE", " FOR NO KEY UPDATE OF e", " FOR SHARE SKIP LOCKED", " FOR KEY SHARE OF e NOWAIT"]


@st.composite
def statements(draw, major: int):
    names = names_of(major)
    src = draw(st.sampled_from(SOURCES)).format(f=FILTER)
    where = f"e.run_id {FILTER}"
    pred = draw(st.sampled_from(["", "type_eq", "type_in", "type_like", "type_sub"]))
    if pred == "type_eq":
        where += f" AND e.type = '{draw(st.sampled_from(names))}'"
    elif pred == "type_in":
        picked = draw(st.lists(st.sampled_from(names), min_size=1, max_size=4))
        where += " AND e.type IN (" + ", ".join(f"'{n}'" for n in picked) + ")"
    elif pred == "type_like":
        where += " AND e.type LIKE 'agent.%%'"
    elif pred == "type_sub":
        where += f" AND e.type IN (SELECT type FROM events WHERE run_id = '{PREFIX}-{draw(st.integers(0, 5))}')"
    if draw(st.booleans()):
        sql = draw(st.sampled_from(AGGREGATES)).format(src=src, where=where)
    else:
        cols = draw(st.sampled_from(PROJECTIONS))
        sql = f"SELECT {cols} FROM {src} WHERE {where} ORDER BY e.type, e.run_id, e.sequence"
        if "OVER" not in cols:  # a row lock (ADR 0017); PostgreSQL allows none with window functions
            sql += draw(st.sampled_from(LOCKS))
    if draw(st.booleans()):
        sql = f"WITH q AS ({sql}) SELECT * FROM q"
    return sql


def rows(dsn: str, sql: str, binary: bool, **kw) -> list:
    with psycopg.connect(dsn, autocommit=True, **kw) as conn:
        cur = conn.cursor(binary=binary)
        cur.execute(sql)
        out = [tuple(str(v) for v in row) for row in cur.fetchall()]
    return out if "ORDER BY e.type" in sql else sorted(out)


@pytest.mark.parametrize("major", [2, 1])
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_generated_reads_through_the_seat_equal_the_translated_copy(oracle, pg, major, binary):
    app = {"application_name": "v1-host"} if major == 1 else {}

    @settings(max_examples=40, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(sql=statements(major))
    def check(sql):
        sql = sql.replace("%%", "%")
        got = rows(oracle.dsn(dbname="oracle"), sql, binary, **app)
        want = rows(pg.dsn(dbname=f"oracle_m{major}"), sql, binary)
        assert got == want, sql

    check()


@pytest.mark.parametrize("major", [2, 1])
def test_copy_of_the_whole_events_table_equals_the_translated_copy(oracle, pg, major):
    app = {"application_name": "v1-host"} if major == 1 else {}

    def copied(dsn: str, **kw) -> list[str]:
        with psycopg.connect(dsn, autocommit=True, **kw) as conn:
            with conn.cursor().copy("COPY events TO STDOUT") as copy:
                return sorted("".join(bytes(b).decode() for b in copy).splitlines())

    got = copied(oracle.dsn(dbname="oracle"), **app)
    assert got and got == copied(pg.dsn(dbname=f"oracle_m{major}"))


# Shapes of issue 23, each compared with the translated copy, read as host_user (a role the net of ADR 0009
# holds: a superuser reads past row-level security) and as the superuser.
ISSUE_23_SHAPES = [
    # schema-qualified column references (SQLAlchemy 2 Core with schema='public')
    f"SELECT public.events.run_id, public.events.sequence, public.events.type FROM public.events "
    f"WHERE public.events.run_id LIKE '{PREFIX}-%' ORDER BY 1, 2",
    f"SELECT public.events.type, count(*) FROM public.events WHERE public.events.run_id LIKE '{PREFIX}-%' "
    f"GROUP BY 1 ORDER BY 1",
    f"SELECT max(public.events.sequence) FROM public.events WHERE public.events.run_id LIKE '{PREFIX}-%'",
    # field-selection notation for a function of the whole row
    f"SELECT e.to_jsonb FROM events e WHERE e.run_id LIKE '{PREFIX}-%' ORDER BY e.run_id, e.sequence",
    f"SELECT events.row_to_json::text FROM events WHERE run_id LIKE '{PREFIX}-%' ORDER BY run_id, sequence",
    # the whole row of a join alias over events
    f"SELECT to_jsonb(j) - 'created_at' FROM (events JOIN runs USING (run_id)) AS j "
    f"WHERE j.run_id LIKE '{PREFIX}-%' ORDER BY j.run_id, j.sequence",
    f"SELECT (j).type FROM (events JOIN runs USING (run_id)) AS j WHERE j.run_id LIKE '{PREFIX}-%' "
    f"ORDER BY j.run_id, j.sequence",
    # row locks on translated reads (ADR 0017)
    f"SELECT * FROM events WHERE run_id LIKE '{PREFIX}-%' ORDER BY run_id, sequence FOR UPDATE",
    f"SELECT e.type, r.tenant_id FROM events e JOIN runs r USING (run_id) WHERE e.run_id LIKE '{PREFIX}-%' "
    f"ORDER BY e.run_id, e.sequence FOR SHARE OF e SKIP LOCKED",
    f"SELECT s.type, s.sequence FROM (SELECT * FROM events WHERE run_id LIKE '{PREFIX}-%') s "
    f"ORDER BY s.run_id, s.sequence LIMIT 20 FOR NO KEY UPDATE NOWAIT",
    f"SELECT run_id, sequence FROM events WHERE run_id LIKE '{PREFIX}-%' ORDER BY 1, 2 FOR KEY SHARE",
    # a CTE named like the table
    f"WITH events AS (SELECT * FROM events WHERE run_id LIKE '{PREFIX}-%') SELECT type, count(*) FROM events "
    f"GROUP BY type ORDER BY 1",
]


@pytest.mark.parametrize("major", [2, 1])
@pytest.mark.parametrize("user", ["host_user", "postgres"])
@pytest.mark.parametrize("sql", ISSUE_23_SHAPES)
def test_issue_23_shapes_through_the_seat_equal_the_translated_copy(oracle, pg, major, user, sql):
    app = {"application_name": "v1-host"} if major == 1 else {}
    got = rows(oracle.dsn(user=user, dbname="oracle"), sql, False, **app)
    want = rows(pg.dsn(dbname=f"oracle_m{major}"), sql, False)
    assert got and got == want, sql
