"""The read path, sans-IO: rewrites event-reading statements and translates their rows.

It sees every client message the session captures and every server message
while a translated result may be in flight, and keeps a FIFO of the responses
the server owes, exactly as PostgreSQL orders them (extended protocol: one
entry per Parse/Bind/Describe/Execute/Close/Sync; simple protocol: one per
Query). With that it knows, for each RowDescription and DataRow, which
statement produced it, so it can:

- strip the hidden era column from RowDescription and every DataRow;
- map each row's `type` by its era and the reader's major (splicing bytes,
  never re-encoding the row);
- present a refused statement's error at the place PostgreSQL would have.

Most statements on a host database never touch the events table, so the FIFO
is kept only while some answer must be looked at. While nothing owed is
watched ("quiet"), the read path keeps just the ReadyForQuery each
Sync/Query/FunctionCall is owed (for latency) and the kinds of the extended
messages since the last Sync; the session then relays the server's answers
without framing them for the read path, looking only at RowDescriptions (for
the leak check) and ReadyForQuery. The first message that touches a translated
or refused statement turns the quiet bookkeeping into FIFO entries (one
``Zq`` entry standing for the quiet answers still owed, then the open group's
messages) and the FIFO takes over until it drains.

Refusals never depend on the seat alone: a row the reader rule cannot read
fails inside the server (the hidden column's check raises), and a refused
statement is replaced by a *poison* statement that fails on the server, so the
server's transaction, pipeline and ReadyForQuery state are exactly those of a
PostgreSQL error. The seat only swaps the poison's error for its own.
"""

from __future__ import annotations

import struct
from collections import Counter, deque
from dataclasses import dataclass, replace
from time import perf_counter

import orjson

from .classify import HIDDEN, PASS, REFUSE, Classifier, Plan
from .errors import BY_SQLSTATE, ERRORS
from .wire import messages

_I16 = struct.Struct("!h")
_U16 = struct.Struct("!H")
_I32 = struct.Struct("!i")
_HIDDEN_B = HIDDEN.encode()
_TEXT_OID = 25
_META = b"\x1e"  # read_v2p: era, projected payload, then counts after this separator (proxy.projection)
_JSONB_VERSION = b"\x01"

# A statement that always fails at parse analysis, on any server, whatever the client bound.
POISON_SQL = "SELECT FROM openwop_seat.openwop_seat_refused_statement"

# Statement classes for the metrics: a statement the classifier left alone counts as an event write when it
# starts with one of these keywords and names the events table soon after (no parse: a cheap approximation,
# so `WITH … INSERT INTO events` or a leading comment counts as passthrough).
_WRITE_HEADS = frozenset(("INSERT", "UPDATE", "DELETE", "COPY"))
_CLASS = {"translate": "event_read", REFUSE: "refused"}


class ReadPathError(Exception):
    """A result the seat must not pass on and cannot fail cleanly on the server: end the session."""


@dataclass(frozen=True)
class EventColumns:
    """Where the events table's columns are, to recognise them in RowDescription."""

    table_oid: int
    type_attnum: int
    # Views (and materialized views) that read events.type: their rows cannot be translated.
    derived_oids: frozenset[int] = frozenset()
    payload_attnum: int = 0  # 0: unknown (no payload column is recognised)
    # Views that read events.payload: their payloads cannot be projected (major 2 only).
    derived_payload_oids: frozenset[int] = frozenset()


@dataclass
class Layout:
    """The shape of one result: which columns are hidden and which carry an event type."""

    hidden: tuple[int, ...]
    types: tuple[int, ...]
    ncols: int  # as the server sends them, hidden included
    era_binary: bool = False
    derived: bool = False  # some column comes from a view over events.type
    payloads: tuple[int, ...] = ()  # columns that are the events table's payload
    hidden_text: bool = False  # the hidden column is read_v2p's text (era, projected payload, counts)
    payload_binary: tuple[bool, ...] = ()  # per payload column: sent in binary (jsonb version byte first)
    derived_payload: bool = False  # some column comes from a view over events.payload

    @property
    def translated(self) -> bool:
        return bool(self.hidden)

    def __post_init__(self) -> None:
        # The columns a row changes, in order, as (index, what): 0 hidden (dropped), 1 type, 2 payload.
        self.cuts_mapped = sorted([(i, 0) for i in self.hidden] + [(i, 1) for i in self.types])
        self.cuts_projected = sorted([(i, 0) for i in self.hidden] + [(i, 1) for i in self.types]
                                     + [(i, 2) for i in self.payloads])
        self.cuts_plain = [(i, 0) for i in sorted(self.hidden)]
        # The one hidden column is the last (a plain `SELECT …` or `RETURNING …`): a row whose era column is
        # just the era (nothing projected) is spliced without walking past the last type column.
        self.hidden_last = self.hidden == (self.ncols - 1,)
        self.types_sorted = tuple(sorted(self.types))
        self.ncols_out = _I16.pack(self.ncols - len(self.hidden))


@dataclass
class Statement:
    plan: Plan
    layout: Layout | None = None  # from a Describe of the statement (formats unknown there)
    described: bool = False  # a Describe of it was sent: its layout arrives before any of its rows
    cls: str = "passthrough"  # its class for the statement metrics, counted per Execute


@dataclass
class Portal:
    statement: Statement | None
    result_formats: tuple[int, ...]
    layout: Layout | None = None
    described: bool = False


@dataclass(slots=True)
class Entry:
    """A response the server owes, in order."""

    kind: str  # 'P', 'B', 'DS', 'DP', 'E', 'C', 'S', 'Q', 'F'; 'Zq': the quiet answers owed before it
    name: str = ""
    statement: Statement | None = None
    portal: Portal | None = None
    refusal: object = None  # the refused StatementPlan, when this entry carries a poison
    injected: bool = False  # a Describe the seat added itself: its answer is swallowed
    plan: Plan | None = None  # for 'Q'
    poison_index: int = -1  # for 'Q': which statement is the poison
    stmt_index: int = 0  # for 'Q': statements completed so far
    layout: Layout | None = None  # for 'Q': the current result's layout
    watched: bool = False  # its answers must be looked at (rewritten or swallowed)
    t0: float = 0.0  # for 'S', 'Q', 'F': when it was sent (statement latency)


# Extended-protocol messages of a quiet group, by type byte: the FIFO entry each one owes.
_QUIET_KINDS = {0x50: "P", 0x42: "B", 0x45: "E", 0x43: "C"}


def parse_row_description(body: bytes, events: EventColumns | None) -> tuple[Layout, list[tuple[int, int]]]:
    """The layout of a RowDescription and the (start, end) byte span of each field in ``body``."""
    (n,) = _I16.unpack_from(body, 0)
    pos = 2
    spans, hidden, types, payloads, payload_formats = [], [], [], [], []
    binary_hidden = derived = hidden_text = derived_payload = False
    for i in range(n):
        end = body.index(b"\x00", pos)
        name = body[pos:end]
        table_oid, attnum, type_oid = struct.unpack_from("!IhI", body, end + 1)
        fmt = _I16.unpack_from(body, end + 17)[0]
        field_end = end + 19
        spans.append((pos, field_end))
        if name == _HIDDEN_B:
            hidden.append(i)
            binary_hidden = binary_hidden or fmt == 1
            hidden_text = hidden_text or type_oid == _TEXT_OID
        elif events is not None and table_oid == events.table_oid and attnum == events.type_attnum:
            types.append(i)
        elif events is not None and table_oid == events.table_oid and attnum == events.payload_attnum:
            payloads.append(i)
            payload_formats.append(fmt == 1)  # 0 in a statement Describe's answer: the portal's formats decide
        elif events is not None and table_oid in events.derived_oids:
            derived = True
        if events is not None and table_oid in events.derived_payload_oids:
            derived_payload = True
        pos = field_end
    return Layout(tuple(hidden), tuple(types), n, binary_hidden and not hidden_text, derived, tuple(payloads),
                  hidden_text, tuple(payload_formats), derived_payload), spans


def strip_row_description(body: bytes, layout: Layout, spans) -> bytes:
    keep = [body[a:b] for i, (a, b) in enumerate(spans) if i not in layout.hidden]
    return messages.message(b"T", _I16.pack(len(keep)) + b"".join(keep))


def type_fields_of(type_map: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """``type_map`` with each key and value as a DataRow field: the int32 length, then the bytes."""
    return {_I32.pack(len(k)) + k: _I32.pack(len(v)) + v for k, v in type_map.items()}


class ReadPath:
    """Per-session read-path state. `major` is 1 or 2 (raw sessions never get one)."""

    def __init__(self, classifier: Classifier, major: int, events: EventColumns | None,
                 v1_to_v2: dict[bytes, bytes], v2_to_v1: dict[bytes, bytes] | None,
                 type_fields: dict[bytes, bytes] | None = None):
        self.classifier = classifier
        self.major = major
        self.events = events
        self.type_map = v1_to_v2 if major == 2 else (v2_to_v1 or {})
        # The same as whole DataRow fields (length included), for the fast path; shared by every session of a
        # seat (`type_fields_of`), since a dict per session would cost kilobytes per idle connection.
        self.type_fields = type_fields if type_fields is not None else type_fields_of(self.type_map)
        self.map_era = b"2" if major == 2 else b"3"  # rows of this era are mapped for this reader
        self.map_era_bin = b"\x00\x02" if major == 2 else b"\x00\x03"
        self.pending: deque[Entry] = deque()
        # Quiet bookkeeping (nothing owed is watched): when each quiet Sync/Query/FunctionCall was sent,
        # oldest first (one ReadyForQuery owed each), and the FIFO kinds of the open extended group.
        self.quiet_sent: deque[float] = deque()
        self.quiet_group: list[str] = []
        # The 4-byte table OIDs a RowDescription field must carry to come from the events table or a view
        # over it: a RowDescription holding none of them cannot leak (a substring test, no parsing).
        self._leak_oids = () if events is None else tuple(
            struct.pack("!I", oid) for oid in {events.table_oid, *events.derived_oids, *events.derived_payload_oids})
        self.statements: dict[str, Statement] = {}
        self.portals: dict[str, Portal] = {}
        self.active = 0  # pending entries whose answers the seat must inspect
        self.rows_translated = 0
        self.refusals: list[str] = []
        # Metrics; `attach` swaps in the process-wide ones (plain additions either way).
        self.statement_counts: Counter[tuple[str, str]] = Counter()  # (class, protocol)
        self.server_errors: Counter[str] = Counter()  # upstream ErrorResponses passed on, by SQLSTATE
        # Payload projection: (what, v2 type, key) for what in projected / boxed (keys) / missing (required)
        self.payload_counts: Counter[tuple[str, str, str]] = Counter()
        self.statement_seconds = None  # a metrics.Histogram, or None
        self.parse_seconds = None
        self.on_refusal = None  # called with (sqlstate, kind) for each OpenWOP refusal, to log it

    def attach(self, stats, on_refusal=None) -> None:
        """Count into the process-wide `metrics.Stats` instead of this read path's own counters."""
        self.statement_counts = stats.statements
        self.server_errors = stats.server_errors
        self.payload_counts = stats.payloads
        self.statement_seconds = stats.statement_seconds
        self.parse_seconds = stats.parse_seconds
        self.on_refusal = on_refusal

    def _classify(self, sql: str) -> Plan:
        classifier = self.classifier
        misses = classifier.misses
        start = perf_counter()
        plan = classifier.classify(sql)
        if classifier.misses != misses and self.parse_seconds is not None:
            self.parse_seconds.observe(perf_counter() - start)
        return plan

    def _class_of(self, st) -> str:
        if st.action != PASS:
            return _CLASS[st.action]
        sql = st.sql.lstrip()
        if sql[:6].upper() in _WRITE_HEADS or sql[:4].upper() == "COPY":
            if self.classifier.mentions_events(sql[:200]):
                return "event_write"
        return "passthrough"

    # ------------------------------------------------------------ client side

    @property
    def inspecting(self) -> bool:
        return self.active > 0

    def _push(self, entry: Entry, watch: bool) -> None:
        if watch:
            entry.watched = True
            self.active += 1
        self.pending.append(entry)

    def _pop(self) -> Entry:
        entry = self.pending.popleft()
        if entry.watched:
            self.active -= 1
        return entry

    @property
    def quiet(self) -> bool:
        """Nothing the server owes is in the FIFO: its answers need no framing by the read path."""
        return not self.pending

    def on_client(self, t: int, body: bytes) -> bytes | None:
        """Account for one client message; returns replacement bytes, or None to forward it as is."""
        if not self.pending and self._quiet_client(t, body):
            return None
        return self._on_client(t, body)

    def _quiet_client(self, t: int, body: bytes) -> bool:
        """Quiet bookkeeping of one client message; False when it needs the FIFO (it touches a translated
        or refused statement, or a group the quiet bookkeeping cannot follow), which then takes over."""
        if t == 0x53:  # 'S' Sync
            self.quiet_sent.append(perf_counter())
            self.quiet_group.clear()
            return True
        if t == 0x50:  # 'P'
            name_end = body.index(b"\x00")
            sql = body[name_end + 1:body.index(b"\x00", name_end + 1)].decode("utf-8", "surrogateescape")
            plan = self._classify(sql)
            if plan.changed or plan.refused is not None:
                return self._unquiet()
            name = body[:name_end].decode()
            cls = self._class_of(plan.statements[0]) if plan.statements else "passthrough"
            if cls == "passthrough":
                if self.statements:
                    self.statements.pop(name, None)
            else:
                self.statements[name] = Statement(plan, cls=cls)
        elif t == 0x42:  # 'B'
            portal_end = body.index(b"\x00")
            st = self.statements.get(body[portal_end + 1:body.index(b"\x00", portal_end + 1)].decode()) \
                if self.statements else None
            if st is not None:
                if st.plan.translated:
                    return self._unquiet()
                self.portals[body[:portal_end].decode()] = Portal(st, ())
            elif self.portals:
                self.portals.pop(body[:portal_end].decode(), None)
        elif t == 0x45:  # 'E'
            portal = self.portals.get(body[:body.index(b"\x00")].decode()) if self.portals else None
            st = portal.statement if portal is not None else None
            if st is not None and st.plan.translated:
                return self._unquiet()
            self.statement_counts[st.cls if st is not None else "passthrough", "extended"] += 1
        elif t == 0x44:  # 'D'
            name = body[1:-1].decode()
            if body[:1] == b"S":
                st = self.statements.get(name) if self.statements else None
                kind = "DS"
            else:
                portal = self.portals.get(name) if self.portals else None
                st = portal.statement if portal is not None else None
                kind = "DP"
            if st is not None and st.plan.translated:
                return self._unquiet()
            self.quiet_group.append(kind)
            return True
        elif t == 0x43:  # 'C' Close
            (self.statements if body[:1] == b"S" else self.portals).pop(body[1:-1].decode(), None)
        elif t == 0x51:  # 'Q'
            if self.quiet_group:
                return self._unquiet()
            plan = self._classify(body[:-1].decode("utf-8", "surrogateescape"))
            if plan.changed:
                return self._unquiet()
            counts = self.statement_counts
            for st in plan.statements:
                counts[self._class_of(st), "simple"] += 1
            self.quiet_sent.append(perf_counter())
            return True
        elif t == 0x46:  # 'F' FunctionCall
            if self.quiet_group:
                return self._unquiet()
            self.quiet_sent.append(perf_counter())
            return True
        else:  # Flush, Terminate, COPY traffic: nothing owed
            return True
        self.quiet_group.append(_QUIET_KINDS[t])
        return True

    def _unquiet(self) -> bool:
        """Hand the quiet bookkeeping to the FIFO: the answers still owed, then the open group's messages."""
        if self.quiet_sent:
            self.pending.append(Entry("Zq"))
        for kind in self.quiet_group:
            self.pending.append(Entry(kind))
        self.quiet_group.clear()
        return False

    def _on_client(self, t: int, body: bytes) -> bytes | None:
        if t == 0x51:  # 'Q'
            return self._query(body)
        if t == 0x50:  # 'P'
            return self._parse(body)
        if t == 0x42:  # 'B'
            return self._bind(body)
        if t == 0x44:  # 'D'
            kind, name = body[:1], body[1:-1].decode()
            if kind == b"S":
                st = self.statements.get(name)
                if st is not None:
                    st.described = True
                self._push(Entry("DS", name, statement=st), watch=bool(st and st.plan.translated))
            else:
                portal = self.portals.get(name)
                st = portal.statement if portal else None
                if portal is not None:
                    portal.described = True
                self._push(Entry("DP", name, portal=portal), watch=bool(st and st.plan.translated))
            return None
        if t == 0x45:  # 'E'
            name = body[:body.index(b"\x00")].decode()
            portal = self.portals.get(name)
            translated = bool(portal and portal.statement and portal.statement.plan.translated)
            injected = b""
            if translated and not portal.described and not portal.statement.described:
                # The client never described this result: ask the server ourselves, answer swallowed.
                self._push(Entry("DP", name, portal=portal, injected=True), watch=True)
                injected = messages.message(b"D", b"P" + name.encode() + b"\x00")
            self._push(Entry("E", name, portal=portal), watch=translated)
            self.statement_counts[portal.statement.cls if portal and portal.statement else "passthrough",
                                  "extended"] += 1
            return injected + messages.message(b"E", body) if injected else None
        if t == 0x43:  # 'C' Close
            kind, name = body[:1], body[1:-1].decode()
            (self.statements if kind == b"S" else self.portals).pop(name, None)
            self._push(Entry("C"), watch=False)
            return None
        if t == 0x53:  # 'S' Sync
            self._push(Entry("S", t0=perf_counter()), watch=False)
            return None
        if t == 0x46:  # 'F' FunctionCall
            self._push(Entry("F", t0=perf_counter()), watch=False)
            return None
        return None

    def _query(self, body: bytes) -> bytes | None:
        sql = body[:-1].decode("utf-8", "surrogateescape")
        plan = self._classify(sql)
        entry = Entry("Q", plan=plan, t0=perf_counter())
        counts = self.statement_counts
        for st in plan.statements:
            counts[self._class_of(st), "simple"] += 1
        if not plan.changed:
            self._push(entry, watch=False)
            return None
        texts = []
        for i, st in enumerate(plan.statements):
            if st.action == REFUSE and entry.poison_index < 0:
                entry.poison_index = i
                entry.refusal = st
                texts.append(POISON_SQL)
            else:
                texts.append(st.sql)
        self._push(entry, watch=True)
        return messages.query("; ".join(texts))

    def _parse(self, body: bytes) -> bytes | None:
        name_end = body.index(b"\x00")
        name = body[:name_end].decode()
        sql_end = body.index(b"\x00", name_end + 1)
        sql = body[name_end + 1:sql_end].decode("utf-8", "surrogateescape")
        plan = self._classify(sql)
        st = Statement(plan)
        if plan.statements:
            st.cls = "refused" if plan.refused is not None else self._class_of(plan.statements[0])
        self.statements[name] = st
        if plan.refused is not None:
            self._push(Entry("P", name, statement=st, refusal=plan.refused), watch=True)
            return messages.message(b"P", name.encode() + b"\x00" + POISON_SQL.encode() + b"\x00\x00\x00")
        self._push(Entry("P", name, statement=st), watch=False)
        if not plan.changed:
            return None
        return messages.message(b"P", body[:name_end + 1] + plan.text.encode() + body[sql_end:])

    def _bind(self, body: bytes) -> bytes | None:
        portal_end = body.index(b"\x00")
        portal_name = body[:portal_end].decode()
        stmt_end = body.index(b"\x00", portal_end + 1)
        st = self.statements.get(body[portal_end + 1:stmt_end].decode())
        pos = stmt_end + 1
        (nfmt,) = _U16.unpack_from(body, pos)
        pos += 2 + 2 * nfmt
        (nparams,) = _U16.unpack_from(body, pos)
        pos += 2
        for _ in range(nparams):
            (length,) = _I32.unpack_from(body, pos)
            pos += 4 + (length if length > 0 else 0)
        results_at = pos
        (nres,) = _U16.unpack_from(body, pos)
        formats = struct.unpack_from(f"!{nres}h", body, pos + 2) if nres else ()
        portal = Portal(st, tuple(formats))
        self.portals[portal_name] = portal
        translated = bool(st and st.plan.translated)
        self._push(Entry("B", portal_name, portal=portal), watch=False)
        if translated and nres > 1 and st.layout is not None and st.layout.ncols == nres + len(st.layout.hidden):
            # Give the hidden column(s) a text format code at their positions.
            codes = list(formats)
            for i in st.layout.hidden:
                codes.insert(i, 0)
            portal.result_formats = tuple(codes)
            new_tail = _U16.pack(len(codes)) + struct.pack(f"!{len(codes)}h", *codes)
            return messages.message(b"B", body[:results_at] + new_tail)
        return None

    # ------------------------------------------------------------ server side

    def on_server_quiet(self, t: int, body: bytes) -> None:
        """A server message while the read path is quiet (only RowDescription, ReadyForQuery and
        ErrorResponse are shown): the leak check, statement latency and the server's errors."""
        if t == 0x54:  # 'T'
            if self._may_leak(body):
                self._check_leak(parse_row_description(body, self.events)[0])
        elif t == 0x5A:  # 'Z'
            if self.quiet_sent:
                sent = self.quiet_sent.popleft()
                if self.statement_seconds is not None:
                    self.statement_seconds.observe(perf_counter() - sent)
        elif t == 0x45:  # 'E'
            self._server_error(body)

    def _may_leak(self, body: bytes) -> bool:
        for oid in self._leak_oids:
            if oid in body:
                return True
        return False

    def on_server(self, t: int, body: bytes) -> bytes | None:
        """Account for one server message: None to forward it as it is, else the bytes to send instead
        (b"" to swallow it)."""
        pending = self.pending
        head = pending[0] if pending else None
        if head is not None and head.kind == "Zq":  # answers to quiet groups, owed before the FIFO's
            if t == 0x5A:
                self.on_server_quiet(t, body)
                if not self.quiet_sent:
                    self._pop()
            elif t == 0x54 or t == 0x45:
                self.on_server_quiet(t, body)
            return None
        if t == 0x44:  # 'D' DataRow
            layout = self._current_layout(head)
            if layout is not None and layout.translated:
                return self._translate_row(body, layout)
            return None
        if t == 0x54:  # 'T'
            if head is None or not head.watched:  # a passthrough result: only the leak check
                if self._may_leak(body):
                    self._check_leak(parse_row_description(body, self.events)[0])
                if head is not None and (head.kind == "DS" or head.kind == "DP"):
                    self._pop()
                return None
            layout, spans = parse_row_description(body, self.events)
            self._check_leak(layout)
            if head is None:
                return None
            if head.kind == "Q":
                head.layout = layout
            elif head.kind == "DS":
                self._pop()
                if head.statement is not None:
                    head.statement.layout = layout
            elif head.kind == "DP":
                self._pop()
                if head.portal is not None:
                    self._set_portal_layout(head.portal, layout)
                if head.injected:
                    return b""
            return strip_row_description(body, layout, spans) if layout.translated else None
        if t == 0x6E:  # 'n' NoData
            if head is not None and head.kind in ("DS", "DP"):
                self._pop()
                if head.injected:
                    return b""
            return None
        if t == 0x74:  # 't' ParameterDescription: the head stays until its 'T'/'n'
            return None
        if t in (0x31, 0x32, 0x33):  # ParseComplete, BindComplete, CloseComplete
            if head is not None:
                self._pop()
            return None
        if t == 0x43:  # 'C' CommandComplete
            if head is not None:
                if head.kind == "Q":
                    head.stmt_index += 1
                    head.layout = None
                elif head.kind == "E":
                    self._pop()
            return None
        if t == 0x73:  # 's' PortalSuspended
            if head is not None and head.kind == "E":
                self._pop()
            return None
        if t == 0x49:  # 'I' EmptyQueryResponse
            if head is not None:
                if head.kind == "Q":
                    head.stmt_index += 1
                elif head.kind == "E":
                    self._pop()
            return None
        if t == 0x45:  # 'E' ErrorResponse
            replacement = self._error(head)
            if replacement is None:  # the server's own error reaches the client
                self._server_error(body)
            return replacement
        if t == 0x5A:  # 'Z' ReadyForQuery ends a Sync, a Query or a FunctionCall
            while self.pending:
                entry = self._pop()
                if entry.kind in ("S", "Q", "F"):
                    if self.statement_seconds is not None:
                        self.statement_seconds.observe(perf_counter() - entry.t0)
                    break
            return None
        return None  # notices, notifications, parameter status, COPY traffic, …

    def row_translator(self):
        """The current result's DataRow translation as one callable (body -> message bytes), or None when the
        result at the head of the FIFO is not translated: the session calls it for each DataRow instead of
        `on_server` until the next other message, which may change the head."""
        head = self.pending[0] if self.pending else None
        if head is None or not head.watched:
            return None
        layout = self._current_layout(head)
        if layout is None or not layout.translated:
            return None
        translate = self._translate_row
        return lambda body: translate(body, layout)

    def _server_error(self, body: bytes) -> None:
        sqlstate = messages.parse_error_fields(body).get("C", "")
        self.server_errors[sqlstate] += 1
        if sqlstate in BY_SQLSTATE and self.on_refusal is not None:
            self.on_refusal(sqlstate, "")

    def _current_layout(self, head: Entry | None) -> Layout | None:
        if head is None:
            return None
        if head.kind == "Q":
            return head.layout
        if head.kind == "E" and head.portal is not None:
            portal = head.portal
            if portal.layout is None and portal.statement is not None and portal.statement.layout is not None:
                self._set_portal_layout(portal, portal.statement.layout)
            return portal.layout
        return None

    def _set_portal_layout(self, portal: Portal, layout: Layout) -> None:
        fmts = portal.result_formats

        def binary(i: int) -> bool:
            return (fmts[0] == 1) if len(fmts) == 1 else (len(fmts) > i and fmts[i] == 1)

        if layout.hidden:
            layout = replace(layout, era_binary=binary(layout.hidden[0]) and not layout.hidden_text,
                             payload_binary=tuple(binary(i) for i in layout.payloads))
        portal.layout = layout

    def _check_leak(self, layout: Layout) -> None:
        if (layout.types and not layout.hidden) or layout.derived:
            raise ReadPathError(
                "a result carries the events table's type column without the seat's era column "
                "(a view, a function or a statement shape the seat does not know); the session is closed "
                "rather than pass untranslated rows")
        if self.major == 2 and ((layout.payloads and not layout.hidden_text) or layout.derived_payload):
            raise ReadPathError(
                "a result carries the events table's payload column without the seat's projection "
                "(a view, a function or a statement shape the seat does not know); the session is closed "
                "rather than pass unprojected payloads")

    def _error(self, head: Entry | None) -> bytes | None:
        if head is None:
            return None
        if head.kind == "Q":
            if head.refusal is not None and head.stmt_index == head.poison_index:
                return self._refusal_error(head.refusal)
            return None  # the Query entry ends at its ReadyForQuery
        # Extended protocol: the server skips everything up to the next Sync.
        failed = self._pop()
        while self.pending and self.pending[0].kind != "S":
            self._pop()
        if failed.refusal is not None:
            return self._refusal_error(failed.refusal)
        return None

    def _refusal_error(self, refusal) -> bytes:
        code = ERRORS["statement_untranslatable"]
        self.refusals.append(refusal.kind)
        if self.on_refusal is not None:
            self.on_refusal(code.sqlstate, refusal.kind)
        envelope = {"error": code.code, "message": refusal.detail, "details": {"kind": refusal.kind}}
        return messages.error_response(code.sqlstate, f"{code.code}: {refusal.detail}",
                                       detail=orjson.dumps(envelope).decode(),
                                       hint="the statement was not run; see the openwop-seat README, "
                                            "'Statements the seat refuses'")

    def _projection(self, rest: bytes) -> bytes:
        """The projected payload in read_v2p's text after the era (b"" when unchanged); counts its metrics."""
        cut = rest.find(_META)
        if cut < 0:
            return rest
        payload, meta = rest[:cut], rest[cut + 1:]
        boxed, v2type, missing = meta.decode().split("\x1e")
        counts = self.payload_counts
        if payload:
            counts["projected", v2type, ""] += 1
        if boxed != "0":
            counts["boxed", v2type, ""] += int(boxed)
        for key in missing.split(",") if missing else ():
            counts["missing", v2type, key] += 1
        return payload

    def _translate_row(self, body: bytes, layout: Layout) -> bytes:
        """Strip hidden columns and map `type` by era, splicing the row's bytes (never decoding it)."""
        if layout.hidden_last:
            # The era column ends the row: a 1-byte era (text, or read_v2p's text with nothing projected)
            # or a 2-byte binary smallint. Its length field cannot be mistaken: read_v2p's longer text is
            # JSON, which holds no NUL byte.
            if not layout.era_binary:
                if body[-5:-1] == b"\x00\x00\x00\x01":
                    return self._splice_era_last(body, body[-1:] == self.map_era, len(body) - 5, layout)
            elif body[-6:-2] == b"\x00\x00\x00\x02":
                return self._splice_era_last(body, body[-2:] == self.map_era_bin, len(body) - 6, layout)
        return self._translate_row_walk(body, layout)

    def _splice_era_last(self, body: bytes, mapped: bool, cut: int, layout: Layout) -> bytes:
        """The fast path of `_translate_row`: drop the era column at ``cut``, map the type columns (each
        type field, length included, is swapped whole), and build the message in one join."""
        if not mapped:
            return b"".join((b"D", _I32.pack(cut + 4), layout.ncols_out, body[2:cut]))
        self.rows_translated += 1  # a row of the mapped era, type columns or not (as the walk counts it)
        unpack = _I32.unpack_from
        fields = self.type_fields
        parts = [b"D", b"", layout.ncols_out]
        size = cut + 4  # the message's length field: itself, the column count and the columns kept
        last = pos = 2
        col = 0
        for i in layout.types_sorted:
            while col < i:
                (length,) = unpack(body, pos)
                pos += 4 + (length if length > 0 else 0)
                col += 1
            (length,) = unpack(body, pos)
            end = pos + 4 + (length if length > 0 else 0)
            new = fields.get(body[pos:end])
            if new is not None:
                parts.append(body[last:pos])
                parts.append(new)
                size += len(new) - (end - pos)
                last = end
            pos = end
            col = i + 1
        parts.append(body[last:cut])
        parts[1] = _I32.pack(size)
        return b"".join(parts)

    def _translate_row_walk(self, body: bytes, layout: Layout) -> bytes:
        unpack = _I32.unpack_from
        offsets = []
        pos = 2
        for _ in range(layout.ncols):
            offsets.append(pos)
            (length,) = unpack(body, pos)
            pos += 4 + (length if length > 0 else 0)
        offsets.append(pos)
        h = offsets[layout.hidden[0]]
        (hlen,) = unpack(body, h)
        if hlen <= 0:
            raise ReadPathError("the seat's era column was NULL")
        projected = b""
        if layout.hidden_text:
            era = body[h + 4:h + 5]
            if hlen > 1:
                projected = self._projection(body[h + 5:h + 4 + hlen])
            mapped = era == self.map_era
        else:
            era = body[h + 4:h + 4 + hlen]
            mapped = era == (self.map_era_bin if layout.era_binary else self.map_era)
        out = [_I16.pack(layout.ncols - len(layout.hidden))]
        last = 2
        type_map = self.type_map
        cuts = (layout.cuts_projected if projected else layout.cuts_mapped) if mapped else layout.cuts_plain
        p = 0
        for i, what in cuts:
            start, stop = offsets[i], offsets[i + 1]
            out.append(body[last:start])
            last = stop
            if what == 1:
                new = type_map.get(body[start + 4:stop])
                if new is None:
                    out.append(body[start:stop])
                else:
                    out.append(_I32.pack(len(new)))
                    out.append(new)
            elif what == 2:
                value = _JSONB_VERSION + projected if layout.payload_binary[p] else projected
                p += 1
                out.append(_I32.pack(len(value)))
                out.append(value)
        out.append(body[last:])
        if mapped:
            self.rows_translated += 1
        row = b"".join(out)
        return b"D" + _I32.pack(len(row) + 4) + row

