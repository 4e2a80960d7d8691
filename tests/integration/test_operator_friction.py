"""Issue 25's friction, the parts that need a cluster: `serve` refusing a major 2 without a claim secret, a start
error said once with workers > 1, `migrate` and the cutover tools naming every missing GRANT before they start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from harness import HOST_SCHEMA, ROOT, render_config, wait_listening
from proxy.dev.devcluster import free_port

SECRET_ENV = "OPENWOP_SEAT_CLAIM_SECRET"


@pytest.fixture
def host_db(pg):
    name = f"f_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {name}")
    pg.psql(HOST_SCHEMA, dbname=name)
    yield name
    pg.psql(f"DROP DATABASE {name} WITH (FORCE)", check=False)


def _env(secret: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    if secret:
        env[SECRET_ENV] = os.environ[SECRET_ENV]
    return env


def _config(tmp_path, pg, dbname: str, **proxy) -> str:
    path = tmp_path / f"seat-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(render_config({
        "proxy": {"listen": f"127.0.0.1:{free_port()}", "upstream": f"127.0.0.1:{pg.port}", "workers": 1,
                  **proxy},
        "host": {"dsn": pg.dsn(dbname=dbname)},
    }))
    return str(path)


def _serve(config: str, secret: bool, timeout: float = 40) -> subprocess.CompletedProcess:
    # A seat that does start would run forever: the timeout turns that into a failure.
    return subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", config], cwd=ROOT, env=_env(secret),
                          capture_output=True, text=True, timeout=timeout)


def _migrate(pg, dbname: str, user: str = "postgres", secret: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=dbname, user=user)],
                          cwd=ROOT, env=_env(secret), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("proxy,why", [
    ({}, "proxy.default_major = 2"),
    ({"default_major": 1, "clients": [{"user": "v2host", "major": 2}]}, "proxy.clients[0] (major = 2)"),
    ({"workers": 2}, "proxy.default_major = 2"),
])
def test_serve_refuses_major_2_without_a_claim_secret(pg, host_db, tmp_path, proxy, why):
    assert _migrate(pg, host_db).returncode == 0
    out = _serve(_config(tmp_path, pg, host_db, **proxy), secret=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("openwop-seat: configuration error: claim secret: none configured") == 1, out.stderr
    assert f"but {why} gives sessions major 2" in out.stderr


def test_serve_without_a_secret_starts_when_no_session_gets_major_2(pg, host_db, tmp_path):
    assert _migrate(pg, host_db).returncode == 0
    config = _config(tmp_path, pg, host_db, default_major=1, clients=[{"user": "ops", "major": "raw"}])
    port = int(open(config).read().split('listen = "127.0.0.1:')[1].split('"')[0])
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", config], cwd=ROOT,
                            env=_env(False), stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, proc)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)


def test_serve_with_workers_says_its_start_error_once(pg, host_db, tmp_path):
    out = _serve(_config(tmp_path, pg, host_db, workers=2), secret=True)  # not migrated
    assert out.returncode == 1
    assert out.stderr.count("openwop-seat serve:") == 1, out.stderr
    assert "migrate" in out.stderr


# --- every GRANT named up front: migrate, backfill, audit ---------------------------------------------------------


@pytest.fixture
def roles(pg):
    made: list[str] = []

    def make(*attrs: str) -> str:
        name = f"fr_{uuid.uuid4().hex[:8]}"
        pg.psql(f"CREATE ROLE {name} {' '.join(attrs)}")
        made.append(name)
        return name

    yield make
    for name in reversed(made):
        pg.psql(f"DROP OWNED BY {name} CASCADE; DROP ROLE IF EXISTS {name}", check=False)


def _grants(stderr: str) -> list[str]:
    return [line.split("--")[0].strip() for line in stderr.splitlines() if line.strip().startswith("GRANT ")]


def test_migrate_names_every_grant_and_they_suffice_first_boot_layout(pg, roles, tmp_path):
    """At first boot the host creates its tables as the role it logs in as; the seat's owner then needs that
    role's rights (the net) and pg_read_all_stats: nothing else, and exactly those GRANTs make migrate pass."""
    host, owner = roles("LOGIN"), roles("LOGIN")
    db = f"f_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    try:
        pg.psql(f"GRANT CREATE ON DATABASE {db} TO {owner}; GRANT ALL ON SCHEMA public TO {host}", dbname=db)
        pg.psql(HOST_SCHEMA, dbname=db, user=host)
        out = _migrate(pg, db, user=owner)
        assert out.returncode == 1, out
        assert _grants(out.stderr) == [f"GRANT pg_read_all_stats TO {owner};", f"GRANT {host} TO {owner};"]
        for grant in _grants(out.stderr):
            pg.psql(grant, dbname=db)
        out = _migrate(pg, db, user=owner)
        assert out.returncode == 0, out.stderr
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)


def test_migrate_names_trigger_and_the_era_column_grants_on_a_runs_table_of_another_owner(pg, roles, tmp_path):
    tables, other, owner = roles("NOLOGIN"), roles("NOLOGIN"), roles("LOGIN")
    db = f"f_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    try:
        pg.psql(HOST_SCHEMA + "ALTER TABLE runs ADD COLUMN era smallint;"
                f"ALTER TABLE events OWNER TO {tables}; ALTER TABLE runs OWNER TO {other};"
                f"GRANT CREATE ON DATABASE {db} TO {owner}; GRANT pg_read_all_stats TO {owner};", dbname=db)
        config = tmp_path / "seat.toml"
        config.write_text('[host]\nera_column = "era"\n')
        cmd = [sys.executable, "-m", "proxy", "migrate", "--config", str(config), "--dsn",
               pg.dsn(dbname=db, user=owner)]
        out = subprocess.run(cmd, cwd=ROOT, env=_env(True), capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, out
        assert _grants(out.stderr) == [f"GRANT {tables} TO {owner};", f"GRANT TRIGGER ON public.runs TO {owner};",
                                       f"GRANT SELECT, UPDATE ON public.runs TO {owner};"], out.stderr
        for grant in _grants(out.stderr):
            pg.psql(grant, dbname=db)
        out = subprocess.run(cmd, cwd=ROOT, env=_env(True), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)


def _seed_runs(pg, db: str, n: int) -> None:
    pg.psql("INSERT INTO runs (run_id, tenant_id) SELECT 'r' || i, 't' FROM generate_series(1, %d) i;"
            "INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
            "SELECT 'e' || i, 'r' || i, 0, 'run.started', '{}', now() FROM generate_series(1, %d) i" % (n, n),
            dbname=db)


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", *args, "--no-progress"], cwd=ROOT, env=_env(True),
                          capture_output=True, text=True, timeout=120)


def test_backfill_dry_run_and_audit_refuse_up_front_naming_every_grant(pg, host_db, roles):
    assert _migrate(pg, host_db).returncode == 0
    _seed_runs(pg, host_db, 30)
    reader = roles("LOGIN")
    pg.psql(f"GRANT SELECT ON events TO {reader}", dbname=host_db)
    out = _tool("backfill", "--dsn", pg.dsn(dbname=host_db, user=reader), "--all", "--dry-run")
    assert out.returncode == 3, out
    assert "skipped run" not in out.stdout and out.stderr.count("openwop-seat backfill:") == 1, out
    assert _grants(out.stderr) == [f"GRANT SELECT ON public.runs TO {reader};"]
    pg.psql(f"REVOKE SELECT ON events FROM {reader}", dbname=host_db)
    out = _tool("audit", "--dsn", pg.dsn(dbname=host_db, user=reader))
    assert out.returncode == 3, out
    assert _grants(out.stderr) == [f"GRANT SELECT ON public.events TO {reader};",
                                   f"GRANT SELECT ON public.runs TO {reader};"]
    for grant in _grants(out.stderr):
        pg.psql(grant, dbname=host_db)
    out = _tool("backfill", "--dsn", pg.dsn(dbname=host_db, user=reader), "--all", "--dry-run")
    assert out.returncode == 1 and "schema_invalid: 30 runs" in out.stdout, out  # every run read (run.started {})


def test_backfill_as_the_owner_names_the_update_grant(pg, roles):
    owner = roles("LOGIN")
    db = f"f_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    try:
        pg.psql(HOST_SCHEMA + f"GRANT CREATE ON DATABASE {db} TO {owner}; GRANT pg_read_all_stats TO {owner};"
                f"GRANT TRIGGER, SELECT, DELETE ON runs, events TO {owner};", dbname=db)
        # the net needs the events table's owner's rights: give the seat's owner the table itself
        pg.psql(f"ALTER TABLE events OWNER TO {owner}; REVOKE UPDATE ON events FROM {owner}", dbname=db)
        assert _migrate(pg, db, user=owner).returncode == 0
        _seed_runs(pg, db, 3)
        out = _tool("backfill", "--dsn", pg.dsn(dbname=db, user=owner), "--all")
        assert out.returncode == 3, out
        assert _grants(out.stderr) == [f"GRANT UPDATE ON public.events TO {owner};"], out.stderr
        assert pg.psql("SELECT count(*) FROM openwop_seat.run_era", dbname=db).strip() == "0"
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)


# --- first boot: SHOW STATE tells the truth; the sessions ended when the rules come into force read as a restart --


def test_first_boot_state_is_truthful_and_its_sessions_end_as_a_restart(pg, start_seat, tmp_path):
    import time

    from rawpg import RawConn, error_fields
    from test_psql import psql

    db = f"fb_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    try:
        from proxy.serve.admin import scram_secret

        admin_port = free_port()
        (tmp_path / "users.txt").write_text(f'"ops" "{scram_secret("admin-pw")}"\n')
        seat = start_seat(host={"dsn": pg.dsn(dbname=db)}, extra={"admin": {
            "listen": f"127.0.0.1:{admin_port}", "users": ["ops"], "auth_file": str(tmp_path / "users.txt")}})
        admin = f"host=127.0.0.1 port={admin_port} user=ops dbname=admin"

        def state() -> dict[str, str]:
            out = psql(admin, "-c", "SHOW STATE", password="admin-pw").stdout
            return dict(line.split("|", 1) for line in out.splitlines())

        writer = state()["writer_rule"]
        assert writer.startswith("not in force: first boot: the writer rule's triggers are not installed"), writer
        raw = RawConn(seat.port)
        raw.login(database=db)  # a host session that begins at first boot (unclaimed)
        pg.psql(HOST_SCHEMA, dbname=db)
        time.sleep(2.5)  # the seat sees the events table, and no trigger on it yet
        assert state()["writer_rule"].startswith("not in force: first boot"), state()
        assert _migrate(pg, db).returncode == 0
        deadline = time.monotonic() + 15
        while state()["writer_rule"].startswith("not in force") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state()["writer_rule"].startswith("in force"), state()
        ending = [body for t, body in raw.read_all_until_closed(timeout=10) if t == b"E"]
        assert len(ending) == 1, ending
        fields = error_fields(ending[0])
        assert fields["S"] == "FATAL" and fields["C"] == "57P01", fields
        assert fields["M"].startswith("terminating connection due to administrator command: openwop-seat's rules "
                                      "came into force"), fields
        raw.close()
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)


def test_pg_dump_of_a_whole_database_as_a_translated_session_stops_at_ow004(pg, host_db, start_seat):
    """docs/operations.md#backups-and-restores: a whole-database pg_dump through a translated session is refused at
    its first LOCK TABLE of a seat relation (the -t events case, the view, is test_backups.py's)."""
    assert _migrate(pg, host_db).returncode == 0
    seat = start_seat(host={"dsn": pg.dsn(dbname=host_db)})
    out = subprocess.run(["pg_dump", "-h", "127.0.0.1", "-p", str(seat.port), "-U", "postgres", "-d", host_db],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    assert "statement_untranslatable: openwop_seat.events_v1_original is the seat's own relation" in out.stderr, \
        out.stderr
    assert "LOCK TABLE openwop_seat.events_v1_original" in out.stderr


# --- an ordinary refusal leaves no ERROR in PostgreSQL's log -------------------------------------------------------


def test_an_ordinary_refusal_leaves_no_error_in_postgresqls_log(pg, host_db, start_seat):
    import psycopg

    assert _migrate(pg, host_db).returncode == 0
    seat = start_seat(host={"dsn": pg.dsn(dbname=host_db)})
    refused = "DO $$ BEGIN PERFORM 1 FROM events; END $$"
    marker = f"friction_{uuid.uuid4().hex[:8]}"
    start = os.path.getsize(pg.logfile)
    dsn = f"host=127.0.0.1 port={seat.port} user=postgres dbname={host_db} application_name={marker}"
    from rawpg import RawConn, error_fields, query

    raw = RawConn(seat.port)  # a simple Query
    raw.login(database=host_db, application_name=marker)
    raw.send(query(refused))
    answers = raw.read_until(b"Z")
    assert [t for t, _ in answers] == [b"E", b"Z"] and error_fields(answers[0][1])["C"] == "OW004", answers
    assert answers[-1][1] == b"I"
    raw.send(query("SELECT 1"))
    assert [t for t, _ in raw.read_until(b"Z")] == [b"T", b"D", b"C", b"Z"]  # the session goes on
    raw.close()
    with psycopg.connect(dsn, autocommit=True) as conn:  # an unnamed Parse (psycopg's extended protocol)
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT count(*) FROM events e WHERE EXISTS "
                         "(SELECT FROM events TABLESAMPLE SYSTEM (1)) AND %s", (True,), prepare=False)
        assert e.value.sqlstate == "OW004", e.value
        assert conn.execute("SELECT %s::int", (1,)).fetchone() == (1,)  # the session goes on
        # Inside a transaction block the server's transaction must fail as after any error: the poison is sent.
        conn.execute("BEGIN")
        with pytest.raises(psycopg.Error) as e:
            conn.execute(refused)
        assert e.value.sqlstate == "OW004"
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.execute("ROLLBACK")
    with open(pg.logfile, errors="replace") as f:
        f.seek(start)
        log = f.read()
    # (the client's own statement in the failed block gets PostgreSQL's 25P02, logged as PostgreSQL logs it)
    errors = [line for line in log.splitlines() if "ERROR:" in line and "current transaction is aborted" not in line]
    assert len([line for line in errors if "refused by openwop-seat: the client got its error" in line]) == 1, errors
    assert not [line for line in errors if "refused by openwop-seat" not in line], errors  # the block's poison only


def test_a_reload_that_would_leave_major_2_without_a_secret_is_rejected(pg, host_db, tmp_path):
    import time

    assert _migrate(pg, host_db).returncode == 0
    secret = tmp_path / "claim-secret"
    secret.write_text(os.environ[SECRET_ENV])
    port = free_port()
    base = {"proxy": {"listen": f"127.0.0.1:{port}", "upstream": f"127.0.0.1:{pg.port}", "workers": 1},
            "host": {"dsn": pg.dsn(dbname=host_db)}}
    config = tmp_path / "seat.toml"
    config.write_text(render_config({**base, "host": {**base["host"], "claim_secret_file": str(secret)}}))
    log = tmp_path / "seat.log"
    with open(log, "wb") as err:
        seat = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config)], cwd=ROOT,
                                env=_env(False), stderr=err)
    try:
        wait_listening(port, seat)
        config.write_text(render_config(base))  # no secret any more, default major 2
        seat.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 15
        while "reload rejected" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "reload rejected: claim secret: none configured" in log.read_text(), log.read_text()
        assert seat.poll() is None
    finally:
        seat.send_signal(signal.SIGINT)
        seat.wait(timeout=20)


def test_pinned_runs_names_its_grants_before_reading(pg, host_db, roles, tmp_path):
    assert _migrate(pg, host_db).returncode == 0
    reader = roles("LOGIN")
    implemented = tmp_path / "implemented"
    implemented.write_text("# none\n")
    cmd = [sys.executable, "-m", "proxy", "pinned-runs", "--dsn", pg.dsn(dbname=host_db, user=reader)]
    out = subprocess.run(cmd, cwd=ROOT, env=_env(True), capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and _grants(out.stderr) == [f"GRANT SELECT ON public.events TO {reader};"], out
    out = subprocess.run(cmd + ["--implemented", str(implemented), "--cancel"], cwd=ROOT, env=_env(True),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out
    assert _grants(out.stderr) == [f"GRANT SELECT, INSERT ON public.events TO {reader};"], out.stderr
    pg.psql(f"GRANT SELECT ON events TO {reader}", dbname=host_db)
    out = subprocess.run(cmd, cwd=ROOT, env=_env(True), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out


def test_a_locally_answered_refusal_with_asyncpgs_unnamed_statements(pg, host_db, start_seat):
    """asyncpg without a statement cache prepares unnamed statements (Parse, Describe, then Flush or Sync): the
    refusal answered without a server error reaches it, and the session goes on."""
    import asyncio

    import asyncpg

    assert _migrate(pg, host_db).returncode == 0
    seat = start_seat(host={"dsn": pg.dsn(dbname=host_db)})

    async def go():
        conn = await asyncpg.connect(host="127.0.0.1", port=seat.port, user="postgres", database=host_db,
                                     statement_cache_size=0)
        try:
            for _ in range(3):
                with pytest.raises(asyncpg.PostgresError) as e:
                    await asyncio.wait_for(conn.fetch(
                        "SELECT * FROM runs, (SELECT type FROM public.events TABLESAMPLE SYSTEM (1)) y "
                        "WHERE $1::int = 1", 1), 10)
                assert e.value.sqlstate == "OW004"
                assert await asyncio.wait_for(conn.fetchval("SELECT $1::int", 7), 10) == 7
        finally:
            await conn.close()

    asyncio.run(go())
