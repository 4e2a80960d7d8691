"""The metrics listener: Prometheus text at /metrics, /healthz, /readyz."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import psycopg

from harness import PASSWORD
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
                conn.execute("SELECT * FROM events TABLESAMPLE SYSTEM (1)")
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
        assert 'openwop_seat_statements_refused_total{kind="TABLESAMPLE on the events table"} 1.0' in text
        assert "openwop_seat_rows_translated" not in text  # rows are translated in the database, not counted
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            conn.execute("DELETE FROM events WHERE run_id = 'metrics-run'")


def documented_metrics() -> set[str]:
    """The metric names of the table in docs/operations.md, "Metrics and health"."""
    from harness import ROOT

    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Metrics and health", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `openwop_seat_")]
    return {name for row in rows for name in re.findall(r"`(openwop_seat_[a-z0-9_]+)", row.split(" | ")[0])}


def test_every_exported_metric_is_in_the_docs_table(start_seat):
    """What a seat exports (a supervisor over two workers: the workers' families and its own) is documented, and
    the table names nothing that is not exported."""
    from prometheus_client.parser import text_string_to_metric_families

    seat = start_seat(proxy={"workers": 2})
    with psycopg.connect(seat.dsn()) as conn:
        conn.execute("SELECT 1").fetchone()
    status, text = get(seat.metrics_port, "/metrics")
    assert status == 200
    exported = set()
    for family in text_string_to_metric_families(text):
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        exported.add(family.name + suffix)
    documented = documented_metrics()
    assert len(documented) >= 30
    assert not exported - documented, f"exported but not in docs/operations.md: {sorted(exported - documented)}"
    assert not documented - exported, f"documented but not exported: {sorted(documented - exported)}"


def test_transactions_and_sessions_by_database_and_user(start_seat, pg):
    """Transaction blocks ended count per (database, user); pairs past metrics.database_user_labels count as
    "(other)"; the open-sessions gauge follows the sessions."""
    from prometheus_client.parser import text_string_to_metric_families

    def samples() -> dict:
        _, text = get(seat.metrics_port, "/metrics")
        return {(s.name, s.labels.get("database"), s.labels.get("user")): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    seat = start_seat(metrics={"database_user_labels": 2})
    with psycopg.connect(seat.dsn(), autocommit=True) as conn:
        conn.execute("SELECT 1")  # no transaction block: not counted
        with conn.transaction():
            conn.execute("SELECT 1")
        conn.execute("BEGIN")
        try:
            conn.execute("SELECT 1/0")
        except psycopg.errors.DivisionByZero:
            pass
        conn.execute("ROLLBACK")  # a failed block ends too
        now = samples()
        assert now["openwop_seat_transactions_total", "postgres", "postgres"] == 2  # counted while open
        assert now["openwop_seat_database_sessions_open", "postgres", "postgres"] == 1
    with psycopg.connect(seat.dsn(dbname="app", user="host_user")) as conn:  # psycopg: a block per transaction
        conn.execute("SELECT 1")
        conn.commit()
    with psycopg.connect(seat.dsn(dbname="app", user="md5_user", password=PASSWORD)) as conn:  # a third pair
        conn.execute("SELECT 1")
        conn.commit()
        conn.execute("SELECT 2")
        conn.rollback()
    after = samples()
    assert after["openwop_seat_transactions_total", "postgres", "postgres"] == 2
    assert after["openwop_seat_database_sessions_total", "postgres", "postgres"] == 1
    assert after["openwop_seat_database_sessions_open", "postgres", "postgres"] == 0
    assert after["openwop_seat_transactions_total", "app", "host_user"] == 1
    assert after["openwop_seat_transactions_total", "(other)", "(other)"] == 2
    assert after["openwop_seat_database_sessions_total", "(other)", "(other)"] == 1
    assert not any(user == "md5_user" for _, _, user in after)
