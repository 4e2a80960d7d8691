"""The writer rule's database-wide counters (sequences its triggers bump), exported on /metrics.

The triggers run inside PostgreSQL, out of the seat's sight; they count with
`nextval`, which neither blocks concurrent appends nor rolls back, and the seat
reads the values when Prometheus scrapes (at most every few seconds).
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client.core import CounterMetricFamily

log = logging.getLogger("openwop_seat.metrics")

REFRESH_EVERY = 5.0  # seconds


class DatabaseCounters:
    def __init__(self, config, catalog=None):
        self.config = config
        self.catalog = catalog  # the seat process's one connection for its checks (context.CatalogConnection)
        self.values: dict[str, int] = {}
        self._read_at = 0.0

    async def refresh(self) -> None:
        if time.monotonic() - self._read_at < REFRESH_EVERY:
            return
        from proxy.db.connect import connect
        from proxy.db.layout import SCHEMA, WRITER_COUNTERS

        self._read_at = time.monotonic()

        async def read(conn):
            for name in WRITER_COUNTERS:
                row = await conn.fetchrow(f"SELECT last_value, is_called FROM {SCHEMA}.{name}")
                self.values[name] = row["last_value"] if row["is_called"] else 0

        try:
            if self.catalog is not None:
                await self.catalog.run(read)
                return
            conn = await asyncio.wait_for(connect(self.config.host.dsn), self.config.connect_timeout)
            try:
                await read(conn)
            finally:
                await conn.close()
        except Exception as e:  # a scrape must not fail because the database is slow; keep the last values
            log.warning("could not read the writer rule's counters: %s", e)

    def collect(self):
        from proxy.db.layout import WRITER_COUNTERS

        for name, doc in WRITER_COUNTERS.items():
            c = CounterMetricFamily(f"openwop_seat_{name}", doc)
            if name in self.values:
                c.add_metric([], self.values[name])
            yield c
