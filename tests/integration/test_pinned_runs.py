"""`openwop-seat pinned-runs`: list, decide and cancel runs pinned to v1 change ids (persistence.md P1–P3).

Every test gets a fresh host database, copied from a template that conftest's
HOST_SCHEMA and `migrate` (with the suite's claim secret) made, once per era
store (`run_era` and `[host] era_column`), so the command's database-wide
listing sees exactly the runs the test seeded.  The command runs as a real
subprocess connecting as the host's role (`host_user`: neither a superuser nor
the owner of openwop_seat).  Runs are seeded directly (unclaimed sessions, the
v1 writer); an era-3 run is stamped with `openwop_seat.stamp_run` as the owner.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from harness import CLAIM_SECRET, HOST_SCHEMA, ROOT, render_config
from proxy.artifacts.load import load_artifacts
from proxy.dev.devcluster import free_port
from proxy.errors import ERRORS
from proxy.tools.pinned import spellings

A = load_artifacts()
WORDS = spellings(A)
ERA_COLUMN = "event_log_schema_version"
HOST_LOCK = "pg_advisory_xact_lock(hashtext(run_id), 1)"  # the reference host's append lock
CANCEL = {"reason": "v1_pin_unsupported", "cancelledBy": "v2-cutover"}
_ids = itertools.count()


def rid(prefix: str = "pin") -> str:
    return f"{prefix}-{next(_ids)}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module", params=["run_era", "era_column"])
def template(request, pg, tmp_path_factory):
    """A migrated host database to copy (never connected to by the tests), and the tool's config file."""
    name = f"pin_tpl_{request.param}_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE DATABASE {name} OWNER host_user")
    host = {"append_lock": HOST_LOCK}
    ddl = HOST_SCHEMA
    if request.param == "era_column":
        host["era_column"] = ERA_COLUMN
        ddl += f"ALTER TABLE runs ADD COLUMN {ERA_COLUMN} smallint CHECK ({ERA_COLUMN} = 3);"
    pg.psql(ddl, user="host_user", dbname=name)
    config = tmp_path_factory.mktemp("pinned") / "openwop-seat.toml"
    config.write_text(render_config({"host": dict(host)}))
    out = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--config", str(config), "--dsn",
                          pg.dsn(dbname=name)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    yield name, config, host
    pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


class Db:
    """One fresh host database copied from the template."""

    def __init__(self, pg, name: str, config, host: dict):
        self.pg, self.name, self.config, self.host = pg, name, config, host

    def dsn(self, user: str = "host_user") -> str:
        return self.pg.dsn(user=user, dbname=self.name)

    def sql(self, query: str, params=()) -> list[tuple]:
        """As the superuser (the owner of openwop_seat); an unclaimed session: a v1 writer."""
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def seed(self, run: str, events: list[tuple[str, dict | None]], era: int = 2, first: int = 1) -> None:
        """A runs row, its events at first, first+1, ... (inserted while the run is era 2), then the era-3 stamp."""
        self.sql("INSERT INTO runs (run_id, tenant_id, status) VALUES (%s, 't', 'running')", (run,))
        for i, (etype, payload) in enumerate(events):
            seq = first + i
            self.sql("INSERT INTO events (event_id, run_id, sequence, type, payload, \"timestamp\") "
                     "VALUES (%s, %s, %s, %s, %s, now())",
                     (f"{run}-{seq}", run, seq, etype, None if payload is None else json.dumps(payload)))
        if era == 3:
            assert self.sql("SELECT openwop_seat.stamp_run(%s, 'test')", (run,)) == [(True,)]
        assert self.sql("SELECT openwop_seat.era_of(%s)", (run,)) == [(era,)]

    def log(self, run: str) -> list[tuple]:
        """(sequence, type, payload as text, event_id, timestamp is set) of each event, in order."""
        return self.sql("SELECT sequence, type, payload::text, event_id, \"timestamp\" IS NOT NULL FROM events "
                        "WHERE run_id = %s ORDER BY sequence", (run,))

    def tool(self, *args: str, env: dict | None = None, dsn: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "proxy", "pinned-runs", "--config", str(self.config),
                               "--dsn", dsn or self.dsn(), *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env=env)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "proxy", "pinned-runs", "--config", str(self.config),
                                 "--dsn", self.dsn(), *args], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)


@pytest.fixture
def db(pg, template):
    tpl, config, host = template
    name = f"pin_{uuid.uuid4().hex[:10]}"
    pg.psql(f"CREATE DATABASE {name} TEMPLATE {tpl} OWNER host_user")
    yield Db(pg, name, config, host)
    pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


def pin(change: str, version: int = 1) -> tuple[str, dict]:
    return ("version.pinned", {"changeId": change, "version": version})


def started() -> tuple[str, dict]:
    return ("run.started", {"inputs": {}})


def implemented(tmp_path, *lines: str):
    path = tmp_path / f"implemented-{next(_ids)}.txt"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def line_of(out: str, run: str) -> str:
    found = [line for line in out.splitlines() if line.startswith(f"run {run} ")]
    assert len(found) == 1, out
    return found[0]


# --- listing and deciding ----------------------------------------------------------------------


def test_lists_the_non_terminal_pinned_runs_of_both_eras_with_their_change_ids(db):
    two, three = rid(), rid()
    db.seed(two, [started(), pin("alpha", 1), ("node.started", {"nodeId": "n"}), pin("beta", 2)], era=2)
    db.seed(three, [started(), pin("gamma", 1)], era=3)
    done = rid()  # pinned, but terminal: not listed
    db.seed(done, [started(), pin("alpha"), ("run.completed", {"outputs": {}})])
    db.seed(rid(), [started(), ("node.started", {"nodeId": "n"})])  # not pinned: not listed
    out = db.tool()
    assert out.returncode == 0, out.stderr
    assert line_of(out.stdout, two) == f"run {two} (era 2): pinned alpha@1, beta@2"
    assert line_of(out.stdout, three) == f"run {three} (era 3): pinned gamma@1"
    assert done not in out.stdout
    assert "pinned runs: 2 non-terminal" in out.stdout
    assert "in total (for the certification bundle): 0" in out.stdout


def test_implemented_file_decides_continue_or_cancel_and_writes_nothing(db, tmp_path):
    keep, drop2, drop3 = rid(), rid(), rid()
    db.seed(keep, [started(), pin("alpha"), pin("beta")], era=2)
    db.seed(drop2, [started(), pin("alpha"), pin("retired")], era=2)
    db.seed(drop3, [started(), pin("retired-too")], era=3)
    before = {r: db.log(r) for r in (keep, drop2, drop3)}
    path = implemented(tmp_path, "# the change ids release 2.0 still implements", "", "  alpha  ", "beta")
    out = db.tool("--implemented", path)
    assert out.returncode == 0, out.stderr
    assert line_of(out.stdout, keep).endswith(": continue (every pinned change id is implemented)")
    assert line_of(out.stdout, drop2).endswith(": cancel (not implemented: retired)")
    assert line_of(out.stdout, drop3).endswith(": cancel (not implemented: retired-too)")
    assert "pinned runs to cancel: 2 (pass --cancel to cancel them)" in out.stdout
    assert "pinned runs continued: 1" in out.stdout
    assert {r: db.log(r) for r in before} == before


def test_a_file_with_only_comments_implements_nothing(db, tmp_path):
    run = rid()
    db.seed(run, [started(), pin("alpha")])
    out = db.tool("--implemented", implemented(tmp_path, "# none"))
    assert out.returncode == 0, out.stderr
    assert line_of(out.stdout, run).endswith(": cancel (not implemented: alpha)")


# --- cancelling ----------------------------------------------------------------------------


def test_cancel_appends_one_run_cancelled_in_the_run_era_vocabulary_and_keeps_the_pins(db, tmp_path, start_seat):
    keep, drop2, drop3, zero = rid(), rid(), rid(), rid()
    db.seed(keep, [started(), pin("alpha")], era=3)
    db.seed(drop2, [started(), pin("alpha"), pin("retired")], era=2)
    db.seed(drop3, [started(), pin("retired")], era=3)
    db.seed(zero, [started(), pin("retired")], era=2, first=0)  # a log numbered from 0, as v2 numbers
    before = {r: db.log(r) for r in (keep, drop2, drop3, zero)}
    out = db.tool("--implemented", implemented(tmp_path, "alpha"), "--cancel")
    assert out.returncode == 0, out.stdout + out.stderr
    for run, era in ((drop2, 2), (drop3, 3), (zero, 2)):
        log = db.log(run)
        assert log[:-1] == before[run], "the pins and every earlier event are untouched"
        seq, etype, payload, event_id, stamped = log[-1]
        assert (seq, etype, json.loads(payload), stamped) == (before[run][-1][0] + 1, WORDS.cancelled[era], CANCEL,
                                                              True)
        assert event_id and event_id not in {e[3] for e in before[run]}
        assert f"cancelled run {run}: {WORDS.cancelled[era]} at sequence {seq} (era {era}; not implemented: retired)" \
            in out.stdout
    assert db.log(keep) == before[keep]
    assert "pinned runs cancelled: 3" in out.stdout
    assert "pinned runs continued: 1" in out.stdout
    assert "in total (for the certification bundle): 3" in out.stdout
    # The era-3 run takes no v1 write: the tool's append got in as a v2 writer (its claim), not as a bypass.
    with pytest.raises(psycopg.Error) as refused:
        db.sql("INSERT INTO events (event_id, run_id, sequence, type, \"timestamp\") VALUES (%s, %s, 99, "
               "'node.started', now())", (f"{drop3}-x", drop3))
    assert refused.value.sqlstate == ERRORS["era2_write_refused"].sqlstate
    # A v2 host reading the era-2 run through the seat reads the cancel (type and projected payload).
    seat = start_seat(host={"dsn": db.dsn(), **{k: v for k, v in db.host.items() if k == "era_column"}})
    with psycopg.connect(seat.dsn(user="host_user", dbname=db.name), autocommit=True) as conn:
        last = conn.execute("SELECT type, payload FROM events WHERE run_id = %s ORDER BY sequence DESC LIMIT 1",
                            (drop2,)).fetchone()
    assert last == (A.v1_to_v2[WORDS.cancelled[2]], CANCEL)


def test_cancel_again_adds_nothing(db, tmp_path):
    run = rid()
    db.seed(run, [started(), pin("retired")], era=3)
    path = implemented(tmp_path, "alpha")
    first = db.tool("--implemented", path, "--cancel")
    assert first.returncode == 0, first.stderr
    after = db.log(run)
    second = db.tool("--implemented", path, "--cancel")
    assert second.returncode == 0, second.stderr
    assert db.log(run) == after
    assert [e[1] for e in after].count(WORDS.cancelled[3]) == 1
    assert run not in second.stdout
    assert "pinned runs cancelled: 0" in second.stdout
    assert "in total (for the certification bundle): 1" in second.stdout


def wait_for_advisory_wait(db: Db, timeout: float = 20) -> None:
    """Wait until some backend of this database waits on an advisory lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND wait_event_type = 'Lock' AND wait_event = 'advisory'") != [(0,)]:
            return
        time.sleep(0.02)
    raise AssertionError("the cancel never waited on an advisory lock")


@pytest.mark.parametrize("host_append", ["holds the host's lock, then appends", "has an append in flight"])
def test_a_run_that_ends_while_the_cancel_waits_for_its_locks_is_refused(db, tmp_path, host_append):
    """The host completes the run while the cancel waits: the cancel sees the terminal event and appends nothing.

    First case: the host holds its own append lock and appends only after the cancel started waiting; the
    host's append (which takes the seat's run lock in its trigger) must not deadlock with the cancel.
    Second case: the host's append is in the table, uncommitted, holding the seat's lock in share mode."""
    run = rid()
    db.seed(run, [started(), pin("retired")], era=2)
    with psycopg.connect(db.dsn()) as host:  # the host's role, unclaimed, in a transaction
        completed = ("INSERT INTO events (event_id, run_id, sequence, type, payload, \"timestamp\") "
                     "VALUES (%s, %s, 3, 'run.completed', '{\"outputs\": {}}', now())")
        if host_append.startswith("holds"):
            host.execute(f"SELECT {HOST_LOCK.replace('run_id', '%s')}", (run,))
        else:
            host.execute(completed, (f"{run}-3", run))
        tool = db.popen("--implemented", implemented(tmp_path, "alpha"), "--cancel")
        try:
            wait_for_advisory_wait(db)
            if host_append.startswith("holds"):
                host.execute(completed, (f"{run}-3", run))
            host.commit()
            stdout, stderr = tool.communicate(timeout=60)
        finally:
            if tool.poll() is None:
                tool.kill()
                tool.wait()
    assert tool.returncode == 0, stdout + stderr
    assert (f"refused run {run}: it already has a terminal event (run.completed at sequence 3): not cancelled"
            in stdout)
    assert "pinned runs cancelled: 0" in stdout
    assert [e[1] for e in db.log(run)] == ["run.started", "version.pinned", "run.completed"]


def test_a_pin_without_a_change_id_is_undecided_and_left_alone(db, tmp_path):
    odd, drop = rid(), rid()
    db.seed(odd, [started(), ("version.pinned", {"version": 1}), pin("retired")])
    db.seed(drop, [started(), pin("retired")])
    before = db.log(odd)
    out = db.tool("--implemented", implemented(tmp_path, "alpha"), "--cancel")
    assert out.returncode == 1, out.stdout
    assert line_of(out.stdout, odd).endswith(
        ": undecided (a version.pinned event names no change id: <sequence 2: changeId is absent>)")
    assert db.log(odd) == before
    assert f"cancelled run {drop}:" in out.stdout
    assert "pinned runs cancelled: 1" in out.stdout


# --- bad input ---------------------------------------------------------------------------------


def test_cancel_without_implemented_is_refused(db):
    run = rid()
    db.seed(run, [started(), pin("retired")])
    out = db.tool("--cancel")
    assert out.returncode == 2
    assert "--cancel needs --implemented FILE" in out.stderr
    assert len(db.log(run)) == 2


@pytest.mark.parametrize("content,why", [
    (None, "cannot read"),
    (b"", "is empty"),
    (b"  \n\n\t\n", "is empty"),
    (b"alpha beta\n", "line 1: 'alpha beta' is not one change id"),
    (b"alpha\n\xff\n", "is not UTF-8"),
])
def test_a_bad_implemented_file_is_refused(db, tmp_path, content, why):
    run = rid()
    db.seed(run, [started(), pin("retired")])
    path = tmp_path / "implemented.txt"
    if content is not None:
        path.write_bytes(content)
    out = db.tool("--implemented", str(path), "--cancel")
    assert out.returncode == 2, out.stdout
    assert out.stderr.startswith("openwop-seat pinned-runs: --implemented: ") and why in out.stderr, out.stderr
    assert out.stdout == ""
    assert len(db.log(run)) == 2


def test_an_unreachable_database_is_an_error(db, tmp_path):
    out = db.tool("--implemented", implemented(tmp_path, "alpha"),
                  dsn=f"host=127.0.0.1 port={free_port()} user=host_user dbname={db.name}")
    assert out.returncode == 1
    assert out.stderr.startswith("openwop-seat pinned-runs: cannot connect to the database: "), out.stderr


def test_cancel_without_the_claim_secret_is_refused_before_writing(db, tmp_path):
    run = rid()
    db.seed(run, [started(), pin("retired")], era=3)
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CLAIM_SECRET"}
    out = db.tool("--implemented", implemented(tmp_path, "alpha"), "--cancel", env=env)
    assert out.returncode == 2
    assert "needs the seat's claim secret" in out.stderr
    assert CLAIM_SECRET not in out.stderr
    assert len(db.log(run)) == 2


def test_cancel_with_a_wrong_claim_secret_writes_nothing(db, tmp_path):
    run = rid()
    db.seed(run, [started(), pin("retired")], era=3)
    env = {**os.environ, "OPENWOP_SEAT_CLAIM_SECRET": f"not-the-secret-{uuid.uuid4().hex}"}
    out = db.tool("--implemented", implemented(tmp_path, "alpha"), "--cancel", env=env)
    assert out.returncode == 1
    assert "openwop_seat.claim: wrong secret" in out.stderr
    assert len(db.log(run)) == 2
