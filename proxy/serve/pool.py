"""Pooled server connections (`[pool]`, ADR 0016): claimed backends kept after their client leaves, reset, and handed
to the next client of the same pool.

A pool is keyed on (database, user, major, every other startup parameter): a backend is never handed to a client of
another user or major, and a client gets a backend whose session defaults are exactly those its own startup packet
asks for (``DISCARD ALL`` resets every setting to the values of the startup packet that opened the backend).

Life of a :class:`ServerConn`: *active* (a session relays on it; the first one authenticated it with PostgreSQL and
claimed it), then, when its client leaves idle outside a transaction, *released*: waiting, at most
``server_reset_delay``, for the next client of its pool, who takes it and has it reset while it computes its SCRAM
proof (at one client a connect is serial, and the reset's round trip and the backend's work on it are then off the
connect's path: ADR 0016's addendum "the reset waits for the next client"). A released backend nobody takes in time,
or that speaks, or that a client took and gave back without a hand-over, is *reset* on its own. The reset is
``DISCARD ALL`` and ``SELECT openwop_seat.session_major()`` pipelined, one round trip; then *idle* if it succeeded and
the claim still is the pool's major, else closed. An idle one is handed over (*active* again, no claim: the claim
belongs to the backend; its claim checked again first unless its reset was less than ``server_check_delay`` ago)
after the next client proved its password to the seat (:mod:`proxy.serve.scram`), or closed by
``server_idle_timeout`` / ``server_lifetime``, or when anything arrives from it while idle (a backend whose claim
another session took is ended by the claims triggers: its FATAL).

Every pooled session gets a cancel key made by the seat: the backend's own key never reaches a client, so that a
former client cannot cancel the statements of the next one (:meth:`Pool.cancel_target`).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import secrets
import struct
import time
from typing import TYPE_CHECKING, NamedTuple

from proxy.config import Config, ConfigError
from proxy.serve.scram import load_auth_file, scram_keys
from proxy.wire import messages
from proxy.wire.framer import HOLD_ALL, Framer
from proxy.wire.types import (
    COMMAND_COMPLETE,
    DATA_ROW,
    NOTICE_RESPONSE,
    NOTIFICATION_RESPONSE,
    PARAMETER_STATUS,
    READY_FOR_QUERY,
    ROW_DESCRIPTION,
)

if TYPE_CHECKING:
    from proxy.serve.context import SeatView
    from proxy.serve.peer import Peer
log = logging.getLogger("openwop_seat.pool")

# One round trip: two simple Query messages in one write (DISCARD ALL cannot run in the implicit transaction of a
# multi-statement Query). The function is schema-qualified: a search_path cannot put another one in its place.
CHECK = messages.query("SELECT openwop_seat.session_major()")
RESET = messages.query("DISCARD ALL") + CHECK
# What the reset's answer may hold besides its own results: notices, and notifications of a LISTEN it ends.
_RESET_MESSAGES = frozenset((COMMAND_COMPLETE, DATA_ROW, NOTICE_RESPONSE, NOTIFICATION_RESPONSE, PARAMETER_STATUS,
                             READY_FOR_QUERY, ROW_DESCRIPTION))

_ids = itertools.count(1)

# The states of a server connection no session holds (a released one is the pool's until a hand-over takes it).
UNATTACHED = frozenset(("released", "reset", "check", "idle"))

# How long an answer of pool.auth_query is kept (a password changed in PostgreSQL reaches hand-overs within it).
AUTH_QUERY_SECONDS = 60.0
# What became of a cancel request a client sent this process: sent as a live pooled session's backend key, sent
# by another worker that holds the session (proxy.workers > 1), or forwarded as it came.
CANCEL_RESULTS = ("mapped", "routed", "forwarded")


class PoolKey(NamedTuple):
    database: str
    user: str
    major: int
    params: tuple[tuple[str, str], ...]  # every other startup parameter, sorted


class PoolWaitTimeout(Exception):
    """No server connection of a full pool was free within pool.query_wait_timeout."""


class ServerConn:
    """One backend of a pool."""

    __slots__ = ("id", "key", "peer", "pid", "backend_key", "params", "created", "idle_since", "checked_at", "state",
                 "session", "reset_owed", "_pool", "_timer", "_framer", "_readies", "_expect", "_major_seen", "_error",
                 "_checked")

    def __init__(self, pool: "Pool", key: PoolKey):
        self.id = next(_ids)
        self._pool = pool
        self.key = key
        self.peer: Peer | None = None  # None until its first session connected it
        self.pid: int | None = None
        self.backend_key: bytes | None = None
        self.params: dict[str, str] = {}  # the ParameterStatus values current on the backend
        self.created = time.monotonic()
        self.idle_since = 0.0
        self.checked_at = 0.0  # when its claim was last found the pool's major (its reset, or a check)
        self.state = "active"  # "active", "released", "reset", "check", "idle", "closed"
        self.session = None
        self.reset_owed = False  # taken released, for a hand-over: reset before it (Pool.reset_for_hand_over)
        self._timer: asyncio.TimerHandle | None = None
        self._framer: Framer | None = None
        self._readies = 0
        self._expect = 0  # the ReadyForQuery messages the reset (2) or the check before a hand-over (1) ends with
        self._major_seen: bytes | None = None
        self._error: str | None = None
        # the check or reset a hand-over waits for: True when the backend may be handed over
        self._checked: asyncio.Future | None = None

    @property
    def closed(self) -> bool:
        return self.state == "closed"

    def _on_lost(self, peer, exc) -> None:
        if self.state in UNATTACHED:
            self._pool._close(self, "lost" if self.state == "reset" else None,
                              f"server connection lost while {self.state}")

    def _released_data(self, data: bytes) -> None:
        # What a released backend says is the last client's (a notification of its LISTEN) or a FATAL: the reset
        # starts now and reads it first, as the answer to a reset sent at once would have held it.
        self._pool._reset_now(self, data)

    def _idle_data(self, data: bytes) -> None:
        # An idle backend has nothing to say (its LISTENs ended with the reset): a FATAL of an administrator's
        # pg_terminate_backend, or anything else, and it is not handed out.
        self._pool._close(self, None, "server connection sent data while idle")

    def _reset_data(self, data: bytes) -> None:
        framer = self._framer
        for item in framer.feed(data):
            t, body = item[1], item[2]
            if t not in _RESET_MESSAGES:
                if self._error is None:
                    fields = messages.parse_error_fields(body) if t == ord("E") else {}
                    self._error = f"{chr(t)} {fields.get('C', '')} {fields.get('M', '')}".strip()
                continue
            if t == PARAMETER_STATUS:
                name, value = messages.parse_parameter_status(body)
                self.params[name] = value
            elif t == DATA_ROW:
                values = messages.parse_data_row(body)
                self._major_seen = values[0] if len(values) == 1 else b"?"
            elif t == READY_FOR_QUERY:
                self._readies += 1
                if body[:1] != b"I" and self._error is None:
                    self._error = f"transaction status {body[:1]!r} after the reset"
        if framer.violation is not None:
            self._pool._close(self, "error", f"reset answered with an invalid message: {framer.violation.message}")
        elif self._readies == self._expect:
            self._reset_done()

    def _exchange(self, payload: bytes, readies: int) -> None:
        """Send the reset (or the check) and read its answer with :meth:`_reset_data`."""
        self._framer = Framer(HOLD_ALL)
        self._readies = 0
        self._expect = readies
        self._major_seen = None
        self._error = None
        self.peer.owner = self
        self.peer.sink = ServerConn._reset_data
        self._timer = asyncio.get_running_loop().call_later(self._pool.server.config.connect_timeout,
                                                            self._reset_timed_out)
        self.peer.write(payload)

    def _reset_done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._framer = None
        check = self.state == "check"
        what = "check before hand-over" if check else "reset"
        if self._error is not None:
            self._pool._close(self, "error", f"{what} failed: {self._error}", check=check)
        elif self._major_seen != str(self.key.major).encode():
            seen = self._major_seen.decode(errors="replace") if self._major_seen is not None else "NULL"
            self._pool._close(self, "claim lost", f"{what}: the backend's claim is {seen}, not the pool's major "
                                                  f"{self.key.major}: closed, never handed out", check=check)
        else:
            self.checked_at = time.monotonic()
            waiter = self._checked
            if waiter is not None and not waiter.done():  # a hand-over waits for this check or reset
                self._checked = None
                self.state = "active"
                self.peer.sink = None
                (self._pool.checks if check else self._pool.resets)["ok"] += 1
                waiter.set_result(True)
            else:
                self._pool._became_idle(self)

    def _reset_timed_out(self) -> None:
        self._timer = None
        if self.state in ("reset", "check"):
            self._pool._close(self, "timeout", f"{self.state} not answered within proxy.connect_timeout",
                              check=self.state == "check")


class Pool:
    """The pools of one seat process: their server connections, the waiting clients, the seat's cancel keys."""

    def __init__(self, server: "SeatView"):
        self.server = server
        self.secrets: dict[str, str] = {}  # user -> SCRAM-SHA-256 verifier (pool.auth_file)
        # pool.auth_query's answers: user -> (verifier or None, monotonic time asked); and the lookups in flight
        self._queried: dict[str, tuple[str | None, float]] = {}
        self._asking: dict[str, asyncio.Future] = {}
        self.servers: set[ServerConn] = set()  # every server connection of every pool, open or connecting
        self.idle: dict[PoolKey, collections.deque[ServerConn]] = {}
        self._count: collections.Counter[PoolKey] = collections.Counter()
        self._db_count: collections.Counter[str] = collections.Counter()
        self._waiters: dict[str, collections.deque[asyncio.Future]] = {}  # by database
        self.cancels: dict[tuple[int, bytes], object] = {}  # (seat pid, seat key) -> the session it names
        # metrics
        self.resets: collections.Counter[str] = collections.Counter()  # by result
        self.checks: collections.Counter[str] = collections.Counter()  # the checks before a hand-over, by result
        self.cancel_results: collections.Counter[str] = collections.Counter()  # CANCEL_RESULTS
        self.hand_overs = 0
        self.hand_over_resets = 0  # resets run for the hand-over that took a released backend
        self.waits = 0
        self.wait_seconds = 0.0
        self.closed_by: collections.Counter[str] = collections.Counter()  # server connections closed, by why

    # ------------------------------------------------------------------ configuration

    @staticmethod
    def load_secrets(config: Config) -> dict[str, str]:
        """The SCRAM-SHA-256 verifiers of pool.auth_file (at start and at each reload). A user whose line holds an
        md5 hash or a password in plain text is not pooled: the seat checks only what PostgreSQL's SCRAM would."""
        if not config.pool.enabled or config.pool.auth_file is None:
            return {}
        entries = load_auth_file(config.pool.auth_file, "pool.auth_file")
        out = {}
        for user, secret in entries.items():
            if secret.startswith("SCRAM-SHA-256$"):
                if scram_keys(secret) is None:
                    raise ConfigError(f"pool.auth_file: the SCRAM-SHA-256 secret of {user!r} is malformed")
                out[user] = secret
        return out

    def verifier(self, user: str) -> str | None:
        """The user's verifier as known now: pool.auth_file's, else pool.auth_query's last answer (while fresh)."""
        found = self.secrets.get(user)
        if found is None:
            known = self._queried.get(user)
            if known is not None and time.monotonic() - known[1] < AUTH_QUERY_SECONDS:
                found = known[0]
        return found

    async def lookup(self, user: str) -> str | None:
        """The user's SCRAM-SHA-256 verifier: pool.auth_file's, else pool.auth_query's, run on the seat's own
        connection (host.dsn) and kept AUTH_QUERY_SECONDS. None (not pooled) for a user the query does not know, a
        secret that is not a SCRAM verifier, or a query that fails (logged)."""
        found = self.verifier(user)
        sql = self.server.config.pool.auth_query
        if found is not None or sql is None or user in self.secrets:
            return found
        known = self._queried.get(user)
        if known is not None and time.monotonic() - known[1] < AUTH_QUERY_SECONDS:
            return known[0]
        asking = self._asking.get(user)
        if asking is None:  # one lookup per user at a time; the others wait for its answer
            asking = self._asking[user] = asyncio.ensure_future(self._ask(sql, user))
            asking.add_done_callback(lambda f: self._asking.pop(user, None))
        return await asyncio.shield(asking)

    async def _ask(self, sql: str, user: str) -> str | None:
        try:
            secret = await self.server.catalog.run(lambda conn: conn.fetchval(sql, user))
        except Exception as e:  # not pooled while the query fails: relayed to PostgreSQL, which authenticates
            log.warning("pool.auth_query failed: the user's sessions are not pooled", extra={"fields": {
                "user": user, "error": f"{type(e).__name__}: {e}"[:300]}})
            return None
        verifier = secret if isinstance(secret, str) and scram_keys(secret) is not None else None
        if len(self._queried) >= 1000:  # a bound: the users that connect are few
            self._queried.clear()
        self._queried[user] = (verifier, time.monotonic())
        return verifier

    def forget_queried(self) -> None:
        """A reload: pool.auth_query's answers are asked again."""
        self._queried.clear()

    @staticmethod
    def key_for(params: dict[str, str], major: int) -> PoolKey:
        rest = tuple(sorted((k, v) for k, v in params.items() if k not in ("user", "database")))
        return PoolKey(params["database"], params["user"], major, rest)

    # ------------------------------------------------------------------ taking and giving back

    async def acquire(self, key: PoolKey) -> ServerConn:
        """An idle server connection of ``key`` (``peer`` set: to hand over), or a new one to connect (``peer`` None,
        its place in the pool's limits taken). Waits while the pool or its database is full."""
        config = self.server.config.pool
        started = None
        while True:
            conn = await self.take_idle(key)
            if conn is not None:
                self.hand_overs += 1
                self._waited(started)
                return conn
            db_full = 0 < config.max_db_connections <= self._db_count[key.database]
            if self._count[key] < config.pool_size and db_full:
                # The database is full but this pool is not: an idle connection of another of its pools makes room.
                other = self._oldest_idle(key.database)
                if other is not None:
                    self._close(other, None, "max_db_connections")
                    db_full = False
            if self._count[key] < config.pool_size and not db_full:
                conn = ServerConn(self, key)
                self.servers.add(conn)
                self._count[key] += 1
                self._db_count[key.database] += 1
                self._waited(started)
                return conn
            if started is None:
                started = time.monotonic()
                self.waits += 1
            future = asyncio.get_running_loop().create_future()
            waiters = self._waiters.setdefault(key.database, collections.deque())
            waiters.append(future)
            timeout = config.query_wait_timeout or None
            left = None if timeout is None else timeout - (time.monotonic() - started)
            try:
                if left is not None and left <= 0:
                    raise asyncio.TimeoutError
                await asyncio.wait_for(asyncio.shield(future), left)
            except asyncio.TimeoutError:
                self._waited(started)
                raise PoolWaitTimeout(f"no server connection free in pool ({key.database}, {key.user}, major "
                                      f"{key.major}) within pool.query_wait_timeout ({timeout:g} s)") from None
            finally:
                if future in waiters:
                    waiters.remove(future)

    async def take_idle(self, key: PoolKey) -> ServerConn | None:
        """An idle (or released) server connection of ``key`` to hand over, its claim checked first when its last
        check is ``server_check_delay`` old; None when the pool has none."""
        config = self.server.config.pool
        while True:
            idle = self.idle.get(key)
            if not idle:
                return None
            conn = idle.pop()  # the most recently used: the others age out by server_idle_timeout
            if not idle:
                del self.idle[key]  # no empty deque kept per key (application names vary)
            if self._expired(conn):
                self._close(conn, None, "server_lifetime")
                continue
            self._cancel_timer(conn)
            if conn.state == "released":
                # Its last client left a moment ago: reset (and its claim checked) for this hand-over, once the
                # client has sent its first SCRAM message (reset_for_hand_over).
                conn.state = "active"
                conn.peer.sink = None
                conn.reset_owed = True
            elif time.monotonic() - conn.checked_at < config.server_check_delay:
                # Its claim was found right a moment ago (its reset). A claim another session takes while it is
                # idle ends the backend (the claims triggers), and the pool closes it when its FATAL arrives.
                conn.state = "active"
                conn.peer.sink = None
                self.checks["skipped"] += 1
            else:
                # The claim is checked again before the hand-over (one round trip on a warm backend): a backend
                # that died or lost its claim unseen while idle is closed instead.
                conn.state = "check"
                conn._checked = asyncio.get_running_loop().create_future()
                conn._exchange(CHECK, 1)
                try:
                    if not await conn._checked:
                        continue
                except asyncio.CancelledError:  # the client's startup timed out meanwhile
                    self._close(conn, None, "hand-over cancelled")
                    raise
            return conn

    async def reset_for_hand_over(self, conn: ServerConn) -> bool:
        """The reset a backend taken released owes (none owed: True at once), run while the client computes its SCRAM
        proof; True when it may be handed over. A reset that fails closes the backend, as one run on release would."""
        if not conn.reset_owed:
            return True
        conn.reset_owed = False
        if conn.closed:
            return False
        self.hand_over_resets += 1
        conn._checked = asyncio.get_running_loop().create_future()
        self._start_reset(conn, None)
        if conn.closed:  # what it had said since it was taken ended it
            return False
        try:
            return await conn._checked
        except asyncio.CancelledError:  # the client's startup timed out meanwhile
            self._close(conn, None, "hand-over cancelled")
            raise

    def _waited(self, started: float | None) -> None:
        if started is not None:
            self.wait_seconds += time.monotonic() - started

    def _oldest_idle(self, database: str) -> ServerConn | None:
        found = None
        for key, idle in self.idle.items():
            if key.database == database and idle and (found is None or idle[0].idle_since < found.idle_since):
                found = idle[0]
        return found

    def _expired(self, conn: ServerConn) -> bool:
        lifetime = self.server.config.pool.server_lifetime
        return lifetime > 0 and time.monotonic() - conn.created >= lifetime

    def put_back(self, conn: ServerConn) -> None:
        """A connection taken for a hand-over that did not happen (the client failed the seat's authentication or
        left during it): nothing of a client ran on it. Idle again as it was; one taken released (its reset owed, not
        started) is reset now."""
        if conn.closed:
            return
        conn.session = None
        if conn.reset_owed:  # taken released: the reset it owes, now
            conn.reset_owed = False
            self._start_reset(conn, None)
            return
        if conn.peer.lost or conn.peer.buffer:  # it went away, or spoke, while the client authenticated
            self._close(conn, None, "server connection lost during a hand-over")
            return
        self._became_idle(conn, hand_over=False)

    def give_back(self, conn: ServerConn, clean: bool, why: str) -> None:
        """Its session ended: released for the next client when ``clean`` (the client left idle outside a
        transaction, nothing pending), else closed (the server rolls back what the session left). A released
        backend is reset when the next client takes it, or after ``server_reset_delay`` if none does."""
        conn.session = None
        if conn.closed:
            return
        if conn.peer is None or conn.peer.lost:
            self._close(conn, None, why)
            return
        if not clean:
            self._close(conn, None, why)
            return
        if self._expired(conn):
            self._close(conn, None, "server_lifetime")
            return
        peer = conn.peer
        peer.owner = conn
        peer.on_lost = ServerConn._on_lost
        peer.on_pause = None
        peer.on_eof = None
        if peer.transport is not None and not peer.transport.is_closing():
            peer.transport.resume_reading()
        delay = self.server.config.pool.server_reset_delay
        if delay <= 0:
            self._start_reset(conn, None)
            return
        conn.state = "released"
        conn.idle_since = time.monotonic()
        peer.sink = ServerConn._released_data
        conn._timer = asyncio.get_running_loop().call_later(delay, self._reset_now, conn)
        self.idle.setdefault(conn.key, collections.deque()).append(conn)
        self._wake(conn.key.database)

    def _reset_now(self, conn: ServerConn, data: bytes | None = None) -> None:
        """A released backend reset on its own: nobody took it within server_reset_delay, or it spoke (``data``)."""
        if conn.state != "released":
            return
        self._cancel_timer(conn)
        self._unlist(conn)
        self._start_reset(conn, data)

    def _start_reset(self, conn: ServerConn, data: bytes | None) -> None:
        """Send the reset, then read what the backend said since it was released (``data``, or what its peer
        holds) as the start of its answer."""
        conn.state = "reset"
        conn._exchange(RESET, 2)
        peer = conn.peer
        if peer.buffer:
            data = bytes(peer.buffer) + (data or b"")
            peer.buffer = b""
        if data:
            conn._reset_data(data)

    def forget(self, conn: ServerConn) -> None:
        """A connection that never got a backend (its connect failed, or its client left first)."""
        if not conn.closed:
            self._close(conn, None, "not connected", count=False)

    def _became_idle(self, conn: ServerConn, hand_over: bool = True) -> None:
        if hand_over:
            self.resets["ok"] += 1
        conn.state = "idle"
        conn.idle_since = time.monotonic()
        conn.peer.owner = conn
        conn.peer.sink = ServerConn._idle_data
        conn.peer.on_lost = ServerConn._on_lost
        config = self.server.config.pool
        delays = [d for d in (config.server_idle_timeout,
                              config.server_lifetime - (conn.idle_since - conn.created) if config.server_lifetime
                              else 0) if d > 0]
        if delays:
            conn._timer = asyncio.get_running_loop().call_later(max(min(delays), 0.001), self._idle_expired, conn)
        self.idle.setdefault(conn.key, collections.deque()).append(conn)
        self._wake(conn.key.database)

    def _idle_expired(self, conn: ServerConn) -> None:
        conn._timer = None
        if conn.state == "idle":
            self._close(conn, None, "server_lifetime" if self._expired(conn) else "server_idle_timeout")

    @staticmethod
    def _cancel_timer(conn: ServerConn) -> None:
        if conn._timer is not None:
            conn._timer.cancel()
            conn._timer = None

    def _close(self, conn: ServerConn, reset_result: str | None, why: str, count: bool = True,
               check: bool = False) -> None:
        if conn.closed:
            return
        if conn._checked is not None and not conn._checked.done():
            conn._checked.set_result(False)  # the hand-over that waits for its check takes another one
        if conn.state == "check":
            check = True
        if reset_result is not None:
            (self.checks if check else self.resets)[reset_result] += 1
            level = logging.WARNING if reset_result == "claim lost" else logging.INFO
            log.log(level, "pooled server connection closed", extra={"fields": {
                "database": conn.key.database, "user": conn.key.user, "major": conn.key.major, "pid": conn.pid,
                "why": why}})
        if count:
            self.closed_by[reset_result or why.split(":")[0]] += 1
        self._unlist(conn)
        self._cancel_timer(conn)
        conn.state = "closed"
        conn.session = None
        self.servers.discard(conn)
        self._count[conn.key] -= 1
        if self._count[conn.key] <= 0:
            del self._count[conn.key]
        self._db_count[conn.key.database] -= 1
        if self._db_count[conn.key.database] <= 0:
            del self._db_count[conn.key.database]
        peer = conn.peer
        if peer is not None:
            peer.sink = None
            peer.on_lost = None
            peer.write(messages.terminate())
            peer.close()
        self._wake(conn.key.database)

    def _unlist(self, conn: ServerConn) -> None:
        idle = self.idle.get(conn.key)
        if idle is not None and conn in idle:
            idle.remove(conn)
            if not idle:
                del self.idle[conn.key]

    def _wake(self, database: str) -> None:
        waiters = self._waiters.get(database)
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                return

    def close_all(self) -> None:
        """The seat stops: every connection no session holds closed (active ones end with their sessions)."""
        for conn in list(self.servers):
            if conn.state in UNATTACHED:
                self._close(conn, None, "seat stopping")

    # ------------------------------------------------------------------ cancel keys

    def issue_cancel_key(self, session, length: int = 4) -> tuple[int, bytes]:
        """A BackendKeyData of the seat's for a pooled session: (pid, secret key), registered until it ends."""
        while True:
            pid = secrets.randbelow(0x7FFFFFFF) + 1
            key = secrets.token_bytes(max(length, 4))
            if (pid, key) not in self.cancels:
                self.cancels[(pid, key)] = session
                return pid, key

    def drop_cancel_key(self, pid: int, key: bytes) -> None:
        self.cancels.pop((pid, key), None)

    def cancel_target(self, pid: int, key: bytes) -> bytes | None:
        """The CancelRequest to send PostgreSQL for a seat-issued key: the backend's own, for the backend the session
        it names is on now; None when the key is not one this process issued to a live session. Counts nothing:
        the caller knows whether the cancel came from a client or from another worker."""
        session = self.cancels.get((pid, key))
        conn = session.pool_conn if session is not None and not session.closed else None
        if conn is None or conn.pid is None or conn.backend_key is None:
            return None
        return messages.cancel_request(conn.pid, conn.backend_key)

    # ------------------------------------------------------------------ what the admin console and metrics read

    def counts(self) -> dict[tuple[str, str, int, str], int]:
        """Server connections by (database, user, major, state)."""
        out: collections.Counter = collections.Counter()
        for conn in self.servers:
            out[(conn.key.database, conn.key.user, conn.key.major, "login" if conn.peer is None else conn.state)] += 1
        return dict(out)


def seat_key_data(pid: int, key: bytes) -> bytes:
    return messages.message(b"K", struct.pack("!i", pid) + key)


AUTH_OK = messages.message(b"R", struct.pack("!I", 0))
READY_IDLE = messages.ready_for_query(b"I")
# The middle of a hand-over's login, by the backend's ParameterStatus values (name, value pairs in order): a pool's
# backends report the same values, so a hand-over finds its bytes made; a value that changed (the reset reported
# it, or the last client's session did) is another key, so stale bytes are never sent.
_LOGIN_STATUS: dict[tuple[tuple[str, str], ...], bytes] = {}
LOGIN_STATUS_KEPT = 64  # distinct sets of values kept (a bound: application names and settings vary per pool)


def login_status(params: dict[str, str]) -> bytes:
    """AuthenticationOk and one ParameterStatus message per value of ``params``, encoded once per distinct set of
    values (what a hand-over sends between the SCRAM exchange's last message and its BackendKeyData)."""
    key = tuple(params.items())
    found = _LOGIN_STATUS.get(key)
    if found is None:
        found = AUTH_OK + b"".join(messages.message(b"S", name.encode() + b"\x00" + value.encode() + b"\x00")
                                   for name, value in key)
        if len(_LOGIN_STATUS) >= LOGIN_STATUS_KEPT:
            _LOGIN_STATUS.clear()
        _LOGIN_STATUS[key] = found
    return found
