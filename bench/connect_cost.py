"""A quick probe, not the benchmark: what a connect costs, and what a backend costs PostgreSQL in memory.

    .venv/bin/python bench/connect_cost.py [--connects 200]

Starts a throwaway PostgreSQL with the reference host's tables, migrates the seat's schema, and starts one
seat (major 2 by default, major 1 for application_name ``v1-host``, raw for ``ops``). Then, one client after
the other, ``--connects`` times per target: a psycopg connect, ``SELECT 1``, close; the median and the
mean in ms. Last, the memory of a backend: the sum of ``pg_backend_memory_contexts.total_bytes`` (what
PostgreSQL has allocated in that backend) read by the session itself, right after connect and after one
100-row page of an era-2 run, direct and through the seat. And the claim's database time: the CPU time a fresh
backend spends on its first statement (``/proc/<pid>/schedstat`` of the backend, so not skewed by a loaded machine;
the PostgreSQL of this probe runs here), ``SELECT 1`` against ``claim_once`` as the seat sends it and against each
part of it alone (``CLAIM_PARTS``: the relations, the function and the digest a fresh backend meets for the first
time), interleaved, median over ``--claims`` backends (ADR 0013's addendum, ADR 0021); and a fresh backend's
first projected row, its CPU and the PL/pgSQL memory it compiled (ADR 0011's addendum). One run, no alternation:
``make bench --only connect`` is the measurement; this tells a developer where the time and the memory go.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from proxy.db.claims import claim_once_params
from proxy.db.layout import CLAIM_ONCE_ONLY_SQL, CLAIM_ONCE_PARAM_OIDS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench.args import positive  # noqa: E402
from bench.seed import TURN, page_payload  # noqa: E402
from bench.stack import backend_cpu_ns  # noqa: E402
from harness import HOST_SCHEMA, render_config, wait_listening  # noqa: E402
from proxy.dev.devcluster import DevCluster, free_port  # noqa: E402

PAGE = "SELECT * FROM events WHERE run_id = 'run-1' AND sequence > 0 ORDER BY sequence LIMIT 100"
MEMORY = "SELECT sum(total_bytes) FROM pg_backend_memory_contexts"


def connects(dsn: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT 1").fetchone()
        times.append((time.perf_counter() - t) * 1000)
    return times


# What claim_once touches that SELECT 1 does not, each as a fresh backend's first statement (ADR 0021): what a
# fresh backend pays the first time it reads a relation, calls a function or fetches a digest from OpenSSL.
CLAIM_PARTS = {
    "pg_stat_get_activity": "SELECT (SELECT a.backend_start FROM pg_catalog.pg_stat_get_activity("
                            "pg_catalog.pg_backend_pid()) a)",
    "claims read": "SELECT (SELECT c.backend_start FROM openwop_seat.claims c WHERE c.pid = 0)",
    "claim_secret read": "SELECT (SELECT s.hmac_ipad FROM openwop_seat.claim_secret s)",
    "sha256": "SELECT pg_catalog.sha256('\\x01'::bytea)",
    "timestamps": "SELECT pg_catalog.to_timestamp(1::float8 / 1000000::float8) < pg_catalog.statement_timestamp() "
                  "- '60000000 microseconds'::interval",
}


FIRST_PROJECTION = ("SELECT openwop_seat.payload_v2('run.completed', '{\"output\": {\"text\": \"x\"}}', 'run-1', 5, "
                    "'e5', NULL)")
PLPGSQL_MEMORY = "SELECT sum(total_bytes) FROM pg_backend_memory_contexts WHERE name = 'PL/pgSQL function'"


def first_projection(dsn: str, n: int) -> tuple[float, float]:
    """A fresh backend's first projected row (``payload_v2`` of one ``run.completed`` payload, ADR 0011): the
    median CPU ms of that statement, and KiB of the PL/pgSQL functions it compiled (their memory contexts)."""
    times, kib = [], []
    for _ in range(n):
        with psycopg.connect(dsn, autocommit=True) as conn:
            pg = conn.pgconn
            before = backend_cpu_ns(pg.backend_pid)
            conn.execute(FIRST_PROJECTION).fetchone()
            times.append((backend_cpu_ns(pg.backend_pid) - before) / 1e6)
            kib.append(int(conn.execute(PLPGSQL_MEMORY).fetchone()[0] or 0) / 1024)
    return statistics.median(times), statistics.median(kib)


def first_statement_cpu(dsn: str, secret: str, salt: str, n: int) -> dict[str, float]:
    """Median CPU ms of a fresh backend's first statement: SELECT 1, each of the claim's parts (CLAIM_PARTS), and
    claim_once as the seat sends it (parameter types by OID, without the ownership question); interleaved, one
    backend each."""
    times: dict[str, list[float]] = {"SELECT 1": [], **{part: [] for part in CLAIM_PARTS}, "claim_once": []}
    for _ in range(n):
        for name in times:
            with psycopg.connect(dsn, autocommit=True) as conn:
                pg = conn.pgconn
                if name == "claim_once":
                    params = [str(v).encode() for v in claim_once_params(secret, salt, pg.backend_pid, 2)]
                    sql, oids = CLAIM_ONCE_ONLY_SQL.encode(), list(CLAIM_ONCE_PARAM_OIDS)
                else:
                    params, sql, oids = [], CLAIM_PARTS.get(name, "SELECT 1").encode(), []
                before = backend_cpu_ns(pg.backend_pid)
                result = pg.exec_params(sql, params, oids)
                times[name].append((backend_cpu_ns(pg.backend_pid) - before) / 1e6)
                if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                    raise RuntimeError(f"{name}: {result.error_message.decode(errors='replace')}")
                if name == "claim_once" and result.get_value(0, 0) != b"ok":
                    raise RuntimeError(f"claim_once answered {result.get_value(0, 0)!r}")
    return {name: statistics.median(t) for name, t in times.items()}


def memory(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        fresh = conn.execute(MEMORY).fetchone()[0]
        rows = conn.execute(PAGE).fetchall()
        if os.environ.get("CONNECT_COST_SHOW"):
            print(len(rows), rows[0][3], rows[1][3], conn.execute(
                "SELECT name, total_bytes FROM pg_backend_memory_contexts ORDER BY 2 DESC LIMIT 4").fetchall())
        after = conn.execute(MEMORY).fetchone()[0]
    return int(fresh), int(after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connects", type=positive, default=200)
    parser.add_argument("--claims", type=positive, default=60, help="fresh backends per statement for the claim's time")
    args = parser.parse_args()
    os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())
    tmp = Path(tempfile.mkdtemp(prefix="openwop-seat-connect-"))
    cluster = DevCluster(settings={"fsync": "off", "synchronous_commit": "off"}).start()
    seat = None
    try:
        cluster.psql(HOST_SCHEMA)
        subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", cluster.dsn()], check=True,
                       capture_output=True, cwd=ROOT)
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:  # a page of the bench's turn, era 2
            conn.cursor().executemany(
                "INSERT INTO events VALUES (%s, 'run-1', %s, %s, 'n', %s::jsonb, now(), NULL)",
                [(f"e{i}", i, TURN[(i - 1) % len(TURN)], json.dumps(page_payload(TURN[(i - 1) % len(TURN)], i)))
                 for i in range(1, 101)])
        port = free_port()
        cfg = tmp / "seat.toml"
        cfg.write_text(render_config({
            "proxy": {"listen": f"127.0.0.1:{port}", "upstream": f"127.0.0.1:{cluster.port}", "workers": 1,
                      "clients": [{"application_name": "v1-host", "major": 1},
                                  {"application_name": "ops", "major": "raw"}]},
            "host": {"dsn": cluster.dsn()}}))
        seat = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(cfg)], cwd=ROOT,
                                stderr=subprocess.DEVNULL)
        wait_listening(port, seat)
        base = "host=127.0.0.1 dbname=postgres user=postgres"
        targets = {"direct": f"{base} port={cluster.port}", "seat major 2": f"{base} port={port}",
                   "seat major 1": f"{base} port={port} application_name=v1-host",
                   "seat raw": f"{base} port={port} application_name=ops"}
        for dsn in targets.values():  # warm up: the seat's caches, the OS's
            connects(dsn, 5)
        direct = None
        for name, dsn in targets.items():
            times = connects(dsn, args.connects)
            median = statistics.median(times)
            direct = direct or median
            print(f"{name:13} {args.connects} connects + SELECT 1: median {median:.2f} ms, mean "
                  f"{statistics.fmean(times):.2f} ms, total {sum(times) / 1000:.2f} s ({median / direct:.2f}x direct)")
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            salt = conn.execute("SELECT salt FROM openwop_seat.claim_secret").fetchone()[0]
        try:
            cpu = first_statement_cpu(cluster.dsn(), os.environ["OPENWOP_SEAT_CLAIM_SECRET"], salt, args.claims)
        except OSError as e:  # no /proc/<pid>/schedstat (not Linux, or the backend runs elsewhere)
            print(f"claim's database time: not measured ({e})")
        else:
            print(f"fresh backend, first statement, backend CPU (median of {args.claims}): "
                  + ", ".join(f"{name} {ms:.2f} ms" for name, ms in cpu.items()))
        try:
            ms, kib = first_projection(cluster.dsn(), args.claims)
        except OSError as e:
            print(f"first projected row: not measured ({e})")
        else:
            print(f"fresh backend, first projected row (payload_v2 of a run.completed payload, median of "
                  f"{args.claims}): backend CPU {ms:.2f} ms, PL/pgSQL functions compiled {kib:.0f} KiB")
        for name in ("direct", "seat major 2", "seat raw"):
            samples = [memory(targets[name]) for _ in range(5)]
            fresh = statistics.median(s[0] for s in samples)
            after = statistics.median(s[1] for s in samples)
            print(f"{name:13} backend memory: {fresh / 1024:.0f} KiB after connect, {after / 1024:.0f} KiB after a "
                  f"100-row page")
    finally:
        if seat is not None:
            seat.terminate()
            seat.wait(20)
        cluster.stop()


if __name__ == "__main__":
    main()
