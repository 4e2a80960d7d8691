"""SHOW STATS's avg_* columns: per-second rates over PgBouncer's stats period, computed from the totals."""
from __future__ import annotations

import time

from proxy.serve import admin
from proxy.serve.admin import STATS_PERIOD, ProcessCommands


def test_rates_over_the_current_period_until_one_completes_then_over_the_last_completed(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    commands = ProcessCommands(server=None)
    now[0] += 10
    assert commands._rates({"app": [20, 40, 1000, 2000]}) == {"app": [2, 4, 100, 200]}  # since the start
    now[0] += STATS_PERIOD - 10  # the period ends at this ask: its rates are kept
    assert commands._rates({"app": [60, 120, 6000, 12000]}) == {"app": [1, 2, 100, 200]}
    now[0] += 30  # inside the next period: still the last completed one's
    assert commands._rates({"app": [600, 1200, 6000, 12000]}) == {"app": [1, 2, 100, 200]}
    now[0] += STATS_PERIOD  # the next period (90 s) ends: 540 more transactions over 90 s
    rates = commands._rates({"app": [600, 1200, 6000, 12000], "new": [90, 0, 0, 0]})
    assert rates == {"app": [6, 12, 0, 0], "new": [1, 0, 0, 0]}
    assert admin.STATS_COLUMNS[-4:] == ["avg_xact_count", "avg_query_count", "avg_recv", "avg_sent"]
