"""A probe, not the benchmark: the CPU a pooled connect costs the seat (ADR 0016), beside PgBouncer's.

    .venv/bin/python -m bench.pool_cost [--connects 2000] [--rounds 3] [--clients 1]
                                        [--baseline DIR] [--profile FILE] [--only seat_pool]

Starts a throwaway PostgreSQL with the host's tables and the seat's schema, gives its superuser a SCRAM-SHA-256
password, and starts a seat with reuse (``[pool]``, the superuser's verifier in its auth_file) and PgBouncer in
session mode with ``auth_type = scram-sha-256``: both log clients in with SCRAM, as ``make bench``'s connect
workloads (seat_pool, pgbouncer_scram). Then, round after round, target after target (interleaved, so that the
drift of a shared machine falls on all alike): ``pgbench -C -M extended -f select1.sql -t N`` (a connect, ``SELECT
1``, a close, ``--connects`` times in all over ``--clients`` clients), and the proxy process's CPU time
(``/proc/<pid>/stat``, utime + stime) before and after: CPU ms per 1,000 connects, and connects/s. The medians over
the rounds are printed last. Prefer the CPU figure on a loaded machine: it does not depend on what else runs.

``--baseline DIR``: a third target, a seat with reuse running the code of another checkout (e.g. ``git archive
<commit> | tar -x -C DIR``, with the C framer's built module copied in), for an A/B of a change.
``--profile FILE``: instead, one seat with reuse runs in-process under cProfile (``serve-profiled``), takes
``--connects`` pooled connects, is stopped with SIGTERM and writes its stats to FILE (in CPU time: the process's,
not the wall clock's, which on a loaded machine charges the waits for a CPU to whatever ran before them, mostly the
socket writes that wake the other side); the top of them is printed.
"""

from __future__ import annotations

import argparse
import os
import pstats
import re
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proxy.db.layout import CLAIM_SECRET_ENV

from . import stack
from .args import checkout, positive

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from harness import HOST_SCHEMA  # noqa: E402


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds a process has used so far, from /proc/PID/stat (fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")


def pgbench_connects(pgbench: str, port: int, script: Path, connects: int, clients: int) -> tuple[float, int]:
    """``connects`` pooled connects over ``clients`` clients: (connects/s including the connects, how many)."""
    per_client = max(connects // clients, 1)
    cmd = [pgbench, "-n", "-C", "-M", "extended", "-f", str(script), "-c", str(clients), "-j", str(min(clients, 2)),
           "-t", str(per_client), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "postgres"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PGPASSWORD": stack.POOL_PASSWORD})
    tps = re.search(r"^tps = ([\d.]+)", done.stdout, re.M)
    processed = re.search(r"^number of transactions actually processed: (\d+)", done.stdout, re.M)
    if done.returncode != 0 or tps is None or processed is None:
        raise RuntimeError(f"pgbench failed (exit {done.returncode}) against port {port}:\n{done.stderr[-2000:]}")
    return float(tps.group(1)), int(processed.group(1))


def serve_profiled(profile: str, config: str) -> int:
    """``serve`` in this process under cProfile (workers = 1 runs in-process); the stats go to ``profile`` once it
    returns (SIGTERM: a drain, then the end)."""
    import cProfile

    from proxy import cli

    profiler = cProfile.Profile(time.process_time)  # CPU time: a wall clock charges the waits for the CPU to writes
    profiler.enable()
    try:
        return cli.main(["serve", "--config", config])
    finally:
        profiler.disable()
        profiler.dump_stats(profile)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve-profiled"]:
        return serve_profiled(argv[1], argv[2])
    parser = argparse.ArgumentParser(prog="python -m bench.pool_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--connects", type=positive, default=2000, help="connects per measurement (default 2000)")
    parser.add_argument("--rounds", type=positive, default=3)
    parser.add_argument("--clients", type=positive, default=1)
    parser.add_argument("--baseline", type=checkout, metavar="DIR", help="another checkout: a seat with its code too")
    parser.add_argument("--profile", type=Path, metavar="FILE", help="profile the seat with reuse instead")
    parser.add_argument("--only", action="append", help="measure only this target (repeatable)")
    args = parser.parse_args(argv)
    os.environ.setdefault(CLAIM_SECRET_ENV, secrets.token_hex(16))
    scratch = Path(tempfile.mkdtemp(prefix="openwop-seat-pool-cost-"))
    running: list = []
    cluster = stack.start_cluster(50)
    try:
        cluster.psql(HOST_SCHEMA)
        subprocess.run([sys.executable, "-m", "proxy", "migrate", "--dsn", cluster.dsn()], check=True,
                       capture_output=True, cwd=ROOT)
        cluster.psql(f"SET password_encryption = 'scram-sha-256'; "
                     f"ALTER ROLE {cluster.superuser} PASSWORD '{stack.POOL_PASSWORD}'")
        verifier = cluster.psql("SELECT rolpassword FROM pg_authid WHERE rolname = current_user").strip()
        pgbench = os.path.join(cluster.bin, "pgbench")
        if not os.path.exists(pgbench):
            pgbench = shutil.which("pgbench") or pgbench
        script = scratch / "select1.sql"
        script.write_text("SELECT 1;\n")
        if args.profile is not None:
            seat = stack.Seat(cluster, 200, pool_verifier=verifier, profile=args.profile.resolve())
            running.append(seat)
            pgbench_connects(pgbench, seat.port, script, 50, args.clients)  # the pool's backend opened
            cpu = stack.cpu_seconds(seat.pid)
            tps, n = pgbench_connects(pgbench, seat.port, script, args.connects, args.clients)
            cpu = stack.cpu_seconds(seat.pid) - cpu
            print(f"profiled seat_pool: {tps:,.0f} conn/s, {cpu / n * 1e6:.0f} ms CPU per 1,000 connects (profiler "
                  f"included)")
            seat.stop(signal.SIGTERM)
            running.remove(seat)
            stats = pstats.Stats(str(args.profile))
            stats.sort_stats("tottime").print_stats(45)
            stats.sort_stats("cumulative").print_stats(60)
            return 0
        targets: dict[str, object] = {}
        if args.baseline is not None:
            targets["seat_base"] = stack.Seat(cluster, 200, pool_verifier=verifier, root=args.baseline.resolve())
        targets["seat_pool"] = stack.Seat(cluster, 200, pool_verifier=verifier)
        targets["pgbouncer_scram"] = stack.PgBouncer(stack.find_pgbouncer(), cluster, 200, scram_verifier=verifier)
        running.extend(targets.values())
        if args.only:
            targets = {k: v for k, v in targets.items() if k in args.only}
        for proc in targets.values():  # warm up: the pool's backends opened, the caches of the seat and the OS
            pgbench_connects(pgbench, proc.port, script, 100, args.clients)
        cpu_ms: dict[str, list[float]] = {name: [] for name in targets}
        # pgbench's own CPU per connect (its SCRAM PBKDF2 most of it): at 1 client a connect is serial, so the
        # wall time per connect less this is what the proxy and the server add to it (ADR 0021)
        client_us: dict[str, list[float]] = {name: [] for name in targets}
        rates: dict[str, list[float]] = {name: [] for name in targets}
        user_ms: dict[str, list[float]] = {name: [] for name in targets}
        for round_no in range(args.rounds):
            order = list(targets) if round_no % 2 == 0 else list(reversed(targets))  # neither always first
            for name in order:
                proc = targets[name]
                user, system = cpu_split(proc.pid)
                client = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.monotonic()
                tps, n = pgbench_connects(pgbench, proc.port, script, args.connects, args.clients)
                user_after, system_after = cpu_split(proc.pid)
                client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
                user, system = (user_after - user) / n * 1e6, (system_after - system) / n * 1e6
                cpu_ms[name].append(user + system)
                user_ms[name].append(user)
                rates[name].append(tps)
                client_us[name].append((client_after.ru_utime + client_after.ru_stime - client.ru_utime
                                        - client.ru_stime) / n * 1e6)
                print(f"round {round_no + 1}/{args.rounds}  {name:16} {tps:7,.0f} conn/s  {user + system:6.0f} ms CPU "
                      f"per 1,000 connects ({user:.0f} user, {system:.0f} system)  pgbench {client_us[name][-1]:5.0f} "
                      f"µs a connect  ({n} connects, {time.monotonic() - started:.0f} s, load "
                      f"{os.getloadavg()[0]:.1f})", flush=True)
        def serial(name: str) -> str:  # at 1 client a connect is serial: its wall time less the client's CPU
            if args.clients != 1:
                return ""
            wall_us = 1e6 / statistics.median(rates[name])
            return f", wall less that {wall_us - statistics.median(client_us[name]):.0f} µs"

        print(f"\nmedians over {args.rounds} rounds, {args.connects} connects each, {args.clients} client(s):")
        for name in targets:
            print(f"  {name:16} {statistics.median(rates[name]):7,.0f} conn/s  "
                  f"{statistics.median(cpu_ms[name]):6.0f} ms CPU per 1,000 connects (user "
                  f"{statistics.median(user_ms[name]):.0f})  pgbench {statistics.median(client_us[name]):5.0f} µs a "
                  f"connect{serial(name)}  (CPU per round: {', '.join(f'{c:.0f}' for c in cpu_ms[name])})")
        return 0
    finally:
        for proc in reversed(running):
            proc.stop()
        cluster.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
