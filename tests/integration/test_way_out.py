"""Issue 24: the way in and the way out (docs/lifecycle.md): ``status``, ``uninstall`` and ``retire`` on a real
PostgreSQL, through the real command line and a real seat.

Each test seeds a database of its own (the commands drop the seat's schema), with era-2 runs as a v1 host left
them, some open; takes the dumps a round trip is compared with before ``migrate``; then drives traffic through a
seat from major-1 and major-2 clients.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest
from psycopg.adapt import Loader

from harness import HOST_SCHEMA, render_config
from proxy.artifacts.load import load_artifacts
from proxy.tools.common import EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
A = load_artifacts()
_dbs = itertools.count()

# An era-2 run's log as a v1 host stored it: (type, node_id, payload or None); the last event is terminal.
LOG = [
    ("run.started", None, {"workflowId": "wf"}),
    ("agent.reasoning.delta", "n-1", {"agentId": "a", "delta": "x", "sequence": 1}),
    ("node.started", "n-1", {"nodeId": "n-1", "typeId": "t", "extra": True}),
    ("node.completed", "n-1", None),
    ("run.completed", None, {"outputs": {}, "output": {"answer": 42}}),
]
RENAMED = sorted(A.renamed)[0]  # a v1 name the codemap renames


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, cwd=ROOT,
                          env=_env(), timeout=timeout)


class Raw(Loader):
    def load(self, data):
        return bytes(data)


def raw_read(dsn: str, run: str) -> list[tuple]:
    """Every column of the run's events as the bytes the server (or the seat) sent, in text format."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("text", "int4", "jsonb", "timestamptz"):
            conn.adapters.register_loader(name, Raw)
        return conn.execute("SELECT * FROM events WHERE run_id = %s ORDER BY sequence", (run,)).fetchall()


class Host:
    """A database of its own with the reference host's tables, seeded with era-2 runs."""

    def __init__(self, pg, tmp: Path, era_column: str | None = None):
        self.pg = pg
        self.db = f"wayout_{os.getpid()}_{next(_dbs)}"
        self.era_column = era_column
        pg.psql(f"CREATE DATABASE {self.db}")
        self.sql(HOST_SCHEMA + "GRANT ALL ON runs, events TO PUBLIC;"
                 + (f"ALTER TABLE runs ADD COLUMN {era_column} smallint;" if era_column else ""))
        self.config = tmp / "seat.toml"
        self.config.write_text(render_config({"host": {"dsn": pg.dsn(dbname=self.db),
                                                       **({"era_column": era_column} if era_column else {})}}))
        self.closed = [f"closed-{i}" for i in range(3)]
        self.open = ["open-0"]
        for run in self.closed:
            self.make_run(run, LOG)
        for run in self.open:
            self.make_run(run, LOG[:-1])

    def dsn(self, user: str | None = None) -> str:
        return self.pg.dsn(user=user, dbname=self.db)

    def sql(self, text: str) -> str:
        return self.pg.psql(text, dbname=self.db)

    def rows(self, sql: str, *params) -> list[tuple]:
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            return conn.execute(sql, params or None).fetchall()

    def make_run(self, run: str, log) -> None:
        with psycopg.connect(self.dsn(), autocommit=True) as conn, conn.transaction():
            conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (run,))
            for seq, (t, node, payload) in enumerate(log):
                conn.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                             "VALUES (%s, %s, %s, %s, %s, %s::jsonb, '2026-09-03T08:00:00Z')",
                             (f"{run}-{seq}", run, seq, t, node, None if payload is None else json.dumps(payload)))

    def schema_dump(self) -> str:
        """pg_dump --schema-only of the host's tables: columns, triggers, policies, row-level security, grants."""
        out = subprocess.run([os.path.join(self.pg.bin, "pg_dump"), "--schema-only", "-t", "runs", "-t", "events",
                              "-d", self.dsn()], capture_output=True, text=True, check=True)
        return "\n".join(line for line in out.stdout.splitlines() if not line.startswith("\\restrict")
                         and not line.startswith("\\unrestrict"))

    def database_schema_dump(self) -> str:
        """pg_dump --schema-only of the whole database: every schema, object, grant and default privilege."""
        out = subprocess.run([os.path.join(self.pg.bin, "pg_dump"), "--schema-only", "-d", self.dsn()],
                             capture_output=True, text=True, check=True)
        return "\n".join(line for line in out.stdout.splitlines() if not line.startswith("\\restrict")
                         and not line.startswith("\\unrestrict"))

    def whole_dump(self) -> str:
        """Every schema and row of the database (for "nothing changed"), but the heartbeats a seat writes."""
        out = subprocess.run([os.path.join(self.pg.bin, "pg_dump"), "--exclude-table-data=openwop_seat.seats",
                              "--exclude-table-data=openwop_seat.sessions_seen", "-d", self.dsn()],
                             capture_output=True, text=True, check=True)
        lines = [line for line in out.stdout.splitlines() if not line.startswith("\\restrict")
                 and not line.startswith("\\unrestrict")]
        return "\n".join(sorted(lines))  # COPY rows in physical order: a rewrite moves a tuple

    def data(self, table: str) -> list[str]:
        return [r[0] for r in self.rows(f"SELECT t::text FROM {table} t ORDER BY 1")]

    def migrate(self) -> None:
        r = cli("migrate", "--config", str(self.config), "--dsn", self.dsn())
        assert r.returncode == 0, r.stderr

    def status(self, *flags: str) -> subprocess.CompletedProcess:
        return cli("status", "--config", str(self.config), "--dsn", self.dsn(), *flags)

    def status_json(self, *flags: str) -> dict:
        r = self.status("--json", *flags)
        assert r.returncode == EXIT_OK, r.stderr
        return json.loads(r.stdout)


@pytest.fixture
def host(pg, tmp_path):
    h = Host(pg, tmp_path)
    yield h
    pg.psql(f"DROP DATABASE IF EXISTS {h.db} WITH (FORCE)", check=False)


def start(start_seat, host: Host):
    extra = {"era_column": host.era_column} if host.era_column else {}
    return start_seat(host={"dsn": host.dsn(), **extra},
                      proxy={"clients": [{"application_name": "v1-host", "major": 1}]})


def traffic(seat, host: Host, new_run: str) -> None:
    """A v2 host creates a run (era 3) and appends a v2 name into an open era-2 run; a v1 host reads and appends."""
    with psycopg.connect(seat.dsn(dbname=host.db), autocommit=True) as v2:
        v2.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (new_run,))
        v2.execute("INSERT INTO events VALUES (%s, %s, 0, 'run.started', NULL, '{\"workflowId\": \"wf\"}', now(), "
                   "NULL)", (f"{new_run}-0", new_run))
        v2.execute("INSERT INTO events VALUES (%s, %s, 10, %s, 'n-1', NULL, now(), NULL)",
                   (f"{host.open[0]}-10", host.open[0], A.v1_to_v2[RENAMED]))
        assert v2.execute("SELECT count(*) FROM events WHERE run_id = %s", (host.closed[0],)).fetchone() == (5,)
    with psycopg.connect(seat.dsn(dbname=host.db, application_name="v1-host"), autocommit=True) as v1:
        v1.execute("INSERT INTO events VALUES (%s, %s, 11, 'node.started', 'n-2', NULL, now(), NULL)",
                   (f"{host.open[0]}-11", host.open[0]))
        assert v1.execute("SELECT count(*) FROM events WHERE run_id = %s", (new_run,)).fetchone() == (1,)


def wait_for(what, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def seen_both(host: Host) -> dict | None:
    """The status once the heartbeat has recorded majors 1 and 2 (within a heartbeat: 10 s)."""
    j = host.status_json()
    return j if {m["major"] for m in j["majorsSeen"]} >= {"1", "2"} else None


# --- the way back ------------------------------------------------------------------------------------------


def test_uninstall_round_trip_leaves_the_host_tables_as_before_migrate_but_the_kept_era3_runs(pg, host, start_seat):
    schema_before, database_before = host.schema_dump(), host.database_schema_dump()
    events_before, runs_before = host.data("events"), host.data("runs")
    host.migrate()
    assert host.schema_dump() != schema_before  # the triggers, the policies, row-level security
    seat = start(start_seat, host)
    traffic(seat, host, "v2-new")
    backfill = cli("backfill", "--config", str(host.config), "--dsn", host.dsn(), "--runs", host.closed[1],
                   "--no-progress")
    assert backfill.returncode == EXIT_OK, backfill.stdout + backfill.stderr

    # status while the seat serves: runs by era and source, the majors seen, the seat serving
    j = wait_for(lambda: seen_both(host))
    assert j, host.status_json()
    assert j["state"] == "installed" and j["artifacts"]["match"] and j["declarations"]["match"]
    assert j["runs"]["era2"] == 3 and j["runs"]["era2Open"] == 1
    assert j["runs"]["era3BySource"] == {"created": 1, "backfill": 1}
    assert j["backfilledRuns"] == 1
    assert j["era3WithoutOriginal"]["runs"] == [{"runId": "v2-new", "why": "no v1 original (created by a v2 writer)"}]
    assert j["newestEra2Append"]["column"] == "timestamp" and j["newestEra2Append"]["at"] is not None
    assert [s for s in j["seats"] if s["serving"]]
    assert {(m["major"], m["user"]) for m in j["majorsSeen"]} == {("1", "postgres"), ("2", "postgres")}
    assert not j["uninstall"]["possible"] and not j["retire"]["possible"]
    text = host.status()
    assert text.returncode == EXIT_OK
    assert "era 2 (v1 logs, unstamped): 3, open (no terminal event): 1" in text.stdout
    assert "era 3: 2 (converted by backfill 1, stamped by a seat (created by a v2 writer) 1)" in text.stdout
    assert "major 1   user postgres" in text.stdout and "seats serving: " in text.stdout

    # refused while the seat serves, and without --keep-era3: nothing changed
    whole = host.whole_dump()
    r = cli("uninstall", "--config", str(host.config), "--dsn", host.dsn(), "--keep-era3")
    assert r.returncode == EXIT_REFUSED and "a seat is serving" in r.stderr, r.stderr
    assert host.whole_dump() == whole
    seat.stop()
    j = host.status_json()
    assert not [s for s in j["seats"] if s["serving"]] and j["seats"][0]["stoppedAt"] is not None
    assert j["uninstall"]["blockers"] and j["uninstall"]["possibleWithKeepEra3"]
    r = cli("uninstall", "--config", str(host.config), "--dsn", host.dsn())
    assert r.returncode == EXIT_REFUSED, r.stdout + r.stderr
    assert "1 era-3 runs have no v1 original" in r.stderr and "era-3 run without a v1 original: v2-new" in r.stderr
    assert host.whole_dump() == whole

    r = cli("uninstall", "--config", str(host.config), "--dsn", host.dsn(), "--keep-era3", "--no-progress")
    assert r.returncode == EXIT_OK, r.stdout + r.stderr
    assert "kept era-3 run v2-new as it is" in r.stdout and "restored 1 backfilled runs" in r.stdout

    # the host's tables: the same DDL, triggers, policies and grants; the same rows but the kept run and the
    # appends the hosts made meanwhile (in the v1 spelling an era-2 log holds)
    assert host.schema_dump() == schema_before
    assert host.database_schema_dump() == database_before  # nothing migrate made is left anywhere
    events_after = host.data("events")
    kept = [e for e in events_after if e.startswith("(v2-new-")]
    appended = [e for e in events_after if e.startswith((f"({host.open[0]}-10,", f"({host.open[0]}-11,"))]
    assert len(kept) == 1 and len(appended) == 2
    assert f",{RENAMED},n-1," in appended[0]  # the v2 host's append, stored in its v1 spelling
    assert sorted(set(events_after) - set(kept) - set(appended)) == sorted(events_before)
    assert sorted(set(host.data("runs")) - {r for r in host.data("runs") if r.startswith("(v2-new,")}) == \
        sorted(runs_before)
    assert host.rows("SELECT count(*) FROM pg_namespace WHERE nspname = 'openwop_seat'") == [(0,)]

    # again: nothing to do; status: no schema (exit 3)
    r = cli("uninstall", "--config", str(host.config), "--dsn", host.dsn())
    assert r.returncode == EXIT_OK and "nothing to do" in r.stdout
    r = host.status()
    assert r.returncode == EXIT_UNAVAILABLE and "has no openwop_seat schema" in r.stderr


def test_the_era_column_store_round_trip(pg, tmp_path, start_seat):
    """With [host] era_column the era lives in the host's runs table: status counts it, uninstall clears the
    column of the runs it restores and leaves it on the kept ones (the host's own column stays)."""
    host = Host(pg, tmp_path, era_column="era")
    try:
        schema_before, runs_before = host.schema_dump(), host.data("runs")
        host.migrate()
        seat = start(start_seat, host)
        traffic(seat, host, "v2-new")
        r = cli("backfill", "--config", str(host.config), "--dsn", host.dsn(), "--runs", host.closed[1],
                "--no-progress")
        assert r.returncode == EXIT_OK, r.stdout + r.stderr
        seat.stop()
        j = host.status_json()
        assert j["runs"]["era2"] == 3 and j["runs"]["era3BySource"] == {"era-column": 2}
        assert [x["runId"] for x in j["era3WithoutOriginal"]["runs"]] == ["v2-new"]
        r = cli("uninstall", "--config", str(host.config), "--dsn", host.dsn(), "--keep-era3", "--no-progress")
        assert r.returncode == EXIT_OK, r.stdout + r.stderr
        assert host.schema_dump() == schema_before
        assert host.rows("SELECT run_id, era FROM runs WHERE era IS NOT NULL") == [("v2-new", 3)]
        assert sorted(set(host.data("runs")) - {x for x in host.data("runs") if x.startswith("(v2-new,")}) == \
            sorted(runs_before)
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {host.db} WITH (FORCE)", check=False)


def test_uninstall_killed_between_restores_resumes(pg, host):
    schema_before, events_before = host.schema_dump(), host.data("events")
    host.migrate()
    r = cli("backfill", "--config", str(host.config), "--dsn", host.dsn(), "--all", "--no-progress")
    assert r.returncode == EXIT_OK, r.stdout + r.stderr
    runs = sorted(host.closed + host.open)  # uninstall restores them in this order
    # hold the third run's lock (the one backfill and an append take): the uninstall stops there; kill it then
    with psycopg.connect(host.dsn(), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(openwop_seat.run_lock_key(%s))", (runs[2],))
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "uninstall", "--config", str(host.config), "--dsn",
                                 host.dsn(), "--no-progress"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert wait_for(lambda: host.rows("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                                              "NOT granted")[0][0] == 1, timeout=60)
            assert [host.rows("SELECT openwop_seat.era_of(%s)", run)[0][0] for run in runs] == [2, 2, 3, 3]
        finally:
            proc.kill()
            proc.communicate()
        holder.execute("SELECT pg_advisory_unlock_all()")
    # the state an interrupted uninstall leaves: status explains it, seats, tools and migrate refuse it
    j = host.status_json()
    assert j["state"] == "uninstalling" and j["backfilledRuns"] == 2 and j["runs"]["era2"] == 2, j
    assert "an uninstall is under way" in host.status().stdout
    r = cli("backfill", "--config", str(host.config), "--dsn", host.dsn(), "--restore", runs[2])
    assert r.returncode == EXIT_UNAVAILABLE and "uninstall of this database is under way" in r.stderr
    r = cli("migrate", "--config", str(host.config), "--dsn", host.dsn())
    assert r.returncode == 1 and "uninstall" in r.stderr
    # a re-run finishes
    r = cli("uninstall", "--config", str(host.config), "--dsn", host.dsn(), "--no-progress")
    assert r.returncode == EXIT_OK, r.stdout + r.stderr
    assert "restored 2 backfilled runs" in r.stdout and "uninstall started" not in r.stdout
    assert host.schema_dump() == schema_before and host.data("events") == events_before


# --- the way forward ---------------------------------------------------------------------------------------


def test_retire_refuses_until_ready_then_a_direct_v2_read_is_the_seats_read(pg, host, start_seat):
    host.migrate()
    seat = start(start_seat, host)
    traffic(seat, host, "v2-new")
    runs = host.closed + host.open + ["v2-new"]
    through_seat = {run: raw_read(seat.dsn(dbname=host.db), run) for run in runs}
    assert through_seat[host.closed[0]][1][3] == A.v1_to_v2["agent.reasoning.delta"].encode()  # translated
    assert wait_for(lambda: seen_both(host))

    def retire(*flags: str) -> subprocess.CompletedProcess:
        return cli("retire", "--config", str(host.config), "--dsn", host.dsn(), *flags)

    whole = host.whole_dump()
    r = retire("--quiet", "3600")
    assert r.returncode == EXIT_REFUSED, r.stdout + r.stderr
    assert "4 era-2 runs remain (1 of them open)" in r.stderr
    assert "a major-1 session of user 'postgres' connected through a seat" in r.stderr
    assert "a seat is serving" in r.stderr
    assert host.whole_dump() == whole
    j = host.status_json("--quiet", "3600")
    assert len(j["retire"]["blockers"]) == 3 and not j["retire"]["possibleWithAllowEra2"]

    r = cli("backfill", "--config", str(host.config), "--dsn", host.dsn(), "--all", "--no-progress")
    assert r.returncode == EXIT_OK, r.stdout + r.stderr
    whole = host.whole_dump()
    r = retire("--quiet", "0")  # no era-2 run, no quiet period: the serving seat alone blocks
    assert r.returncode == EXIT_REFUSED, r.stderr
    assert r.stderr.count("  - ") == 1 and "a seat is serving" in r.stderr
    assert host.whole_dump() == whole
    seat.stop()
    r = retire("--quiet", "3600")
    assert r.returncode == EXIT_REFUSED, r.stderr
    assert "a major-1 session" in r.stderr and "a seat is serving" not in r.stderr
    whole = host.whole_dump()
    assert "retire: not possible now" in host.status("--quiet", "3600").stdout
    assert host.whole_dump() == whole

    time.sleep(1.5)
    adr = host.config.parent / "retire-addendum.md"
    r = retire("--quiet", "1", "--adr", str(adr))
    assert r.returncode == EXIT_OK, r.stdout + r.stderr
    assert "## Addendum: the seat retired" in r.stdout and adr.read_text() in r.stdout
    assert "era 3: 5 (backfill 4, created 1)" in r.stdout

    # a v2 host now reads the database directly: exactly the bytes the seat served before
    for run in runs:
        assert raw_read(host.dsn(), run) == through_seat[run], run
    assert host.rows("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'zz_openwop_seat_%'") == [(0,)]
    assert host.rows("SELECT count(*) FROM pg_policy WHERE polname LIKE 'openwop_seat_%'") == [(0,)]
    assert host.rows("SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = 'events'::regclass") \
        == [(False, False)]
    left = {r[0] for r in host.rows("SELECT relname::text FROM pg_class WHERE relnamespace = "
                                    "'openwop_seat'::regnamespace AND relkind = 'r'")}
    assert left == {"meta", "run_era", "events_v1_original", "sessions_seen", "audit_verdicts"}
    assert host.rows("SELECT count(*) FROM pg_proc WHERE pronamespace = 'openwop_seat'::regnamespace") == [(0,)]

    j = host.status_json()
    assert j["state"] == "retired" and j["retiredAt"] and j["runs"]["era3BySource"] == {"backfill": 4, "created": 1}
    text = host.status().stdout
    assert "retired at" in text and "retire: done at" in text and "the way back is closed" in text
    r = retire("--quiet", "1")
    assert r.returncode == EXIT_OK and "nothing to do" in r.stdout
    r = cli("migrate", "--config", str(host.config), "--dsn", host.dsn())
    assert r.returncode == 1 and "retired" in r.stderr
    late = start_seat(host={"dsn": host.dsn()}, wait=False)  # a seat started after retire refuses to serve
    assert late.proc.wait(30) == 1 and "the seat was retired from this database" in late.log()
    r = cli("uninstall", "--config", str(host.config), "--dsn", host.dsn())
    assert r.returncode == EXIT_REFUSED and "the way back is closed" in r.stderr
    r = retire("--drop-evidence")
    assert r.returncode == EXIT_OK and "dropped the evidence" in r.stdout
    assert host.rows("SELECT count(*) FROM pg_namespace WHERE nspname = 'openwop_seat'") == [(0,)]


def test_retire_with_allow_era2_leaves_the_era2_runs_v1_only_and_lists_them(pg, host):
    host.migrate()
    assert host.status_json()["audit"] is None
    audit = cli("audit", "--config", str(host.config), "--dsn", host.dsn(), "--no-progress")
    assert audit.returncode in (EXIT_OK, EXIT_REFUSED), audit.stderr
    verdict = host.status_json()["audit"]  # recorded: audit ran as the owner of openwop_seat
    assert verdict["ok"] is (audit.returncode == EXIT_OK) and verdict["byRole"] == "postgres"
    assert verdict["summary"]["runs"]["era2Scanned"] == 4, verdict
    assert "audit: last verdict" in host.status().stdout
    reader = cli("audit", "--config", str(host.config), "--dsn", host.dsn(user="host_user"), "--no-progress")
    assert reader.returncode in (EXIT_OK, EXIT_REFUSED), reader.stderr  # a reader records nothing
    assert host.status_json()["audit"]["finishedAt"] == verdict["finishedAt"]
    r = cli("retire", "--config", str(host.config), "--dsn", host.dsn(), "--quiet", "0")
    assert r.returncode == EXIT_REFUSED and "--allow-era2" in r.stderr
    assert host.status_json("--quiet", "0")["retire"]["possibleWithAllowEra2"]
    # killed while it waits for the events table's lock (a writer's transaction is open): nothing changed
    whole = host.whole_dump()
    with psycopg.connect(host.dsn()) as writer:
        writer.execute("LOCK TABLE events IN ROW EXCLUSIVE MODE")
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "retire", "--config", str(host.config), "--dsn",
                                 host.dsn(), "--quiet", "0", "--allow-era2"], cwd=ROOT, env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert wait_for(lambda: host.rows("SELECT count(*) FROM pg_locks WHERE relation = 'events'::regclass "
                                              "AND NOT granted")[0][0] == 1, timeout=60)
        finally:
            proc.kill()
            proc.communicate()
        writer.rollback()
    assert wait_for(lambda: host.rows("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                                      "'openwop-seat retire'")[0][0] == 0)
    assert host.whole_dump() == whole and host.status_json()["state"] == "installed"
    r = cli("retire", "--config", str(host.config), "--dsn", host.dsn(), "--quiet", "0", "--allow-era2")
    assert r.returncode == EXIT_OK, r.stdout + r.stderr
    record = json.loads(host.rows("SELECT value FROM openwop_seat.meta WHERE key = 'retire_record'")[0][0])
    assert record["era2Runs"] == sorted(host.closed + host.open)
    assert "era 2 left (v1-only, accepted with --allow-era2): 4" in r.stdout


# --- gauges and bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_cutover_gauges_on_metrics(pg, host, start_seat, workers):
    host.migrate()
    seat = start_seat(host={"dsn": host.dsn()}, proxy={"workers": workers})
    traffic(seat, host, "v2-new")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=20) as resp:
            return resp.read().decode()

    def gauged() -> str | None:
        # each worker's heartbeat lands on its own schedule: wait until every one of them is counted
        t = scrape()
        return t if f"openwop_seat_cutover_seats_serving {float(workers)}" in t else None

    text = wait_for(gauged)
    assert text, scrape()
    # every worker reads the one database: the supervisor exports one value, not their sum
    assert 'openwop_seat_cutover_runs{era="2",source=""} 4.0' in text
    assert 'openwop_seat_cutover_runs{era="3",source="created"} 1.0' in text
    assert "openwop_seat_cutover_era2_open_runs 1.0" in text
    assert f"openwop_seat_cutover_seats_serving {float(workers)}" in text
    assert "openwop_seat_cutover_newest_era2_append_timestamp_seconds " in text


def test_bad_input_and_databases_the_commands_cannot_use(pg, host):
    r = cli("status", "--dsn", host.dsn(), "--bogus")
    assert r.returncode == EXIT_USAGE and "unrecognized arguments: --bogus" in r.stderr
    r = cli("status", "--dsn", host.dsn(), "--quiet", "-5")
    assert r.returncode == EXIT_USAGE and "--quiet" in r.stderr
    for cmd in ("status", "retire"):  # not migrated yet
        r = cli(cmd, "--config", str(host.config), "--dsn", host.dsn())
        assert r.returncode == EXIT_UNAVAILABLE and "no openwop_seat schema" in r.stderr, (cmd, r.stderr)
    r = cli("status", "--dsn", "host=127.0.0.1 port=1 dbname=nope connect_timeout=2")
    assert r.returncode == EXIT_UNAVAILABLE and "cannot connect" in r.stderr
    host.migrate()
    existing = host.config.parent / "exists.md"
    existing.write_text("an edited ADR\n")
    r = cli("retire", "--config", str(host.config), "--dsn", host.dsn(), "--adr", str(existing))
    assert r.returncode == EXIT_USAGE and "exists" in r.stderr and existing.read_text() == "an edited ADR\n"

    # a role that lacks the grants: every one named, nothing changed
    whole = host.whole_dump()
    for cmd in ("uninstall", "retire"):
        r = cli(cmd, "--config", str(host.config), "--dsn", host.dsn(user="host_user"), "--quiet" if cmd == "retire"
                else "--no-progress", *(["0"] if cmd == "retire" else []))
        assert r.returncode == EXIT_UNAVAILABLE, (cmd, r.stderr)
        assert "GRANT postgres TO host_user;" in r.stderr, r.stderr
    assert host.whole_dump() == whole

    host.sql("UPDATE openwop_seat.meta SET value = '99' WHERE key = 'layout_version'")
    for cmd in ("status", "retire", "uninstall"):
        r = cli(cmd, "--config", str(host.config), "--dsn", host.dsn())
        assert r.returncode == EXIT_UNAVAILABLE and "layout is version 99, newer" in r.stderr, (cmd, r.stderr)
    assert host.whole_dump() != whole  # only the layout_version changed above


def test_a_database_migrated_before_the_host_made_its_tables(pg, tmp_path):
    """First boot: migrate ran before the host created its tables; status reads it, uninstall leaves nothing."""
    db = f"wayout_{os.getpid()}_{next(_dbs)}"
    pg.psql(f"CREATE DATABASE {db}")
    try:
        dsn = pg.dsn(dbname=db)
        dump = [os.path.join(pg.bin, "pg_dump"), "--schema-only", "-d", dsn]
        before = subprocess.run(dump, capture_output=True, text=True, check=True).stdout
        assert cli("migrate", "--dsn", dsn).returncode == EXIT_OK
        r = cli("status", "--dsn", dsn, "--json")
        assert r.returncode == EXIT_OK, r.stderr
        j = json.loads(r.stdout)
        assert j["runs"]["total"] == 0 and j["newestEra2Append"] is None and j["uninstall"]["possible"]
        r = cli("uninstall", "--dsn", dsn)
        assert r.returncode == EXIT_OK and "dropped 0 triggers" in r.stdout, r.stdout + r.stderr

        def strip(text: str) -> list[str]:
            return [x for x in text.splitlines() if not x.startswith(("\\restrict", "\\unrestrict"))]

        assert strip(subprocess.run(dump, capture_output=True, text=True, check=True).stdout) == strip(before)
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)", check=False)
