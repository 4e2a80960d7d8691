"""psycopg 3 through the seat beyond the host's page statement: a named (server-side) cursor, SQL-level
PREPARE/EXECUTE, and DECLARE … CURSOR / FETCH, each reading an era-2 run as major 2 (text and binary
results), and the host's append path. Checked as tests/integration/drivers.py says."""

from __future__ import annotations

from datetime import datetime

import drivers
import psycopg
import pytest
from drivers import APPEND_LOCK_SQL, APPEND_SQL, COLUMNS, PAGE_SIZE, TRANSLATED_VIEW
from psycopg.types.json import Jsonb


def _rows(cur, tuples) -> list[dict]:
    names = [d.name for d in cur.description]
    assert names == COLUMNS, names
    return [dict(zip(names, t)) for t in tuples]


def read_named_cursor(dsn: str, table: str, run_id: str, binary: bool) -> list[dict]:
    """A server-side cursor: psycopg DECLAREs it with the bound run id and FETCHes PAGE_SIZE rows at a time."""
    out = []
    with psycopg.connect(dsn) as conn:
        with conn.cursor(name="seat_named", binary=binary) as cur:
            cur.itersize = PAGE_SIZE
            cur.execute(f"SELECT * FROM {table} WHERE run_id = %s ORDER BY sequence", (run_id,))
            while batch := cur.fetchmany(PAGE_SIZE):
                out += _rows(cur, batch)
    return out


def read_sql_prepare(dsn: str, table: str, run_id: str, binary: bool) -> list[dict]:
    """PREPARE once, then EXECUTE page after page: EXECUTE's arguments are literals (mogrify), sent in an
    extended-protocol statement of no parameters, so that binary results can be asked for."""
    out, after = [], -1
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"PREPARE seat_page(text, integer, integer) AS "
                     f"SELECT * FROM {table} WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3")
        cur, literal = conn.cursor(binary=binary), psycopg.ClientCursor(conn)
        while True:
            execute = literal.mogrify("EXECUTE seat_page(%s, %s, %s)", (run_id, after, PAGE_SIZE))
            page = _rows(cur, cur.execute(execute).fetchall())
            out += page
            if len(page) < PAGE_SIZE:
                break
            after = page[-1]["sequence"]
        conn.execute("DEALLOCATE seat_page")
    return out


def read_declare_fetch(dsn: str, table: str, run_id: str, binary: bool) -> list[dict]:
    """DECLARE … CURSOR and FETCH as SQL statements of the client's own (simple protocol, literal run id)."""
    out = []
    literal = "'" + run_id.replace("'", "''") + "'"
    with psycopg.connect(dsn) as conn:
        cur = psycopg.ClientCursor(conn)
        binary_kw = "BINARY " if binary else ""
        cur.execute(f"DECLARE seat_c {binary_kw}CURSOR FOR SELECT * FROM {table} WHERE run_id = {literal} "
                    f"ORDER BY sequence")
        while True:
            cur.execute(f"FETCH {PAGE_SIZE} FROM seat_c")
            page = cur.fetchall()
            if not page:
                break
            out += _rows(cur, page)
        cur.execute("CLOSE seat_c")
    return out


READERS = {"named-cursor": read_named_cursor, "sql-prepare": read_sql_prepare, "declare-fetch": read_declare_fetch}


@pytest.fixture(scope="module")
def era2_run(pg):
    return drivers.seed_read_run(pg, "drv-psycopg3")


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("reader", list(READERS))
def test_major2_read(pg, seat, era2_run, reader, binary):
    run_id, events = era2_run
    via = READERS[reader](seat.dsn(), "events", run_id, binary)
    direct = READERS[reader](pg.dsn(), TRANSLATED_VIEW, run_id, binary)
    drivers.check_read(pg, run_id, events, via, direct, f"psycopg3 {reader} {'binary' if binary else 'text'}")


def append(dsn: str, run_id: str, events: list[dict]) -> list[dict]:
    """The host's append path, one transaction an event; payload as Jsonb, timestamp as a datetime."""
    out = []
    sql = APPEND_SQL.replace("$1", "%(run)s")
    for n, name in enumerate(("event_id", "type", "node_id", "payload", "timestamp", "causation_id"), start=2):
        sql = sql.replace(f"${n}", f"%({name})s")
    with psycopg.connect(dsn) as conn:
        for e in events:
            with conn.transaction():
                conn.execute(APPEND_LOCK_SQL.replace("$1", "%s"), (run_id,))
                cur = conn.execute(sql, {
                    "run": run_id, "event_id": e["eventId"], "type": e["type"], "node_id": e["nodeId"],
                    "payload": None if e["payload"] is None else Jsonb(drivers.payload_value(e["payload"])),
                    "timestamp": datetime.fromisoformat(e["timestamp"]), "causation_id": e["causationId"]})
                out += _rows(cur, cur.fetchall())
    return out


def test_host_append(pg, seat):
    run_id = drivers.new_append_run(pg, "drv-psycopg3-append")
    sent = drivers.append_events(run_id)
    returned = append(seat.dsn(), run_id, sent)
    drivers.check_append(pg, run_id, sent, returned, "psycopg3 append")
