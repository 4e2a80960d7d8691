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
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from proxy import __version__
from proxy.errors import BY_SQLSTATE, CODES, ERRORS
from proxy.serve.pool import CANCEL_RESULTS, UNATTACHED
from proxy.stats import PROTOCOLS, STATEMENT_CLASSES, Stats

if TYPE_CHECKING:
    from proxy.serve.context import SeatView

log = logging.getLogger("openwop_seat.metrics")


BY_SQLSTATE_OW004 = ERRORS["statement_untranslatable"].sqlstate


class SeatCollector:
    def __init__(self, server: "SeatView"):
        self.server = server

    def _pool_metrics(self):
        """Pooled server connections ([pool], ADR 0016)."""
        pool = self.server.pool
        g = GaugeMetricFamily("openwop_seat_pool_server_connections",
                              "Pooled server connections by pool and state: active (a session relays on it), "
                              "released (its client left; reset when the next client takes it, or after "
                              "pool.server_reset_delay), idle (kept for the next client), reset (DISCARD ALL and the "
                              "claim's check in flight), check (the claim checked before a hand-over), login (being "
                              "connected for its first session)",
                              labels=["database", "user", "major", "state"])
        for (database, user, major, state), n in sorted(pool.counts().items(), key=str):
            g.add_metric([database, user, str(major), state], n)
        yield g
        c = CounterMetricFamily("openwop_seat_pool_resets", "Resets of pooled server connections after their client "
                                "left, by result: ok (kept), claim lost (its claim is not its pool's major: closed), "
                                "error, timeout, lost", labels=["result"])
        for result, n in sorted(pool.resets.items()):
            c.add_metric([result], n)
        yield c
        c = CounterMetricFamily("openwop_seat_pool_checks", "Checks of a pooled server connection's claim before a "
                                "hand-over, by result (as openwop_seat_pool_resets)", labels=["result"])
        for result, n in sorted(pool.checks.items()):
            c.add_metric([result], n)
        yield c
        for name, doc, value in (
            ("openwop_seat_pool_hand_overs", "Sessions handed an idle pooled server connection", pool.hand_overs),
            ("openwop_seat_pool_hand_over_resets", "Resets a hand-over ran on the released server connection it "
             "took, while its client computed its SCRAM proof (their results in openwop_seat_pool_resets)",
             pool.hand_over_resets),
            ("openwop_seat_pool_waits", "Sessions that waited for a server connection of a full pool", pool.waits),
            ("openwop_seat_pool_wait_seconds", "Time sessions waited for a server connection of a full pool",
             pool.wait_seconds),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
        c = CounterMetricFamily("openwop_seat_pool_cancels", "Cancel requests received: mapped (a seat-issued key of "
                                "a live pooled session, sent as its backend's own key), routed (sent so by the worker "
                                "that holds the session) or forwarded as they came", labels=["result"])
        for result in CANCEL_RESULTS:
            c.add_metric([result], pool.cancel_results[result])
        yield c

    def collect(self):
        server = self.server
        stats = server.stats
        live = [s for s in server.sessions if not s.closed]  # a closed session's counts are in Stats already
        yield self._build_info()
        g = GaugeMetricFamily("openwop_seat_client_connections_open", "Client connections open now")
        g.add_metric([], len(live))
        yield g
        g = GaugeMetricFamily("openwop_seat_upstream_connections_open", "Upstream connections open now")
        unattached = sum(1 for c in server.pool.servers if c.state in UNATTACHED)  # pooled, no session
        g.add_metric([], sum(1 for s in live if s.upstream is not None and not s.upstream.lost) + unattached)
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
        c = CounterMetricFamily("openwop_seat_privileged_sessions",
                                "Sessions on the host database whose role is a superuser or owns openwop_seat "
                                "(it can bypass the writer rule's guard)", labels=["role"])
        for role in ("superuser", "owns openwop_seat"):
            c.add_metric([role], stats.privileged_sessions[role])
        yield c
        c = CounterMetricFamily("openwop_seat_claims",
                                "Claims of sessions' majors, by how they were made: once (one round trip), challenge "
                                "(the salt was not known yet), or the challenge after a one-round-trip claim the "
                                "database did not take (clock, ledger, pooler, replay, refused, error; ADR 0013)",
                                labels=["path"])
        for path, n in sorted(stats.claims.items()):
            c.add_metric([path], n)
        yield c
        c = CounterMetricFamily("openwop_seat_fast_pages",
                                "Run pages sent through their fast twin, an era-3 run's rows as stored (ADR 0024), by "
                                "outcome: rows (the run is era 3), empty (sent again as the page statement), error "
                                "(relayed as it came), unprepared (the twin could not be prepared)",
                                labels=["outcome"])
        for outcome in ("rows", "empty", "error", "unprepared"):
            c.add_metric([outcome], stats.fast_pages[outcome])
        yield c
        yield from self._pool_metrics()
        g = GaugeMetricFamily("openwop_seat_writer_rule_broken",
                              "1 while the last check found the writer rule not in force as migrate installed it "
                              "(a trigger missing, disabled or replaced, a function replaced, another digest); new "
                              "sessions on the host database are refused meanwhile")
        g.add_metric([], 1 if server.writer_rule_verdict else 0)
        yield g
        g = GaugeMetricFamily("openwop_seat_paused", "1 while paused (SIGUSR1 or the admin console's PAUSE): new "
                              "connections wait in the kernel's backlog until SIGUSR2 or RESUME")
        g.add_metric([], 1 if server.paused else 0)
        yield g
        g = GaugeMetricFamily("openwop_seat_sessions_held", "Sessions held at a transaction boundary by the admin "
                              "console's PAUSE")
        g.add_metric([], sum(1 for s in live if getattr(s, "held", False)))
        yield g
        g = GaugeMetricFamily("openwop_seat_first_boot", "1 while the seat's rules are not in force in the host "
                              "database yet (first boot: no events table, or migrate has not run): sessions are not "
                              "claimed and statements that read or write event rows are refused")
        g.add_metric([], 1 if server.first_boot else 0)
        yield g
        c = CounterMetricFamily("openwop_seat_writer_rule_checks", "Checks of the writer rule in the host database "
                                "(at start of the check loop, every host.check_interval, on SIGHUP)",
                                labels=["result"])
        for result in ("ok", "broken", "error"):
            c.add_metric([result], stats.writer_rule_checks[result])
        yield c
        c = CounterMetricFamily("openwop_seat_store_fill_runs", "Runs the v2 store's background fill visited "
                                "(ADR 0015): filled whole, extended (the rows appended above a filled run's mark "
                                "copied), or skipped while an append held the run's lock (busy)",
                                labels=["result"])
        c.add_metric(["filled"], stats.store_runs_filled)
        c.add_metric(["extended"], stats.store_runs_extended)
        c.add_metric(["busy"], stats.store_runs_busy)
        yield c
        c = CounterMetricFamily("openwop_seat_store_fill_errors", "Passes of the v2 store's background fill that "
                                "failed (reads are translated at read time meanwhile)")
        c.add_metric([], stats.store_fill_errors)
        yield c
        catalog = getattr(server, "catalog", None)
        if catalog is not None:
            c = CounterMetricFamily("openwop_seat_catalog_connections_opened",
                                    "Connections this seat process opened to the host database for its own checks "
                                    "(one, kept; another only after one failed)")
            c.add_metric([], catalog.opened)
            yield c
        c = CounterMetricFamily("openwop_seat_session_errors", "Sessions ended by the seat with an error",
                                labels=["sqlstate"])
        for sqlstate, n in sorted(stats.refusals.items()):
            c.add_metric([sqlstate], n)
        yield c
        refused = Counter(stats.statements_refused)
        prepared = 0
        for s in live:
            if s.reader is not None:
                refused.update(s.reader.refusals)
                prepared += len(s.reader.prepared)
        g = GaugeMetricFamily("openwop_seat_prepared_statements",
                              "Server-side statements the seat prepared for translated unnamed statements "
                              "(plan once per session), over the open sessions")
        g.add_metric([], prepared)
        yield g
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
                for major, n in ctx.summed(attr):  # with the strict twin's (ADR 0019)
                    c.add_metric([str(major)], n)
                yield c
            g = GaugeMetricFamily("openwop_seat_parse_cache_size", "Plans in the classifier cache", labels=["major"])
            for major, n in ctx.summed("size"):
                g.add_metric([str(major)], n)
            yield g
            g = GaugeMetricFamily("openwop_seat_parse_cache_bytes", "Bytes held by the classifier cache",
                                  labels=["major"])
            for major, n in ctx.summed("bytes"):
                g.add_metric([str(major)], n)
            yield g
            g = GaugeMetricFamily("openwop_seat_parse_cache_capacity_bytes",
                                  "Configured bytes per classifier cache (proxy.plan_cache_bytes)", labels=["major"])
            for major, classifier in sorted(ctx.classifiers.items()):
                g.add_metric([str(major)], classifier.cache_bytes)
            yield g
        yield from self._connections(stats)
        yield from self._by_database_user(stats, live)
        yield from self._statements(stats, live, refused)
        yield from self._latency(stats)
        yield from self._limits(server.config)

    def _build_info(self):
        from proxy.db.layout import LAYOUT_VERSION

        ctx = self.server.read_context
        artifacts = ctx.artifacts if ctx is not None else None
        return InfoMetricFamily("openwop_seat_build", "Version of the running seat, its spec artifacts and layout",
                                value={"version": __version__,
                                       "artifact_tag": getattr(artifacts, "tag", "") or "",
                                       "artifact_digest": getattr(artifacts, "digest", "") or "",
                                       "layout_version": str(LAYOUT_VERSION)})

    @staticmethod
    def _connections(stats: Stats):
        c = CounterMetricFamily("openwop_seat_upstream_connections_opened", "Upstream connections opened")
        c.add_metric([], stats.upstream_connections)
        yield c
        for name, doc, counts in (
                ("openwop_seat_client_connections_refused", "Client connections the seat turned away, by reason",
                 stats.connections_refused),
                ("openwop_seat_upstream_connections_refused", "Upstream connections that failed, by reason",
                 stats.upstream_refused)):
            c = CounterMetricFamily(name, doc, labels=["reason"])
            for reason, n in sorted(counts.items()):
                c.add_metric([reason], n)
            yield c

    @staticmethod
    def _by_database_user(stats: Stats, live: list):
        """Sessions and transactions by database and user: at most metrics.database_user_labels pairs per process,
        the rest under database="(other)", user="(other)"."""
        open_now: Counter[tuple[str, str]] = Counter()
        transactions = Counter(stats.pair_transactions)
        for s in live:
            if s.major is not None:
                open_now[s.label_pair] += 1
                transactions[s.label_pair] += s.relay.transactions if s.relay is not None else 0
        pairs = sorted(stats.pair_sessions)
        labels = ["database", "user"]
        c = CounterMetricFamily("openwop_seat_database_sessions", "Sessions that sent a startup message, by database "
                                "and user (bounded: metrics.database_user_labels)", labels=labels)
        for pair in pairs:
            c.add_metric(list(pair), stats.pair_sessions[pair])
        yield c
        g = GaugeMetricFamily("openwop_seat_database_sessions_open", "Sessions open now, by database and user",
                              labels=labels)
        for pair in pairs:
            g.add_metric(list(pair), open_now[pair])
        yield g
        c = CounterMetricFamily("openwop_seat_transactions", "Transaction blocks ended (a ReadyForQuery back to idle "
                                "from in a transaction or failed), by database and user", labels=labels)
        for pair in pairs:
            c.add_metric(list(pair), transactions[pair])
        yield c

    @staticmethod
    def _statements(stats: Stats, live: list, refused: Counter):
        counts = Counter(stats.statements)
        for s in live:
            if s.reader is None:  # raw sessions count on the session, added to Stats when they end
                counts["passthrough", "simple"] += s.raw_simple
                counts["passthrough", "extended"] += s.raw_extended
        c = CounterMetricFamily("openwop_seat_statements",
                                "Statements sent by clients, by class and protocol (simple: per statement of a "
                                "Query; extended: per Execute)", labels=["class", "protocol"])
        for cls in STATEMENT_CLASSES:
            for protocol in PROTOCOLS:
                c.add_metric([cls, protocol], counts[cls, protocol])
        yield c
        c = CounterMetricFamily("openwop_seat_upstream_errors",
                                "ErrorResponses from the upstream relayed to clients, by SQLSTATE class",
                                labels=["class"])
        classes: Counter[str] = Counter()
        for sqlstate, n in stats.server_errors.items():
            classes[sqlstate[:2]] += n
        for cls, n in sorted(classes.items()):
            c.add_metric([cls], n)
        yield c
        # Refusals by OpenWOP code: raised inside PostgreSQL (OW001, OW003, OW005, OW006), the seat's own
        # statement refusals (OW004) and sessions it ends (OW007).
        codes: Counter[str] = Counter({sqlstate: 0 for sqlstate in BY_SQLSTATE})
        for source in (stats.server_errors, stats.refusals):
            for sqlstate, n in source.items():
                if sqlstate in BY_SQLSTATE:
                    codes[sqlstate] += n
        for kind, n in refused.items():  # statements setting a client-only encoding have their own code (OW009)
            codes[CODES[kind].sqlstate if kind in CODES else BY_SQLSTATE_OW004] += n
        c = CounterMetricFamily("openwop_seat_refusals", "OpenWOP refusals relayed or raised, by code",
                                labels=["code", "sqlstate"])
        for sqlstate, n in sorted(codes.items()):
            c.add_metric([BY_SQLSTATE[sqlstate].code, sqlstate], n)
        yield c

    @staticmethod
    def _latency(stats: Stats):
        h = HistogramMetricFamily("openwop_seat_processing_seconds",
                                  "Time the seat spent on one received chunk (its own added latency), by the side "
                                  "that sent it", labels=["from"])
        for side, hist in stats.seat_seconds.items():
            h.add_metric([side], hist.cumulative(), hist.sum)
        yield h
        for name, doc, hist in (
                ("openwop_seat_statement_seconds",
                 "Whole statements: a Sync, Query or FunctionCall forwarded to its ReadyForQuery forwarded",
                 stats.statement_seconds),
                ("openwop_seat_parse_seconds", "Classifier time on a parse cache miss", stats.parse_seconds)):
            h = HistogramMetricFamily(name, doc)
            h.add_metric([], hist.cumulative(), hist.sum)
            yield h

    @staticmethod
    def _limits(config):
        g = GaugeMetricFamily("openwop_seat_buffer_limit_bytes", "Configured write buffer limit per connection")
        g.add_metric([], config.buffer_limit)
        yield g
        limit = getattr(config, "max_client_conn", None)  # [proxy] max_client_conn, where the config has it
        if limit is not None:
            g = GaugeMetricFamily("openwop_seat_max_client_connections",
                                  "Configured client connection limit ([proxy] max_client_conn)")
            g.add_metric([], limit)
            yield g


class MetricsHTTP:
    """A minimal HTTP/1.1 server for /metrics, /healthz and /readyz."""

    def __init__(self, server: "SeatView"):
        self.server = server
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SeatCollector(server))
        self.db_counters = None
        if server.config.translates and server.config.host.dsn:
            from proxy.serve.dbcounters import DatabaseCounters

            self.db_counters = DatabaseCounters(server.config, getattr(server, "catalog", None))
            self.registry.register(self.db_counters)
        self.cutover = None
        if server.config.translates and server.config.host.dsn and getattr(server, "catalog", None) is not None:
            from proxy.serve.cutover_gauges import CutoverGauges  # docs/lifecycle.md

            self.cutover = CutoverGauges(server)
            self.registry.register(self.cutover)
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
        await serve_http(reader, writer, self._route)

    async def _route(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            if self.db_counters is not None:
                await self.db_counters.refresh()
            if self.cutover is not None:
                await self.cutover.poke()
            return "200 OK", PROMETHEUS_TEXT, generate_latest(self.registry)
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            ready, why = await self.server.readiness()
            return ("200 OK" if ready else "503 Service Unavailable"), "text/plain", (why + "\n").encode()
        return "404 Not Found", "text/plain", b"not found\n"


PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


async def serve_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route) -> None:
    """Answer one HTTP/1.1 GET or HEAD with ``await route(path) -> (status, content type, body)``."""
    try:
        request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        method, _, rest = request.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            status, ctype, body = "405 Method Not Allowed", "text/plain", b"method not allowed\n"
        else:
            status, ctype, body = await route(path)
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
