"""The host's own era column as the era store ([host] era_column): reads translate the same way."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg
import pytest

from harness import HOST_SCHEMA, ROOT, render_config


@pytest.fixture(scope="module")
def column_db(pg, tmp_path_factory):
    name = f"ec_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {name}")
    pg.psql(HOST_SCHEMA + "ALTER TABLE runs ADD COLUMN event_log_schema_version smallint; "
            "GRANT ALL ON runs, events TO PUBLIC;", dbname=name)
    config = tmp_path_factory.mktemp("ec") / "migrate.toml"
    config.write_text(render_config({"host": {"era_column": "event_log_schema_version"}}))
    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--config", str(config), "--dsn",
                          pg.dsn(dbname=name)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    yield name
    pg.psql(f"DROP DATABASE {name} WITH (FORCE)", check=False)


def test_era_column_store(start_seat, pg, column_db):
    seat = start_seat(host={"dsn": pg.dsn(dbname=column_db), "era_column": "event_log_schema_version"})
    with psycopg.connect(pg.dsn(dbname=column_db), autocommit=True) as conn:
        # seeded as a loader would: rows first, then the era-3 stamp (a direct session is a v1 writer)
        conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES ('old', 't'), ('new', 't')")
        conn.execute("INSERT INTO events VALUES ('a', 'old', 0, 'agent.reasoning.delta', NULL, NULL, now(), NULL), "
                     "('b', 'new', 0, 'agent.reasoning-delta', NULL, NULL, now(), NULL), "
                     "('c', 'orphan', 0, 'run.resuming', NULL, NULL, now(), NULL)")
        conn.execute("SET session_replication_role = replica")  # the era column is guarded against UPDATE
        conn.execute("UPDATE runs SET event_log_schema_version = 3 WHERE run_id = 'new'")
    with psycopg.connect(seat.dsn(dbname=column_db)) as conn:
        rows = conn.execute("SELECT run_id, type FROM events ORDER BY run_id").fetchall()
    # era 2 (no stamp, and an orphan event with no runs row) translated; era 3 untouched
    assert rows == [("new", "agent.reasoning-delta"), ("old", "agent.reasoning-delta"),
                    ("orphan", "run.resume-started")]
    assert pg.psql("SELECT count(*) FROM openwop_seat.run_era", dbname=column_db).strip() == "0"
