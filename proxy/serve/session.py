"""One relayed session: a client connection and its own upstream connection.

The handshake (encryption requests, startup, cancel) is a coroutine; after it
both directions are plain protocol callbacks that walk each received chunk and
forward it as one write, so the hot path has no task switches and no copies.
Backpressure is the transports' own: when one side's write buffer passes the
configured limit, the seat stops reading from the other side until it drains.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import struct
import time
from collections import deque
from time import perf_counter
from typing import TYPE_CHECKING

from proxy.db.claims import claim_proof
from proxy.db.layout import CHALLENGE_SQL as schema_challenge_sql
from proxy.db.layout import CLAIM_PARAM_OIDS
from proxy.db.layout import CLAIM_SQL as schema_claim_sql
from proxy.errors import BY_SQLSTATE
from proxy.readpath.read_path import ReadPath, ReadPathError
from proxy.serve.peer import Peer, UpstreamUnavailable, open_upstream
from proxy.wire import messages
from proxy.wire.codec import (
    FRONTEND_TYPES,
    HELD,
    RAW,
    CancelRequest,
    EditFramer,
    GSSENCRequest,
    MessageWalker,
    ProtocolViolation,
    SSLRequest,
    StartupMessage,
    StreamSplitter,
    parse_initial_packet,
)
from proxy.wire.startup import StartupRefused, parse_startup
from proxy.wire.state import BACKEND_CAPTURE, FRONTEND_CAPTURE, Phase, SessionState

# Client messages that are each answered by exactly one ReadyForQuery (Query, Sync, FunctionCall):
# counted when client_idle_timeout is on, to tell a session waiting for a result from an idle one.
ANSWERED_FRONTEND = frozenset(b"QSF")

# Without a read path, Query, Sync and FunctionCall are captured to count and time statements (metrics).
RAW_COUNTED = frozenset(b"QSF")
# Why a session ended before it had an upstream connection, by the SQLSTATE it was sent (metrics).
REFUSED_REASONS = {"53300": "max_client_conn", "08006": "upstream_unavailable", "42501": "forbidden_setting",
                   "42601": "forbidden_setting", "08P01": "protocol_violation", "57P01": "shutting_down",
                   "57P03": "writer_rule_not_in_force"}

# With a read path, the client messages it rewrites or accounts for (and Terminate, for the session state)…
READ_FRONTEND = frozenset(b"QPBDECSFX")
# …the backend messages it needs for its bookkeeping while its FIFO is in use…
READ_BACKEND_SEEN = BACKEND_CAPTURE | frozenset(b"123CsInT")
# …and while it is quiet: the session state's, and RowDescription for the leak check.
QUIET_BACKEND_SEEN = BACKEND_CAPTURE | frozenset(b"T")
# ErrorResponses of a translated session are always held: a DETAIL may print a row as stored (proxy.readpath.read_path).
ERROR_HELD = frozenset(b"E")

if TYPE_CHECKING:
    from proxy.serve.context import SeatView

log = logging.getLogger("openwop_seat.session")

_session_ids = itertools.count(1)

CLAIM_SQL = schema_claim_sql.encode()
CHALLENGE_SQL = schema_challenge_sql.encode()


class Session:
    """A client connection relayed to one upstream connection for its whole life."""

    def __init__(self, server: "SeatView", client: Peer):
        self.server = server
        self.config = server.config  # the config this session started under; reloads do not touch it
        self.client = client
        self.upstream: Peer | None = None
        self.id = next(_session_ids)
        self.state = SessionState()
        self.params: dict[str, str] = {}
        self.major: int | str | None = None
        self.client_tls = False
        self.started = time.monotonic()
        self.bytes_in = 0  # client -> upstream
        self.bytes_out = 0  # upstream -> client
        self.end_reason = ""
        self.closed = False
        self.done = asyncio.get_running_loop().create_future()
        peername = client.transport.get_extra_info("peername") if client.transport else None
        self.client_addr = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else str(peername or "-")
        self._auth_pending = bytearray()
        self.client_walker = MessageWalker(capture=FRONTEND_CAPTURE, allowed=FRONTEND_TYPES)
        self.upstream_walker = MessageWalker(capture=BACKEND_CAPTURE)
        self.reader: ReadPath | None = None
        self.raw_simple = self.raw_extended = 0  # statements of a session without a read path (metrics)
        self._raw_sent: deque[float] = deque()  # …and when each Query/Sync/FunctionCall went upstream
        self._seat_client = server.stats.seat_seconds["client"]  # histograms of the seat's own time per chunk
        self._seat_upstream = server.stats.seat_seconds["upstream"]
        self._claim_secret: str | None = None  # set for major-2 sessions on the host database
        self._claiming = False  # the seat's own claim statement is in flight
        self._claim_buf = bytearray()
        self._claim_phase = 0  # 1: the challenge is asked for; 2: the proof is sent
        self._claim_held = 0  # bytes held from the client until its claim is done
        self._pre_ready = bytearray()  # …of which an incomplete message
        self._claim_timer: asyncio.TimerHandle | None = None
        self._held_ready = b""  # the server's first ReadyForQuery, held until the claim is done
        self._client_backlog: list[bytes] = []
        self._client_framer: EditFramer | None = None  # with a read path: frames the client's stream…
        self._upstream_splitter: StreamSplitter | None = None  # …and the server's, once authenticated
        self._split_upstream = False  # the server's stream goes through the splitter alone from here on
        # client_idle_timeout bookkeeping
        self._last_client = self.started  # monotonic time of the last chunk from the client
        self._ready_at = self.started  # …and of the last ReadyForQuery from the upstream
        self._queries_sent = 0  # ANSWERED_FRONTEND messages relayed (counted only with the timeout on)
        self._readies = 0  # ReadyForQuery messages seen, the one that ends authentication included
        client.on_lost = self._client_lost
        client.on_eof = self._client_eof

    # ------------------------------------------------------------------ handshake

    async def run(self) -> None:
        try:
            await asyncio.wait_for(self._handshake(), self.config.startup_timeout)
        except asyncio.TimeoutError:
            self._fail_client("08P01", "timeout waiting for the startup packet", reason="startup timeout")
        except ProtocolViolation as e:
            self._fail_client(e.sqlstate, e.message)
        except UpstreamUnavailable as e:
            self.server.stats.upstream_connect_errors += 1
            self.server.stats.upstream_refused[_upstream_reason(str(e))] += 1
            self._fail_client("08006", str(e))
        except (ConnectionError, ssl.SSLError) as e:
            self.close(f"client gone during handshake: {e}")
        except asyncio.CancelledError:
            self.close("cancelled")
            raise
        except Exception:  # a bug must end this session only, never the seat
            log.exception("session %s: unexpected error in handshake", self.id)
            self._fail_client("XX000", "internal error in openwop-seat during connection setup")

    async def _handshake(self) -> None:
        client = self.client
        loop = asyncio.get_running_loop()
        seen_ssl = seen_gss = False
        while True:
            parsed = parse_initial_packet(client.buffer)
            while parsed is None:
                await client.wait_data()
                parsed = parse_initial_packet(client.buffer)
            packet, used = parsed
            del client.buffer[:used]
            if isinstance(packet, SSLRequest):
                if seen_ssl:
                    raise ProtocolViolation("duplicate SSL request")
                seen_ssl = True
                ctx = self.server.client_ssl_context
                if ctx is None:
                    client.write(b"N")
                    continue
                client.write(b"S")
                if client.buffer:
                    # Plaintext sent after the request would be read as if it were encrypted.
                    raise ProtocolViolation("received unencrypted data after SSL request")
                client.transport = await loop.start_tls(client.transport, client, ctx, server_side=True)
                self.client_tls = True
                continue
            if isinstance(packet, GSSENCRequest):
                if seen_gss:
                    raise ProtocolViolation("duplicate GSSENC request")
                seen_gss = True
                client.write(b"N")
                continue
            if isinstance(packet, CancelRequest):
                await self._forward_cancel(packet)
                return
            assert isinstance(packet, StartupMessage)
            await self._start(packet)
            return

    async def _forward_cancel(self, packet: CancelRequest) -> None:
        self.server.stats.cancel_requests += 1
        try:
            up = await open_upstream(self.server, asyncio.get_running_loop())
        except UpstreamUnavailable as e:
            log.warning("cancel request for backend %s not forwarded: %s", packet.pid, e)
            self.close("cancel not forwarded")
            return
        self.server.stats.upstream_connections += 1
        up.write(packet.raw)
        up.close()
        self.close("cancel forwarded")

    async def _start(self, startup: StartupMessage) -> None:
        self.params = dict(startup.params)
        try:
            # As PostgreSQL reads the packet (options split with escapes, -c and --name=value, an empty database
            # meaning the user's): the allowlist of settings, and the database that decides the major and the claim.
            parsed = parse_startup(self.params)
        except StartupRefused as e:
            raise ProtocolViolation(str(e), sqlstate=e.sqlstate) from None
        self.params["user"], self.params["database"] = parsed.user, parsed.database
        limit = self.config.max_client_conn
        if sum(1 for s in self.server.sessions if s.major is not None and not s.closed) >= limit:
            # As PgBouncer does: answered after the startup packet, before any upstream connection.
            log.warning("connection refused: too many client connections", extra={"fields": {
                "client": self.client_addr, "user": self.params.get("user"), "max_client_conn": limit}})
            self._fail_client("53300", f"too many client connections (max_client_conn {limit})",
                              reason="max_client_conn reached")
            return
        self.major = self.config.major_for(self.params)
        if self.config.client_idle_timeout > 0:
            self.client_walker.capture = FRONTEND_CAPTURE | ANSWERED_FRONTEND
            asyncio.get_running_loop().call_later(self.config.client_idle_timeout, self._idle_check)
        self.server.stats.sessions_started += 1
        self.reader = self.server.read_path_for(self.params, self.major)
        if self.reader is None:
            self.client_walker.capture = self.client_walker.capture | RAW_COUNTED
        else:
            self.reader.attach(self.server.stats, self._log_refusal)
        if self.reader is not None:
            self._client_framer = EditFramer(READ_FRONTEND, FRONTEND_TYPES)
            self._upstream_splitter = StreamSplitter()
        if self.server.on_host_database(self.params) and self.server.writer_rule_broken:
            # The writer rule is not in force (ADR 0006): no new session on the host database until it is again.
            why = await self.server.writer_rule_refusal()
            if self.closed:  # the client left meanwhile
                return
            if why:
                self._fail_client("57P03", "openwop-seat accepts no new session on the host database while the "
                                           f"writer rule is not in force: {why}", reason="writer rule not in force")
                return
        if self.server.on_host_database(self.params):
            # Every session on the host database is claimed, with major 1 unless it is a v2 host, so a
            # backend reused behind a pooler never keeps an earlier session's major.
            self._claim_secret = self.server.claim_secret
        log.info("session start", extra={"fields": self._log_fields(protocol=startup.version_text)})
        self.upstream = await open_upstream(self.server, asyncio.get_running_loop(), self._upstream_lost)
        self.server.stats.upstream_connections += 1
        if self.closed:  # the client left while we were connecting
            self.upstream.close()
            return
        up = self.upstream
        limit = self.config.buffer_limit
        for peer in (self.client, up):
            peer.transport.set_write_buffer_limits(high=limit, low=limit // 4)
        # Backpressure: a full write buffer on one side pauses reading on the other.
        self.client.on_pause = lambda paused: _set_reading(up, not paused)
        up.on_pause = lambda paused: _set_reading(self.client, not paused)
        up.write(startup.raw)
        self.bytes_in += len(startup.raw)
        up.sink = self._from_upstream
        # A session to be claimed: until the claim is done, only authentication messages reach the server, so
        # nothing the client sends can run before the claim or be taken for its answer (ADR 0006).
        client_sink = self._from_client if self._claim_secret is None else self._client_before_ready
        if self._claim_secret is not None:
            self._claim_timer = asyncio.get_running_loop().call_later(self.config.startup_timeout,
                                                                      self._claim_timed_out)
        self.client.sink = client_sink
        for peer, sink in ((up, self._from_upstream), (self.client, client_sink)):
            if peer.buffer:
                pending = bytes(peer.buffer)
                peer.buffer.clear()
                sink(pending)
        if self.client.eof and not self.closed:
            self._client_eof()

    # ------------------------------------------------------------------ relay

    def _from_client(self, data: bytes) -> None:
        start = perf_counter()
        self._relay_client(data)
        self._seat_client.observe(perf_counter() - start)

    def _from_upstream(self, data: bytes) -> None:
        start = perf_counter()
        self._relay_upstream(data)
        self._seat_upstream.observe(perf_counter() - start)

    def _relay_client(self, data: bytes) -> None:
        if self._claiming:  # the client speaks before its ReadyForQuery: keep it until the claim is done
            self._client_backlog.append(data)
            return
        if self.reader is not None:
            self._relay_client_read(data)
            return
        try:
            captured = self.client_walker.feed(data)
        except ProtocolViolation as e:
            if e.valid_upto and self.upstream is not None:
                self.upstream.write(data[:e.valid_upto])
            self._client_violation(e)
            return
        self._last_client = time.monotonic()
        for t, body, _ in captured:
            self.state.on_frontend(t, body)
            if t != 0x58:  # with the idle timeout on, Query/Sync/FunctionCall are captured too
                self._queries_sent += 1
        self.bytes_in += len(data)
        if captured:
            self._raw_frontend(captured)
        self.upstream.write(data)

    def _relay_client_read(self, data: bytes) -> None:
        """A session with a read path: one pass frames the chunk, the read path sees each message it
        accounts for, and the chunk goes on as it arrived unless a message in it was replaced."""
        framer = self._client_framer
        items, lo, hi = framer.feed(data)
        self._last_client = time.monotonic()
        self.bytes_in += len(data)
        reader = self.reader
        parts: list | None = None
        last = lo
        for t, body, start, end in items:
            if t == 0x58:  # 'X'
                self.state.on_frontend(t, body)
                continue
            if t == 0x51 or t == 0x53 or t == 0x46:
                self._queries_sent += 1
            try:
                replacement = reader.on_client(t, body)
            except ProtocolViolation as e:
                # the messages before it are forwarded, as PostgreSQL processes them before failing
                if start >= 0 and start > last:
                    parts = (parts or []) + [data[last:start]]
                if parts:
                    self.upstream.write(b"".join(parts))
                self._client_violation(e)
                return
            if start < 0:  # a held message, completed now: it comes before the chunk's span
                if parts is None:
                    parts = []
                parts.append(messages.message(bytes([t]), body) if replacement is None else replacement)
            elif replacement is not None:
                if parts is None:
                    parts = []
                parts.append(data[last:start])
                parts.append(replacement)
                last = end
        if parts is None:
            out = data if lo == 0 and hi == len(data) else data[lo:hi]
        else:
            parts.append(data[last:hi])
            out = b"".join(parts)
        if out:
            self.upstream.write(out)
        if framer.violation is not None:
            self._client_violation(framer.violation)

    def _client_violation(self, e: ProtocolViolation) -> None:
        self.server.stats.protocol_violations += 1
        log.warning("session %s: client protocol violation: %s", self.id, e.message)
        self._fail_client(e.sqlstate, e.message)

    def _relay_upstream(self, data: bytes) -> None:
        if self._split_upstream:
            self._relay_upstream_read(data)
            return
        try:
            captured = self.upstream_walker.feed(data)
        except ProtocolViolation as e:
            if e.valid_upto:
                self.client.write(data[:e.valid_upto])
            self._upstream_violation(e)
            return
        if self._claiming:
            self._claim_answer(data)
            return
        state = self.state
        claim_now = False
        if state.phase is Phase.AUTHENTICATING:
            data = self._auth_messages(data)
            if data is None:
                return
            if self._claim_secret is not None and data[-6:-1] == b"Z\x00\x00\x00\x05":
                # Authenticated: before the client may speak, record who it is in the database.
                self._held_ready, data = data[-6:], data[:-6]
                claim_now = True
        for t, body, _ in captured:
            state.on_backend(t, body)
            if self.reader is None and (t == 0x5A or t == 0x45):
                self._raw_backend(t, body)
            if t == 0x5A:
                self._readies += 1
                self._ready_at = time.monotonic()
        if claim_now:
            self.client.write(data)
            self.bytes_out += len(data)
            self._send_claim()
            return
        self.bytes_out += len(data)
        if self.reader is None:
            self.client.write(data)
            return
        # Authenticated, not claiming, at a message boundary: from here on the splitter alone frames the
        # server's stream (one pass), and this chunk is the first it sees.
        self._split_upstream = state.phase is not Phase.AUTHENTICATING
        self._relay_upstream_read(data, counted=True)

    def _relay_upstream_read(self, data: bytes, counted: bool = False) -> None:
        """A session with a read path, after authentication: one pass frames the chunk. While the read
        path is quiet nothing is held and only a few message kinds are looked at; while its FIFO is in
        use, every message is accounted for and, when a result is being translated, held to be rewritten."""
        reader = self.reader
        quiet = reader.quiet
        state = self.state
        hold = reader.active > 0
        try:
            items = self._upstream_splitter.feed(data, hold, QUIET_BACKEND_SEEN if quiet else READ_BACKEND_SEEN,
                                                 None, ERROR_HELD)
        except ProtocolViolation as e:
            self._upstream_violation(e)
            return
        if not counted:
            self.bytes_out += len(data)
        out: list = []
        try:
            for item in items:
                kind = item[0]
                if kind == RAW:
                    out.append(item[1])
                    continue
                t, body = item[1], item[2]
                if not counted and t in BACKEND_CAPTURE:
                    state.on_backend(t, body)
                    if t == 0x5A:
                        self._readies += 1
                        self._ready_at = time.monotonic()
                if kind == HELD:
                    replacement = reader.on_server_quiet(t, body) if quiet else reader.on_server(t, body)
                    out.append(messages.message(bytes([t]), body) if replacement is None else replacement)
                elif quiet:
                    reader.on_server_quiet(t, body)
                else:
                    reader.on_server(t, body)
        except ReadPathError as e:
            log.error("session %s: %s", self.id, e)
            self.client.write(b"".join(out))
            self._fail_client("OW007", f"result_untranslatable: {e}", reason="read path refused a result")
            return
        # one write per received chunk, however many messages were rewritten in it
        if out:
            self.client.write(out[0] if len(out) == 1 else b"".join(out))

    def _upstream_violation(self, e: ProtocolViolation) -> None:
        log.error("session %s: upstream protocol violation: %s", self.id, e.message)
        self._fail_client("08P01", f"upstream sent an invalid message: {e.message}")

    def _send_claim(self) -> None:
        """Start the claim (ADR 0006): ask the backend for a challenge; :meth:`_claim_answer` proves the secret.

        While the claim is in flight the client is not read from (the kernel's socket buffer holds what it
        sends), and what was read already is held, at most ``proxy.claim_buffer_limit`` bytes.
        """
        self._claiming = True
        self._claim_phase = 1
        _set_reading(self.client, False)
        self.upstream.write(
            messages.message(b"P", b"\x00" + CHALLENGE_SQL + b"\x00\x00\x00")
            + messages.message(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x00")
            + messages.message(b"E", b"\x00\x00\x00\x00\x00")
            + messages.message(b"S"))

    def _client_before_ready(self, data: bytes) -> None:
        """The client's bytes from its startup packet until the claim is done: while the server authenticates,
        authentication messages ('p') go through; every other message is held, at most
        ``proxy.claim_buffer_limit`` bytes, and forwarded once the claim is done."""
        self._claim_held += len(data)
        if self._claim_held > self.config.claim_buffer_limit:
            self._fail_client("54000", f"the client sent more than {self.config.claim_buffer_limit} bytes before "
                                       f"its session was ready (proxy.claim_buffer_limit)", reason="claim buffer full")
            return
        pending = self._pre_ready
        pending += data
        while len(pending) >= 5:
            (length,) = struct.unpack_from("!i", pending, 1)
            if length < 4 or len(pending) < 1 + length:
                break  # incomplete (a bad length is the relay's to report, once the held bytes reach it)
            message = bytes(pending[:1 + length])
            if (message[0] == 0x70 and not self._client_backlog and not self._claiming
                    and self.state.phase is Phase.AUTHENTICATING):
                self.upstream.write(message)  # a password or SASL message: authentication needs it now
                self.bytes_in += len(message)
                self._claim_held -= len(message)
            else:
                self._client_backlog.append(message)
            del pending[:1 + length]

    def _claim_timed_out(self) -> None:
        if self.client.sink == self._client_before_ready and not self.closed:
            self._fail_client("08006", f"timeout: authentication and the claim of this session's major took longer "
                                       f"than {self.config.startup_timeout} s (proxy.startup_timeout)",
                              reason="claim timeout")

    def _send_proof(self, challenge: str) -> None:
        """The second half of the claim: the proof for this backend's challenge, never the secret."""
        major = 2 if self.major == 2 else 1
        proof = claim_proof(self._claim_secret, challenge, major).encode()
        major_text = str(major).encode()
        params = struct.pack("!i", len(proof)) + proof + struct.pack("!i", len(major_text)) + major_text
        oids = struct.pack("!h", len(CLAIM_PARAM_OIDS)) + b"".join(struct.pack("!I", o) for o in CLAIM_PARAM_OIDS)
        self._claim_phase = 2
        self.upstream.write(
            messages.message(b"P", b"\x00" + CLAIM_SQL + b"\x00" + oids)
            + messages.message(b"B", b"\x00\x00\x00\x00\x00\x02" + params + b"\x00\x00")
            + messages.message(b"E", b"\x00\x00\x00\x00\x00")
            + messages.message(b"S"))

    def _claim_answer(self, data: bytes) -> None:
        self._claim_buf += data
        if not self.upstream_walker.at_boundary:
            return
        answer, self._claim_buf = bytes(self._claim_buf), bytearray()
        error, done, pos, owns_schema, first = None, False, 0, False, None
        for t, body in messages.iter_messages(answer):
            pos += 5 + len(body)
            if t == 0x44:  # phase 1: (salt:challenge); phase 2: (claim, owns openwop_seat), 't' or 'f'
                owns_schema = body.endswith(b"\x00\x00\x00\x01t")
                (n,) = struct.unpack_from("!i", body, 2)
                first = body[6:6 + n].decode("utf-8", "replace") if n >= 0 else None
            elif t == 0x45:
                error = messages.parse_error_fields(body)
            elif t == 0x5A:
                done = True
                break
        if not done:
            self._claim_buf = bytearray(answer)
            return
        if error is None and self._claim_phase == 1:
            if first is None or ":" not in first:
                error = {"C": "XX000", "M": "openwop_seat.claim_challenge() returned no challenge"}
            else:
                self._send_proof(first)
                return
        self._claiming = False
        if self._claim_timer is not None:
            self._claim_timer.cancel()
        if error is not None:
            log.error("session %s: claim failed: %s %s", self.id, error.get("C"), error.get("M"))
            self._fail_client(error.get("C", "XX000"),
                              f"openwop-seat could not record this session's major: {error.get('M')}",
                              reason="claim failed")
            return
        superuser = self.state.server_params.get("is_superuser") == "on"
        if superuser or owns_schema:
            # Such a role can disable triggers or write claims: the in-database guard cannot bind it.
            self.server.stats.privileged_sessions["superuser" if superuser else "owns openwop_seat"] += 1
            log.warning("privileged role", extra={"fields": self._log_fields(
                role="superuser" if superuser else "owner of openwop_seat",
                why="this role can bypass the writer rule's guard; connect the host as a plain role")})
        self.client.write(self._held_ready)
        self.bytes_out += len(self._held_ready)
        if answer[pos:]:
            self.client.write(answer[pos:])
        self.client.sink = self._from_client
        _set_reading(self.client, True)
        if self._pre_ready:  # an incomplete message: the relay frames it with what follows
            self._client_backlog.append(bytes(self._pre_ready))
            self._pre_ready.clear()
        backlog, self._client_backlog = self._client_backlog, []
        for chunk in backlog:
            if self.closed:
                break
            self._from_client(chunk)

    def _auth_messages(self, data: bytes) -> bytes | None:
        """During authentication, forward whole messages only, so an offer can be edited.

        Returns the bytes to forward now, or None while a message is incomplete.
        """
        self._auth_pending += data
        if not self.upstream_walker.at_boundary:
            return None
        data, self._auth_pending = bytes(self._auth_pending), bytearray()
        if self.client_tls:
            return data
        out, changed = [], False
        for t, body in messages.iter_messages(data):
            if t == 0x52 and (plain := messages.without_channel_binding(body)) is not None:
                out.append(messages.message(b"R", plain))
                changed = True
            else:
                out.append(messages.message(bytes([t]), body))
        return b"".join(out) if changed else data

    # ------------------------------------------------------------------ endings

    def _client_at_boundary(self) -> bool:
        return (self._client_framer or self.client_walker).at_boundary

    def _upstream_at_boundary(self) -> bool:
        return (self._upstream_splitter if self._split_upstream else self.upstream_walker).at_boundary

    def _client_eof(self) -> None:
        if not self._client_at_boundary():
            self._fail_client("08P01", "unexpected EOF within message")
        else:
            self.close("client closed")

    def _client_lost(self, peer: Peer, exc: Exception | None) -> None:
        self.close("client closed" if exc is None else f"client connection lost: {exc}")

    def _upstream_lost(self, peer: Peer, exc: Exception | None) -> None:
        if self.closed or self.client.sink is None:
            return
        if self.state.phase is Phase.CLOSING:
            fatal = self.state.last_fatal
            self.close("client terminated" if fatal is None else f"upstream FATAL {fatal.get('C')}: {fatal.get('M')}")
            return
        # The upstream went away without a word: tell the client, if we are between messages.
        self._fail_client("08006", f"connection to upstream {self.config.upstream} lost"
                          + (f": {exc}" if exc else ""), reason="upstream lost")

    def _idle_check(self) -> None:
        """client_idle_timeout: end the session if it has been idle that long, else look again later.

        Idle means: authenticated, not inside a transaction (status 'I'), every Query/Sync/FunctionCall
        answered by its ReadyForQuery (so a long-running statement is not idle), and nothing from the
        client since. As PostgreSQL's idle_session_timeout, it does not apply inside a transaction.
        """
        if self.closed:
            return
        timeout = self.config.client_idle_timeout
        now = time.monotonic()
        since = max(self._last_client, self._ready_at)
        idle = (self.state.phase is Phase.READY and not self.state.in_transaction and not self._claiming
                and self._queries_sent < self._readies and self._client_at_boundary())
        if idle and now - since >= timeout:
            if self.upstream is not None:
                self.upstream.write(messages.message(b"X"))  # a clean Terminate for the backend
            self._fail_client("57P05", "terminating connection due to idle-session timeout",
                              reason="client_idle_timeout")
            return
        delay = since + timeout - now if idle else timeout
        asyncio.get_running_loop().call_later(max(delay, 0.01), self._idle_check)

    def _fail_client(self, sqlstate: str, text: str, reason: str | None = None) -> None:
        """Send a FATAL ErrorResponse where the protocol allows one, then end the session."""
        if not self.closed and self._upstream_at_boundary():
            self.client.write(messages.error_response(sqlstate, text, severity="FATAL"))
        if not self.closed:
            if self.upstream is None:  # turned away before it was relayed
                self.server.stats.connections_refused[
                    "startup_timeout" if reason == "startup timeout" else REFUSED_REASONS.get(sqlstate, sqlstate)] += 1
            if sqlstate in BY_SQLSTATE:
                self._log_refusal(sqlstate, "")
        self.server.stats.count_refusal(sqlstate)
        self.close(reason or f"{sqlstate} {text}")

    def shut_down(self) -> None:
        """The seat is stopping: end this session with the error PostgreSQL sends at shutdown."""
        if self.client.sink is None:  # still in the handshake: nothing to tell it in
            self.close("seat shutting down")
            return
        self._fail_client("57P01", "terminating connection because openwop-seat is shutting down",
                          reason="seat shutting down")

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.end_reason = reason
        if self.upstream is not None:
            self.upstream.sink = None
            self.upstream.close()
        self.client.sink = None
        self.client.close()
        if self.major is not None:  # a session that got past startup
            log.info("session end", extra={"fields": self._log_fields(
                reason=reason, duration_s=round(time.monotonic() - self.started, 3),
                bytes_in=self.bytes_in, bytes_out=self.bytes_out)})
        self.server.stats.bytes_in += self.bytes_in
        self.server.stats.bytes_out += self.bytes_out
        if self.raw_simple or self.raw_extended:
            self.server.stats.statements["passthrough", "simple"] += self.raw_simple
            self.server.stats.statements["passthrough", "extended"] += self.raw_extended
        if self.reader is not None:
            self.server.stats.statements_refused.update(self.reader.refusals)
        if not self.done.done():
            self.done.set_result(None)

    # ------------------------------------------------------------------ metrics and refusal logs

    def _raw_frontend(self, captured) -> None:
        """A session without a read path: count Query (simple) and Sync (extended, one per batch), time them."""
        now = perf_counter()
        for t, _, _ in captured:
            if t == 0x51:
                self.raw_simple += 1
            elif t == 0x53:
                self.raw_extended += 1
            elif t != 0x46:
                continue
            self._raw_sent.append(now)

    def _raw_backend(self, t: int, body: bytes) -> None:
        if t == 0x5A:
            if self._raw_sent:
                self.server.stats.statement_seconds.observe(perf_counter() - self._raw_sent.popleft())
            return
        sqlstate = messages.parse_error_fields(body).get("C", "")
        self.server.stats.server_errors[sqlstate] += 1
        if sqlstate in BY_SQLSTATE:
            self._log_refusal(sqlstate, "")

    def _log_refusal(self, sqlstate: str, kind: str) -> None:
        """One line per OpenWOP refusal (never the statement's text or its parameters)."""
        fields = self._log_fields(code=BY_SQLSTATE[sqlstate].code, sqlstate=sqlstate)
        if kind:
            fields["kind"] = kind
        log.info("refusal", extra={"fields": fields})

    def _log_fields(self, **more) -> dict:
        fields = {
            "session": self.id,
            "client": self.client_addr,
            "user": self.params.get("user"),
            "database": self.params.get("database", self.params.get("user")),
            "application_name": self.params.get("application_name", ""),
            "major": self.major,
            "tls": self.client_tls,
        }
        fields.update(more)
        return fields


def _upstream_reason(message: str) -> str:
    """A short label for an UpstreamUnavailable message (metrics)."""
    if message.startswith("timeout"):
        return "timeout"
    if "TLS" in message:
        return "tls"
    return "connect"


def _set_reading(peer: Peer, on: bool) -> None:
    transport = peer.transport
    if transport is None or transport.is_closing():
        return
    if on:
        transport.resume_reading()
    else:
        transport.pause_reading()
