"""The append's triggers after ADR 0020: one BEFORE guard and one AFTER row trigger of the writer rule per appended
row (plus the v2 store's own), the payloads-clean mark kept by the final check on the row as stored, and the
guard's outcome for an era-2 append the same whether or not it asks for the writer's claim.

The guarantees themselves (the four append cases, the final check against a later host trigger, the lock) are
tests/integration/test_writer_rule.py's and test_writer_guard.py's; these pin what ADR 0020 changed."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from harness import CLAIM_SECRET, HOST_SCHEMA
from proxy.artifacts.load import load_artifacts
from proxy.config import Config, HostConfig
from proxy.db.claims import claim_proof
from proxy.db.migrate import migrate

A = load_artifacts()
ERA_COLUMN = "event_log_schema_version"
# tgtype bits: 1 row, 2 before, 4 insert, 16 update
SEAT_TRIGGERS = ("SELECT tgname, CASE WHEN tgtype & 2 = 2 THEN 'BEFORE' ELSE 'AFTER' END, tgtype & 4 = 4, "
                 "tgtype & 16 = 16 FROM pg_trigger WHERE tgrelid = 'events'::regclass AND NOT tgisinternal "
                 "AND tgtype & 1 = 1 ORDER BY tgname")


@pytest.fixture
def make_db(pg):
    made = []

    def make(config: Config, ddl: str = HOST_SCHEMA) -> str:
        name = f"at_{uuid.uuid4().hex[:10]}"
        pg.psql(f"CREATE DATABASE {name} OWNER host_user")
        pg.psql(ddl, user="host_user", dbname=name)
        made.append(name)
        asyncio.run(migrate(pg.dsn(dbname=name), config, A, out=lambda _line: None))
        return name

    yield make
    for name in made:
        pg.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", check=False)


def claim(conn, major: int) -> None:
    (challenge,), = conn.execute("SELECT openwop_seat.claim_challenge()").fetchall()
    conn.execute("SELECT openwop_seat.claim(%s, %s)", (claim_proof(CLAIM_SECRET, challenge, major), major))


def append(conn, run: str, seq: int, etype: str, payload: str | None = None) -> None:
    conn.execute("INSERT INTO events (event_id, run_id, sequence, type, payload, \"timestamp\") "
                 "VALUES (%s, %s, %s, %s, %s::jsonb, now())", (f"{run}-{seq}", run, seq, etype, payload))


@pytest.mark.parametrize("host, store", [({}, True), ({"store": False}, False), ({"era_column": ERA_COLUMN}, False)],
                         ids=["run_era and the v2 store", "no store", "era column"])
def test_an_append_fires_the_guard_and_one_after_trigger_of_the_writer_rule(pg, make_db, host, store):
    ddl = HOST_SCHEMA + (f"ALTER TABLE runs ADD COLUMN {ERA_COLUMN} smallint;" if "era_column" in host else "")
    db = make_db(Config(host=HostConfig(**host)), ddl)
    with psycopg.connect(pg.dsn(dbname=db)) as conn:
        rows = conn.execute(SEAT_TRIGGERS).fetchall()
    on_insert = [(name, when) for name, when, insert, _update in rows if insert]
    expected = [("zz_openwop_seat_append", "BEFORE"), ("zz_openwop_seat_append_check", "AFTER")]
    if store:  # the v2 store's unmark keeps its own trigger: disabling it is the store's documented switch
        expected.append(("zz_openwop_seat_store", "AFTER"))
    assert on_insert == expected
    # the payloads-clean mark's own trigger is an UPDATE's only: an append's mark is kept by the final check
    assert [(when, insert, update) for name, when, insert, update in rows if name == "zz_openwop_seat_clean"] == \
        [("AFTER", False, True)]


def test_the_final_check_keeps_the_clean_mark_by_the_row_as_stored(pg, make_db):
    """A host trigger that fires after the guard and makes the payload one that needs projection: the mark goes,
    as it went when the clean trigger (AFTER INSERT) judged the stored row."""
    db = make_db(Config())
    run = "clean-after-host-trigger"
    pg.psql("""
        CREATE FUNCTION dirty_payload() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.payload ? 'dirty' THEN
                NEW.payload := '{"nodeId": "n1", "typeId": "t", "extra": true}';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER zzzz_host_dirty BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION dirty_payload();
    """, user="host_user", dbname=db)
    with psycopg.connect(pg.dsn(dbname=db), autocommit=True) as owner, \
            psycopg.connect(pg.dsn(user="host_user", dbname=db), autocommit=True) as host:
        marked = lambda: owner.execute("SELECT count(*) FROM openwop_seat.payloads_clean WHERE run_id = %s",  # noqa: E731
                                       (run,)).fetchone()[0]
        host.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", (run,))
        append(host, run, 1, "run.resuming", '{"fromStatus": "suspended"}')
        assert owner.execute("SELECT openwop_seat.mark_payloads_clean(%s)", (run,)).fetchone() == (True,)
        append(host, run, 2, "node.started", '{"nodeId": "n1", "typeId": "t"}')  # clean as sent and as stored
        assert marked() == 1
        append(host, run, 3, "node.started", '{"nodeId": "n1", "typeId": "t", "dirty": 1}')  # made dirty later
        assert marked() == 0
        assert owner.execute("SELECT openwop_seat.mark_payloads_clean(%s)", (run,)).fetchone() == (False,)


# (type appended, what a v1 writer stores, what a v2 writer stores, or the v2 writer's refusal's SQLSTATE)
ERA2_CASES = [
    ("node.completed", "node.completed", "node.completed"),  # an identity name: no claim asked
    ("example.thing-happened", "example.thing-happened", "example.thing-happened"),  # a vendor's type: the same
    ("run.resume-started", "run.resume-started", "run.resuming"),  # a v2 name: a v2 writer's is stored in v1
    ("run.resuming", "run.resuming", "OW001"),  # a v1-only spelling: a v2 writer appends v2 names
]


@pytest.mark.parametrize("etype, v1_stored, v2_stored", ERA2_CASES, ids=[c[0] for c in ERA2_CASES])
def test_an_era2_append_is_judged_by_the_writer_where_it_matters(pg, make_db, etype, v1_stored, v2_stored):
    db = make_db(Config())
    run = f"era2-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg.dsn(user="host_user", dbname=db), autocommit=True) as v1, \
            psycopg.connect(pg.dsn(user="host_user", dbname=db), autocommit=True) as v2:
        claim(v2, 2)
        v1.execute("INSERT INTO runs (run_id, tenant_id) VALUES (%s, 't')", (run,))
        append(v1, run, 1, etype)
        if v2_stored.startswith("OW"):
            with pytest.raises(psycopg.Error) as refused:
                append(v2, run, 2, etype)
            assert refused.value.sqlstate == v2_stored
        else:
            append(v2, run, 2, etype)
        stored = [t for (t,) in v1.execute("SELECT type FROM events WHERE run_id = %s ORDER BY sequence", (run,))]
        assert stored == [v1_stored] + ([] if v2_stored.startswith("OW") else [v2_stored])
        assert v1.execute("SELECT openwop_seat.era_of(%s)", (run,)).fetchone() == (2,)
