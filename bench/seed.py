"""The benchmark's data: the host's tables, pgbench's tables, event pages of both eras and runs to append into.

* :data:`PAGE_RUNS`: era-2 runs (no ``openwop_seat.run_era`` row), stored as a v1 host wrote them, every
  row of a *renamed* type (one whose v2 name differs in the pinned codemap).  Their payloads are
  realistic for their type and already fit the v2 definitions, and each run is marked payloads-clean
  (``openwop_seat.mark_payloads_clean``) after loading, so a major-2 read maps the type only and a
  major-1 read returns the rows as stored.
* :data:`ERA3_RUNS`: era-3 runs (a ``run_era`` row), the same turn of types stored under their v2 names
  with the same payloads: a major-2 read returns them as stored.
* :data:`PROJECTION_RUNS`: era-2 runs like the page runs, except that about one row in five has a
  payload that needs projection (``run.started`` without ``owner``, ``output.chunk`` without ``runId``,
  ``approval.requested`` in its v1 shape); not marked clean.
* :data:`HOST_MIX_RUNS`: era-2 runs of the shapes the unmodified reference host stores (issue 22), in its
  order, over and over: ``run.started`` without owner, ``node.started {}``, ``node.completed {outputs}``,
  ``memory.written``, ``run.completed {output}``; four rows in five read changed by major 2 (the legacy
  Subject, ``nodeId`` from the row, the singular ``output`` carried); not marked clean.
* :data:`APPEND_RUNS`: era-2 runs to append into.

The era-2 page runs (page, projection, host-mix) are filled into the v2 store (ADR 0015) after loading, as a
running seat fills them in the background: a major-2 page of them reads the store. So are the append runs (empty):
left to the seat, their fill would land in the first measured round. The rows the append workloads add above their
marks are filled by the seat, as in production.
:func:`check_translation` proves each of these readings before anything is measured.

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

from proxy.artifacts.load import load_artifacts

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from harness import HOST_SCHEMA  # noqa: E402  (the reference host's tables, shared with the tests)

PAGE_ROWS = 100
PAGE_RUNS = range(1_000_001, 1_000_011)  # 10 era-2 runs of PAGE_ROWS renamed events each, payloads-clean
ERA3_RUNS = range(1_100_001, 1_100_011)  # 10 era-3 runs: the same pages stored under their v2 names
PROJECTION_RUNS = range(1_200_001, 1_200_011)  # 10 era-2 runs, about 1 row in 5 needing payload projection
HOST_MIX_RUNS = range(1_300_001, 1_300_011)  # 10 era-2 runs of the reference host's shapes (issue 22)
APPEND_RUNS = range(2_000_001, 2_001_001)  # 1,000 era-2 runs: 8 writers rarely wait for one another's lock
TENANT = "acme"

# The host's page read (host-traffic.md), with the bench's page size.
PAGE_SQL = f"SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT {PAGE_ROWS}"

# The host's append (host-traffic.md; as in proxy.dev.demo), one transaction per event.
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
                                   {"title": "Q3 revenue by region", "url": "https://intranet.example/q3",
                                    "score": 0.91},
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


def projection_event(seq: int) -> tuple[str, dict] | None:
    """The v1 type and payload of row ``seq`` of a projection run when it needs projection, else None.

    The first row is ``run.started`` without ``owner`` (the read stamps the legacy Subject of the run's
    tenant); every fifth row is ``output.chunk`` without ``runId`` (every 25th instead
    ``approval.requested`` in its v1 shape, with ``message`` and ``timeout``): 21 rows of 100.
    """
    if seq == 1:
        return "run.started", {"workflowId": "wf-quarterly-report", "inputs": {"quarter": "Q3", "regions": 4},
                               "transport": "rest"}
    if seq % 25 == 0:
        return "approval.requested", {"artifactId": f"art-{seq}", "artifactType": "report",
                                      "title": "Approve the quarterly summary",
                                      "message": "Please review the regional figures before they are sent.",
                                      "timeout": 3_600_000, "onTimeout": "reject", "actions": ["accept", "reject"]}
    if seq % 5 == 0:
        return "output.chunk", {"nodeId": node_of(seq), "chunk": REASONING[(seq * 3) % 60:][:48], "channel": "text"}
    return None


# The reference host's stored shapes (issue 22), (type, payload, node_id), in the order it writes them.
HOST_SHAPES = (
    ("run.started", {"workflowId": "openwop-app.uppercase"}, None),
    ("node.started", {}, "uppercase"),
    ("node.completed", {"outputs": {"text": "HELLO SEAT"}}, "uppercase"),
    ("memory.written", {"tags": ["run", "uppercase"], "memoryId": "mem_5f2c9a", "memoryRef": "tenant-memory"},
     None),
    ("run.completed", {"output": {"text": "HELLO SEAT"}}, None),
)


def host_event(seq: int) -> tuple[str, dict, str | None]:
    return HOST_SHAPES[(seq - 1) % len(HOST_SHAPES)]


def node_of(seq: int) -> str:
    return f"n-{(seq - 1) // 25}"


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
    """The host's tables, the seat's schema (migrate), pgbench's tables, and the event data; then ANALYZE.

    The page runs are marked payloads-clean (each mark must succeed) and the projection runs' rows are
    checked with ``openwop_seat.fast_v2``: false exactly for the rows :func:`projection_event` makes.
    """
    cluster.psql(HOST_SCHEMA)
    migrate = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", cluster.dsn()],
                             capture_output=True, text=True, cwd=ROOT)
    if migrate.returncode != 0:
        raise SeedError(f"openwop-seat migrate failed:\n{migrate.stderr}")
    init = subprocess.run([pgbench, "-i", "-q", "-s", str(scale), "-h", "127.0.0.1", "-p", str(cluster.port),
                           "-U", "postgres", "postgres"], capture_output=True, text=True)
    if init.returncode != 0:
        raise SeedError(f"pgbench -i failed:\n{init.stderr}")
    names = renamed_types()
    rows = []
    for run in (*PAGE_RUNS, *ERA3_RUNS, *PROJECTION_RUNS):
        for seq in range(1, PAGE_ROWS + 1):
            v1 = TURN[(seq - 1) % len(TURN)]
            t, payload = (names[v1] if run in ERA3_RUNS else v1), page_payload(v1, seq)
            if run in PROJECTION_RUNS and projection_event(seq) is not None:
                t, payload = projection_event(seq)
            rows.append((f"ev-{run}-{seq}", str(run), seq, t, node_of(seq), json.dumps(payload), None))
    for run in HOST_MIX_RUNS:
        for seq in range(1, PAGE_ROWS + 1):
            t, payload, node = host_event(seq)
            rows.append((f"ev-{run}-{seq}", str(run), seq, t, node, json.dumps(payload), None))
    runs = [(str(r), TENANT) for r in (*PAGE_RUNS, *ERA3_RUNS, *PROJECTION_RUNS, *HOST_MIX_RUNS, *APPEND_RUNS)]

    async def insert() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=cluster.port, user="postgres", database="postgres")
        try:
            async with conn.transaction():
                await conn.executemany("INSERT INTO runs (run_id, tenant_id) VALUES ($1, $2)", runs)
                await conn.executemany(
                    "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) "
                    "VALUES ($1, $2, $3, $4, $5, $6::jsonb, now(), $7)", rows)
                # the era-3 runs are stamped after their events (an unclaimed session may not append to one)
                await conn.executemany("INSERT INTO openwop_seat.run_era (run_id, era, source) VALUES ($1, 3, 'bench')",
                                       [(str(r),) for r in ERA3_RUNS])
            for run in PAGE_RUNS:
                if await conn.fetchval("SELECT openwop_seat.mark_payloads_clean($1)", str(run)) is not True:
                    raise SeedError(f"openwop_seat.mark_payloads_clean({run!r}) did not mark the page run: its "
                                    f"payloads do not all fit v2 as the bench assumes")
            for run in PROJECTION_RUNS:
                needs = await conn.fetch(
                    "SELECT sequence, openwop_seat.fast_v2(type, payload) AS fast FROM events WHERE run_id = $1",
                    str(run))
                wrong = [r["sequence"] for r in needs if r["fast"] is not (projection_event(r["sequence"]) is None)]
                if len(needs) != PAGE_ROWS or wrong:
                    raise SeedError(f"projection run {run}: openwop_seat.fast_v2 disagrees with the bench on which "
                                    f"rows need projection (sequences {wrong[:10]})")
            # The v2 store (ADR 0015) as a running seat fills it in the background: every era-2 page run, so the
            # first round reads what the later ones read; and the (empty) runs to append into, which a seat would
            # otherwise fill in a burst 5 s after it starts, in the middle of the first workload's first round.
            for run in (*PAGE_RUNS, *PROJECTION_RUNS, *HOST_MIX_RUNS, *APPEND_RUNS):
                outcome = await conn.fetchval("SELECT openwop_seat.store_fill($1)", str(run))
                if outcome != "filled":
                    raise SeedError(f"openwop_seat.store_fill({run!r}) returned {outcome!r}, not 'filled'")
            await conn.execute("VACUUM ANALYZE")
        finally:
            await conn.close()

    asyncio.run(insert())


V1_APPLICATION = "v1-bench"  # the application_name the bench's seat config gives major 1


async def check_translation(seat_port: int, reference_port: int, cluster_port: int) -> None:
    """Fail unless every page reads through the seat as the workloads assume, and the v2 append works.

    * page runs (era 2, payloads-clean), major 2: the v2 name of every stored type, the payload as stored;
      through ``reference_port`` (PgBouncer) the stored v1 names;
    * era-3 runs, major 2: every page equal to direct PostgreSQL's, row for row;
    * page runs, major 1 (application_name :data:`V1_APPLICATION`): every page equal to direct's;
    * projection runs, major 2: the v2 name of every stored type, no error, and at least one payload of
      each page different from the stored one;
    * one append through the seat, written with the v2 name into an era-2 run, must return the v2 name,
      be stored by the v1 name, and leave the run era 2.
    """
    names = renamed_types()
    v1_to_v2 = load_artifacts().v1_to_v2

    def connect(port: int, **settings):
        return asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="postgres",
                               server_settings=settings or None)

    seat = await connect(seat_port)
    seat_v1 = await connect(seat_port, application_name=V1_APPLICATION)
    ref = await connect(reference_port)
    direct = await connect(cluster_port)
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
                if json.loads(t["payload"]) != json.loads(s["payload"]):
                    raise SeedError(f"run {run} sequence {s['sequence']}: the seat changed a payload of a "
                                    f"payloads-clean run")
            major1 = await seat_v1.fetch(PAGE_SQL, str(run), 0)
            if major1 != await direct.fetch(PAGE_SQL, str(run), 0):
                raise SeedError(f"run {run}: a major-1 page through the seat differs from direct PostgreSQL's")
        for run in ERA3_RUNS:
            through, plain = await seat.fetch(PAGE_SQL, str(run), 0), await direct.fetch(PAGE_SQL, str(run), 0)
            if len(plain) != PAGE_ROWS or through != plain:
                raise SeedError(f"era-3 run {run}: the page through the seat differs from direct PostgreSQL's "
                                f"({len(through)} / {len(plain)} rows)")
        for run in (*PROJECTION_RUNS, *HOST_MIX_RUNS):
            through, plain = await seat.fetch(PAGE_SQL, str(run), 0), await direct.fetch(PAGE_SQL, str(run), 0)
            if len(through) != PAGE_ROWS or len(plain) != PAGE_ROWS:
                raise SeedError(f"projection run {run}: a page of {len(through)} / {len(plain)} rows, not {PAGE_ROWS}")
            for t, s in zip(through, plain):
                if t["type"] != v1_to_v2.get(s["type"]):
                    raise SeedError(f"projection run {run} sequence {s['sequence']}: the seat read {t['type']!r} "
                                    f"for the stored {s['type']!r}")
            if all(json.loads(t["payload"]) == json.loads(s["payload"]) for t, s in zip(through, plain)):
                raise SeedError(f"projection run {run}: no payload of the page was projected")
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
        for conn in (seat, seat_v1, ref, direct):
            await conn.close()
