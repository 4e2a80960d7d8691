"""The admin view: a read-only console on its own listener, spoken in the PostgreSQL protocol (as PgBouncer's).

`[admin] listen` and/or `[admin] unix_socket`; off by default. A client connects with any user and database
and no password (AuthenticationOk at once: only listen where the operator alone can connect), gets a few
ParameterStatus messages and ReadyForQuery, and may send simple Query messages only: ``SHOW SESSIONS``,
``SHOW CACHES``, ``SHOW STATE`` (alias ``SHOW CLAIMS``), ``SHOW VERSION``, ``SHOW CONFIG`` and
``SHOW HELP``, each answered with text rows. Any other message ends the connection with an ErrorResponse;
an unknown command gets an ErrorResponse and the console stays ready. Nothing here changes the seat.
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable

from proxy import __version__
from proxy.config import config_keys
from proxy.readpath.classify import PASSED_BYTES
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


class AdminView:
    """The SHOW commands over what the listener holds; each returns (columns, rows)."""

    def __init__(self, server: "SeatView"):
        self.server = server
        self.commands: dict[str, tuple[Callable[[], Rows], str]] = {
            "sessions": (self.sessions, "one row per client session: who, where, its major, backend, state, "
                                        "bytes"),
            "caches": (self.caches, "the classifier plan caches (per reader major) and the prepared statements"),
            "state": (self.state, "the writer rule in force or why not, the claim secret, the read context"),
            "claims": (self.state, "the same as SHOW STATE"),
            "version": (self.version, "the seat's version, its spec artifacts and schema layout"),
            "config": (self.config, "the running configuration, one key a row; passwords redacted"),
            "help": (self.help, "this list"),
        }

    def run(self, sql: str) -> Rows | None:
        words = sql.strip().rstrip(";").split()
        if len(words) == 2 and words[0].lower() == "show" and words[1].lower() in self.commands:
            return self.commands[words[1].lower()][0]()
        return None

    def sessions(self) -> Rows:
        columns = ["id", "client", "user", "database", "application_name", "major", "backend_pid", "state", "tls",
                   "bytes_in", "bytes_out", "started"]
        rows = []
        for s in sorted(self.server.sessions, key=lambda s: s.id):
            if s.closed:
                continue
            if s.major is None:
                state = "startup"
            else:
                st = s.state
                state = st.phase.value if st.phase.value != "ready" else _TXN.get(st.txn_status, "ready")
            params = s.params
            rows.append([s.id, s.client_addr, params.get("user"), params.get("database"),
                         params.get("application_name", ""), s.major, s.state.backend_pid, state, s.client_tls,
                         s.bytes_in, s.bytes_out, _wall(s.started)])
        return columns, rows

    def caches(self) -> Rows:
        columns = ["cache", "major", "entries", "bytes", "capacity_bytes", "hits", "misses"]
        rows: list[list[object]] = []
        ctx = self.server.read_context
        if ctx is not None:
            for major, c in sorted(ctx.classifiers.items()):
                rows.append(["plan", major, c.size, c.bytes, c.cache_bytes, c.hits, c.misses])
            for major, c in sorted(ctx.classifiers.items()):
                rows.append(["passthrough", major, c.passed_entries, c.passed_bytes, PASSED_BYTES, None, None])
        prepared = sum(len(s.reader.prepared) for s in self.server.sessions if not s.closed and s.reader is not None)
        rows.append(["prepared_statements", None, prepared, None, None, None, None])
        return columns, rows

    def state(self) -> Rows:
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
        rows = [["writer_rule", writer], ["claim_secret", secret], ["read_context", read],
                ["accepting", "no (draining or stopping)" if getattr(server, "_draining", False)
                 else "no (paused: SIGUSR1)" if getattr(server, "paused", False) else "yes"],
                ["sessions", len(live)],
                ["privileged_sessions", sum(server.stats.privileged_sessions.values())]]
        return ["key", "value"], rows

    def version(self) -> Rows:
        from proxy.db.layout import LAYOUT_VERSION

        ctx = self.server.read_context
        artifacts = ctx.artifacts if ctx is not None else None
        return (["version", "artifact_tag", "artifact_digest", "layout_version"],
                [[__version__, getattr(artifacts, "tag", "") or "", getattr(artifacts, "digest", "") or "",
                  LAYOUT_VERSION]])

    def config(self) -> Rows:
        rows = []
        for key, value in config_keys(self.server.config).items():
            if key == "proxy.clients":
                value = "; ".join(", ".join(f"{k}={getattr(rule, k)}" for k in
                                            ("user", "database", "application_name", "major")
                                            if getattr(rule, k) is not None) for rule in value)
            elif hasattr(value, "__dataclass_fields__") or value is None:
                value = "" if value is None else str(value)
            rows.append([key, redact(key, value)])
        return ["key", "value"], rows

    def help(self) -> Rows:
        return ["command", "description"], [[f"SHOW {name.upper()}", text]
                                           for name, (_, text) in self.commands.items()]


class AdminConsole:
    """The admin listeners: TCP ([admin] listen) and/or a Unix socket ([admin] unix_socket)."""

    def __init__(self, server: "SeatView"):
        self.view = AdminView(server)
        self._servers: list[asyncio.AbstractServer] = []
        self.unix_socket: str | None = None

    @property
    def port(self) -> int | None:
        for srv in self._servers:
            name = srv.sockets[0].getsockname()
            if isinstance(name, tuple):
                return name[1]
        return None

    async def start(self, listen, unix_socket: str | None) -> None:
        from proxy.errors import ListenError

        if listen is not None:
            try:
                self._servers.append(await asyncio.start_server(self._handle, listen.host, listen.port,
                                                                reuse_address=True))
            except OSError as e:
                raise ListenError("admin.listen", listen, e) from None
        if unix_socket is not None:
            import os

            if os.path.exists(unix_socket):
                os.unlink(unix_socket)  # a file left by a seat that died: the config names it for this seat
            try:
                self._servers.append(await asyncio.start_unix_server(self._handle, unix_socket))
            except OSError as e:
                raise ListenError("admin.unix_socket", unix_socket, e) from None
            os.chmod(unix_socket, 0o700)  # the seat's own user only: there is no password
            self.unix_socket = unix_socket

    async def close(self) -> None:
        for srv in self._servers:
            srv.close()
        self._servers = []
        if self.unix_socket is not None:
            import os

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
        except (asyncio.TimeoutError, EOFError, ConnectionError, ProtocolViolation):
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
            out = [messages.message(b"R", struct.pack("!I", 0))]  # AuthenticationOk: no password
            for name, value in (("server_version", f"15.0 (openwop-seat {__version__} admin)"),
                                ("server_encoding", "UTF8"), ("client_encoding", "UTF8"), ("DateStyle", "ISO, MDY"),
                                ("integer_datetimes", "on"), ("standard_conforming_strings", "on"),
                                ("application_name", params.get("application_name", ""))):
                out.append(messages.message(b"S", name.encode() + b"\x00" + value.encode() + b"\x00"))
            out.append(messages.ready_for_query())
            writer.write(b"".join(out))
            log.info("admin connection", extra={"fields": {"user": params.get("user", "")}})
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
            writer.write(self.answer(body.rstrip(b"\x00").decode("utf-8", "replace")))
            await writer.drain()

    def answer(self, sql: str) -> bytes:
        """The reply to one Query: a result per statement, or an error, then ReadyForQuery."""
        statements = [s for s in sql.split(";") if s.strip()]
        if not statements:
            return messages.message(b"I") + messages.ready_for_query()
        out = []
        for statement in statements:
            rows = self.view.run(statement)
            if rows is None:
                out.append(messages.error_response(
                    "42601", f"unknown admin command: {statement.strip()[:80]}",
                    detail="The admin console answers SHOW SESSIONS, CACHES, STATE, CLAIMS, VERSION, CONFIG, HELP."))
                break
            out.append(result(*rows))
        out.append(messages.ready_for_query())
        return b"".join(out)


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
