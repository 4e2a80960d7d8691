"""A probe, not the benchmark: how many chunks the seat reads and writes per page, and its CPU per page (issue 27).

    .venv/bin/python -m bench.chunks [--seconds 6] [--rounds 5]

Starts a throwaway PostgreSQL with the bench's data (``pgbench -i -s 1`` and the bench's event runs), a seat whose
sessions are translated (major 2, claimed) and one whose sessions are raw (``default_major = "raw"``), as
``make bench`` does, and runs the bench's era-3 page workload (``pgbench -f page.sql -M extended``, 8 clients, the
100-row page of ``bench.seed.ERA3_RUNS``) against each in turn, ``--rounds`` times. For each run it reads the seat
process's ``/proc/<pid>/io`` and CPU time before and after: the read and write system calls per page (one read and
one write per chunk the seat receives, on either side: a page is one chunk from the client and what PostgreSQL's
answer arrived in), the bytes the seat read per page, and its CPU per 1,000 pages. The connects of the 8 clients
fall in the window too (a few reads and well under a µs of CPU per page at these counts).

PostgreSQL sends this page in the same four sends in both kinds of session (its 8 KiB send buffer filling up three
times, then the rest with ReadyForQuery); how many of them the seat finds at once when it reads is the pacing of
the machine's processes, which changes from round to round. The medians are printed last.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import seed, stack, workloads  # noqa: E402
from bench.args import positive  # noqa: E402
from proxy.db.layout import CLAIM_SECRET_ENV  # noqa: E402


def proc_io(pid: int) -> dict[str, int]:
    """The counters of /proc/<pid>/io (Linux): syscr and syscw count read and write system calls, rchar bytes read."""
    out = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        key, value = line.split(":")
        out[key] = int(value)
    return out


def one_run(pgbench: str, port: int, pid: int, script: Path, seconds: int) -> dict[str, float]:
    cmd = [pgbench, "-n", "-c", str(workloads.CLIENTS), "-j", str(workloads.THREADS), "-T", str(seconds),
           "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-f", str(script), "-M", "extended", "postgres"]
    io0, cpu0 = proc_io(pid), stack.cpu_seconds(pid)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    io1, cpu1 = proc_io(pid), stack.cpu_seconds(pid)
    pages = re.search(r"^number of transactions actually processed: (\d+)", done.stdout, re.M)
    failed = re.search(r"^number of failed transactions: (\d+)", done.stdout, re.M)
    if done.returncode != 0 or pages is None or (failed and int(failed.group(1)) > 0) or not int(pages.group(1)):
        raise workloads.WorkloadError(f"pgbench failed (exit {done.returncode}): {done.stderr[-2000:]}")
    n = int(pages.group(1))
    return {"pages_per_s": n / seconds, "reads": (io1["syscr"] - io0["syscr"]) / n,
            "writes": (io1["syscw"] - io0["syscw"]) / n, "bytes_read": (io1["rchar"] - io0["rchar"]) / n,
            "cpu_ms_per_1000": (cpu1 - cpu0) / n * 1e6}


def line(target: str, r: dict[str, float]) -> str:
    return (f"{target:10} {r['pages_per_s']:7.0f} pages/s  {r['reads']:5.2f} reads  {r['writes']:5.2f} writes  "
            f"{r['bytes_read']:7.0f} bytes read per page  {r['cpu_ms_per_1000']:6.1f} ms CPU per 1,000 pages")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chunks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=positive, default=6, help="seconds per pgbench run (default 6)")
    parser.add_argument("--rounds", type=positive, default=5, help="rounds over both seats (default 5)")
    args = parser.parse_args(argv)
    os.environ.setdefault(CLAIM_SECRET_ENV, secrets.token_hex(16))
    cluster = None
    running: list = []
    scratch = Path(tempfile.mkdtemp(prefix="openwop-seat-chunks-"))
    try:
        cluster = stack.start_cluster(50)
        pgbench = os.path.join(cluster.bin, "pgbench")
        if not os.path.exists(pgbench):
            pgbench = shutil.which("pgbench") or pgbench
        seed.load(cluster, pgbench, 1)
        seats = {"translated": stack.Seat(cluster, 100), "raw": stack.Seat(cluster, 100, default_major="raw")}
        running += seats.values()
        script = workloads.page_script(scratch, seed.ERA3_RUNS, "era3-page")
        print(f"era-3 page, pgbench -M extended, {workloads.CLIENTS} clients, {args.seconds} s per run; per page:",
              flush=True)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in seats}
        for round_no in range(args.rounds):
            for name, seat in seats.items():
                r = one_run(pgbench, seat.port, seat.pid, script, args.seconds)
                results[name].append(r)
                print(f"round {round_no + 1}/{args.rounds}  {line(name, r)}", flush=True)
        print("medians:")
        for name, rs in results.items():
            print(f"            {line(name, {k: statistics.median(r[k] for r in rs) for k in rs[0]})}")
    finally:
        for proc in running:
            proc.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
