"""`make demo`: a throwaway PostgreSQL with a host-shaped schema, the seat in front, a few reads through it.

Everything runs on loopback and is removed on exit (Ctrl-C included).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import asyncpg

from .devcluster import DevCluster, PostgresNotFound, free_port

HOST_SCHEMA = """
CREATE TABLE runs (
    run_id text PRIMARY KEY, tenant_id text NOT NULL, status text, inputs jsonb, metadata jsonb,
    configurable jsonb, parent_run_id text, created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE events (
    event_id text PRIMARY KEY, run_id text NOT NULL, sequence integer NOT NULL, type text NOT NULL,
    node_id text, payload jsonb, timestamp timestamptz NOT NULL, causation_id text,
    UNIQUE (run_id, sequence));
"""

# The host's append: advisory xact lock, then a CTE computing the next sequence, RETURNING the row.
APPEND = """
WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = $1)
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT $2, $1, next.seq, $3, $4, $5, now(), $6 FROM next
RETURNING event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id
"""

PAGE = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"


def _print_rows(title: str, rows) -> None:
    print(f"\n{title}")
    for r in rows:
        print(f"  #{r['sequence']:<2} {r['type']:<28} {r['payload']}")


async def _through_seat(port: int) -> None:
    conn = await asyncpg.connect(host="127.0.0.1", port=port, user="postgres", database="postgres")
    try:
        print(f"\nconnected through the seat on 127.0.0.1:{port}; server says:",
              await conn.fetchval("SELECT version()"))
        await conn.execute("INSERT INTO runs (run_id, tenant_id, status) VALUES ('run-demo', 'tenant-1', 'running')")
        for i, (etype, payload) in enumerate([
            ("run.started", '{"engineVersion": "1"}'),
            ("agent.reasoning-delta", '{"text": "thinking..."}'),
            ("node.completed", '{"nodeId": "n1"}'),
        ]):
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1), 1)", "run-demo")
                row = await conn.fetchrow(APPEND, "run-demo", f"evt-{i}", etype, "n1", payload, None)
            print(f"  appended {row['event_id']} as sequence {row['sequence']} ({row['type']})")
        _print_rows("log page read through the seat (SELECT * … ORDER BY sequence LIMIT 100):",
                    await conn.fetch(PAGE, "run-demo", 0, 100))
        print("\nthe seat relays these untouched for now; era-aware translation is the next step.")
    finally:
        await conn.close()


def main() -> int:
    try:
        cluster = DevCluster()
    except PostgresNotFound as e:
        print(f"openwop-seat demo: {e}", file=sys.stderr)
        return 1
    seat = None
    logdir = tempfile.mkdtemp(prefix="openwop-seat-demo-")
    try:
        print("starting a throwaway PostgreSQL …")
        cluster.start()
        cluster.psql(HOST_SCHEMA)
        port = free_port()
        log_path = os.path.join(logdir, "seat.log")
        seat = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--listen", f"127.0.0.1:{port}",
                                 "--upstream", f"127.0.0.1:{cluster.port}"], stderr=open(log_path, "wb"))
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or seat.poll() is not None:
                    print(open(log_path).read(), file=sys.stderr)
                    raise RuntimeError("the seat did not start")
                time.sleep(0.1)
        asyncio.run(_through_seat(port))
        print("\nseat log:")
        seat.send_signal(signal.SIGTERM)
        seat.wait(20)
        print("".join(f"  {line}" for line in open(log_path)))
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        if seat is not None and seat.poll() is None:
            seat.kill()
            seat.wait()
        cluster.stop()
        shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
