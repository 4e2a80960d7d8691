"""The audit at scale (issue #7): wall time and peak memory of ``openwop-seat audit`` over generated events.

    .venv/bin/python bench/audit_scale.py [events]     # default 1,000,000

Starts a throwaway PostgreSQL, installs the seat's schema, and generates era-2 runs of 100 events each with
``INSERT ... SELECT`` over ``generate_series`` (in the server: no client round trips): a run.started per run
(its payload is projected), renamed types, identity types, a registered vendor type, and one unmapped type
every 10,000 events (so the report has failures to count).  It audits a tenth of the events first, then all
of them, each time as a child process (``python -m proxy audit --no-progress --json ...``), and prints the
wall time and the child's peak RSS: the same peak at both sizes is the flat memory the issue asks for.
A measurement for the notes, not a test: no thresholds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from harness import HOST_SCHEMA  # noqa: E402
from proxy.dev.devcluster import DevCluster  # noqa: E402

PER_RUN = 100


def generate(cluster: DevCluster, lo: int, hi: int) -> None:
    """Events lo..hi-1 (whole runs of PER_RUN events), and their runs."""
    cluster.psql(f"""
INSERT INTO runs (run_id, tenant_id)
SELECT 'run-' || lpad(r::text, 8, '0'), 'acme' FROM generate_series({lo // PER_RUN}, {hi // PER_RUN - 1}) r;
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp)
SELECT 'ev-' || g, 'run-' || lpad((g / {PER_RUN})::text, 8, '0'), g % {PER_RUN}, k.t, 'n-1', k.p, now()
FROM generate_series({lo}, {hi - 1}) g
CROSS JOIN LATERAL (SELECT CASE
    WHEN g % {PER_RUN} = 0 THEN 'run.started'
    WHEN g % 10000 = 5 THEN 'foo.bar'
    WHEN g % 10 = 1 THEN 'agent.reasoning.delta'
    WHEN g % 50 = 7 THEN 'example.thing-happened'
    ELSE 'node.started' END AS t) k0
CROSS JOIN LATERAL (SELECT k0.t AS t, CASE k0.t
    WHEN 'run.started' THEN jsonb_build_object('workflowId', 'wf')
    WHEN 'agent.reasoning.delta' THEN jsonb_build_object('agentId', 'a', 'delta', 'd', 'sequence', g)
    WHEN 'node.started' THEN jsonb_build_object('nodeId', 'n-1', 'typeId', 't')
    ELSE jsonb_build_object('k', g) END AS p) k;
ANALYZE runs, events;
""")


def audit(cluster: DevCluster, report: str) -> tuple[float, int, int, dict]:
    """(wall seconds, peak RSS in KiB of the audit process itself, exit status, the JSON report)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_CONFIG"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "audit", "--dsn", cluster.dsn(), "--no-progress",
                                 "--json", report], cwd=ROOT, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, not the max over all children
        wall = time.monotonic() - start
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):
            err.seek(0)
            raise SystemExit(f"audit failed ({code}): {err.read().decode()}")
    return wall, usage.ru_maxrss, code, json.loads(Path(report).read_text())


def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    total -= total % PER_RUN
    first = max(PER_RUN, (total // 10) - (total // 10) % PER_RUN)
    os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())
    cluster = DevCluster().start()
    try:
        cluster.psql(HOST_SCHEMA)
        subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", cluster.dsn()], check=True,
                       capture_output=True, cwd=ROOT)
        with tempfile.TemporaryDirectory() as d:
            done = 0
            for size in (first, total):
                t0 = time.monotonic()
                generate(cluster, done, size)
                done = size
                gen = time.monotonic() - t0
                wall, rss, status, r = audit(cluster, os.path.join(d, f"audit-{size}.json"))
                print(f"{size:>10,} events ({size // PER_RUN:,} runs; generated in {gen:.1f} s): audit "
                      f"{wall:.1f} s ({size / wall:,.0f} events/s), peak RSS {rss / 1024:.1f} MiB, exit {status}, "
                      f"{r['events']['scanned']:,} scanned, {r['events']['wouldFail']:,} would fail, "
                      f"{r['events']['projected']:,} projected", flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
