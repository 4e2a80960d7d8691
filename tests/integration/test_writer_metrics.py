"""The writer rule's counters on /metrics: stamps at creation and translated appends (database-wide)."""

from __future__ import annotations

import uuid

import psycopg
from test_metrics import get, metric

from proxy.artifacts.load import load_artifacts

A = load_artifacts()


def counter(pg, name: str) -> int:
    value, called = pg.psql(f"SELECT last_value, is_called FROM openwop_seat.{name}").strip().split("|")
    return int(value) if called == "t" else 0


def test_stamps_and_translated_appends_are_counted(start_seat, pg):
    seat = start_seat()
    stamped, translated = counter(pg, "runs_stamped_created"), counter(pg, "appends_translated")
    old, new = f"old-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    renamed = sorted(A.renamed)[:3]
    with psycopg.connect(pg.dsn(), autocommit=True) as direct:  # an era-2 run, as a v1 host left it
        direct.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", (old,))
    with psycopg.connect(seat.dsn(), autocommit=True) as v2:
        v2.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", (new,))  # stamped era 3
        for i, t in enumerate(renamed):  # v2 names into the era-2 run: stored in v1 spelling
            v2.execute("INSERT INTO events VALUES (%s, %s, %s, %s, NULL, NULL, now(), NULL)",
                       (f"{old}-{i}", old, i, A.v1_to_v2[t]))
        v2.execute("INSERT INTO events VALUES (%s, %s, 9, 'run.started', NULL, NULL, now(), NULL)",
                   (f"{old}-9", old))  # an identity name: stored as is, not counted
    _, text = get(seat.metrics_port, "/metrics")
    assert metric(text, "openwop_seat_runs_stamped_created_total") == stamped + 1
    assert metric(text, "openwop_seat_appends_translated_total") == translated + len(renamed)
    assert counter(pg, "appends_translated") == translated + len(renamed)


def test_privileged_roles_are_warned_about_and_counted(start_seat, pg):
    role = f"owner_member_{uuid.uuid4().hex[:6]}"
    pg.psql(f"CREATE ROLE {role} LOGIN; GRANT postgres TO {role}")  # a member of openwop_seat's owner
    try:
        seat = start_seat()
        for user in ("host_user", "postgres", role):
            with psycopg.connect(seat.dsn(user=user)) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        _, text = get(seat.metrics_port, "/metrics")
        assert metric(text, 'openwop_seat_privileged_sessions_total{role="superuser"}') == 1
        assert metric(text, 'openwop_seat_privileged_sessions_total{role="owns openwop_seat"}') == 1
        log = seat.log()
        assert log.count("privileged role") == 2 and "user=host_user" not in log.split("privileged role")[1]
    finally:
        pg.psql(f"DROP ROLE {role}")
