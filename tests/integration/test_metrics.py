"""The metrics listener: Prometheus text at /metrics, /healthz, /readyz."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import psycopg

from proxy.dev.devcluster import free_port


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not exported"
    return float(m.group(1))


def test_metrics_count_sessions_and_bytes(start_seat):
    seat = start_seat()
    status, before = get(seat.metrics_port, "/metrics")
    assert status == 200 and "# TYPE openwop_seat_sessions_total counter" in before
    with psycopg.connect(seat.dsn()) as conn:
        conn.execute("SELECT repeat('x', 100000)").fetchone()
        _, during = get(seat.metrics_port, "/metrics")
        assert metric(during, "openwop_seat_client_connections_open") == 1
        assert metric(during, "openwop_seat_upstream_connections_open") == 1
    _, after = get(seat.metrics_port, "/metrics")
    assert metric(after, "openwop_seat_sessions_total") == metric(before, "openwop_seat_sessions_total") + 1
    assert metric(after, "openwop_seat_client_bytes_sent_total") > 100_000
    assert metric(after, "openwop_seat_client_connections_open") == 0
    assert re.search(r'^openwop_seat_build_info\{.*\bversion="', after, re.M)


def test_health_and_readiness(start_seat):
    seat = start_seat()
    assert get(seat.metrics_port, "/healthz") == (200, "ok\n")
    assert get(seat.metrics_port, "/readyz") == (200, "ready\n")
    assert get(seat.metrics_port, "/nope")[0] == 404
    dead = start_seat(upstream_port=free_port(), proxy={"connect_timeout": 2})
    status, body = get(dead.metrics_port, "/readyz")
    assert status == 503 and "unreachable" in body
    assert get(dead.metrics_port, "/healthz")[0] == 200


def test_session_errors_are_counted_by_sqlstate(start_seat):
    dead = start_seat(upstream_port=free_port(), proxy={"connect_timeout": 2})
    try:
        psycopg.connect(dead.dsn())
    except psycopg.OperationalError:
        pass
    _, text = get(dead.metrics_port, "/metrics")
    assert metric(text, 'openwop_seat_session_errors_total{sqlstate="08006"}') == 1
    assert metric(text, "openwop_seat_upstream_connect_errors_total") == 1


def test_read_path_metrics(start_seat, pg):
    seat = start_seat()
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("INSERT INTO events VALUES ('m-1', 'metrics-run', 0, 'agent.reasoning.delta', NULL, NULL, now(), "
                     "NULL) ON CONFLICT DO NOTHING")
    try:
        with psycopg.connect(seat.dsn(), autocommit=True) as conn:
            for _ in range(3):
                assert conn.execute("SELECT type FROM events WHERE run_id = 'metrics-run'").fetchone() == (
                    "agent.reasoning-delta",)
            try:
                conn.execute("WITH events AS (SELECT 1) SELECT * FROM events")
            except psycopg.Error:
                pass
            cur = conn.cursor()
            for _ in range(2):  # an unnamed Parse of a translated statement: prepared once on the server
                cur.execute("SELECT type FROM events WHERE run_id = %s", ("metrics-run",), prepare=False)
            _, text = get(seat.metrics_port, "/metrics")
        assert metric(text, 'openwop_seat_statements_total{class="event_read",protocol="simple"}') == 3
        assert metric(text, 'openwop_seat_statements_total{class="event_read",protocol="extended"}') == 2
        assert metric(text, "openwop_seat_prepared_statements") == 1  # the session is still open
        assert metric(text, 'openwop_seat_parse_cache_hits_total{major="2"}') >= 2
        assert metric(text, 'openwop_seat_parse_cache_misses_total{major="2"}') >= 2
        assert metric(text, 'openwop_seat_parse_cache_bytes{major="2"}') > 0
        assert 'openwop_seat_statements_refused_total{kind="CTE named like the events table"} 1.0' in text
        assert "openwop_seat_rows_translated" not in text  # rows are translated in the database, not counted
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("DELETE FROM events WHERE run_id = 'metrics-run'")
