"""psycopg2 (psycopg2-binary) through the seat: the host's page statement page after page (psycopg2 binds
client-side and sends the simple protocol), a named (server-side) cursor (DECLARE … CURSOR WITHOUT HOLD and
FETCH FORWARD itersize), and the host's append path. Checked as tests/integration/drivers.py says."""

from __future__ import annotations

from datetime import datetime

import drivers
import psycopg2
import psycopg2.extras
import pytest
from drivers import APPEND_LOCK_SQL, APPEND_SQL, COLUMNS, PAGE_SIZE, TRANSLATED_VIEW


def _rows(cur, tuples) -> list[dict]:
    names = [d.name for d in cur.description]
    assert names == COLUMNS, names
    return [dict(zip(names, t)) for t in tuples]


def read_pages(dsn: str, table: str, run_id: str) -> list[dict]:
    out, after = [], -1
    sql = drivers.PAGE_SQL.format(table=table).replace("$1", "%s").replace("$2", "%s").replace("$3", "%s")
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        while True:
            cur.execute(sql, (run_id, after, PAGE_SIZE))
            page = _rows(cur, cur.fetchall())
            out += page
            if len(page) < PAGE_SIZE:
                break
            after = page[-1]["sequence"]
    conn.close()
    return out


def read_named(dsn: str, table: str, run_id: str) -> list[dict]:
    out = []
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor(name="seat_named") as cur:
            cur.itersize = PAGE_SIZE
            cur.execute(f"SELECT * FROM {table} WHERE run_id = %s ORDER BY sequence", (run_id,))
            while batch := cur.fetchmany(PAGE_SIZE):
                out += _rows(cur, batch)
    finally:
        conn.close()
    return out


READERS = {"pages": read_pages, "named-cursor": read_named}


@pytest.fixture(scope="module")
def era2_run(pg):
    return drivers.seed_read_run(pg, "drv-psycopg2")


@pytest.mark.parametrize("reader", list(READERS))
def test_major2_read(pg, seat, era2_run, reader):
    run_id, events = era2_run
    via = READERS[reader](seat.dsn(), "events", run_id)
    direct = READERS[reader](pg.dsn(), TRANSLATED_VIEW, run_id)
    drivers.check_read(pg, run_id, events, via, direct, f"psycopg2 {reader}")


def test_host_append(pg, seat):
    run_id = drivers.new_append_run(pg, "drv-psycopg2-append")
    sent = drivers.append_events(run_id)
    sql = APPEND_SQL.replace("$1", "%(run)s")
    for n, name in enumerate(("event_id", "type", "node_id", "payload", "ts", "causation_id"), start=2):
        sql = sql.replace(f"${n}", f"%({name})s")
    returned = []
    conn = psycopg2.connect(seat.dsn())
    try:
        for e in sent:
            with conn, conn.cursor() as cur:  # one transaction an event
                cur.execute(APPEND_LOCK_SQL.replace("$1", "%s"), (run_id,))
                cur.execute(sql, {"run": run_id, "event_id": e["eventId"], "type": e["type"], "node_id": e["nodeId"],
                                  "payload": None if e["payload"] is None else psycopg2.extras.Json(
                                      drivers.payload_value(e["payload"])),
                                  "ts": datetime.fromisoformat(e["timestamp"]), "causation_id": e["causationId"]})
                returned += _rows(cur, cur.fetchall())
    finally:
        conn.close()
    drivers.check_append(pg, run_id, sent, returned, "psycopg2 append")
