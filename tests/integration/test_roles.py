"""deploy/roles.sql, the recommended role layout as one script: applied to a real cluster, then migrate, serve,
audit and backfill run as its roles, each with exactly the rights the script gives (docs/host-database.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import psycopg
import pytest

from harness import HOST_SCHEMA, ROOT, render_config, wait_listening
from proxy.dev.devcluster import free_port

SCRIPT = ROOT / "deploy" / "roles.sql"
ROLES = ("openwop_readonly", "openwop", "openwop_seat_owner", "openwop_tables")


@pytest.fixture
def layout_db(pg):
    db = f"rl_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    yield db
    pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)
    for role in ROLES:
        for other in ("postgres",):
            pg.psql(f"DROP OWNED BY {role} CASCADE", dbname=other, check=False)
        pg.psql(f"DROP ROLE IF EXISTS {role}", check=False)


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "proxy", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=180)
    if check:
        assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-2000:])
    return out


def test_the_role_script_is_what_the_docs_show():
    doc = (ROOT / "docs" / "host-database.md").read_text()
    assert "```sql\n" + SCRIPT.read_text() + "```" in doc


def test_migrate_serve_audit_and_backfill_run_as_the_scripts_roles(pg, layout_db, tmp_path):
    db = layout_db
    out = subprocess.run([os.path.join(pg.bin, "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-q", "-d",
                          pg.dsn(dbname=db), "-f", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    # The host's own migrations, as the tables' owner (the host's first start does this, SET ROLE or not).
    pg.psql("SET ROLE openwop_tables;" + HOST_SCHEMA, dbname=db)

    done = _cli("migrate", "--dsn", pg.dsn(dbname=db, user="openwop_seat_owner"))
    assert "GRANT" not in done.stdout + done.stderr

    # An era-2 run, written around the seat (unclaimed: a v1 writer).
    pg.psql("INSERT INTO runs (run_id, tenant_id) VALUES ('old-run', 't');"
            "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) VALUES "
            "('o1', 'old-run', 1, 'agent.reasoning.delta', 'n1', '{\"delta\": \"a\"}', now())", dbname=db)

    port = free_port()
    config = tmp_path / "seat.toml"
    config.write_text(render_config({
        "proxy": {"listen": f"127.0.0.1:{port}", "upstream": f"127.0.0.1:{pg.port}", "workers": 1},
        "host": {"dsn": pg.dsn(dbname=db, user="openwop")},
    }))
    seat = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, seat)
        with psycopg.connect(f"host=127.0.0.1 port={port} user=openwop dbname={db}", autocommit=True) as host:
            assert host.execute("SELECT openwop_seat.session_major()").fetchone() == (2,)
            host.execute("INSERT INTO runs (run_id, tenant_id) VALUES ('new-run', 't')")
            assert host.execute("SELECT openwop_seat.era_of('new-run')").fetchone() == (3,)
            (read,) = host.execute("SELECT type FROM events WHERE run_id = 'old-run'").fetchone()
            assert read == "agent.reasoning-delta"
            # A row lock on a translated read (ADR 0017): the lockable view, owned by openwop_seat_owner (not a
            # superuser), locks the stored row for the host, which holds UPDATE on the table
            with host.transaction():
                locked = host.execute("SELECT type FROM events WHERE run_id = 'old-run' FOR UPDATE NOWAIT").fetchall()
                assert locked == [("agent.reasoning-delta",)]
                with psycopg.connect(pg.dsn(dbname=db, user="openwop"), autocommit=True) as other:
                    with pytest.raises(psycopg.errors.LockNotAvailable):
                        other.execute("SELECT 1 FROM events WHERE run_id = 'old-run' FOR KEY SHARE NOWAIT")
            # ADR 0019: the host's append with RETURNING writes through events_insert_m2, owned by openwop_seat_owner
            # (not a superuser: the table's row-level security is its owner's); an upsert meeting the row works;
            # dynamic SQL returning the new row meets the net
            append = ("WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = %s) "
                      "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                      "SELECT %s, %s, next.seq, 'agent.reasoning-delta', 'n1', '{\"delta\": \"b\"}', now() FROM next "
                      "ON CONFLICT (event_id) DO UPDATE SET node_id = 'n2' RETURNING sequence, type, node_id, xmax = 0")
            pg.psql("INSERT INTO runs (run_id, tenant_id) VALUES ('old-run-2', 't')", dbname=db)  # era 2
            assert host.execute(append, ("old-run-2", "o2", "old-run-2")).fetchall() == \
                [(1, "agent.reasoning-delta", "n1", True)]
            assert host.execute(append, ("old-run-2", "o2", "old-run-2")).fetchall() == \
                [(1, "agent.reasoning-delta", "n2", False)]
            assert pg.psql("SELECT type FROM events WHERE event_id = 'o2'", dbname=db).strip() == \
                "agent.reasoning.delta"  # stored in its v1 spelling: the run is era 2
            with pytest.raises(psycopg.Error) as info:
                host.execute("DO $$ DECLARE t text; BEGIN EXECUTE 'INSERT INTO ev' || 'ents (event_id, run_id, "
                             "sequence, type, timestamp) VALUES (''o3'', ''old-run-2'', 3, ''agent.reasoning-delta'', "
                             "now()) RETURNING type' INTO t; RAISE EXCEPTION '%', t; END $$")
            assert info.value.sqlstate == "OW008" and "agent.reasoning.delta" not in str(info.value)
        # a role that may read but not update the table may not lock its rows, as on the table itself
        with psycopg.connect(f"host=127.0.0.1 port={port} user=openwop_readonly dbname={db}") as ro:
            assert ro.execute("SELECT type FROM events WHERE run_id = 'old-run'").fetchall() == [locked[0]]
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                ro.execute("SELECT type FROM events WHERE run_id = 'old-run' FOR SHARE")
    finally:
        seat.send_signal(signal.SIGINT)
        seat.wait(timeout=20)

    audit = _cli("audit", "--dsn", pg.dsn(dbname=db, user="openwop_readonly"), "--no-progress", check=False)
    assert audit.returncode in (0, 1) and "GRANT" not in audit.stderr, audit
    dry = _cli("backfill", "--dsn", pg.dsn(dbname=db, user="openwop_readonly"), "--all", "--dry-run",
               "--no-progress", check=False)
    assert dry.returncode in (0, 1) and "GRANT" not in dry.stderr, dry
    _cli("backfill", "--dsn", pg.dsn(dbname=db, user="openwop_seat_owner"), "--all", "--no-progress",
         "--allow-schema-invalid")  # the payload stands in: what is tested is the rights
    assert pg.psql("SELECT openwop_seat.era_of('old-run')", dbname=db).strip() == "3"


def test_the_compose_init_scripts_make_a_database_migrate_accepts(pg, layout_db):
    """deploy/docker-compose.yml runs deploy/roles.sql and its own init script (passwords, stand-in tables) when
    the database is first initialised: as the image does, both as the superuser; then migrate as the owner."""
    import yaml

    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    assert compose["configs"]["db-roles"]["file"] == "./roles.sql"
    targets = [c["target"] for c in compose["services"]["db"]["configs"]]
    assert targets == sorted(targets)  # the image runs them in name order: the roles first
    db = layout_db
    psql = [os.path.join(pg.bin, "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-q", "-d", pg.dsn(dbname=db)]
    out = subprocess.run([*psql, "-f", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    out = subprocess.run(psql, input=compose["configs"]["db-init"]["content"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    done = _cli("migrate", "--dsn", pg.dsn(dbname=db, user="openwop_seat_owner"))
    assert "installed artifact objects" in done.stdout
    pg.psql("INSERT INTO runs (run_id, tenant_id) VALUES ('r', 't')", user="openwop", dbname=db)
