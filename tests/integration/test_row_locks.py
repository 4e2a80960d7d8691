"""Row locks on translated reads (issue 23 item 2, ADR 0017): ``SELECT … FROM events … FOR UPDATE`` (and ``FOR NO
KEY UPDATE``, ``FOR SHARE``, ``FOR KEY SHARE``, with ``NOWAIT`` or ``SKIP LOCKED``) in a session of major 2 or 1
locks the events table's stored rows and returns the translated rows.

The proof that a lock is held is another session's lock attempt with ``NOWAIT`` failing (``55P03``) while the
first transaction is open, and succeeding after it ends; a lock of a weaker strength that does not conflict goes
through. No timing: a blocked statement is observed through ``pg_stat_activity`` (its wait event), never by a
sleep. Sessions run as ``host_user`` (no BYPASSRLS), so the net (ADR 0009) holds them.
"""

from __future__ import annotations

import threading
import uuid

import asyncpg
import psycopg
import pytest

from proxy.artifacts.load import load_artifacts

A = load_artifacts()
RENAMED_V1 = sorted(A.renamed)[:6]
RENAMED_V2 = [A.v1_to_v2[t] for t in RENAMED_V1]
USER = "host_user"
STORED = {2: RENAMED_V1, 1: RENAMED_V2}  # what each run stores, and so what the other reader must not see
READ = {2: RENAMED_V2, 1: RENAMED_V1}  # what each reader reads
STRENGTHS = ["FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE"]
# PostgreSQL's conflict table: does a lock of the row strength conflict with a held one?
CONFLICTS = {
    "FOR KEY SHARE": {"FOR UPDATE"},
    "FOR SHARE": {"FOR NO KEY UPDATE", "FOR UPDATE"},
    "FOR NO KEY UPDATE": {"FOR SHARE", "FOR NO KEY UPDATE", "FOR UPDATE"},
    "FOR UPDATE": set(STRENGTHS),
}


@pytest.fixture(scope="module")
def lock_seat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1},
                                         {"application_name": "ops", "major": "raw"}]},
                      host={"check_interval": 3600})


@pytest.fixture(scope="module")
def runs(pg):
    """An era-2 run (stored in v1 spelling) for major 2, an era-3 run (stored in v2 spelling) for major 1."""
    tag = uuid.uuid4().hex[:8]
    era2, era3 = f"lock2-{tag}", f"lock3-{tag}"
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't'), (%s, 't')", (era2, era3))
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO events VALUES (%s, %s, %s, %s, 'n1', '{}'::jsonb, now(), NULL)",
                            [(f"{era2}-{i}", era2, i, t) for i, t in enumerate(STORED[2])]
                            + [(f"{era3}-{i}", era3, i, t) for i, t in enumerate(STORED[1])])
        conn.execute("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES (%s, 3, 'test')", (era3,))
    yield {2: era2, 1: era3}
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("DELETE FROM events WHERE run_id IN (%s, %s)", (era2, era3))
        conn.execute("DELETE FROM runs WHERE run_id IN (%s, %s)", (era2, era3))
        conn.execute("DELETE FROM openwop_seat.run_era WHERE run_id = %s", (era3,))


def connect(seat, major, **kw):
    name = {2: "app", 1: "v1-host", "raw": "ops"}[major]
    return psycopg.connect(seat.dsn(user=USER), application_name=name, **kw)


def locked_elsewhere(pg, run: str, sequence: int, strength: str = "FOR UPDATE") -> bool:
    """Does another session (direct, unclaimed) fail to take ``strength`` on the row at once (55P03)?"""
    with psycopg.connect(pg.dsn(user=USER), autocommit=True) as other:
        try:
            other.execute(f"SELECT 1 FROM events WHERE run_id = %s AND sequence = %s {strength} NOWAIT",
                          (run, sequence))
        except psycopg.errors.LockNotAvailable:
            return True
    return False


@pytest.mark.parametrize("major", [2, 1])
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("wait", ["", " NOWAIT", " SKIP LOCKED"])
@pytest.mark.parametrize("strength", STRENGTHS)
def test_a_row_lock_returns_translated_rows_and_holds_the_stored_rows(lock_seat, pg, runs, major, binary, wait,
                                                                     strength):
    run = runs[major]
    with connect(lock_seat, major) as conn:
        plain = conn.execute("SELECT * FROM events WHERE run_id = %s ORDER BY sequence", (run,),
                             binary=binary).fetchall()
        rows = conn.execute(f"SELECT * FROM events WHERE run_id = %s ORDER BY sequence {strength}{wait}", (run,),
                            binary=binary).fetchall()
        assert rows == plain  # the translated rows, as the same read without the lock
        assert [r[3] for r in rows] == READ[major]
        for held in STRENGTHS:  # the stored rows are locked at the strength asked for, no more
            assert locked_elsewhere(pg, run, 0, held) == (held in CONFLICTS[strength]), (strength, held)
        conn.rollback()
    assert not locked_elsewhere(pg, run, 0)


@pytest.mark.parametrize("major", [2, 1])
def test_nowait_and_skip_locked_between_two_translated_sessions(lock_seat, runs, major):
    run = runs[major]
    with connect(lock_seat, major) as holder, connect(lock_seat, major) as other:
        got = holder.execute("SELECT sequence, type FROM events WHERE run_id = %s AND sequence < 2 "
                             "ORDER BY sequence FOR UPDATE", (run,)).fetchall()
        assert got == [(0, READ[major][0]), (1, READ[major][1])]
        with pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute("SELECT type FROM events WHERE run_id = %s ORDER BY sequence FOR UPDATE NOWAIT", (run,))
        other.rollback()
        # SKIP LOCKED: the rows the holder locked are skipped, the others come back translated and locked
        rest = other.execute("SELECT sequence, type FROM events WHERE run_id = %s ORDER BY sequence "
                             "FOR UPDATE SKIP LOCKED", (run,)).fetchall()
        assert rest == [(i, READ[major][i]) for i in range(2, len(READ[major]))]
        # the queue pattern: the first unlocked row, LIMIT 1
        with connect(lock_seat, major) as third:
            first = third.execute("SELECT sequence, type FROM events e WHERE e.run_id = %s ORDER BY e.sequence "
                                  "LIMIT 1 FOR UPDATE OF e SKIP LOCKED", (run,)).fetchall()
            assert first == []  # every row is locked by one of the two
            third.rollback()
        holder.rollback()
        other.rollback()


@pytest.mark.parametrize("major", [2, 1])
def test_locks_in_joins_subqueries_ctes_and_cursors(lock_seat, pg, runs, major):
    run = runs[major]
    shapes = [
        ("join, lock of both", "SELECT e.type, r.run_id FROM events e JOIN runs r USING (run_id) "
                               "WHERE e.run_id = %s AND e.sequence = 0 FOR UPDATE"),
        ("join, lock OF e", "SELECT e.type FROM events e JOIN runs r USING (run_id) WHERE e.run_id = %s "
                            "AND e.sequence = 0 FOR NO KEY UPDATE OF e"),
        ("sub-select locked from outside", "SELECT s.type FROM (SELECT * FROM events WHERE run_id = %s "
                                           "AND sequence = 0) s FOR UPDATE OF s"),
        ("locking CTE", "WITH l AS (SELECT * FROM events WHERE run_id = %s AND sequence = 0 FOR UPDATE) "
                        "SELECT type FROM l"),
        ("keys only", "SELECT run_id, sequence, 'x' FROM events WHERE run_id = %s AND sequence = 0 FOR UPDATE"),
    ]
    for name, sql in shapes:
        with connect(lock_seat, major) as conn:
            rows = conn.execute(sql, (run,)).fetchall()
            assert rows and rows[0][0] in (READ[major][0], run), (name, rows)
            assert locked_elsewhere(pg, run, 0), name
            conn.rollback()
    # the lock OF the other table only: the events rows are not locked, the runs row is
    with connect(lock_seat, major) as conn:
        rows = conn.execute("SELECT e.type FROM events e JOIN runs r USING (run_id) WHERE e.run_id = %s "
                            "ORDER BY e.sequence FOR UPDATE OF r", (run,)).fetchall()
        assert [r[0] for r in rows] == READ[major]
        assert not locked_elsewhere(pg, run, 0)
        conn.rollback()
    # a cursor FOR UPDATE (DECLARE … FOR UPDATE, then FETCH)
    with connect(lock_seat, major) as conn:
        conn.execute(f"DECLARE c CURSOR FOR SELECT type FROM events WHERE run_id = '{run}' ORDER BY sequence "
                     f"FOR UPDATE")
        assert conn.execute("FETCH 2 FROM c").fetchall() == [(READ[major][0],), (READ[major][1],)]
        assert locked_elsewhere(pg, run, 0)
        conn.rollback()


@pytest.mark.parametrize("major", [2, 1])
def test_asyncpg_prepared_lock_binary(lock_seat, pg, runs, major):
    """asyncpg: a prepared, binary FOR UPDATE SKIP LOCKED, executed several times (the seat's named statement)."""
    import asyncio

    run = runs[major]

    async def go():
        conn = await asyncpg.connect(lock_seat.url(user=USER),
                                     server_settings={"application_name": {2: "app", 1: "v1-host"}[major]})
        try:
            out = []
            for _ in range(3):
                async with conn.transaction():
                    stmt = await conn.prepare("SELECT type, payload FROM events WHERE run_id = $1 "
                                              "ORDER BY sequence FOR UPDATE SKIP LOCKED")
                    out.append([r[0] for r in await stmt.fetch(run)])
                    out.append(await asyncio.to_thread(locked_elsewhere, pg, run, 0))
            return out
        finally:
            await conn.close()

    got = asyncio.run(go())
    assert got == [READ[major], True] * 3


@pytest.mark.parametrize("major", [2, 1])
def test_read_committed_recheck_reads_the_updated_row_translated(lock_seat, pg, runs, major):
    """A lock that waits on a row another transaction updates gets the new row version, translated (PostgreSQL's
    EvalPlanQual re-check under READ COMMITTED, on the stored row under the lockable view)."""
    run = runs[major]
    with psycopg.connect(pg.dsn()) as writer:  # a superuser, past the writer rule (it only changes node_id here)
        writer.execute("SET session_replication_role = replica")
        writer.execute("UPDATE events SET node_id = 'changed' WHERE run_id = %s AND sequence = 0", (run,))
        result = {}

        def lock():
            with connect(lock_seat, major) as conn:
                pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
                result["pid"] = pid
                result["rows"] = conn.execute("SELECT node_id, type FROM events WHERE run_id = %s AND sequence = 0 "
                                              "FOR UPDATE", (run,)).fetchall()
                conn.rollback()

        t = threading.Thread(target=lock)
        t.start()
        with psycopg.connect(pg.dsn(), autocommit=True) as watch:  # until the lock waits on the writer's row
            while True:
                row = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND "
                                    "wait_event_type = 'Lock' AND query LIKE '%%FOR UPDATE%%'",
                                    ({2: "app", 1: "v1-host"}[major],)).fetchone()
                if row[0] or not t.is_alive():
                    break
        assert t.is_alive(), result
        writer.commit()
    t.join()
    assert result["rows"] == [("changed", READ[major][0])]
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE events SET node_id = 'n1' WHERE run_id = %s", (run,))


@pytest.mark.parametrize("major", [2, 1])
def test_a_locked_read_never_returns_a_stored_spelling_and_the_net_still_holds(lock_seat, runs, major):
    """Hostile variants: the lock view is the seat's, a client naming it is refused (OW004), and so is server-side
    code that would lock the table itself; a locked whole row is translated."""
    run = runs[major]
    with connect(lock_seat, major, autocommit=True) as conn:
        for sql in ("SELECT * FROM openwop_seat.events_m2_lock FOR UPDATE",
                    "SELECT * FROM openwop_seat.events_m1_lock"):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            assert info.value.sqlstate == "OW004"
        # server-side code that locks the table itself: refused where the net does not hold dynamic SQL (this
        # session's role may read past it: ADR 0017), and where it does, it meets the net (ADR 0019)
        held = conn.execute("SELECT NOT rolsuper AND NOT rolbypassrls FROM pg_roles WHERE rolname = current_user"
                            ).fetchone()[0]
        create = ("CREATE FUNCTION pg_temp.lock_leak(r text) RETURNS text LANGUAGE plpgsql AS $f$ DECLARE "
                  "t text; BEGIN EXECUTE 'SELECT string_agg(type, '','') FROM (SELECT type FROM public.ev' || "
                  "'ents WHERE run_id = $1 FOR UPDATE) s' INTO t USING r; RETURN t; END $f$")
        if held:
            conn.execute(create)
        for sql in ("SELECT pg_temp.lock_leak(%s)" if held else create,
                    "DO $$ BEGIN PERFORM 1 FROM (SELECT type FROM public.events FOR UPDATE) s; END $$"):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql, (run,) if "%s" in sql else None)
            assert info.value.sqlstate == ("OW008" if held else "OW004"), info.value
        rows = conn.execute("SELECT e, to_jsonb(e) FROM events e WHERE run_id = %s FOR SHARE", (run,)).fetchall()
        text = repr(rows)
        assert not any(s in text for s in STORED[major] if s not in READ[major])
        assert all(s in text for s in READ[major])
