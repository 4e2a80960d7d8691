"""`serve` refuses to start unless the host database holds the seat's schema for these very artifacts, except at
first boot: while the events table does not exist there is nothing to translate (test_first_boot.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

import pytest

from harness import HOST_SCHEMA, ROOT, render_config, wait_listening
from proxy.dev.devcluster import free_port


@pytest.fixture
def host_db(pg):
    name = f"h_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {name}")
    pg.psql(HOST_SCHEMA, dbname=name)
    yield name
    pg.psql(f"DROP DATABASE {name} WITH (FORCE)", check=False)


def serve(pg, dbname: str, tmp_path) -> subprocess.CompletedProcess:
    config = tmp_path / "seat.toml"
    config.write_text(render_config({
        "proxy": {"listen": f"127.0.0.1:{free_port()}", "upstream": f"127.0.0.1:{pg.port}"},
        "host": {"dsn": pg.dsn(dbname=dbname)},
    }))
    # A seat that does start would run forever: the timeout turns that into a failure.
    return subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)


def migrate(pg, dbname: str) -> None:
    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=dbname)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_refuses_without_schema(pg, host_db, tmp_path):
    out = serve(pg, host_db, tmp_path)
    assert out.returncode == 1 and "openwop-seat serve:" in out.stderr
    assert "migrate" in out.stderr  # says what to do


def test_refuses_a_different_artifact_digest(pg, host_db, tmp_path):
    migrate(pg, host_db)
    pg.psql("UPDATE openwop_seat.meta SET value = repeat('0', 64) WHERE key = 'artifact_digest'", dbname=host_db)
    out = serve(pg, host_db, tmp_path)
    assert out.returncode == 1 and "digest" in out.stderr.lower()


def test_refuses_a_newer_layout(pg, host_db, tmp_path):
    migrate(pg, host_db)
    pg.psql("UPDATE openwop_seat.meta SET value = '99' WHERE key = 'layout_version'", dbname=host_db)
    out = serve(pg, host_db, tmp_path)
    assert out.returncode == 1 and "99" in out.stderr


def test_starts_at_first_boot_without_the_events_table(pg, host_db, tmp_path):
    """No events table: nothing to translate yet, so the seat starts (first boot, docs/operations.md#first-boot)
    instead of refusing, whatever the seat's schema holds."""
    migrate(pg, host_db)
    pg.psql("DROP TABLE events CASCADE", dbname=host_db)  # the seat's translated relations depend on it
    config = tmp_path / "seat.toml"
    port = free_port()
    config.write_text(render_config({
        "proxy": {"listen": f"127.0.0.1:{port}", "upstream": f"127.0.0.1:{pg.port}", "workers": 1},
        "host": {"dsn": pg.dsn(dbname=host_db)},
    }))
    log = tmp_path / "seat.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_listening(port, proc)
        assert "first boot" in log.read_text() and "'events' does not exist yet" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_refuses_when_the_translated_relations_no_longer_match_the_table(pg, host_db, tmp_path):
    migrate(pg, host_db)
    pg.psql("ALTER TABLE events ADD COLUMN extra int", dbname=host_db)
    out = serve(pg, host_db, tmp_path)
    assert out.returncode == 1 and "no longer matches the columns" in out.stderr and "migrate" in out.stderr
    migrate(pg, host_db)  # regenerates them over the table as it is now
    for view in ("events_m2", "events_m1"):
        pg.psql(f"SELECT extra FROM openwop_seat.{view} LIMIT 0", dbname=host_db)


def test_refuses_an_unreachable_host_database(pg, tmp_path):
    out = serve(pg, "no_such_database", tmp_path)
    assert out.returncode == 1 and "host.dsn" in out.stderr


def test_refuses_a_claim_secret_other_than_the_installed_one(pg, host_db, tmp_path, monkeypatch):
    migrate(pg, host_db)  # installs the test run's secret
    monkeypatch.setenv("OPENWOP_SEAT_CLAIM_SECRET", "a-different-secret-0123456789")
    out = serve(pg, host_db, tmp_path)
    assert out.returncode == 1 and "claim secret" in out.stderr
    assert "a-different-secret" not in out.stderr
