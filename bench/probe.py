"""A quick probe, not the benchmark: rough pgbench ratios and the classifier's per-statement costs.

    .venv/bin/python bench/probe.py

Starts a throwaway PostgreSQL, a seat as a plain relay (default_major "raw") and a seat in
translating sessions, and runs pgbench for 5 s per target (4 clients) on `-S` and on a 100-row
event page of an era-2 run. One run, no alternation, no PgBouncer: `make bench` (issue #6) is
the measurement; this only tells a developer where the time goes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from harness import HOST_SCHEMA, wait_listening  # noqa: E402
from proxy.config import HostConfig  # noqa: E402
from proxy.dev.devcluster import DevCluster, free_port  # noqa: E402
from proxy.readpath.classify import Classifier  # noqa: E402

PAGE = "SELECT * FROM events WHERE run_id = 'run-1' AND sequence > 0 ORDER BY sequence LIMIT 100"


def classifier_costs() -> None:
    c = Classifier(HostConfig(), 2)
    sql = "SELECT * FROM runs WHERE run_id = $1"
    c.classify(sql)
    n = 200_000
    print(f"prefilter:              {timeit.timeit(lambda: c.mentions_events(sql), number=n) / n * 1e6:.2f} us")
    print(f"cache hit:              {timeit.timeit(lambda: c.classify(sql), number=n) / n * 1e6:.2f} us")
    small = Classifier(HostConfig(), 2, cache_size=1)
    pair = [sql, sql + " "]
    seconds = timeit.timeit(lambda: [small.classify(s) for s in pair], number=n // 10)
    print(f"miss, no events:        {seconds / (n // 5) * 1e6:.2f} us")
    pages = [PAGE, PAGE + " "]
    seconds = timeit.timeit(lambda: [small.classify(s) for s in pages], number=100)
    print(f"miss, parse + rewrite:  {seconds / 200 * 1e6:.0f} us")


def pgbench(port: int, args: list[str]) -> float:
    out = subprocess.run(["pgbench", "-n", "-c", "4", "-j", "2", "-T", "5", "-h", "127.0.0.1", "-p", str(port),
                          "-U", "postgres", *args, "postgres"], capture_output=True, text=True).stdout
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


def main() -> None:
    classifier_costs()
    os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())
    tmp = Path(tempfile.mkdtemp(prefix="openwop-seat-probe-"))
    cluster = DevCluster().start()
    seats = []
    try:
        cluster.psql(HOST_SCHEMA)
        subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", cluster.dsn()], check=True,
                       capture_output=True, cwd=ROOT)
        renamed = "ARRAY['agent.reasoning.delta','run.resuming','node.started','run.dead_lettered']"
        cluster.psql(f"INSERT INTO events SELECT 'e'||g, 'run-1', g, ({renamed})[1 + g % 4], 'n', "
                     "jsonb_build_object('text', repeat('x', 200), 'i', g), now(), NULL FROM generate_series(1, 100) g")
        subprocess.run(["pgbench", "-i", "-s", "2", "-q", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
                        "postgres"], check=True, capture_output=True)
        ports = {}
        for name, extra in (("relay", 'default_major = "raw"\n'), ("seat", "")):
            port = free_port()
            cfg = tmp / f"{name}.toml"
            cfg.write_text(f'[proxy]\nlisten = "127.0.0.1:{port}"\nupstream = "127.0.0.1:{cluster.port}"\n{extra}'
                           f'[host]\ndsn = "{cluster.dsn()}"\n')
            proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(cfg)], cwd=ROOT,
                                    stderr=subprocess.DEVNULL)
            seats.append(proc)
            wait_listening(port, proc)
            ports[name] = port
        (tmp / "page.sql").write_text(PAGE + ";\n")
        for label, args in (("-S extended", ["-S", "-M", "extended"]), ("-S prepared", ["-S", "-M", "prepared"]),
                            ("100-row page", ["-f", str(tmp / "page.sql"), "-M", "extended"])):
            d, r, s = (pgbench(p, args) for p in (cluster.port, ports["relay"], ports["seat"]))
            print(f"{label:14} direct {d:8.0f} tps   relay {r:8.0f} ({r / d:.2f})   seat {s:8.0f} ({s / d:.2f})")
    finally:
        for proc in seats:
            proc.terminate()
            proc.wait(20)
        cluster.stop()


if __name__ == "__main__":
    main()
