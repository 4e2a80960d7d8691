"""Per-row cost of the payload projection in the database: the compiled ``payload_v2`` against the engine.

    .venv/bin/python -m bench.projection_cost [--rows 20000] [--repeat 5] [--declarations FILE]

Starts a throwaway cluster, installs the seat's schema (``migrate``), and stores era-2 runs shaped as the
unmodified reference host stores them (issue 22: ``run.started`` without owner, ``node.started {}``,
``node.completed {outputs}``, ``memory.written``, ``run.completed {output}``), ``--rows`` rows of each
type. For each type it times, in one session, the best of ``--repeat`` runs of

* ``direct``: ``SELECT sum(length(payload::text)) FROM events WHERE type = $1`` (the scan and output);
* ``view``: the same over ``openwop_seat.events_m2`` (what a major-2 reader pays: the compiled projection);
* ``engine``: the same over ``events`` with ``openwop_seat.project_live(...)`` per row (the PL/pgSQL walk
  the compiled projection replaced, still the fallback and the tests' oracle);

and prints µs per row above direct, and whether projection leaves the payload as stored or changes it.
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
from pathlib import Path

import asyncpg

from proxy.artifacts.load import load_artifacts
from proxy.config import parse_config
from proxy.db.migrate import migrate
from proxy.dev.devcluster import DevCluster
from proxy.errors import SeatException

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
ENGINE = ("SELECT sum(length(openwop_seat.project_live(type, payload, run_id, sequence, event_id, node_id)::text)) "
          "FROM events WHERE type = $1")


async def best(conn, sql: str, arg: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        await conn.fetchval(sql, arg)
        times.append(time.perf_counter() - start)
    return min(times)


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
            await conn.fetchval(READ.format(rel="openwop_seat.events_m2"), t)  # plan and cache once
            await conn.fetchval(ENGINE, t)
            direct = await best(conn, READ.format(rel="events"), t, repeat)
            view = await best(conn, READ.format(rel="openwop_seat.events_m2"), t, repeat)
            engine = await best(conn, ENGINE, t, repeat)
            changed = await conn.fetchval("SELECT payload IS DISTINCT FROM $2::jsonb FROM openwop_seat.events_m2 "
                                          "WHERE type = $1 LIMIT 1", t, json.dumps(payload))
            out.append({"type": t, "changed": changed, "direct_us": direct / rows * 1e6,
                        "compiled_added_us": (view - direct) / rows * 1e6,
                        "engine_added_us": (engine - direct) / rows * 1e6})
        return out
    finally:
        await conn.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.projection_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20000, help="rows of each type (default 20000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure, best kept (default 5)")
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
    print(f"{'stored type':<16} {'projection':<10} {'direct µs/row':>14} {'+compiled µs':>13} {'+engine µs':>11}")
    for r in results:
        print(f"{r['type']:<16} {'changes' if r['changed'] else 'as stored':<10} {r['direct_us']:>14.2f} "
              f"{r['compiled_added_us']:>13.2f} {r['engine_added_us']:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
