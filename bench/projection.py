"""Micro-benchmark of the payload projection's per-row cost (issue #4), in the database and in the seat.

    .venv/bin/python bench/projection.py [rows]

Starts a throwaway PostgreSQL, installs the seat's schema, stores one era-2 run per row kind, and times
the hidden column the classifier adds, evaluated over every row (median of 5 runs, ``count()`` over the
expression so the client receives one row):

* ``check only``: ``read_v2`` (the era check of a statement that reads ``type`` but not ``payload``);
* ``unchanged``: ``read_v2p`` on identity rows whose payloads need nothing;
* ``renamed only``: ``read_v2p`` on renamed types whose payloads need nothing;
* ``projected``: ``read_v2p`` on rows whose payloads change (a boxed key; run.started's owner block).

Then the seat's own share: splicing one projected payload into a DataRow in Python (``ReadPath``), per row.
A measurement for the notes, not a test: no thresholds.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from harness import HOST_SCHEMA  # noqa: E402

from proxy.devcluster import DevCluster  # noqa: E402

KINDS = {  # run id -> (type expression, payload expression) over generate_series g
    "unchanged": ("'node.started'", "jsonb_build_object('nodeId', 'n-' || g, 'typeId', 'llm', 'attempt', 1)"),
    "renamed": ("'agent.toolCalled'", "jsonb_build_object('agentId', 'a', 'toolName', 'echo', 'callId', 'c-' || g)"),
    "projected": ("'variable.changed'", "jsonb_build_object('name', 'total', 'value', g)"),
    "run-started": ("'run.started'", "jsonb_build_object('workflowId', 'wf', 'engineVersion', '7')"),
}


def expression(kind: str, projected: bool) -> str:
    era = "COALESCE((SELECT x.era FROM openwop_seat.run_era x WHERE x.run_id = e.run_id), 2::smallint)"
    if not projected:
        return f"openwop_seat.read_v2({era}, e.type, e.run_id, e.sequence::bigint)"
    tenant = ("CASE WHEN e.type = 'run.started' THEN (SELECT r.tenant_id FROM runs r WHERE r.run_id = e.run_id) END")
    return (f"openwop_seat.read_v2p({era}, e.type, e.payload, e.run_id, e.sequence::bigint, e.event_id, e.node_id, "
            f"{tenant})")


def timed(conn, sql: str, rows: int) -> float:
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        conn.execute(sql).fetchall()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) / rows * 1e6


def splice_cost() -> float:
    from proxy.classify import Classifier
    from proxy.config import HostConfig
    from proxy.reader import EventColumns, Layout, ReadPath
    from proxy.wire import messages

    rp = ReadPath(Classifier(HostConfig(), 2), 2, EventColumns(1, 4, payload_attnum=6), {b"a.b": b"a-b"}, None)
    layout = Layout(hidden=(8,), types=(3,), ncols=9, payloads=(5,), hidden_text=True, payload_binary=(False,))
    projected = b'{"name": "total", "x-v1": {"value": 2}}'
    values = [b"ev-1", b"run-1", b"7", b"a.b", b"n-1", b'{"name": "total", "value": 2}', b"2026-09-03", None,
              b"2" + projected + b"\x1e1\x1evariable.changed\x1e"]
    body = messages.data_row(values)[5:] if hasattr(messages, "data_row") else _data_row(values)
    n = 100_000
    return timeit.timeit(lambda: rp._translate_row(body, layout), number=n) / n * 1e6


def _data_row(values) -> bytes:
    import struct
    out = [struct.pack("!h", len(values))]
    for v in values:
        out.append(struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v)
    return b"".join(out)


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())
    cluster = DevCluster().start()
    try:
        cluster.psql(HOST_SCHEMA)
        subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", cluster.dsn()], check=True,
                       capture_output=True, cwd=ROOT)
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            for run, (t, payload) in KINDS.items():
                conn.execute(f"INSERT INTO runs (run_id, tenant_id) VALUES ('{run}', 'acme')")
                conn.execute(f"INSERT INTO events SELECT '{run}-' || g, '{run}', g, {t}, 'n-1', {payload}, now(), NULL "
                             f"FROM generate_series(1, {rows}) g")
            conn.execute("ANALYZE")
            base = timed(conn, f"SELECT count(*) FROM events e WHERE e.run_id = 'unchanged'", rows)
            print(f"{rows} rows per kind; µs per row, the hidden column's evaluation only (a bare scan subtracted: "
                  f"{base:.2f} µs/row)")
            print(f"  {'check only (read_v2)':32} {timed(conn, _count('unchanged', False), rows) - base:6.2f}")
            for kind in KINDS:
                print(f"  {'read_v2p, ' + kind:32} {timed(conn, _count(kind, True), rows) - base:6.2f}")
    finally:
        cluster.stop()
    print(f"  {'seat: splice a projected row':32} {splice_cost():6.2f}  (Python, per DataRow)")


def _count(kind: str, projected: bool) -> str:
    return f"SELECT count({expression(kind, projected)}) FROM events e WHERE e.run_id = '{kind}'"


if __name__ == "__main__":
    main()
