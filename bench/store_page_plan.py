"""Rows read and time of a page of a long filled run through ``events_m2_run`` (ADR 0015, issue 22).

    .venv/bin/python -m bench.store_page_plan [--runs 20] [--length 3000] [--tail 30] [--limit 5] [--repeat 20]

Starts a throwaway cluster, installs the seat's schema (``migrate``), and stores ``--runs`` era-2 runs of
``--length`` rows each (the reference host's cheap shapes, cycled), fills them all into the v2 store, then appends
``--tail`` rows to the last run (above its mark: read at read time, ADR 0015's prefix-filled runs). Then, for the
host's page statement (``SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence ASC LIMIT $3``)
as the seat's classifier sends it for a major-2 session, prepared, in its form through ``events_m2_run($1)``
(``run``: every page before the page form) and its page form (``page``: the union of the store's arm and the live
arm, each with the page's clauses), under ``plan_cache_mode = force_generic_plan`` and ``force_custom_plan``, for a
filled run and for the run with a tail, and for its first page, a page from the middle and its last page, it prints
the rows the plan's scans read per relation (``EXPLAIN (ANALYZE, BUFFERS)``: actual rows times loops, plus rows
removed by a filter), the shared buffers hit, and the best of ``--repeat`` execution times (``EXPLAIN (ANALYZE,
TIMING OFF)``'s "Execution Time", ms, planning not counted: a cached generic plan has none). The same page of the
host's table (``direct``) is printed for comparison. Nothing here asserts a figure; docs/adr/0015-v2-store.md
quotes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import asyncpg

from proxy.artifacts.load import load_artifacts
from proxy.config import HostConfig, parse_config
from proxy.db.migrate import migrate
from proxy.dev.devcluster import DevCluster
from proxy.readpath.classify import Classifier

from .args import count, positive

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import HOST_SCHEMA  # noqa: E402

SHAPES = [  # (stored type, payload, node_id): era-2 rows the reader rule maps
    ("node.started", {}, "n1"),
    ("node.completed", {"outputs": {"text": "T0-49"}}, "n1"),
    ("memory.written", {"tags": ["a", "b"], "memoryId": "mem_1", "memoryRef": "tenant-memory"}, None),
]

PAGE = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence ASC LIMIT $3"


def statements() -> dict[str, str]:
    """The host's page statement as sent: to the table (direct), and as the seat's classifier rewrites it for a
    major-2 session with ``events_m2_run`` alone (``run``, before the page form) and with its page form
    (``page``: the store's and the live arm, each cut at the limit)."""
    host = HostConfig()
    return {"direct": PAGE,
            "run": Classifier(host, 2, run_function=True).classify(PAGE).text,
            "page": Classifier(host, 2, run_function=True, page_function=True).classify(PAGE).text}


async def seed(conn, runs: int, length: int, tail: int) -> None:
    await conn.execute("INSERT INTO runs (run_id, tenant_id) SELECT 'r' || i, 'acme' FROM generate_series(1, $1) i",
                       runs)
    for k, (t, payload, node) in enumerate(SHAPES):
        await conn.execute(
            "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
            "SELECT 'e' || i || '-' || s, 'r' || i, s, $1, $2, $3::jsonb, now() "
            "FROM generate_series(1, $4::int) i, generate_series(1, $5::int) s WHERE s % $6::int = $7::int",
            t, node, json.dumps(payload), runs, length, len(SHAPES), k)
    for r in await conn.fetch("SELECT openwop_seat.store_pending($1) AS run", runs + 1):
        verdict = await conn.fetchval("SELECT openwop_seat.store_fill($1)", r["run"])
        if verdict != "filled":
            raise RuntimeError(f"store_fill({r['run']}) said {verdict}")
    t, payload, node = SHAPES[0]
    await conn.execute(
        "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
        "SELECT 'e' || $1 || '-' || s, 'r' || $1, s, $2, $3, $4::jsonb, now() FROM generate_series($5::int, $6::int) s",
        str(runs), t, node, json.dumps(payload), length + 1, length + tail)
    marked = await conn.fetchval("SELECT count(*) FROM openwop_seat.events_v2_runs")
    if marked != runs:
        raise RuntimeError(f"{runs - marked} runs not marked after the fill and the tail")
    await conn.execute("VACUUM ANALYZE")


def read_rows(plan: dict) -> tuple[dict[str, int], int]:
    """Relation name -> rows its scans read; shared buffers hit and read."""
    out: dict[str, int] = {}

    def walk(node):
        if "Relation Name" in node:
            out[node["Relation Name"]] = out.get(node["Relation Name"], 0) + \
                node["Actual Rows"] * node["Actual Loops"] + node.get("Rows Removed by Filter", 0) + \
                node.get("Rows Removed by Index Recheck", 0)
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan["Plan"])
    return out, plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)


async def measure(conn, runs: int, length: int, tail: int, limit: int, repeat: int) -> list[dict]:
    out = []
    cases = [("filled", "r1", length), ("with tail", f"r{runs}", length + tail)]
    for mode in ("force_generic_plan", "force_custom_plan"):
        await conn.execute(f"SET plan_cache_mode = {mode}")
        for name, sql in statements().items():
            stmt = f"page_{mode.split('_')[1]}_{name}"
            await conn.execute(f"PREPARE {stmt}(text, integer, bigint) AS {sql}")
            for case, run, total in cases:
                for where, after in (("first", 0), ("middle", total // 2), ("last", total - limit)):
                    args = f"'{run}', {after}, {limit}"
                    (plan,) = json.loads(await conn.fetchval(
                        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {stmt}({args})"))
                    rows, buffers = read_rows(plan)
                    times = []
                    for _ in range(repeat):
                        (p,) = json.loads(await conn.fetchval(
                            f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) EXECUTE {stmt}({args})"))
                        times.append(p["Execution Time"])
                    out.append({"plan": mode.split("_")[1], "relation": name, "run": case, "page": where,
                                "after": after, "rows": rows, "buffers": buffers, "ms": min(times),
                                "returned": plan["Plan"]["Actual Rows"]})
    return out


async def run(port: int, args) -> list[dict]:
    conn = await asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="postgres")
    try:
        await seed(conn, args.runs, args.length, args.tail)
        return await measure(conn, args.runs, args.length, args.tail, args.limit, args.repeat)
    finally:
        await conn.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.store_page_plan", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=positive, default=20, help="runs, all filled (default 20)")
    parser.add_argument("--length", type=positive, default=3000, help="rows of each run (default 3000)")
    parser.add_argument("--tail", type=count, default=30, help="rows appended to the last run after its fill")
    parser.add_argument("--limit", type=positive, default=5, help="the page's LIMIT (default 5)")
    parser.add_argument("--repeat", type=positive, default=20, help="executions per figure, best kept (default 20)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())
    cluster = DevCluster(settings={"shared_buffers": "256MB"}).start()
    try:
        cluster.psql(HOST_SCHEMA)
        dsn = cluster.dsn()
        config = parse_config({"proxy": {"listen": "127.0.0.1:1", "upstream": f"127.0.0.1:{cluster.port}"},
                               "host": {"dsn": dsn, "tenant_column": "tenant_id", "node_id_column": "node_id",
                                        "event_id_column": "event_id"}})
        asyncio.run(migrate(dsn, config, load_artifacts(), out=lambda _line: None))
        results = asyncio.run(run(cluster.port, args))
    finally:
        cluster.stop()
    print(f"{args.runs} runs of {args.length} rows, all filled; the last with {args.tail} rows above its mark; "
          f"LIMIT {args.limit}; rows read per relation, shared buffers, best of {args.repeat} executions (ms)")
    print(f"{'plan':<8} {'form':<8} {'run':<10} {'page':<7} {'after':>6} {'store':>6} {'events':>6} "
          f"{'other':>6} {'bufs':>5} {'ms':>8}")
    for r in results:
        rows = dict(r["rows"])
        store, events = rows.pop("events_v2_store", 0), rows.pop("events", 0)
        print(f"{r['plan']:<8} {r['relation']:<8} {r['run']:<10} {r['page']:<7} {r['after']:>6} {store:>6} "
              f"{events:>6} {sum(rows.values()):>6} {r['buffers']:>5} {r['ms']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
