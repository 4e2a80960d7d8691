"""What the driver tests (test_drivers_*.py) share: the era-2 run they read, the events they append, and the checks.

Each driver reads one era-2 run (stored directly, in v1 vocabulary) through the seat as major 2, with the
host's page statement (``SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT
$3``) in pages of PAGE_SIZE rows, so the same statement runs several times on one connection (a driver's
statement cache and its switch to a named or binary statement both get used). What it read is put into one
canonical form (``canonical``) and must equal:

- the same driver program's read of ``openwop_seat.events_m2`` (the seat's translated view) straight from
  PostgreSQL, which is what the reader rule says a major-2 reader sees, decoded by the same driver;
- the oracle of this module (psycopg 3 reading ``openwop_seat.events_m2`` directly), and for the rows taken
  from the frozen fixtures, their expectations: v2 type names through the pinned codemap, and the projected
  payload of each payload-projection case.

Each driver then appends with the host's append path (BEGIN; ``pg_advisory_xact_lock``; the next-sequence
CTE ``INSERT … RETURNING *``; COMMIT) v2 names to a fresh era-2 run, and what RETURNING gave must be the v2
names at sequences 1.., equal to the oracle's major-2 read of the stored rows, while the stored types are
the v1 spellings and the run stays era 2.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

from proxy.artifacts.load import load_artifacts

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
DRIVERS_DIR = ROOT / "tests" / "drivers"
A = load_artifacts()

PAGE_SIZE = 7
COLUMNS = ["event_id", "run_id", "sequence", "type", "node_id", "payload", "timestamp", "causation_id"]
TENANT = "acme"
TRANSLATED_VIEW = "openwop_seat.events_m2"

# The host's statements; each driver program writes them in its own placeholder style.
PAGE_SQL = "SELECT * FROM {table} WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
APPEND_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext($1), 1)"
APPEND_SQL = """WITH next AS (SELECT COALESCE(MAX(sequence),0)+1 AS seq FROM events WHERE run_id = $1)
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT $2, $1, next.seq, $3, $4, $5, $6, $7 FROM next RETURNING *"""

BASE_TS = datetime(2026, 9, 3, 8, 0, 0, 123456, tzinfo=timezone.utc)


def _projection_cases() -> list[dict]:
    """The payload-projection fixture cases of tenant TENANT that read without error, superseded ones out."""
    docs = {n: json.loads((FIXTURES / n / "cases.json").read_text()) for n in
            ("payload-projection-v1", "payload-projection-v2")}
    superseded = {(old, name) for doc in docs.values() for old, names in doc.get("supersedes", {}).items()
                  for name in names}
    return [dict(c, fixture=n) for n, doc in docs.items() for c in doc["cases"]
            if c["tenantId"] == TENANT and "error" not in c["expect"] and (n, c["name"]) not in superseded]


PROJECTION_CASES = _projection_cases()
RENAMED = sorted(A.renamed)  # v1 spellings the codemap renames
VENDOR_PAYLOAD = {"msg": "grüße 🌍 \"quoted\" \\ back", "n": 12345678901, "f": 1.5, "nested": {"a": [1, None, True]}}


def stored_events(run_id: str) -> list[dict]:
    """The era-2 run every driver reads: renamed v1 types, the projection cases, a vendor type.

    Timestamps carry microseconds; node_id, causation_id and payload are NULL on some rows."""
    events = []
    for i, t in enumerate(RENAMED):
        events.append({"type": t, "nodeId": None if i % 3 == 0 else f"node-{i}",
                       "payload": None if i % 4 == 3 else {}, "expectPayload": None})
    for c in PROJECTION_CASES:
        e = c["event"]
        events.append({"type": e["type"], "nodeId": e["nodeId"], "payload": e["payload"],
                       "expectPayload": c["expect"]["payload"], "case": c["name"]})
    events.append({"type": "example.thing-happened", "nodeId": "n-v", "payload": VENDOR_PAYLOAD,
                   "expectPayload": VENDOR_PAYLOAD})
    for i, e in enumerate(events):
        seq = i + 1
        if e.get("case"):  # the fixtures write the run's own id as "<run>"
            e["expectPayload"] = json.loads(json.dumps(e["expectPayload"]).replace('"<run>"', json.dumps(run_id)))
        e.update(sequence=seq, eventId=f"ev.{run_id}.{seq:04d}",
                 timestamp=BASE_TS + timedelta(seconds=seq, microseconds=seq * 7),
                 causationId=None if seq % 2 else f"ev.{run_id}.{seq - 1:04d}")
    return events


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def seed_read_run(pg, prefix: str) -> tuple[str, list[dict]]:
    """Store the era-2 run directly (no seat: a v1 writer, no stamp); return its id and events."""
    run_id = new_id(prefix)
    events = stored_events(run_id)
    with psycopg.connect(pg.dsn(), autocommit=True) as conn, conn.transaction():
        conn.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES (%s, %s, 'running')", (run_id, TENANT))
        conn.cursor().executemany(
            "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [(e["eventId"], run_id, e["sequence"], e["type"], e["nodeId"],
              None if e["payload"] is None else Jsonb(e["payload"]), e["timestamp"], e["causationId"])
             for e in events])
    return run_id, events


def new_append_run(pg, prefix: str) -> str:
    """A runs row inserted directly (a v1 writer: era 2, no stamp) and no events yet."""
    run_id = new_id(prefix)
    pg.psql(f"INSERT INTO runs (run_id, tenant_id, status) VALUES ('{run_id}', '{TENANT}', 'running')")
    return run_id


def append_events(run_id: str) -> list[dict]:
    """What a v2 host appends to the era-2 run: v2 names of renamed types, an identity name, a vendor type.

    Payloads are `{}` or NULL for the codemap types (no v2 definition boxes or refuses an empty object) and a
    vendor payload for the vendor type (never projected). Parameters are given as text (payload as JSON text,
    timestamp as ISO 8601) and each driver binds them its own way."""
    sent_v1 = RENAMED[:12] + ["node.started", "example.thing-happened"]
    out = []
    for i, v1 in enumerate(sent_v1):
        payload = VENDOR_PAYLOAD if v1.startswith("example.") else (None if i % 4 == 3 else {})
        out.append({"eventId": f"ev.{run_id}.a{i:03d}", "type": A.v1_to_v2.get(v1, v1), "storedType": v1,
                    "nodeId": None if i % 3 == 0 else f"node-{i}",
                    "payload": None if payload is None else json.dumps(payload),
                    "timestamp": (BASE_TS + timedelta(minutes=i, microseconds=i)).isoformat(),
                    "causationId": None if i % 2 == 0 else f"ev.{run_id}.a{i - 1:03d}"})
    return out


def wire_events(events: list[dict]) -> list[dict]:
    """The append events as the driver programs take them (no storedType)."""
    return [{k: v for k, v in e.items() if k != "storedType"} for e in events]


# ---------------------------------------------------------------- canonical form


def ts_micros(v) -> int:
    """A timestamptz as the driver gave it (epoch microseconds, a datetime, or text) in epoch microseconds."""
    if isinstance(v, bool):
        raise TypeError(v)
    if isinstance(v, int):
        return v
    if isinstance(v, datetime):
        assert v.tzinfo is not None, v
        d = v - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
    if isinstance(v, str):
        s = v.strip().replace(" ", "T", 1)
        if s.endswith("Z"):
            s = s[:-1] + "+00:00"
        # PostgreSQL's text prints the offset as +HH; fromisoformat wants +HH:MM.
        if len(s) >= 3 and s[-3] in "+-" and s[-2:].isdigit():
            s += ":00"
        return ts_micros(datetime.fromisoformat(s))
    raise TypeError(f"timestamp of type {type(v).__name__}: {v!r}")


def payload_value(v):
    """A jsonb as the driver gave it (parsed, or JSON text) as the parsed value; None for SQL NULL."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        v = bytes(v).decode()
    if isinstance(v, str):
        return json.loads(v)
    return v


def canonical(row: dict) -> dict:
    """One events row in one comparable form, whatever the driver made of it.

    The column order is checked where the driver gives it (the programs whose output objects are unordered
    check it themselves)."""
    assert sorted(row) == sorted(COLUMNS), list(row)
    return {
        "event_id": row["event_id"], "run_id": row["run_id"], "sequence": int(row["sequence"]),
        "type": row["type"], "node_id": row["node_id"], "payload": payload_value(row["payload"]),
        "timestamp": ts_micros(row["timestamp"]), "causation_id": row["causation_id"],
    }


def oracle(pg, run_id: str, relation: str = TRANSLATED_VIEW) -> list[dict]:
    """psycopg 3, directly: the run as ``relation`` gives it (the major-2 view by default), canonical."""
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        cur = conn.execute(f"SELECT * FROM {relation} WHERE run_id = %s ORDER BY sequence", (run_id,))
        names = [d.name for d in cur.description]
        return [canonical(dict(zip(names, r))) for r in cur.fetchall()]


def check_read(pg, run_id: str, events: list[dict], via_seat: list[dict], direct_view: list[dict] | None,
               where: str) -> None:
    """A driver's major-2 read through the seat against the view, the oracle and the fixtures."""
    got = [canonical(r) for r in via_seat]
    want = oracle(pg, run_id)
    if direct_view is not None:
        same_driver = [canonical(r) for r in direct_view]
        assert same_driver == want, f"{where}: the driver's direct read of the view differs from the oracle"
    assert len(got) == len(events), f"{where}: {len(got)} rows, {len(events)} stored"
    for g, w, e in zip(got, want, events):
        assert g == w, f"{where}: sequence {e['sequence']} through the seat differs from {TRANSLATED_VIEW}"
        assert g["type"] == A.v1_to_v2.get(e["type"], e["type"]), (where, e["type"], g["type"])
        if e.get("expectPayload") is not None:
            assert g["payload"] == e["expectPayload"], (where, e.get("case"), g["payload"])
        assert (g["event_id"], g["sequence"], g["node_id"], g["causation_id"]) == (
            e["eventId"], e["sequence"], e["nodeId"], e["causationId"]), where
        assert g["timestamp"] == ts_micros(e["timestamp"]), where
    # the fixture-derived checks are not vacuous: renamed types were mapped and payloads projected
    assert sum(g["type"] != e["type"] for g, e in zip(got, events)) >= len(RENAMED), where
    assert any(payload_value(e["payload"]) != g["payload"] for g, e in zip(got, events) if e.get("case")), where


def check_append(pg, run_id: str, sent: list[dict], returned: list[dict], where: str) -> None:
    """RETURNING through the seat against what was sent, what was stored, and the major-2 view of it."""
    got = [canonical(r) for r in returned]
    assert [(g["sequence"], g["type"]) for g in got] == [(i + 1, e["type"]) for i, e in enumerate(sent)], where
    assert [g["event_id"] for g in got] == [e["eventId"] for e in sent], where
    assert got == oracle(pg, run_id), f"{where}: RETURNING differs from the major-2 view of the stored rows"
    stored = oracle(pg, run_id, "events")
    assert [s["type"] for s in stored] == [e["storedType"] for e in sent], f"{where}: stored types"
    assert [s["payload"] for s in stored] == [payload_value(e["payload"]) for e in sent], f"{where}: payloads"
    assert [(s["node_id"], s["causation_id"], s["timestamp"]) for s in stored] == [
        (e["nodeId"], e["causationId"], ts_micros(e["timestamp"])) for e in sent], where
    assert sum(e["type"] != e["storedType"] for e in sent) >= 10, where
    era = pg.psql(f"SELECT count(*) FROM openwop_seat.run_era WHERE run_id = '{run_id}'").strip()
    assert era == "0", f"{where}: an append stamped the run"
