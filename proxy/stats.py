"""Counters and histograms the serving path updates (no prometheus import: the hot path stays light)."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

# Upper bounds (seconds) of the latency histograms: fine enough to resolve the seat's own tens of microseconds.
LATENCY_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0)


# Statement classes and protocols of openwop_seat_statements_total (keys of Stats.statements).
STATEMENT_CLASSES = ("passthrough", "event_read", "event_write", "refused")


PROTOCOLS = ("simple", "extended")


# The (database, user) label pair of sessions past the first metrics.database_user_labels pairs a process saw.
OTHER_PAIR = ("(other)", "(other)")


class Histogram:
    """A plain list-of-counts histogram: observe() is a bisect and two additions, no lock, no labels."""

    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, n in zip(self.buckets + (float("inf"),), self.counts):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
        return out


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
        self.privileged_sessions: Counter[str] = Counter()  # sessions whose role can bypass the guard
        self.writer_rule_checks: Counter[str] = Counter()  # runtime checks of the writer rule, by result
        self.claims: Counter[str] = Counter()  # sessions claimed, by how: "once", "challenge", "challenge after …"
        self.statements_refused: Counter[str] = Counter()  # by refused statement kind
        self.upstream_connections = 0  # upstream connections opened (sessions and forwarded cancels)
        # (major, user) -> sessions on the host database since the last heartbeat (proxy.serve.heartbeat)
        self.majors_seen: Counter = Counter()
        # Connections the seat turned away, by reason (`Session.run`; the limits add their own reasons).
        self.connections_refused: Counter[str] = Counter()
        self.upstream_refused: Counter[str] = Counter()  # failed upstream connections, by reason
        # Shared with every session's read path (`ReadPath.attach`); raw sessions add theirs at close.
        self.statements: Counter[tuple[str, str]] = Counter()  # by (class, protocol)
        self.server_errors: Counter[str] = Counter()  # upstream ErrorResponses relayed to clients, by SQLSTATE
        self.seat_seconds = {"client": Histogram(), "upstream": Histogram()}  # seat's own time per chunk
        self.statement_seconds = Histogram()  # Sync/Query forwarded -> its ReadyForQuery forwarded
        self.parse_seconds = Histogram()  # classifier cache misses
        # By (database, user), for at most metrics.database_user_labels pairs (then OTHER_PAIR): sessions started,
        # and transaction blocks ended of the sessions that closed (the open ones count on their relay).
        self.pair_sessions: Counter[tuple[str, str]] = Counter()
        self.pair_transactions: Counter[tuple[str, str]] = Counter()
        self._pair_keys: dict[tuple[str, str], tuple[str, str]] = {}  # one tuple per pair, shared by its sessions
        # The v2 store's background fill (proxy.serve.store_filler, ADR 0015).
        self.store_runs_filled = 0
        self.store_runs_extended = 0  # marked runs whose rows above the mark were copied (an incremental fill)
        self.store_runs_busy = 0
        self.store_fill_errors = 0
        # fast pages (ADR 0024), by outcome: rows (the run is era 3: its page), empty (sent again as the page
        # statement), error (relayed as it came), unprepared (the twin's Parse failed: sent again, the twin not used)
        self.fast_pages: Counter[str] = Counter()

    def label_pair(self, database: str, user: str, limit: int) -> tuple[str, str]:
        """The label pair a session of this database and user counts under: its own while the process has seen
        fewer than ``limit`` pairs (or already has it), else OTHER_PAIR, so that the series stay bounded."""
        pair = (database, user)
        if pair in self.pair_sessions or len(self.pair_sessions) - (OTHER_PAIR in self.pair_sessions) < limit:
            return self._pair_keys.setdefault(pair, pair)
        return OTHER_PAIR

    def count_refusal(self, sqlstate: str) -> None:
        self.refusals[sqlstate] += 1
