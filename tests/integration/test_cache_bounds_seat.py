"""The classifier's caches are bounded in bytes and freed with the session (issue 23, item 6).

40 passthrough statements of 4 MiB used to stay in the prefilter's text cache (172 MiB) after the client left;
now a long text is never kept there, and the plans of a session's long statements leave the plan cache with it.
"""

from __future__ import annotations

import psycopg
from test_admin import rows
from test_backpressure import rss_bytes
from test_psql import psql


def caches(sock_dir) -> dict[tuple[str, str], list[str]]:
    out = rows(psql(f"host={sock_dir} port=6434 user=ops dbname=openwop_seat", "-c", "SHOW CACHES").stdout)
    return {(r[0], r[1]): r for r in out}


def test_long_statements_do_not_stay_after_their_session(start_seat, pg, tmp_path):
    admin = tmp_path  # the console on a Unix socket alone, admin.auth = "trust"
    seat = start_seat(extra={"admin": {"unix_socket": str(tmp_path / ".s.PGSQL.6434"), "auth": "trust"}})
    with psycopg.connect(seat.dsn(), autocommit=True) as conn:  # warm: the parser, the plans every session makes
        conn.execute("SELECT count(*) FROM events").fetchone()
        conn.execute("SELECT 'short passthrough'").fetchone()
    before = caches(admin)
    baseline = rss_bytes(seat.proc.pid)
    big = "x" * (4 << 20)
    with psycopg.connect(seat.dsn(), autocommit=True) as conn:
        for i in range(40):  # 40 different passthrough texts of 4 MiB (simple Query: the text is the statement)
            assert conn.execute(f"SELECT length('{i}{big}')".encode()).fetchone() == (len(big) + len(str(i)),)
        # long texts over the events table: parsed, planned and cached while the session lives
        pad = "y" * (32 << 10)
        for i in range(8):
            conn.execute(f"SELECT count(*) FROM events WHERE run_id <> '{i}{pad}'".encode()).fetchone()
        during = caches(admin)
        assert int(during["plan", "2"][2]) >= int(before["plan", "2"][2]) + 8
    after = caches(admin)
    grown = rss_bytes(seat.proc.pid) - baseline
    print(f"passthrough cache bytes {after['passthrough', '2'][3]} (capacity {after['passthrough', '2'][4]}); "
          f"plan cache bytes {during['plan', '2'][3]} during, {after['plan', '2'][3]} after; RSS grew "
          f"{grown / 1024 / 1024:.1f} MiB")
    assert int(after["passthrough", "2"][3]) <= int(after["passthrough", "2"][4]) == 4 << 20
    assert int(after["passthrough", "2"][3]) < 1 << 20  # none of the 4 MiB texts
    assert after["plan", "2"][2:4] == before["plan", "2"][2:4]  # the session's long plans left with it
    assert grown < 48 * 1024 * 1024  # was 172 MiB: 40 texts of 4 MiB kept
