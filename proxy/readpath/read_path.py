"""The read path, sans-IO: rewrites the statements of a translated session; its rows pass as sent.

Every statement text a translated session sends (Query, Parse) goes through
the classifier (:mod:`proxy.readpath.classify`), which substitutes the seat's translated
relation for the events table.  The rows then come back from the server
already translated, so the seat relays every DataRow as the server sent it and
never frames the server's stream for a translated result.

Two things still need the order of the server's answers:

- a *refused* statement is replaced by a *poison* statement that fails on the
  server at parse analysis (so the server's transaction, pipeline and
  ReadyForQuery are exactly those of a PostgreSQL error), and the seat swaps the
  poison's error for its own ``statement_untranslatable``.  When the session is
  idle outside a transaction block with nothing owed, and the refused statement
  is the first of its Query (or an unnamed Parse), nothing of it would run
  anyway: an empty stand-in is sent instead (no ERROR in PostgreSQL's log), and
  the seat swaps its answer for the refusal. For both the read path keeps a
  FIFO of the responses the server owes, exactly as PostgreSQL orders them,
  until the poison's (or the stand-in's) answer is in;
- the leak check: a RowDescription field that comes from the events table's
  own ``type`` (or, for major 2, ``payload``) column, or from a view over them
  that is not the seat's, can only mean untranslated values; the session is
  closed rather than relay them (``OW007``).  A substring test on the table
  OIDs keeps this off the parse path.

Plan once per session.  The reference host sends every parameterised query as
an unnamed Parse, which PostgreSQL parses, rewrites and plans again at every
execution; for a statement over the translated relation that costs more than
the page itself.  While the read path is quiet, an unnamed Parse of a
translated statement is sent once as a *named* server-side statement
(``openwop_seat_<n>``), and later unnamed Parses of the same text (and
parameter types) become an empty unnamed Parse (the client still gets its
ParseComplete, from the server) while the Bind and Describe that follow name
the prepared statement.  A name is trusted only once the ReadyForQuery of its
group arrived with no error in that group; names are never reused, so a
statement the server did not keep cannot be mistaken for one it did.
``DISCARD``/``DEALLOCATE`` forget them all.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from dataclasses import dataclass
from time import perf_counter

import orjson

from proxy import fifo
from proxy.errors import BY_SQLSTATE, CODES, SeatException
from proxy.readpath import encoding, fast_page
from proxy.readpath.classify import LARGE_TEXT, PASS, PREFILTERED, REFUSE, Classifier, Plan, StatementPlan
from proxy.wire import framer, messages
from proxy.wire.codec import ProtocolViolation
from proxy.wire.state import Phase
from proxy.wire.types import (
    BIND,
    BIND_COMPLETE,
    CLOSE,
    CLOSE_COMPLETE,
    COMMAND_COMPLETE,
    DATA_ROW,
    DESCRIBE,
    EMPTY_QUERY_RESPONSE,
    ERROR_RESPONSE,
    EXECUTE,
    FLUSH,
    FUNCTION_CALL,
    NO_DATA,
    PARAMETER_DESCRIPTION,
    PARSE,
    PARSE_COMPLETE,
    PORTAL_SUSPENDED,
    QUERY,
    READY_FOR_QUERY,
    ROW_DESCRIPTION,
    SYNC,
)

_I16 = struct.Struct("!h")
_U16 = struct.Struct("!H")
_I32 = struct.Struct("!i")

# A statement that always fails at parse analysis, on any server, whatever the client bound (only the schema's
# owner could create the relation). PostgreSQL logs its error: the relation's name says what happened there.
POISON_SQL = 'SELECT FROM openwop_seat."refused by openwop-seat: the client got its error"'
PREPARED_PREFIX = "openwop_seat_"
# A statement text at least this long (bytes) that has no plan yet is parsed off the event loop (a worker thread),
# so that other sessions are served meanwhile (issue 23: a 0.96 MiB statement stalled a worker for seconds).
ANALYSE_OFF_LOOP = 8 << 10
MAX_PREPARED = 256  # server-side statements the seat keeps per session (then it stops adding)
MAX_CLOSING = 64  # twins waiting to be closed on the server (fast pages stopped): no new named twin meanwhile
# The longest unnamed Parse a session keeps to repeat without classifying it again (ReadPath._repeated_parse): a
# page's is a few hundred bytes; a longer text costs more to keep in each idle session than its classifying costs.
REPEAT_MAX_BYTES = 2048

# Statement classes for the metrics: a statement the classifier left alone counts as an event write when it
# starts with one of these keywords and names the events table soon after (no parse: a cheap approximation,
# so `WITH … INSERT INTO events` or a leading comment counts as passthrough).
_WRITE_HEADS = frozenset(("INSERT", "UPDATE", "DELETE", "COPY"))
_CLASS = {"translate": "event_read", REFUSE: "refused"}


class ReadPathError(SeatException):
    """A result the seat must not pass on and cannot fail cleanly on the server: end the session."""


@dataclass(frozen=True)
class EventColumns:
    """Where the events table's columns are, to recognise them in RowDescription."""

    table_oid: int
    type_attnum: int
    # Views (and materialized views) that read events.type, the seat's own excepted: their rows are untranslated.
    derived_oids: frozenset[int] = frozenset()
    payload_attnum: int = 0  # 0: unknown (no payload column is recognised)
    # Views that read events.payload, the seat's own excepted (major 2 only).
    derived_payload_oids: frozenset[int] = frozenset()


class RelationWatch:
    """What every translated session of a seat checks its results against, kept fresh by the server
    (``SeatServer._watch_relations``): the events table's columns and the views over them, and why the
    translated relations are stale ('' when they match the table)."""

    def __init__(self, events: EventColumns | None, stale: str = ""):
        self.stale = stale
        self.set(events)

    def set(self, events: EventColumns | None) -> None:
        self.events = events
        # The 4-byte table OIDs a RowDescription field must carry to come from the events table or a view
        # over it: a RowDescription holding none of them cannot leak (a substring test, no parsing).
        self.leak_oids = () if events is None else tuple(
            struct.pack("!I", oid) for oid in {events.table_oid, *events.derived_oids, *events.derived_payload_oids})


@dataclass
class Statement:
    plan: Plan
    cls: str = "passthrough"  # its class for the statement metrics, counted per Execute


@dataclass
class Portal:
    statement: Statement | None


@dataclass(slots=True)
class Entry:
    """A response the server owes, in order."""

    kind: str  # 'P', 'B', 'DS', 'DP', 'E', 'C', 'S', 'Q', 'F'; 'Zq': the quiet answers owed before it
    name: str = ""
    refusal: object = None  # the refused StatementPlan, when this entry carries a poison
    plan: Plan | None = None  # for 'Q'
    poison_index: int = -1  # for 'Q': which statement is the poison
    stmt_index: int = 0  # for 'Q': statements completed so far
    watched: bool = False  # its answers must be looked at (an error swapped)
    # A refusal answered without an error on the server: an empty stand-in (Query "" or an empty unnamed Parse) was
    # sent instead, whose answer (EmptyQueryResponse, ParseComplete) the seat swaps for its refusal.
    local: bool = False
    t0: float = 0.0  # for 'S', 'Q', 'F': when it was sent (statement latency)


# An empty unnamed Parse: what the client's repeated Parse of a plan-once statement becomes (its ParseComplete).
_EMPTY_UNNAMED_PARSE = messages.message(b"P", b"\x00\x00\x00\x00")

# Extended-protocol messages of a quiet group, by type byte: the FIFO entry each one owes.
_QUIET_KINDS = {PARSE: "P", BIND: "B", EXECUTE: "E", CLOSE: "C"}

# The compiled quiet bookkeeping (_cquiet.c, ADR 0018's second addendum): ReadPath._quiet_client's Bind, Describe,
# Execute and Sync, the relay's join of a chunk's parts, and the quiet server side's RowDescription and
# ReadyForQuery (Relay._server_read with on_server_quiet), in C. Taken with the compiled framer
# (OPENWOP_SEAT_FRAMER chooses both); None where it is not built or the pure-Python framer is chosen, and the relay
# then calls on_client for every message as it did.
try:
    from proxy.readpath import _cquiet
except ImportError:  # not built: see setup.py
    _cquiet = None
    QUIET_MISSING = "the compiled quiet read path (proxy/readpath/_cquiet.c) is not built"
else:
    _cquiet.init(Portal, _EMPTY_UNNAMED_PARSE, Phase.AUTHENTICATING)
    QUIET_MISSING = ""
if _cquiet is None and framer.IMPLEMENTATION == "c" and \
        os.environ.get(framer.IMPLEMENTATION_ENV, "").strip().lower() == "c":
    raise ImportError(f"{framer.IMPLEMENTATION_ENV}=c, but {QUIET_MISSING}; run make setup (it needs a C compiler "
                      "and Python's headers), or unset it for the pure-Python core")
QUIET_RUN = _cquiet.quiet_run if _cquiet is not None and framer.IMPLEMENTATION == "c" else None
JOIN_PARTS = _cquiet.join_parts if QUIET_RUN is not None else None
SERVER_QUIET_RUN = _cquiet.server_quiet_run if QUIET_RUN is not None else None


def leak_of(body: bytes, events: EventColumns, major: int) -> str:
    """Why a RowDescription carries untranslated event values ('' when it does not)."""
    (n,) = _I16.unpack_from(body, 0)
    pos = 2
    for _ in range(n):
        end = body.index(b"\x00", pos)
        table_oid, attnum = struct.unpack_from("!Ih", body, end + 1)
        pos = end + 19
        if table_oid == events.table_oid and attnum == events.type_attnum:
            return "the events table's type column as stored"
        if table_oid in events.derived_oids:
            return "a column of a view over the events table's type column"
        if major == 2:
            if table_oid == events.table_oid and attnum == events.payload_attnum and attnum:
                return "the events table's payload column as stored"
            if table_oid in events.derived_payload_oids:
                return "a column of a view over the events table's payload column"
    return ""


class ReadPath:
    """Per-session read-path state. `major` is 1 or 2 (raw sessions never get one).

    A seat holds one per translated connection, idle ones included (make bench's idle_memory): slots, and no
    container made before it is needed. The FIFOs are :mod:`proxy.fifo` queues: lists while short (an empty one is
    56 bytes, a deque 760 bytes however empty), deques once long (a client may pipeline up to
    ``Session._max_owed`` answers)."""

    __slots__ = ("_names", "_repeat", "active", "classifier", "fast_twins", "large_texts", "major", "on_refusal",
                 "parse_seconds",
                 "pending", "portals", "prepared", "preparing", "quiet_group", "quiet_sent", "readies", "refusals",
                 "server_errors", "skipping", "statement_counts", "statement_seconds", "statements", "twins_closing",
                 "tx_status", "unnamed", "watch")

    def __init__(self, classifier: Classifier, major: int, events: EventColumns | None,
                 watch: RelationWatch | None = None):
        self.classifier = classifier
        self.major = major
        # The events table's columns and views, and the 4-byte table OIDs a RowDescription field must carry to come
        # from one of them: shared by the seat's sessions (a RowDescription holding none of them cannot leak).
        self.watch = watch if watch is not None else RelationWatch(events)
        self.pending: list[Entry] = []
        # Quiet bookkeeping (nothing owed is watched): when each quiet Sync/Query/FunctionCall was sent,
        # oldest first (one ReadyForQuery owed each), and the FIFO kinds of the open extended group.
        self.quiet_sent: list[float] = []
        self.quiet_group: list[str] = []
        self.statements: dict[str, Statement] = {}  # named statements that are not passthrough, for the metrics
        self.portals: dict[str, Portal] = {}
        self.active = 0  # pending entries whose answers the seat must inspect
        self.refusals: list[str] | tuple = ()  # a list from the first refusal
        # Plan once per session: rewritten text (+ parameter types) -> the server-side statement holding it.
        self.prepared: dict[tuple[str, bytes], str] = {}  # (rewritten text, parameter types) -> name
        self.preparing: list[list] = []  # [key, name, ReadyForQuery index that ends its group, failed]
        self.unnamed: str | None = None  # the prepared statement the client's unnamed statement stands for
        # The fast pages' twins (ADR 0024, proxy/readpath/fast_page.py): a plan-once statement's name (bytes) -> its
        # twin [state, name, Parse message, the run's parameter, fast text]; None until a page is prepared.
        self.fast_twins: dict[bytes, list] | None = None
        # Server-side twins no statement names any more (the client closed or parsed again its named statement, or
        # DEALLOCATE/DISCARD forgot them): closed by the relay ahead of its next fast page (fast_page.Pending).
        self.twins_closing: list[bytes] | tuple = ()
        # The transaction status of the last ReadyForQuery ('I' idle, 'T' in a block, 'E' failed), and whether the
        # client's messages are skipped until its Sync (after a refused Parse answered locally, as PostgreSQL
        # skips them after an error).
        self.tx_status = b"I"
        self.skipping = False
        self.readies = 0  # ReadyForQuery messages seen while quiet
        self._names = 0
        # The last unnamed Parse that can be repeated, and what it found: (its body, the classifier's generation,
        # the prepared key, the plan-once statement's name and the Statement kept for it (None for a text passed as
        # it is), its text). A page's next Parse with the same bytes has the same outcome while they still hold
        # (_repeated_parse).
        self._repeat: tuple | None = None
        # Metrics; `attach` swaps in the process-wide ones (plain additions either way).
        self.statement_counts: Counter[tuple[str, str]] = Counter()  # (class, protocol)
        self.server_errors: Counter[str] = Counter()  # upstream ErrorResponses passed on, by SQLSTATE
        self.statement_seconds = None  # a metrics.Histogram, or None
        self.parse_seconds = None
        self.on_refusal = None  # called with (sqlstate, kind) for each OpenWOP refusal, to log it
        self.large_texts: list[str] | tuple = ()  # long statements this session had planned (and cached): see close

    def analysis_needed(self, t: int, body: bytes) -> str | None:
        """The text of a Query or Parse long enough (ANALYSE_OFF_LOOP bytes) to be parsed off the event loop and
        not planned yet, or None: the caller has Classifier.analyse() run in a worker thread, hands the plan back
        with Classifier.analysed(), and only then passes the message to on_client."""
        if len(body) < ANALYSE_OFF_LOOP or (t != QUERY and t != PARSE):
            return None
        try:
            if t == QUERY:
                sql = body[:-1].decode("utf-8", "surrogateescape")
            else:
                name_end = body.index(b"\x00")
                sql = body[name_end + 1:body.index(b"\x00", name_end + 1)].decode("utf-8", "surrogateescape")
        except ValueError:
            return None  # malformed: on_client says so
        return sql if self.classifier.needs_analysis(sql) else None

    def close(self) -> None:
        """The session ended: the plans of its long statements leave the shared cache with it."""
        if self.large_texts:
            self.classifier.forget(self.large_texts)
            self.large_texts = ()

    def attach(self, stats, on_refusal=None) -> None:
        """Count into the process-wide `metrics.Stats` instead of this read path's own counters."""
        self.statement_counts = stats.statements
        self.server_errors = stats.server_errors
        self.statement_seconds = stats.statement_seconds
        self.parse_seconds = stats.parse_seconds
        self.on_refusal = on_refusal

    def _classify(self, sql: str) -> Plan:
        classifier = self.classifier
        misses = classifier.misses
        start = perf_counter()
        plan = classifier.classify(sql)
        if classifier.misses != misses:
            if self.parse_seconds is not None:
                self.parse_seconds.observe(perf_counter() - start)
            if len(sql) > LARGE_TEXT:  # its plan is this session's share of the cache: dropped when it ends
                if not self.large_texts:
                    self.large_texts = []
                self.large_texts.append(sql)
        if plan.translated and self.watch.stale:
            refusal = StatementPlan(REFUSE, sql, "translated relations stale",
                                    f"the seat's translated relations no longer match the events table "
                                    f"({self.watch.stale}): run openwop-seat migrate")
            return Plan((refusal,), sql, False, refusal, True)
        return plan

    def _class_of(self, st) -> str:
        if st.kind is PREFILTERED:  # the prefilter found no mention of the events table: not an event write
            return "passthrough"
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
        pending = self.pending
        pending.append(entry)
        if len(pending) > fifo.LONG:
            self.pending = fifo.grown(pending)

    def _pop(self) -> Entry:
        entry = fifo.popleft(self.pending)
        if entry.watched:
            self.active -= 1
        return entry

    @property
    def quiet(self) -> bool:
        """Nothing the server owes is in the FIFO: its answers need no framing by the read path."""
        return not self.pending

    def on_client(self, t: int, body: bytes) -> bytes | None:
        """Account for one client message; returns replacement bytes, or None to forward it as is.

        A message whose body does not hold what its type promises raises ProtocolViolation (08P01), as
        PostgreSQL ends such a session."""
        try:
            if self.skipping:  # after a refused Parse answered locally: PostgreSQL ignores all but Sync
                replacement = self._skipped(t, body)
                if self.skipping:
                    return replacement
            if not self.pending:
                done, replacement = self._quiet_client(t, body)
                if done:
                    return replacement
            return self._on_client(t, body)
        except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
            raise ProtocolViolation(f"invalid {chr(t)!r} message from the client: {e}") from None

    def _skipped(self, t: int, body: bytes) -> bytes | None:
        """A client message after a refused Parse answered locally, up to its Sync: dropped, as PostgreSQL ignores
        it after an error (a Flush goes on, so that a client waiting for the Parse's answer gets the refusal; the
        Sync ends the skipping and is handled as always). The bytes to send (b"": none), or None."""
        if t == BIND:  # the statement metrics count an Execute by its portal's statement, as usual
            portal_end = body.index(b"\x00")
            stmt_end = body.index(b"\x00", portal_end + 1)
            self.portals[body[:portal_end].decode()] = Portal(
                self.statements.get(body[portal_end + 1:stmt_end].decode()))
        elif t == EXECUTE:
            portal = self.portals.get(body[:body.index(b"\x00")].decode())
            self.statement_counts[portal.statement.cls if portal and portal.statement else "passthrough",
                                  "extended"] += 1
        elif t == SYNC:
            self.skipping = False
            return None
        return None if t == FLUSH else b""

    def _quiet_client(self, t: int, body: bytes) -> tuple[bool, bytes | None]:
        """Quiet bookkeeping of one client message: (True, replacement) when handled; (False, None) when it
        needs the FIFO (a refused statement, or a group the quiet bookkeeping cannot follow)."""
        if t == SYNC:  # 'S' Sync
            sent = self.quiet_sent
            sent.append(perf_counter())
            if len(sent) > fifo.LONG:
                self.quiet_sent = fifo.grown(sent)
            self.quiet_group.clear()
            return True, None
        replacement = None
        if t == PARSE:  # 'P'
            if self._repeat is not None and self._repeated_parse(body):
                return True, None if self.unnamed is None else _EMPTY_UNNAMED_PARSE
            name_end = body.index(b"\x00")
            sql_end = body.index(b"\x00", name_end + 1)
            sql = body[name_end + 1:sql_end].decode("utf-8", "surrogateescape")
            plan = self._classify(sql)
            if plan.refused is not None:
                return self._unquiet()
            name = body[:name_end].decode()
            if name:
                self._drop_twin(name)  # a named statement parsed again: not the statement its twin was made for
            cls = self._class_of(plan.statements[0]) if plan.statements else "passthrough"
            if cls == "passthrough":
                if self.statements:
                    self.statements.pop(name, None)
            else:
                old = self.statements.get(name)
                if old is None or old.plan is not plan or old.cls != cls:  # a page's repeated Parse keeps its own
                    self.statements[name] = Statement(plan, cls=cls)
            if not name:
                self.unnamed = None
            forgets = _forgets_prepared(sql)
            if forgets and (self.prepared or self.preparing or self.fast_twins):
                self._forget_prepared()
            if plan.changed:
                replacement = self._translated_parse(name, plan.text, body[sql_end + 1:], plan)
            if not name and not forgets and len(body) <= REPEAT_MAX_BYTES:
                if replacement is _EMPTY_UNNAMED_PARSE and cls != "passthrough":
                    self._repeat = (body, self.classifier.generation, (plan.text, body[sql_end + 1:]), self.unnamed,
                                    self.statements[name], sql)
                elif not plan.changed and cls == "passthrough":
                    self._repeat = (body, self.classifier.generation, None, None, None, sql)
        elif t == BIND:  # 'B'
            portal_end = body.index(b"\x00")
            stmt_end = body.index(b"\x00", portal_end + 1)
            stmt = body[portal_end + 1:stmt_end]
            st = self.statements.get(stmt.decode()) if self.statements else None
            if st is not None:
                portal = body[:portal_end].decode()
                held = self.portals.get(portal)
                if held is None or held.statement is not st:  # a page's repeated Bind keeps its portal
                    self.portals[portal] = Portal(st)
            elif self.portals:
                self.portals.pop(body[:portal_end].decode(), None)
            if not stmt and self.unnamed is not None:
                replacement = messages.message(b"B", body[:portal_end + 1] + self.unnamed.encode() + body[stmt_end:])
        elif t == EXECUTE:  # 'E'
            portal = self.portals.get(body[:body.index(b"\x00")].decode()) if self.portals else None
            st = portal.statement if portal is not None else None
            self.statement_counts[st.cls if st is not None else "passthrough", "extended"] += 1
        elif t == DESCRIBE:  # 'D'
            kind = body[:1]
            if kind == b"S" and body == b"S\x00" and self.unnamed is not None:
                replacement = messages.message(b"D", b"S" + self.unnamed.encode() + b"\x00")
            self.quiet_group.append("DS" if kind == b"S" else "DP")
            return True, replacement
        elif t == CLOSE:  # 'C' Close
            self._close(body)
        elif t == QUERY:  # 'Q'
            if self.quiet_group:
                return self._unquiet()
            sql = body[:-1].decode("utf-8", "surrogateescape")
            plan = self._classify(sql)
            if plan.refused is not None:
                return self._unquiet()
            self.unnamed = None  # a simple Query destroys the unnamed statement
            if (self.prepared or self.preparing or self.fast_twins) and _forgets_prepared(sql):
                self._forget_prepared()
            counts = self.statement_counts
            for st in plan.statements:
                counts[self._class_of(st), "simple"] += 1
            sent = self.quiet_sent
            sent.append(perf_counter())
            if len(sent) > fifo.LONG:
                self.quiet_sent = fifo.grown(sent)
            return True, (_query(plan.text) if plan.changed else None)
        elif t == FUNCTION_CALL:  # 'F' FunctionCall: a function by OID, out of the seat's sight
            return self._unquiet()
        else:  # Flush, Terminate, COPY traffic: nothing owed
            return True, None
        self.quiet_group.append(_QUIET_KINDS[t])
        return True, replacement

    def _repeated_parse(self, body: bytes) -> bool:
        """A repeated unnamed Parse (a page's, sent again at every page), done as the last one was without decoding
        and classifying its text again. Either a translated statement whose plan-once statement was found (it is
        still prepared, and the unnamed statement's metrics entry is the one that Parse made: the Parse becomes an
        empty one and the unnamed statement stands for the prepared one) or a statement the read path passes as it
        is (no metrics entry: it goes on as it came). Only while the bytes are the same, the classifier's plans of
        the same generation and the translated relations not stale; else False, and the Parse goes the whole way
        (which records it again when it can be repeated)."""
        repeat = self._repeat
        statements = self.statements
        if (repeat[0] != body or repeat[1] != self.classifier.generation or self.watch.stale
                or (repeat[2] is not None and self.prepared.get(repeat[2]) != repeat[3])
                or (statements.get("") if statements else None) is not repeat[4]):
            self._repeat = None
            return False
        self.classifier.touch(repeat[5])  # its cache hit counted, its plan kept recent, as classify would
        self.unnamed = repeat[3]
        self.quiet_group.append("P")
        return True

    def _translated_parse(self, name: str, text: str, tail: bytes, plan: Plan | None = None) -> bytes:
        """The Parse to send for a translated statement: the rewritten text; an unnamed one as a named
        server-side statement, prepared once per session (with its fast twin's name, for a page: ADR 0024)."""
        if name:
            if plan is not None and plan.fast and len(self.twins_closing) < MAX_CLOSING and \
                    len(self.fast_twins or ()) + len(self.preparing) < MAX_PREPARED:
                # a named page's twin (ADR 0024's addendum): usable once the client's statement is trusted, under
                # the client's name; dropped with it (_drop_twin)
                self.preparing.append([None, name, self.readies + len(self.quiet_sent) + 1, False,
                                       self._twin(plan, tail)])
            return messages.message(b"P", name.encode() + b"\x00" + text.encode("utf-8", "surrogateescape")
                                    + b"\x00" + tail)
        # Keyed on the rewritten text (the classifier's own string, whose hash is kept) and the parameter types:
        # a page's repeated Parse finds its statement without encoding and hashing the text again.
        key = (text, tail)
        prepared = self.prepared.get(key)
        if prepared is not None:
            self.unnamed = prepared
            return _EMPTY_UNNAMED_PARSE  # an empty unnamed statement: ParseComplete
        statement = text.encode("utf-8", "surrogateescape") + b"\x00" + tail
        if len(self.prepared) + len(self.preparing) >= MAX_PREPARED:
            return messages.message(b"P", b"\x00" + statement)
        self._names += 1
        prepared = f"{PREPARED_PREFIX}{self._names}"
        # trusted once the ReadyForQuery of this group (after those already owed) came without an error; its fast
        # twin usable from then on
        # (a page's fast twin, ADR 0024: usable from then on too)
        twin = self._twin(plan, tail, prepared) if plan is not None and plan.fast else None
        self.preparing.append([key, prepared, self.readies + len(self.quiet_sent) + 1, False, twin])
        self.unnamed = prepared
        return messages.message(b"P", prepared.encode() + b"\x00" + statement)

    def _twin(self, plan: Plan, tail: bytes, prepared: str = "") -> list:
        """A page's fast twin (ADR 0024), named after its plan-once statement (or a name of its own, for a client's
        named statement): prepared by the relay with the first fast page that names it (fast_page.Pending.group)."""
        if not prepared:
            self._names += 1
            prepared = f"{PREPARED_PREFIX}{self._names}"
        name = f"{prepared}f".encode()
        return [fast_page.NOT_PREPARED, name, messages.message(
            b"P", name + b"\x00" + plan.fast.encode("utf-8", "surrogateescape") + b"\x00" + tail),
            plan.fast_key, plan.fast]

    def _close(self, body: bytes) -> None:
        """A client's Close: its statement or portal forgotten (a named statement's twin with it)."""
        kind, name = body[:1], body[1:-1].decode()
        (self.statements if kind == b"S" else self.portals).pop(name, None)
        if kind == b"S":
            if not name:
                self.unnamed = None
            else:
                self._drop_twin(name)

    def _drop_twin(self, name: str) -> None:
        """The client's named statement ``name`` is closed or parsed again: its twin (if any) is no longer the
        statement's, and goes (closed on the server, once prepared there: twins_closing)."""
        if not self.fast_twins and not self.preparing:
            return
        if self.preparing:
            self.preparing = [p for p in self.preparing if p[0] is not None or p[1] != name]
        twin = self.fast_twins.pop(name.encode(), None) if self.fast_twins else None
        if twin is not None:
            self._closing(twin)

    def _closing(self, twin: list) -> None:
        if twin[0] == fast_page.PREPARED:
            if not self.twins_closing:
                self.twins_closing = []
            self.twins_closing.append(twin[1])

    def _forget_prepared(self) -> None:
        if self.fast_twins:  # DEALLOCATE may have left them (a false positive of _forgets_prepared, or another name)
            for twin in self.fast_twins.values():
                self._closing(twin)
        self.prepared.clear()
        self.preparing.clear()
        self.unnamed = None
        self.fast_twins = None

    def _unquiet(self) -> tuple[bool, None]:
        """Hand the quiet bookkeeping to the FIFO: the answers still owed, then the open group's messages."""
        if self.quiet_sent:
            self._push(Entry("Zq"), False)
        for kind in self.quiet_group:
            self._push(Entry(kind), False)
        self.quiet_group.clear()
        self.preparing.clear()  # their outcome can no longer be told apart: never trusted
        self.unnamed = None
        return False, None

    def _refuse_locally(self) -> bool:
        """Whether a refused statement can be answered without an error on the server (so that an ordinary
        refusal leaves no ERROR line in PostgreSQL's log): the session is idle outside a transaction block and
        nothing is owed, so the refused statement is the first of its implicit transaction and PostgreSQL would
        have run nothing of it. Inside a block the server's transaction must fail as after any error: the poison."""
        return not self.pending and self.tx_status == b"I"

    def _on_client(self, t: int, body: bytes) -> bytes | None:
        if t == QUERY:  # 'Q'
            return self._query(body)
        if t == PARSE:  # 'P'
            return self._parse(body)
        if t == BIND:  # 'B'
            portal_end = body.index(b"\x00")
            stmt_end = body.index(b"\x00", portal_end + 1)
            st = self.statements.get(body[portal_end + 1:stmt_end].decode())
            self.portals[body[:portal_end].decode()] = Portal(st)
            self._push(Entry("B"), watch=False)
            return None
        if t == DESCRIBE:  # 'D'
            self._push(Entry("DS" if body[:1] == b"S" else "DP", body[1:-1].decode()), watch=False)
            return None
        if t == EXECUTE:  # 'E'
            portal = self.portals.get(body[:body.index(b"\x00")].decode())
            self._push(Entry("E"), watch=False)
            self.statement_counts[portal.statement.cls if portal and portal.statement else "passthrough",
                                  "extended"] += 1
            return None
        if t == CLOSE:  # 'C' Close
            self._close(body)
            self._push(Entry("C"), watch=False)
            return None
        if t == SYNC:  # 'S' Sync
            self._push(Entry("S", t0=perf_counter()), watch=False)
            return None
        if t == FUNCTION_CALL:  # 'F' FunctionCall: refused (it names a function by OID, which the seat cannot see)
            refusal = _FUNCTION_CALL_REFUSAL
            entry = Entry("Q", refusal=refusal, poison_index=0, t0=perf_counter())
            self._push(entry, watch=True)
            self.statement_counts["refused", "function_call"] += 1
            return messages.query(POISON_SQL)
        return None

    def _query(self, body: bytes) -> bytes | None:
        sql = body[:-1].decode("utf-8", "surrogateescape")
        plan = self._classify(sql)
        self.unnamed = None  # a simple Query destroys the unnamed statement
        if (self.prepared or self.preparing or self.fast_twins) and _forgets_prepared(sql):
            self._forget_prepared()
        entry = Entry("Q", plan=plan, t0=perf_counter())
        counts = self.statement_counts
        for st in plan.statements:
            counts[self._class_of(st), "simple"] += 1
        if plan.refused is None:
            self._push(entry, watch=False)
            return _query(plan.text) if plan.changed else None
        if plan.statements and plan.statements[0].action == REFUSE and self._refuse_locally():
            # the first statement is refused: nothing of the Query would run; an empty Query stands in
            entry.poison_index, entry.refusal, entry.local = 0, plan.statements[0], True
            self._push(entry, watch=True)
            return _query("")
        texts = []
        for i, st in enumerate(plan.statements):
            if st.action == REFUSE and entry.poison_index < 0:
                entry.poison_index = i
                entry.refusal = st
                texts.append(POISON_SQL)
            else:
                texts.append(st.sql)
        self._push(entry, watch=True)
        return _query("; ".join(texts))

    def _parse(self, body: bytes) -> bytes | None:
        name_end = body.index(b"\x00")
        name = body[:name_end].decode()
        sql_end = body.index(b"\x00", name_end + 1)
        sql = body[name_end + 1:sql_end].decode("utf-8", "surrogateescape")
        plan = self._classify(sql)
        if not name:
            self.unnamed = None  # the client's unnamed statement is this one, sent as it is (the FIFO is in use)
        else:
            self._drop_twin(name)
        if (self.prepared or self.preparing or self.fast_twins) and _forgets_prepared(sql):
            self._forget_prepared()
        st = Statement(plan)
        if plan.statements:
            st.cls = "refused" if plan.refused is not None else self._class_of(plan.statements[0])
        self.statements[name] = st
        if plan.refused is not None and not name and self._refuse_locally():
            # an empty unnamed statement stands in; what the client sends until its Sync is dropped
            self._push(Entry("P", name, refusal=plan.refused, local=True), watch=True)
            self.skipping = True
            return _EMPTY_UNNAMED_PARSE
        if plan.refused is not None:
            self._push(Entry("P", name, refusal=plan.refused), watch=True)
            return messages.message(b"P", name.encode() + b"\x00" + POISON_SQL.encode() + b"\x00\x00\x00")
        self._push(Entry("P", name), watch=False)
        if not plan.changed:
            return None
        return messages.message(b"P", body[:name_end + 1] + plan.text.encode("utf-8", "surrogateescape")
                                + body[sql_end:])

    # ------------------------------------------------------------ server side

    def on_server_quiet(self, t: int, body: bytes) -> bytes | None:
        """A server message while the read path is quiet (only RowDescription, ReadyForQuery and
        ErrorResponse are shown): the leak check, statement latency, the server's errors, and the outcome
        of the statements being prepared. Returns the bytes to send instead of an ErrorResponse, or None."""
        if t == ROW_DESCRIPTION:  # 'T'
            if self._may_leak(body):
                self._check_leak(body)
        elif t == READY_FOR_QUERY:  # 'Z'
            self.readies += 1
            self.tx_status = body[:1]
            if self.preparing:
                self._settle_prepared()
            if self.quiet_sent:
                sent = fifo.popleft(self.quiet_sent)
                if self.statement_seconds is not None:
                    self.statement_seconds.observe(perf_counter() - sent)
        elif t == ERROR_RESPONSE:  # 'E'
            current = self.readies + 1  # the group this error belongs to
            for p in self.preparing:
                if p[2] == current:
                    p[3] = True
            self._server_error(body)
            return self._withhold_stored_row(body)
        return None

    def _settle_prepared(self) -> None:
        keep = []
        for p in self.preparing:
            if p[2] > self.readies:
                keep.append(p)
            elif not p[3]:
                if p[0] is not None:  # a plan-once statement (a client's named page has its twin only)
                    self.prepared[p[0]] = p[1]
                if p[4] is not None:
                    if self.fast_twins is None:
                        self.fast_twins = {}
                    self.fast_twins[p[1].encode()] = p[4]
        self.preparing = keep

    def _may_leak(self, body: bytes) -> bool:
        for oid in self.watch.leak_oids:
            if oid in body:
                return True
        return False

    def _check_leak(self, body: bytes) -> None:
        if self.major == 1 and self.classifier.first_boot:
            return  # first boot: a v1 session reads event rows as stored (no run is era 3 before the rules apply)
        why = leak_of(body, self.watch.events, self.major)
        if why:
            raise ReadPathError(f"a result carries {why} (a view, a function or a statement shape the seat does "
                                f"not know); the session is closed rather than pass untranslated rows")

    def on_server(self, t: int, body: bytes) -> bytes | None:
        """Account for one server message: None to forward it as it is, else the bytes to send instead."""
        pending = self.pending
        head = pending[0] if pending else None
        if head is not None and head.kind == "Zq":  # answers to quiet groups, owed before the FIFO's
            if t == READY_FOR_QUERY:
                self.on_server_quiet(t, body)
                if not self.quiet_sent:
                    self._pop()
            elif t == ROW_DESCRIPTION or t == ERROR_RESPONSE:
                return self.on_server_quiet(t, body)
            return None
        if t == DATA_ROW:  # 'D' DataRow
            return None
        if t == ROW_DESCRIPTION:  # 'T'
            if self._may_leak(body):
                self._check_leak(body)
            if head is not None and (head.kind == "DS" or head.kind == "DP"):
                self._pop()
            return None
        if t == NO_DATA:  # 'n' NoData
            if head is not None and head.kind in ("DS", "DP"):
                self._pop()
            return None
        if t == PARAMETER_DESCRIPTION:  # 't' ParameterDescription: the head stays until its 'T'/'n'
            return None
        if t in (PARSE_COMPLETE, BIND_COMPLETE, CLOSE_COMPLETE):  # ParseComplete, BindComplete, CloseComplete
            if head is not None:
                self._pop()
                if head.local:  # the stand-in's ParseComplete: the client gets the refusal
                    return self._refusal_error(head.refusal)
            return None
        if t == COMMAND_COMPLETE:  # 'C' CommandComplete
            if head is not None:
                if head.kind == "Q":
                    head.stmt_index += 1
                elif head.kind == "E":
                    self._pop()
            return None
        if t == PORTAL_SUSPENDED:  # 's' PortalSuspended
            if head is not None and head.kind == "E":
                self._pop()
            return None
        if t == EMPTY_QUERY_RESPONSE:  # 'I' EmptyQueryResponse
            if head is not None:
                if head.local and head.kind == "Q" and head.stmt_index == 0:  # the stand-in's answer
                    head.stmt_index += 1
                    return self._refusal_error(head.refusal)
                if head.kind == "Q":
                    head.stmt_index += 1
                elif head.kind == "E":
                    self._pop()
            return None
        if t == ERROR_RESPONSE:  # 'E' ErrorResponse
            replacement = self._error(head)
            if replacement is None:  # the server's own error reaches the client
                self._server_error(body)
                return self._withhold_stored_row(body)
            return replacement
        if t == READY_FOR_QUERY:  # 'Z' ReadyForQuery ends a Sync, a Query or a FunctionCall
            self.tx_status = body[:1]
            while self.pending:
                entry = self._pop()
                if entry.kind in ("S", "Q", "F"):
                    if self.statement_seconds is not None:
                        self.statement_seconds.observe(perf_counter() - entry.t0)
                    break
            return None
        return None  # notices, notifications, parameter status, COPY traffic, …

    def _withhold_stored_row(self, body: bytes) -> bytes | None:
        """A constraint's DETAIL prints the failing row, or a key, as stored: after the writer rule that is the
        other era's spelling of what this session wrote. The DETAIL is replaced; the rest is the server's."""
        if b"DFailing row contains" not in body and b"DKey (" not in body:
            return None
        fields = messages.parse_error_fields(body)
        detail = fields.get("D", "")
        if detail.startswith("Key ("):
            columns = {c.strip().strip('"') for c in detail[5:detail.find(")")].split(",")}
            host = self.classifier.host
            if host.type_column not in columns and host.payload_column not in columns:
                return None
        elif not detail.startswith("Failing row contains"):
            return None
        out = bytearray()
        for code, value in _error_field_list(body):
            if code == "D":
                value = ("the row (or key) as stored is withheld by openwop-seat: its event type and payload are in "
                         "the vocabulary of the run's era, not this session's")
            out += code.encode() + value.encode("utf-8", "surrogateescape") + b"\x00"
        return messages.message(b"E", bytes(out) + b"\x00")

    def _server_error(self, body: bytes) -> None:
        sqlstate = messages.parse_error_fields(body).get("C", "")
        self.server_errors[sqlstate] += 1
        if sqlstate in BY_SQLSTATE and self.on_refusal is not None:
            self.on_refusal(sqlstate, "")

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
        # a statement setting a client_encoding the seat cannot parse in has its own code (readpath/encoding.py)
        code = CODES[encoding.ERROR_CODE if refusal.kind == encoding.ERROR_CODE else "statement_untranslatable"]
        if not self.refusals:
            self.refusals = []
        self.refusals.append(refusal.kind)
        if self.on_refusal is not None:
            self.on_refusal(code.sqlstate, refusal.kind)
        envelope = {"error": code.code, "message": refusal.detail, "details": {"kind": refusal.kind}}
        return messages.error_response(code.sqlstate, f"{code.code}: {refusal.detail}",
                                       detail=orjson.dumps(envelope).decode(),
                                       hint="the statement was not run; see docs/refusals-and-errors.md"
                                            "#statements-the-seat-refuses in the openwop-seat repository")


@dataclass(frozen=True)
class _Refusal:
    kind: str
    detail: str


_FUNCTION_CALL_REFUSAL = _Refusal(
    "function call", "the FunctionCall message names a function by OID, which the seat cannot see into; it is "
                     "refused in a translated session (call the function in a statement instead)")


def _error_field_list(body: bytes) -> list[tuple[str, str]]:
    """An ErrorResponse's fields in order, as (code, value)."""
    out = []
    for part in body.split(b"\x00"):
        if part:
            out.append((chr(part[0]), part[1:].decode("utf-8", "surrogateescape")))
    return out


def _query(text: str) -> bytes:
    """A Query of text the read path decoded (bytes that are not UTF-8 go back as they came)."""
    return messages.message(b"Q", text.encode("utf-8", "surrogateescape") + b"\x00")


def _forgets_prepared(sql: str) -> bool:
    """DISCARD ALL/PLANS and DEALLOCATE drop server-side statements, the seat's included (a cheap test: a
    false positive only costs a re-prepare)."""
    low = sql.lower()
    return "deallocate" in low or "discard" in low
