"""``openwop-seat backfill`` (issue #7 item 2) on a real PostgreSQL, through the real command line and a seat.

The runs live in the suite's shared ``postgres`` database (migrated by conftest), each with a fresh id, and
every backfill here names its runs with ``--runs``, so other tests' runs are never converted.  Reads through
the seat compare raw column bytes (psycopg with loaders that return the bytes as received), in text and in
binary format.  The backfill's configuration sets ``[host] append_lock``, so the host-lock path runs too.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import pq
from psycopg.adapt import Loader

from harness import render_config
from proxy.artifacts.load import load_artifacts
from proxy.errors import ERRORS
from proxy.tools.common import EXIT_OK, EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
A = load_artifacts()
APPEND_LOCK = "pg_advisory_xact_lock(hashtext(run_id), 1)"
_ids = itertools.count()

# One era-2 run's log, as a v1 host stored it: (type, node_id, payload or None)
LOG = [
    ("run.started", None, {"workflowId": "wf"}),  # projected: the legacy owner Subject (tenant from runs)
    ("agent.reasoning.delta", "n-1", {"agentId": "a", "delta": "x", "sequence": 1}),  # renamed
    ("node.started", "n-1", {"nodeId": "n-1", "typeId": "t", "extra": True}),  # boxed under x-v1
    ("example.thing-happened", None, {"z": 1, "a": [1, 2.50]}),  # vendor: passed as stored
    ("node.completed", "n-1", None),  # no payload
    ("run.completed", None, {"outputs": {}, "output": {"answer": 42}}),  # `output` boxed beside `outputs`
]


def rid(prefix: str) -> str:
    return f"bf-{prefix}-{next(_ids)}-{uuid.uuid4().hex[:8]}"


class Raw(Loader):
    def load(self, data):
        return bytes(data)


class RawBinary(Raw):
    format = pq.Format.BINARY


def raw_read(dsn: str, run: str, binary: bool) -> list[tuple]:
    """Every column of the run's events, as the bytes the server (or seat) sent."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("text", "int4", "jsonb", "timestamptz"):
            conn.adapters.register_loader(name, RawBinary if binary else Raw)
        cur = conn.cursor(binary=binary)
        return cur.execute("SELECT * FROM events WHERE run_id = %s ORDER BY sequence", (run,)).fetchall()


def seat_reads(seat, run: str) -> tuple[list, list]:
    return raw_read(seat.dsn(), run, False), raw_read(seat.dsn(), run, True)


def direct(pg, sql: str, *params) -> list[tuple]:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        cur = conn.execute(sql, params or None)
        return cur.fetchall() if cur.description else []


def make_run(pg, run: str, log=LOG, tenant: str = "acme") -> None:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:  # a direct session: a v1 writer, era 2
        with conn.transaction():
            conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, %s)", (run, tenant))
            for seq, (t, node, payload) in enumerate(log):
                conn.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                             "VALUES (%s, %s, %s, %s, %s, %s::jsonb, '2026-09-03T08:00:00Z')",
                             (f"{run}-{seq}", run, seq, t, node, None if payload is None else json.dumps(payload)))


def whole_rows(pg, run: str) -> list[str]:
    return [r[0] for r in direct(pg, "SELECT e::text FROM events e WHERE run_id = %s ORDER BY sequence", run)]


def era(pg, run: str) -> int:
    return direct(pg, "SELECT openwop_seat.era_of(%s)", run)[0][0]


def originals(pg, run: str) -> list[tuple]:
    return direct(pg, "SELECT sequence, type, payload, original FROM openwop_seat.events_v1_original "
                      "WHERE run_id = %s ORDER BY sequence", run)


@pytest.fixture(scope="module")
def bseat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1}]})


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("backfill") / "openwop-seat.toml"
    path.write_text(render_config({"host": {"append_lock": APPEND_LOCK}}))
    return str(path)


def backfill_cmd(pg, config_file: str, *args: str, user: str = "postgres") -> list[str]:
    return [sys.executable, "-m", "proxy", "backfill", "--config", config_file, "--dsn", pg.dsn(user=user), *args]


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}


def backfill(pg, config_file: str, *args: str, user: str = "postgres") -> subprocess.CompletedProcess:
    return subprocess.run(backfill_cmd(pg, config_file, *args, user=user), capture_output=True, text=True,
                          cwd=ROOT, env=_env(), timeout=120)


# --- conversion, byte for byte, and --restore ---------------------------------------------------


def test_backfill_keeps_major2_reads_byte_identical_and_restore_undoes_it(pg, bseat, config_file):
    run = rid("bytes")
    make_run(pg, run)
    before_rows = whole_rows(pg, run)
    before_text, before_binary = seat_reads(bseat, run)
    # the seat does translate this run (else the comparison below would prove nothing)
    stored_types = [r[0] for r in direct(pg, "SELECT type FROM events WHERE run_id = %s ORDER BY sequence", run)]
    assert [r[3] for r in before_text] != [t.encode() for t in stored_types]
    assert before_text[0][5] != direct(pg, "SELECT payload::text FROM events WHERE run_id = %s AND sequence = 0",
                                       run)[0][0].encode()

    out = backfill(pg, config_file, "--runs", run)
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert "converted 1 runs to era 3 (4 events rewritten, 6 preserved" in out.stdout
    assert era(pg, run) == 3
    assert direct(pg, "SELECT source FROM openwop_seat.run_era WHERE run_id = %s", run) == [("backfill",)]
    # a major-2 read through the seat returns the same bytes, text and binary
    assert seat_reads(bseat, run) == (before_text, before_binary)
    # the stored rows are now what the reader served
    assert [r[0] for r in direct(pg, "SELECT type FROM events WHERE run_id = %s ORDER BY sequence", run)] == \
        [r[3].decode() for r in before_text]
    # the originals, byte for byte: the whole row, and its type and payload text
    held = originals(pg, run)
    assert [h[3] for h in held] == before_rows
    assert [(h[0], h[1]) for h in held] == list(enumerate(stored_types))
    assert [h[2] for h in held] == [r[0] for r in direct(
        pg, "SELECT ((o.original::events).payload)::text FROM openwop_seat.events_v1_original o "
            "WHERE o.run_id = %s ORDER BY o.sequence", run)]

    again = backfill(pg, config_file, "--runs", run)  # idempotent
    assert again.returncode == EXIT_OK and "already era 3: 1 runs" in again.stdout
    assert originals(pg, run) == held

    out = backfill(pg, config_file, "--restore", run)
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert f"restored run {run}: 4 of its 6 events put back" in out.stdout
    assert whole_rows(pg, run) == before_rows
    assert era(pg, run) == 2 and originals(pg, run) == []
    assert seat_reads(bseat, run) == (before_text, before_binary)
    out = backfill(pg, config_file, "--restore", run)
    assert out.returncode == EXIT_USAGE and "has no preserved rows" in out.stderr


def raw_read_v1(seat, run: str, binary: bool) -> list[tuple]:
    """raw_read through the seat as a major-1 reader."""
    dsn = seat.dsn(application_name="v1-host")
    return raw_read(dsn, run, binary)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_a_major_1_read_of_a_backfilled_run_returns_the_originals_byte_for_byte(pg, bseat, config_file, binary):
    """After a backfill the stored rows are v2 (type and projected payload); a v1 host reading the run through
    the seat gets back exactly what it read before, from the preserved originals."""
    run = rid("v1-after")
    make_run(pg, run)
    before = raw_read_v1(bseat, run, binary)
    assert before == raw_read(pg.dsn(), run, binary)  # era 2: a v1 reader reads it as stored
    out = backfill(pg, config_file, "--runs", run)
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert raw_read(pg.dsn(), run, binary) != before  # rewritten in storage
    assert raw_read_v1(bseat, run, binary) == before
    # an event appended after the backfill (a v2 writer) has no original: read back through the codemap
    with psycopg.connect(bseat.dsn(), autocommit=True) as conn:
        conn.execute("INSERT INTO events VALUES (%s, %s, 99, %s, NULL, NULL, now(), NULL)",
                     (f"{run}-99", run, A.v1_to_v2["agent.reasoning.delta"]))
    last = raw_read_v1(bseat, run, False)[-1]
    assert last[3] == b"agent.reasoning.delta"


def test_converted_run_refuses_a_v1_writer_and_takes_v2_appends(pg, bseat, config_file):
    run = rid("writers")
    make_run(pg, run)
    assert backfill(pg, config_file, "--runs", run, "--no-progress").returncode == EXIT_OK
    insert = ("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
              "VALUES (%s, %s, %s, %s, '{}', now())")
    for dsn in (bseat.dsn(application_name="v1-host"), pg.dsn(user="host_user")):  # through the seat; direct
        with psycopg.connect(dsn, autocommit=True) as v1:
            with pytest.raises(psycopg.Error) as e:
                v1.execute(insert, (f"{run}-v1", run, 50, "agent.reasoning.delta"))
            assert e.value.sqlstate == ERRORS["era2_write_refused"].sqlstate
    with psycopg.connect(bseat.dsn(), autocommit=True) as v2:
        v2.execute(insert, (f"{run}-v2", run, 60, "agent.reasoning-delta"))
    assert direct(pg, "SELECT type FROM events WHERE run_id = %s AND sequence = 60", run) == \
        [("agent.reasoning-delta",)]
    # an event appended after the backfill has no era-2 spelling to go back to: the restore is refused
    before = whole_rows(pg, run)
    out = backfill(pg, config_file, "--restore", run)
    assert out.returncode == EXIT_REFUSED and "1 events appended after its backfill" in out.stderr
    assert whole_rows(pg, run) == before and era(pg, run) == 3 and len(originals(pg, run)) == len(LOG)


def test_a_run_that_would_fail_is_skipped_untouched(pg, config_file):
    bad, good = rid("bad"), rid("good")
    make_run(pg, bad, LOG[:2] + [("foo.bar", None, {}), ("run.started", None, {"engineVersion": "2.1.0"})])
    make_run(pg, good)
    before = whole_rows(pg, bad)
    out = backfill(pg, config_file, "--runs", bad, good)
    assert out.returncode == EXIT_REFUSED
    assert (f"skipped run {bad}: 2 of its 4 events would fail the reader rule; the first, at sequence 2: "
            f"event_type_unmapped: ") in out.stdout
    assert "converted 1 runs" in out.stdout and "event_type_unmapped: 1 runs" in out.stdout
    assert whole_rows(pg, bad) == before and era(pg, bad) == 2 and originals(pg, bad) == []
    assert era(pg, good) == 3


INVALID_LOG = [  # the reference host's shapes (issue 17 item 5): they read, but would not validate
    ("run.started", None, {"workflowId": "wf"}),
    ("node.started", "n-1", {"nodeId": "n-1"}),  # required typeId missing
    ("run.completed", None, {"output": {"answer": 42}}),  # output boxed, required outputs missing
]


def test_a_run_with_schema_invalid_payloads_is_skipped_unless_the_operator_allows_it(pg, config_file):
    run = rid("invalid")
    make_run(pg, run, INVALID_LOG)
    before = whole_rows(pg, run)
    for args in ((), ("--dry-run",)):
        out = backfill(pg, config_file, "--runs", run, *args)
        assert out.returncode == EXIT_REFUSED, out.stdout + out.stderr
        assert (f"skipped run {run}: 2 of its 3 events would be written schema-invalid (their v2 definition "
                f"requires a key nothing in the row provides); the first, at sequence 1: node.started without "
                f"typeId; --allow-schema-invalid writes them as they read") in out.stdout
        assert "schema_invalid: 1 runs" in out.stdout
        assert whole_rows(pg, run) == before and era(pg, run) == 2 and originals(pg, run) == []
    out = backfill(pg, config_file, "--runs", run, "--allow-schema-invalid", "--dry-run")
    assert out.returncode == EXIT_OK and "schema-invalid payloads that would be written (--allow-schema-invalid): " \
        "2 events" in out.stdout
    assert whole_rows(pg, run) == before and era(pg, run) == 2
    out = backfill(pg, config_file, "--runs", run, "--allow-schema-invalid")
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert "schema-invalid payloads written (--allow-schema-invalid): 2 events" in out.stdout
    assert era(pg, run) == 3 and [o[3] for o in originals(pg, run)] == before


def test_allow_schema_invalid_does_not_apply_to_restore(pg, config_file):
    out = backfill(pg, config_file, "--restore", "nothing", "--allow-schema-invalid")
    assert out.returncode == EXIT_USAGE and "--allow-schema-invalid does not apply to --restore" in out.stderr


def test_dry_run_changes_nothing(pg, config_file):
    run = rid("dry")
    make_run(pg, run)
    before = whole_rows(pg, run)
    out = backfill(pg, config_file, "--runs", run, "--dry-run")
    assert out.returncode == EXIT_OK, out.stderr
    assert "dry run: would convert 1 runs (4 of their 6 events would be rewritten); nothing was changed" in out.stdout
    assert whole_rows(pg, run) == before and era(pg, run) == 2 and originals(pg, run) == []


def test_refusals_before_anything_changes(pg, config_file):
    run = rid("refuse")
    make_run(pg, run)
    before = whole_rows(pg, run)
    out = backfill(pg, config_file, "--runs", run, "no-such-run")
    assert out.returncode == EXIT_USAGE and "name no run" in out.stderr and "'no-such-run'" in out.stderr
    out = backfill(pg, config_file, "--runs", run, user="host_user")
    assert out.returncode == EXIT_UNAVAILABLE and "must connect as the owner of openwop_seat" in out.stderr
    out = backfill(pg, config_file, "--restore", run)
    assert out.returncode == EXIT_USAGE and "has no preserved rows" in out.stderr
    out = backfill(pg, config_file, "--runs", run, "--batch", "0")
    assert out.returncode == EXIT_USAGE
    out = subprocess.run([sys.executable, "-m", "proxy", "backfill", "--dsn", pg.dsn()], capture_output=True,
                         text=True, cwd=ROOT, env=_env(), timeout=60)
    assert out.returncode == EXIT_USAGE and "one of the arguments --runs --all --restore is required" in out.stderr
    assert whole_rows(pg, run) == before and era(pg, run) == 2
    # the host's own role cannot rewrite types by naming the run itself: the guard admits only the owner
    with psycopg.connect(pg.dsn(user="host_user")) as host:
        host.execute("SELECT set_config('openwop_seat.rewrite_run', %s, true)", (run,))
        with pytest.raises(psycopg.Error) as e:
            host.execute("UPDATE events SET type = 'agent.reasoning-delta' WHERE run_id = %s", (run,))
        assert e.value.sqlstate == "42501"


# --- a crash in the middle, and appends during the backfill ---------------------------------------


def _backend_blocked_by(pg, holder_pid: int) -> bool:
    """The backfill's session waits on a lock ``holder_pid`` holds (not any lock: under load it can wait briefly
    on a relation's extension or on autovacuum before it reaches the held row)."""
    return bool(direct(pg, "SELECT 1 FROM pg_stat_activity WHERE application_name = 'openwop-seat backfill' "
                           "AND %s = ANY (pg_blocking_pids(pid))", holder_pid))


def _backend_gone(pg) -> bool:
    return not direct(pg, "SELECT 1 FROM pg_stat_activity WHERE application_name = 'openwop-seat backfill'")


def wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_kill_9_mid_way_leaves_runs_whole_and_a_rerun_finishes(pg, config_file):
    runs = sorted(rid("kill") for _ in range(6))
    for run in runs:
        make_run(pg, run)
    before = {run: whole_rows(pg, run) for run in runs}
    blocked = runs[3]
    # Hold a row lock on an event the backfill must rewrite: it blocks inside run 3's transaction, after it has
    # preserved the run's rows and while its UPDATE is under way.
    holder = psycopg.connect(pg.dsn())
    try:
        holder.execute("SELECT 1 FROM events WHERE run_id = %s AND sequence = 1 FOR UPDATE", (blocked,))
        proc = subprocess.Popen(backfill_cmd(pg, config_file, "--runs", *runs), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=ROOT, env=_env())
        try:
            wait_for(lambda: _backend_blocked_by(pg, holder.info.backend_pid), "the backfill to block on run 3")
            assert direct(pg, "SELECT count(*) FROM openwop_seat.events_v1_original WHERE run_id = %s",
                          blocked) == [(0,)]  # its transaction's rows are not visible: not committed
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
            else:
                proc.communicate()
    finally:
        holder.rollback()
        holder.close()
    assert proc.returncode == -signal.SIGKILL
    wait_for(lambda: _backend_gone(pg), "the killed backfill's server session to end")
    for i, run in enumerate(runs):
        if i < 3:  # converted before the kill: wholly
            assert era(pg, run) == 3 and len(originals(pg, run)) == len(LOG), run
            assert [o[3] for o in originals(pg, run)] == before[run]
            assert whole_rows(pg, run) != before[run]
        else:  # the one in flight and those after it: untouched
            assert era(pg, run) == 2 and originals(pg, run) == [], run
            assert whole_rows(pg, run) == before[run]
    out = backfill(pg, config_file, "--runs", *runs)
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert "converted 3 runs" in out.stdout and "already era 3: 3 runs" in out.stdout
    for run in runs:
        assert era(pg, run) == 3 and [o[3] for o in originals(pg, run)] == before[run]


def test_concurrent_major2_appends_all_land_in_the_right_vocabulary(pg, bseat, config_file):
    runs = [rid("conc") for _ in range(12)]
    for run in runs:
        make_run(pg, run)
    v2_name = A.v1_to_v2["agent.reasoning.delta"]
    assert v2_name != "agent.reasoning.delta"
    appended: list[tuple[str, int]] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def append() -> None:
        try:
            with psycopg.connect(bseat.dsn(), autocommit=True) as v2:  # major 2 through the seat
                seqs = {run: 100 for run in runs}
                for n in range(3000):  # bounded; ends when the backfill has exited
                    if stop.is_set() and n % len(runs) == 0:
                        return
                    run = runs[n % len(runs)]
                    v2.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                               "VALUES (%s, %s, %s, %s, 'n-1', %s::jsonb, now())",
                               (f"{run}-a{seqs[run]}", run, seqs[run], v2_name,
                                json.dumps({"agentId": "a", "delta": "d", "sequence": seqs[run]})))
                    appended.append((run, seqs[run]))
                    seqs[run] += 1
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    thread = threading.Thread(target=append)
    thread.start()
    try:
        wait_for(lambda: len(appended) >= len(runs), "the first appends")
        out = backfill(pg, config_file, "--runs", *runs, "--batch", "3")
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and errors == []
    assert out.returncode == EXIT_OK, out.stdout + out.stderr
    assert len(appended) > len(runs)
    for run in runs:
        assert era(pg, run) == 3
        stored = dict(direct(pg, "SELECT sequence, type FROM events WHERE run_id = %s", run))
        mine = [seq for r, seq in appended if r == run]
        # every append is there, under its v2 name: rewritten by the backfill if it came first, stored so if after
        assert all(stored[seq] == v2_name for seq in mine), run
        assert "agent.reasoning.delta" not in stored.values()
        # and a major-2 reader sees every one of them under its v2 name
        text, _ = seat_reads(bseat, run)
        assert [r[3].decode() for r in text if int(r[2]) >= 100] == [v2_name] * len(mine)
