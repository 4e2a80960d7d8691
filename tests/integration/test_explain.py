"""`openwop-seat explain`: the classifier `serve` runs, on one SQL string, without a database.

The command runs as a subprocess.  What it prints as sent is then run on the
real database (the suite's migrated `postgres` database) to show it is the
statement the seat would send, over the seat's translated relation; what it refuses is
refused by a running seat with the same SQLSTATE and reason.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

import asyncpg
import psycopg
import pytest

from harness import render_config, seat_cli
from proxy.errors import ERRORS

EVENT_COLUMNS = ["event_id", "run_id", "sequence", "type", "node_id", "payload", "timestamp", "causation_id"]
# The reference host's statements (host-traffic.md).
LOG_PAGE = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
APPEND = ("WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = $2) "
          "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) "
          "SELECT $1, $2, next.seq, $3, $4, $5, now(), $6 FROM next RETURNING *")
RUN_READ = "SELECT * FROM runs WHERE run_id = $1"
GROUPED = "SELECT * FROM events TABLESAMPLE SYSTEM (1)"  # refused: not substitutable


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("explain") / "openwop-seat.toml"
    path.write_text(render_config({"proxy": {"default_major": 2}}))
    return path


def explain(config, *args: str) -> subprocess.CompletedProcess:
    return seat_cli("explain", "--config", str(config), *args)


def sent(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("  sent: ")]
    assert len(lines) == 1, out
    return lines[0][len("  sent: "):]


def run_sql(pg, sql: str, *args, setup: str = "") -> list[asyncpg.Record]:
    """``setup`` then ``sql`` in one transaction that is rolled back (the shared database keeps nothing)."""
    async def go():
        conn = await asyncpg.connect(host="127.0.0.1", port=pg.port, user="postgres", database="postgres")
        try:
            tr = conn.transaction()
            await tr.start()
            try:
                if setup:
                    await conn.execute(setup)
                return await conn.fetch(sql, *args)
            finally:
                await tr.rollback()
        finally:
            await conn.close()

    return asyncio.run(go())


def test_a_log_page_is_translated_and_what_it_sends_runs(pg, config):
    out = explain(config, LOG_PAGE)
    assert out.returncode == 0, out.stderr
    assert "translated: the events table is read as openwop_seat.events_m2" in out.stdout
    text = sent(out.stdout)
    # a page of one run (ADR 0015 decision 7, page plans): the store's arm and the live arm, each up to the limit
    assert "FROM openwop_seat.events_v2_filled AS events WHERE" in text, text
    assert "FROM openwop_seat.events_m2_run_live($1) AS events WHERE" in text, text
    assert "a run's page" in out.stdout, out.stdout
    run = f"explain-{uuid.uuid4().hex[:8]}"
    seed = (f"INSERT INTO events (event_id, run_id, sequence, type, payload, timestamp) VALUES "
            f"('{run}-1', '{run}', 1, 'run.started', '{{\"inputs\": {{}}}}', now())")
    rows = run_sql(pg, text, run, 0, 10, setup=seed)
    assert len(rows) == 1 and list(rows[0].keys()) == EVENT_COLUMNS
    assert rows[0]["type"] == "run.started"
    # Major 1 reads the same page with the era check only: the payload is not projected.
    one = explain(config, "--major", "1", LOG_PAGE)
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("major: 1 (--major)\n")
    assert "openwop_seat.events_m1 AS events" in sent(one.stdout)
    assert list(run_sql(pg, sent(one.stdout), run, 0, 10, setup=seed)[0].keys()) == EVENT_COLUMNS


def test_an_append_with_returning_is_translated_and_what_it_sends_runs(pg, config):
    out = explain(config, APPEND)
    assert out.returncode == 0, out.stderr
    assert "translated: the events table is read as openwop_seat.events_m2" in out.stdout
    text = sent(out.stdout)
    # ADR 0019: through the insert view, whose openwop_seat_type is type_m2 over a fresh era (era_now inside)
    assert "INSERT INTO openwop_seat.events_insert_m2 AS events" in text and "openwop_seat_type" in text
    run = f"explain-{uuid.uuid4().hex[:8]}"
    rows = run_sql(pg, text, f"{run}-1", run, "run.started", None, json.dumps({"inputs": {}}), None)
    assert len(rows) == 1 and list(rows[0].keys()) == EVENT_COLUMNS
    assert rows[0]["sequence"] == 1


def test_a_refused_statement_says_why_as_a_running_seat_does(config, seat):
    out = explain(config, GROUPED)
    assert out.returncode == 1
    code = ERRORS["statement_untranslatable"]
    assert out.stdout.splitlines() == [
        "major: 2 (proxy.default_major)",
        "refused (TABLESAMPLE on the events table): TABLESAMPLE samples the stored table, which a translated "
        "session never reads",
        f"  the client gets SQLSTATE {code.sqlstate} (statement_untranslatable, HTTP 500); the statement is not run"]
    with psycopg.connect(seat.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(GROUPED)
    assert refused.value.sqlstate == code.sqlstate
    assert refused.value.diag.message_primary.startswith("statement_untranslatable: TABLESAMPLE samples the stored")


