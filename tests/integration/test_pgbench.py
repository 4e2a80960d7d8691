"""pgbench through the seat in each protocol mode: no failed transaction."""

from __future__ import annotations

import re
import subprocess

import pytest


@pytest.fixture(scope="module")
def bench_db(pg):
    pg.psql("CREATE DATABASE pgbench_db")
    subprocess.run(["pgbench", "-i", "-s", "2", "-q", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
                    "pgbench_db"], check=True, capture_output=True)
    yield "pgbench_db"
    pg.psql("DROP DATABASE pgbench_db WITH (FORCE)", check=False)


@pytest.mark.parametrize("mode", ["simple", "extended", "prepared"])
@pytest.mark.parametrize("script", ["-S", "-N"])
def test_pgbench_modes(seat, bench_db, mode, script):
    out = subprocess.run(["pgbench", script, "-n", "-M", mode, "-c", "4", "-j", "2", "-T", "5", "-h", "127.0.0.1",
                          "-p", str(seat.port), "-U", "postgres", bench_db], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    processed = int(re.search(r"number of transactions actually processed: (\d+)", out.stdout).group(1))
    failed = int(re.search(r"number of failed transactions: (\d+)", out.stdout).group(1))
    assert processed > 100 and failed == 0, out.stdout
