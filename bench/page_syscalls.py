"""A probe, not the benchmark: a page's cost to the proxy process, the seat beside PgBouncer, taken apart.

    .venv/bin/python -m bench.page_syscalls [--workload host_mix] [--seconds 8] [--rounds 2] [--no-strace]

Starts a throwaway cluster loaded as ``make bench`` loads it (``bench.seed``), PgBouncer in session mode and the
seat, then, round after round, runs pgbench with the bench's page script of ``--workload`` (``host_mix``,
``projection``, ``era3``: the runs of ``make bench``'s workload of that name, 8 clients, 2 threads, ``-M extended``)
against each proxy for ``--seconds``, and prints per page: the proxy process's CPU time (``/proc/<pid>/stat``) and
its voluntary and involuntary context switches (``/proc/<pid>/status``). Then, unless ``--no-strace``, one more run
each under ``strace -c -f`` (which slows the proxy: only its counts are used) prints the system calls per page by
name. Nothing here asserts a figure; docs/performance.md quotes a run. Needs ``strace`` for the counts (Debian:
``apt-get install strace``); ``--no-strace`` runs without it.

Where the seat's CPU goes inside the process is py-spy's to say, not this probe's (py-spy is not a dependency of the
project): ``py-spy record -r 1000 -f raw -o spy.txt -p <seat pid> -d 9`` while this probe's pgbench runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import seed, stack, workloads
from .args import positive

RUNS = {"host_mix": seed.HOST_MIX_RUNS, "projection": seed.PROJECTION_RUNS, "era3": seed.ERA3_RUNS}


def switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of a process so far, summed over its threads."""
    voluntary = involuntary = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        voluntary += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))
        involuntary += int(re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))
    return voluntary, involuntary


def pages(pgbench: str, port: int, script: Path, seconds: int, user: str) -> int:
    done = subprocess.run([pgbench, "-n", "-f", str(script), "-M", "extended", "-c", str(workloads.CLIENTS),
                           "-j", str(workloads.THREADS), "-T", str(seconds), "-h", "127.0.0.1", "-p", str(port),
                           "-U", user, "postgres"], capture_output=True, text=True, timeout=seconds + 120)
    processed = re.search(r"^number of transactions actually processed: (\d+)", done.stdout, re.M)
    if done.returncode != 0 or processed is None:
        raise RuntimeError(f"pgbench failed (exit {done.returncode}) against port {port}:\n{done.stderr[-2000:]}")
    return int(processed.group(1))


def syscalls(pgbench: str, port: int, pid: int, script: Path, seconds: int, user: str) -> dict[str, float]:
    """System calls per page of the proxy process, by name, counted by ``strace -c -f`` over one run."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", out.name],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)  # attached
            n = pages(pgbench, port, script, seconds, user)
        finally:
            tracer.send_signal(2)  # strace writes its table when interrupted
            tracer.wait(30)
        counts = {}
        for line in out.read().splitlines():
            m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
            if m and m.group(2) != "total":
                counts[m.group(2)] = int(m.group(1)) / n
        return counts


def page_options(parser: argparse.ArgumentParser, rounds: int) -> None:
    """The options of the probes that run the bench's page script against proxies (this one, page_cpu_split)."""
    parser.add_argument("--workload", choices=sorted(RUNS), default="host_mix", help="the page runs (default host_mix)")
    parser.add_argument("--seconds", type=positive, default=8, help="seconds per run (default 8)")
    parser.add_argument("--rounds", type=positive, default=rounds, help=f"rounds over the proxies (default {rounds})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.page_syscalls", description=__doc__.split("\n")[0])
    page_options(parser, 2)
    parser.add_argument("--no-strace", action="store_true", help="skip the system-call counts")
    args = parser.parse_args(argv)
    if not args.no_strace and shutil.which("strace") is None:
        parser.error("strace is not installed (apt-get install strace), or pass --no-strace")
    with page_stack(args.workload) as (cluster, pgbench, script, targets):
        print(f"{args.workload} pages, pgbench -M extended, {workloads.CLIENTS} clients, {args.seconds} s a run")
        for rnd in range(args.rounds):
            for name, (port, pid) in targets.items():
                (v0, i0), c0 = switches(pid), stack.cpu_seconds(pid)
                n = pages(pgbench, port, script, args.seconds, cluster.superuser)
                (v1, i1), c1 = switches(pid), stack.cpu_seconds(pid)
                print(f"round {rnd + 1}  {name:<10} {n / args.seconds:8.0f} pages/s  CPU {(c1 - c0) / n * 1e6:6.1f} µs "
                      f"a page  context switches a page: {(v1 - v0) / n:.2f} voluntary, {(i1 - i0) / n:.2f} "
                      f"involuntary", flush=True)
        if not args.no_strace:
            for name, (port, pid) in targets.items():
                counts = syscalls(pgbench, port, pid, script, args.seconds, cluster.superuser)
                shown = ", ".join(f"{call} {per:.2f}" for call, per in sorted(counts.items(), key=lambda kv: -kv[1])
                                  if per >= 0.01)
                print(f"{name:<10} system calls a page (strace -c): {sum(counts.values()):.2f}: {shown}")
    return 0


@contextlib.contextmanager
def page_stack(workload: str, floors: bool = False, baseline: Path | None = None):
    """A throwaway cluster loaded as ``make bench`` loads it, PgBouncer in session mode and the seat in front of it,
    and the bench's page script of ``workload``: (cluster, pgbench, script, {name: (port, pid)}); all stopped after.
    ``floors``: two more proxies, a seat whose sessions are raw (its relay without the read path, the page read as
    stored) and the bare uvloop relay (``bench.bare_relay``). ``baseline``: a seat running the code of another
    checkout (``seat base``), for an A/B of a change."""
    os.environ.setdefault("OPENWOP_SEAT_CLAIM_SECRET", os.urandom(16).hex())
    cluster = stack.start_cluster(10)
    running: list = []
    try:
        pgbench = os.path.join(cluster.bin, "pgbench")
        pgbench = pgbench if os.path.exists(pgbench) else shutil.which("pgbench") or pgbench
        seed.load(cluster, pgbench, 1)
        bouncer = stack.PgBouncer(stack.find_pgbouncer(), cluster, 110)
        running.append(bouncer)
        seat = stack.Seat(cluster, 110)
        running.append(seat)
        targets = {"seat": (seat.port, seat.pid), "pgbouncer": (bouncer.port, bouncer.pid)}
        if baseline is not None:
            base = stack.Seat(cluster, 110, root=baseline.resolve())
            running.append(base)
            targets["seat base"] = (base.port, base.pid)
        if floors:
            raw = stack.Seat(cluster, 110, default_major="raw")
            running.append(raw)
            bare = stack.BareRelay(cluster)
            running.append(bare)
            targets.update({"seat raw": (raw.port, raw.pid), "bare relay": (bare.port, bare.pid)})
        script = workloads.page_script(Path(tempfile.mkdtemp()), RUNS[workload], f"{workload}-page")
        yield cluster, pgbench, script, targets
    finally:
        for proc in reversed(running):
            proc.stop()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
