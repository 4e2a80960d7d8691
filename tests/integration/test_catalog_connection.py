"""One persistent connection per seat process for its checks of the host database (issue 23, item 6).

Every 2 s the seat re-reads the catalog (views over events, functions, whether its relations are stale), every
host.check_interval it checks the writer rule, and /readyz and /metrics read the database too. They share one
connection per worker, opened once, instead of one new connection per check.
"""

from __future__ import annotations

import time
import urllib.request
import uuid

import pytest

from proxy.serve.context import RELATION_CHECK_SECONDS


def backends(pg, app: str) -> set[int]:
    out = pg.psql(f"SELECT pid FROM pg_stat_activity WHERE application_name = '{app}'")
    return {int(line) for line in out.split()}


@pytest.mark.parametrize("workers", [1, 2])
def test_one_catalog_connection_per_worker_over_many_checks(start_seat, pg, workers):
    app = f"seat-catalog-{uuid.uuid4().hex[:8]}"
    seat = start_seat(proxy={"workers": workers}, host={"dsn": pg.dsn(application_name=app), "check_interval": 1})
    # each worker's start-up reads the database on connections of its own (load_read_context): counted from the
    # moment every worker holds its catalog connection
    guard = time.monotonic() + 30  # a guard against a hang, not a measurement
    while len(backends(pg, app)) != workers or seat.log().count(" info listening ") < workers:
        assert time.monotonic() < guard, seat.log()
        time.sleep(0.1)
    time.sleep(1)
    seen: set[int] = set()
    samples = []
    # several catalog checks (every 2 s) and writer rule checks (every 1 s), with /readyz and /metrics scraped too
    deadline = time.monotonic() + 4 * RELATION_CHECK_SECONDS + 1
    while time.monotonic() < deadline:
        now = backends(pg, app)
        samples.append(len(now))
        seen |= now
        for path in ("/readyz", "/metrics"):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}{path}", timeout=5).read()
            except OSError:
                pass  # /readyz may answer 503 while a worker starts; what counts is the connections
        time.sleep(0.25)
    print(f"workers={workers}: catalog backends seen {sorted(seen)}; per sample {samples}")
    assert max(samples) == workers  # one per worker at any time…
    assert len(seen) == workers  # …and the same ones throughout: none opened per check
    if workers == 1:  # and the process says so itself (a scrape reaches one worker)
        text = urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=5).read().decode()
        assert "openwop_seat_catalog_connections_opened_total 1.0" in text


def test_a_catalog_connection_closed_under_the_seat_is_replaced_without_a_failed_check(start_seat, pg):
    app = f"seat-catalog-{uuid.uuid4().hex[:8]}"
    seat = start_seat(host={"dsn": pg.dsn(application_name=app), "check_interval": 1})
    deadline = time.monotonic() + 30  # a guard against a hang, not a measurement
    while not backends(pg, app):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    (first,) = backends(pg, app)
    pg.psql(f"SELECT pg_terminate_backend({first})")
    while backends(pg, app) in (set(), {first}):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    (second,) = backends(pg, app)
    assert second != first
    time.sleep(2 * RELATION_CHECK_SECONDS)  # more checks on the new connection
    assert backends(pg, app) == {second}
    text = urllib.request.urlopen(f"http://127.0.0.1:{seat.metrics_port}/metrics", timeout=5).read().decode()
    assert "openwop_seat_catalog_connections_opened_total 2.0" in text
    assert 'openwop_seat_writer_rule_checks_total{result="error"} 0.0' in text  # retried on the new one
    assert "relation check failed" not in seat.log()
