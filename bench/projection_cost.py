"""Per-row cost of the payload projection in the database: the compiled ``payload_v2`` against the engine.

    .venv/bin/python -m bench.projection_cost [--rows 20000] [--repeat 5] [--declarations FILE]

Starts a throwaway cluster, installs the seat's schema (``migrate``), and stores era-2 runs shaped as the
unmodified reference host stores them (issue 22: ``run.started`` without owner, ``node.started {}``,
``node.completed {outputs}``, ``memory.written``, ``run.completed {output}``), ``--rows`` rows of each
type. For each type it times, in one session, the best of ``--repeat`` runs of

* ``direct``: ``SELECT sum(length(payload::text)) FROM events WHERE type = $1`` (the scan and output);
* ``view``: the same over ``openwop_seat.events_m2_live`` (what a major-2 reader pays for a run not in the v2
  store: the compiled projection, ADR 0011);
* ``engine``: the same over ``events`` with ``openwop_seat.project_live(...)`` per row (the PL/pgSQL walk
  the compiled projection replaced, still the fallback and the tests' oracle);

and prints µs per row above direct, and whether projection leaves the payload as stored or changes it. Then,
for pages (the host's page statement run after run for 2,000 runs, evaluated inside the server, every column
computed), µs per row of a direct read, of the live translation (``events_m2_live``), and of ``events_m2``
once every run is filled into the v2 store (what a major-2 reader pays for a filled run, ADR 0015), and of
``events_m2_run(run)``, what the seat sends for a level that names its run (ADR 0015 decision 7). Then the
same pages of *active* runs: each run gets a few rows appended after its fill, which keep its mark (ADR 0015,
prefix-filled runs), so a page reads the store's prefix and the tail translated at read time; again after the
incremental fill that copies the tails; and the time of that incremental fill against a whole fill.
``--declarations FILE`` installs the operator's declarations (``[host] declarations_file``, ADR 0010), e.g.
``config/reference-host-declarations.toml``.
Nothing here asserts a figure; docs/performance.md quotes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import asyncpg

from proxy.artifacts.load import load_artifacts
from proxy.config import parse_config
from proxy.db.migrate import migrate
from proxy.dev.devcluster import DevCluster
from proxy.errors import SeatException

from .args import positive

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from harness import HOST_SCHEMA  # noqa: E402

SHAPES = [  # (stored type, payload, node_id)
    ("run.started", {"workflowId": "openwop-app.uppercase"}, None),
    ("node.started", {}, "n1"),
    ("node.completed", {"outputs": {"text": "T0-49"}}, "n1"),
    ("memory.written", {"tags": ["a", "b"], "memoryId": "mem_1", "memoryRef": "tenant-memory"}, None),
    ("run.completed", {"output": {"text": "HELLO SEAT"}}, None),
]

READ = "SELECT sum(length(payload::text)) FROM {rel} WHERE type = $1"
TAIL = 2  # rows appended to each run after its fill, for the active-run pages

ENGINE = ("SELECT sum(length(openwop_seat.project_live(type, payload, run_id, sequence, event_id, node_id)::text)) "
          "FROM events WHERE type = $1")


# The host's page statement for runs r1..rN, evaluated in the server with every column of every row computed.
PAGES_FUNCTION = """
CREATE FUNCTION pg_temp.pages_{name}(n integer) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    total bigint := 0;
    x bigint;
BEGIN
    FOR i IN 1..n LOOP
        SELECT sum(pg_catalog.length(q::text)) INTO x
        FROM (SELECT * FROM {rel} WHERE run_id = 'r' || i AND sequence > 0 ORDER BY sequence LIMIT 100) q;
        total := total + x;
    END LOOP;
    RETURN total;
END
$$"""


async def best(conn, sql: str, arg: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await conn.fetchval(sql, arg)
        times.append(time.perf_counter() - start)
    return min(times)


async def fill_pending(conn, n: int) -> Counter:
    """store_fill for each run store_pending lists (one transaction each, READ COMMITTED: autocommit); the
    outcomes counted."""
    outcomes: Counter = Counter()
    for r in await conn.fetch("SELECT openwop_seat.store_pending($1) AS run", n):
        outcomes[await conn.fetchval("SELECT openwop_seat.store_fill($1)", r["run"])] += 1
    return outcomes


async def measure(port: int, rows: int, repeat: int) -> list[dict]:
    conn = await asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="postgres")
    try:
        await conn.execute("INSERT INTO runs (run_id, tenant_id) SELECT 'r' || i, 'acme' FROM generate_series(1, $1) i",
                           rows)
        for seq, (t, payload, node) in enumerate(SHAPES, 1):
            await conn.execute(
                "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                "SELECT 'e' || i || '-' || $1::int, 'r' || i, $1::int, $2, $3, $4::jsonb, now() "
                "FROM generate_series(1, $5) i", seq, t, node, json.dumps(payload), rows)
        await conn.execute("ANALYZE")
        out = []
        for t, payload, _node in SHAPES:
            await conn.fetchval(READ.format(rel="openwop_seat.events_m2_live"), t)  # plan and cache once
            await conn.fetchval(ENGINE, t)
            direct = await best(conn, READ.format(rel="events"), t, repeat)
            view = await best(conn, READ.format(rel="openwop_seat.events_m2_live"), t, repeat)
            engine = await best(conn, ENGINE, t, repeat)
            changed = await conn.fetchval("SELECT payload IS DISTINCT FROM $2::jsonb FROM openwop_seat.events_m2_live "
                                          "WHERE type = $1 LIMIT 1", t, json.dumps(payload))
            out.append({"type": t, "changed": changed, "direct_us": direct / rows * 1e6,
                        "compiled_added_us": (view - direct) / rows * 1e6,
                        "engine_added_us": (engine - direct) / rows * 1e6})
        # Pages: the host's page statement, run after run, inside the server (no client round trip counted).
        pages = min(rows, 2000)
        for name, rel in (("direct", "events"), ("live", "openwop_seat.events_m2_live"),
                          ("store", "openwop_seat.events_m2"),
                          ("per_run", "openwop_seat.events_m2_run('r' || i) AS events")):
            await conn.execute(PAGES_FUNCTION.format(name=name, rel=rel))

        async def pages_of(name: str) -> float:
            """The best time of the page function ``name``, run once first (its plans cached, its buffers read)."""
            await conn.fetchval(f"SELECT pg_temp.pages_{name}(10)")
            return await best(conn, f"SELECT pg_temp.pages_{name}($1)", pages, repeat)

        page = {"direct": await pages_of("direct"), "live": await pages_of("live")}
        filled = (await fill_pending(conn, rows))["filled"]
        if filled != rows:
            raise RuntimeError(f"filled {filled} runs into the v2 store, not {rows}")
        await conn.execute("VACUUM ANALYZE")
        page["store"] = await pages_of("store")
        page["per_run"] = await pages_of("per_run")
        page_rows = pages * len(SHAPES)
        result = {"pages": pages, "rows_per_page": len(SHAPES),
                  **{f"page_{k}_us_per_row": v / page_rows * 1e6 for k, v in page.items()}}
        # An active run: every run gets TAIL more rows after its fill, as a v1 host still writing it appends them
        # (an append above the mark keeps it): the store's prefix and the tail read live, until an incremental
        # fill copies the tail.
        for seq, (t, payload, node) in enumerate(SHAPES[1:1 + TAIL], len(SHAPES) + 1):
            await conn.execute(
                "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp) "
                "SELECT 'e' || i || '-' || $1::int, 'r' || i, $1::int, $2, $3, $4::jsonb, now() "
                "FROM generate_series(1, $5) i", seq, t, node, json.dumps(payload), rows)
        marked = await conn.fetchval("SELECT count(*) FROM openwop_seat.events_v2_runs")
        if marked != rows:
            raise RuntimeError(f"{rows - marked} runs lost their mark to an append above it")
        await conn.execute("VACUUM ANALYZE")
        active = {name: await pages_of(name) for name in ("direct", "live", "store", "per_run")}
        # The incremental fill of those tails, against filling the same runs whole (their marks dropped first).
        start = time.perf_counter()
        extended = (await fill_pending(conn, rows))["extended"]
        fill_extended = time.perf_counter() - start
        if extended != rows:
            raise RuntimeError(f"extended {extended} runs' marks, not {rows}")
        await conn.execute("VACUUM ANALYZE")
        active["per_run_extended"] = await pages_of("per_run")
        await conn.execute("DELETE FROM openwop_seat.events_v2_runs")
        start = time.perf_counter()
        await fill_pending(conn, rows)
        fill_whole = time.perf_counter() - start
        active_rows = pages * (len(SHAPES) + TAIL)
        result.update({"active_rows_per_page": len(SHAPES) + TAIL, "tail": TAIL,
                       **{f"active_{k}_us_per_row": v / active_rows * 1e6 for k, v in active.items()},
                       "fill_extended_ms_per_run": fill_extended / rows * 1e3,
                       "fill_whole_ms_per_run": fill_whole / rows * 1e3})
        out.append(result)
        return out
    finally:
        await conn.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.projection_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=positive, default=20000, help="rows of each type (default 20000)")
    parser.add_argument("--repeat", type=positive, default=5, help="runs per figure, best kept (default 5)")
    parser.add_argument("--declarations", help="a declarations file to install (default: none)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())
    if args.declarations and not os.path.isfile(args.declarations):
        parser.error(f"--declarations: no such file: {args.declarations}")
    cluster = DevCluster(settings={"shared_buffers": "256MB"}).start()
    try:
        cluster.psql(HOST_SCHEMA)
        dsn = cluster.dsn()
        host = {"dsn": dsn, "tenant_column": "tenant_id", "node_id_column": "node_id", "event_id_column": "event_id"}
        if args.declarations:
            host["declarations_file"] = os.path.abspath(args.declarations)
        config = parse_config({"proxy": {"listen": "127.0.0.1:1", "upstream": f"127.0.0.1:{cluster.port}"},
                               "host": host})
        try:
            asyncio.run(migrate(dsn, config, load_artifacts(), out=lambda _line: None))
        except SeatException as e:  # a declarations file the pinned artifacts refuse, naming its line
            print(f"error: {e.describe()}", file=sys.stderr)
            return 2
        results = asyncio.run(measure(cluster.port, args.rows, args.repeat))
    finally:
        cluster.stop()
    page = results.pop()
    print(f"{'stored type':<16} {'projection':<10} {'direct µs/row':>14} {'+compiled µs':>13} {'+engine µs':>11}")
    for r in results:
        print(f"{r['type']:<16} {'changes' if r['changed'] else 'as stored':<10} {r['direct_us']:>14.2f} "
              f"{r['compiled_added_us']:>13.2f} {r['engine_added_us']:>11.2f}")
    print(f"\nthe host's page statement, {page['pages']} runs of {page['rows_per_page']} rows (one of each type "
          f"above), µs per row:")
    print(f"  direct {page['page_direct_us_per_row']:.2f}   through the live translation (ADR 0011) "
          f"{page['page_live_us_per_row']:.2f}   filled into the v2 store (ADR 0015) "
          f"{page['page_store_us_per_row']:.2f}   through events_m2_run, the classifier's form for a run's page "
          f"(ADR 0015 decision 7) {page['page_per_run_us_per_row']:.2f}")
    print(f"\nactive runs: each of those runs with {page['tail']} rows appended after its fill (its mark kept: "
          f"{page['active_rows_per_page']}-row pages, {page['tail']} rows read live), µs per row:")
    print(f"  direct {page['active_direct_us_per_row']:.2f}   live translation {page['active_live_us_per_row']:.2f}   "
          f"events_m2 {page['active_store_us_per_row']:.2f}   events_m2_run {page['active_per_run_us_per_row']:.2f}   "
          f"events_m2_run after an incremental fill {page['active_per_run_extended_us_per_row']:.2f}")
    print(f"  the fill of a run's tail (incremental) {page['fill_extended_ms_per_run']:.3f} ms a run, of the whole "
          f"run {page['fill_whole_ms_per_run']:.3f} ms (one transaction a run, from the client)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
