"""The cutover's progress as Prometheus gauges (docs/lifecycle.md): the facts ``openwop-seat status`` prints,
read from the host database on the seat process's catalog connection at most every REFRESH_SECONDS, in the
background: a scrape never waits for them and exports the last reading."""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger("openwop_seat.metrics")

REFRESH_SECONDS = 60.0
READ_TIMEOUT = 30.0
FIRST_WAIT = 5.0


class CutoverGauges:
    def __init__(self, server):
        self.server = server
        self.facts = None
        self.read_at: float | None = None  # wall clock of the last reading
        self._tried = 0.0
        self._task: asyncio.Task | None = None

    async def poke(self) -> None:
        """Start a reading in the background when the last one is older than REFRESH_SECONDS; only before the
        first reading is there does a scrape wait for it (FIRST_WAIT at most)."""
        if self._task is None or self._task.done():
            if not self._tried or time.monotonic() - self._tried >= REFRESH_SECONDS:
                self._tried = time.monotonic()
                self._task = asyncio.get_running_loop().create_task(self._read())
        if self.facts is None and self._task is not None and not self._task.done():
            await asyncio.wait({self._task}, timeout=FIRST_WAIT)

    async def _read(self) -> None:
        from proxy.db.cutover import read_facts

        ctx = self.server.read_context
        if ctx is None or ctx.first_boot:
            return
        config = self.server.config
        try:
            self.facts = await self.server.catalog.run(
                lambda conn: read_facts(conn, config, ctx.artifacts, full=False), timeout=READ_TIMEOUT)
            self.read_at = time.time()
        except Exception as e:  # keep the last reading
            log.warning("could not read the cutover's state for /metrics: %s", e)

    def collect(self):
        f = self.facts
        if f is None:
            return
        g = GaugeMetricFamily("openwop_seat_cutover_runs", "Runs of the host database by era and by how they "
                              "became era 3 (source: created, backfill, backfill-repair, era-column)",
                              labels=["era", "source"])
        for key, n in sorted(f.eras.items()):
            g.add_metric(["2", ""] if key == "2" else ["3", key], n)
        yield g
        g = GaugeMetricFamily("openwop_seat_cutover_era2_open_runs", "Era-2 runs without a terminal event")
        if f.era2_open is not None:
            g.add_metric([], f.era2_open)
        yield g
        g = GaugeMetricFamily("openwop_seat_cutover_newest_era2_append_timestamp_seconds",
                              "The newest event of an era-2 run (the events table's first timestamp column)")
        if f.newest_era2 is not None and f.newest_era2[1] is not None:
            g.add_metric([], f.newest_era2[1].timestamp())
        yield g
        g = GaugeMetricFamily("openwop_seat_cutover_major_last_seen_timestamp_seconds",
                              "When a session of this major last connected through any seat, per database user",
                              labels=["major", "user"])
        for s in f.sightings:
            g.add_metric([s["major"], s["user"]], s["last_seen"].timestamp())
        yield g
        yield GaugeMetricFamily("openwop_seat_cutover_seats_serving",
                                "Seat processes whose heartbeat is younger than 30 s", value=len(
                                    [s for s in f.seats if s["age"] < 30 and s["stopped_at"] is None]))
        ok = GaugeMetricFamily("openwop_seat_cutover_audit_ok",
                               "1 when the last recorded audit found nothing that would fail or is schema-invalid")
        at = GaugeMetricFamily("openwop_seat_cutover_audit_timestamp_seconds", "When the last recorded audit finished")
        if f.audit is not None:
            ok.add_metric([], 1 if f.audit["ok"] else 0)
            at.add_metric([], f.audit["finished_at"].timestamp())
        yield ok
        yield at
        yield GaugeMetricFamily("openwop_seat_cutover_read_timestamp_seconds",
                                "When these cutover gauges were read from the database", value=self.read_at)
