"""One relayed session: a client connection and its own upstream connection (the I/O side).

The handshake (encryption requests, startup, cancel) is a coroutine; after it both directions are plain
protocol callbacks that hand each received chunk to the session's sans-IO :class:`~proxy.serve.relay.Relay`
and write what it returns, one write per chunk and side, so the hot path has no task switches and no
copies. Backpressure is the transports' own: when one side's write buffer passes the configured limit, the
seat stops reading from the other side until it drains. Timers (the claim's, the idle timeout) live here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import ssl
import struct
import time
from time import perf_counter
from typing import TYPE_CHECKING

from proxy.errors import BY_SQLSTATE, CODES
from proxy.logs import event
from proxy.readpath import encoding
from proxy.readpath.read_path import ReadPath
from proxy.serve.peer import Peer, UpstreamUnavailable, open_upstream
from proxy.serve.pool import READY_IDLE, PoolWaitTimeout, ServerConn, login_status, seat_key_data
from proxy.serve.relay import Claim, Ending, Identity, Relay
from proxy.serve.scram import ScramServer
from proxy.wire import messages
from proxy.wire.codec import (
    CancelRequest,
    GSSENCRequest,
    ProtocolViolation,
    SSLRequest,
    StartupMessage,
    parse_initial_packet,
)
from proxy.wire.messages import PROTOCOL_3_0
from proxy.wire.startup import StartupRefused, parse_startup
from proxy.wire.state import Phase, SessionState, shared

# Why a session ended before it had an upstream connection, by the SQLSTATE it was sent (metrics).
REFUSED_REASONS = {"53300": "max_client_conn", "08006": "upstream_unavailable", "42501": "forbidden_setting",
                   "42601": "forbidden_setting", "08P01": "protocol_violation", "57P01": "shutting_down",
                   "57P03": "writer_rule_not_in_force", "OW009": "client_encoding"}

# How long the seat takes a role's ownership of openwop_seat, as a claim found it, for known (the claims in between
# leave out that question: ADR 0013).
OWNS_KNOWN_SECONDS = 60.0

# The largest SASL message a pooled client may send the seat during its login (a SCRAM message is under 300 bytes).
MAX_PASSWORD_MESSAGE = 8192

# What the seat keeps per answer the server owes a session, roughly, in bytes (a float in a list, an entry of the
# read path's FIFO): with buffer_limit, it bounds how many answers a session may owe before its client is not read.
OWED_BYTES = 64

if TYPE_CHECKING:
    from proxy.serve.context import SeatView

# The seat's own time per received chunk (openwop_seat_processing_seconds) is sampled: each side counts its own
# chunks and times the first and then one in 8, the others cost an integer increment (two clock reads and a
# histogram update were the largest piece of Python per chunk, issue 27). One counter for both sides would time
# only one side of a strictly alternating session.
TIMED_MASK = 7
FAST_HOLD_BYTES = 256 << 10  # a client's bytes held while a fast page's answer is not settled, before it is not read

log = logging.getLogger("openwop_seat.session")
# The session's own lines (two a connect, one a refusal) go through logs.event, their fields built only when the
# level is logged (issue 26).
INFO = logging.INFO

_session_ids = itertools.count(1)


SESSIONS_PER_START = 1 << 32  # ids a worker process may number before the next start of its slot would repeat them


def number_sessions(first: int, step: int, start: int = 0) -> None:
    """Session ids first, first + step, …: with ``proxy.workers`` > 1 worker W of N numbers W, W + N, …, so that an
    id names one session of the whole seat (the admin console's KILL, the log lines). ``start`` counts the earlier
    processes of this worker slot (the supervisor restarts a worker that exited): the k-th start numbers from
    W + N·k·2³², so a restarted worker never hands out an id an earlier one used."""
    global _session_ids
    _session_ids = itertools.count(first + step * start * SESSIONS_PER_START, step)


class Session:
    """A client connection relayed to one upstream connection for its whole life."""

    # slots: a seat holds one session per connection, idle ones included (make bench's idle_memory: a dict of this
    # many attributes was 1.6 KB a session)
    __slots__ = ("_analysing", "_bytes_at_ready", "_claim_open", "_claim_timer", "_client_chunks", "_client_holds",
                 "_done", "_ending", "_ending_timer", "_held_data", "_last_client", "_max_owed", "_on_held", "_pausing",
                 "_readies", "_reading_paused", "_ready_at", "_seat_client", "_seat_key", "_seat_upstream",
                 "_upstream_chunks", "client", "client_addr", "client_tls", "closed", "config", "end_reason",
                 "first_boot", "handed_over", "held", "held_since", "id", "label_pair", "major", "params",
                 "pool_conn", "relay", "server", "started", "startup_bytes", "upstream")

    def __init__(self, server: "SeatView", client: Peer):
        self.server = server
        self.config = server.config  # the config this session started under; reloads do not touch it
        self.client = client
        self.upstream: Peer | None = None
        self.id = next(_session_ids)
        self.relay: Relay | None = None  # the protocol side, once the startup packet is read
        self.params: dict[str, str] = {}
        self.major: int | str | None = None
        self.label_pair = ("", "")  # the (database, user) labels of its metrics, once started
        self.client_tls = False
        self.started = time.monotonic()
        self.startup_bytes = 0  # the startup packet, relayed before the relay exists
        self.end_reason = ""
        self.closed = False
        self._done: asyncio.Future | None = None  # made when first asked for (done): an idle session keeps none
        peername = client.transport.get_extra_info("peername") if client.transport else None
        # A Unix-socket client has no address: "[local]", as PostgreSQL logs it.
        self.client_addr = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else str(peername or "[local]")
        self._client_chunks = -1  # chunks received from each side, less one: one in TIMED_MASK + 1 is timed
        self._upstream_chunks = -1
        self._seat_client = server.stats.seat_seconds["client"]  # histograms of the seat's own time per chunk
        self._seat_upstream = server.stats.seat_seconds["upstream"]
        self._claim_timer: asyncio.TimerHandle | None = None
        self._claim_open = False  # the session is to be claimed and the claim is not over yet
        self._reading_paused = False  # the client is not read while the seat's claim is in flight
        # Why the client is not read now ("upstream full", "claim", "owed", "analysis"): read again when none is left
        # (a tuple: the empty one is shared, a set is 216 bytes a session)
        self._client_holds: tuple[str, ...] = ()
        self._analysing = False  # a statement of this session is being parsed in the analysis thread
        # Answers the server owes this session that the seat keeps track of (a timestamp, an entry of the read path's
        # FIFO): at most this many before the client is no longer read (about buffer_limit bytes of bookkeeping).
        self._max_owed = _max_owed(self.config.buffer_limit)
        # client_idle_timeout bookkeeping
        self._last_client = self.started  # monotonic time of the last chunk from the client
        self._ready_at = self.started  # …and of the last ReadyForQuery from the upstream
        self._readies = 0
        # Set when the session is to end once idle outside a transaction (a drain in shutdown_mode "idle", the end of
        # first boot): (grace in seconds, sqlstate, message, end reason); and the timer that looks again.
        self._ending: tuple[float, str, str, str] | None = None
        self._ending_timer: asyncio.TimerHandle | None = None
        self.pool_conn: ServerConn | None = None  # a pooled session's server connection (ADR 0016)
        self.handed_over = False  # …handed over from the pool (else connected, authenticated and claimed for it)
        self._seat_key: tuple[int, bytes] | None = None  # the cancel key the seat gave its client
        self.first_boot = False  # started while the seat's rules were not in force: unclaimed, event rows refused
        # The admin console's PAUSE (hold): from the next transaction boundary on, what the client sends waits in
        # _held_data (up to buffer_limit, then it is no longer read) until release(); on_held is called once held.
        self._pausing = False
        self.held = False
        self.held_since = 0.0
        self._held_data: bytes | bytearray = b""  # a bytearray once something is held
        self._on_held = None
        self._bytes_at_ready = 0  # relay.bytes_in at the last ReadyForQuery: more since means a statement is sent
        client.owner = self  # the peers' callbacks are this class's functions, called with the session
        client.on_lost = Session._client_lost
        client.on_eof = Session._client_eof

    # What the listener and the metrics collector read of a session.

    @property
    def done(self) -> asyncio.Future:
        """Set once the session has ended (for a drain, a reload or PAUSE to wait on)."""
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
            if self.closed:
                self._done.set_result(None)
        return self._done

    @property
    def reader(self) -> ReadPath | None:
        return self.relay.reader if self.relay is not None else None

    @property
    def state(self) -> SessionState:
        return self.relay.state if self.relay is not None else _NO_STATE

    @property
    def bytes_in(self) -> int:
        return self.startup_bytes + (self.relay.bytes_in if self.relay is not None else 0)

    @property
    def bytes_out(self) -> int:
        return self.relay.bytes_out if self.relay is not None else 0

    @property
    def raw_simple(self) -> int:
        return self.relay.raw_simple if self.relay is not None else 0

    @property
    def raw_extended(self) -> int:
        return self.relay.raw_extended if self.relay is not None else 0

    # ------------------------------------------------------------------ handshake

    async def run(self) -> None:
        try:
            # asyncio.timeout, not wait_for: the handshake runs in this task (wait_for would make it a task of its own,
            # with its futures and callbacks, at every connect)
            async with asyncio.timeout(self.config.startup_timeout):
                await self._handshake()
        except TimeoutError:
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
            if not client.buffer:
                client.buffer = b""  # none kept while the session idles
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
        server = self.server
        server.stats.cancel_requests += 1
        pool = server.pool
        # A pooled session's client holds a cancel key of the seat's (ADR 0016): sent on as its backend's own key, to
        # the backend that session is on now. With workers > 1 the kernel may have given this connection to another
        # worker than the session's: the other workers are asked (through the supervisor) before the key goes on as
        # it came. Any other key goes on as it came: PostgreSQL checks it (a seat key of a session that ended
        # matches no backend there).
        mapped = pool.cancel_target(packet.pid, packet.key)
        if mapped is None and self.config.pool.enabled and self.config.workers > 1 and not server.peers_linked.is_set():
            # A worker listens before its link to the supervisor is up: a cancel that comes in between waits for it
            # (as long as an ask of the others may take), not forwarded as it came while another worker holds the
            # session. Once up, it is not waited for again (a drain without a supervisor forwards at once).
            from proxy.serve.supervisor import PEER_CANCEL_SECONDS

            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.peers_linked.wait(), PEER_CANCEL_SECONDS)
        if mapped is None and server.peers is not None and self.config.pool.enabled:
            if await server.peers.cancel(packet.pid, packet.key):
                pool.cancel_results["routed"] += 1
                self.close("cancel routed to another worker")
                return
        if await server.send_cancel(packet.raw if mapped is None else mapped, packet.pid):
            pool.cancel_results["forwarded" if mapped is None else "mapped"] += 1
            self.close("cancel forwarded")
        else:
            self.close("cancel not forwarded")

    async def _start(self, startup: StartupMessage) -> None:
        self.params = dict(startup.params)
        try:
            # As PostgreSQL reads the packet (options split with escapes, -c and --name=value, an empty database
            # meaning the user's): the allowlist of settings, and the database that decides the major and the claim.
            parsed = parse_startup(self.params)
        except StartupRefused as e:
            raise ProtocolViolation(str(e), sqlstate=e.sqlstate) from None
        self.params["user"], self.params["database"] = parsed.user, parsed.database
        self.params = shared(self.params)  # never changed from here on: one dict for the sessions that have the same
        limit = self.config.max_client_conn
        if self.server.open_sessions >= limit:
            # As PgBouncer does: answered after the startup packet, before any upstream connection.
            log.warning("connection refused: too many client connections", extra={"fields": {
                "client": self.client_addr, "user": self.params.get("user"), "max_client_conn": limit}})
            self._fail_client("53300", f"too many client connections (max_client_conn {limit})",
                              reason="max_client_conn reached")
            return
        self.major = self.config.major_for(self.params)
        self.server.open_sessions += 1  # back in close(): a session with a major
        stats = self.server.stats
        if self.server.on_host_database(self.params):  # a count only: the heartbeat writes it (docs/lifecycle.md)
            stats.majors_seen[(self.major, self.params["user"])] += 1
        self.label_pair = stats.label_pair(self.params["database"], self.params["user"],
                                           self.config.database_user_labels)
        stats.pair_sessions[self.label_pair] += 1
        if self.config.client_idle_timeout > 0:
            asyncio.get_running_loop().call_later(self.config.client_idle_timeout, self._idle_check)
        self.server.stats.sessions_started += 1
        reader = self.server.read_path_for(self.params, self.major)
        if reader is not None:
            # A translated session is parsed in UTF-8 (proxy/readpath/encoding.py): no client-only encoding.
            encodings = [v for n, v in parsed.settings if n.lower() == "client_encoding"]
            why = encoding.refusal(encodings[-1]) if encodings else None
            if why is not None:
                code = CODES[encoding.ERROR_CODE]
                self._fail_client(code.sqlstate, f"{code.code}: {why}", reason=f"client_encoding {encodings[-1]}")
                return
        if self.server.on_host_database(self.params) and self.server.writer_rule_broken:
            # The writer rule is not in force (ADR 0006): no new session on the host database until it is again.
            why = await self.server.writer_rule_refusal()
            if self.closed:  # the client left meanwhile
                return
            if why:
                self._fail_client("57P03", "openwop-seat accepts no new session on the host database while the "
                                           f"writer rule is not in force: {why}", reason="writer rule not in force")
                return
        claim = None
        if self.server.on_host_database(self.params):
            if self.server.first_boot:
                # The seat's schema may not exist yet: nothing to claim with. The read path refuses every statement
                # that reads or writes event rows; the session ends once the rules come into force.
                self.first_boot = reader is not None
            elif self.major in (1, 2) or self.server.upstream_pooler:
                # Sessions of major 1 and 2 are claimed. A raw session is relayed byte for byte, unclaimed: on a
                # fresh backend that is what a claim of 0 records (a v1 writer whose reads the net of ADR 0009
                # leaves alone). Once this seat has seen a pooler behind it, whose backends outlive its sessions,
                # raw sessions are claimed as 0 too, so that they never keep an earlier session's major (ADR 0013).
                known = self.server.claim_owners.get(self.params["user"])
                claim = Claim(self.server.claim_secret, self.major if self.major in (1, 2) else 0,
                              self.config.claim_buffer_limit, self.server.claim_salt,
                              known[0] if known is not None and time.monotonic() - known[1] < OWNS_KNOWN_SECONDS
                              else None)
        identity = None
        followed = claim is not None or (self.major == "raw" and self.server.on_host_database(self.params)
                                         and not self.server.first_boot)  # raw: unclaimed, still on the host database
        if followed and any(r.application_name is not None or r.user is not None for r in self.config.clients):
            # a rule keys on what a client may change mid-session: follow what the server reports
            identity = Identity(dict(self.params), self.major, self.config.major_for)
        # Statements are counted against their ReadyForQuery (count_answered) so that idleness can be told at any
        # time: the idle timeout, a drain in shutdown_mode "idle" and the end of first boot need it.
        pool = self.server.pool
        verifier = None
        if (claim is not None and self.config.pool.enabled and self.major in (1, 2) and not self.server.upstream_pooler
                and startup.version == PROTOCOL_3_0 and not any(k.startswith("_pq_.") for k in self.params)):
            verifier = await pool.lookup(self.params["user"])
            if self.closed:  # the client left meanwhile
                return
        if verifier is not None:
            # Pooled (ADR 0016): a claimed major, a user with a SCRAM-SHA-256 verifier (pool.auth_file, auth_query).
            try:
                conn = await pool.acquire(pool.key_for(self.params, self.major))
            except PoolWaitTimeout as e:
                self._fail_client("53300", str(e), reason="query_wait_timeout")
                return
            self.pool_conn = conn
            conn.session = self
            if self.closed:  # the client left while it waited
                if conn.peer is not None:
                    pool.put_back(conn)
                else:
                    pool.forget(conn)
                self.pool_conn = None
                return
            if conn.peer is not None:
                await self._hand_over(conn, reader, identity, startup, verifier)
                return
        self.relay = Relay(self.server.stats, reader=reader, claim=claim, client_tls=self.client_tls,
                           count_answered=True, identity=identity, on_refusal=self._log_refusal,
                           pooled=self.pool_conn is not None,
                           key_data=self._seat_key_data if self.pool_conn is not None else None)
        if self.server.config.log_connections and log.isEnabledFor(INFO):
            event(log, INFO, "session start", self._log_fields(protocol=startup.version_text))
        try:
            self.upstream = await open_upstream(self.server, asyncio.get_running_loop(), Session._upstream_lost, self)
        except BaseException:
            if self.pool_conn is not None:
                pool.forget(self.pool_conn)
                self.pool_conn = None
            raise
        self.server.stats.upstream_connections += 1
        if self.pool_conn is not None:
            self.pool_conn.peer = self.upstream
        if self.closed:  # the client left while we were connecting
            if self.pool_conn is not None:
                pool.give_back(self.pool_conn, False, "client left while connecting")
                self.pool_conn = None
            self.upstream.close()
            return
        up = self.upstream
        limit = self.config.buffer_limit
        for peer in (self.client, up):
            peer.transport.set_write_buffer_limits(high=limit, low=limit // 4)
        # Backpressure: a full write buffer on one side pauses reading on the other.
        self.client.on_pause = Session._client_write_paused
        up.on_pause = Session._upstream_write_paused
        up.write(startup.raw)
        self.startup_bytes = len(startup.raw)
        up.sink = Session._from_upstream
        if claim is not None:
            self._claim_open = True
            self._claim_timer = asyncio.get_running_loop().call_later(self.config.startup_timeout,
                                                                      self._claim_timed_out)
        self.client.sink = Session._from_client
        for peer, sink in ((up, self._from_upstream), (self.client, self._from_client)):
            if peer.buffer:
                pending = bytes(peer.buffer)
                peer.buffer = b""
                sink(pending)
        if self.client.eof and not self.closed:
            self._client_eof()

    # ------------------------------------------------------------------ pooled server connections (ADR 0016)

    def _seat_key_data(self, body: bytes) -> bytes:
        """The server's BackendKeyData of a new pooled backend: kept for the seat, the client gets one of the seat's."""
        conn = self.pool_conn
        conn.pid, conn.backend_key = messages.parse_backend_key_data(body)
        self._seat_key = self.server.pool.issue_cancel_key(self, len(conn.backend_key))
        return struct.pack("!i", self._seat_key[0]) + self._seat_key[1]

    async def _password_message(self) -> bytes:
        head = await self.client.read_exact(5)
        (length,) = struct.unpack("!i", head[1:])
        if head[:1] != b"p" or length < 4 or length > MAX_PASSWORD_MESSAGE:
            raise ProtocolViolation("expected a SASL message (SCRAM-SHA-256)", sqlstate="28000")
        return await self.client.read_exact(length - 4)

    async def _hand_over(self, conn: ServerConn, reader: ReadPath | None, identity: Identity | None,
                         startup: StartupMessage, verifier: str) -> None:
        """An idle pooled backend of this session's pool: the client proves its password to the seat (SCRAM-SHA-256
        against pool.auth_file), then gets the login PostgreSQL would send: AuthenticationOk, the backend's current
        ParameterStatus values, a cancel key of the seat's, ReadyForQuery. No claim: the backend's claim was checked
        by its reset."""
        pool = self.server.pool
        user = self.params["user"]
        exchange = ScramServer(verifier)
        try:
            self.client.write(exchange.start())
            self.client.write(exchange.client_first(await self._password_message()))
            # The client computes its proof now (PBKDF2: milliseconds), and a backend its last client left a moment
            # ago is reset meanwhile. One that fails its reset is closed: the next idle one of the pool is taken
            # instead, and with none the login ends below with 08006 (a client in the middle of the seat's SCRAM
            # exchange cannot be sent to PostgreSQL for a new backend).
            while not await pool.reset_for_hand_over(conn):
                other = await pool.take_idle(conn.key)
                if other is None:
                    break
                conn = self.pool_conn = other
                conn.session = self
            final = exchange.client_final(await self._password_message())
        except BaseException:
            pool.put_back(conn)
            self.pool_conn = None
            raise
        if final is None:
            pool.put_back(conn)
            self.pool_conn = None
            log.warning("pooled login refused", extra={"fields": self._log_fields(why="wrong password")})
            self._fail_client("28P01", f'password authentication failed for user "{user}"',
                              reason="password authentication failed at the seat")
            return
        if self.closed:  # the client left after its last SASL message
            pool.put_back(conn)
            self.pool_conn = None
            return
        if conn.closed or conn.peer.lost:  # the backend went away, or failed its reset, while the client authenticated
            pool.put_back(conn)  # closed already, or closed there (a backend lost while active was never closed)
            self.pool_conn = None
            self._fail_client("08006", "the pooled server connection was lost during login; connect again",
                              reason="pooled server connection lost")
            return
        self.handed_over = True
        self._seat_key = pool.issue_cancel_key(self, len(conn.backend_key or b"1234"))
        # The login first (AuthenticationOk and the ParameterStatus values, encoded once per set of values:
        # pool.login_status), the session's own set-up after it: at one client a connect is serial, and the
        # client reads its login while the seat builds the relay and writes its log line. Nothing the client
        # sends can be read before this callback returns.
        self.client.write(b"".join((final, login_status(conn.params), seat_key_data(*self._seat_key), READY_IDLE)))
        relay = self.relay = Relay(self.server.stats, reader=reader, claim=None, client_tls=self.client_tls,
                                   count_answered=True, identity=identity, on_refusal=self._log_refusal, pooled=True)
        relay.adopt(conn.params, conn.pid, conn.backend_key)
        self._readies = relay.readies
        up = self.upstream = conn.peer
        up.owner = self
        up.on_lost = Session._upstream_lost
        limit = self.config.buffer_limit
        for peer in (self.client, up):
            peer.transport.set_write_buffer_limits(high=limit, low=limit // 4)
        self.client.on_pause = Session._client_write_paused
        up.on_pause = Session._upstream_write_paused
        if self.server.config.log_connections and log.isEnabledFor(INFO):
            event(log, INFO, "session start", self._log_fields(protocol=startup.version_text, pooled_backend=conn.pid))
        up.sink = Session._from_upstream
        self.client.sink = Session._from_client
        if up.buffer:  # what the backend sent since it was taken from the pool (a FATAL): the session's now
            pending = bytes(up.buffer)
            up.buffer = b""
            self._from_upstream(pending)
        if self.client.buffer:
            pending = bytes(self.client.buffer)
            self.client.buffer = b""
            self._from_client(pending)
        if self.client.eof and not self.closed:
            self._client_eof()

    def _pool_clean(self) -> bool:
        """Whether this pooled session's backend may be reset for the next client: the client left (Terminate or
        EOF) idle outside a transaction, every statement answered, nothing sent since the last ReadyForQuery but
        its Terminate, no message half-read on either side, no COPY, no claim in flight, no FATAL."""
        relay = self.relay
        if relay is None or self.upstream is None or self.upstream.lost:
            return False
        sent_since = relay.bytes_in - self._bytes_at_ready
        return (relay.ending is None and not relay.awaiting_ready and not relay.claiming
                and relay.state.last_fatal is None and relay.state.txn_status == b"I"
                and relay.queries_sent < relay.readies and relay.readies == self._readies
                and relay.server_at_boundary and relay.client_at_boundary
                and not relay.deferred and not self._analysing and not self._held_data
                and sent_since == (5 if relay.state.phase is Phase.CLOSING else 0))

    # ------------------------------------------------------------------ relay

    def _from_client(self, data: bytes) -> None:
        if self._pausing and (self.held or self._at_rest()):
            self._hold_here(data)
            return
        self._client_chunks += 1
        timed = not self._client_chunks & TIMED_MASK
        if timed:
            start = perf_counter()
        relay = self.relay
        out = relay.from_client(data)
        self._last_client = time.monotonic()
        if out:
            self.upstream.write(out)
        if relay.analysis is not None and not self._analysing:
            self._analyse()
        if relay.fast_held > FAST_HOLD_BYTES:
            # what the client sends while a fast page's answer is not settled waits in the relay (ADR 0024): a bound
            self._hold_client("fast", True)
        if relay.owed > self._max_owed:
            # A client that sends faster than it reads its answers (pipelined Syncs it never reads): each owed answer
            # costs the seat bookkeeping, so it is not read further until the server's answers catch up.
            self._hold_client("owed", True)
        if relay.ending is not None:
            self._end(relay.ending)
        elif (self.pool_conn is not None and relay.state.phase is Phase.CLOSING and relay.state.last_fatal is None
              and not self.closed):
            # A pooled session's Terminate is not relayed (ADR 0016): the session ends here, as PostgreSQL would end
            # it, and its backend goes back to the pool, not held by a client that keeps its socket open.
            self.close("client terminated")
        if timed:
            self._seat_client.observe(perf_counter() - start)

    def _from_upstream(self, data: bytes) -> None:
        self._upstream_chunks += 1
        timed = not self._upstream_chunks & TIMED_MASK
        if timed:
            start = perf_counter()
        relay = self.relay
        to_client, to_server = relay.from_server(data)
        if to_client:
            self.client.write(to_client)
        if to_server:
            self.upstream.write(to_server)
            if relay.analysis is not None and not self._analysing:  # the backlog released after the claim
                self._analyse()
        if "owed" in self._client_holds and relay.owed <= self._max_owed // 2:
            self._hold_client("owed", False)
        if "fast" in self._client_holds and not relay.fast_held:
            self._hold_client("fast", False)
        if relay.readies != self._readies:
            self._readies = relay.readies
            self._ready_at = time.monotonic()
            self._bytes_at_ready = relay.bytes_in
            if self._ending is not None:
                self._ending_check()
            if self._pausing:
                self._check_held()
        if self._claim_open:
            self._claim_progress(relay)
        if relay.ending is not None:
            self._end(relay.ending)
        if timed:
            self._seat_upstream.observe(perf_counter() - start)

    def _claim_progress(self, relay: Relay) -> None:
        """The claim started (stop reading the client: its kernel buffer holds what it sends), or ended."""
        # ADR 0013: the salt for the next one-round-trip claims, a pooler seen behind the seat, a role's ownership
        if relay.salt_seen is not None:
            self.server.claim_salt = relay.salt_seen
        if relay.pooler_seen:
            self.server.upstream_pooler = True
        if relay.owns_seen is not None:
            owners = self.server.claim_owners
            if len(owners) >= 1000:  # a bound: the roles that connect are few
                owners.clear()
            owners[self.params["user"]] = (relay.owns_seen, time.monotonic())
        if relay.claiming and not self._reading_paused:
            self._reading_paused = True
            self._hold_client("claim", True)
            return
        if relay.awaiting_ready:
            return
        self._claim_open = False
        if relay.claim_path:
            self.server.stats.claims[relay.claim_path] += 1
        if self._claim_timer is not None:
            self._claim_timer.cancel()
            self._claim_timer = None
        if self._reading_paused:
            self._reading_paused = False
            self._hold_client("claim", False)
        if self._ending is not None:
            self._ending_check()
        if relay.privileged:
            superuser = relay.privileged == "superuser"
            self.server.stats.privileged_sessions[relay.privileged] += 1
            log.warning("privileged role", extra={"fields": self._log_fields(
                role="superuser" if superuser else "owner of openwop_seat",
                why="this role can bypass the writer rule's guard; connect the host as a plain role")})
            relay.privileged = ""

    def _analyse(self) -> None:
        """A long statement without a plan (Relay.analysis): parsed in a worker thread, so that every other session
        of this process is served meanwhile; this client is not read, and what it sent after the statement waits in
        the relay, until the plan is back."""
        relay = self.relay
        classifier = relay.reader.classifier
        sql = relay.analysis
        self._analysing = True
        self._hold_client("analysis", True)
        future = asyncio.get_running_loop().run_in_executor(_analysis_pool(), _analyse, classifier, sql)

        def done(f: asyncio.Future) -> None:
            self._analysing = False
            if self.closed:
                return
            try:
                plan, generation = f.result()
            except Exception:  # a bug must end this session only, never the seat
                log.exception("session %s: unexpected error analysing a statement", self.id)
                self._fail_client("XX000", "internal error in openwop-seat while analysing a statement")
                return
            classifier.analysed(sql, plan, generation)
            self._relay_analysed()

        future.add_done_callback(done)

    def _relay_analysed(self) -> None:
        relay = self.relay
        out = relay.analysed()
        if out:
            self.upstream.write(out)
        if relay.ending is not None:
            self._end(relay.ending)
            return
        if relay.analysis is not None:  # another long statement after it
            self._analyse()
            return
        self._hold_client("analysis", False)
        if relay.owed > self._max_owed:
            self._hold_client("owed", True)
        if self.client.eof and not self.closed:
            self._client_eof()  # the client left after sending them: as PostgreSQL, they ran first

    def _hold_client(self, reason: str, on: bool) -> None:
        """Stop reading the client for ``reason`` (or no longer for it): it is read while no reason holds it."""
        holds = self._client_holds
        if on:
            if reason in holds:
                return
            self._client_holds = holds + (reason,)
            if not holds:
                _set_reading(self.client, False)
        elif reason in holds:
            self._client_holds = rest = tuple(r for r in holds if r != reason)
            if not rest:
                _set_reading(self.client, True)

    # Backpressure (the bound methods cost a session less than a closure each): a full write buffer on one side pauses
    # reading on the other.

    def _client_write_paused(self, paused: bool) -> None:
        if self.upstream is not None:
            _set_reading(self.upstream, not paused)

    def _upstream_write_paused(self, paused: bool) -> None:
        self._hold_client("upstream full", paused)

    def _end(self, ending: Ending) -> None:
        if ending.kind == "client_violation":
            log.warning("session %s: client protocol violation: %s", self.id, ending.message)
        elif ending.kind == "server_violation":
            log.error("session %s: %s", self.id, ending.message)
        elif ending.kind in ("result_untranslatable", "claim_failed", "identity_changed", "pooler_behind",
                             "client_encoding_refused"):
            log.error("session %s: %s", self.id, ending.message)
        self._fail_client(ending.sqlstate, ending.message, reason=ending.reason)

    def _claim_timed_out(self) -> None:
        if self.relay is not None and self.relay.awaiting_ready and not self.closed:
            self._fail_client("08006", f"timeout: authentication and the claim of this session's major took longer "
                                       f"than {self.config.startup_timeout} s (proxy.startup_timeout)",
                              reason="claim timeout")

    # ------------------------------------------------------------------ PAUSE (the admin console)

    def hold(self, on_held) -> None:
        """PAUSE: hold this session at its next transaction boundary (a ReadyForQuery 'I' with every statement
        answered and nothing sent since): nothing it sends reaches the server until release(). ``on_held()`` is
        called when it is held (at once if it is at a boundary now)."""
        self._pausing = True
        self._on_held = on_held
        self._check_held()

    def release(self) -> None:
        """RESUME: relay what the client sent while held, and read it again."""
        self._pausing = False
        self._on_held = None
        if not self.held:
            return
        self.held = False
        pending, self._held_data = bytes(self._held_data), b""
        self._hold_client("pause", False)
        if pending and not self.closed:
            self._from_client(pending)
        if self.client.eof and not self.closed:
            self._client_eof()

    @property
    def pause_ok(self) -> bool:
        """What PAUSE waits for: held, or not (yet) relayed to a backend, or ended."""
        return self.closed or self.held or self.upstream is None

    @property
    def waiting(self) -> bool:
        """Held with a message of the client's waiting (PgBouncer's client state "waiting")."""
        return self.held and bool(self._held_data)

    def _at_rest(self) -> bool:
        return (self.upstream is not None and self.relay is not None and self._is_idle()
                and self.relay.bytes_in == self._bytes_at_ready)

    def _check_held(self) -> None:
        if self.closed or self.held or not self._at_rest():
            return
        self.held = True
        self.held_since = time.monotonic()
        if self._on_held is not None:
            self._on_held()

    def _hold_here(self, data: bytes) -> None:
        """What a held client sends waits here (so SHOW CLIENTS can say it is waiting); past buffer_limit the
        client is no longer read."""
        if not self.held:
            self.held = True
            self.held_since = time.monotonic()
            if self._on_held is not None:
                self._on_held()
        if not self._held_data:
            self.held_since = time.monotonic()  # PgBouncer's wait: since the statement arrived
            self._held_data = bytearray(data)
        else:
            self._held_data += data
        if len(self._held_data) > self.config.buffer_limit:
            self._hold_client("pause", True)

    # ------------------------------------------------------------------ endings

    def _client_at_boundary(self) -> bool:
        return self.relay is None or self.relay.client_at_boundary

    def _upstream_at_boundary(self) -> bool:
        return self.relay is None or self.relay.server_at_boundary

    def _client_eof(self) -> None:
        if self._analysing:
            return  # its last statements are still being analysed: the session ends once they are relayed
        if self._held_data:
            return  # what it sent before leaving waits for the end of a PAUSE (release() relays it, then ends)
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

    def _is_idle(self) -> bool:
        """Idle: authenticated, not inside a transaction (status 'I'), every Query/Sync/FunctionCall answered by
        its ReadyForQuery (so a long-running statement is not idle), no partial message from the client."""
        relay = self.relay
        return (relay is not None and relay.state.phase is Phase.READY and not relay.state.in_transaction
                and not relay.awaiting_ready and relay.queries_sent < relay.readies and relay.client_at_boundary
                and not relay.deferred  # a statement being analysed (and what follows it) is not idle
                and not self._held_data)  # nor one whose statement waits for the end of a PAUSE

    def _idle_check(self) -> None:
        """client_idle_timeout: end the session if it has been idle that long, else look again later.

        Idle (:meth:`_is_idle`), with nothing from the client since. As PostgreSQL's idle_session_timeout, it
        does not apply inside a transaction.
        """
        if self.closed:
            return
        timeout = self.config.client_idle_timeout
        now = time.monotonic()
        since = max(self._last_client, self._ready_at)
        idle = self._is_idle()
        if idle and now - since >= timeout:
            if self.upstream is not None and self.pool_conn is None:
                self.upstream.write(messages.message(b"X"))  # a clean Terminate for the backend (a pooled one is reset)
            self._fail_client("57P05", "terminating connection due to idle-session timeout",
                              reason="client_idle_timeout")
            return
        delay = since + timeout - now if idle else timeout
        asyncio.get_running_loop().call_later(max(delay, 0.01), self._idle_check)

    def drain(self, grace: float, idle: bool) -> None:
        """The seat drains: a connection still in its handshake gets ``grace`` seconds to send its startup packet;
        with ``idle`` (shutdown_mode "idle") the session ends once idle outside a transaction for ``grace``."""
        if self.closed:
            return
        if self.major is None:
            asyncio.get_running_loop().call_later(grace, self._drain_startup_check)
        if idle:
            self.end_when_idle(grace, "57P01", "terminating connection because openwop-seat is shutting down",
                               "seat draining: idle")

    def _drain_startup_check(self) -> None:
        if not self.closed and self.major is None:  # connected but never sent a startup packet
            self.close("seat draining")

    def end_when_idle(self, grace: float, sqlstate: str, text: str, reason: str) -> None:
        """End the session with a FATAL ``sqlstate`` once it has been idle outside a transaction for ``grace``
        seconds: at once if it is already, else at a later ReadyForQuery (a transaction or a statement in progress
        finishes first)."""
        if self.closed or (self._ending is not None and self._ending[0] <= grace):
            return
        self._ending = (grace, sqlstate, text, reason)
        self._ending_check()

    def _ending_timer_fired(self) -> None:
        self._ending_timer = None
        self._ending_check()

    def _ending_check(self) -> None:
        if self.closed or self._ending is None or not self._is_idle():
            return  # not idle: the next ReadyForQuery looks again
        grace, sqlstate, text, reason = self._ending
        now = time.monotonic()
        since = max(self._last_client, self._ready_at)
        if now - since >= grace:
            if self.upstream is not None and self.pool_conn is None:
                self.upstream.write(messages.message(b"X"))  # a clean Terminate for the backend (a pooled one is reset)
            self._fail_client(sqlstate, text, reason=reason)
        elif self._ending_timer is None:
            self._ending_timer = asyncio.get_running_loop().call_later(max(since + grace - now, 0.01),
                                                                       self._ending_timer_fired)

    def _fail_client(self, sqlstate: str, text: str, reason: str | None = None) -> None:
        """Send a FATAL ErrorResponse where the protocol allows one, then end the session."""
        if not self.closed and self._upstream_at_boundary():
            self.client.write(messages.error_response(sqlstate, text, severity="FATAL"))
        if not self.closed:
            if self.upstream is None:  # turned away before it was relayed
                self.server.stats.connections_refused[
                    "startup_timeout" if reason == "startup timeout" else "query_wait_timeout"
                    if reason == "query_wait_timeout" else REFUSED_REASONS.get(sqlstate, sqlstate)] += 1
            if sqlstate in BY_SQLSTATE:
                self._log_refusal(sqlstate, "")
        self.server.stats.count_refusal(sqlstate)
        self.close(reason or f"{sqlstate} {text}")

    def end_now(self, sqlstate: str, text: str, reason: str) -> None:
        """End the session at once with a FATAL ``sqlstate`` (where the protocol allows one: else the connection
        just closes, and the server rolls back what the session had in progress)."""
        if not self.closed:
            self._fail_client(sqlstate, text, reason=reason)

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
        if self._seat_key is not None:
            self.server.pool.drop_cancel_key(*self._seat_key)
        conn = self.pool_conn
        # A pooled backend this session relays on goes back to its pool (reset, or closed). One still connecting or
        # being handed over is the handshake's to give back, when its await returns.
        if conn is not None and self.upstream is not None and conn.peer is self.upstream:
            self.pool_conn = None
            clean = self._pool_clean()  # before anything of the session is torn down
            self.upstream.sink = None
            self.upstream.on_pause = None
            self.client.on_pause = None
            conn.params = dict(self.relay.state.server_params) if self.relay is not None else conn.params
            self.server.pool.give_back(conn, clean, reason)
            self.upstream = None
        if self.upstream is not None:
            self.upstream.sink = None
            self.upstream.close()
        self.client.sink = None
        self.client.close()
        if self.major is not None:  # a session that got past startup
            self.server.open_sessions -= 1
            if self.server.config.log_disconnections and log.isEnabledFor(INFO):
                event(log, INFO, "session end", self._log_fields(
                    reason=reason, duration_s=round(time.monotonic() - self.started, 3),
                    bytes_in=self.bytes_in, bytes_out=self.bytes_out))
        self.server.stats.bytes_in += self.bytes_in
        self.server.stats.bytes_out += self.bytes_out
        if self.raw_simple or self.raw_extended:
            self.server.stats.statements["passthrough", "simple"] += self.raw_simple
            self.server.stats.statements["passthrough", "extended"] += self.raw_extended
        if self.reader is not None:
            self.server.stats.statements_refused.update(self.reader.refusals)
            self.reader.close()
        if self.relay is not None and self.relay.transactions:
            self.server.stats.pair_transactions[self.label_pair] += self.relay.transactions
        if self._claim_timer is not None:
            self._claim_timer.cancel()
        if self._ending_timer is not None:
            self._ending_timer.cancel()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
        try:  # the listener's bookkeeping of this session ends after this callback, as a future's callback would
            asyncio.get_running_loop().call_soon(self.server.session_ended, self)
        except RuntimeError:  # no event loop running (never while the seat serves)
            self.server.session_ended(self)

    # ------------------------------------------------------------------ metrics and refusal logs

    def _log_refusal(self, sqlstate: str, kind: str) -> None:
        """One line per OpenWOP refusal (never the statement's text or its parameters)."""
        if not log.isEnabledFor(INFO):
            return
        fields = self._log_fields(code=BY_SQLSTATE[sqlstate].code, sqlstate=sqlstate)
        if kind:
            fields["kind"] = kind
        event(log, INFO, "refusal", fields)

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


@functools.lru_cache(maxsize=8)
def _max_owed(buffer_limit: int) -> int:
    """Session._max_owed: one int object for the sessions of a config, not one each."""
    return max(buffer_limit // OWED_BYTES, 64)


def _upstream_reason(message: str) -> str:
    """A short label for an UpstreamUnavailable message (metrics)."""
    if message.startswith("timeout"):
        return "timeout"
    if "TLS" in message:
        return "tls"
    return "connect"


# The state of a session whose startup packet is not read yet.
_NO_STATE = SessionState()


_POOL: list = []


def _analysis_pool():
    """The worker thread long statements are parsed in (one per process: at most one parse competes with the event
    loop for the interpreter, which pglast releases while its C parser runs)."""
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        _POOL.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="openwop-seat-analysis"))
    return _POOL[0]


# A test hook (tests/integration/test_analysis_off_loop.py), never set in production: a directory where the analysis
# thread, before each analysis, creates "held" and then waits until "release" exists, so that a test can show that
# other sessions are answered while a statement is being analysed, without timing anything.
HOLD_ANALYSIS_ENV = "OPENWOP_SEAT_TEST_HOLD_ANALYSIS"


def _analyse(classifier, sql: str):
    import os

    gate = os.environ.get(HOLD_ANALYSIS_ENV)
    if gate:
        from pathlib import Path

        Path(gate, "held").write_text(str(len(sql)))
        release = Path(gate, "release")
        deadline = time.monotonic() + 120
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return classifier.analyse(sql)


def _set_reading(peer: Peer, on: bool) -> None:
    transport = peer.transport
    if transport is None or transport.is_closing():
        return
    if on:
        transport.resume_reading()
    else:
        transport.pause_reading()
