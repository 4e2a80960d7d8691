"""Django 5's ORM (on psycopg 3) through the seat: tests/drivers/python/django_driver.py, one process a read.

An unmanaged model mapped onto ``events`` reads the era-2 run as major 2 with sliced querysets page after
page (client-side binding, Django's default, and ``server_side_binding``) and with ``QuerySet.iterator()``
(a server-side cursor: DECLARE … WITH HOLD and FETCH); the same model mapped onto the seat's translated view
reads it directly. Appends: the host's append path with ``connection.cursor()`` in ``transaction.atomic()``.
Checked as tests/integration/drivers.py says.
"""

from __future__ import annotations

import json
import subprocess
import sys

import drivers
import pytest
from drivers import PAGE_SIZE, TRANSLATED_VIEW

SCRIPT = drivers.DRIVERS_DIR / "python" / "django_driver.py"
READS = {"queryset-pages": ("queryset-pages", {}),
         "queryset-pages-server-binding": ("queryset-pages", {"server_side_binding": True}),
         "iterator": ("iterator", {})}


def run_django(request: dict) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=120, cwd=drivers.ROOT)
    assert proc.returncode == 0, f"django_driver {request['mode']} exited {proc.returncode}:\n{proc.stderr}"
    out = json.loads(proc.stdout)
    assert (out["vendor"], out["driver"]) == ("postgresql", "psycopg"), out  # psycopg 3, not psycopg2
    return out


@pytest.fixture(scope="module")
def era2_run(pg):
    return drivers.seed_read_run(pg, "drv-django")


@pytest.mark.parametrize("read", list(READS))
def test_major2_read(pg, seat, era2_run, read):
    run_id, events = era2_run
    how, options = READS[read]
    request = {"mode": "read", "runId": run_id, "pageSize": PAGE_SIZE, "how": how, "options": options}
    direct = run_django({**request, "port": pg.port, "relation": TRANSLATED_VIEW})
    via = run_django({**request, "port": seat.port, "relation": "events"})
    assert all(list(r) == drivers.COLUMNS for r in via["rows"])
    drivers.check_read(pg, run_id, events, via["rows"], direct["rows"], f"django {read}")


@pytest.mark.parametrize("binding", ["client", "server"])
def test_host_append(pg, seat, binding):
    run_id = drivers.new_append_run(pg, f"drv-django-{binding}")
    sent = drivers.append_events(run_id)
    out = run_django({"mode": "append", "port": seat.port, "runId": run_id, "events": drivers.wire_events(sent),
                      "options": {"server_side_binding": binding == "server"}})
    drivers.check_append(pg, run_id, sent, out["rows"], f"django append {binding}-side binding")


@pytest.mark.parametrize("lock", [{}, {"skip_locked": True}, {"nowait": True}, {"of": ("self",)}],
                         ids=["plain", "skip_locked", "nowait", "of_self"])
def test_select_for_update_locks_and_reads_translated(pg, seat, era2_run, lock):
    """Issue 23, ADR 0017: ``select_for_update()`` through the seat returns what the plain read returns (the
    translated rows) and holds the stored rows: a connection straight to PostgreSQL cannot lock them NOWAIT."""
    run_id, events = era2_run
    request = {"mode": "lock", "runId": run_id, "lock": lock, "probePort": pg.port}
    via = run_django({**request, "port": seat.port, "relation": "events"})
    plain = run_django({"mode": "read", "runId": run_id, "pageSize": PAGE_SIZE, "how": "iterator", "options": {},
                        "port": seat.port, "relation": "events"})
    assert via["held"] is True
    assert via["rows"] == plain["rows"] and via["rows"]
    drivers.check_read(pg, run_id, events, via["rows"], None, f"django select_for_update {lock}")
