"""The era-3 page (ADR 0024) against PostgreSQL: a run's page read first through its fast twin, an era-3 run's rows
as stored, and through the page statement where the twin has no row; in both cases exactly the rows the page
statement reads, in the client's snapshot, whatever the client's protocol use (unnamed statements, text and binary
results, pipelines, transaction blocks) and whatever writes or DDL happen meanwhile.

The oracle: the run's rows as ``openwop_seat.events_m2`` reads them on a direct connection, cut into the page."""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid

import psycopg
import pytest

PAGE = "SELECT * FROM events WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s"
SHAPES = [  # the reference host's stored shapes (issue 22), in its order
    ("run.started", {"workflowId": "openwop-app.uppercase"}, None),
    ("node.started", {}, "n1"),
    ("node.completed", {"outputs": {"text": "T0-49"}}, "n1"),
    ("memory.written", {"tags": ["a"], "memoryId": "mem_1", "memoryRef": "tenant-memory"}, None),
    ("run.completed", {"output": {"text": "HELLO SEAT"}}, None),
]


@pytest.fixture(scope="module")
def fast_seat(start_seat):
    """A seat of this module's own: its fast-page counters count this module's pages only."""
    return start_seat()


@pytest.fixture
def db(pg):
    with psycopg.connect(pg.dsn(), autocommit=True) as c:
        yield c


def new_run(db, rows: int = 12, era3: bool = False) -> str:
    run = f"fast-{uuid.uuid4().hex[:10]}"
    db.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 'acme')", (run,))
    for seq in range(1, rows + 1):
        append(db, run, seq)
    if era3:  # stamped after its rows (these types are spelled alike in v1 and v2), as a v2 host's run reads
        db.execute("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES (%s, 3, 'test')", (run,))
    return run


def append(db, run: str, seq: int) -> None:
    t, payload, node = SHAPES[(seq - 1) % len(SHAPES)]
    db.execute("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
               "VALUES (%s, %s, %s, %s, %s, %s::jsonb, '2026-01-01')",
               (f"{run}-{seq}", run, seq, t, node, json.dumps(payload)))


def fill(db, run: str) -> None:
    """The run filled into the v2 store. The seat's background filler may be filling it at that moment (the fill
    answers "busy"): then its fill is waited for."""
    for _ in range(200):
        if db.execute("SELECT openwop_seat.store_fill(%s)", (run,)).fetchone()[0] == "filled" or db.execute(
                "SELECT EXISTS (SELECT FROM openwop_seat.events_v2_runs WHERE run_id = %s)", (run,)).fetchone()[0]:
            return
        time.sleep(0.05)
    raise AssertionError(f"{run} was not filled")


def oracle(db, run: str, after: int = 0, limit: int = 1000, binary: bool = False) -> list[tuple]:
    return db.cursor(binary=binary).execute(
        "SELECT * FROM openwop_seat.events_m2 WHERE run_id = %s AND sequence > %s ORDER BY sequence LIMIT %s",
        (run, after, limit)).fetchall()


def pages(conn, run: str, size: int = 5, binary: bool = False) -> list[tuple]:
    """The run read page by page as the host reads it (an unnamed statement each time), to its first short page."""
    rows, after = [], 0
    while True:
        page = conn.cursor(binary=binary).execute(PAGE, (run, after, size)).fetchall()
        rows += page
        if len(page) < size:
            return rows
        after = page[-1][2]


def connect(seat, **kw) -> psycopg.Connection:
    # prepare_threshold=None: every execute is an unnamed Parse, Bind, Describe, Execute, Sync (node-postgres's way)
    return psycopg.connect(seat.dsn(), autocommit=True, prepare_threshold=None, **kw)


def fast_pages(seat) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=5).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r'^openwop_seat_fast_pages_total\{outcome="(\w+)"\} (\S+)$',
                                                    text, re.M)}


def twins(conn) -> list[str]:
    """The session's fast twins, as PostgreSQL holds them."""
    return [r[0] for r in conn.execute(
        "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'openwop_seat_%f'")]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_an_era3_runs_pages_come_through_its_twin_with_the_page_statements_rows(fast_seat, db, binary):
    run = new_run(db, era3=True)
    before = fast_pages(fast_seat)
    with connect(fast_seat) as conn:
        assert pages(conn, run, binary=binary) == oracle(db, run, binary=binary)
        assert len(twins(conn)) == 1 and "events_m2_run_era3" in twins(conn)[0]
    after = fast_pages(fast_seat)
    # 12 rows in pages of 5: the first page prepares the page statement, the next two (the last one short) go fast
    assert after["rows"] - before["rows"] == 2
    assert after["empty"] == before["empty"]


def test_an_era3_page_is_the_runs_rows_as_stored(fast_seat, db):
    run = new_run(db, rows=6, era3=True)
    stored = db.execute("SELECT * FROM events WHERE run_id = %s ORDER BY sequence", (run,)).fetchall()
    with connect(fast_seat) as conn:
        for _ in range(3):
            assert conn.execute(PAGE, (run, 0, 100)).fetchall() == stored


def test_era2_runs_read_as_the_page_statement_reads_them(fast_seat, db):
    filled = new_run(db, rows=7)
    fill(db, filled)
    grown = new_run(db, rows=8)
    fill(db, grown)
    append(db, grown, 9)  # above the mark: read live
    unfilled = new_run(db, rows=3)
    before = fast_pages(fast_seat)
    with connect(fast_seat) as conn:
        conn.execute(PAGE, ("warm-up", 0, 1))  # the page statement prepared: every page below may go fast
        for run in (filled, grown, unfilled):
            assert conn.execute(PAGE, (run, 0, 100)).fetchall() == oracle(db, run), run
            assert conn.execute(PAGE, (run, 2, 3)).fetchall() == oracle(db, run, 2, 3), run
    after = fast_pages(fast_seat)
    # each run misses at its first page and is left to the page statement for its second
    assert after["empty"] - before["empty"] == 3 and after["rows"] == before["rows"]


def test_a_page_past_an_era3_runs_end_is_empty_as_the_page_statement_says(fast_seat, db):
    run = new_run(db, rows=4, era3=True)
    with connect(fast_seat) as conn:
        conn.execute(PAGE, ("warm-up", 0, 1))
        assert conn.execute(PAGE, (run, 4, 10)).fetchall() == []
        assert conn.execute(PAGE, (run, 3, 10)).fetchall() == oracle(db, run, 3)


def test_a_repeatable_read_block_reads_one_snapshot_through_twin_and_fallback(fast_seat, db):
    known = new_run(db, rows=5, era3=True)
    with connect(fast_seat) as conn:
        conn.execute(PAGE, ("warm-up", 0, 1))
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        first = conn.execute(PAGE, (known, 0, 100)).fetchall()  # the twin's rows
        assert first == oracle(db, known)
        later = new_run(db, rows=3, era3=True)  # committed by another session after the block's snapshot
        # its twin finds no row in this snapshot, nor does the page statement after it
        assert conn.execute(PAGE, (later, 0, 100)).fetchall() == []
        assert conn.execute(PAGE, (known, 2, 100)).fetchall() == first[2:]
        conn.execute("COMMIT")
        assert conn.execute(PAGE, (later, 0, 100)).fetchall() == oracle(db, later) and len(oracle(db, later)) == 3


def test_a_failed_transaction_gets_its_own_error_and_stays_usable(fast_seat, db):
    run = new_run(db, rows=3, era3=True)
    with connect(fast_seat) as conn:
        conn.execute(PAGE, ("warm-up", 0, 1))
        conn.execute("BEGIN")
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute(PAGE, (run, 0, 100))
        conn.execute("ROLLBACK")
        assert conn.execute(PAGE, (run, 0, 100)).fetchall() == oracle(db, run)


def test_pipelined_pages_keep_their_order(fast_seat, db):
    runs = [new_run(db, rows=4, era3=True), new_run(db, rows=4), new_run(db, rows=4, era3=True)]
    fill(db, runs[1])
    with connect(fast_seat) as conn:
        conn.execute(PAGE, ("warm-up", 0, 1))
        for _ in range(2):
            with conn.pipeline() as p:
                cursors = [conn.cursor() for _ in runs]
                for cur, run in zip(cursors, runs):
                    cur.execute(PAGE, (run, 0, 100))
                p.sync()
                got = [cur.fetchall() for cur in cursors]
            assert got == [oracle(db, run) for run in runs]


def test_a_twin_that_cannot_be_prepared_leaves_the_session_to_its_page_statement(fast_seat, db):
    """DDL while the seat runs: the twin's function dropped. A session's first fast page finds its Parse refused,
    and the page statement answers it and every page after."""
    run = new_run(db, rows=4, era3=True)
    (definition,) = db.execute("SELECT pg_get_functiondef('openwop_seat.events_m2_run_era3(text)'::regprocedure)"
                               ).fetchone()
    before = fast_pages(fast_seat)
    db.execute("DROP FUNCTION openwop_seat.events_m2_run_era3(text)")
    try:
        with connect(fast_seat) as conn:
            conn.execute(PAGE, ("warm-up", 0, 1))
            for _ in range(3):
                assert conn.execute(PAGE, (run, 0, 100)).fetchall() == oracle(db, run)
            assert twins(conn) == []
    finally:
        db.execute(definition)
        db.execute("GRANT EXECUTE ON FUNCTION openwop_seat.events_m2_run_era3(text) TO PUBLIC")
    after = fast_pages(fast_seat)
    assert after["unprepared"] - before["unprepared"] == 1


def test_node_postgres_pages_through_the_twin(fast_seat, db, tmp_path):
    """The reference host's driver: its page statement, unnamed, with the run's id as a string parameter."""
    import subprocess
    from pathlib import Path

    run = new_run(db, rows=9, era3=True)
    node_dir = Path(__file__).resolve().parents[1] / "node"
    script = tmp_path / "pages.js"
    script.write_text(f"""
const {{ Client }} = require({json.dumps(str(node_dir / "node_modules" / "pg"))});
(async () => {{
  const c = new Client({{ host: '127.0.0.1', port: {fast_seat.port}, user: 'postgres', database: 'postgres' }});
  await c.connect();
  const out = [];
  for (let after = 0; ; ) {{
    const r = await c.query('SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence ASC '
                            + 'LIMIT $3', [{json.dumps(run)}, after, 4]);
    out.push(...r.rows.map(x => [x.sequence, x.type, x.payload]));
    if (r.rows.length < 4) break;
    after = r.rows[r.rows.length - 1].sequence;
  }}
  console.log(JSON.stringify(out));
  await c.end();
}})().catch(e => {{ console.error(e); process.exit(1); }});
""")
    before = fast_pages(fast_seat)
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[r[2], r[3], r[5]] for r in oracle(db, run)]
    assert fast_pages(fast_seat)["rows"] - before["rows"] == 2  # pages 2 and 3 (the first prepares)


# ---------------------------------------------------------------- a client's named statements: asyncpg's

ASYNCPG_PAGE = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence ASC LIMIT $3"


def asyncpg_run(coro):
    import asyncio
    return asyncio.run(coro)


async def asyncpg_pages(conn, run: str, size: int = 5) -> list[tuple]:
    """The run read page by page through asyncpg's prepared (named) statement, binary results."""
    rows, after = [], 0
    while True:
        page = [tuple(r) for r in await conn.fetch(ASYNCPG_PAGE, run, after, size)]
        rows += page
        if len(page) < size:
            return rows
        after = page[-1][2]


async def asyncpg_oracle(pg, run: str) -> list[tuple]:
    import asyncpg
    conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{pg.port}/postgres")
    try:
        return [tuple(r) for r in await conn.fetch(
            "SELECT * FROM openwop_seat.events_m2 WHERE run_id = $1 ORDER BY sequence", run)]
    finally:
        await conn.close()


async def named_twins(conn) -> list[str]:
    return [r[0] for r in await conn.fetch("SELECT name FROM pg_prepared_statements WHERE name LIKE 'openwop_seat_%f'")]


def test_asyncpg_pages_of_era3_runs_come_through_a_twin_of_its_named_statement(fast_seat, pg, db):
    import asyncpg
    era3 = [new_run(db, rows=12, era3=True) for _ in range(2)]
    filled, unfilled = new_run(db, rows=7), new_run(db, rows=6)
    fill(db, filled)

    async def go():
        conn = await asyncpg.connect(fast_seat.url())
        try:
            got = {run: await asyncpg_pages(conn, run) for run in (*era3, filled, unfilled)}
            return got, await named_twins(conn)
        finally:
            await conn.close()

    before = fast_pages(fast_seat)
    got, held = asyncpg_run(go())
    after = fast_pages(fast_seat)
    for run, rows in got.items():
        assert rows == asyncpg_run(asyncpg_oracle(pg, run)), run
    assert len(held) == 1  # one twin, for asyncpg's one statement
    # era 3: every page through the twin but the first (asyncpg prepares with a Flush, and binds in the same group:
    # its statement is trusted at that group's ReadyForQuery): 2 + 3 pages; era 2: one miss each, bound again as
    # asyncpg's own statement
    assert after["rows"] - before["rows"] == 5
    assert after["empty"] - before["empty"] == 2


def test_asyncpg_statement_cache_churn_closes_the_twins_it_leaves(fast_seat, db):
    """asyncpg's statement cache closes the statements it evicts: each one's twin is closed on the server too, ahead
    of the session's next fast page, so a session churning its cache holds no more twins than live pages."""
    import asyncpg
    run = new_run(db, rows=6, era3=True)

    async def go():
        conn = await asyncpg.connect(fast_seat.url(), statement_cache_size=1)
        try:
            counts, rows = [], []
            for n in range(6):
                # a page statement of its own each round (its LIMIT), evicted by the next statement
                sql = ASYNCPG_PAGE.replace("$3", str(3 + n))
                rows.append([r["sequence"] for r in await conn.fetch(sql, run, 0)])
                rows.append([r["sequence"] for r in await conn.fetch(sql, run, 1)])  # the twin, once trusted
                await conn.fetchval("SELECT 1")  # evicts the page statement: asyncpg closes it
                counts.append(len(await named_twins(conn)))
            return counts, rows
        finally:
            await conn.close()

    before = fast_pages(fast_seat)
    counts, rows = asyncpg_run(go())
    assert rows == [list(range(start + 1, min(start + 3 + n // 2, 6) + 1)) for n, start in
                    ((i, i % 2) for i in range(12))]
    assert max(counts) <= 2, counts  # the live statement's twin, and at most one waiting to be closed
    after = fast_pages(fast_seat)
    # each round's second page at least (asyncpg's first page of a statement may share its Parse's group, whose
    # ReadyForQuery makes the statement trusted) through a twin, none missed
    assert after["rows"] - before["rows"] >= 6 and after["empty"] == before["empty"]


def test_asyncpg_page_in_a_transaction_and_after_deallocate(fast_seat, pg, db):
    import asyncpg
    run = new_run(db, rows=8, era3=True)
    expected = asyncpg_run(asyncpg_oracle(pg, run))

    async def go():
        conn = await asyncpg.connect(fast_seat.url())
        try:
            first = await asyncpg_pages(conn, run)
            async with conn.transaction(isolation="repeatable_read"):
                in_block = await asyncpg_pages(conn, run)
                late = new_run(db, rows=2, era3=True)  # after the block's snapshot: empty through twin and fallback
                assert await conn.fetch(ASYNCPG_PAGE, late, 0, 5) == []
            await conn.execute("DEALLOCATE ALL")  # the client's statements go, and the seat's with them
            conn._stmt_cache.clear()
            again = await asyncpg_pages(conn, run)
            return first, in_block, again, await named_twins(conn)
        finally:
            await conn.close()

    first, in_block, again, held = asyncpg_run(go())
    assert first == in_block == again == expected
    assert len(held) == 1


def test_host_fast_page_false_sends_every_page_as_the_page_statement(start_seat, pg, db):
    """The operator's switch (host.fast_page): no twin prepared, no page counted, the same rows."""
    import asyncpg
    seat = start_seat(host={"fast_page": False})
    run = new_run(db, rows=8, era3=True)
    with connect(seat) as conn:
        assert pages(conn, run, size=3) == oracle(db, run)
        assert twins(conn) == []

    async def go():
        conn = await asyncpg.connect(seat.url())
        try:
            return await asyncpg_pages(conn, run, size=3), await named_twins(conn)
        finally:
            await conn.close()

    got, held = asyncpg_run(go())
    assert got == asyncpg_run(asyncpg_oracle(pg, run)) and held == []
    assert not any(fast_pages(seat).values())


def test_a_client_sending_past_the_hold_bound_is_not_read_until_its_page_settles(fast_seat, pg, db):
    """What a client sends while a fast page's answer is not settled waits in the relay, up to FAST_HOLD_BYTES
    (256 KiB); past it the session stops reading the client (its sends block) until the page is settled. Then
    everything goes, in order. The page is kept unsettled by a lock on the events table taken meanwhile."""
    import threading

    from rawpg import RawConn, msg, query

    run = new_run(db, rows=3, era3=True)
    sql = ASYNCPG_PAGE.encode()
    group = (msg(b"P", b"\x00" + sql + b"\x00\x00\x00")
             + msg(b"B", b"\x00\x00\x00\x00\x00\x03" + b"".join(
                 len(v).to_bytes(4, "big") + v for v in (run.encode(), b"0", b"100")) + b"\x00\x00")
             + msg(b"D", b"P\x00") + msg(b"E", b"\x00\x00\x00\x00\x00") + msg(b"S"))
    c = RawConn(fast_seat.port, timeout=60)
    c.login()
    c.send(group)  # the page statement prepared and trusted
    assert [m[0] for m in c.read_until(b"Z")].count(b"D") == 3
    queries = [query(f"SELECT {n} -- {'x' * 8000}") for n in range(4096)]  # 32 MiB
    total = sum(map(len, queries))
    sent = [0]

    def send_all():
        for q in queries:
            c.sock.sendall(q)
            sent[0] += len(q)

    before = fast_pages(fast_seat)
    with psycopg.connect(pg.dsn()) as locker:
        locker.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        c.send(group)  # goes as the twin, which waits for the lock
        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        sender.join(5)
        # not read past the bound (and the sockets' buffers): had the session read on, 32 MiB would be in by now
        assert sender.is_alive() and sent[0] < total
        locker.rollback()
    answers = c.read_until(b"Z")
    assert [m[0] for m in answers].count(b"D") == 3
    values = []
    while len(values) < len(queries):
        for t, body in c.read_until(b"Z"):
            if t == b"D":
                values.append(int(body[6:]))
    sender.join(30)
    assert not sender.is_alive() and values == list(range(len(queries)))  # all of them, in order
    assert fast_pages(fast_seat)["rows"] - before["rows"] == 1
    c.close()


def test_psycopg_prepared_pages_come_through_a_twin_of_its_named_statement(fast_seat, db):
    """psycopg's server-side prepared statement (prepare_threshold=0: `_pg3_<n>`), bound with a Describe of the
    portal at every page, text and binary."""
    runs = [new_run(db, rows=12, era3=True), new_run(db, rows=7)]
    before = fast_pages(fast_seat)
    with psycopg.connect(fast_seat.dsn(), autocommit=True, prepare_threshold=0) as conn:
        for binary in (False, True):
            for run in runs:
                assert pages(conn, run, binary=binary) == oracle(db, run, binary=binary), (run, binary)
        held = [r[0] for r in conn.execute("SELECT name FROM pg_prepared_statements ORDER BY name")]
    after = fast_pages(fast_seat)
    assert any(name.startswith("_pg3_") for name in held) and "openwop_seat_1f" in held
    # libpq prepares in a round trip of its own: the statement is trusted before its first page, and the era-3 run's
    # 3 pages a pass, text and binary, all go through the twin; the era-2 run missed once (then left to the page
    # statement for a minute)
    assert (after["rows"] - before["rows"], after["empty"] - before["empty"]) == (6, 1), held
