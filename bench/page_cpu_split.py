"""A probe, not the benchmark: where a page's CPU goes on the machine, PostgreSQL, the proxy and pgbench, for
the seat and for PgBouncer.

    .venv/bin/python -m bench.page_cpu_split [--workload host_mix] [--seconds 8] [--rounds 3] [--floors]
                                             [--baseline DIR]

On ``make bench``'s machine the page workloads use every core: PostgreSQL, the proxy and pgbench share two, so a
proxy's throughput ratio is set by the CPU a page costs all three together. This probe starts a throwaway
cluster loaded as ``make bench`` loads it (``bench.seed``), PgBouncer in session mode and the seat, then, round
after round, runs pgbench with the bench's page script of ``--workload`` (8 clients, 2 threads, ``-M extended``)
against each proxy and prints the CPU per page of

* PostgreSQL: every process of the cluster (the postmaster and its children, backends that ended included: the
  postmaster's children's time, ``cutime`` and ``cstime`` of ``/proc/<pid>/stat``, once it has reaped them);
* the proxy process (``/proc/<pid>/stat``);
* pgbench (this process's children's time, ``getrusage``);

and their sum, the page's whole CPU, against what the machine had (cores × seconds ÷ pages); the proxy's in user
and system time too (the interpreter and the event loop against the kernel's sends and receives). ``--floors``
adds two more proxies whose CPU per page bounds what the seat's own code costs: a seat whose sessions are raw (the
relay, its framing and the session's bookkeeping, without the read path) and ``bench.bare_relay`` (a bare uvloop
relay, nothing parsed); both read the page as stored, so only their proxy figures compare with the seat's.
``--baseline DIR`` adds a seat running the code of another checkout (as ``bench.pool_cost --baseline``: ``git
archive <commit> | tar -x -C DIR``, with the built C modules copied in), for an A/B of a change. Nothing
here asserts a figure; docs/performance.md and ADR 0021 quote a run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

from . import workloads
from .args import checkout
from .page_syscalls import page_options, page_stack, pages

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


def proxy_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the proxy process so far (fields 14 and 15 of /proc/<pid>/stat)."""
    fields = _stat_fields(pid)
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def line(name: str, row, rate: float) -> str:
    return (f"{name:<10} {rate:8.0f} pages/s  PostgreSQL {row[0]:6.1f}  proxy {row[1]:5.1f} (user {row[5]:5.1f}, "
            f"system {row[6]:5.1f})  pgbench {row[2]:5.1f}  all {row[3]:6.1f}  (machine {row[4]:6.1f})")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.page_cpu_split", description=__doc__.split("\n")[0])
    page_options(parser, 3)
    parser.add_argument("--floors", action="store_true", help="add a raw seat and the bare uvloop relay")
    parser.add_argument("--baseline", type=checkout, metavar="DIR", help="another checkout: a seat with its code too")
    args = parser.parse_args(argv)
    with page_stack(args.workload, floors=args.floors, baseline=args.baseline) as (cluster, pgbench, script, targets):
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
                pg0, (user0, sys0), bench0, wall0 = cluster_cpu(postmaster), proxy_cpu(pid), children_cpu(), \
                    time.monotonic()
                n = pages(pgbench, port, script, args.seconds, cluster.superuser)
                wall = time.monotonic() - wall0
                time.sleep(0.5)
                user, system = proxy_cpu(pid)
                pg, user, system, bench = (cluster_cpu(postmaster) - pg0, user - user0, system - sys0,
                                           children_cpu() - bench0)
                proxy = user + system
                row = tuple(v / n * 1e6 for v in (pg, proxy, bench, pg + proxy + bench, cores * wall, user, system))
                figures[name].append(row + (n / args.seconds,))
                print(f"round {rnd + 1}  {line(name, row, n / args.seconds)}", flush=True)
        print(f"medians over {args.rounds} rounds:")
        for name, rows in figures.items():
            med = [statistics.median(r[i] for r in rows) for i in range(8)]
            print(f"  {line(name, med, med[7])}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
