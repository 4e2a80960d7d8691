"""The relay of one session, sans-IO: bytes from the client and from the server in, bytes to send out.

:class:`Relay` is the whole protocol side of a session once its startup packet is read: the framing of
both directions (one :class:`~proxy.wire.framer.Framer` each), the session state, the read path of a
translated session, the editing of the server's authentication offer, and the claim of the session's
major (ADR 0006). It never sees a socket or a timer: :class:`~proxy.serve.session.Session` feeds it
what it reads and writes what it gets back, as h11's ``Connection`` is driven by its caller.

Theory of operation.

* ``from_client(chunk) -> bytes``: what to send to the server.
* ``from_server(chunk) -> (to_client, to_server)``: what to send to each side; ``to_server`` holds the
  seat's own claim messages and, once the claim is done, what the client sent meanwhile.
* After either call, :attr:`Relay.ending` is set when the session must end (a protocol violation, a
  failed claim, a result the read path refuses, a client that says too much before its session is
  ready): the caller sends the FATAL it names, where :attr:`server_at_boundary` allows one, and closes.
* :attr:`Relay.claiming` is true while the seat's own claim is in flight: the caller stops reading the
  client then (its kernel buffer holds what it sends), and starts again when it turns false.

Rule 1: every chunk is framed once per direction, before any of it is forwarded (ADR 0004), so a
protocol violation stops the stream exactly at the first bad message. Rule 2: until the claim is done,
nothing but authentication messages from the client reaches the server, so nothing it sends can run
before the claim or be taken for the claim's answer.
"""

from __future__ import annotations

import functools
import struct
from time import perf_counter
from typing import Callable, NamedTuple

from proxy import fifo
from proxy.db.claims import claim_once_params, claim_proof
from proxy.db.layout import (
    CHALLENGE_SQL,
    CLAIM_ONCE_ONLY_SQL,
    CLAIM_ONCE_PARAM_OIDS,
    CLAIM_ONCE_SQL,
    CLAIM_PARAM_OIDS,
    CLAIM_SQL,
)
from proxy.errors import BY_SQLSTATE, CODES
from proxy.readpath import encoding, fast_page
from proxy.readpath.read_path import ANALYSE_OFF_LOOP, JOIN_PARTS, QUIET_RUN, SERVER_QUIET_RUN, ReadPath, ReadPathError
from proxy.stats import Stats
from proxy.wire import messages
from proxy.wire.codec import FRONTEND_TYPES, ProtocolViolation
from proxy.wire.framer import COPY, HOLD, HOLD_ALL, REFUSE, SPAN, Framer, verbs
from proxy.wire.state import BACKEND_CAPTURE, FRONTEND_CAPTURE, Phase, SessionState
from proxy.wire.types import (
    AUTHENTICATION,
    BACKEND_KEY_DATA,
    DATA_ROW,
    ERROR_RESPONSE,
    FUNCTION_CALL,
    PARAMETER_STATUS,
    PASSWORD_MESSAGE,
    QUERY,
    READY_FOR_QUERY,
    SYNC,
    TERMINATE,
)

# Client messages that are each answered by exactly one ReadyForQuery (Query, Sync, FunctionCall):
# counted when client_idle_timeout is on, to tell a session waiting for a result from an idle one.
ANSWERED_FRONTEND = frozenset(b"QSF")
# Without a read path, Query, Sync and FunctionCall are copied to count and time statements (metrics).
RAW_COUNTED = frozenset(b"QSF")
# With a read path, the client messages it rewrites or accounts for are held; Terminate is copied.
READ_FRONTEND = frozenset(b"QPBDECSF")
# The server's messages a read path needs while its FIFO is in use…
READ_BACKEND_SEEN = BACKEND_CAPTURE | frozenset(b"123CsInT")
# …and while it is quiet: the session state's, and RowDescription for the leak check.
QUIET_BACKEND_SEEN = BACKEND_CAPTURE | frozenset(b"T")
# ErrorResponses of a translated session are always held: a DETAIL may print a row as stored.
ERROR_HELD = frozenset(b"E")

SLICE = 32 * 1024  # a read path frames a chunk this many bytes at a time (Relay._sliced)
# The server's chunks while the read path is quiet: only a few message kinds are shown (one object each), the rest
# goes on as spans, and a chunk that holds none comes back as itself. A page's answer (a 100-row page is about
# 40 KB) is framed whole, with no copy; a flood of small shown messages (ReadyForQuery answers to pipelined
# Syncs) still makes at most QUIET_SLICE / 6 objects at once (about 1 MB).
QUIET_SLICE = 64 * 1024
_CLAIM_SQL = CLAIM_SQL.encode()
_CHALLENGE_SQL = CHALLENGE_SQL.encode()
_CLAIM_ONCE_SQL = CLAIM_ONCE_SQL.encode()
_CLAIM_ONCE_ONLY_SQL = CLAIM_ONCE_ONLY_SQL.encode()
_READY_TAIL = b"Z\x00\x00\x00\x05"


class Ending(NamedTuple):
    """Why the session must end: the FATAL to send the client, and a label for the logs and metrics."""

    sqlstate: str
    message: str
    reason: str | None = None  # the session's end reason, when not "<sqlstate> <message>"
    kind: str = ""  # "client_violation", "server_violation", "claim_failed", "result_untranslatable", ...


class Claim(NamedTuple):
    """A session to be claimed (ADR 0006): the secret's proof is made here, the secret never sent."""

    secret: str
    major: int  # 2 for a v2 host, 1 for a v1 host, 0 for a raw session on the host database
    buffer_limit: int  # proxy.claim_buffer_limit: bytes held from the client until the claim is done
    # the claim_secret's salt, as an earlier challenge returned it: with it the claim takes one round trip (ADR 0013)
    salt: str | None = None
    # whether the session's role owns openwop_seat, as an earlier claim of the role found (None: ask the database)
    owns: bool | None = None


class Identity(NamedTuple):
    """What chose a session's major, to be checked again when the server reports that it changed.

    ``[[proxy.clients]]`` rules may key on application_name, which a client can change at any time with SET
    (pgjdbc sends it that way, and so does a pooler in front of the seat for each client it serves). The major
    a session was given at startup cannot change under it: its claim is recorded in the database, and its
    statements were planned for it. So when the server's ParameterStatus reports an identity that selects
    another major, the session ends before anything after that report reaches the client.
    """

    params: dict[str, str]  # the startup parameters the major was chosen by
    major: int | str
    major_for: Callable[[dict[str, str]], int | str]


# The ParameterStatus names that carry an identity a client rule may key on, and the rule's key for each.
IDENTITY_PARAMETERS = {"application_name": "application_name", "session_authorization": "user"}


@functools.lru_cache(maxsize=None)  # 16 kinds of session at most
def _tables(read_path: bool, count_answered: bool, pooled: bool, hold_status: bool) -> tuple[bytes, ...]:
    """A relay's verb tables, by what kind of session it is: the client's, then the server's raw, quiet and busy
    ones (made once per kind, not per session: a pooled connect builds a relay each time)."""
    copied = FRONTEND_CAPTURE | (ANSWERED_FRONTEND if count_answered else frozenset())
    kept = frozenset(b"X") if pooled else frozenset()  # a pooled session's Terminate: held, never relayed
    if read_path:
        client = verbs(REFUSE, forward=FRONTEND_TYPES, copy=copied, hold=READ_FRONTEND | kept)
    else:
        client = verbs(REFUSE, forward=FRONTEND_TYPES, copy=copied | RAW_COUNTED, hold=kept)
    held = frozenset(b"S") if hold_status else frozenset()
    raw_copied = BACKEND_CAPTURE | (frozenset(b"ZE") if not read_path else frozenset())
    return (client, verbs(copy=raw_copied, hold=held), verbs(copy=QUIET_BACKEND_SEEN, hold=ERROR_HELD | held),
            verbs(copy=READ_BACKEND_SEEN, hold=ERROR_HELD | held))


def _no_refusal_log(sqlstate: str, kind: str) -> None:
    pass


class Relay:
    """One session's protocol side; see the module docstring."""

    # slots: a seat holds one relay per connection, idle ones included (make bench's idle_memory)
    __slots__ = ("_backlog", "_busy_table", "_claim", "_claim_error", "_claim_first", "_claim_phase", "_claim_pid",
                 "_client_table", "_count_answered", "_deferred", "_fast", "_fast_cool", "_fast_misses", "_held_bytes",
                 "_held_ready", "_owns_schema", "_pre_ready", "_quiet_table", "_raw_sent", "_raw_table", "_whole",
                 "analysis", "awaiting_ready",
                 "claim_path", "owns_seen", "pooler_seen", "salt_seen", "key_data", "pooled",
                 "bytes_in", "bytes_out", "claiming", "client_framer", "client_tls", "ending", "identity",
                 "on_refusal", "privileged", "queries_sent", "raw_extended", "raw_simple", "reader", "readies",
                 "server_framer", "state", "stats", "transactions")

    def __init__(self, stats: Stats, *, reader: ReadPath | None = None, claim: Claim | None = None,
                 client_tls: bool = False, count_answered: bool = False, identity: Identity | None = None,
                 on_refusal: Callable[[str, str], None] | None = None, pooled: bool = False,
                 key_data: Callable[[bytes], bytes] | None = None):
        self.stats = stats
        # A pooled session (ADR 0016): the client's Terminate is not relayed (its backend outlives it), and the
        # server's BackendKeyData is replaced by the seat's (key_data: the server's body -> the client's).
        self.pooled = pooled
        self.key_data = key_data
        self.reader = reader
        self.state = SessionState()
        self.client_tls = client_tls
        self.on_refusal = on_refusal or _no_refusal_log
        self.ending: Ending | None = None
        self.privileged = ""  # set when the claim finds a role that can bypass the guard: why
        self.bytes_in = 0  # client -> server
        self.bytes_out = 0  # server -> client
        self.raw_simple = self.raw_extended = 0  # statements of a session without a read path (metrics)
        self.queries_sent = 0  # ANSWERED_FRONTEND messages relayed (counted only with count_answered)
        self.readies = 0  # ReadyForQuery messages seen, the one that ends authentication included
        self.transactions = 0  # transaction blocks ended: a ReadyForQuery back to idle from 'T' or 'E' (metrics)
        # when each Query/Sync/FunctionCall went upstream, oldest first: a proxy.fifo queue (a list while short: a
        # deque is 760 bytes, idle or not)
        self._raw_sent: list[float] | tuple = [] if reader is None else ()  # never used with a read path
        if reader is not None:
            reader.attach(stats, on_refusal)
        # With an identity to follow, or a read path (whose client_encoding is checked), ParameterStatus is held:
        # nothing after a change that ends the session may go out.
        self._client_table, self._raw_table, self._quiet_table, self._busy_table = _tables(
            reader is not None, count_answered, pooled, identity is not None or reader is not None)
        self._count_answered = count_answered
        self.client_framer = Framer(self._client_table)
        # The server's stream: whole messages while authenticating and claiming (the offer may be edited and
        # the claim's answer is read here), then forwarded with the few kinds the session needs copied.
        self.server_framer = Framer(HOLD_ALL)
        self._whole = True  # authenticating or claiming: the server's messages are read whole
        self.identity = identity
        # the claim
        self._claim = claim
        self.awaiting_ready = claim is not None  # the client's messages are held until the claim is done
        self.claiming = False  # the seat's own claim statement is in flight
        self._claim_phase = 0  # 1: the challenge is asked for; 2: the proof is sent; 3: the one-round-trip claim
        self.claim_path = ""  # how the claim was made: "once", "challenge", or "challenge after <why once failed>"
        self.salt_seen: str | None = None  # the salt a challenge returned (the session keeps it for the next claims)
        self.owns_seen: bool | None = None  # whether the role owns openwop_seat, when this claim asked the database
        self.pooler_seen = False  # the backend's pid is not the one BackendKeyData named: a pooler behind the seat
        self._claim_error: dict[str, str] | None = None
        self._claim_first: str | None = None
        self._claim_pid: bytes | None = None  # the backend's pid, as the challenge saw it
        self._owns_schema = False
        self._held_ready = b""  # the server's first ReadyForQuery (and its chunk), held until the claim is done
        self._held_bytes = 0  # bytes held from the client until its claim is done
        # …of which an incomplete message, and the whole ones (a bytearray and a list once something is held: an idle
        # session keeps none)
        self._pre_ready: bytes | bytearray = b""
        self._backlog: list[bytes] | tuple = ()
        # A statement to parse off the event loop (its text), and the client's framed messages from it on.
        self.analysis: str | None = None
        self._deferred: list | tuple = ()
        # A fast page whose answer is not settled (ADR 0024, proxy/readpath/fast_page.py): the client waits meanwhile
        self._fast: fast_page.Pending | None = None
        # Pages that went as the page statement in a row (a run that missed, or missed before), and the groups left
        # to send as they are without looking (after COOL_AFTER such pages: a session reading era-2 runs)
        self._fast_misses = self._fast_cool = 0

    def adopt(self, server_params: dict[str, str], pid: int | None, key: bytes | None) -> None:
        """A pooled backend handed to this session (ADR 0016): authenticated, claimed and reset already. The session
        starts READY, as if its login's ReadyForQuery had just been relayed."""
        state = self.state
        state.phase = Phase.READY
        state.auth_ok = True
        state.server_params = dict(server_params)
        state.share_params()
        state.backend_pid, state.backend_key = pid, key
        self.awaiting_ready = False
        self.readies = 1
        self._whole = False
        self.server_framer.table = self._raw_table if self.reader is None else self._quiet_table

    # ------------------------------------------------------------------ boundaries

    @property
    def client_at_boundary(self) -> bool:
        return self.client_framer.at_boundary and not self._pre_ready

    @property
    def server_at_boundary(self) -> bool:
        return self.server_framer.at_boundary and self._fast is None

    @property
    def fast_held(self) -> int:
        """Bytes the client sent while a fast page's answer is not settled (relayed once it is)."""
        return 0 if self._fast is None else self._fast.client_bytes

    @property
    def owed(self) -> int:
        """How many answers the server owes that the seat keeps bookkeeping for: ReadyForQuery messages (one per
        Query, Sync, FunctionCall relayed), and with a read path the entries of its FIFO and open group."""
        owed = self.queries_sent - self.readies + 1  # the ReadyForQuery that ends authentication is not owed
        reader = self.reader
        if reader is not None:
            entries = len(reader.pending) + len(reader.quiet_group)
            if entries > owed:
                return entries
        return owed

    # ------------------------------------------------------------------ client -> server

    def from_client(self, data: bytes) -> bytes:
        if self.ending is not None:
            return b""
        if self._fast is not None:  # a fast page's answer is not settled: the page statement may go before this
            self._fast.hold(data)
            return b""
        if self.awaiting_ready:
            return self._before_ready(data)
        if self._deferred:  # a statement is being analysed: what follows it waits, in order
            self.bytes_in += len(data)
            self._deferred += self.client_framer.feed(data)
            return b""
        if len(data) > SLICE and self.reader is not None:
            return self._sliced(self.from_client, data)
        self.bytes_in += len(data)
        framer = self.client_framer
        whole = framer.at_boundary  # the chunk starts a message: it may go on as itself
        items = framer.feed(data)
        if self.reader is None:
            out = self._client_raw(items, data)
        else:
            out = self._client_read(items, data if whole and framer.at_boundary and framer.violation is None else None)
        if self.client_framer.violation is not None and not self._deferred:
            self._client_violation(self.client_framer.violation)
        elif self.reader is not None and self.reader.fast_twins and not self._deferred and self.ending is None:
            if not self._fast_cool:
                return self._fast_page(out)
            self._fast_cool -= 1
        return out

    def _fast_page(self, out: bytes) -> bytes:
        """The group as a fast page, where it is one page alone and its answer starts the server's stream (nothing
        else owed); else as it was (ADR 0024)."""
        reader = self.reader
        if reader.tx_status == b"E" or len(reader.quiet_sent) != 1 or reader.pending or reader.quiet_group or \
                not self.server_framer.at_boundary or self._whole:
            return out
        found = fast_page.match(out, reader.fast_twins)
        if found is None:
            return out
        if fast_page.missed(found[3]):
            self._not_fast()
            return out
        closes = reader.twins_closing
        if closes:
            reader.twins_closing = ()
        pending = self._fast = fast_page.Pending(out, found[3], found[2], closes)
        return pending.group(found[0], found[1])

    def _not_fast(self) -> None:
        """A page went as the page statement: after COOL_AFTER in a row, the next COOL_GROUPS groups go as they are
        without being looked at (what the twin would cost a session that reads era-2 runs)."""
        self._fast_misses += 1
        if self._fast_misses >= fast_page.COOL_AFTER:
            self._fast_misses = 0
            self._fast_cool = fast_page.COOL_GROUPS

    def _fast_answer(self, data: bytes) -> tuple[bytes, bytes]:
        """The server's bytes while a fast page's answer is not settled: held until a row, an error or its
        ReadyForQuery settles it, then relayed (rows, error) or dropped and the page statement sent (empty)."""
        fast = self._fast
        if fast.server:
            fast.server += data
            data = bytes(fast.server)
        outcome = fast_page.scan(data, fast.lead)
        kind = outcome[0]
        if kind == "more":
            if not fast.server:
                fast.server += data
            return b"", b""
        self._fast = None
        self.stats.fast_pages[kind] += 1
        twin = fast.twin
        if kind == "rows" or kind == "error":
            kept, start = outcome[1], outcome[2]
            if fast.injected and not outcome[3]:  # its ParseComplete came
                twin[0] = fast_page.PREPARED
            if kind == "rows":
                fast_page.forget_miss(fast.key)
                self._fast_misses = 0
            to_client, to_server = self.from_server(kept + data[start:] if start else data)
        else:
            if kind == "empty":
                if fast.injected:
                    twin[0] = fast_page.PREPARED
                fast_page.remember_miss(fast.key)
                self._not_fast()
            else:
                twin[0] = fast_page.BROKEN  # its Parse failed: this session's pages go as the page statement
            kept = outcome[1] + outcome[2]
            to_client, to_server = self.from_server(kept) if kept else (b"", b"")
            to_server = fast.fallback + to_server
        if fast.client and self.ending is None:
            to_server += self.from_client(b"".join(fast.client))
        return to_client, to_server

    def analysed(self) -> bytes:
        """The statement :attr:`analysis` named has its plan (``Classifier.analysed``): the client's messages from
        it on are relayed now, up to the next one to analyse, if any. Returns what to send to the server."""
        items, self._deferred = self._deferred, ()
        self.analysis = None
        if self.ending is not None:
            return b""
        out = self._client_read(items)
        if self.client_framer.violation is not None and not self._deferred and self.ending is None:
            self._client_violation(self.client_framer.violation)
        return out

    def _sliced(self, feed, data: bytes) -> bytes:
        """A read path makes one Python object per message it reads: a chunk of small messages (a socket read is up to
        256 KiB, some 50,000 pipelined Syncs) is framed a slice at a time, so that only one slice's objects are alive
        at once. What comes out is the same, in one write; an ending stops it at the message that caused it."""
        out = []
        for i in range(0, len(data), SLICE):  # SLICE steps in every mode: a quiet chunk over QUIET_SLICE too
            part = feed(data[i:i + SLICE])
            out.append(part[0] if isinstance(part, tuple) else part)
            if self.ending is not None:
                break
        return b"".join(out)

    def _client_raw(self, items: list, data: bytes) -> bytes:
        """No read path: the chunk goes on as it arrived; the copied messages are counted."""
        if len(items) == 1 and items[0][0] == SPAN:  # nothing copied: the chunk itself
            return items[0][1]
        now = None
        for item in items:
            if item[0] != COPY:
                if item[0] == HOLD:  # a pooled session's Terminate: the session ends, its backend stays
                    self.state.on_frontend(item[1], item[2])
                continue
            t = item[1]
            if t == TERMINATE:
                self.state.on_frontend(t, item[2])
                continue
            if self._count_answered:
                self.queries_sent += 1
            if t == QUERY:
                self.raw_simple += 1
            elif t == SYNC:
                self.raw_extended += 1
            elif t != FUNCTION_CALL:
                continue
            raw_sent = self._raw_sent
            raw_sent.append(now if now is not None else (now := perf_counter()))
            if len(raw_sent) > fifo.LONG:
                self._raw_sent = fifo.grown(raw_sent)
        spans = [item[1] for item in items if item[0] == SPAN]
        return spans[0] if len(spans) == 1 else b"".join(spans)

    def _client_read(self, items: list, chunk: bytes | None = None) -> bytes:
        """A read path: each held message is rewritten by it (or goes on as it was). ``chunk``: the chunk the items
        were framed from, when it holds whole messages only; if the read path replaces none of them it goes on as
        itself (no message re-encoded, no join: ADR 0004's one pass, issue 27). Where it is built, QUIET_RUN does
        the quiet Binds, Describes, Executes and Syncs (and the spans between them) in C, and hands back at the
        first message it leaves to on_client."""
        reader = self.reader
        out: list = []  # bytes to send, and held items that go on as they were
        replaced = stopped = False
        quiet_run = QUIET_RUN
        n, count = 0, len(items)
        while n < count:
            if quiet_run is not None:
                n, fast_replaced, answered = quiet_run(reader, items, n, out, self._count_answered)
                if fast_replaced:
                    replaced = True
                if answered:
                    self.queries_sent += answered
                if n == count:
                    break
            item = items[n]
            n += 1
            kind = item[0]
            if kind == SPAN:
                out.append(item[1])
                continue
            t, body = item[1], item[2]
            if kind == COPY or t == TERMINATE:  # Terminate (held in a pooled session: not relayed)
                self.state.on_frontend(t, body)
                if kind != COPY:
                    replaced = True  # a held Terminate is dropped: the chunk cannot go on as itself
                continue
            if len(body) >= ANALYSE_OFF_LOOP and self.analysis is None:
                sql = reader.analysis_needed(t, body)
                if sql is not None:  # parsed off the event loop first: it and what follows wait (analysed())
                    self.analysis = sql
                    self._deferred = items[n - 1:]
                    stopped = True
                    break
            if self._count_answered and (t == QUERY or t == SYNC or t == FUNCTION_CALL):
                self.queries_sent += 1
            try:
                replacement = reader.on_client(t, body)
            except ProtocolViolation as e:
                # the messages before it are forwarded, as PostgreSQL processes them before failing
                self._client_violation(e)
                stopped = True
                break
            if replacement is None:
                out.append(item)  # as it was: encoded below, unless the whole chunk goes on
            else:
                replaced = True
                out.append(replacement)
        if not stopped and chunk is not None and not replaced:
            return chunk
        if JOIN_PARTS is not None:
            return JOIN_PARTS(out)
        out = [part if part.__class__ is bytes else messages.message(bytes([part[1]]), part[2]) for part in out]
        return out[0] if len(out) == 1 else b"".join(out)

    @property
    def deferred(self) -> bool:
        """Client messages wait for a statement's analysis (:attr:`analysis`), or a fast page's answer."""
        return bool(self._deferred) or self._fast is not None

    def _client_violation(self, e: ProtocolViolation) -> None:
        self.stats.protocol_violations += 1
        self.ending = Ending(e.sqlstate, e.message, kind="client_violation")

    def _before_ready(self, data: bytes) -> bytes:
        """The client's bytes from its startup packet until the claim is done: while the server authenticates,
        authentication messages ('p') go through; every other message is held, at most
        ``proxy.claim_buffer_limit`` bytes, and relayed once the claim is done."""
        limit = self._claim.buffer_limit
        self._held_bytes += len(data)
        if self._held_bytes > limit:
            self.ending = Ending("54000", f"the client sent more than {limit} bytes before its session was ready "
                                          f"(proxy.claim_buffer_limit)", "claim buffer full", "claim_buffer_full")
            return b""
        out = bytearray()
        pending = self._pre_ready
        if not pending:
            pending = self._pre_ready = bytearray()
        pending += data
        while len(pending) >= 5:
            (length,) = struct.unpack_from("!i", pending, 1)
            if length < 4 or len(pending) < 1 + length:
                break  # incomplete (a bad length is the framer's to report, once the held bytes reach it)
            message = bytes(pending[:1 + length])
            if (message[0] == PASSWORD_MESSAGE and not self._backlog and not self.claiming
                    and self.state.phase is Phase.AUTHENTICATING):
                out += message  # a password or SASL message: authentication needs it now
                self.bytes_in += len(message)
                self._held_bytes -= len(message)
            elif self._backlog:
                self._backlog.append(message)
            else:
                self._backlog = [message]
            del pending[:1 + length]
        return bytes(out)

    # ------------------------------------------------------------------ server -> client

    def from_server(self, data: bytes) -> tuple[bytes, bytes]:
        if self.ending is not None:
            return b"", b""
        if self._fast is not None:
            return self._fast_answer(data)
        reader = self.reader
        if reader is not None and not self._whole and \
                len(data) > (QUIET_SLICE if reader.active == 0 and reader.quiet else SLICE):
            return self._sliced(self.from_server, data), b""
        self.bytes_out += len(data)
        if self._whole:
            result = self._server_whole(self.server_framer.feed(data))
        elif self.reader is None:
            result = self._server_raw(self.server_framer.feed(data)), b""
        else:
            result = self._server_read(data), b""
        violation = self.server_framer.violation
        if violation is not None and self.ending is None:
            self.ending = Ending("08P01", f"upstream sent an invalid message: {violation.message}",
                                 kind="server_violation")
        return result

    def _seen(self, t: int, body: bytes) -> None:
        """A server message the session state needs (BACKEND_CAPTURE)."""
        if t == READY_FOR_QUERY:
            self.readies += 1
            if self.state.txn_status != b"I" and body[:1] == b"I":  # rarely true: one comparison per statement
                self.transactions += 1
        self.state.on_backend(t, body)
        if t == PARAMETER_STATUS and self.ending is None:
            if self.reader is not None:
                self._check_encoding(body)
            if self.identity is not None and self.ending is None:
                self._check_identity(body)

    def _check_encoding(self, body: bytes) -> None:
        """PostgreSQL reports the session's client_encoding (at login and whenever it changes, however it was
        changed): a translated session in an encoding the seat does not parse as PostgreSQL does ends here."""
        name, value = messages.parse_parameter_status(body)
        if name != "client_encoding":
            return
        why = encoding.refusal(value)
        if why is not None:
            code = CODES[encoding.ERROR_CODE]
            self.ending = Ending(code.sqlstate, f"{code.code}: the server reports {why}",
                                 f"client_encoding {value}", encoding.ERROR_CODE)

    def _check_identity(self, body: bytes) -> None:
        name, value = messages.parse_parameter_status(body)
        key = IDENTITY_PARAMETERS.get(name)
        if key is None:
            return
        identity = self.identity
        if identity.params.get(key, "" if key == "application_name" else None) == value:
            return
        now = {**identity.params, key: value}
        major = identity.major_for(now)
        if major == identity.major:
            return
        self.ending = Ending(
            "0A000", f"this session's {key} is now {value!r}, which selects major {major}, but the session was "
                     f"given major {identity.major} at startup; a session's major cannot change (its claim and its "
                     f"plans are for the first), so the session ends: connect again with the {key} in the startup "
                     f"packet, or key [[proxy.clients]] on user or database (see docs/configuration.md)",
            f"{key} changed to one of major {major}", "identity_changed")

    def _server_raw(self, items: list) -> bytes:
        if len(items) == 1 and items[0][0] == SPAN:  # nothing to look at: the chunk itself
            return items[0][1]
        out: list[bytes] = []
        for item in items:
            kind = item[0]
            if kind == SPAN:
                out.append(item[1])
                continue
            t, body = item[1], item[2]
            if t in BACKEND_CAPTURE:
                self._seen(t, body)
            if kind == HOLD:  # a ParameterStatus, with an identity to follow
                if self.ending is not None:
                    break
                out.append(messages.message(bytes([t]), body))
            elif t == READY_FOR_QUERY:
                if self._raw_sent:
                    self.stats.statement_seconds.observe(perf_counter() - fifo.popleft(self._raw_sent))
            elif t == ERROR_RESPONSE:
                sqlstate = messages.parse_error_fields(body).get("C", "")
                self.stats.server_errors[sqlstate] += 1
                if sqlstate in BY_SQLSTATE:
                    self.on_refusal(sqlstate, "")
        return out[0] if len(out) == 1 else b"".join(out)

    def _server_read(self, data: bytes) -> bytes:
        """A read path, after authentication: one pass frames the chunk. While the read path is quiet nothing is
        held but errors and only a few message kinds are looked at; while its FIFO is in use, every message is
        accounted for and, when a result is being translated, held to be rewritten."""
        reader = self.reader
        quiet = reader.quiet
        framer = self.server_framer
        framer.table = HOLD_ALL if reader.active > 0 else self._quiet_table if quiet else self._busy_table
        items = framer.feed(data)
        out: list[bytes] = []
        # Where it is built, SERVER_QUIET_RUN does the quiet spans, RowDescriptions and ReadyForQuerys in C and
        # hands back at the first message it leaves to the loop below (an error, a ParameterStatus, a possible leak).
        server_run = SERVER_QUIET_RUN if quiet else None
        n, count = 0, len(items)
        try:
            while n < count:
                if server_run is not None:
                    n = server_run(self, reader, items, n, out)
                    if n == count:
                        break
                item = items[n]
                n += 1
                kind = item[0]
                if kind == SPAN:
                    out.append(item[1])
                    continue
                t, body = item[1], item[2]
                if t in BACKEND_CAPTURE:
                    self._seen(t, body)
                    if self.ending is not None:  # the identity changed: nothing from here on goes out
                        break
                if kind == HOLD:
                    replacement = reader.on_server_quiet(t, body) if quiet else reader.on_server(t, body)
                    out.append(messages.message(bytes([t]), body) if replacement is None else replacement)
                elif quiet:
                    reader.on_server_quiet(t, body)
                else:
                    reader.on_server(t, body)
        except ReadPathError as e:
            self.ending = Ending("OW007", f"result_untranslatable: {e}", "read path refused a result",
                                 "result_untranslatable")
        # one write per received chunk, however many messages were rewritten in it
        return out[0] if len(out) == 1 else b"".join(out)

    def _server_whole(self, items: list) -> tuple[bytes, bytes]:
        """Authentication and the claim: whole messages. The offer of channel binding is removed for a
        plaintext client; the first ReadyForQuery of a session to be claimed is held, and the claim begins."""
        to_client: list[bytes] = []
        to_server = b""
        for n, item in enumerate(items):
            t, body = item[1], item[2]
            if self.claiming:
                done = self._claim_answer(t, body)
                if done is None:
                    continue
                to_server += done
                if self.claiming:
                    continue
                # the claim is done (or failed): what follows goes on as received
                if self.ending is None:
                    to_client.append(self._held_ready)
                    self._held_ready = b""
                    to_client += [messages.message(bytes([i[1]]), i[2]) for i in items[n + 1:]]
                    to_server += self._release_backlog()
                break
            if self.state.phase is not Phase.AUTHENTICATING:  # after the first ReadyForQuery, unclaimed
                if t in BACKEND_CAPTURE:
                    self._seen(t, body)
                    if self.ending is not None:
                        break
                to_client.append(messages.message(bytes([t]), body))
                continue
            if t in BACKEND_CAPTURE:
                self._seen(t, body)
                if self.ending is not None:  # an identity of another major, reported at login
                    break
            if t == AUTHENTICATION and not self.client_tls:
                plain = messages.without_channel_binding(body)
                if plain is not None:
                    body = plain
            elif t == BACKEND_KEY_DATA and self.key_data is not None:
                body = self.key_data(body)  # the seat's cancel key: the backend's own never reaches a client
            encoded = messages.message(bytes([t]), body)
            if t == READY_FOR_QUERY and self._claim is not None:
                # Authenticated: before the client may speak, record who it is in the database. What the server
                # sent in this chunk goes out with its ReadyForQuery once the claim is done: one write, not two.
                self._held_ready = b"".join([*to_client, encoded,
                                             *(messages.message(bytes([i[1]]), i[2]) for i in items[n + 1:])])
                to_client = []
                to_server = self._send_claim()
                break
            to_client.append(encoded)
        if not self.claiming and self.state.phase is not Phase.AUTHENTICATING:
            # from here on the server's stream is forwarded as it arrives, but for what the session reads
            self._whole = False
            self.server_framer.table = self._raw_table if self.reader is None else self._quiet_table
        return b"".join(to_client), to_server

    # ------------------------------------------------------------------ the claim (ADR 0006)

    def _send_claim(self) -> bytes:
        """The claim in one round trip when the salt is known (ADR 0013), else the challenge (ADR 0006)."""
        claim, pid = self._claim, self.state.backend_pid
        if claim.salt is None or pid is None:
            self.claim_path = "challenge"
            return self._send_challenge()
        self.claiming = True
        self._claim_phase = 3
        self.claim_path = "once"
        values = [str(v).encode() for v in claim_once_params(claim.secret, claim.salt, pid, claim.major)]
        params = b"".join(struct.pack("!i", len(v)) + v for v in values)
        oids = struct.pack("!h", len(CLAIM_ONCE_PARAM_OIDS)) + b"".join(struct.pack("!I", o)
                                                                       for o in CLAIM_ONCE_PARAM_OIDS)
        self._owns_schema = bool(claim.owns)
        sql = _CLAIM_ONCE_SQL if claim.owns is None else _CLAIM_ONCE_ONLY_SQL
        return (messages.message(b"P", b"\x00" + sql + b"\x00" + oids)
                + messages.message(b"B", b"\x00\x00\x00\x00" + struct.pack("!h", len(values)) + params + b"\x00\x00")
                + messages.message(b"E", b"\x00\x00\x00\x00\x00")
                + messages.message(b"S"))

    def _send_challenge(self) -> bytes:
        """Ask the backend for a challenge; the answer's proof is sent by :meth:`_claim_answer`."""
        self.claiming = True
        self._claim_phase = 1
        return (messages.message(b"P", b"\x00" + _CHALLENGE_SQL + b"\x00\x00\x00")
                + messages.message(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x00")
                + messages.message(b"E", b"\x00\x00\x00\x00\x00")
                + messages.message(b"S"))

    def _send_proof(self, challenge: str) -> bytes:
        """The second half of the claim: the proof for this backend's challenge, never the secret."""
        claim = self._claim
        proof = claim_proof(claim.secret, challenge, claim.major).encode()
        major_text = str(claim.major).encode()
        params = struct.pack("!i", len(proof)) + proof + struct.pack("!i", len(major_text)) + major_text
        oids = struct.pack("!h", len(CLAIM_PARAM_OIDS)) + b"".join(struct.pack("!I", o) for o in CLAIM_PARAM_OIDS)
        self._claim_phase = 2
        return (messages.message(b"P", b"\x00" + _CLAIM_SQL + b"\x00" + oids)
                + messages.message(b"B", b"\x00\x00\x00\x00\x00\x02" + params + b"\x00\x00")
                + messages.message(b"E", b"\x00\x00\x00\x00\x00")
                + messages.message(b"S"))

    def _claim_answer(self, t: int, body: bytes) -> bytes | None:
        """One message of the claim's answer. None until its ReadyForQuery; then the next claim message to send
        (b"" when the claim is over, :attr:`claiming` false and :attr:`ending` set if it failed)."""
        if t == DATA_ROW:  # 1: (salt:challenge, backend pid); 2: (claim, owns openwop_seat); 3: (verdict, owns)
            values = messages.parse_data_row(body)
            first = values[0] if values else None
            self._claim_first = first.decode("utf-8", "replace") if first is not None else None
            if self._claim_phase == 1:
                self._claim_pid = values[1] if len(values) > 1 else None
            else:
                if len(values) > 1:
                    self._owns_schema = self.owns_seen = values[1] == b"t"
        elif t == ERROR_RESPONSE:
            self._claim_error = messages.parse_error_fields(body)
        if t != READY_FOR_QUERY:
            return None
        error, first = self._claim_error, self._claim_first
        self._claim_error = self._claim_first = None
        if self._claim_phase == 3:
            if error is None and first == "ok":
                return self._claimed()
            if error is None and first is not None and first.startswith("pooler "):
                self.pooler_seen = True
                self._claim_pid = first[len("pooler "):].encode()
                if self.reader is not None or self._claim.major == 2:
                    return self._pooler_ending()
            # Not claimed, nothing recorded: the challenge says why, or claims (the seat's clock is off, a crash
            # emptied claims, the salt changed, a pooler sits behind the seat for a raw or other session).
            why = "error" if error is not None else (first or "").split(" ")[0]
            if why not in ("error", "clock", "ledger", "pooler", "replay"):
                why = "refused"  # the wrong secret (a salt learnt before migrate replaced it), no secret, …
            self.claim_path = f"challenge after {why}"
            return self._send_challenge()
        if error is None and self._claim_phase == 1:
            if first is None or ":" not in first:
                error = {"C": "XX000", "M": "openwop_seat.claim_challenge() returned no challenge"}
            elif self._behind_pooler() and (self.reader is not None or self._claim.major == 2):
                self.pooler_seen = True
                return self._pooler_ending()
            else:
                if self._behind_pooler():
                    self.pooler_seen = True
                self.salt_seen = first.partition(":")[0]
                return self._send_proof(first)
        self.claiming = False
        self.awaiting_ready = False
        if error is not None:
            self.ending = Ending(error.get("C", "XX000"),
                                 f"openwop-seat could not record this session's major: {error.get('M')}",
                                 "claim failed", "claim_failed")
            return b""
        return self._claimed()

    def _claimed(self) -> bytes:
        self.claiming = False
        self.awaiting_ready = False
        self._claim = self._claim_pid = None  # done: nothing of the claim stays with the session
        superuser = self.state.server_params.get("is_superuser") == "on"
        if superuser or self._owns_schema:
            # Such a role can disable triggers or write claims: the in-database guard cannot bind it.
            self.privileged = "superuser" if superuser else "owns openwop_seat"
        return b""

    def _pooler_ending(self) -> bytes:
        # Its backends outlive this session (and, pooling transactions, change under it): a claim would be carried
        # to other clients, and the plans prepared once per session lost. Refused before the claim is made, so
        # nothing is recorded on that backend.
        self.claiming = False
        self.ending = Ending(
            "08004", "openwop-seat is connected to PostgreSQL through a connection pooler (the backend's "
                     f"pid {self._claim_pid.decode(errors='replace') if self._claim_pid else '?'} is not "
                     f"the pid {self.state.backend_pid} the server's BackendKeyData named): translated and "
                     "v2 sessions are refused in this arrangement; put the pooler in front of the seat "
                     "(see docs/operations.md)", "pooler between the seat and PostgreSQL", "pooler_behind")
        return b""

    def _behind_pooler(self) -> bool:
        pid = self._claim_pid
        return pid is not None and self.state.backend_pid is not None and pid != str(self.state.backend_pid).encode()

    def _release_backlog(self) -> bytes:
        """What the client sent while its session was not ready, relayed now in order."""
        backlog, self._backlog = self._backlog, ()
        if self._pre_ready:  # an incomplete message: the framer frames it with what follows
            backlog = [*backlog, bytes(self._pre_ready)]
        self._pre_ready = b""
        out = [self.from_client(chunk) for chunk in backlog]
        return b"".join(out)
