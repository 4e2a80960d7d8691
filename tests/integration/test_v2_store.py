"""The v2 store (ADR 0015): filled runs read from ``events_v2_store``, and never differently from the translation
computed at read time (``events_m2_live``, ADR 0011), whatever writes the host's tables meanwhile.

The oracle: for a run, ``SELECT * FROM openwop_seat.events_m2 WHERE run_id = … ORDER BY sequence`` gives the same
rows as the same statement over ``events_m2_live``, or the same refusal (SQLSTATE, message, DETAIL). Each test
also shows that the store is what was read, where it says so: a store row changed by hand shows through.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_projection_compiled import REFERENCE_HOST
from test_projection_property import PROPERTY, rows

from harness import HOST_SCHEMA, PASSWORD
from proxy.artifacts.load import load_artifacts
from proxy.config import Config, HostConfig
from proxy.db.layout import STEPS
from proxy.db.migrate import migrate as db_migrate
from proxy.readpath.classify import Classifier

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = load_artifacts()
FIXTURES = [ROOT / "tests" / "fixtures" / name / "cases.json"
            for name in ("payload-projection-v1", "payload-projection-v2")]
_names = itertools.count()


@contextmanager
def host_db(pg, suffix: str, config: Config = Config()):
    """A database of its own: the host's tables and the seat's schema (migrate with ``config``); dropped after."""
    name = f"ow_store_{suffix}_{os.getpid()}"
    pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)
    pg.psql(f"CREATE DATABASE {name}")
    try:
        pg.psql(HOST_SCHEMA, dbname=name)
        asyncio.run(db_migrate(pg.dsn(dbname=name), config, ARTIFACTS, out=lambda _line: None))
        yield name
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


@pytest.fixture(scope="module")
def db(pg):
    with host_db(pg, "m") as name:
        yield name


@pytest.fixture
def conn(pg, db):
    with psycopg.connect(pg.dsn(dbname=db), autocommit=True) as c:
        yield c


def new_run(conn, events, tenant: str | None = "acme") -> str:
    run = f"store-run-{next(_names)}"
    if tenant is not None:
        conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, %s)", (run, tenant))
    for seq, (t, payload, node) in enumerate(events, 1):
        append(conn, run, seq, t, payload, node)
    return run


def append(conn, run, seq, t, payload, node=None) -> None:
    conn.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                 "VALUES (%s, %s, %s, %s, %s, %s::jsonb, '2026-01-01')",
                 (f"{run}-{seq}", run, seq, t, node, None if payload is None else json.dumps(payload)))


def read(conn, rel: str, run: str):
    try:
        with conn.transaction():
            args = (run, run) if "%s" in rel else (run,)
            return "ok", conn.execute(f"SELECT *, payload::text FROM openwop_seat.{rel} WHERE run_id = %s "
                                      f"ORDER BY sequence", args).fetchall()
    except psycopg.Error as e:
        return "error", e.sqlstate, e.diag.message_primary, e.diag.message_detail


def same(conn, run: str):
    """The run as events_m2 reads it, asserted equal to the live translation; and as events_m2_run(run) reads it
    (what the classifier substitutes for a level that names its run, ADR 0015 decision 7)."""
    stored, live = read(conn, "events_m2", run), read(conn, "events_m2_live", run)
    assert stored == live, run
    per_run = read(conn, "events_m2_run(%s) AS events", run)
    if per_run != live and per_run[:2] == live[:2] == ("error", per_run[1]):
        # A run with more than one refused row: which one a read names depends on the order PostgreSQL evaluates
        # the rows in, its plan's; the read must still be refused, for a row the live translation refuses.
        assert per_run[1:] in row_refusals(conn, run), (run, per_run)
    else:
        assert per_run == live, run
    return stored


def row_refusals(conn, run: str) -> list:
    """What the live translation says of each refused row of ``run`` alone: (sqlstate, message, detail)."""
    found = []
    for (seq,) in conn.execute("SELECT sequence FROM events WHERE run_id = %s ORDER BY sequence", (run,)).fetchall():
        try:
            with conn.transaction():
                conn.execute("SELECT *, payload::text FROM openwop_seat.events_m2_live WHERE run_id = %s "
                             "AND sequence = %s", (run, seq)).fetchall()
        except psycopg.Error as e:
            found.append((e.sqlstate, e.diag.message_primary, e.diag.message_detail))
    return found


def fill(conn, run: str) -> str:
    return conn.execute("SELECT openwop_seat.store_fill(%s)", (run,)).fetchone()[0]


def stored(conn, run: str) -> int:
    return conn.execute("SELECT count(*) FROM openwop_seat.events_v2_store WHERE run_id = %s", (run,)).fetchone()[0]


def refused(conn, run: str) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM openwop_seat.events_v2_refused WHERE run_id = %s)",
                        (run,)).fetchone()[0]


def upto(conn, run: str):
    """The run's mark: how far the store holds it (None: not marked)."""
    row = conn.execute("SELECT upto FROM openwop_seat.events_v2_runs WHERE run_id = %s", (run,)).fetchone()
    return None if row is None else row[0]


def store_xmins(conn, run: str) -> dict[int, str]:
    """sequence -> the xmin of the store's copy: which transaction wrote each copy."""
    return dict(conn.execute("SELECT sequence, xmin::text FROM openwop_seat.events_v2_store WHERE run_id = %s",
                             (run,)).fetchall())


def filled(conn, run: str) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM openwop_seat.events_v2_runs WHERE run_id = %s)",
                        (run,)).fetchone()[0]


def tamper(conn, run: str) -> None:
    """Change the store's copy of the run's rows by hand: a read that shows it read the store."""
    conn.execute("UPDATE openwop_seat.events_v2_store SET node_id = 'from-the-store' WHERE run_id = %s", (run,))


def read_store_node_ids(conn, run: str) -> set:
    seen = {r[0] for r in conn.execute("SELECT node_id FROM openwop_seat.events_m2 WHERE run_id = %s", (run,))}
    per_run = {r[0] for r in conn.execute("SELECT node_id FROM openwop_seat.events_m2_run(%s) e WHERE run_id = %s",
                                          (run, run))}
    assert per_run == seen, (per_run, seen)
    return seen


# --- the oracle ---------------------------------------------------------------------------------------------


@settings(PROPERTY, max_examples=120)
@given(st.lists(rows(), min_size=1, max_size=6), st.sampled_from(["acme", "", None]))
def test_a_filled_run_reads_as_the_live_translation_on_generated_rows(conn, events, tenant):
    run = new_run(conn, [(t, payload, node) for t, _v2, payload, node, _tenant in events], tenant)
    before = same(conn, run)
    assert fill(conn, run) == ("filled" if before[0] == "ok" else "refused")
    assert same(conn, run) == before
    assert stored(conn, run) == (len(events) if before[0] == "ok" else 0)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.parent.name)
def test_a_filled_run_reads_as_the_live_translation_on_the_frozen_fixtures(conn, path):
    cases = json.loads(path.read_text())["cases"]
    assert cases
    for case in cases:
        event = case["event"]
        run = new_run(conn, [(event["type"], event["payload"], event.get("nodeId"))], case.get("tenantId"))
        before = same(conn, run)
        assert fill(conn, run) == ("filled" if before[0] == "ok" else "refused")
        assert same(conn, run) == before


def test_the_reference_host_shapes_are_stored_projected_and_read_from_the_store(conn):
    run = new_run(conn, REFERENCE_HOST)
    before = same(conn, run)
    assert before[0] == "ok" and len(before[1]) == len(REFERENCE_HOST)
    assert fill(conn, run) == "filled" and stored(conn, run) == len(REFERENCE_HOST)
    assert same(conn, run) == before
    tamper(conn, run)
    assert read_store_node_ids(conn, run) == {"from-the-store"}  # read from the store, not computed


def test_a_run_with_a_refused_row_is_left_out_and_refused_exactly_as_live_until_its_next_write(conn):
    for bad in [("no.such.type", {}, None), ("vendor.nope.x", [], None)]:
        run = new_run(conn, [REFERENCE_HOST[0], bad, REFERENCE_HOST[1]])
        live = same(conn, run)
        assert live[0] == "error" and live[1] == "OW001"
        assert fill(conn, run) == "refused" and stored(conn, run) == 0 and refused(conn, run)
        assert run not in {r[0] for r in conn.execute("SELECT openwop_seat.store_pending(100000)")}
        assert same(conn, run) == live
        conn.execute("DELETE FROM events WHERE run_id = %s AND sequence = 2", (run,))  # the operator's repair
        assert not refused(conn, run)
        assert fill(conn, run) == "filled" and same(conn, run)[0] == "ok"


def test_era3_runs_and_unfilled_runs_read_live(conn):
    run = new_run(conn, REFERENCE_HOST[:3])
    assert same(conn, run)[0] == "ok" and not filled(conn, run)
    conn.execute("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES (%s, 3, 'test')", (run,))
    assert fill(conn, run) == "era3" and stored(conn, run) == 0 and not filled(conn, run)
    same(conn, run)


# --- writes after a fill ------------------------------------------------------------------------------------


def test_an_append_above_the_mark_keeps_it_and_the_appended_rows_read_live(conn, pg, db):
    """READ COMMITTED (the host's usual): an append above the run's mark leaves it; the store's rows are read up to
    the mark and the appended ones at read time (a tampered store shows which is which)."""
    run = new_run(conn, REFERENCE_HOST[:3])
    assert fill(conn, run) == "filled" and upto(conn, run) == 3
    tamper(conn, run)
    with psycopg.connect(pg.dsn(dbname=db)) as w:
        append(w, run, 4, "run.completed", {"output": {"text": "late"}})
        assert upto(w, run) == 3  # kept, in the writing transaction too
        w.commit()
    assert upto(conn, run) == 3 and stored(conn, run) == 3
    assert read_store_node_ids(conn, run) == {"from-the-store", None}  # rows 1-3 from the store, 4 live
    page = conn.execute(PAGE, (run, run, 2, 10)).fetchall()
    assert [(r[2], r[4]) for r in page] == [(3, "from-the-store"), (4, None)]


def test_an_append_above_the_mark_that_the_reader_rule_refuses_refuses_the_run_as_live(conn):
    """The appended row is read at read time: refused exactly as the live translation refuses it (OW001), for
    a page that reaches it; never a page with it left out. The fill records the run refused and unmarks it."""
    run = new_run(conn, REFERENCE_HOST[:3])
    fill(conn, run)
    append(conn, run, 4, "no.such.type", {})
    assert upto(conn, run) == 3
    assert same(conn, run)[:2] == ("error", "OW001")
    page = "SELECT * FROM openwop_seat.{} WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s"
    for after, limit in ((0, 100), (3, 1), (2, 5), (0, 3), (4, 10)):
        per_run, view = read_page(conn, PAGE, (run, run, after, limit)), \
            read_page(conn, page.format("events_m2"), (run, after, limit))
        live = read_page(conn, page.format("events_m2_live"), (run, after, limit))
        assert view == live, (after, limit)
        if after < 4 and after + limit > 3:  # a page that reaches the row: refused, by all three
            assert per_run == live and live[0] == "error" and live[1] == "OW001", (after, limit)
        else:  # one that stops before it: events_m2_run may refuse it too when its plan sorts the arms' rows (as
            # for a run not filled, before this change), never answer another page
            assert per_run == live or per_run[:2] == ("error", "OW001"), (after, limit)
        # the page form (ADR 0015, page plans): the same, and it reads the live arm's first row above the mark
        # when the page ends in the store's range (the merge's look-ahead): refused there too, never another page
        form = page_form()
        keys = {"$1": run, "$2": after, "$3": limit}
        paged = read_page(conn, re.sub(r"\$[123]", "%s", form), tuple(keys[k] for k in re.findall(r"\$[123]", form)))
        if after < 4 and after + limit > 3:
            assert paged == live, (after, limit)
        else:
            assert paged == live or paged[:2] == ("error", "OW001"), (after, limit)
    assert fill(conn, run) == "refused" and not filled(conn, run) and refused(conn, run) and stored(conn, run) == 0
    assert same(conn, run)[:2] == ("error", "OW001")
    conn.execute("DELETE FROM events WHERE run_id = %s AND sequence = 4", (run,))  # the operator's repair
    assert run in {r[0] for r in conn.execute("SELECT openwop_seat.store_pending(100000)")}
    assert fill(conn, run) == "filled"
    assert len(same(conn, run)[1]) == 3


def read_page(conn, sql: str, args):
    try:
        with conn.transaction():
            return "ok", conn.execute(sql, args).fetchall()
    except psycopg.Error as e:
        return "error", e.sqlstate, e.diag.message_primary, e.diag.message_detail


@settings(PROPERTY, max_examples=60)
@given(st.lists(rows(), min_size=1, max_size=4), st.lists(st.lists(rows(), min_size=1, max_size=3), max_size=3))
def test_appends_after_a_fill_keep_the_mark_and_read_as_the_live_translation(conn, prefix, tails):
    """The oracle at every step of an active run: filled, then rows appended above the mark (read live), then an
    incremental fill that copies only them, again and again."""
    run = new_run(conn, [(t, payload, node) for t, _v2, payload, node, _tenant in prefix])
    seq = len(prefix)
    before = same(conn, run)
    assert fill(conn, run) == ("filled" if before[0] == "ok" else "refused")
    for tail in tails:
        marked, copies = upto(conn, run), store_xmins(conn, run)
        for t, _v2, payload, node, _tenant in tail:
            seq += 1
            append(conn, run, seq, t, payload, node)
        assert upto(conn, run) == marked  # kept (or still none)
        got = same(conn, run)
        verdict = fill(conn, run)
        assert same(conn, run) == got
        if marked is None:  # refused before: filled whole once the log reads
            assert verdict == ("filled" if got[0] == "ok" else "refused")
        elif got[0] == "ok":
            assert verdict == "extended" and upto(conn, run) == seq
            now = store_xmins(conn, run)
            assert {k: v for k, v in now.items() if k <= marked} == copies  # the prefix's copies untouched
            assert sorted(now) == list(range(1, seq + 1))
            assert len({v for k, v in now.items() if k > marked}) == 1  # the tail, by one transaction
        else:  # the tail has a row the reader rule refuses
            assert verdict == "refused" and not filled(conn, run) and stored(conn, run) == 0


def test_a_fill_of_a_marked_run_with_nothing_above_its_mark_changes_nothing(conn):
    run = new_run(conn, REFERENCE_HOST[:3])
    assert fill(conn, run) == "filled"
    copies = store_xmins(conn, run)
    assert fill(conn, run) == "current" and store_xmins(conn, run) == copies and upto(conn, run) == 3
    assert run not in {r[0] for r in conn.execute("SELECT openwop_seat.store_pending(100000)")}
    append(conn, run, 4, *REFERENCE_HOST[3])
    assert run in {r[0] for r in conn.execute("SELECT openwop_seat.store_pending(100000)")}
    assert fill(conn, run) == "extended" and upto(conn, run) == 4 and stored(conn, run) == 4
    assert run not in {r[0] for r in conn.execute("SELECT openwop_seat.store_pending(100000)")}


def test_a_run_filled_empty_keeps_its_mark_for_its_first_appends(conn):
    run = new_run(conn, [])
    assert fill(conn, run) == "filled" and upto(conn, run) == -2**63
    append(conn, run, 1, *REFERENCE_HOST[0])
    assert upto(conn, run) == -2**63 and len(same(conn, run)[1]) == 1
    assert fill(conn, run) == "extended" and upto(conn, run) == 1 and len(same(conn, run)[1]) == 1


def test_store_fill_refuses_a_snapshot_older_than_its_lock(conn, pg, db):
    """A fill in a REPEATABLE READ transaction would read a snapshot taken before it took the run's lock (and miss
    an append committed in between): refused, nothing written."""
    run = new_run(conn, REFERENCE_HOST[:2])
    with psycopg.connect(pg.dsn(dbname=db)) as rr:
        rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.InvalidTransactionState, match="READ COMMITTED"):
            fill(rr, run)
    assert not filled(conn, run) and stored(conn, run) == 0


def test_under_repeatable_read_an_append_above_the_mark_unmarks_the_run_as_before(conn, pg, db):
    run = new_run(conn, REFERENCE_HOST[:3])
    fill(conn, run)
    for level in ("REPEATABLE READ", "SERIALIZABLE"):
        with psycopg.connect(pg.dsn(dbname=db)) as w:
            w.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            append(w, run, stored(conn, run) + 1, "node.started", {}, "n9")
            w.commit()
        assert not filled(conn, run), level
        got = same(conn, run)
        assert fill(conn, run) == "filled" and same(conn, run) == got


def test_an_insert_at_or_below_the_mark_unmarks_the_run(conn, pg, db):
    """A row inserted into the filled prefix (a gap in the sequence) is not in the store: the run is unmarked in
    the writing transaction, and reads live until filled again whole."""
    run = new_run(conn, [])
    for seq in (1, 2, 4):
        append(conn, run, seq, *REFERENCE_HOST[seq - 1])
    fill(conn, run)
    tamper(conn, run)
    with psycopg.connect(pg.dsn(dbname=db)) as w:
        append(w, run, 3, *REFERENCE_HOST[2])
        assert upto(w, run) is None
        assert upto(conn, run) == 4  # not committed yet: other readers still read the filled run
        w.commit()
    assert not filled(conn, run) and "from-the-store" not in read_store_node_ids(conn, run)
    got = same(conn, run)
    assert [r[2] for r in got[1]] == [1, 2, 3, 4]
    before = store_xmins(conn, run)
    assert fill(conn, run) == "filled" and upto(conn, run) == 4 and same(conn, run) == got
    assert not set(before.values()) & set(store_xmins(conn, run).values())  # written again, whole


def test_updates_and_deletes_of_a_filled_run_unmark_it(conn):
    for change in ("UPDATE events SET payload = '{\"output\": {\"text\": \"changed\"}}' "
                   "WHERE run_id = %s AND sequence = 2",
                   "UPDATE events SET sequence = 40 WHERE run_id = %s AND sequence = 3",
                   "UPDATE events SET node_id = 'elsewhere' WHERE run_id = %s AND sequence = 1",
                   "DELETE FROM events WHERE run_id = %s AND sequence = 3"):
        run = new_run(conn, REFERENCE_HOST[:4])
        fill(conn, run)
        conn.execute(change, (run,))
        assert not filled(conn, run), change
        got = same(conn, run)
        fill(conn, run)
        assert same(conn, run) == got


def test_deleting_a_runs_events_leaves_no_copy_in_the_store(conn, pg, db):
    """A host that deletes a run (retention, erasure) deletes the store's translated copy of its rows with it,
    in the same transaction: rolled back with it, and gone when it commits, filled or not at the time."""
    run = new_run(conn, REFERENCE_HOST)
    fill(conn, run)
    with psycopg.connect(pg.dsn(dbname=db)) as w:
        w.execute("DELETE FROM events WHERE run_id = %s", (run,))
        w.rollback()
    assert stored(conn, run) == len(REFERENCE_HOST)  # rolled back with the delete
    # an unmark takes the run's rows out of the store with its mark (the store holds the marked runs' rows only)
    conn.execute("UPDATE events SET node_id = 'n9' WHERE run_id = %s AND sequence = 1", (run,))
    assert not filled(conn, run) and stored(conn, run) == 0
    assert fill(conn, run) == "filled" and stored(conn, run) == len(REFERENCE_HOST)
    conn.execute("DELETE FROM events WHERE run_id = %s AND sequence <= 2", (run,))
    assert not filled(conn, run) and stored(conn, run) == 0
    assert fill(conn, run) == "filled" and stored(conn, run) == len(REFERENCE_HOST) - 2
    conn.execute("DELETE FROM events WHERE run_id = %s", (run,))
    assert stored(conn, run) == 0 and same(conn, run) == ("ok", [])


# Every way a run leaves the store: the writer's statement, the isolation level it runs in.
UNMARKS = [
    ("UPDATE events SET payload = '{\"output\": {\"text\": \"changed\"}}' WHERE run_id = %(run)s AND sequence = 2",
     "READ COMMITTED"),
    ("DELETE FROM events WHERE run_id = %(run)s AND sequence = 3", "READ COMMITTED"),
    ("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
     "VALUES (%(run)s || '-0', %(run)s, 0, 'node.started', '{}', '2026-01-01')", "READ COMMITTED"),  # below the mark
    ("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
     "VALUES (%(run)s || '-9', %(run)s, 9, 'node.started', '{}', '2026-01-01')", "REPEATABLE READ"),
    ("INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) "
     "VALUES (%(run)s || '-9', %(run)s, 9, 'node.started', '{}', '2026-01-01')", "SERIALIZABLE"),
    ("UPDATE runs SET tenant_id = 'globex' WHERE run_id = %(run)s", "READ COMMITTED"),
    ("DELETE FROM runs WHERE run_id = %(run)s", "READ COMMITTED"),
    ("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES (%(run)s, 3, 'test')", "READ COMMITTED"),
]


@pytest.mark.parametrize("change, level", UNMARKS)
def test_every_unmark_takes_the_runs_rows_out_of_the_store_in_the_writers_transaction(conn, pg, db, change, level):
    """The store holds exactly the marked runs' rows up to their marks (events_v2_filled reads it without a join
    to the marks): a write that unmarks a run deletes its rows from the store in the same transaction. Until it
    commits, other readers still read the filled run whole (mark and rows); after, neither; rolled back, both
    stay. Then the run reads as the live translation, and fills again."""
    run = new_run(conn, REFERENCE_HOST[:4])
    assert fill(conn, run) == "filled" and stored(conn, run) == 4
    for commit in (False, True):
        with psycopg.connect(pg.dsn(dbname=db)) as w:
            w.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            w.execute(change, {"run": run})
            assert not filled(w, run) and stored(w, run) == 0, change
            assert upto(conn, run) == 4 and stored(conn, run) == 4  # not committed: read as filled
            w.commit() if commit else w.rollback()
        if not commit:
            assert upto(conn, run) == 4 and stored(conn, run) == 4, change
    assert not filled(conn, run) and stored(conn, run) == 0, change
    got = same(conn, run)
    if "run_era" not in change:
        assert fill(conn, run) == "filled" and stored(conn, run) == len(got[1]) and same(conn, run) == got


def test_an_append_above_the_mark_under_read_committed_keeps_the_runs_rows(conn):
    run = new_run(conn, REFERENCE_HOST[:3])
    fill(conn, run)
    before = store_xmins(conn, run)
    append(conn, run, 4, *REFERENCE_HOST[3])
    assert upto(conn, run) == 3 and store_xmins(conn, run) == before
    assert fill(conn, run) == "extended" and stored(conn, run) == 4
    assert {k: v for k, v in store_xmins(conn, run).items() if k <= 3} == before  # only the new row written


def test_a_row_at_the_greatest_bigint_is_never_copied_into_the_store(pg):
    """upto stays below the greatest bigint (so that the live arm starts at upto + 1): a fill leaves a row at
    the greatest bigint out of the store, and the run reads it once, live, beside the stored rows."""
    name = f"ow_store_big_{os.getpid()}"
    pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)
    pg.psql(f"CREATE DATABASE {name}")
    try:
        pg.psql(HOST_SCHEMA.replace("sequence integer", "sequence bigint"), dbname=name)
        asyncio.run(db_migrate(pg.dsn(dbname=name), Config(), ARTIFACTS, out=lambda _line: None))
        with psycopg.connect(pg.dsn(dbname=name), autocommit=True) as c:
            run = new_run(c, REFERENCE_HOST[:2])
            append(c, run, 2**63 - 1, *REFERENCE_HOST[2])
            assert fill(c, run) == "filled" and upto(c, run) == 2 and stored(c, run) == 2
            got = same(c, run)
            assert [r[2] for r in got[1]] == [1, 2, 2**63 - 1]
            page = "SELECT * FROM openwop_seat.{} WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s"
            live = read_page(c, page.format("events_m2_live"), (run, 0, 10))
            form = page_form()
            keys = {"$1": run, "$2": 0, "$3": 10}
            paged = read_page(c, re.sub(r"\$[123]", "%s", form), tuple(keys[k] for k in re.findall(r"\$[123]", form)))
            assert paged == live and len(live[1]) == 3, paged
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


def test_a_fill_committed_after_a_repeatable_read_writers_snapshot_makes_it_retry(conn, pg, db):
    """The writer's snapshot predates the fill: its unmark would not see the mark, so the mark's conflict check
    fails it (serialization failure); nothing stale is left. Without a fill in between it goes through."""
    run = new_run(conn, REFERENCE_HOST[:3])
    with psycopg.connect(pg.dsn(dbname=db)) as rr:
        rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT count(*) FROM runs").fetchone()  # the snapshot
        assert fill(conn, run) == "filled"
        with pytest.raises(psycopg.errors.SerializationFailure):
            append(rr, run, 4, "node.started", {}, "n4")
        rr.rollback()
        rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        append(rr, run, 4, "node.started", {}, "n4")
        rr.commit()
    assert not filled(conn, run) and len(same(conn, run)[1]) == 4


def test_a_tenant_change_unmarks_the_run_and_reads_the_new_tenant(conn, pg, db):
    run = new_run(conn, REFERENCE_HOST[:2])
    fill(conn, run)
    before = same(conn, run)
    conn.execute("UPDATE runs SET tenant_id = 'globex' WHERE run_id = %s", (run,))
    assert not filled(conn, run)
    after = same(conn, run)
    assert after != before and "globex" in after[1][0][-1]
    fill(conn, run)
    assert same(conn, run) == after and filled(conn, run)
    # under REPEATABLE READ, a fill committed after the writer's snapshot: a serialization failure
    with psycopg.connect(pg.dsn(dbname=db)) as rr:
        rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT 1 FROM runs LIMIT 1").fetchone()
        conn.execute("DELETE FROM openwop_seat.events_v2_runs WHERE run_id = %s", (run,))
        assert fill(conn, run) == "filled"
        with pytest.raises(psycopg.errors.SerializationFailure):
            rr.execute("UPDATE runs SET tenant_id = 'initech' WHERE run_id = %s", (run,))
        rr.rollback()
    assert same(conn, run) == after
    conn.execute("DELETE FROM runs WHERE run_id = %s", (run,))
    assert not filled(conn, run)
    same(conn, run)


def test_a_stamp_and_an_unstamp_take_the_run_out_of_the_store(conn):
    run = new_run(conn, REFERENCE_HOST[:3])
    fill(conn, run)
    conn.execute("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES (%s, 3, 'test')", (run,))
    assert not filled(conn, run)
    same(conn, run)
    conn.execute("DELETE FROM openwop_seat.run_era WHERE run_id = %s", (run,))
    assert fill(conn, run) == "filled"
    same(conn, run)


def test_truncate_empties_the_store(pg):
    with host_db(pg, "t") as name, psycopg.connect(pg.dsn(dbname=name), autocommit=True) as c:
        run = new_run(c, REFERENCE_HOST[:3])
        fill(c, run)
        c.execute("TRUNCATE events")
        assert c.execute("SELECT count(*) FROM openwop_seat.events_v2_store").fetchone()[0] == 0
        assert not filled(c, run)
        assert same(c, run) == ("ok", [])


def test_with_a_store_trigger_disabled_every_read_is_live(conn):
    run = new_run(conn, REFERENCE_HOST[:3])
    fill(conn, run)
    tamper(conn, run)
    assert read_store_node_ids(conn, run) == {"from-the-store"}
    try:
        conn.execute("ALTER TABLE events DISABLE TRIGGER zz_openwop_seat_store")
        assert read_store_node_ids(conn, run) == {None, "n1"}  # the host's rows, translated at read time
        conn.execute("UPDATE events SET node_id = 'n7' WHERE run_id = %s AND sequence = 1", (run,))  # unseen
        assert filled(conn, run)
    finally:
        conn.execute("ALTER TABLE events ENABLE TRIGGER zz_openwop_seat_store")
    assert read_store_node_ids(conn, run) == {"from-the-store"}  # documented: unmark the run after such writes
    assert fill(conn, run) == "current"  # a fill of a marked run copies only rows above its mark: none here
    conn.execute("DELETE FROM openwop_seat.events_v2_runs WHERE run_id = %s", (run,))
    assert fill(conn, run) == "filled"
    assert "n7" in read_store_node_ids(conn, run) and len(same(conn, run)[1]) == 3


def test_migrate_installing_again_empties_the_store(pg):
    with host_db(pg, "i") as name, psycopg.connect(pg.dsn(dbname=name), autocommit=True) as c:
        run = new_run(c, REFERENCE_HOST[:3])
        fill(c, run)
        decl = ROOT / "config" / "reference-host-declarations.toml"
        said = asyncio.run(db_migrate(pg.dsn(dbname=name), Config(host=HostConfig(declarations_file=str(decl))),
                                      ARTIFACTS, out=lambda _line: None))
        assert any(line.startswith("emptied the v2 store of 1 filled runs") for line in said), said
        assert not filled(c, run) and stored(c, run) == 0
        got = same(c, run)
        assert '"typeId": "legacy.unrecorded"' in got[1][1][-1]  # the declarations apply, live
        fill(c, run)
        assert same(c, run) == got


def test_layout_step_10_upgrades_a_layout_9_database(pg):
    """A database at layout 9 with a filled run (the store's tables as layout 9's migrate generated them): the
    step gives the old mark an upto that keeps it true (every later append below the greatest bigint unmarks
    it, as before); migrate then applies it, installs the generated objects again (emptying the store), and
    the run reads as live and fills with its real upto."""
    name = f"ow_store_l9_{os.getpid()}"
    pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)
    pg.psql(f"CREATE DATABASE {name}")
    try:
        pg.psql(HOST_SCHEMA, dbname=name)
        pg.psql("".join(step.sql for step in STEPS[:9])
                + "INSERT INTO openwop_seat.meta (key, value) VALUES ('layout_version', '9');"
                + "CREATE TABLE openwop_seat.events_v2_runs (run_id text PRIMARY KEY, "
                  "filled_at timestamptz NOT NULL DEFAULT now());"
                + "CREATE TABLE openwop_seat.events_v2_store (LIKE events, PRIMARY KEY (run_id, sequence));",
                dbname=name)
        with psycopg.connect(pg.dsn(dbname=name), autocommit=True) as c:
            run = "layout-9-run"
            c.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (run,))
            for seq, (t, payload, node) in enumerate(REFERENCE_HOST[:3], 1):
                append(c, run, seq, t, payload, node)
            c.execute("INSERT INTO openwop_seat.events_v2_runs (run_id) VALUES (%s)", (run,))
            with c.transaction(force_rollback=True):
                c.execute(STEPS[9].sql)
                assert upto(c, run) == 2**63 - 2
            said = asyncio.run(db_migrate(pg.dsn(dbname=name), Config(), ARTIFACTS, out=lambda _line: None))
            assert said[0] == f"applied step 10: {STEPS[9].description}", said
            assert any(line.startswith("emptied the v2 store of 1 filled runs") for line in said), said
            assert c.execute("SELECT value FROM openwop_seat.meta WHERE key = 'layout_version'").fetchone() == ("10",)
            assert not filled(c, run)
            got = same(c, run)
            assert fill(c, run) == "filled" and upto(c, run) == 3 and same(c, run) == got
            append(c, run, 4, *REFERENCE_HOST[3])
            assert upto(c, run) == 3 and len(same(c, run)[1]) == 4
    finally:
        pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


def test_without_the_store_events_m2_is_the_live_view(pg):
    with host_db(pg, "off", Config(host=HostConfig(store=False))) as name:
        assert pg.psql("SELECT to_regclass('openwop_seat.events_v2_store') IS NULL, "
                       "to_regclass('openwop_seat.events_m2_live') IS NULL, "
                       "(SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'zz_openwop_seat_store%')",
                       dbname=name).strip() == "t|t|0"


def test_the_store_is_not_readable_by_the_host_role_and_pending_names_no_run_to_a_role_without_runs(pg, db, conn):
    run = new_run(conn, REFERENCE_HOST[:2])
    del run
    with psycopg.connect(pg.dsn(dbname=db, user="md5_user", password=PASSWORD)) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT * FROM openwop_seat.events_v2_store")
        c.rollback()
        assert c.execute("SELECT count(*) FROM openwop_seat.store_pending(100)").fetchone()[0] == 0


def test_the_marks_and_the_filled_rows_show_nothing_to_a_role_without_select_on_the_events_table(conn):
    """events_v2_marked and events_v2_filled are readable by PUBLIC (the per-run function is inlined into the reader's
    query): both are gated by the reader's SELECT on the events table (the marks by nothing else: run ids and
    sequence numbers, not rows; the net's gate is the store rows' and the live arm's)."""
    run = new_run(conn, REFERENCE_HOST[:3])
    assert fill(conn, run) == "filled"
    conn.execute("DO $$ BEGIN CREATE ROLE store_nobody NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    conn.execute("DO $$ BEGIN CREATE ROLE store_reader NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    conn.execute("GRANT SELECT ON events TO store_reader")
    counts = "SELECT (SELECT count(*) FROM openwop_seat.events_v2_marked WHERE run_id = %s), " \
             "(SELECT count(*) FROM openwop_seat.events_v2_filled WHERE run_id = %s)"
    for role, expected in (("store_nobody", (0, 0)), ("store_reader", (1, 3))):
        with conn.transaction():
            conn.execute(f"SET LOCAL ROLE {role}")
            assert conn.execute(counts, (run, run)).fetchone() == expected, role


# --- a run's page: events_m2_run --------------------------------------------------------------------------


def executed_relations(conn, sql: str, args) -> dict[str, int]:
    """Relation name -> rows its scans returned, from EXPLAIN ANALYZE (what was read, not a time)."""
    (plan,) = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", args).fetchone()[0]
    out: dict[str, int] = {}

    def walk(node):
        if "Relation Name" in node:
            out[node["Relation Name"]] = out.get(node["Relation Name"], 0) + \
                node["Actual Rows"] * node["Actual Loops"] + node.get("Rows Removed by Filter", 0)
        assert node["Node Type"] != "Function Scan", node  # inlined: the caller's query, not a function call
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan["Plan"])
    return out


PAGE = "SELECT * FROM openwop_seat.events_m2_run(%s) AS events WHERE run_id = %s AND sequence > %s " \
       "ORDER BY sequence LIMIT %s"


def test_a_page_of_a_filled_run_reads_no_host_row(conn):
    """The filled arm's gate is a one-time filter: a filled run's page never scans the host's rows. (The store
    arm's gate is a join with the marks, whose plan may scan store rows of other runs: not asserted.)"""
    run = new_run(conn, REFERENCE_HOST)
    before = executed_relations(conn, PAGE, (run, run, 0, 100))
    assert before.get("events", 0) == len(REFERENCE_HOST), before  # unfilled: the host's rows, read live
    fill(conn, run)
    after = executed_relations(conn, PAGE, (run, run, 0, 100))
    assert after.get("events_v2_store", 0) >= len(REFERENCE_HOST) and after.get("events", 0) == 0, after  # no host row
    page = conn.execute(PAGE, (run, run, 2, 2)).fetchall()
    assert [r[2] for r in page] == [3, 4]
    assert page == conn.execute("SELECT * FROM openwop_seat.events_m2_live WHERE run_id = %s AND sequence > 2 "
                                "ORDER BY sequence LIMIT 2", (run,)).fetchall()


def test_the_per_run_function_shows_nothing_the_view_does_not_to_a_host_role(pg, db, conn):
    """Inlined, events_m2_run runs with the caller's rights: a login role reads a run's page through it, and
    neither it nor the views it reads show a row of a run after a write unmarked it (the store's stale copy)."""
    run = new_run(conn, REFERENCE_HOST[:3])
    fill(conn, run)
    conn.execute("GRANT SELECT ON events, runs TO md5_user")  # a host role (payload projection reads runs)
    try:
        with psycopg.connect(pg.dsn(dbname=db, user="md5_user", password=PASSWORD), autocommit=True) as c:
            assert same(c, run)[0] == "ok"
            conn.execute("UPDATE events SET node_id = 'n8' WHERE run_id = %s AND sequence = 1", (run,))  # unmarks
            assert same(c, run)[1][0][4] == "n8"
            assert c.execute("SELECT count(*) FROM openwop_seat.events_v2_filled WHERE run_id = %s",
                             (run,)).fetchone() == (0,)
            assert c.execute("SELECT count(*) FROM openwop_seat.events_v2_marked WHERE run_id = %s",
                             (run,)).fetchone() == (0,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute("SELECT * FROM openwop_seat.events_v2_store")
    finally:
        conn.execute("REVOKE SELECT ON events, runs FROM md5_user")
    with psycopg.connect(pg.dsn(dbname=db, user="md5_user", password=PASSWORD), autocommit=True) as c:
        # without SELECT on the events table: nothing, as events_m2 shows nothing
        assert c.execute("SELECT count(*) FROM openwop_seat.events_m2_run(%s) e", (run,)).fetchone() == (0,)


def test_the_page_statement_through_the_seat_reads_an_active_run_as_the_live_translation(start_seat, pg, conn, db):
    """Major 2 through the seat (psycopg and asyncpg, both prepared): the host's page statement of a run filled,
    then appended to above its mark, then extended, pages the same rows as the live translation at each step."""
    import asyncpg

    seat = start_seat(host={"dsn": pg.dsn(dbname=db), "store_fill_interval": 0})
    page = "SELECT * FROM events WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s"
    live = "SELECT * FROM openwop_seat.events_m2_live WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s"
    run = new_run(conn, REFERENCE_HOST[:4])

    async def by_asyncpg(args):
        c = await asyncpg.connect(seat.url(dbname=db))
        try:
            stmt = await c.prepare(page.replace("%s", "$1", 1).replace("%s", "$2", 1).replace("%s", "$3", 1))
            rows = await stmt.fetch(*args)
            return [tuple(json.loads(v) if k == "payload" else v for k, v in r.items()) for r in rows]
        finally:
            await c.close()

    def check(step):
        with psycopg.connect(seat.url(dbname=db), autocommit=True, prepare_threshold=0) as c:
            for after, limit in ((0, 100), (2, 3), (len(REFERENCE_HOST) - 2, 100)):
                want = conn.execute(live, (run, after, limit)).fetchall()
                for _ in range(7):  # past the server's switch to a cached generic plan
                    assert c.execute(page, (run, after, limit)).fetchall() == want, (step, after, limit)
                assert asyncio.run(by_asyncpg((run, after, limit))) == want, (step, after, limit)

    check("unfilled")
    fill(conn, run)
    check("filled")
    for seq in range(5, len(REFERENCE_HOST) + 1):
        append(conn, run, seq, *REFERENCE_HOST[seq - 1])
        assert upto(conn, run) == 4
        check(f"appended {seq}")
    assert fill(conn, run) == "extended"
    check("extended")


# --- a run's page: the two arms, each in order up to the limit -------------------------------------------------

HOST_PAGE = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence ASC LIMIT $3"


def page_form() -> str:
    """The host's page statement as the classifier sends it for a major-2 session (ADR 0015, page plans)."""
    text = Classifier(HostConfig(), 2, run_function=True, page_function=True).classify(HOST_PAGE).text
    assert "openwop_seat.events_v2_filled" in text and "openwop_seat.events_m2_run_live($1)" in text, text
    return text


def long_run(conn, length: int) -> str:
    """An era-2 run of ``length`` rows (three shapes the reader rule maps), appended in one statement."""
    run = f"store-run-{next(_names)}"
    conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (run,))
    conn.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                 "SELECT %s || '-' || s, %s, s, "
                 "(ARRAY['node.started', 'node.completed', 'memory.written'])[s %% 3 + 1], 'n1', "
                 "(ARRAY['{}', '{\"outputs\": {\"text\": \"T\"}}', '{\"tags\": [\"a\"]}'])[s %% 3 + 1]::jsonb, "
                 "'2026-01-01' FROM generate_series(1, %s) s", (run, run, length))
    return run


def test_a_page_of_a_long_run_reads_about_its_limit_from_each_arm_in_the_generic_plan(pg, db, conn):
    """Issue 22: through events_m2_run, the cached generic plan of the page statement sorted each arm's rows from
    $2 on (a 5-row page from the middle of a 3,000-row filled run read about 1,500 store rows). The page form reads
    each arm in index order and stops at the limit: here at most LIMIT rows of the arm that gives the page and one
    row (the merge's look-ahead) of the other, whatever the page's place in the run, filled or with rows above its
    mark; and it pages the same rows as the live translation. Rows counted from EXPLAIN ANALYZE, not timed."""
    run = long_run(conn, 3000)
    assert fill(conn, run) == "filled" and upto(conn, run) == 3000
    conn.execute("ANALYZE events")
    conn.execute("ANALYZE openwop_seat.events_v2_store")
    live = "SELECT * FROM openwop_seat.events_m2_live WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s"
    with psycopg.connect(pg.dsn(dbname=db), autocommit=True) as c:
        c.execute("SET plan_cache_mode = force_generic_plan")
        c.execute(f"PREPARE page(text, integer, bigint) AS {page_form()}")

        def page(after: int, limit: int):
            (plan,) = c.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE page({quote(run)}, {after}, {limit})"
                                ).fetchone()[0]
            read: dict[str, int] = {}

            def walk(node):
                if "Relation Name" in node:
                    read[node["Relation Name"]] = read.get(node["Relation Name"], 0) + \
                        node["Actual Rows"] * node["Actual Loops"] + node.get("Rows Removed by Filter", 0)
                for child in node.get("Plans", ()):
                    walk(child)

            walk(plan["Plan"])
            rows = c.execute(f"EXECUTE page({quote(run)}, {after}, {limit})").fetchall()
            assert rows == conn.execute(live, (run, after, limit)).fetchall(), (after, limit)
            return read, [r[2] for r in rows]

        for after in (0, 1500, 2995):
            read, seqs = page(after, 5)
            assert seqs == list(range(after + 1, after + 6)), seqs
            assert read.get("events_v2_store", 0) <= 5 and read.get("events", 0) == 0, (after, read)
        for seq in range(3001, 3004):  # above the mark: kept, read live
            append(conn, run, seq, "node.started", {}, "n1")
        assert upto(conn, run) == 3000
        for after, want in ((1500, range(1501, 1506)), (2998, range(2999, 3004)), (3000, range(3001, 3004))):
            read, seqs = page(after, 5)
            assert seqs == list(want), seqs
            assert read.get("events_v2_store", 0) <= 5 and read.get("events", 0) <= 5 + 1, (after, read)
            assert read.get("events_v2_store", 0) + read.get("events", 0) <= 5 + 1, (after, read)


def quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


# --- serve fills it -----------------------------------------------------------------------------------------


def test_serve_fills_the_store_in_the_background_and_counts_it(start_seat, pg, conn, db):
    runs = [new_run(conn, REFERENCE_HOST) for _ in range(3)]
    seat = start_seat(host={"dsn": pg.dsn(dbname=db), "store_fill_interval": 0.2})
    deadline = time.monotonic() + 30
    while not all(filled(conn, r) for r in runs):
        assert time.monotonic() < deadline, "the seat did not fill the store"
        time.sleep(0.2)
    with urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert re.search(r'openwop_seat_store_fill_runs_total\{result="filled"\} [1-9]', metrics), metrics
    for r in runs:
        same(conn, r)


def test_the_store_functions_refuse_bad_input_and_change_nothing(conn):
    """What a client may call itself: store_fill of no run, store_pending with a negative count, and the
    classifier's guard given a name that is not the host's events table."""
    before = conn.execute("SELECT count(*) FROM openwop_seat.events_v2_runs").fetchone()[0]
    assert fill(conn, None) == "missing"
    with pytest.raises(psycopg.errors.InvalidRowCountInLimitClause):
        conn.execute("SELECT openwop_seat.store_pending(-1)")
    with pytest.raises(psycopg.Error) as refused:
        conn.execute("SELECT openwop_seat.events_named('runs')")
    assert refused.value.sqlstate == "OW004" and "finds public.runs, not the host's events table" in str(refused.value)
    assert conn.execute("SELECT openwop_seat.events_named('events')").fetchone() == (True,)
    assert conn.execute("SELECT count(*) FROM openwop_seat.events_v2_runs").fetchone()[0] == before


def test_the_per_run_function_with_no_run_or_an_unknown_one_returns_nothing_and_changes_nothing(conn):
    run = new_run(conn, REFERENCE_HOST[:2])
    fill(conn, run)
    for arg in (None, "no-such-run", ""):
        assert conn.execute("SELECT count(*) FROM openwop_seat.events_m2_run(%s) e", (arg,)).fetchone() == (0,)
    with pytest.raises(psycopg.errors.UndefinedFunction):  # not a run id's type: PostgreSQL's own error
        conn.execute("SELECT * FROM openwop_seat.events_m2_run(42::bigint) e")
    assert filled(conn, run) and same(conn, run)[0] == "ok"


def test_the_page_form_through_the_seat_with_odd_parameter_types_and_limits(start_seat, pg, conn, db):
    """The page form (ADR 0015, page plans) repeats the level's WHERE and LIMIT in each arm, so the parameters'
    types are inferred in the arms too: a hostile client's casts and values must give what the live translation
    gives, and a bad LIMIT PostgreSQL's own error with the session usable after it."""
    seat = start_seat(host={"dsn": pg.dsn(dbname=db), "store_fill_interval": 0})
    run = new_run(conn, REFERENCE_HOST[:4])
    fill(conn, run)
    for seq in range(5, len(REFERENCE_HOST) + 1):  # rows above the mark: both arms give rows
        append(conn, run, seq, *REFERENCE_HOST[seq - 1])
    live = "SELECT * FROM openwop_seat.events_m2_live WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s"
    shapes = [  # (statement, its parameters' values, the live translation's (after, limit))
        ("SELECT * FROM events WHERE run_id = %s AND sequence > %s::numeric ORDER BY sequence LIMIT %s::bigint",
         (run, "3.5", 2), (3, 2)),
        ("SELECT * FROM events WHERE run_id = %s::text AND sequence > %s::int8 ORDER BY sequence ASC LIMIT %s",
         (run, 2, 10**6), (2, 10**6)),
        ("SELECT * FROM events WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s", (run, -5, 0), (-5, 0)),
        ("SELECT * FROM events WHERE %s = run_id AND %s < sequence ORDER BY sequence LIMIT %s", (run, 1, 3), (1, 3)),
        ("SELECT * FROM events WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s::numeric",
         (run, 0, "2.6"), (0, 3)),  # a numeric LIMIT is rounded, as PostgreSQL rounds it
    ]
    classifier = Classifier(HostConfig(), 2, run_function=True, page_function=True)
    for sql, _, _ in shapes:  # each is sent in the page form
        numbered = re.sub(r"%s", lambda m, n=itertools.count(1): f"${next(n)}", sql)
        assert "openwop_seat.events_m2_run_live(" in classifier.classify(numbered).text, sql
    with psycopg.connect(seat.url(dbname=db), autocommit=True, prepare_threshold=0) as c:
        for sql, args, (after, limit) in shapes:
            want = conn.execute(live, (run, after, limit)).fetchall()
            for _ in range(7):  # past the server's switch to a cached generic plan
                assert c.execute(sql, args).fetchall() == want, (sql, args)
        with pytest.raises(psycopg.errors.InvalidRowCountInLimitClause):
            c.execute("SELECT * FROM events WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s",
                      (run, 0, -1))
        assert c.execute(shapes[0][0], shapes[0][1]).fetchall() == conn.execute(live, (run, 3, 2)).fetchall()
