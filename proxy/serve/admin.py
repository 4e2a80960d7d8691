"""The admin console, spoken in the PostgreSQL protocol, with PgBouncer's commands (ADR 0014).

`[admin] listen` and/or `[admin] unix_socket`; off by default, and never open: an admin user named in
``admin.users`` logs in with SCRAM-SHA-256 (or md5) against its secret in ``admin.auth_file`` (PgBouncer's
userlist.txt format), unless ``admin.auth = "trust"`` on a Unix socket alone. It then sends simple Query
messages only: SHOW CLIENTS / SERVERS / POOLS / STATS (PgBouncer's columns where they mean something here),
SHOW SESSIONS / CACHES / STATE / VERSION / CONFIG / HELP, PAUSE, RESUME, RELOAD, KILL, WAIT_CLOSE, SHUTDOWN.

Three parts: :class:`ProcessCommands`, what one seat process answers (its sessions, its pause, its reload);
the merge of the answers of every process (one, or each worker's when the supervisor runs the console); and
:class:`AdminConsole`, the listeners, the login and the protocol.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
import secrets
import struct
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable

from proxy import __version__
from proxy.config import Config, ConfigError, changed_keys, config_keys
from proxy.readpath.classify import PASSED_BYTES
from proxy.serve.pool import UNATTACHED
from proxy.serve.scram import (  # noqa: F401 (load_auth_file, scram_secret: the console's names too)
    ScramServer,
    is_md5,
    load_auth_file,
    scram_keys,
    scram_secret,
)
from proxy.wire import messages
from proxy.wire.codec import (
    CancelRequest,
    GSSENCRequest,
    ProtocolViolation,
    SSLRequest,
    StartupMessage,
    parse_initial_packet,
)

if TYPE_CHECKING:
    from proxy.serve.context import SeatView

log = logging.getLogger("openwop_seat.admin")

TEXT_OID = 25
MAX_MESSAGE = 1 << 20  # an admin query is a few words: a longer message ends the connection
STARTUP_TIMEOUT = 10.0

Rows = tuple[list[str], list[list[object]]]


def _row_description(columns: list[str]) -> bytes:
    body = struct.pack("!h", len(columns))
    for name in columns:  # text, no table: name, table oid, attnum, type oid, typlen, typmod, format
        body += name.encode() + b"\x00" + struct.pack("!IhIhih", 0, 0, TEXT_OID, -1, -1, 0)
    return messages.message(b"T", body)


def _data_row(values: list[object]) -> bytes:
    body = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            body += struct.pack("!i", -1)
        else:
            data = (("t" if value else "f") if isinstance(value, bool) else str(value)).encode()
            body += struct.pack("!i", len(data)) + data
    return messages.message(b"D", body)


def result(columns: list[str], rows: list[list[object]]) -> bytes:
    out = [_row_description(columns), *(_data_row(r) for r in rows)]
    out.append(messages.message(b"C", f"SHOW {len(rows)}".encode() + b"\x00"))
    return b"".join(out)


def _complete(tag: str) -> bytes:
    return messages.message(b"C", tag.encode() + b"\x00")


def redact(key: str, value: object) -> object:
    """A configuration value as the admin view shows it: passwords in a DSN are replaced."""
    if key == "host.dsn" and isinstance(value, str):
        value = re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1<redacted>", value, flags=re.I)
        value = re.sub(r"^([a-z]+://[^:/@]*):[^@/]*@", r"\1:<redacted>@", value, flags=re.I)
    return value


def _wall(monotonic_at: float) -> str:
    """A time.monotonic() instant as RFC 3339 wall-clock time with milliseconds (UTC)."""
    wall = time.time() - (time.monotonic() - monotonic_at)
    return datetime.fromtimestamp(wall, timezone.utc).isoformat(timespec="milliseconds")


_TXN = {b"I": "idle", b"T": "in transaction", b"E": "in failed transaction"}


class AdminError(Exception):
    """A command refused: sent to the admin client as an ErrorResponse, the console stays ready."""

    def __init__(self, sqlstate: str, message: str, detail: str | None = None):
        super().__init__(message)
        self.sqlstate, self.message, self.detail = sqlstate, message, detail


# ------------------------------------------------------------------ what one seat process answers

CLIENT_COLUMNS = ["type", "user", "database", "state", "addr", "port", "local_addr", "local_port", "connect_time",
                  "request_time", "wait", "wait_us", "close_needed", "tls", "application_name",
                  "prepared_statements", "id", "major", "held"]
SERVER_COLUMNS = ["type", "user", "database", "state", "addr", "port", "local_addr", "local_port", "connect_time",
                  "request_time", "wait", "wait_us", "close_needed", "remote_pid", "tls", "application_name", "id",
                  "link"]
POOL_COLUMNS = ["database", "user", "cl_active", "cl_waiting", "sv_active", "sv_idle", "sv_used", "sv_login",
                "maxwait", "maxwait_us", "pool_mode"]
STATS_COLUMNS = ["database", "total_xact_count", "total_query_count", "total_received", "total_sent",
                 "avg_xact_count", "avg_query_count", "avg_recv", "avg_sent"]
STATS_PERIOD = 60.0  # seconds: PgBouncer's stats_period, over which SHOW STATS's avg_* are per-second rates


def _split_addr(transport, key: str) -> tuple[object, object]:
    name = transport.get_extra_info(key) if transport is not None else None
    if isinstance(name, tuple):
        return name[0], name[1]
    return "unix", None


def _tls_version(transport) -> str:
    obj = transport.get_extra_info("ssl_object") if transport is not None else None
    return obj.version() if obj is not None else ""


class ProcessCommands:
    """What one seat process answers: its rows, or the outcome of an action on its sessions (JSON-able values,
    so that a worker can send them to the supervisor)."""

    def __init__(self, server: "SeatView"):
        self.server = server
        # SHOW STATS's averages: the totals at the start of the current period, and the rates of the last one
        self._period_start: tuple[float, dict[str, list[int]]] = (time.monotonic(), {})
        self._period_rates: dict[str, list[int]] | None = None
        self.handlers: dict[str, Callable] = {
            "clients": self.clients, "servers": self.servers, "pools": self.pools, "stats": self.stats,
            "sessions": self.sessions, "caches": self.caches, "state": self.state, "version": self.version,
            "config": self.config,
        }

    async def run(self, command: str, arg: str = "") -> object:
        server = self.server
        if command in self.handlers:
            return self.handlers[command]()
        if command == "pause":
            try:
                return await server.hold_sessions()
            except RuntimeError as e:
                raise AdminError("57014", f"PAUSE ended: {e}") from None
        if command == "resume":
            return await server.release_sessions()
        if command == "kill":
            return server.kill(arg)
        if command == "wait_close":
            return await server.wait_close()
        if command == "shutdown":  # a worker's part of SHUTDOWN WAIT_FOR_CLIENTS / WAIT_FOR_SERVERS
            server.admin_action(arg)
            return 0
        if command == "reload":
            ok = await server.reload()
            return {"ok": ok, "error": server.last_reload_error}
        raise AdminError("42601", f"unknown command {command}")

    async def local(self, command: str, arg: str = "") -> list[tuple[int | None, object]]:
        """The console's executor in a single process: this process's answer."""
        return [(None, await self.run(command, arg))]

    def _live(self):
        return sorted((s for s in self.server.sessions if not s.closed), key=lambda s: s.id)

    def _wait(self, s) -> tuple[int, int]:
        if not s.waiting:
            return 0, 0
        waited = time.monotonic() - s.held_since
        return int(waited), int((waited % 1) * 1_000_000)

    def _close_needed(self, s) -> int:
        config = self.server.config
        return int(s.config is not config and bool(changed_keys(s.config, config)))

    def clients(self) -> list:
        rows = []
        for s in self._live():
            transport = s.client.transport
            addr, port = _split_addr(transport, "peername")
            local_addr, local_port = _split_addr(transport, "sockname")
            wait, wait_us = self._wait(s)
            state = "login" if s.major is None else "waiting" if s.waiting else "active"
            rows.append(["C", s.params.get("user"), s.params.get("database"), state, addr, port, local_addr,
                         local_port, _wall(s.started), _wall(s._last_client), wait, wait_us, self._close_needed(s),
                         _tls_version(transport), s.params.get("application_name", ""),
                         len(s.reader.prepared) if s.reader is not None else 0, s.id, s.major, s.held])
        return rows

    def servers(self) -> list:
        rows = []
        up = self.server.config.upstream
        for s in self._live():
            if s.upstream is None or s.upstream.lost:
                continue
            transport = s.upstream.transport
            addr, port = _split_addr(transport, "peername")
            local_addr, local_port = _split_addr(transport, "sockname")
            state = "active" if s.state.phase.value not in ("startup", "authenticating") else "login"
            wait, wait_us = self._wait(s)
            rows.append(["S", s.params.get("user"), s.params.get("database"), state,
                         addr if addr != "unix" else str(up.host), port if port is not None else up.port,
                         local_addr, local_port, _wall(s.started), _wall(s._ready_at), wait, wait_us,
                         self._close_needed(s), s.state.backend_pid, _tls_version(transport),
                         s.params.get("application_name", ""), s.id, s.id])
        # Pooled server connections no session is on ([pool], ADR 0016): idle, or released, or being reset or
        # checked ("used", as PgBouncer's state of a server connection that waits for its check). Their id is the
        # negative of the pool's own number for them, and they have no link.
        for conn in sorted(self.server.pool.servers, key=lambda c: c.id):
            if conn.state not in UNATTACHED or conn.peer is None or conn.peer.transport is None:
                continue
            transport = conn.peer.transport
            addr, port = _split_addr(transport, "peername")
            local_addr, local_port = _split_addr(transport, "sockname")
            rows.append(["S", conn.key.user, conn.key.database, "idle" if conn.state == "idle" else "used",
                         addr if addr != "unix" else str(up.host), port if port is not None else up.port,
                         local_addr, local_port, _wall(conn.created), _wall(conn.idle_since or conn.created), 0, 0,
                         0, conn.pid, _tls_version(transport), dict(conn.key.params).get("application_name", ""),
                         -conn.id, None])
        return rows

    def pools(self) -> list:
        pools: dict[tuple, list] = {}
        for s in self._live():
            if s.major is None:
                continue
            row = pools.setdefault((s.params.get("database"), s.params.get("user")), [0, 0, 0, 0, 0, 0, 0, 0])
            row[1 if s.waiting else 0] += 1
            if s.upstream is not None and not s.upstream.lost:
                row[2 if s.state.phase.value not in ("startup", "authenticating") else 5] += 1
            wait, wait_us = self._wait(s)
            if (wait, wait_us) > (row[6], row[7]):
                row[6], row[7] = wait, wait_us
        for conn in self.server.pool.servers:  # pooled server connections no session is on (ADR 0016)
            if conn.state in UNATTACHED:
                row = pools.setdefault((conn.key.database, conn.key.user), [0, 0, 0, 0, 0, 0, 0, 0])
                row[3 if conn.state == "idle" else 4] += 1
        return [[db, user, *row[:6], row[6], row[7], "session"] for (db, user), row in sorted(pools.items())]

    def stats(self) -> list:
        totals = {db: list(v) for db, v in self.server.closed_totals.items()}
        for s in self._live():
            if s.major is None:
                continue
            t = totals.setdefault(s.label_pair[0], [0, 0, 0, 0])
            relay = s.relay
            t[0] += relay.transactions if relay is not None else 0
            t[1] += relay.queries_sent if relay is not None else 0
            t[2] += s.bytes_in
            t[3] += s.bytes_out
        rates = self._rates(totals)
        return [[db, *t, *rates.get(db, (0, 0, 0, 0))] for db, t in sorted(totals.items())]

    def _rates(self, totals: dict[str, list[int]]) -> dict[str, list[int]]:
        """Per second, per database: over the last completed period of at least STATS_PERIOD (a period ends at
        the first SHOW STATS after STATS_PERIOD has passed), or over the current one before the first ends.
        Counters only grow while the process lives, so a rate is never negative."""
        now = time.monotonic()
        started, before = self._period_start
        elapsed = max(now - started, 1e-3)
        current = {db: [round((v - b) / elapsed) for v, b in zip(t, before.get(db, (0, 0, 0, 0)))]
                   for db, t in totals.items()}
        if elapsed >= STATS_PERIOD:
            self._period_rates, self._period_start = current, (now, {db: list(t) for db, t in totals.items()})
        return self._period_rates if self._period_rates is not None else current

    def sessions(self) -> list:
        rows = []
        for s in self._live():
            if s.major is None:
                state = "startup"
            elif s.held:
                state = "held (PAUSE)"
            else:
                st = s.state
                state = st.phase.value if st.phase.value != "ready" else _TXN.get(st.txn_status, "ready")
            params = s.params
            rows.append([s.id, s.client_addr, params.get("user"), params.get("database"),
                         params.get("application_name", ""), s.major, s.state.backend_pid, state, s.client_tls,
                         s.bytes_in, s.bytes_out, _wall(s.started)])
        return rows

    def caches(self) -> list:
        rows: list[list[object]] = []
        ctx = self.server.read_context
        if ctx is not None:
            # a major's classifier and its strict twin (ADR 0019) added up
            got = {a: dict(ctx.summed(a))
                   for a in ("size", "bytes", "hits", "misses", "passed_entries", "passed_bytes")}
            for major, c in sorted(ctx.classifiers.items()):
                rows.append(["plan", major, got["size"][major], got["bytes"][major], c.cache_bytes,
                             got["hits"][major], got["misses"][major]])
            for major in sorted(ctx.classifiers):
                rows.append(["passthrough", major, got["passed_entries"][major], got["passed_bytes"][major],
                             PASSED_BYTES, None, None])
        prepared = sum(len(s.reader.prepared) for s in self.server.sessions if not s.closed and s.reader is not None)
        rows.append(["prepared_statements", None, prepared, None, None, None, None])
        return rows

    def state(self) -> list:
        server = self.server
        ctx = server.read_context
        if ctx is None:
            writer = "not checked: no major translates (every session is relayed as is)"
        elif server.writer_rule_broken:
            writer = f"not in force: {server.writer_rule_broken}"
        else:
            writer = "in force (the last check found it as migrate installed it)"
        if server.claim_secret is not None:
            secret = "present: sessions on the host database are claimed"
        elif ctx is None:
            secret = "not used: no major translates"
        else:
            secret = "absent: no session is claimed, every session writes as a v1 writer"
        if ctx is None:
            read = "not loaded: every major is raw"
        else:
            artifacts = ctx.artifacts
            read = (f"loaded: database {ctx.database}, events table {server.config.host.events_table}, artifacts "
                    f"{getattr(artifacts, 'tag', '')} {getattr(artifacts, 'digest', '')}")
            if ctx.first_boot:  # docs/operations.md#first-boot
                read += f"; first boot: {ctx.first_boot} (sessions not claimed, event rows refused)"
        live = [s for s in server.sessions if not s.closed and s.major is not None]
        accepting = ("no (draining or stopping)" if getattr(server, "_draining", False)
                     else "no (paused: PAUSE)" if getattr(server, "holding", False)
                     else "no (paused: SIGUSR1)" if getattr(server, "paused", False) else "yes")
        return [["writer_rule", writer], ["claim_secret", secret], ["read_context", read], ["accepting", accepting],
                ["sessions", len(live)], ["held_sessions", sum(1 for s in live if s.held)],
                ["privileged_sessions", sum(server.stats.privileged_sessions.values())]]

    def version(self) -> list:
        from proxy.db.layout import LAYOUT_VERSION

        ctx = self.server.read_context
        artifacts = ctx.artifacts if ctx is not None else None
        return [[__version__, getattr(artifacts, "tag", "") or "", getattr(artifacts, "digest", "") or "",
                 LAYOUT_VERSION]]

    def config(self) -> list:
        rows = []
        for key, value in config_keys(self.server.config).items():
            if key == "proxy.clients":
                value = "; ".join(", ".join(f"{k}={getattr(rule, k)}" for k in
                                            ("user", "database", "application_name", "major")
                                            if getattr(rule, k) is not None) for rule in value)
            elif key == "admin.users":
                value = ", ".join(value)
            elif hasattr(value, "__dataclass_fields__") or value is None:
                value = "" if value is None else str(value)
            rows.append([key, redact(key, value)])
        return rows


# ------------------------------------------------------------------ the answers of every process, merged

# SHOW <name>: the columns, whether each process's rows are simply listed (True) or summed by key, and the help line.
SHOW = {
    "clients": (CLIENT_COLUMNS, "one row per client connection (PgBouncer's columns; state waiting: held by PAUSE "
                                "with a statement waiting)"),
    "servers": (SERVER_COLUMNS, "one row per upstream connection: one per session, and the pooled ones no session "
                                "is on ([pool])"),
    "pools": (POOL_COLUMNS, "per database and user: clients active and waiting, upstream connections"),
    "stats": (STATS_COLUMNS, "per database (bounded as metrics.database_user_labels): transactions, statements, "
                             "bytes, since start"),
    "sessions": (["id", "client", "user", "database", "application_name", "major", "backend_pid", "state", "tls",
                  "bytes_in", "bytes_out", "started"],
                 "one row per client session: who, where, its major, backend, state, bytes"),
    "caches": (["cache", "major", "entries", "bytes", "capacity_bytes", "hits", "misses"],
               "the classifier plan caches (per reader major) and the prepared statements"),
    "state": (["key", "value"], "the writer rule in force or why not, the claim secret, the read context"),
    "claims": (["key", "value"], "the same as SHOW STATE"),
    "version": (["version", "artifact_tag", "artifact_digest", "layout_version"],
                "the seat's version, its spec artifacts and schema layout"),
    "config": (["key", "value"], "the running configuration, one key a row; passwords redacted"),
    "help": (["command", "description"], "this list"),
}
ACTIONS = [
    ("PAUSE", "hold every session at its next transaction boundary and stop accepting; returns once all are held"),
    ("RESUME", "release the held sessions and accept again (also after SIGUSR1)"),
    ("RELOAD", "re-read the configuration file and the artifacts, as SIGHUP"),
    ("KILL <id> | <database>", "end a session (the id of SHOW CLIENTS) or every session on a database"),
    ("KILL", "end every session"),
    ("KILL_CLIENT <id>", "end the session with that id"),
    ("WAIT_CLOSE", "wait until the sessions started before the last RELOAD that changed something have ended"),
    ("SHUTDOWN", "stop at once, as SIGINT: every session ends with 57P01"),
    ("SHUTDOWN WAIT_FOR_CLIENTS", "drain as SIGTERM with shutdown_mode drain: exit once every client has left"),
    ("SHUTDOWN WAIT_FOR_SERVERS", "drain as SIGTERM with shutdown_mode idle: each session ends at its next idle "
                                  "moment"),
    ("SUSPEND", "not supported: a rolling restart uses SO_REUSEPORT (docs/operations.md#rolling-restart)"),
]


def _sum_by(results, key_len: int, maxed: tuple[int, ...] = ()) -> list:
    merged: dict[tuple, list] = {}
    for _, rows in results:
        for row in rows:
            key = tuple(row[:key_len])
            if key not in merged:
                merged[key] = list(row)
                continue
            into = merged[key]
            if maxed and tuple(row[i] for i in maxed) > tuple(into[i] for i in maxed):
                for i in maxed:
                    into[i] = row[i]
            for i in range(key_len, len(row)):
                if i not in maxed and isinstance(row[i], int) and not isinstance(row[i], bool):
                    into[i] += row[i]
    return [merged[k] for k in sorted(merged, key=lambda k: tuple(str(x) for x in k))]


def merge_show(name: str, results: list[tuple[int | None, object]]) -> Rows:
    """One SHOW answer over every process: listed (clients, servers, sessions: ids are unique across workers),
    summed by key (pools, stats), or one set of rows per worker with a worker column (caches, state, version,
    config: with more than one process)."""
    columns = list(SHOW[name][0])
    if name in ("clients", "servers", "sessions"):
        id_at = columns.index("id")
        return columns, sorted((row for _, rows in results for row in rows), key=lambda r: r[id_at])
    if name == "pools":
        return columns, _sum_by(results, 2, maxed=(8, 9))
    if name == "stats":
        return columns, _sum_by(results, 1)
    if len(results) == 1 and results[0][0] is None:
        return columns, list(results[0][1])
    return columns + ["worker"], [[*row, worker] for worker, rows in results for row in rows]


# ------------------------------------------------------------------ login: admin.users, admin.auth_file

def check_auth(config: Config) -> dict[str, str]:
    """The admin users' secrets for ``config`` (at start and at each reload): every user of admin.users has one,
    of a kind admin.auth can check (an md5 secret cannot answer SCRAM)."""
    if config.admin_auth == "trust" or config.admin_auth_file is None:
        return {}
    entries = load_auth_file(config.admin_auth_file)
    out = {}
    for user in config.admin_users:
        if user not in entries:
            raise ConfigError(f"admin.users: {user!r} has no line in admin.auth_file {config.admin_auth_file!r}")
        secret = entries[user]
        if is_md5(secret) and config.admin_auth != "md5":
            raise ConfigError(f"admin.auth_file: the secret of {user!r} is an md5 hash, which cannot answer "
                              f"{config.admin_auth}: give a SCRAM-SHA-256 secret or set admin.auth = \"md5\"")
        if secret.startswith("SCRAM-SHA-256$") and scram_keys(secret) is None:
            raise ConfigError(f"admin.auth_file: the SCRAM-SHA-256 secret of {user!r} is malformed")
        out[user] = secret
    return out


class LoginFailed(Exception):
    pass


# ------------------------------------------------------------------ the console


class AdminConsole:
    """The admin listeners: TCP ([admin] listen) and/or a Unix socket ([admin] unix_socket), the login and the
    commands. ``execute(command, arg)`` returns every process's answer, [(worker id or None, answer)];
    ``action("now" | "drain")`` stops the seat (SHUTDOWN)."""

    def __init__(self, config: Config, execute: Callable, action: Callable[[str], None]):
        self.config = config
        self.execute = execute
        self.action = action
        self.secrets: dict[str, str] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self.unix_socket: str | None = None

    @staticmethod
    def check_auth(config: Config) -> dict[str, str]:
        return check_auth(config)

    def set_auth(self, config: Config, secrets_: dict[str, str] | None) -> None:
        """A reload: new admin users and secrets for the next logins (the listeners need a restart)."""
        self.config = config
        self.secrets = secrets_ or {}

    @property
    def port(self) -> int | None:
        for srv in self._servers:
            name = srv.sockets[0].getsockname()
            if isinstance(name, tuple):
                return name[1]
        return None

    async def start(self) -> None:
        from proxy.errors import ListenError

        self.secrets = check_auth(self.config)  # before listening: a bad auth file stops the start
        listen, unix_socket = self.config.admin_listen, self.config.admin_unix_socket
        if listen is not None:
            try:
                self._servers.append(await asyncio.start_server(self._handle, listen.host, listen.port,
                                                                reuse_address=True))
            except OSError as e:
                raise ListenError("admin.listen", listen, e) from None
        if unix_socket is not None:
            if os.path.exists(unix_socket):
                os.unlink(unix_socket)  # a file left by a seat that died: the config names it for this seat
            try:
                self._servers.append(await asyncio.start_unix_server(self._handle, unix_socket))
            except OSError as e:
                raise ListenError("admin.unix_socket", unix_socket, e) from None
            os.chmod(unix_socket, 0o700)  # the seat's own user only
            self.unix_socket = unix_socket

    async def close(self) -> None:
        for srv in self._servers:
            srv.close()
        self._servers = []
        if self.unix_socket is not None:
            try:
                os.unlink(self.unix_socket)
            except OSError:
                pass
            self.unix_socket = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(reader)
        try:
            if await asyncio.wait_for(self._startup(conn, writer), STARTUP_TIMEOUT):
                await self._serve(conn, writer)
        except (asyncio.TimeoutError, EOFError, ConnectionError, ProtocolViolation, LoginFailed):
            pass
        except Exception:  # a bug must end this connection only
            log.exception("admin connection failed")
        finally:
            writer.close()

    async def _startup(self, conn: "_Conn", writer: asyncio.StreamWriter) -> bool:
        while True:
            parsed = parse_initial_packet(conn.buf)
            while parsed is None:
                await conn.more()
                parsed = parse_initial_packet(conn.buf)
            packet, used = parsed
            del conn.buf[:used]
            if isinstance(packet, (SSLRequest, GSSENCRequest)):
                writer.write(b"N")  # plaintext only: the console listens where only the operator reaches it
                continue
            if isinstance(packet, CancelRequest):
                return False
            assert isinstance(packet, StartupMessage)
            params = dict(packet.params)
            user = params.get("user", "")
            await self._login(conn, writer, user)
            out = [messages.message(b"R", struct.pack("!I", 0))]  # AuthenticationOk
            for name, value in (("server_version", f"15.0 (openwop-seat {__version__} admin)"),
                                ("server_encoding", "UTF8"), ("client_encoding", "UTF8"), ("DateStyle", "ISO, MDY"),
                                ("integer_datetimes", "on"), ("standard_conforming_strings", "on"),
                                ("application_name", params.get("application_name", ""))):
                out.append(messages.message(b"S", name.encode() + b"\x00" + value.encode() + b"\x00"))
            out.append(messages.ready_for_query())
            writer.write(b"".join(out))
            log.info("admin connection", extra={"fields": {"user": user}})
            return True

    async def _login(self, conn: "_Conn", writer: asyncio.StreamWriter, user: str) -> None:
        """admin.users with their secrets (SCRAM-SHA-256, or md5 where admin.auth allows it), or trust. A user
        who is not an admin user goes through the same exchange and fails the same way."""
        config = self.config
        if config.admin_auth == "trust":
            if config.admin_users and user not in config.admin_users:
                self._refuse(writer, user, "28000", f'user "{user}" is not an admin user (admin.users)')
            return
        secret = self.secrets.get(user) if user in config.admin_users else None
        md5 = config.admin_auth == "md5" and (secret is None or not secret.startswith("SCRAM-SHA-256$"))
        ok = await (self._md5(conn, writer, user, secret) if md5 else self._scram(conn, writer, secret))
        if not ok:
            self._refuse(writer, user, "28P01", f'password authentication failed for user "{user}"')

    def _refuse(self, writer: asyncio.StreamWriter, user: str, sqlstate: str, text: str) -> None:
        log.warning("admin login refused", extra={"fields": {"user": user, "sqlstate": sqlstate}})
        writer.write(messages.error_response(sqlstate, text, severity="FATAL"))
        raise LoginFailed

    @staticmethod
    async def _password_message(conn: "_Conn") -> bytes:
        head = await conn.take(5)
        length = struct.unpack("!i", head[1:])[0]
        if head[:1] != b"p" or length < 4 or length > 65536:
            raise ProtocolViolation("expected a password message")
        return await conn.take(length - 4)

    async def _md5(self, conn, writer, user: str, secret: str | None) -> bool:
        salt = secrets.token_bytes(4)
        writer.write(messages.message(b"R", struct.pack("!I", 5) + salt))
        answer = (await self._password_message(conn)).rstrip(b"\x00").decode("ascii", "replace")
        if secret is None:
            return False
        stored = secret if is_md5(secret) else "md5" + hashlib.md5((secret + user).encode()).hexdigest()
        expected = "md5" + hashlib.md5(stored[3:].encode() + salt).hexdigest()
        return hmac.compare_digest(answer, expected)

    async def _scram(self, conn, writer, secret: str | None) -> bool:
        exchange = ScramServer(secret)  # the exchange is proxy/serve/scram.py's, shared with pooled sessions
        writer.write(exchange.start())
        writer.write(exchange.client_first(await self._password_message(conn)))
        final = exchange.client_final(await self._password_message(conn))
        if final is None:
            return False
        writer.write(final)
        return True

    async def _serve(self, conn: "_Conn", writer: asyncio.StreamWriter) -> None:
        while True:
            head = await conn.take(5)
            t, (length,) = head[:1], struct.unpack("!i", head[1:])
            if length < 4 or length > MAX_MESSAGE:
                writer.write(messages.error_response("08P01", "invalid message length", severity="FATAL"))
                return
            body = await conn.take(length - 4)
            if t == b"X":
                return
            if t != b"Q":
                writer.write(messages.error_response(
                    "0A000", "the openwop-seat admin console speaks the simple query protocol only (SHOW HELP)",
                    severity="FATAL"))
                await writer.drain()
                return
            reply, after = await self.answer(body.rstrip(b"\x00").decode("utf-8", "replace"))
            writer.write(reply)
            await writer.drain()
            if after is not None:
                after()

    async def answer(self, sql: str) -> tuple[bytes, Callable[[], None] | None]:
        """The reply to one Query: a result per statement, or an error, then ReadyForQuery; and what to do once it
        is sent (SHUTDOWN)."""
        statements = [s for s in sql.split(";") if s.strip()]
        if not statements:
            return messages.message(b"I") + messages.ready_for_query(), None
        out, after = [], None
        for statement in statements:
            try:
                reply, after = await self.command(statement.split())
            except AdminError as e:
                out.append(messages.error_response(e.sqlstate, e.message, detail=e.detail))
                break
            out.append(reply)
        out.append(messages.ready_for_query())
        return b"".join(out), after

    async def command(self, words: list[str]) -> tuple[bytes, Callable[[], None] | None]:
        verb = words[0].upper()
        args = words[1:]
        if verb == "SHOW" and len(words) == 2 and words[1].lower() in SHOW:
            name = words[1].lower()
            if name == "help":
                rows = [[f"SHOW {n.upper()}", text] for n, (_, text) in SHOW.items()] + [list(a) for a in ACTIONS]
                return result(SHOW["help"][0], rows), None
            name = "state" if name == "claims" else name
            return result(*merge_show(name, await self.execute(name, ""))), None
        if verb in ("PAUSE", "RESUME", "WAIT_CLOSE") and not args:
            answers = await self.execute(verb.lower(), "")
            log.info(f"admin {verb}", extra={"fields": {"sessions": sum(n for _, n in answers)}})
            return _complete(verb), None
        if (verb == "KILL" and len(args) <= 1) or (verb == "KILL_CLIENT" and len(args) == 1):
            target = args[0].strip('"') if args else ""
            if verb == "KILL_CLIENT" and not target.isdigit():
                raise AdminError("22023", f"KILL_CLIENT takes a client id (SHOW CLIENTS), not {target!r}")
            ended = sum(n for _, n in await self.execute("kill", target))
            log.info("admin KILL", extra={"fields": {"target": target or "(all)", "sessions": ended}})
            if ended == 0 and target:
                raise AdminError("42704", f"no session {'with id' if target.isdigit() else 'on database'} {target}")
            return _complete("KILL"), None
        if verb == "RELOAD" and not args:
            answers = await self.execute("reload", "")
            errors = sorted({a["error"] or "rejected" for _, a in answers if not a["ok"]})
            if errors:
                raise AdminError("F0000", "RELOAD rejected, the running configuration stays: " + "; ".join(errors))
            return _complete("RELOAD"), None
        modes = {"WAIT_FOR_CLIENTS": "drain", "WAIT_FOR_SERVERS": "idle"}
        if verb == "SHUTDOWN" and (not args or (len(args) == 1 and args[0].upper() in modes)):
            mode = modes[args[0].upper()] if args else "now"
            log.info("admin SHUTDOWN", extra={"fields": {"mode": mode}})
            return _complete("SHUTDOWN"), lambda: self.action(mode)
        if verb == "SUSPEND" and not args:
            raise AdminError("0A000", "SUSPEND is not supported: it prepares PgBouncer's online restart by socket "
                                      "handover; the seat restarts without it (SO_REUSEPORT)",
                             detail="See docs/operations.md#rolling-restart.")
        raise AdminError("42601", f"unknown admin command: {' '.join(words)[:80]}",
                         detail="SHOW HELP lists the commands.")


class _Conn:
    """What an admin client sent and the console has not read yet."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader
        self.buf = bytearray()

    async def more(self) -> None:
        chunk = await self.reader.read(65536)
        if not chunk:
            raise EOFError
        self.buf += chunk

    async def take(self, n: int) -> bytes:
        while len(self.buf) < n:
            await self.more()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out
