"""Prometheus metrics and the health endpoints, served over plain asyncio HTTP.

Counters live as plain integers on `Stats` (bumping a prometheus-client metric
per message would cost a lock on the hot path); a custom collector turns them
into metrics when Prometheus scrapes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from . import __version__

if TYPE_CHECKING:
    from .server import SeatServer

log = logging.getLogger("openwop_seat.metrics")


class Stats:
    """Process-wide counters, bumped by sessions as plain integer additions."""

    def __init__(self) -> None:
        self.client_connections = 0
        self.sessions_started = 0
        self.cancel_requests = 0
        self.upstream_connect_errors = 0
        self.protocol_violations = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.refusals: Counter[str] = Counter()
        self.rows_translated: Counter[int] = Counter()  # by reader major
        self.statements_refused: Counter[str] = Counter()  # by refused statement kind

    def count_refusal(self, sqlstate: str) -> None:
        self.refusals[sqlstate] += 1


class SeatCollector:
    def __init__(self, server: "SeatServer"):
        self.server = server

    def collect(self):
        server = self.server
        stats = server.stats
        live = list(server.sessions)
        yield InfoMetricFamily("openwop_seat_build", "Version of the running seat", value={"version": __version__})
        g = GaugeMetricFamily("openwop_seat_client_connections_open", "Client connections open now")
        g.add_metric([], len(live))
        yield g
        g = GaugeMetricFamily("openwop_seat_upstream_connections_open", "Upstream connections open now")
        g.add_metric([], sum(1 for s in live if s.upstream is not None and not s.upstream.lost))
        yield g
        for name, doc, value in (
            ("openwop_seat_client_connections_accepted", "Client connections accepted", stats.client_connections),
            ("openwop_seat_sessions", "Sessions that sent a startup message", stats.sessions_started),
            ("openwop_seat_cancel_requests", "Cancel requests received", stats.cancel_requests),
            ("openwop_seat_upstream_connect_errors", "Failed connections to the upstream",
             stats.upstream_connect_errors),
            ("openwop_seat_protocol_violations", "Clients closed for breaking the protocol",
             stats.protocol_violations),
            ("openwop_seat_client_bytes_received", "Bytes received from clients",
             stats.bytes_in + sum(s.bytes_in for s in live)),
            ("openwop_seat_client_bytes_sent", "Bytes sent to clients",
             stats.bytes_out + sum(s.bytes_out for s in live)),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
        c = CounterMetricFamily("openwop_seat_session_errors", "Sessions ended by the seat with an error",
                                labels=["sqlstate"])
        for sqlstate, n in sorted(stats.refusals.items()):
            c.add_metric([sqlstate], n)
        yield c
        rows = Counter(stats.rows_translated)
        refused = Counter(stats.statements_refused)
        for s in live:
            if s.reader is not None:
                rows[s.reader.major] += s.reader.rows_translated
                refused.update(s.reader.refusals)
        c = CounterMetricFamily("openwop_seat_rows_translated",
                                "Event rows whose type the seat mapped, by reader major", labels=["major"])
        for major in (1, 2):
            c.add_metric([str(major)], rows[major])
        yield c
        c = CounterMetricFamily("openwop_seat_statements_refused",
                                "Statements refused as untranslatable, by kind", labels=["kind"])
        for kind, n in sorted(refused.items()):
            c.add_metric([kind], n)
        yield c
        ctx = server.read_context
        if ctx is not None:
            for name, doc, attr in (("openwop_seat_parse_cache_hits", "Classifier cache hits", "hits"),
                                    ("openwop_seat_parse_cache_misses", "Classifier cache misses (parsed)",
                                     "misses")):
                c = CounterMetricFamily(name, doc, labels=["major"])
                for major, classifier in sorted(ctx.classifiers.items()):
                    c.add_metric([str(major)], getattr(classifier, attr))
                yield c
            g = GaugeMetricFamily("openwop_seat_parse_cache_size", "Plans in the classifier cache", labels=["major"])
            for major, classifier in sorted(ctx.classifiers.items()):
                g.add_metric([str(major)], classifier.size)
            yield g


class MetricsHTTP:
    """A minimal HTTP/1.1 server for /metrics, /healthz and /readyz."""

    def __init__(self, server: "SeatServer"):
        self.server = server
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SeatCollector(server))
        self._listener: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> None:
        self._listener = await asyncio.start_server(self._handle, host, port, reuse_address=True)

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, _, rest = request.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"method not allowed\n"
            elif path == "/metrics":
                status, ctype, body = "200 OK", "text/plain; version=0.0.4; charset=utf-8", generate_latest(
                    self.registry)
            elif path == "/healthz":
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            elif path == "/readyz":
                ready, why = await self.server.readiness()
                status = "200 OK" if ready else "503 Service Unavailable"
                ctype, body = "text/plain", (why + "\n").encode()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n").encode()
            writer.write(head if method == "HEAD" else head + body)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except Exception:
            log.exception("metrics request failed")
        finally:
            writer.close()
