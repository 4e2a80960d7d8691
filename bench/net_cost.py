"""The net's cost on the host's hot path (ADR 0019): the append and a page, through the seat, as a role the net holds.

``python -m bench.net_cost [--seconds N] [--rounds N]``: a throwaway cluster with the reference host's tables, owned
by the superuser and granted to PUBLIC (as the integration tests have them), migrated; 200 era-2 runs to append to
and 20 era-3 runs of 1,000 events to page; one seat (``workers = 1``, the session major 2). pgbench ``-M prepared``
as ``host_user`` (no ``BYPASSRLS``), 2 clients, 1 thread, alternating append and page rounds; prints the
transactions per second of each round and the median. Run it from a checkout to measure that checkout's seat (run
it from two checkouts for a before/after). Not part of ``make bench``; a developer probe, like ``probe.py``."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from proxy.dev.devcluster import DevCluster, free_port
from tests.harness import HOST_SCHEMA, ROOT, render_config, wait_listening

APPEND = ("\\set run random(1, 200)\n"
          "BEGIN;\n"
          "SELECT pg_advisory_xact_lock(hashtext('a' || :run), 1);\n"
          "WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = 'a' || :run)\n"
          "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)\n"
          "SELECT 'a' || :run || '.' || next.seq, 'a' || :run, next.seq, 'agent.invocation-completed', 'n', "
          "'{}'::jsonb, now(), NULL FROM next\n"
          "RETURNING event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id;\n"
          "COMMIT;\n")
PAGE = ("\\set run random(1, 20)\n"
        "SELECT * FROM events WHERE run_id = 'p' || :run AND sequence > 0 ORDER BY sequence LIMIT 100;\n")


def pgbench(bin_dir: str, port: int, script: Path, seconds: int) -> float:
    out = subprocess.run([os.path.join(bin_dir, "pgbench"), "-n", "-M", "prepared", "-c", "2", "-j", "1", "-T",
                          str(seconds), "-h", "127.0.0.1", "-p", str(port), "-U", "host_user", "-f", str(script),
                          "postgres"], capture_output=True, text=True)
    line = next((x for x in out.stdout.splitlines() if x.startswith("tps = ")), None)
    failed = next((x for x in out.stdout.splitlines() if x.startswith("number of failed")), "")
    if out.returncode or line is None or not failed.endswith(": 0 (0.000%)") and failed:
        raise SystemExit(f"pgbench failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return float(line.split()[2])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    env = {**os.environ, "OPENWOP_SEAT_CLAIM_SECRET": os.environ.get("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())}
    with DevCluster(hba=["local all all trust", "host all all 127.0.0.1/32 trust"]) as pg, \
            tempfile.TemporaryDirectory() as tmp:
        pg.psql("CREATE ROLE host_user LOGIN")
        pg.psql(HOST_SCHEMA + "GRANT ALL ON runs, events TO PUBLIC;")
        done = subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", pg.dsn()], capture_output=True,
                              text=True, cwd=ROOT, env=env)
        if done.returncode:
            raise SystemExit(done.stderr)
        pg.psql("INSERT INTO runs (run_id, tenant_id) SELECT 'a' || i, 't' FROM generate_series(1, 200) i;"
                "INSERT INTO runs (run_id, tenant_id) SELECT 'p' || i, 't' FROM generate_series(1, 20) i;"
                "INSERT INTO events SELECT 'p' || r || '.' || s, 'p' || r, s, 'agent.invocation-completed', 'n', "
                "'{}'::jsonb, now(), NULL FROM generate_series(1, 20) r, generate_series(1, 1000) s;"
                "INSERT INTO openwop_seat.run_era (run_id, era, source) SELECT 'p' || i, 3, 'bench' "
                "FROM generate_series(1, 20) i; ANALYZE")
        port = free_port()
        config = Path(tmp) / "seat.toml"
        config.write_text(render_config({"proxy": {"listen": f"127.0.0.1:{port}", "upstream": f"127.0.0.1:{pg.port}",
                                                   "workers": 1},
                                         "metrics": {"listen": f"127.0.0.1:{free_port()}"},
                                         "host": {"dsn": pg.dsn(), "check_interval": 3600}}))
        seat = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "seat.log", "wb"))
        try:
            wait_listening(port, seat)
            scripts = {"append": Path(tmp) / "append.sql", "page": Path(tmp) / "page.sql"}
            scripts["append"].write_text(APPEND)
            scripts["page"].write_text(PAGE)
            got: dict[str, list[float]] = {"append": [], "page": []}
            for _ in range(args.rounds):
                for name, script in scripts.items():
                    got[name].append(pgbench(pg.bin, port, script, args.seconds))
            for name, tps in got.items():
                print(f"{name}: tps {' '.join(f'{t:.0f}' for t in tps)}; median {statistics.median(tps):.0f} "
                      f"({1e6 / statistics.median(tps) * 2:.0f} µs per transaction per client)")
        finally:
            seat.terminate()
            seat.wait(15)


if __name__ == "__main__":
    main()
