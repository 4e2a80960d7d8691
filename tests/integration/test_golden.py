"""The frozen golden reader-rule fixtures (tests/fixtures/reader-rule-v1), read through the seat by every driver.

The stored logs of ``logs.json`` are loaded into the host database's ``events``
table directly (superuser, not through the seat), era-3 runs are stamped in
``openwop_seat.run_era``, and each run is then read through a seat with the
host's page shape by asyncpg, psycopg 3 (text and binary), node-postgres and
psql, as a major-2, a major-1 (application_name ``v1-host``) and a raw
(application_name ``ops``) reader. For every run:

- ``(sequence, type)`` must equal the expected file of that major;
- the column list must be the page statement's, and every other column must be
  identical to a direct read with the same driver, statement and formats, and
  equal to the fixture;
- a run the expected file says fails must fail with the expected SQLSTATE, code
  and details, on a connection that then goes on reading.

Run and event ids are suffixed with a per-session tag on load and mapped back
when comparing (see tests/fixtures/README.md). The fixture files are frozen:
a failure here means the seat now reads stored logs differently.

reader-rule-v1 records the type mapping only: it predates payload projection
(issue #4), and its payloads are synthetic v1 shapes that a major-2 reader of
these era-2 runs now reads projected (or refused with OW002). So the major-2
reads compared against it use the host's page statement *without* the payload
column (PAGE_SELECT), with every driver; majors 1 and raw, whose payloads are
never projected, read ``SELECT *`` and compare the payload verbatim. Payload
projection for major 2 is covered by tests/test_projection.py and the frozen
fixtures in tests/fixtures/payload-projection-v1.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import asyncpg
import psycopg
import pytest
from psycopg.types.json import Jsonb

from proxy.artifacts.load import load_artifacts

HERE = Path(__file__).resolve().parents[1]
FIXTURES = HERE / "fixtures" / "reader-rule-v1"
NODE_DIR = HERE / "node"
NODE = shutil.which("node")
PSQL = shutil.which("psql")


def _load(name: str):
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


LOGS: list[dict] = _load("logs.json")
RUNS = {run["runId"]: run for run in LOGS}
MAJORS = ("2", "1", "raw")
EXPECTED_FILES = {"2": "expected-major2.json", "1": "expected-major1.json", "raw": "expected-raw.json"}
EXPECTED_DOCS = {m: _load(f) for m, f in EXPECTED_FILES.items()}
EXPECTED = {m: {r["runId"]: r for r in doc["runs"]} for m, doc in EXPECTED_DOCS.items()}
# The application_name that gets each major from the seat below (major 2 is the default).
APP = {"2": None, "1": "v1-host", "raw": "ops"}

EVENT_COLUMNS = ["event_id", "run_id", "sequence", "type", "node_id", "payload", "timestamp", "causation_id"]
# The columns each major's page read outputs. Major 2 leaves out `payload`: reader-rule-v1's major-2
# expectations are the type mapping only, and payload projection (which a major-2 read of an era-2 row
# with the payload column gets) is tested against its own fixtures (tests/test_projection.py).
PAGE_COLUMNS = {"2": [c for c in EVENT_COLUMNS if c != "payload"], "1": EVENT_COLUMNS, "raw": EVENT_COLUMNS}
PAGE_SELECT = {m: "*" if cols == EVENT_COLUMNS else ", ".join(cols) for m, cols in PAGE_COLUMNS.items()}
PAGE_ARGS = (-1, 1000)


def page_sql(select: str = "*") -> str:
    """The host's page statement, selecting ``select`` (``*``, or a column list)."""
    return f"SELECT {select} FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"


PAGE = page_sql()


def _read_order() -> list[str]:
    """Every run, failing ones interleaved with readable ones, so each error is followed by a read."""
    readable = [r["runId"] for r in LOGS if "expect" not in r]
    failing = [r["runId"] for r in LOGS if "expect" in r]
    order = []
    while readable or failing:
        if readable:
            order.append(readable.pop(0))
        if failing:
            order.append(failing.pop(0))
    return order


READ_ORDER = _read_order()


# ---------------------------------------------------------------- loading


@dataclass
class Golden:
    tag: str

    def run(self, run_id: str) -> str:
        return f"{run_id}-{self.tag}"

    def event(self, event_id: str) -> str:
        return f"{event_id}-{self.tag}"

    def logical_run(self, db_run_id: str) -> str:
        suffix = f"-{self.tag}"
        assert db_run_id.endswith(suffix), db_run_id
        return db_run_id[:-len(suffix)]

    @property
    def run_ids(self) -> list[str]:
        return [self.run(r) for r in RUNS]


@pytest.fixture(scope="module")
def golden(pg):
    g = Golden(uuid.uuid4().hex[:8])
    extra = [g.run("golden-append-e2")]
    with psycopg.connect(pg.dsn(), autocommit=True) as conn, conn.transaction():
        for run in LOGS:
            assert run["era"] in (2, 3), run["runId"]
            conn.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES (%s, %s, 'completed')",
                         (g.run(run["runId"]), run["tenantId"]))
            conn.cursor().executemany(
                "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s::timestamptz, %s)",
                [(g.event(e["eventId"]), g.run(run["runId"]), e["sequence"], e["type"], e["nodeId"],
                  None if e["payload"] is None else Jsonb(e["payload"]), e["timestamp"], e["causationId"])
                 for e in run["events"]])
            # Stamped after its rows are in: a session the seat has not claimed may not append to an era-3 run
            # once the writer rule is installed, and these rows are stored history, not appends.
            if run["era"] == 3:
                conn.execute("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES (%s, 3, 'golden')",
                             (g.run(run["runId"]),))
    yield g
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        ids = g.run_ids + extra
        conn.execute("DELETE FROM events WHERE run_id = ANY(%s)", (ids,))
        conn.execute("DELETE FROM runs WHERE run_id = ANY(%s)", (ids,))
        conn.execute("DELETE FROM openwop_seat.run_era WHERE run_id = ANY(%s)", (ids,))


@pytest.fixture(scope="module")
def golden_seat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1},
                                         {"application_name": "ops", "major": "raw"}]})


# ---------------------------------------------------------------- what a driver read


@dataclass
class Read:
    """One run as one driver saw it: its columns and rows (values as the driver gives them), or an error."""

    columns: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    error: dict | None = None  # {"sqlstate", "message", "detail"}


def _rows(columns, tuples) -> list[dict]:
    return [dict(zip(columns, t)) for t in tuples]


def read_asyncpg(url: str, app: str | None, run_ids: list[str], select: str = "*") -> dict[str, Read]:
    """Binary results, a named prepared statement (conn.prepare), reused for every run."""

    async def go():
        settings = {"application_name": app} if app else {}
        conn = await asyncpg.connect(url, server_settings=settings)
        out = {}
        try:
            stmt = await conn.prepare(page_sql(select))
            columns = [a.name for a in stmt.get_attributes()]
            for run_id in run_ids:
                try:
                    records = await stmt.fetch(run_id, *PAGE_ARGS)
                except asyncpg.PostgresError as e:
                    out[run_id] = Read(error={"sqlstate": e.sqlstate, "message": e.message, "detail": e.detail})
                    continue
                out[run_id] = Read(columns, [dict(r.items()) for r in records])
        finally:
            await conn.close()
        return out

    return asyncio.run(go())


def read_psycopg(dsn: str, app: str | None, run_ids: list[str], binary: bool, select: str = "*") -> dict[str, Read]:
    """Each run read twice on one connection: unnamed statement (prepare=False), then named (prepare=True)."""
    kwargs = {"application_name": app} if app else {}
    page = page_sql(select).replace("$1", "%s").replace("$2", "%s").replace("$3", "%s")
    out = {}
    with psycopg.connect(dsn, autocommit=True, **kwargs) as conn:
        for run_id in run_ids:
            reads = []
            for prepare in (False, True):
                cur = conn.cursor(binary=binary)
                try:
                    cur.execute(page, (run_id, *PAGE_ARGS), prepare=prepare)
                except psycopg.Error as e:
                    reads.append(Read(error={"sqlstate": e.sqlstate, "message": e.diag.message_primary,
                                             "detail": e.diag.message_detail}))
                    continue
                columns = [d.name for d in cur.description]
                reads.append(Read(columns, _rows(columns, cur.fetchall())))
            assert reads[0] == reads[1], f"{run_id}: unnamed and prepared reads differ"
            out[run_id] = reads[0]
    return out


def _node(request: dict) -> object:
    proc = subprocess.run([NODE, str(NODE_DIR / "golden.js")], input=json.dumps(request), cwd=NODE_DIR,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"golden.js {request['mode']} exited {proc.returncode}:\n{proc.stderr}"
    return json.loads(proc.stdout)


def read_node(url: str, app: str | None, run_ids: list[str], select: str = "*") -> dict[str, Read]:
    """node-postgres, the host's shape: unnamed statements, every value as the server's text.

    ``SELECT *`` is golden.js's own page statement; another select list is sent as its "sql"."""
    request = {"mode": "page", "url": url, "applicationName": app, "runs": run_ids}
    if select != "*":
        request["sql"] = page_sql(select)
    out = {}
    for run_id, got in _node(request).items():
        if "error" in got:
            e = got["error"]
            out[run_id] = Read(error={"sqlstate": e["code"], "message": e["message"], "detail": e["detail"]})
        else:
            out[run_id] = Read(got["fields"], _rows(got["fields"], got["rows"]))
    return out


NULL = "<<NULL>>"  # psql's display of NULL below (no fixture value contains it)
SEP = "\x1f"


def _psql(dsn: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGCONNECT_TIMEOUT": "10"}
    return subprocess.run([PSQL, "-X", "-v", "VERBOSITY=verbose", "-d", dsn, *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def _psql_error(stderr: str) -> dict:
    m = re.search(r"^ERROR:  ([0-9A-Z]{5}): (.*)$", stderr, re.MULTILINE)
    assert m, stderr
    d = re.search(r"^DETAIL:  (.*)$", stderr, re.MULTILINE)
    return {"sqlstate": m.group(1), "message": m.group(2), "detail": d.group(1) if d else None}


def read_psql(dsn: str, app: str | None, run_ids: list[str], select: str = "*") -> dict[str, Read]:
    """psql (simple protocol): `SELECT sequence, type` as the brief's one-liner, and `SELECT <select>` for the rest."""
    if app:
        dsn = f"{dsn} application_name={app}"
    out = {}
    for run_id in run_ids:
        literal = "'" + run_id.replace("'", "''") + "'"
        brief = _psql(dsn, "-At", "-F", "|",
                      "-c", f"SELECT sequence, type FROM events WHERE run_id = {literal} ORDER BY sequence")
        full = _psql(dsn, "-A", "-F", SEP, "-P", "footer=off", "-P", f"null={NULL}",
                     "-c", f"SELECT {select} FROM events WHERE run_id = {literal} ORDER BY sequence")
        if brief.returncode != 0:
            assert full.returncode != 0, f"{run_id}: `SELECT {select}` read fine where `SELECT sequence, type` failed"
            err = _psql_error(brief.stderr)
            assert _psql_error(full.stderr) == err
            out[run_id] = Read(error=err)
            continue
        assert full.returncode == 0, full.stderr
        lines = full.stdout.split("\n")
        assert lines[-1] == "", full.stdout
        columns = lines[0].split(SEP)
        rows = [{k: (None if v == NULL else v) for k, v in zip(columns, line.split(SEP))} for line in lines[1:-1]]
        pairs = [tuple(line.split("|")) for line in brief.stdout.splitlines()]
        assert pairs == [(r["sequence"], r["type"]) for r in rows], f"{run_id}: the two psql reads disagree"
        out[run_id] = Read(columns, rows)
    return out


# Each driver's page read: (seat or Direct, application_name, run ids, select list).
DRIVERS = {
    "asyncpg": lambda seat, app, runs, select="*": read_asyncpg(seat.url(), app, runs, select),
    "psycopg-text": lambda seat, app, runs, select="*": read_psycopg(seat.dsn(), app, runs, False, select),
    "psycopg-binary": lambda seat, app, runs, select="*": read_psycopg(seat.dsn(), app, runs, True, select),
    "node-postgres": lambda seat, app, runs, select="*": read_node(seat.url(), app, runs, select),
    "psql": lambda seat, app, runs, select="*": read_psql(seat.dsn(), app, runs, select),
}


class Direct:
    """The database's own port, shaped like a Seat for the driver functions."""

    def __init__(self, pg):
        self.pg = pg

    def dsn(self) -> str:
        return self.pg.dsn()

    def url(self) -> str:
        return f"postgresql://{self.pg.superuser}@127.0.0.1:{self.pg.port}/postgres"


def _skip_unavailable(driver: str) -> None:
    """The drivers are required, not optional (conftest checks them once for the whole run)."""
    if driver == "node-postgres":
        assert NODE is not None and (NODE_DIR / "node_modules" / "pg").is_dir(), "node-postgres is required"
    if driver == "psql":
        assert PSQL is not None, "psql is required"


@pytest.fixture(scope="module")
def direct_reads(pg, golden):
    """Each driver's read of every run straight from PostgreSQL with one select list, computed once."""
    cache: dict[tuple[str, str], dict[str, Read]] = {}

    def get(driver: str, select: str = "*") -> dict[str, Read]:
        if (driver, select) not in cache:
            reads = DRIVERS[driver](Direct(pg), None, [golden.run(r) for r in READ_ORDER], select)
            cache[driver, select] = {golden.logical_run(k): v for k, v in reads.items()}
        return cache[driver, select]

    return get


# ---------------------------------------------------------------- comparing


def _value(column: str, v):
    """A driver's value in one Python form, to compare with the fixture."""
    if v is None:
        return None
    if column == "sequence":
        return int(v)
    if column == "payload":
        return json.loads(v) if isinstance(v, str) else v
    if column == "timestamp":
        return datetime.fromisoformat(v) if isinstance(v, str) else v
    return v


def _fixture_rows(golden: Golden, run: dict, columns: list[str] = EVENT_COLUMNS) -> list[dict]:
    """The stored rows of a fixture run, each of ``columns`` but `type`, as Python values."""
    rows = [{"event_id": golden.event(e["eventId"]), "run_id": golden.run(run["runId"]), "sequence": e["sequence"],
             "node_id": e["nodeId"], "payload": e["payload"], "timestamp": datetime.fromisoformat(e["timestamp"]),
             "causation_id": e["causationId"]} for e in run["events"]]
    return [{k: v for k, v in r.items() if k in columns} for r in rows]


def _without_type(rows: list[dict]) -> list[dict]:
    return _without(rows, "type")


def _without(rows: list[dict], *columns: str) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in columns} for r in rows]


def check_error(where: str, golden: Golden, got: Read, expected: dict) -> None:
    assert got.error is not None, f"{where}: read {len(got.rows)} rows, expected {expected['error']}"
    err = got.error
    assert err["sqlstate"] == expected["sqlstate"], f"{where}: {err}"
    assert err["message"].startswith(expected["error"] + ": "), f"{where}: {err}"
    assert err["detail"] is not None, f"{where}: no DETAIL: {err}"
    envelope = json.loads(err["detail"])
    assert set(envelope) == {"error", "message", "details"}, f"{where}: {envelope}"
    assert envelope["error"] == expected["error"], f"{where}: {envelope}"
    assert envelope["message"] == err["message"][len(expected["error"]) + 2:], f"{where}: {envelope}"
    details = dict(envelope["details"])
    assert details.get("runId") == golden.run(expected["details"]["runId"]), f"{where}: {details}"
    details["runId"] = expected["details"]["runId"]
    assert details == expected["details"], f"{where}: {details}"


def check_run(where: str, golden: Golden, run_id: str, got: Read, direct: Read, expected: dict,
              expected_file: str = "the expected file", columns: list[str] = EVENT_COLUMNS) -> None:
    if "error" in expected:
        check_error(where, golden, got, expected["error"])
        return
    assert got.error is None, f"{where}: {got.error}"
    assert direct.error is None, f"{where} (direct read): {direct.error}"
    assert got.columns == direct.columns == columns, f"{where}: columns {got.columns}"
    # `type` is what the reader rule says this major reads
    seen = [{"sequence": _value("sequence", r["sequence"]), "type": r["type"]} for r in got.rows]
    assert seen == expected["rows"], f"{where}: (sequence, type) differ from {expected_file}"
    # everything else byte for byte as the same driver reads it directly, and as the fixture stored it
    assert _without_type(got.rows) == _without_type(direct.rows), f"{where}: a column other than type differs"
    as_values = [{k: _value(k, v) for k, v in r.items()} for r in _without_type(got.rows)]
    assert as_values == _fixture_rows(golden, RUNS[run_id], columns), f"{where}: rows differ from logs.json"


# ---------------------------------------------------------------- tests


def test_fixture_files_agree_with_each_other_and_cover_the_codemap():
    a = load_artifacts()
    for major, doc in EXPECTED_DOCS.items():
        assert doc["format"] == "reader-rule-v1"
        assert [r["runId"] for r in doc["runs"]] == [r["runId"] for r in LOGS], major
    for run in LOGS:
        stored = [{"sequence": e["sequence"], "type": e["type"]} for e in run["events"]]
        seqs = [e["sequence"] for e in run["events"]]
        assert seqs == sorted(set(seqs)) and all(0 <= s <= 2**31 - 1 for s in seqs), run["runId"]
        assert len({e["eventId"] for e in run["events"]}) == len(run["events"]), run["runId"]
        assert EXPECTED["raw"][run["runId"]]["rows"] == stored, run["runId"]
        assert "error" not in EXPECTED["1"][run["runId"]], run["runId"]
        for major in ("2", "1"):
            exp = EXPECTED[major][run["runId"]]
            if "rows" in exp:
                assert [r["sequence"] for r in exp["rows"]] == seqs, (major, run["runId"])
        if "expect" in run:
            assert run["era"] == 2
            err = EXPECTED["2"][run["runId"]]["error"]
            assert err["error"] == run["expect"] and err["details"]["runId"] == run["runId"]
            offending = [e for e in run["events"] if e["sequence"] == err["details"]["sequence"]]
            assert [e["type"] for e in offending] == [err["details"]["type"]]
        else:
            assert "rows" in EXPECTED["2"][run["runId"]], run["runId"]
    era2 = {e["type"] for r in LOGS if r["era"] == 2 and "expect" not in r for e in r["events"]}
    era3 = {e["type"] for r in LOGS if r["era"] == 3 for e in r["events"]}
    assert a.v1_types <= era2 and len(a.v1_types) == 117
    assert {a.v1_to_v2[t] for t in a.renamed} <= era3 and a.v2_types <= era3
    assert "negotiation.decided" in era3 and "negotiation.decided" not in a.v2_types
    failing = {EXPECTED["2"][r["runId"]]["error"]["details"]["type"] for r in LOGS if "expect" in r}
    assert {"acme.widget-made", "foo.bar"} <= failing
    assert {"example.thing-happened", "openwop-app.conversation.recall-used"} <= era2


def test_direct_read_is_the_stored_log(golden, direct_reads):
    """The loader stored exactly logs.json (so a seat mismatch below is the seat's)."""
    for run_id in READ_ORDER:
        got = direct_reads("psycopg-binary")[run_id]
        where = f"direct {run_id}"
        check_run(where, golden, run_id, got, got, EXPECTED["raw"][run_id], EXPECTED_FILES["raw"])


@pytest.mark.parametrize("major", MAJORS)
@pytest.mark.parametrize("driver", list(DRIVERS))
def test_page_read_through_the_seat(golden_seat, golden, direct_reads, driver, major):
    """Major 2 pages without the payload column (reader-rule-v1 predates payload projection, which
    tests/test_projection.py covers with the payload-projection-v1 fixtures); majors 1 and raw read `SELECT *`."""
    _skip_unavailable(driver)
    select = PAGE_SELECT[major]
    reads = DRIVERS[driver](golden_seat, APP[major], [golden.run(r) for r in READ_ORDER], select)
    reads = {golden.logical_run(k): v for k, v in reads.items()}
    assert list(reads) == READ_ORDER
    direct = direct_reads(driver, select)
    for run_id in READ_ORDER:
        check_run(f"{driver} major {major} {run_id}", golden, run_id, reads[run_id], direct[run_id],
                  EXPECTED[major][run_id], EXPECTED_FILES[major], PAGE_COLUMNS[major])


def _v1_to_v2_from_golden() -> dict[str, str]:
    """The mapping as the frozen files record it: the every-v1-type log against its major-2 reading."""
    run = RUNS["golden-e2-every-v1-type"]
    rows = EXPECTED["2"]["golden-e2-every-v1-type"]["rows"]
    return {e["type"]: r["type"] for e, r in zip(run["events"], rows)}


def test_node_append_cte_returns_the_reader_type(golden_seat, golden, pg):
    """The host's append path through the seat as major 2, into a dedicated era-2 run.

    The v2 host sends v2 names; the writer rule stores their v1 spellings (the run
    stays era 2), and RETURNING * reads them as the log page would: v2 names, the
    payload as a major-2 page read projects it, every other column as stored. The
    mapping expected is the one the frozen files record.

    Payloads: the host writes v2-shaped payloads. The template run's payloads are v1
    shapes of other types, which the projection would box or refuse (OW002) for most
    of the types sent here, so codemap types are sent `{}` or NULL instead (no v2
    definition boxes or refuses an empty object), and the vendor types their template
    payloads (a vendor type has no v2 definition: never projected). The row stores
    each payload as sent; RETURNING and the major-2 page read give it projected, which
    for `{}` only fills a required nodeId/runId from the row's own columns.
    """
    _skip_unavailable("node-postgres")
    v1_to_v2 = _v1_to_v2_from_golden()
    renamed = [t for t, v2 in v1_to_v2.items() if t != v2]
    assert len(renamed) == 36
    template = RUNS["golden-e2-vendor-and-gaps"]["events"]
    run_id = golden.run("golden-append-e2")
    vendor = ["example.thing-happened", "openwop-app.conversation.recall-used"]
    vendor_payloads = {e["type"]: e["payload"] for e in template if e["type"] in vendor}
    assert set(vendor_payloads) == set(vendor) and all(vendor_payloads.values())
    sent = renamed + ["node.started"] + vendor
    as_v2 = [v1_to_v2.get(t, t) for t in sent]
    payloads = [vendor_payloads.get(t, None if i % 4 == 3 else {}) for i, t in enumerate(sent)]
    evs = [{"eventId": f"ev.{run_id}.{i:05d}", "type": t, "nodeId": None if i % 3 == 0 else f"node-{i}",
            "payload": payloads[i], "timestamp": template[i % len(template)]["timestamp"],
            "causationId": None if i % 2 == 0 else f"ev.{run_id}.{i - 1:05d}"} for i, t in enumerate(as_v2)]

    out = _node({"mode": "append", "url": golden_seat.url(), "applicationName": None, "runId": run_id, "events": evs})
    assert [o.get("error") for o in out] == [None] * len(evs), out
    assert all(o["fields"] == EVENT_COLUMNS for o in out), out[0]["fields"]
    returned = [dict(zip(o["fields"], o["row"])) for o in out]
    # the CTE numbers an empty run from 1
    assert [(int(r["sequence"]), r["type"]) for r in returned] == list(zip(range(1, len(evs) + 1), as_v2))
    # stored in v1 spelling with the payloads as sent, and every other column as RETURNING gave it
    stored = _node({"mode": "page", "url": Direct(pg).url(), "applicationName": None, "runs": [run_id]})[run_id]
    stored_rows = [dict(zip(stored["fields"], r)) for r in stored["rows"]]
    assert [r["type"] for r in stored_rows] == sent
    assert [r["event_id"] for r in stored_rows] == [e["eventId"] for e in evs]
    assert [_value("payload", r["payload"]) for r in stored_rows] == payloads
    assert _without(stored_rows, "type", "payload") == _without(returned, "type", "payload")
    assert pg.psql(f"SELECT count(*) FROM openwop_seat.run_era WHERE run_id = '{run_id}'").strip() == "0"
    # RETURNING's payloads are the stored ones, projected: vendor and NULL payloads as stored, `{}` with
    # at most a required nodeId/runId added from the row's node_id/run_id (seen for both below)
    filled = set()
    for r, s in zip(returned, stored_rows):
        got, was = _value("payload", r["payload"]), _value("payload", s["payload"])
        if was is None:
            assert got is None, r["type"]
        elif was == {}:
            columns = {"nodeId": r["node_id"], "runId": r["run_id"]}
            assert set(got) <= set(columns) and got == {k: columns[k] for k in got}, (r["type"], got)
            assert None not in got.values(), (r["type"], got)
            filled |= set(got)
        else:
            assert r["payload"] == s["payload"], r["type"]  # the server's bytes
    assert filled == {"nodeId", "runId"}
    # and the page reads of that run agree with RETURNING (major 2, projected payloads included) and with the
    # stored rows (majors 1 and raw: payloads are never projected for them)
    for major, want, rows in (("2", as_v2, returned), ("1", sent, stored_rows), ("raw", sent, stored_rows)):
        page = read_node(golden_seat.url(), APP[major], [run_id])[run_id]
        assert page.error is None, page.error
        assert page.columns == EVENT_COLUMNS, major
        assert [r["type"] for r in page.rows] == want, major
        assert _without_type(page.rows) == _without_type(rows), major
