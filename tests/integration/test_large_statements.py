"""Statements larger than ``proxy.max_statement_bytes`` (issue 23 item 2, ADR 0017): sent as they are when nothing in
their text can return a stored row past the net, refused (OW004) otherwise.

The net (row-level security, ADR 0009) refuses any read of the stored rows in a translated session, whatever the
text; what it lets through is the new row of an ``INSERT … RETURNING`` (its tuple id is not set yet when the policy
is checked), and code that runs out of its sight (``dblink``: another session) or the seat's own relations. So an
oversized statement whose text holds ``RETURNING``, ``EXECUTE``, a ``DO`` block, ``dblink`` or the seat's schema is
refused; every other one is sent, and the database decides. Hostile variants first."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from proxy.artifacts.load import load_artifacts

A = load_artifacts()
V1 = sorted(A.renamed)[0]
V2 = A.v1_to_v2[V1]
USER = "host_user"
WRITE = {2: V2, 1: V1}
PAD = "x" * 480
ROWS = 4200  # about 2 MiB of VALUES


@pytest.fixture(scope="module")
def big_seat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1}]},
                      host={"check_interval": 3600})


@pytest.fixture
def run(pg):
    run = f"big-{uuid.uuid4().hex[:8]}"
    pg.psql(f"INSERT INTO runs (run_id, tenant_id) VALUES ('{run}', 't')")
    yield run
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute("DELETE FROM events WHERE run_id = %s", (run,))
        conn.execute("DELETE FROM runs WHERE run_id = %s", (run,))


def connect(seat, major):
    return psycopg.connect(seat.dsn(user=USER), autocommit=True, application_name="v1-host" if major == 1 else "app")


def bulk_values(run: str, major: int, start: int = 1) -> str:
    pad = json.dumps({"pad": PAD})
    return ", ".join(f"('{run}-{i}', '{run}', {i}, '{WRITE[major]}', 'n', '{pad}'::jsonb, now(), NULL)"
                     for i in range(start, start + ROWS))


def bulk_insert(run: str, major: int) -> str:
    sql = f"INSERT INTO events VALUES {bulk_values(run, major)}"
    assert len(sql) > (2 << 20) - (64 << 10)  # about 2 MiB: over the default limit (1 MiB)
    return sql


def stored_count(pg, run: str) -> int:
    return int(pg.psql(f"SELECT count(*) FROM events WHERE run_id = '{run}'").strip())


def hostile(run: str, major: int) -> list[tuple[str, str, str]]:
    """(name, SQL over the limit, the SQLSTATE it must get)."""
    values = bulk_values(run, major)
    keys = ", ".join(f"'{run}-{i}-{PAD[:40]}'" for i in range(ROWS * 6))
    return [
        ("INSERT … RETURNING", f"INSERT INTO events VALUES {values} RETURNING type", "OW004"),
        ("returning, upper case", f"INSERT INTO events VALUES {values} RETURNING TYPE, PAYLOAD", "OW004"),
        ("data-modifying CTE", f"WITH w AS (INSERT INTO events VALUES {values} RETURNING *) SELECT type FROM w",
         "OW004"),
        ("upsert RETURNING", f"INSERT INTO events VALUES {values} ON CONFLICT (event_id) DO NOTHING RETURNING type",
         "OW004"),
        ("DO block with dynamic RETURNING",
         f"DO $$ DECLARE t text; BEGIN EXECUTE 'INSERT INTO events VALUES ('{values.split('), (')[0][1:]}') RE' "
         f"|| 'TURNING type' INTO t; RAISE EXCEPTION '%', t; END $$ -- {PAD * 2400}", "OW004"),
        ("the seat's relation", f"SELECT type FROM openwop_seat.events_m{3 - major} WHERE event_id IN ({keys})",
         "OW004"),
        ("dblink", f"SELECT * FROM dblink('dbname=postgres', 'select type from events') AS t(type text) "
                   f"WHERE t.type IN ({keys})", "OW004"),
        # what the net holds: a read of the stored rows, whatever the seat made of the text
        # what the net holds: a read of the stored rows, whatever the seat made of the text (a result that would
        # carry the stored type column ends the session first: the seat's check of the RowDescription, OW007)
        ("read of the stored rows", f"SELECT type FROM events WHERE event_id IN ({keys}) OR run_id = '{run}'",
         "OW007"),
        ("read of the stored rows, no stored column out",
         f"SELECT count(*) FROM events WHERE run_id = '{run}' AND event_id NOT IN ({keys})", "OW008"),
        ("write reading the stored rows",
         f"UPDATE events SET node_id = type WHERE run_id = '{run}' AND event_id NOT IN ({keys})", "OW008"),
    ]


@pytest.mark.parametrize("major", [2, 1])
def test_oversized_statements_that_could_return_stored_rows_are_refused_or_meet_the_net(big_seat, pg, run, major):
    # one stored row in the run, written around the seat: the reads below find it, the writes must add none
    pg.psql(f"INSERT INTO events VALUES ('{run}-0', '{run}', 0, '{V1}', 'n', NULL, now(), NULL)")
    for name, sql, code in hostile(run, major):
        assert len(sql.encode()) > 1 << 20, name
        with connect(big_seat, major) as conn:
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql).fetchall()
            assert info.value.sqlstate == code, (name, info.value)
            assert V1 not in str(info.value) or major == 1, name  # no stored spelling in the error
            assert stored_count(pg, run) == 1, name  # nothing was written


@pytest.mark.parametrize("major", [2, 1])
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_a_2_mib_bulk_insert_runs_and_reads_back_translated(big_seat, pg, run, major, binary):
    sql = bulk_insert(run, major)
    with connect(big_seat, major) as conn:
        if binary:  # the extended protocol, a bound parameter, binary results
            cur = conn.cursor(binary=True)
            cur.execute(sql + " , (%s || '-last', %s, 0, %s, 'n', NULL, now(), NULL)", (run, run, WRITE[major]))
            assert cur.rowcount == ROWS + 1
        else:
            assert conn.execute(sql).rowcount == ROWS
        rows = conn.execute("SELECT type, count(*) FROM events WHERE run_id = %s GROUP BY type", (run,)).fetchall()
        assert rows == [(WRITE[major], ROWS + (1 if binary else 0))]
    assert pg.psql(f"SELECT DISTINCT type FROM events WHERE run_id = '{run}'").strip() == V1  # the writer rule
