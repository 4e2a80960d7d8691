"""``python -m bench`` (``make bench``): the seat against direct PostgreSQL and PgBouncer, in alternating rounds.

The workloads (bench/report.py's THROUGHPUT): pgbench -S in each protocol mode; 100-row pages of era-3
runs read by major 2 (text, binary), of era-2 runs read by major 1 (text), of payloads-clean era-2 runs
translated type-only for major 2 (text, binary), and of era-2 runs needing payload projection (text,
reported with no goal); the host's append as a v2 writer into era-2 runs; latency at one client; and
idle-connection memory.  Direct PostgreSQL and PgBouncer read the same pages untranslated.

Each round runs every workload against direct, PgBouncer and the seat in that order, so drift of the
machine over the run falls on all three alike; the idle-connection memory is measured once at the end,
on a fresh seat and a fresh PgBouncer.  Prints one table and whether each goal is met, and writes
``bench/results/<date>-<commit>.json`` (or ``--out``).  Exit 0 when the bench ran (goals met or not),
1 when something it needs failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

from proxy.db.layout import CLAIM_SECRET_ENV
from proxy.dev.devcluster import PostgresNotFound

from . import report, seed, stack, workloads
from .args import positive

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = (*report.THROUGHPUT, "latency", "idle_memory")
GROUPS = {"connect": report.CONNECT,  # --only connect: both connect workloads
          "host_requests": ("host_requests_1", "host_requests_8"),
          "floor": report.FLOOR_WORKLOADS}  # --only floor: the workloads the bare relay runs (issue 27)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the seat against direct PostgreSQL and PgBouncer (session mode), all on loopback, "
                    "in alternating rounds; print one table with the seat's ratios and the issue's goals, and "
                    "write every figure as JSON. Starts its own PostgreSQL, PgBouncer (installing the Debian "
                    "package when missing and running as root) and seat (one worker); stops them on exit.")
    parser.add_argument("--rounds", type=positive, default=3, help="rounds over all targets (default 3)")
    parser.add_argument("--seconds", type=positive, default=15,
                        help="seconds per measurement of one workload against one target (default 15)")
    parser.add_argument("--only", action="append", choices=(*WORKLOADS, *GROUPS), metavar="WORKLOAD",
                        help=f"run only this workload (repeatable): {', '.join(WORKLOADS)}, or connect (both "
                             f"connect workloads), host_requests (both), or floor (the workloads the floor, a "
                             f"bare uvloop relay, runs beside the others: {', '.join(report.FLOOR_WORKLOADS)}); the "
                             f"ratios of the others are written as null")
    parser.add_argument("--idle-connections", type=positive, default=1000,
                        help="idle client connections for the memory figure (default 1000)")
    parser.add_argument("--scale", type=positive, default=10, help="pgbench -i scale factor (default 10)")
    parser.add_argument("--out", type=Path, metavar="PATH",
                        help="results file (default bench/results/<YYYY-MM-DD>-<short commit>.json)")
    return parser


def _terminate(signum, frame):  # SIGTERM: clean up as for Ctrl-C
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    only = {w for name in args.only or () for w in GROUPS.get(name, (name,))}
    selected = [w for w in WORKLOADS if not only or w in only]
    os.environ.setdefault(CLAIM_SECRET_ENV, secrets.token_hex(16))  # migrate and the seat share it
    signal.signal(signal.SIGTERM, _terminate)
    commit, dirty = stack.git_commit()
    out = args.out or ROOT / "bench" / "results" / f"{datetime.date.today().isoformat()}-{commit}.json"
    running: list = []
    cluster = None
    try:
        # each idle connection is one socket in this process, two in the seat and in PgBouncer
        stack.raise_nofile(2 * args.idle_connections + 256)
        pgbouncer_bin = stack.find_pgbouncer()
        print("starting PostgreSQL ...", flush=True)
        cluster = stack.start_cluster(args.idle_connections)
        pgbench = os.path.join(cluster.bin, "pgbench")
        if not os.path.exists(pgbench):
            pgbench = shutil.which("pgbench") or pgbench
        print(f"loading data (pgbench -i -s {args.scale}; runs of {seed.PAGE_ROWS} events: "
              f"{len(seed.PAGE_RUNS)} era-2 payloads-clean, {len(seed.ERA3_RUNS)} era-3, "
              f"{len(seed.PROJECTION_RUNS)} era-2 needing projection; {len(seed.APPEND_RUNS)} runs to append "
              f"into) ...", flush=True)
        seed.load(cluster, pgbench, args.scale)
        bouncer = stack.PgBouncer(pgbouncer_bin, cluster, args.idle_connections + 100)
        running.append(bouncer)
        seat = stack.Seat(cluster, args.idle_connections + 100)
        running.append(seat)
        asyncio.run(seed.check_translation(seat.port, bouncer.port, cluster.port))
        ports = {"direct": cluster.port, "pgbouncer": bouncer.port, "seat": seat.port}
        pids = {"pgbouncer": bouncer.pid, "seat": seat.pid}
        if any(w in report.FLOOR_WORKLOADS for w in selected):
            # the floor, a bare uvloop relay, and the seat with raw sessions between it and the seat (issue 27)
            floor = stack.BareRelay(cluster)
            running.append(floor)
            ports[report.FLOOR], pids[report.FLOOR] = floor.port, floor.pid
            raw = stack.Seat(cluster, args.idle_connections + 100, default_major="raw")
            running.append(raw)
            ports[report.RAW_SEAT], pids[report.RAW_SEAT] = raw.port, raw.pid
        if any(w in report.CONNECT for w in selected):
            # The seat with reuse ([pool], ADR 0016), for the connect workloads: the superuser gets a SCRAM password
            # (pg_hba stays trust: direct and PgBouncer log in as before), the seat its verifier.
            cluster.psql(f"SET password_encryption = 'scram-sha-256'; "
                         f"ALTER ROLE {cluster.superuser} PASSWORD '{stack.POOL_PASSWORD}'")
            verifier = cluster.psql("SELECT rolpassword FROM pg_authid WHERE rolname = current_user").strip()
            pooled = stack.Seat(cluster, args.idle_connections + 100, pool_verifier=verifier)
            running.append(pooled)
            ports[report.POOLED], pids[report.POOLED] = pooled.port, pooled.pid
            # …and PgBouncer with the same login, SCRAM-SHA-256 (the client's PBKDF2 is most of a reused connect)
            scram_bouncer = stack.PgBouncer(pgbouncer_bin, cluster, args.idle_connections + 100,
                                            scram_verifier=verifier)
            running.append(scram_bouncer)
            ports[report.BOUNCER_SCRAM], pids[report.BOUNCER_SCRAM] = scram_bouncer.port, scram_bouncer.pid
        document = {
            "bench": "openwop-seat make bench (issues #6, #15)",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit,
            "dirty": dirty,
            "settings": {"rounds": args.rounds, "seconds": args.seconds, "clients": workloads.CLIENTS,
                         "threads": workloads.THREADS, "pgbench_scale": args.scale,
                         "idle_connections": args.idle_connections, "workloads": selected,
                         "targets": [*report.TARGETS, report.POOLED, report.BOUNCER_SCRAM, report.RAW_SEAT,
                                     report.FLOOR],
                         "seat_workers": 1,
                         "pgbouncer_pool_mode": "session",
                         "postgresql": stack.cluster_settings(args.idle_connections)},
            "machine": stack.machine(cluster.psql("SHOW server_version").strip(), pgbouncer_bin, pgbench),
            "load_average_start": list(os.getloadavg()),
        }
        results = measure(args, selected, ports, pgbench, cluster, pgbouncer_bin, pids)
    except (stack.StackError, stack.PgBouncerError, seed.SeedError, workloads.WorkloadError, PostgresNotFound) as e:
        _print_logs(running)
        print(f"bench: {e}", file=sys.stderr)
        return 1
    except (asyncpg.PostgresError, OSError, subprocess.SubprocessError) as e:  # a target failed a client
        _print_logs(running)
        print(f"bench: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    finally:
        for proc in reversed(running):
            proc.stop()
        if cluster is not None:
            cluster.stop()
    summary = report.summarise(results)
    ratios = report.ratios(results, summary)
    document.update({
        "load_average_end": list(os.getloadavg()),
        "descriptions": {**{w: {"unit": u, "what": d} for w, (u, d) in report.THROUGHPUT.items()},
                         "latency": {"unit": "µs", "what": report.LATENCY},
                         "idle_memory": {"unit": "KiB per connection",
                                         "what": "VmRSS after minus before N idle connections, over N"}},
        "goals": {k: {"op": op, "threshold": t, "goal": words} for k, (op, t, words) in report.GOALS.items()},
        "reported": {k: {"what": words} for k, words in report.REPORTED.items()},
        "rounds": {"throughput": results.throughput, "latency": results.latency, "cpu_ms_per_1000": results.cpu},
        "memory": results.memory,
        "summary": summary,
        "ratios": ratios,
        "ratios_seat_over_direct": {w: e["seat_over_direct"]["median"] for w, e in summary["throughput"].items()},
        "floor": report.floor_summary(summary),
        "goals_met": report.verdicts(ratios),
    })
    print()
    print(report.table(results, summary))
    print()
    floor_table = report.floor_table(summary)
    if floor_table:
        print(floor_table)
        print()
    print(report.goal_lines(ratios))
    report.write(out, document)
    print(f"\nresults: {out}")
    return 0


def measure(args, selected: list[str], ports: dict[str, int], pgbench: str, cluster, pgbouncer_bin: str,
            pids: dict[str, int]) -> report.Results:
    """Every selected workload, against every target, round after round; then idle memory once. For the
    pgbench workloads, also the CPU time of the proxy process (``pids``) per 1,000 transactions."""
    results = report.Results()
    names = seed.renamed_types()
    scratch = Path(tempfile.mkdtemp(prefix="openwop-seat-bench-"))
    try:
        page = workloads.page_script(scratch, seed.PAGE_RUNS, "page")
        era3 = workloads.page_script(scratch, seed.ERA3_RUNS, "era3-page")
        projection = workloads.page_script(scratch, seed.PROJECTION_RUNS, "projection-page")
        host_mix = workloads.page_script(scratch, seed.HOST_MIX_RUNS, "host-mix-page")
        append = workloads.append_script(scratch)
        select1 = workloads.select1_script(scratch)
        request = workloads.host_request_script(scratch)
        payload = json.dumps(seed.APPEND_PAYLOAD)

        def append_vars(target: str) -> list[str]:
            # the seat's sessions are claimed v2 writers: the v2 name; direct and PgBouncer are v1 writers
            return ["-D", f"type={names[seed.APPEND_V1] if target == 'seat' else seed.APPEND_V1}", "-D", "node=n-1",
                    "-D", f"payload={payload}"]

        pgbench_args = {
            "passthrough_simple": lambda t: ["-S", "-M", "simple"],
            "passthrough_extended": lambda t: ["-S", "-M", "extended"],
            "passthrough_prepared": lambda t: ["-S", "-M", "prepared"],
            "era3_page_text": lambda t: ["-f", str(era3), "-M", "extended"],
            "era2_page_major1_text": lambda t: ["-f", str(page), "-M", "extended"],
            "translated_text": lambda t: ["-f", str(page), "-M", "extended"],
            "projection_page_text": lambda t: ["-f", str(projection), "-M", "extended"],
            "host_mix_page_text": lambda t: ["-f", str(host_mix), "-M", "extended"],
            "append_v2_into_era2": lambda t: ["-f", str(append), "-M", "extended", *append_vars(t)],
            "host_requests_1": lambda t: ["-f", str(request), "-M", "extended", *append_vars(t)],
            "host_requests_8": lambda t: ["-f", str(request), "-M", "extended", *append_vars(t)],
            "connect_1": lambda t: ["-C", "-f", str(select1), "-M", "extended"],
            "connect_8": lambda t: ["-C", "-f", str(select1), "-M", "extended"],
        }
        # (clients, threads); else workloads.CLIENTS, THREADS
        pgbench_clients = {"connect_1": (1, 1), "host_requests_1": (1, 1)}
        # the major-1 session: the seat's [[proxy.clients]] rule; the same application_name on every target
        pgbench_env = {"era2_page_major1_text": {"PGAPPNAME": seed.V1_APPLICATION}}
        binary_runs = {"era3_page_binary": seed.ERA3_RUNS, "translated_binary": seed.PAGE_RUNS}
        for round_no in range(args.rounds):
            for workload in selected:
                if workload == "idle_memory":
                    continue
                for target in report.targets_of(workload, ports):
                    port = ports[target]
                    started = time.monotonic()
                    if workload in pgbench_args:
                        cpu_before = stack.cpu_seconds(pids[target]) if target in pids else None
                        clients, threads = pgbench_clients.get(workload, (workloads.CLIENTS, workloads.THREADS))
                        env = pgbench_env.get(workload)
                        if target in (report.POOLED, report.BOUNCER_SCRAM):  # they log in with SCRAM-SHA-256
                            env = {**(env or {}), "PGPASSWORD": stack.POOL_PASSWORD}
                        figure, transactions = workloads.pgbench_run(pgbench, port, pgbench_args[workload](target),
                                                                     args.seconds, clients=clients, threads=threads,
                                                                     env=env)
                        results.add_throughput(workload, round_no, target, figure)
                        shown = f"{figure:,.0f} {report.THROUGHPUT[workload][0]}"
                        if cpu_before is not None and transactions:
                            cpu = (stack.cpu_seconds(pids[target]) - cpu_before) / transactions * 1e6
                            results.add_cpu(workload, round_no, target, cpu)
                            shown += f", {cpu:.1f} ms CPU per 1,000"
                    elif workload in binary_runs:
                        figure = workloads.binary_pages(port, args.seconds, binary_runs[workload])
                        results.add_throughput(workload, round_no, target, figure)
                        shown = f"{figure:,.0f} pages/s"
                    else:
                        lat = workloads.latency(pgbench, port, args.seconds, scratch, f"{target}-{round_no}")
                        results.add_latency(round_no, target, lat)
                        shown = f"p50 {lat['p50_us']:.0f} µs, p99 {lat['p99_us']:.0f} µs, " \
                                f"p99.9 {lat['p999_us']:.0f} µs"
                    print(f"round {round_no + 1}/{args.rounds}  {workload:22} {target:9} {shown}"
                          f"  ({time.monotonic() - started:.0f} s)", flush=True)
        if "idle_memory" in selected:
            # fresh processes, so the figure is the idle connections' and not what earlier rounds left behind
            for target, start in (("seat", lambda: stack.Seat(cluster, args.idle_connections + 100)),
                                  ("pgbouncer", lambda: stack.PgBouncer(pgbouncer_bin, cluster,
                                                                        args.idle_connections + 100))):
                proc = start()
                try:
                    results.memory[target] = workloads.idle_rss(proc.port, proc.pid, args.idle_connections,
                                                                cluster.port)
                finally:
                    proc.stop()
                m = results.memory[target]
                print(f"idle memory  {target:9} {m['rss_before_kib']} KiB -> {m['rss_after_kib']} KiB with "
                      f"{args.idle_connections} idle connections: {m['kib_per_connection']:.1f} KiB each "
                      f"({m['server_connections']} server connections open)",
                      flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def _print_logs(running: list) -> None:
    for proc in running:
        tail = proc.log()[-3000:]
        if tail:
            print(f"--- {getattr(proc, 'name', type(proc).__name__)} log (tail) ---\n{tail}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
