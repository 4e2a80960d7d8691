"""The measurements: one function per kind, each against one target's port, each returning figures.

* :func:`pgbench_tps`: pgbench for a fixed time; transactions per second (without connection time).
  The passthrough workloads (``-S`` in each protocol mode), the page reads in text format (a custom
  script over one set of runs, :func:`page_script`, ``-M extended`` as the host sends it; the major-1
  read with ``PGAPPNAME`` set) and the host's append are all pgbench.
* The connect workloads are pgbench ``-C`` (a new connection for each transaction) over ``SELECT 1``
  (:func:`select1_script`): connects per second at 1 client and at 8, the connection time included.
* :func:`binary_pages`: the same page read by asyncpg, which binds binary result formats; several
  connections in one process, pages per second.
* :func:`latency`: pgbench ``-S -M extended`` at one client with per-transaction logs (``-l``);
  p50, p99 and p99.9 of the transaction times, in µs.
* :func:`idle_rss`: the resident memory a process gains per idle client connection that completed
  its startup (and so holds its own server connection).

A failed transaction fails the measurement: a figure that includes errors is not a figure.
"""

from __future__ import annotations

import asyncio
import glob
import os
import re
import subprocess
import time
from pathlib import Path

import asyncpg
import uvloop

from .seed import APPEND_RUNS, HOST_MIX_RUNS, PAGE_ROWS, PAGE_SQL
from .stack import rss_kib

CLIENTS = 8  # the pgbench setting for every throughput workload: 8 clients, 2 threads
THREADS = 2


class WorkloadError(RuntimeError):
    """A measurement did not run cleanly (a client error, a failed transaction, a short page)."""


def page_script(directory: Path, runs: range, name: str = "page") -> Path:
    """The host's page read as a pgbench script: a random run of ``runs``, every row after sequence 0."""
    path = directory / f"{name}.sql"
    path.write_text(f"\\set run random({runs[0]}, {runs[-1]})\n"
                    "\\set after 0\n"
                    f"{PAGE_SQL.replace('$1', ':run').replace('$2', ':after')};\n")
    return path


def select1_script(directory: Path) -> Path:
    """``SELECT 1``: with pgbench ``-C``, a connect (libpq, as psycopg connects), the statement, a close."""
    path = directory / "select1.sql"
    path.write_text("SELECT 1;\n")
    return path


# The host's append of one event into run :run, as a transaction (pgbench script text; :type, :node and :payload
# from -D variables).
APPEND_TRANSACTION = (
    "BEGIN;\n"
    "SELECT pg_advisory_xact_lock(hashtext(:run), 1);\n"
    "WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = :run)\n"
    "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)\n"
    "SELECT :run || '.' || next.seq, :run, next.seq, :type, :node, :payload, now(), NULL FROM next\n"
    "RETURNING event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id;\n"
    "COMMIT;\n")


def host_request_script(directory: Path) -> Path:
    """One request of the reference host (docs: host-traffic): its run row, a page of a run's log (a run of the
    host's stored shapes), the append transaction with its advisory lock into an era-2 run, the run row's
    update, and the run list: eight statements, as the host sends them (extended protocol, unnamed statements;
    BEGIN and COMMIT as simple queries would be the same bytes here). The type, node and payload of the append
    come from ``-D`` variables, as for :func:`append_script`."""
    path = directory / "host-request.sql"
    path.write_text(
        f"\\set run random({APPEND_RUNS[0]}, {APPEND_RUNS[-1]})\n"
        f"\\set page random({HOST_MIX_RUNS[0]}, {HOST_MIX_RUNS[-1]})\n"
        "SELECT * FROM runs WHERE run_id = :run;\n"
        "SELECT * FROM events WHERE run_id = :page AND sequence > 0 ORDER BY sequence LIMIT 1000;\n"
        f"{APPEND_TRANSACTION}"
        "UPDATE runs SET status = 'running' WHERE run_id = :run;\n"
        "SELECT run_id, status, created_at FROM runs ORDER BY created_at DESC LIMIT 20;\n")
    return path


def append_script(directory: Path) -> Path:
    """The host's append as a pgbench script; the type, node and payload come from ``-D`` variables.

    The event id is made from the run and its new sequence (unique under the run's lock), since
    pgbench has no string functions; everything else is bound as the host binds it.
    """
    path = directory / "append.sql"
    path.write_text(
        f"\\set run random({APPEND_RUNS[0]}, {APPEND_RUNS[-1]})\n{APPEND_TRANSACTION}")
    return path


def pgbench_tps(pgbench: str, port: int, args: list[str], seconds: int, clients: int = CLIENTS,
                threads: int = THREADS, env: dict[str, str] | None = None) -> float:
    """Run pgbench against ``port`` for ``seconds``; its tps without initial connection time."""
    return pgbench_run(pgbench, port, args, seconds, clients, threads, env)[0]


def pgbench_run(pgbench: str, port: int, args: list[str], seconds: int, clients: int = CLIENTS,
                threads: int = THREADS, env: dict[str, str] | None = None) -> tuple[float, int]:
    """Run pgbench against ``port`` for ``seconds``: (tps without initial connection time, transactions).

    ``env``: extra environment variables for pgbench (libpq reads e.g. ``PGAPPNAME``).
    """
    cmd = [pgbench, "-n", "-c", str(clients), "-j", str(threads), "-T", str(seconds), "-h", "127.0.0.1",
           "-p", str(port), "-U", "postgres", *args, "postgres"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120,
                          env={**os.environ, **env} if env else None)
    failed = re.search(r"^number of failed transactions: (\d+)", done.stdout, re.M)
    # with -C (a connection per transaction) pgbench counts the reconnections in
    tps = re.search(r"^tps = ([\d.]+) \((?:without initial connection time|including reconnection times)\)",
                    done.stdout, re.M)
    if done.returncode != 0 or tps is None or (failed and int(failed.group(1)) > 0):
        shown = " ".join(a if len(a) < 80 else a[:77] + "..." for a in cmd)
        raise WorkloadError(f"pgbench failed (exit {done.returncode}): {shown}\n{done.stderr[-3000:]}"
                            f"{done.stdout[-1500:]}")
    done_tx = re.search(r"^number of transactions actually processed: (\d+)", done.stdout, re.M)
    return float(tps.group(1)), int(done_tx.group(1)) if done_tx else 0


def binary_pages(port: int, seconds: int, page_runs: range, connections: int = CLIENTS) -> float:
    """Pages per second: ``connections`` asyncpg connections in one process, each reading pages of
    ``page_runs`` in a loop."""

    async def run() -> float:
        conns = await asyncio.gather(*(asyncpg.connect(host="127.0.0.1", port=port, user="postgres",
                                                       database="postgres") for _ in range(connections)))
        try:
            stmts = [await c.prepare(PAGE_SQL) for c in conns]
            runs = [str(r) for r in page_runs]
            deadline = time.monotonic() + seconds

            async def loop(stmt, k: int) -> int:
                n = 0
                while time.monotonic() < deadline:
                    rows = await stmt.fetch(runs[(k + n) % len(runs)], 0)
                    if len(rows) != PAGE_ROWS:
                        raise WorkloadError(f"a page of {len(rows)} rows, not {PAGE_ROWS}")
                    n += 1
                return n

            start = time.monotonic()
            pages = await asyncio.gather(*(loop(s, k) for k, s in enumerate(stmts)))
            return sum(pages) / (time.monotonic() - start)
        finally:
            await asyncio.gather(*(c.close() for c in conns))

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run())


def percentile(ordered: list[int], q: float) -> float:
    """The nearest-rank percentile of an ascending list."""
    if not ordered:
        raise WorkloadError("no transactions logged")
    rank = max(1, -(-round(q * 1000) * len(ordered) // 1000))  # ceil(q * n), in integers
    return float(ordered[min(rank, len(ordered)) - 1])


def latency(pgbench: str, port: int, seconds: int, logdir: Path, tag: str) -> dict:
    """pgbench -S -M extended at 1 client with per-transaction logs; p50/p99/p99.9 of the times, in µs."""
    prefix = logdir / f"latency-{tag}"
    pgbench_tps(pgbench, port, ["-S", "-M", "extended", "-l", f"--log-prefix={prefix}"], seconds,
                clients=1, threads=1)
    times: list[int] = []
    files = glob.glob(f"{prefix}.*")
    for name in files:
        with open(name) as f:
            # client_id transaction_no time script_no time_epoch time_us: "time" is the latency in µs
            times.extend(int(line.split()[2]) for line in f if line.strip())
        os.unlink(name)
    times.sort()
    return {"transactions": len(times), "p50_us": percentile(times, 0.5), "p99_us": percentile(times, 0.99),
            "p999_us": percentile(times, 0.999)}


def idle_rss(port: int, pid: int, connections: int, server_port: int) -> dict:
    """RSS of ``pid`` before and after ``connections`` idle client connections (each through its startup).

    Each connection runs one ``SELECT 1`` and then idles, as a host's pooled connection does; that
    also makes PgBouncer, which links a server connection only at a client's first query, hold one
    per client as the seat does from the startup on.  A few connections are opened and closed first,
    so one-time allocations (the first session's imports and caches) are not counted against the idle
    ones.  The server's client backends are counted while the connections are open
    (``server_connections``): fewer than ``connections`` fails the measurement.
    """

    async def connect() -> asyncpg.Connection:
        return await asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="postgres",
                                     timeout=60)

    async def run() -> dict:
        for _ in range(5):
            conn = await connect()
            await conn.fetchval("SELECT 1")
            await conn.close()
        await asyncio.sleep(0.5)
        before = rss_kib(pid)
        gate = asyncio.Semaphore(32)

        async def one() -> asyncpg.Connection:
            async with gate:
                conn = await connect()
                await conn.execute("SELECT 1")
                return conn

        opened = await asyncio.gather(*(one() for _ in range(connections)), return_exceptions=True)
        good = [c for c in opened if isinstance(c, asyncpg.Connection)]
        try:
            errors = [e for e in opened if not isinstance(e, asyncpg.Connection)]
            if errors:
                raise WorkloadError(f"{len(errors)} of {connections} idle connections failed: {errors[0]!r}")
            await asyncio.sleep(1.0)
            after = rss_kib(pid)
            server = await asyncpg.connect(host="127.0.0.1", port=server_port, user="postgres", database="postgres")
            try:
                backends = await server.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'") - 1
            finally:
                await server.close()
            if backends < connections:
                raise WorkloadError(f"{connections} idle client connections hold only {backends} server connections")
        finally:
            await asyncio.gather(*(c.close() for c in good), return_exceptions=True)
        return {"connections": connections, "rss_before_kib": before, "rss_after_kib": after,
                "kib_per_connection": (after - before) / connections, "server_connections": backends}

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run())
