"""`make bench` (issues #6, #15) kept from rotting: a tiny run end to end, and its refusals of bad arguments.

The run starts its own PostgreSQL, PgBouncer (installing it when missing and running as root, else
failing with the install command) and seat, like `make bench`, with 1 round of 1 s per measurement
and 50 idle connections. Only that it runs and what it writes are asserted: no figure is judged here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

from harness import ROOT

RATIO_KEYS = {"passthrough_simple", "passthrough_extended", "passthrough_prepared", "era3_page_text",
              "era3_page_binary", "era2_page_major1_text", "translated_text", "translated_binary",
              "projection_page_text", "host_mix_page_text", "append_v2_into_era2", "p50_added_us", "p99_ratio",
              "idle_conn_kib", "connect_1_vs_direct", "connect_8_vs_direct", "connect_1", "connect_8",
              "host_requests_1", "host_requests_8", "connect_1_with_reuse", "connect_8_with_reuse",
              # issue 27: the proxies' CPU on passthrough, and the host's request mix against direct
              "cpu_passthrough_simple", "cpu_passthrough_extended", "cpu_passthrough_prepared",
              "host_requests_1_vs_direct"}
# measured with no goal: never judged met or not met (the connects without reuse against PgBouncer's reuse)
REPORTED_KEYS: set[str] = {"connect_1", "connect_8", "host_requests_1", "host_requests_8"}
# the workloads the floor (bench/bare_relay.py) runs beside direct, PgBouncer and the seat
FLOOR_WORKLOADS = {"passthrough_simple", "passthrough_extended", "passthrough_prepared", "era3_page_text", "latency"}


def bench(*args: str, timeout: float = 280) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def test_a_tiny_bench_run_prints_the_table_and_writes_every_ratio(tmp_path):
    out = tmp_path / "results" / "smoke.json"
    done = bench("--rounds", "1", "--seconds", "1", "--idle-connections", "50", "--scale", "1", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert set(document["ratios"]) == RATIO_KEYS
    for key, value in document["ratios"].items():
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), key
    assert set(document["machine"]) >= {"cpu_model", "cpus", "memory_mib", "kernel", "postgresql", "pgbouncer",
                                        "python"}
    for workload in RATIO_KEYS & set(document["rounds"]["throughput"]):
        pooled = {"seat_pool", "pgbouncer_scram"} if workload.startswith("connect_") else set()  # reuse, SCRAM
        floor = {"floor", "seat_raw"} if workload in FLOOR_WORKLOADS else set()  # bare relay, raw seat (issue 27)
        assert set(document["rounds"]["throughput"][workload][0]) == {"direct", "pgbouncer", "seat"} | pooled | floor
    assert set(document["goals"]) == RATIO_KEYS - REPORTED_KEYS
    assert set(document["goals_met"]) == RATIO_KEYS - REPORTED_KEYS
    assert set(document["reported"]) == REPORTED_KEYS
    assert "seat/pgbouncer" in done.stdout and "goals (issues #6, #15):" in done.stdout
    for workload in ("projection_page_text", "host_mix_page_text"):  # goals since issue 22
        assert any(line.split()[:1] == [workload] for line in done.stdout.splitlines()), workload
    # issue 27: the proxies' CPU per 1,000 transactions, per pgbench workload, in the file and the table
    cpu = document["summary"]["cpu_ms_per_1000"]
    assert {"passthrough_simple", "append_v2_into_era2", "host_requests_1", "host_requests_8"} <= set(cpu)
    for workload, figures in cpu.items():
        assert figures["seat"] > 0 and figures["pgbouncer"] >= 0, workload
    assert "CPU of the proxy process" in done.stdout
    # issue 27: the floor, a bare uvloop relay, beside the seat and PgBouncer: seat ÷ floor and its CPU per 1,000
    assert set(document["floor"]) == set(FLOOR_WORKLOADS)
    for workload in FLOOR_WORKLOADS - {"latency"}:
        row = document["floor"][workload]
        assert row["floor"] > 0 and row["seat_over_floor"] > 0, workload
        assert row["cpu_ms_per_1000"]["floor"] > 0 and row["cpu_ms_per_1000"]["seat_raw"] > 0, workload
    assert document["floor"]["latency"]["floor"]["p50_us"] > 0
    assert "floor: bare uvloop relay" in done.stdout


def test_bad_arguments_are_refused_before_anything_starts(tmp_path):
    out = tmp_path / "never.json"
    for args in (["--rounds", "0"], ["--seconds", "x"], ["--only", "everything"], ["--idle-connections", "-5"]):
        done = bench(*args, "--out", str(out), timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert "error:" in done.stderr, args
    assert not out.exists()
