"""System columns in the RETURNING list of a write to the events table (issue 23 item 2, ADR 0017): the upsert's
``RETURNING *, (xmax = 0) AS inserted`` through the seat, majors 2 and 1, text and binary, as host_user (the net
holds it) and through psycopg and asyncpg. The rows come back translated; ``xmax``/``ctid`` are the written
rows' own."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import psycopg
import pytest

from proxy.artifacts.load import load_artifacts

A = load_artifacts()
V1 = sorted(A.renamed)[0]
V2 = A.v1_to_v2[V1]
USER = "host_user"
WRITE = {2: V2, 1: V1}  # what each major writes to an era-2 run: stored as V1 either way, read back as written
UPSERT = ("INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
          "VALUES (%s, %s, %s, %s, 'n', '{{}}'::jsonb, now()) ON CONFLICT (event_id) DO {action} "
          "RETURNING *, (xmax = 0) AS inserted")


@pytest.fixture(scope="module")
def ret_seat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1}]},
                      host={"check_interval": 3600})


@pytest.fixture
def run(pg):
    run = f"ret-{uuid.uuid4().hex[:8]}"
    pg.psql(f"INSERT INTO runs (run_id, tenant_id) VALUES ('{run}', 't')")
    yield run
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("DELETE FROM events WHERE run_id = %s", (run,))
        conn.execute("DELETE FROM runs WHERE run_id = %s", (run,))


def connect(seat, major, user=USER):
    return psycopg.connect(seat.dsn(user=user), autocommit=True,
                           application_name="v1-host" if major == 1 else "app")


@pytest.mark.parametrize("major", [2, 1])
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_upsert_do_nothing_returns_xmax_and_translated_rows(ret_seat, pg, run, major, binary):
    with connect(ret_seat, major) as conn:
        cur = conn.execute(UPSERT.format(action="NOTHING"), (f"{run}-1", run, 1, WRITE[major]), binary=binary)
        names = [d.name for d in cur.description]
        rows = cur.fetchall()
        assert names == ["event_id", "run_id", "sequence", "type", "node_id", "payload", "timestamp",
                         "causation_id", "inserted"]
        assert [(r[0], r[3], r[8]) for r in rows] == [(f"{run}-1", WRITE[major], True)]
        # the conflict: nothing written, nothing returned
        again = conn.execute(UPSERT.format(action="NOTHING"), (f"{run}-1", run, 1, WRITE[major]), binary=binary)
        assert again.fetchall() == []
        # RETURNING xmax, ctid by name: the written row's own
        cur = conn.execute("INSERT INTO events AS e (event_id, run_id, sequence, type, timestamp) "
                           "VALUES (%s, %s, 2, %s, now()) RETURNING e.type, xmax, ctid",
                           (f"{run}-2", run, WRITE[major]), binary=binary)
        assert [d.name for d in cur.description] == ["type", "xmax", "ctid"]
        (typ, xmax, ctid), = cur.fetchall()
        if binary:  # psycopg has no binary loader for xid and tid: their wire forms
            assert xmax == b"\x00" * 4
            ctid = f"({int.from_bytes(ctid[:4], 'big')},{int.from_bytes(ctid[4:], 'big')})"
        assert typ == WRITE[major] and str(xmax) in ("0", "b'\\x00\\x00\\x00\\x00'")
    stored = pg.psql(f"SELECT type, ctid FROM events WHERE event_id = '{run}-2'").split("|")
    assert stored[0].strip() == V1 and stored[1].strip() == str(ctid)


@pytest.mark.parametrize("major", [2, 1])
def test_upsert_do_update_inserting_returns_translated_rows(ret_seat, run, major):
    """DO UPDATE that inserts (no conflict) returns inserted = true and the translated row; one that meets an
    existing row updates it and returns inserted = false, translated: the seat writes through its insert view
    (ADR 0019), whose owner reads the existing row, and the update reads no stored type or payload (one that does
    stays on the table and meets the net, test_net_new_rows); a superuser's session too."""
    sql = UPSERT.format(action="UPDATE SET node_id = excluded.node_id")
    with connect(ret_seat, major) as conn:
        rows = conn.execute(sql, (f"{run}-1", run, 1, WRITE[major])).fetchall()
        assert [(r[3], r[8]) for r in rows] == [(WRITE[major], True)]
        rows = conn.execute(sql, (f"{run}-1", run, 1, WRITE[major])).fetchall()
        assert [(r[3], r[8]) for r in rows] == [(WRITE[major], False)]
    with connect(ret_seat, major, user="postgres") as conn:
        rows = conn.execute(sql, (f"{run}-1", run, 1, WRITE[major])).fetchall()
        assert [(r[3], r[8]) for r in rows] == [(WRITE[major], False)]


def test_asyncpg_prepared_upsert_with_xmax(ret_seat, run):
    async def go():
        conn = await asyncpg.connect(ret_seat.url(user=USER))
        try:
            stmt = await conn.prepare("INSERT INTO events (event_id, run_id, sequence, type, timestamp) "
                                      "VALUES ($1, $2, $3, $4, now()) ON CONFLICT DO NOTHING "
                                      "RETURNING type, xmax = 0 AS inserted")
            out = []
            for i in (1, 1, 2):
                out.append([tuple(r) for r in await stmt.fetch(f"{run}-{i}", run, i, V2)])
            return out
        finally:
            await conn.close()

    assert asyncio.run(go()) == [[(V2, True)], [], [(V2, True)]]


@pytest.mark.parametrize("sql", [
    "INSERT INTO events AS e (event_id, run_id, sequence, timestamp) VALUES ('x', 'x', 0, now()) "
    "RETURNING e, xmax",
    "INSERT INTO events (event_id, run_id, sequence, timestamp) VALUES ('x', 'x', 0, now()) "
    "RETURNING (SELECT xmax)",
])
def test_system_columns_the_wrapper_cannot_carry_are_refused(ret_seat, sql):
    with connect(ret_seat, 2) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        assert info.value.sqlstate == "OW004"
