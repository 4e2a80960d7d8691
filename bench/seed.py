"""The benchmark's data: the host's tables, pgbench's tables, era-2 event pages and runs to append into.

Every event row is stored the way a v1 host wrote it (era 2: no ``openwop_seat.run_era`` row) and
carries a *renamed* type (one whose v2 name differs in the pinned codemap), so each row of a page read
through the seat is translated: the type through the codemap, the payload projected onto its v2
definition.  The payloads are realistic for their type and already fit the v2 definitions, so they
project cleanly (no ``OW002``).  :func:`check_translation` proves both before anything is measured.

Run ids are decimal strings so that pgbench (whose variables are numbers) binds them as the host
does, as a text parameter: ``run_id = $1``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import asyncpg

from proxy.artifacts import load_artifacts

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from conftest import HOST_SCHEMA  # noqa: E402  (the reference host's tables, shared with the tests)

PAGE_ROWS = 100
PAGE_RUNS = range(1_000_001, 1_000_011)  # 10 era-2 runs of PAGE_ROWS renamed events each
APPEND_RUNS = range(2_000_001, 2_001_001)  # 1,000 era-2 runs: 8 writers rarely wait for one another's lock
TENANT = "acme"

# The host's page read (host-traffic.md), with the bench's page size.
PAGE_SQL = f"SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT {PAGE_ROWS}"

# The host's append (host-traffic.md; as in proxy.demo), one transaction per event.
APPEND_SQL = """\
WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = $1)
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT $2, $1, next.seq, $3, $4, $5, now(), $6 FROM next
RETURNING event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id"""

# What the bench appends: a renamed type (stored by its v1 name, written by its v2 name through the seat).
APPEND_V1 = "agent.toolCalled"
APPEND_PAYLOAD = {"agentId": "planner", "toolName": "web.search", "callId": "call-7f3a9c",
                  "inputs": {"query": "quarterly revenue by region", "limit": 10}, "transport": "mcp"}

REASONING = ("The user asks for the quarterly figures by region. The ledger export covers Q1 to Q3; Q4 is "
             "still open, so I will fetch the preliminary numbers and mark them as such before summarising.")


def page_payload(v1_type: str, i: int) -> dict:
    """A realistic payload of ``v1_type`` for the ``i``-th event of a page; it fits the type's v2 definition."""
    call = f"call-{i // 8:04d}"
    payloads = {
        "agent.invocation.started": {"invocationId": f"inv-{i // 25}", "agentId": "planner", "source": "workflow-node",
                                     "modelClass": "reasoning", "resolvedModel": "model-large-2",
                                     "resolvedProvider": "acme-ai", "toolSurfaceCount": 4, "memoryBound": True},
        "tool.session.opened": {"sessionId": f"ts-{i // 25}", "toolId": "web:search"},
        "agent.reasoning.delta": {"agentId": "planner", "delta": REASONING[(i * 7) % 40:][:160], "sequence": i,
                                  "verbosity": "summary"},
        "agent.toolCalled": {"agentId": "planner", "toolName": "web.search", "callId": call, "transport": "mcp",
                             "inputs": {"query": "quarterly revenue by region", "limit": 10, "page": i % 3}},
        "agent.toolReturned": {"agentId": "planner", "toolName": "web.search", "callId": call, "status": "ok",
                               "durationMs": 180 + i, "outcome": {"hits": [
                                   {"title": "Q3 revenue by region", "url": "https://intranet.example/q3", "score": 0.91},
                                   {"title": "Regional ledger export", "url": "https://intranet.example/ledger",
                                    "score": 0.77}]}},
        "budget.threshold.crossed": {"dimension": "tokens", "consumed": 8200 + i, "limit": 10000, "percent": 80},
        "core.dispatch.fanOut": {"fanOutPolicy": "parallel", "childCount": 3, "maxConcurrency": 2,
                                 "joinMode": "wait-all"},
        "envelope.retry.attempted": {"nodeId": "n-summarise", "attempt": 2, "reason": "schema-violation",
                                     "previousError": "missing required field 'title'"},
        "run.resuming": {"fromStatus": "suspended"},
        "voice.turn_commit": {"atMs": 15230 + i, "finalText": "Show me the numbers for the northern region, please."},
        "tool.session.closed": {"sessionId": f"ts-{i // 25}", "toolId": "web:search", "outcome": "completed"},
        "agent.invocation.completed": {"invocationId": f"inv-{i // 25}", "agentId": "planner", "outcome": "completed",
                                       "schemaValidated": True, "confidence": 0.82},
    }
    return payloads[v1_type]


# One agent turn, repeated down the page: mostly reasoning deltas and tool calls, as a live agent writes.
TURN = ("agent.invocation.started", "tool.session.opened", "agent.reasoning.delta", "agent.reasoning.delta",
        "agent.toolCalled", "agent.toolReturned", "agent.reasoning.delta", "agent.reasoning.delta",
        "agent.toolCalled", "agent.toolReturned", "budget.threshold.crossed", "core.dispatch.fanOut",
        "agent.reasoning.delta", "envelope.retry.attempted", "run.resuming", "voice.turn_commit",
        "agent.reasoning.delta", "agent.toolCalled", "agent.toolReturned", "agent.reasoning.delta",
        "agent.reasoning.delta", "agent.reasoning.delta", "tool.session.closed", "agent.reasoning.delta",
        "agent.invocation.completed")


class SeedError(RuntimeError):
    """The data or the seat is not what the benchmark needs; nothing would be measured honestly."""


def renamed_types() -> dict[str, str]:
    """v1 -> v2 for every type the bench stores; each must be a renamed type of the pinned codemap."""
    artifacts = load_artifacts()
    used = set(TURN) | {APPEND_V1}
    not_renamed = sorted(t for t in used if t not in artifacts.renamed)
    if not_renamed:
        raise SeedError(f"the bench's event types are not renamed in the pinned codemap: {', '.join(not_renamed)}")
    return {t: artifacts.v1_to_v2[t] for t in sorted(used)}


def load(cluster, pgbench: str, scale: int) -> None:
    """The host's tables, the seat's schema (migrate), pgbench's tables, and the event data; then ANALYZE."""
    cluster.psql(HOST_SCHEMA)
    migrate = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", cluster.dsn()],
                             capture_output=True, text=True, cwd=ROOT)
    if migrate.returncode != 0:
        raise SeedError(f"openwop-seat migrate failed:\n{migrate.stderr}")
    init = subprocess.run([pgbench, "-i", "-q", "-s", str(scale), "-h", "127.0.0.1", "-p", str(cluster.port),
                           "-U", "postgres", "postgres"], capture_output=True, text=True)
    if init.returncode != 0:
        raise SeedError(f"pgbench -i failed:\n{init.stderr}")
    rows = []
    for run in PAGE_RUNS:
        for seq in range(1, PAGE_ROWS + 1):
            v1 = TURN[(seq - 1) % len(TURN)]
            rows.append((f"ev-{run}-{seq}", str(run), seq, v1, f"n-{(seq - 1) // 25}",
                         json.dumps(page_payload(v1, seq)), None))
    runs = [(str(r), TENANT) for r in (*PAGE_RUNS, *APPEND_RUNS)]

    async def insert() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=cluster.port, user="postgres", database="postgres")
        try:
            async with conn.transaction():
                await conn.executemany("INSERT INTO runs (run_id, tenant_id) VALUES ($1, $2)", runs)
                await conn.executemany(
                    "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) "
                    "VALUES ($1, $2, $3, $4, $5, $6::jsonb, now(), $7)", rows)
            await conn.execute("ANALYZE")
        finally:
            await conn.close()

    asyncio.run(insert())


async def check_translation(seat_port: int, reference_port: int, cluster_port: int) -> None:
    """Fail unless the seat translates every row of every page and the v2 append, and the reference does not.

    The page through the seat must carry the v2 name of every stored type (and a JSON object payload);
    the same page through ``reference_port`` (PgBouncer) the stored v1 names.  One append through the seat,
    written with the v2 name into an era-2 run, must return the v2 name, be stored by the v1 name, and
    leave the run era 2.
    """
    names = renamed_types()
    seat = await asyncpg.connect(host="127.0.0.1", port=seat_port, user="postgres", database="postgres")
    ref = await asyncpg.connect(host="127.0.0.1", port=reference_port, user="postgres", database="postgres")
    direct = await asyncpg.connect(host="127.0.0.1", port=cluster_port, user="postgres", database="postgres")
    try:
        for run in PAGE_RUNS:
            translated = await seat.fetch(PAGE_SQL, str(run), 0)
            stored = await ref.fetch(PAGE_SQL, str(run), 0)
            if len(translated) != PAGE_ROWS or len(stored) != PAGE_ROWS:
                raise SeedError(f"run {run}: a page of {len(translated)} / {len(stored)} rows, not {PAGE_ROWS}")
            for t, s in zip(translated, stored):
                if s["type"] not in names or t["type"] != names[s["type"]]:
                    raise SeedError(f"run {run} sequence {s['sequence']}: the seat read {t['type']!r} for the "
                                    f"stored {s['type']!r}; the page is not translated as the bench assumes")
                if not isinstance(json.loads(t["payload"]), dict):
                    raise SeedError(f"run {run} sequence {s['sequence']}: the seat's payload is not an object")
        run = str(APPEND_RUNS[0])
        async with seat.transaction():
            await seat.execute("SELECT pg_advisory_xact_lock(hashtext($1), 1)", run)
            row = await seat.fetchrow(APPEND_SQL, run, "ev-bench-check", names[APPEND_V1], "n-1",
                                      json.dumps(APPEND_PAYLOAD), None)
        stored_type = await direct.fetchval("SELECT type FROM events WHERE event_id = 'ev-bench-check'")
        era_rows = await direct.fetchval("SELECT count(*) FROM openwop_seat.run_era WHERE run_id = $1", run)
        if row["type"] != names[APPEND_V1] or stored_type != APPEND_V1 or era_rows != 0:
            raise SeedError(f"a v2 append through the seat returned {row['type']!r}, stored {stored_type!r}, "
                            f"run_era rows {era_rows}: the writer rule is not at work as the bench assumes")
    finally:
        for conn in (seat, ref, direct):
            await conn.close()
