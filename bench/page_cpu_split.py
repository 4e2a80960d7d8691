"""A probe, not the benchmark: where a page's CPU goes on the machine, PostgreSQL, the proxy and pgbench, for
the seat and for PgBouncer.

    .venv/bin/python -m bench.page_cpu_split [--workload host_mix] [--seconds 8] [--rounds 3]

On ``make bench``'s machine the page workloads use every core: PostgreSQL, the proxy and pgbench share two, so a
proxy's throughput ratio is set by the CPU a page costs all three together. This probe starts a throwaway
cluster loaded as ``make bench`` loads it (``bench.seed``), PgBouncer in session mode and the seat, then, round
after round, runs pgbench with the bench's page script of ``--workload`` (8 clients, 2 threads, ``-M extended``)
against each proxy and prints the CPU per page of

* PostgreSQL: every process of the cluster (the postmaster and its children, backends that ended included: the
  postmaster's children's time, ``cutime`` and ``cstime`` of ``/proc/<pid>/stat``, once it has reaped them);
* the proxy process (``/proc/<pid>/stat``);
* pgbench (this process's children's time, ``getrusage``);

and their sum, the page's whole CPU, against what the machine had (cores × seconds ÷ pages). Nothing here asserts
a figure; docs/performance.md and ADR 0021 quote a run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

from . import stack, workloads
from .args import positive
from .page_syscalls import RUNS, page_stack, pages

TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 is [0]


def cluster_cpu(postmaster: int) -> float:
    """CPU seconds of the cluster so far: the postmaster's own and its reaped children's, and its live children's."""
    fields = _stat_fields(postmaster)
    total = sum(int(f) for f in fields[11:15]) / TICK  # utime, stime, cutime, cstime
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            child = _stat_fields(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(child[1]) == postmaster:  # ppid
            total += (int(child[11]) + int(child[12])) / TICK
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.page_cpu_split", description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=sorted(RUNS), default="host_mix", help="the page runs (default host_mix)")
    parser.add_argument("--seconds", type=positive, default=8, help="seconds per run (default 8)")
    parser.add_argument("--rounds", type=positive, default=3, help="rounds over both proxies (default 3)")
    args = parser.parse_args(argv)
    with page_stack(args.workload) as (cluster, pgbench, script, targets):
        postmaster = int(Path(cluster.datadir, "postmaster.pid").read_text().split()[0])
        cores = os.cpu_count() or 1
        print(f"{args.workload} pages, pgbench -M extended, {workloads.CLIENTS} clients, {args.seconds} s a run, "
              f"{cores} cores; CPU µs a page")
        figures: dict[str, list[tuple[float, ...]]] = {name: [] for name in targets}
        for name, (port, _pid) in targets.items():  # warm up: the proxies' server connections, the caches
            pages(pgbench, port, script, 2, cluster.superuser)
        for rnd in range(args.rounds):
            order = list(targets) if rnd % 2 == 0 else list(reversed(targets))
            for name in order:
                port, pid = targets[name]
                time.sleep(0.5)  # the last run's backends reaped
                pg0, proxy0, bench0, wall0 = cluster_cpu(postmaster), stack.cpu_seconds(pid), children_cpu(), \
                    time.monotonic()
                n = pages(pgbench, port, script, args.seconds, cluster.superuser)
                wall = time.monotonic() - wall0
                time.sleep(0.5)
                pg, proxy, bench = (cluster_cpu(postmaster) - pg0, stack.cpu_seconds(pid) - proxy0,
                                    children_cpu() - bench0)
                row = tuple(v / n * 1e6 for v in (pg, proxy, bench, pg + proxy + bench, cores * wall))
                figures[name].append(row + (n / args.seconds,))
                print(f"round {rnd + 1}  {name:<10} {n / args.seconds:8.0f} pages/s  PostgreSQL {row[0]:6.1f}  "
                      f"proxy {row[1]:5.1f}  pgbench {row[2]:5.1f}  all {row[3]:6.1f}  (machine {row[4]:6.1f})",
                      flush=True)
        print(f"medians over {args.rounds} rounds:")
        for name, rows in figures.items():
            med = [statistics.median(r[i] for r in rows) for i in range(6)]
            print(f"  {name:<10} {med[5]:8.0f} pages/s  PostgreSQL {med[0]:6.1f}  proxy {med[1]:5.1f}  "
                  f"pgbench {med[2]:5.1f}  all {med[3]:6.1f}  (machine {med[4]:6.1f})")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
