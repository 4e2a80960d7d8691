"""Backups and restores of a mixed-era database (issue #18 item 5), as docs/operations.md "Backups" says.

* `pg_dump` through the seat with a raw rule for its application_name dumps the rows as stored, byte for
  byte what a dump around the seat gives; as a translated session it fails (closed: pg_dump will not read
  the translated relation, a view).
* A full restore (schema and data) into a new database keeps both rules: the seat's triggers are created
  after the data is loaded, the eras come back with `openwop_seat.run_era`, and `migrate` finds nothing to do.
* A data-only restore into a migrated database runs with `--disable-triggers` as a superuser (the rows are
  already what the writer rule let in), without the seat's own bookkeeping tables (meta, claims and the
  claim secret belong to the target); the triggers are enabled again at the end.
After each restore, a seat in front of the restored database reads era-2 runs translated and refuses a v1
append into an era-3 run.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import psycopg
import pytest

from harness import HOST_SCHEMA, ROOT
from proxy.artifacts.load import load_artifacts

HOST = "host_user"
A = load_artifacts()
V1 = sorted(A.renamed)[0]
V2 = A.v1_to_v2[V1]
SEAT_DATA = ("openwop_seat.meta", "openwop_seat.claims", "openwop_seat.claim_secret")


def query(pg, sql: str, *params, dbname: str = "postgres") -> list[tuple]:
    with psycopg.connect(pg.dsn(dbname=dbname), autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql, params or None).fetchall()]


def run(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=120, cwd=ROOT, **kw)


def migrate(pg, dbname: str) -> str:
    out = run(sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn(dbname=dbname))
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def source(pg, start_seat):
    """A migrated database with an era-2 run (written by a v1 host, directly) and an era-3 run (created through
    a seat by a v2 host), and the seat in front of it."""
    db = f"bk_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {db}")
    pg.psql(HOST_SCHEMA + "GRANT ALL ON runs, events TO PUBLIC;", dbname=db)
    migrate(pg, db)
    seat = start_seat(host={"dsn": pg.dsn(dbname=db)},
                      proxy={"clients": [{"application_name": "pg_dump", "major": "raw"}]})
    old, new = f"old-{db}", f"new-{db}"
    pg.psql(f"INSERT INTO runs (run_id, tenant_id) VALUES ('{old}', 't'); "
            f"INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
            f"VALUES ('{old}-1', '{old}', 1, '{V1}', '{{}}', now())", dbname=db)
    with psycopg.connect(seat.dsn(user=HOST, dbname=db), autocommit=True) as v2_host:
        v2_host.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", (new,))
        v2_host.execute("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
                        "VALUES (%s, %s, 1, %s, '{}', now())", (f"{new}-1", new, V2))
    assert query(pg, "SELECT run_id FROM openwop_seat.run_era", dbname=db) == [(new,)]
    return db, seat, old, new


def dump(port: int, db: str, *args: str, user: str = "postgres") -> subprocess.CompletedProcess:
    return run("pg_dump", "-h", "127.0.0.1", "-p", str(port), "-U", user, "-d", db, *args)


def without_restrict_keys(script: str) -> str:
    """A plain dump without its \\restrict and \\unrestrict lines (pg_dump draws a random key for each dump)."""
    return "\n".join(line for line in script.splitlines() if not line.startswith(("\\restrict", "\\unrestrict")))


def assert_rules_hold(pg, start_seat, db: str, old: str, new: str) -> None:
    """Through a seat on ``db``: the era-2 run reads translated, a v1 append to the era-3 run is refused."""
    seat = start_seat(host={"dsn": pg.dsn(dbname=db)}, proxy={"clients": [{"application_name": "v1", "major": 1}]})
    with psycopg.connect(seat.dsn(user=HOST, dbname=db), autocommit=True) as v2_host:
        assert v2_host.execute("SELECT type FROM events WHERE run_id = %s", (old,)).fetchone() == (V2,)
        assert v2_host.execute("SELECT type FROM events WHERE run_id = %s", (new,)).fetchone() == (V2,)
    with psycopg.connect(seat.dsn(user=HOST, dbname=db, application_name="v1"), autocommit=True) as v1_host:
        assert v1_host.execute("SELECT type FROM events WHERE run_id = %s", (new,)).fetchone() == (V1,)
        with pytest.raises(psycopg.Error) as e:
            v1_host.execute("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
                            "VALUES (%s, %s, 2, %s, '{}', now())", (f"{new}-2", new, V1))
        assert e.value.sqlstate == "OW005"
    seat.stop()


def test_pg_dump_through_the_seat_with_a_raw_rule_is_a_dump_of_the_rows_as_stored(pg, source):
    db, seat, old, new = source
    args = ("--data-only", "-t", "runs", "-t", "events", "-t", "openwop_seat.run_era")
    direct, through = dump(pg.port, db, *args), dump(seat.port, db, *args)
    assert direct.returncode == 0 and through.returncode == 0, through.stderr
    assert without_restrict_keys(through.stdout) == without_restrict_keys(direct.stdout)
    assert f"\t{V1}\t" in through.stdout and f"\t{V2}\t" in through.stdout  # each era's own spelling


def test_pg_dump_as_a_translated_session_is_refused(pg, source):
    db, seat, _, _ = source
    out = run("pg_dump", "-h", "127.0.0.1", "-p", str(seat.port), "-U", "postgres", "-d", db, "-t", "events",
              env={"PGAPPNAME": "backup-job", "PATH": "/usr/bin:/bin"})
    # its COPY is sent over the translated relation, a view, which pg_dump forbids itself to read
    # (restrict_nonsystem_relation_kind): it fails, and no row of either spelling is written
    assert out.returncode != 0 and 'non-system view "events_m2"' in out.stderr, out.stderr
    assert V1 not in out.stdout and V2 not in out.stdout


def test_a_full_restore_into_a_new_database_keeps_both_rules(pg, start_seat, source, tmp_path):
    db, seat, old, new = source
    archive = tmp_path / "full.dump"
    done = dump(seat.port, db, "-Fc", "-f", str(archive))
    assert done.returncode == 0, done.stderr
    target = f"{db}_full"
    pg.psql(f"CREATE DATABASE {target}")
    restored = run("pg_restore", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-d", target,
                   "--exit-on-error", str(archive))
    assert restored.returncode == 0, restored.stderr
    assert query(pg, "SELECT run_id FROM openwop_seat.run_era", dbname=target) == [(new,)]
    migrate(pg, target)  # accepts the restored schema as its own
    assert_rules_hold(pg, start_seat, target, old, new)


def test_a_data_only_restore_into_a_migrated_database_keeps_both_rules(pg, start_seat, source, tmp_path):
    db, seat, old, new = source
    archive = tmp_path / "data.dump"
    done = dump(seat.port, db, "-Fc", "--data-only", *(f"--exclude-table-data={t}" for t in SEAT_DATA),
                "-f", str(archive))
    assert done.returncode == 0, done.stderr
    target = f"{db}_data"
    pg.psql(f"CREATE DATABASE {target}")
    pg.psql(HOST_SCHEMA + "GRANT ALL ON runs, events TO PUBLIC;", dbname=target)
    migrate(pg, target)
    # without --disable-triggers the writer rule refuses the rows of one era or the other: no major writes both
    refused = run("pg_restore", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-d", target,
                  "--data-only", "--exit-on-error", "--single-transaction", str(archive))
    assert refused.returncode != 0 and "era2_write_refused" in refused.stderr, refused.stderr
    restored = run("pg_restore", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-d", target,
                   "--data-only", "--disable-triggers", "--exit-on-error", "--single-transaction", str(archive))
    assert restored.returncode == 0, restored.stderr
    assert query(pg, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'zz_openwop_seat_%%' AND tgenabled = 'D'",
                 dbname=target) == [(0,)]  # enabled again
    assert query(pg, "SELECT run_id FROM openwop_seat.run_era", dbname=target) == [(new,)]
    assert_rules_hold(pg, start_seat, target, old, new)
