"""Every metric family after real traffic, parsed as Prometheus parses it; /readyz's schema check; refusal logs."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_metrics import get

from harness import HOST_SCHEMA, ROOT
from proxy.artifacts.load import load_artifacts
from proxy.db.layout import LAYOUT_VERSION
from proxy.dev.devcluster import free_port

A = load_artifacts()
RENAMED = sorted(A.renamed)
BIND_SECRET = "zq-bind-secret-4711"  # a parameter value that must never reach the log


def scrape(port: int) -> tuple[set[str], dict[tuple, float]]:
    """The family names and every sample, keyed by (sample name, sorted labels)."""
    status, text = get(port, "/metrics")
    assert status == 200
    families, samples = set(), {}
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for s in family.samples:
            samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return families, samples


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Delta:
    def __init__(self, port: int):
        self.port = port
        _, self.before = scrape(port)
        self.families: set[str] = set()
        self.after: dict = {}

    def take(self) -> "Delta":
        self.families, self.after = scrape(self.port)
        return self

    def __call__(self, name: str, **labels) -> float:
        return value(self.after, name, **labels) - value(self.before, name, **labels)


@pytest.fixture(scope="module")
def mseat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1},
                                         {"application_name": "ops", "major": "raw"}]})


@pytest.fixture
def runs(pg):
    """An era-2 run of renamed v1 types, an era-3 run of their v2 names, an era-2 run with an unmapped type."""
    tag = uuid.uuid4().hex[:8]
    era2, era3, bad = f"mf2-{tag}", f"mf3-{tag}", f"mfx-{tag}"
    rows = [(f"{era2}-{i}", era2, i, t) for i, t in enumerate(RENAMED)]
    rows += [(f"{era3}-{i}", era3, i, A.v1_to_v2[t]) for i, t in enumerate(RENAMED)]
    rows += [(f"{bad}-0", bad, 0, "foo.bar")]
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO events VALUES (%s, %s, %s, %s, NULL, NULL, now(), NULL)", rows)
        conn.execute("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES (%s, 3, 'test')", (era3,))
    yield era2, era3, bad
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("DELETE FROM events WHERE run_id LIKE %s", (f"mf_-{tag}%",))
        conn.execute("DELETE FROM openwop_seat.run_era WHERE run_id = %s", (era3,))
        conn.execute("DELETE FROM runs WHERE run_id LIKE %s", (f"mf_-{tag}%",))


def test_every_family_moves_with_real_traffic(mseat, runs):
    era2, era3, bad = runs
    n = len(RENAMED)
    d = Delta(mseat.metrics_port)
    with psycopg.connect(mseat.dsn(application_name="metrics-full"), autocommit=True) as conn:
        # simple protocol (no parameters): passthrough, a translated read, an event write, a refusal
        assert conn.execute("SELECT 1").fetchone() == (1,)
        rows = conn.execute(f"SELECT type FROM events WHERE run_id = '{era2}' ORDER BY sequence").fetchall()
        assert [r[0] for r in rows] == [A.v1_to_v2[t] for t in RENAMED]
        conn.execute(f"INSERT INTO events VALUES ('{era2}-w1', '{era2}-w', 0, 'run.started', NULL, NULL, now(), "
                     "NULL)")
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT * FROM events TABLESAMPLE SYSTEM (1)")
        assert e.value.sqlstate == "OW004"
        # extended protocol (parameters): the same kinds of statements
        assert conn.execute("SELECT %s::int", (2,)).fetchone() == (2,)
        rows = conn.execute("SELECT type FROM events WHERE run_id = %s ORDER BY sequence", (era2,)).fetchall()
        assert len(rows) == n
        conn.execute("INSERT INTO events VALUES (%s, %s, 1, 'run.started', NULL, NULL, now(), NULL)",
                     (f"{era2}-w2", f"{era2}-w"))
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT * FROM events TABLESAMPLE SYSTEM (1) WHERE type = %s", (BIND_SECRET,))
        assert e.value.sqlstate == "OW004"
        # errors raised inside PostgreSQL: an unmapped type (OW001) and a division by zero (22012)
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT type FROM events WHERE run_id = %s", (bad,)).fetchall()
        assert e.value.sqlstate == "OW001"
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT 1 / 0")
        assert e.value.sqlstate == "22012"
        d.take()
        assert d("openwop_seat_client_connections_open") == 1
        assert d("openwop_seat_upstream_connections_open") == 1
    # major 1 reads the era-3 run back in v1 names; a raw session counts as passthrough
    with psycopg.connect(mseat.dsn(application_name="v1-host"), autocommit=True) as conn:
        rows = conn.execute("SELECT type FROM events WHERE run_id = %s ORDER BY sequence", (era3,)).fetchall()
        assert [r[0] for r in rows] == RENAMED
    with psycopg.connect(mseat.dsn(application_name="ops"), autocommit=True) as conn:
        conn.execute("SELECT 1")
        conn.execute("SELECT %s::text", ("x",))
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT 1 / 0")
    d.take()

    expected = {
        "openwop_seat_build_info", "openwop_seat_client_connections_open", "openwop_seat_upstream_connections_open",
        "openwop_seat_client_connections_accepted", "openwop_seat_upstream_connections_opened",
        "openwop_seat_client_connections_refused", "openwop_seat_upstream_connections_refused",
        "openwop_seat_sessions", "openwop_seat_statements", "openwop_seat_prepared_statements",
        "openwop_seat_refusals", "openwop_seat_statements_refused", "openwop_seat_session_errors",
        "openwop_seat_parse_cache_hits", "openwop_seat_parse_cache_misses", "openwop_seat_parse_cache_size",
        "openwop_seat_parse_cache_bytes", "openwop_seat_parse_cache_capacity_bytes", "openwop_seat_parse_seconds",
        "openwop_seat_upstream_errors",
        "openwop_seat_client_bytes_received", "openwop_seat_client_bytes_sent",
        "openwop_seat_processing_seconds", "openwop_seat_statement_seconds", "openwop_seat_buffer_limit_bytes",
    }
    assert expected <= d.families, expected - d.families

    st = "openwop_seat_statements_total"
    # simple: SELECT 1 (+ the raw session's SELECT 1, SELECT 1/0 and the division by zero above)
    assert d(st, **{"class": "passthrough", "protocol": "simple"}) == 4
    assert d(st, **{"class": "event_read", "protocol": "simple"}) == 1
    assert d(st, **{"class": "event_write", "protocol": "simple"}) == 1
    assert d(st, **{"class": "refused", "protocol": "simple"}) == 1
    # extended: SELECT %s::int and the raw session's one (counted per Sync there)
    assert d(st, **{"class": "passthrough", "protocol": "extended"}) == 2
    assert d(st, **{"class": "event_read", "protocol": "extended"}) == 3  # era-2 read, OW001 read, major-1 read
    assert d(st, **{"class": "event_write", "protocol": "extended"}) == 1
    assert d(st, **{"class": "refused", "protocol": "extended"}) == 1

    rf = "openwop_seat_refusals_total"
    assert d(rf, code="statement_untranslatable", sqlstate="OW004") == 2
    assert d(rf, code="event_type_unmapped", sqlstate="OW001") == 1
    assert d(rf, code="result_untranslatable", sqlstate="OW007") == 0
    assert d("openwop_seat_statements_refused_total", kind="TABLESAMPLE on the events table") == 2

    ue = "openwop_seat_upstream_errors_total"
    assert d(ue, **{"class": "22"}) == 2
    assert d(ue, **{"class": "OW"}) == 1
    assert d(ue, **{"class": "42"}) == 0  # the poison statements' own errors never count

    assert d("openwop_seat_parse_cache_misses_total", major="2") >= 5
    assert d("openwop_seat_parse_seconds_count") == (d("openwop_seat_parse_cache_misses_total", major="2")
                                                      + d("openwop_seat_parse_cache_misses_total", major="1"))
    assert d("openwop_seat_parse_seconds_sum") > 0
    assert value(d.after, "openwop_seat_parse_cache_capacity_bytes", major="2") == 32 << 20
    assert value(d.after, "openwop_seat_parse_cache_size", major="2") >= 5

    assert d("openwop_seat_sessions_total") == 3
    assert d("openwop_seat_upstream_connections_opened_total") == 3
    assert d("openwop_seat_client_bytes_received_total") > 500
    assert d("openwop_seat_client_bytes_sent_total") > 500

    # every statement above ended with a ReadyForQuery: at least one observation each, sessions' own included
    assert d("openwop_seat_statement_seconds_count") >= 14
    assert d("openwop_seat_statement_seconds_sum") > 0
    for side in ("client", "upstream"):
        count = d("openwop_seat_processing_seconds_count", **{"from": side})
        assert count >= 1  # sampled: one received chunk in 8 of each session (issue 27)
        assert d("openwop_seat_processing_seconds_bucket", **{"from": side, "le": "+Inf"}) == count
        # buckets fine enough for the seat's own tens of microseconds
        assert ("openwop_seat_processing_seconds_bucket", tuple(sorted({"from": side, "le": "2.5e-05"}.items()))) \
            in d.after

    build = [k for k in d.after if k[0] == "openwop_seat_build_info"]
    assert len(build) == 1
    labels = dict(build[0][1])
    assert labels["artifact_digest"] == A.digest and labels["artifact_tag"] == A.tag
    assert labels["layout_version"] == str(LAYOUT_VERSION) and labels["version"]
    assert value(d.after, "openwop_seat_buffer_limit_bytes") == 1 << 20


def test_refusal_log_lines(mseat, runs):
    _, _, bad = runs
    with psycopg.connect(mseat.dsn(application_name="log-probe"), autocommit=True) as conn:
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT * FROM events TABLESAMPLE SYSTEM (1) WHERE type = %s", (BIND_SECRET,))
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT type FROM events WHERE run_id = %s AND event_id <> %s", (bad, BIND_SECRET)).fetchall()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "application_name=log-probe" not in _ends(mseat.log()):
        time.sleep(0.05)
    log = mseat.log()
    lines = [line for line in log.splitlines() if " refusal " in line and "application_name=log-probe" in line]
    assert len(lines) == 2, log[-3000:]
    for line, code, sqlstate in zip(lines, ("statement_untranslatable", "event_type_unmapped"), ("OW004", "OW001")):
        for field in ("session=", "client=127.0.0.1:", "user=postgres", "database=postgres", "major=2",
                      f"code={code}", f"sqlstate={sqlstate}"):
            assert field in line, (field, line)
    assert 'kind="TABLESAMPLE on the events table"' in lines[0]
    assert BIND_SECRET not in log


def _ends(log: str) -> str:
    return "\n".join(line for line in log.splitlines() if "session end" in line)


def test_connections_refused_by_reason(start_seat):
    dead = start_seat(upstream_port=free_port(), proxy={"connect_timeout": 2})
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dead.dsn())
    _, samples = scrape(dead.metrics_port)
    assert value(samples, "openwop_seat_upstream_connections_refused_total", reason="connect") == 1
    assert value(samples, "openwop_seat_client_connections_refused_total", reason="upstream_unavailable") == 1
    assert value(samples, "openwop_seat_upstream_connections_opened_total") == 0


@pytest.fixture
def own_host_db(pg):
    """A host database of its own, migrated, so breaking its schema disturbs no other test."""
    name = f"mh_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {name}")
    pg.psql(HOST_SCHEMA, dbname=name)
    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=name)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    yield name
    pg.psql(f"DROP DATABASE {name} WITH (FORCE)", check=False)


def test_readyz_checks_the_host_schema_and_digest(start_seat, pg, own_host_db):
    seat = start_seat(host={"dsn": pg.dsn(dbname=own_host_db)})
    try:
        assert get(seat.metrics_port, "/readyz") == (200, "ready\n")
        pg.psql("UPDATE openwop_seat.meta SET value = repeat('0', 64) WHERE key = 'artifact_digest'",
                dbname=own_host_db)
        deadline = time.monotonic() + 15  # the result is cached for a few seconds
        status, body = get(seat.metrics_port, "/readyz")
        while status == 200 and time.monotonic() < deadline:
            time.sleep(0.25)
            status, body = get(seat.metrics_port, "/readyz")
        assert status == 503 and "digest" in body, body
        assert get(seat.metrics_port, "/healthz") == (200, "ok\n")
    finally:
        seat.stop()
