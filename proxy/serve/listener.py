"""The listener: accepts clients, owns the sessions, the TLS contexts, metrics and signals."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
from dataclasses import replace

from proxy.config import RESTART_KEYS, Config, changed_keys, load_config, missing_claim_secret
from proxy.errors import ListenError, describe
from proxy.readpath import read_path
from proxy.readpath.read_path import ReadPath
from proxy.serve.context import (
    RELATION_CHECK_SECONDS,
    CatalogConnection,
    ReadContext,
    RiskyFunctions,
    check_claim_secret,
    database_functions,
    first_boot_events,
    load_read_context,
    relation_state,
)
from proxy.serve.metrics import MetricsHTTP, Stats
from proxy.serve.peer import client_ssl_context, upstream_ssl_context
from proxy.serve.session import Peer, Session
from proxy.wire import framer

log = logging.getLogger("openwop_seat.server")

LISTEN_BACKLOG = 1024
# A drain gives a connection that has not sent its startup packet yet this long to send it (a client that connected
# just before the drain began is served, not dropped); and with shutdown_mode "idle" a session must have been idle
# outside a transaction this long before it is ended (a client about to send its next statement is not cut off).
DRAIN_GRACE_SECONDS = 1.0


def _reload_reason(e: Exception) -> str:
    if (why := describe(e, database="the host database (host.dsn)")) is not None:
        return why
    log.exception("unexpected error during reload")
    return f"unexpected error: {type(e).__name__}: {e}"


class _ClientPeer(Peer):
    """A freshly accepted client socket: starts its session once connected."""

    __slots__ = ("server",)

    def __init__(self, server: "SeatServer"):
        super().__init__()
        self.server = server

    def connection_made(self, transport):  # type: ignore[override]
        super().connection_made(transport)
        self.server._accept(self)


async def start_checks(config: Config) -> tuple[ReadContext, str | None]:
    """What ``serve`` checks before it listens, when some major translates: the claim secret (a ConfigError, before
    connecting, when a major-2 session could not be claimed), the host database (the read context; first boot
    when the events table does not exist yet), and that the secret is the one migrate installed. Run once by the
    supervisor before it starts its workers, so that a seat that cannot start says why once."""
    from proxy.db.claims import load_claim_secret

    secret = load_claim_secret(config)
    if secret is None and (error := missing_claim_secret(config)) is not None:
        raise error
    read_context = await load_read_context(config)
    if secret is not None and not read_context.first_boot:
        await check_claim_secret(config, secret)
    return read_context, secret


class SeatServer:
    def __init__(self, config: Config):
        self.config = config
        self.stats = Stats()
        self.catalog = CatalogConnection(self)  # this process's one connection for its checks of the host database
        self.sessions: set[Session] = set()
        # the sessions past their startup (a major) and not closed: what max_client_conn counts, kept as a count
        # rather than found by a walk over every session at each connect
        self.open_sessions = 0
        self.client_ssl_context = client_ssl_context(config)
        self.upstream_ssl_context = upstream_ssl_context(config)
        self.metrics = MetricsHTTP(self)
        self.unix_socket: str | None = None  # the path clients connect to, with [proxy] unix_socket_dir
        self.admin = None  # the admin console (serve/admin.py), with [admin]
        # The listen sockets (bound and listening from start to stop; TCP first, then the Unix socket) and the
        # servers accepting on them (dups of the sockets): SIGUSR1 closes the servers only, so new connections wait
        # in the kernel's backlog.
        self._sockets: list[socket.socket] = []
        self._servers: list[asyncio.AbstractServer] = []
        self.paused = False
        # The admin console's PAUSE: sessions are held at their transaction boundaries until RESUME (serve/admin.py)
        self.holding = False
        self._held_changed = asyncio.Event()
        self.closed_totals: dict[str, list[int]] = {}  # SHOW STATS: per database label, the ended sessions' counts
        self.last_reload_error = ""
        self._started = False
        self._stopped = asyncio.Event()
        self._draining = False
        self._tasks: set[asyncio.Task] = set()
        self.read_context: ReadContext | None = None
        self.claim_secret: str | None = None  # None: sessions are not claimed, every writer is v1
        self.claim_salt: str | None = None  # learnt from the first challenge (ADR 0013)
        self.upstream_pooler = False  # set when a claim sees a pooler behind the seat (ADR 0013)
        self.claim_owners: dict = {}  # user -> (owns openwop_seat, when a claim found it) (ADR 0013)
        from proxy.serve.pool import Pool

        self.pool = Pool(self)  # pooled server connections ([pool], ADR 0016): used while pool.enabled
        self.peers = None  # with workers > 1: the other workers, through the supervisor (supervisor.PeerLink)
        # Set once the link to the supervisor is up: a worker listens before it (a cancel may come in between).
        self.peers_linked = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        # The writer rule as the last runtime check found it (ADR 0006): "" in force, else why not.  While it is
        # not, new sessions on the host database are refused. (At first boot no check runs: writer_rule_broken.)
        self.writer_rule_verdict = ""
        self._checks_done = 0
        self._check_lock = asyncio.Lock()

    async def send_cancel(self, request: bytes, pid: int) -> bool:
        """A CancelRequest sent to PostgreSQL over a new upstream connection; False when it cannot be reached."""
        from proxy.serve.peer import UpstreamUnavailable, open_upstream

        try:
            up = await open_upstream(self, asyncio.get_running_loop())
        except UpstreamUnavailable as e:
            log.warning("cancel request for backend %s not forwarded: %s", pid, e)
            return False
        self.stats.upstream_connections += 1
        up.write(request)
        up.close()
        return True

    async def cancel_for_peer(self, pid: int, key: bytes) -> bool:
        """A cancel request another worker received: sent to PostgreSQL as the backend's own key when the seat-issued
        (pid, key) names a live pooled session of this process (ADR 0016); False, and nothing sent, otherwise."""
        mapped = self.pool.cancel_target(pid, key)
        if mapped is None:
            return False
        await self.send_cancel(mapped, pid)  # this process holds the session: no other worker may send it
        return True

    @property
    def port(self) -> int:
        assert self._sockets
        return self._sockets[0].getsockname()[1]

    @property
    def listening(self) -> bool:
        """Started, and not stopped by a signal while it started."""
        return self._started

    @property
    def writer_rule_broken(self) -> str:
        """Why the writer rule is not in force, or "" (what the admin console's SHOW STATE reports): the last
        runtime check's verdict, and at first boot that no trigger guards the host's tables yet. New sessions are
        refused by the verdict only (writer_rule_refusal): first boot has its own rules (docs/operations.md)."""
        if self.writer_rule_verdict:
            return self.writer_rule_verdict
        if self.first_boot:
            return (f"first boot: the writer rule's triggers are not installed until `openwop-seat migrate` has run "
                    f"({self.first_boot})")
        return ""

    @property
    def first_boot(self) -> str:
        """Why the seat's rules are not in force in the host database yet (first boot), or ""."""
        ctx = self.read_context
        return ctx.first_boot if ctx is not None else ""

    async def start(self) -> None:
        self.pool.secrets = self.pool.load_secrets(self.config)  # a bad pool.auth_file stops the start
        if self.config.translates:
            self.read_context, self.claim_secret = await start_checks(self.config)
            if self.read_context.first_boot:
                log.warning("first boot: the seat's rules are not in force in the host database yet: sessions are "
                            "not claimed and statements that read or write event rows are refused until "
                            "`openwop-seat migrate` has run (see docs/operations.md#first-boot)",
                            extra={"fields": {"why": self.read_context.first_boot}})
            self._spawn(self._watch_relations())
        if self.read_context is not None and self.config.host.check_interval > 0:
            self._spawn(self._check_writer_rule_periodically())
        if self.read_context is not None:  # the heartbeat and the tally of majors (docs/lifecycle.md)
            from proxy.serve.heartbeat import beat_periodically

            self._spawn(beat_periodically(self))
        if self.read_context is not None and self.config.host.store and self.config.host.dsn:
            from proxy.serve.store_filler import fill_forever

            self._spawn(fill_forever(self.catalog, self.stats, lambda: self.config.host.store_fill_interval))
        if self._stopped.is_set():  # stopped by a signal while starting
            return
        # The admin console and the metrics first: once clients can connect, both answer.
        await self._start_admin()
        if self.config.metrics_listen is not None:
            m = self.config.metrics_listen
            try:
                await self.metrics.start(m.host, m.port)
            except OSError as e:
                raise ListenError("metrics.listen", m, e) from None
        self._open_listen_sockets()
        self._open_unix_socket()
        # Only now does any socket listen: a client (or a probe of the TCP port) that gets in has every socket
        # ready, the unix socket's mode set (it listened before its chmod, and after the TCP port, once: a client
        # could meet it missing or with the umask's mode).
        try:
            for sock in self._sockets:
                sock.listen(LISTEN_BACKLOG)
        except OSError as e:
            self._close_sockets()
            raise ListenError("proxy.listen", self.config.listen, e) from None
        # What the seat has built by now (the artifacts, the classifiers, the parser's modules) lives as long as the
        # process: out of the garbage collector's sight, so that a full collection walks only what sessions make.
        gc.collect()
        gc.freeze()
        if not self.paused:
            await self._serve()
        self._started = True
        listen = self.config.listen
        log.info("listening", extra={"fields": {
            "listen": str(listen), "upstream": str(self.config.upstream),
            "metrics": str(self.config.metrics_listen) if self.config.metrics_listen else "off",
            "unix_socket": self.unix_socket or "off",
            "admin": ", ".join(str(a) for a in (self.config.admin_listen, self.config.admin_unix_socket) if a) or "off",
            "client_tls": self.client_ssl_context is not None,
            "upstream_sslmode": self.config.tls.upstream_sslmode,
            "framer": framer.IMPLEMENTATION,  # "c", the compiled core, or "python" (ADR 0018)
            "quiet_read_path": "c" if read_path.QUIET_RUN is not None else "python",  # ADR 0018, second addendum
            **({"paused": True} if self.paused else {})}})
        if framer.IMPLEMENTATION_NOTE:
            log.warning("the pure-Python framer relays this seat's sessions: %s", framer.IMPLEMENTATION_NOTE)
        elif read_path.QUIET_MISSING:
            log.warning("the quiet read path's bookkeeping runs in Python: %s", read_path.QUIET_MISSING)

    def _open_listen_sockets(self) -> None:
        """Bind proxy.listen (every address it resolves to, as asyncio's create_server does); start() makes the
        sockets listen once the unix socket is ready too.

        SO_REUSEPORT when workers share the port (supervisor.py) or proxy.so_reuseport lets another seat bind it
        (a rolling restart)."""
        listen = self.config.listen
        reuse_port = self.config.workers > 1 or self.config.so_reuseport
        try:
            infos = socket.getaddrinfo(listen.host or None, listen.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except OSError as e:
            raise ListenError("proxy.listen", listen, e) from None
        seen = set()
        for family, type_, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, type_, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.setblocking(False)
            except OSError as e:
                sock.close()
                self._close_sockets()
                raise ListenError("proxy.listen", listen, e) from None
            self._sockets.append(sock)

    async def _serve(self) -> None:
        """Accept on the listen sockets (each through a dup, so that closing the server leaves the socket)."""
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            create = loop.create_unix_server if sock.family == socket.AF_UNIX else loop.create_server
            self._servers.append(await create(lambda: _ClientPeer(self), sock=sock.dup(), backlog=LISTEN_BACKLOG))

    def _stop_serving(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()

    def _close_sockets(self) -> None:
        """Stop accepting and close the listen sockets; remove the Unix socket's file."""
        self._stop_serving()
        sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()
        if self.unix_socket is not None and sockets:
            import os

            try:
                os.unlink(self.unix_socket)
            except OSError:
                pass

    async def pause(self) -> None:
        """SIGUSR1: stop accepting new connections (they wait in the kernel's backlog); live sessions go on."""
        if self.paused or self._draining or self._stopped.is_set():
            return
        self.paused = True
        self._stop_serving()
        log.info("paused: new connections wait until SIGUSR2", extra={"fields": {"sessions": len(self.sessions)}})

    async def resume(self) -> None:
        """SIGUSR2: accept again after a pause."""
        if not self.paused or self._draining or self._stopped.is_set():
            return
        self.paused = False
        if self._sockets:
            await self._serve()
        log.info("resumed: accepting connections")

    def _open_unix_socket(self) -> None:
        """[proxy] unix_socket_dir: accept clients on <dir>/.s.PGSQL.<port> too (`psql -h <dir> -p <port>`)."""
        if self.config.unix_socket_dir is None:
            return
        import os

        from proxy.config import unix_socket_path

        path = unix_socket_path(self.config.unix_socket_dir, self.port)
        if os.path.exists(path):  # left by a seat that died, unless one is still serving it
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)
            else:
                raise OSError(f"{path} (proxy.unix_socket_dir) is in use by another process")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.setblocking(False)
            os.chmod(path, 0o777)  # as PostgreSQL's unix_socket_permissions: the database authenticates
        except OSError as e:
            sock.close()
            raise ListenError("proxy.unix_socket_dir", path, e) from None
        self._sockets.append(sock)
        self.unix_socket = path

    async def _start_admin(self) -> None:
        """[admin]: the admin console (serve/admin.py), when configured; with workers > 1 the supervisor runs it."""
        if self.config.admin_listen is None and self.config.admin_unix_socket is None or self.config.workers > 1:
            return
        from proxy.serve.admin import AdminConsole, ProcessCommands

        commands = ProcessCommands(self)
        self.admin = AdminConsole(self.config, commands.local, self.admin_action)
        await self.admin.start()

    def admin_action(self, action: str) -> None:
        """SHUTDOWN from the console of a single process: "now" (as SIGINT), or a drain (as SIGTERM) in shutdown
        mode "drain" (WAIT_FOR_CLIENTS) or "idle" (WAIT_FOR_SERVERS)."""
        if action == "now":
            self.stop_now()
        else:
            self._spawn(self.drain(action))

    # ------------------------------------------------------------------ the console's PAUSE, RESUME, KILL

    async def hold_sessions(self) -> int:
        """PAUSE: stop accepting (as SIGUSR1) and hold every session at its next transaction boundary; return once
        each is held (or ended), with the number held. Raises RuntimeError when RESUME comes first."""
        if self._draining or self._stopped.is_set():
            raise RuntimeError("the seat is shutting down")
        self.holding = True
        await self.pause()
        for session in list(self.sessions):
            session.hold(self._held_changed.set)
        loop = asyncio.get_running_loop()
        while True:
            if not self.holding:
                raise RuntimeError("RESUME came before every session was held")
            waiting = [s for s in self.sessions if not s.pause_ok]
            if not waiting:
                return sum(1 for s in self.sessions if s.held)
            self._held_changed.clear()
            changed = loop.create_task(self._held_changed.wait())
            try:
                await asyncio.wait([changed, *(s.done for s in waiting)], return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()

    async def release_sessions(self) -> int:
        """RESUME: release the held sessions and accept again; the number released."""
        was = self.holding
        self.holding = False
        self._held_changed.set()
        released = 0
        for session in list(self.sessions):
            released += session.held
            session.release()
        if was or self.paused:
            await self.resume()
        return released

    def kill(self, target: str) -> int:
        """KILL: end a session by its id, every session on a database (PgBouncer's KILL db), or every session ("");
        the number ended."""
        ended = 0
        for session in list(self.sessions):
            if session.closed:
                continue
            if (not target or (str(session.id) == target if target.isdigit()
                               else session.params.get("database") == target)):
                if session.upstream is not None and (session.relay is None or session.relay.client_at_boundary):
                    session.upstream.write(b"X\x00\x00\x00\x04")  # a clean Terminate for the backend
                session.end_now("57P01", "terminating connection due to administrator command (openwop-seat KILL)",
                                "admin KILL")
                ended += 1
        return ended

    async def wait_close(self) -> int:
        """WAIT_CLOSE: wait until every session that started under an older configuration (before a RELOAD that
        changed it) has ended; the number waited for."""
        from proxy.config import changed_keys

        old = [s for s in self.sessions if not s.closed and s.config is not self.config
               and changed_keys(s.config, self.config)]
        log.info("WAIT_CLOSE waiting", extra={"fields": {"sessions": len(old)}})
        if old:
            await asyncio.wait([s.done for s in old])
        return len(old)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_relations(self) -> None:
        """Re-read, every RELATION_CHECK_SECONDS, the views over the events table (a view created after start
        is a leak the result check must know), the functions defined in the database (a translated session may
        not call them), and whether the translated relations still match the table (DDL on it after start):
        while they do not, translated statements are refused, never mis-translated. At first boot, whether the
        seat's rules are in force yet (the events table exists and migrate has run)."""

        while True:
            await asyncio.sleep(RELATION_CHECK_SECONDS)
            ctx = self.read_context
            if ctx is None:
                return
            if ctx.first_boot:
                try:
                    await self._watch_first_boot(ctx)
                except Exception as e:  # noqa: BLE001 - the database may be away for a while; look again later
                    log.warning("first boot check failed: %s", e)
                continue
            ev = ctx.watch.events

            async def check(conn):
                # the table and its columns by name, as they are now: a rebuilt table or a column dropped and added
                # again has another oid or attnum than at start, and the leak check must follow it (issue 23)
                now = await first_boot_events(conn, self.config.host) or ev
                state = await relation_state(conn, self.config.host, now.table_oid, now.type_attnum,
                                             now.payload_attnum or None)
                return now, state, await database_functions(conn, self.config.host.events_table)

            try:
                now, (derived, derived_payload, stale), functions = await self.catalog.run(
                    check, timeout=self.config.connect_timeout * 3)
            except Exception as e:  # noqa: BLE001 - the database may be away for a while; keep what we had
                log.warning("relation check failed: %s", e)
                continue
            if stale != ctx.watch.stale:
                (log.error if stale else log.info)("translated relations %s", stale or "match the events table again")
            ctx.watch.stale = stale
            for classifier in ctx.all_classifiers():
                classifier.set_functions(functions)
            located = (now.table_oid, now.type_attnum, now.payload_attnum)
            if located != (ev.table_oid, ev.type_attnum, ev.payload_attnum):
                log.warning("the events table's columns moved since the last check: the leak check follows them",
                            extra={"fields": {"table_oid": now.table_oid, "type_attnum": now.type_attnum,
                                              "payload_attnum": now.payload_attnum}})
            if located != (ev.table_oid, ev.type_attnum, ev.payload_attnum) or derived != ev.derived_oids \
                    or derived_payload != ev.derived_payload_oids:
                ctx.watch.set(replace(ev, table_oid=now.table_oid, type_attnum=now.type_attnum,
                                      payload_attnum=now.payload_attnum, derived_oids=derived,
                                      derived_payload_oids=derived_payload))

    async def _watch_first_boot(self, ctx: ReadContext) -> None:
        """First boot: once the events table exists and `migrate` has run, the seat's rules come into force (the
        full read context, as at start); until then keep the functions and the events table's columns fresh."""
        from proxy.db.connect import connect
        from proxy.db.layout import SchemaError

        try:
            new = await asyncio.wait_for(load_read_context(self.config), self.config.connect_timeout * 3)
            if not new.first_boot and self.claim_secret is not None:
                await check_claim_secret(self.config, self.claim_secret)
        except SchemaError as e:  # the events table exists; the seat's schema does not fit it (yet)
            why = f"the events table exists but the seat's rules are not installed for it: {e}"
            if why != ctx.first_boot:
                log.warning("first boot: waiting for openwop-seat migrate", extra={"fields": {"why": why}})
                ctx.first_boot = why
            conn = await asyncio.wait_for(connect(self.config.host.dsn), self.config.connect_timeout)
            try:
                events = await first_boot_events(conn, self.config.host)
                functions = await database_functions(conn, self.config.host.events_table)
            finally:
                await conn.close()
            for classifier in ctx.all_classifiers():
                classifier.set_functions(functions)
            if events is not None and events != ctx.watch.events:
                ctx.watch.set(events)
            return
        if new.first_boot:  # the events table does not exist yet
            for major, classifier in [*ctx.classifiers.items(), *ctx.strict.items()]:
                known = new.classifiers[major]
                classifier.set_functions(RiskyFunctions(known.functions, known.arities or {}))
            return
        if self.read_context is ctx:
            self._rules_in_force(new)

    def _rules_in_force(self, ctx: ReadContext) -> None:
        """First boot is over: new sessions are claimed and translated; the sessions that started before (unclaimed)
        end: those of major 2 (every event row statement refused) as soon as they are idle outside a transaction,
        those of major 1 (event rows as stored) at once."""
        self.read_context = ctx
        retiring = [s for s in self.sessions if s.first_boot and not s.closed]
        log.warning("the seat's rules are in force in the host database: translating and claiming new sessions",
                    extra={"fields": {"first_boot_sessions_ending": len(retiring)}})
        text = ("terminating connection due to administrator command: openwop-seat's rules came into force in this "
                "database after this session began; reconnect")
        for session in retiring:
            # PostgreSQL's own words and SQLSTATE for a server restart: pools and hosts reconnect on them and log them
            # as such, not as an error of the application
            if session.major == 1:
                # it read event rows as stored: from now on a run can be era 3, so it ends at once, in a transaction
                # too (as at a server restart, the server rolls back what it had in progress)
                session.end_now("57P01", text, "rules came into force")
            else:
                session.end_when_idle(0.0, "57P01", text, "rules came into force")

    async def check_writer_rule(self) -> str:
        """Check that the writer rule is in force as migrate installed it (``verify``: layout, digest,
        triggers present and enabled, the fingerprint of the functions and triggers); "" or why not.

        A database that cannot be reached leaves the last verdict as it was (sessions fail on their own then).
        """
        import asyncpg

        from proxy.db.layout import SchemaError
        from proxy.db.migrate import verify

        ctx = self.read_context
        if ctx is None or ctx.first_boot:
            return ""
        try:
            await self.catalog.run(lambda conn: verify(conn, self.config, ctx.artifacts))
            why = ""
        except SchemaError as e:
            why = str(e)
        except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            self.stats.writer_rule_checks["error"] += 1
            log.warning("writer rule check: host database (host.dsn) unreachable: %s", e)
            return self.writer_rule_verdict
        self.stats.writer_rule_checks["broken" if why else "ok"] += 1
        self._checks_done += 1
        if why and why != self.writer_rule_verdict:
            log.error("the writer rule is not in force: new sessions on the host database are refused and open "
                      "ones ended", extra={"fields": {"why": why}})
        if why:
            self._end_host_sessions(why)
        elif not why and self.writer_rule_verdict:
            log.warning("the writer rule is in force again: new sessions on the host database are accepted")
        self.writer_rule_verdict = why
        return why

    def _end_host_sessions(self, why: str) -> None:
        """The writer rule (or the net, ADR 0009) is not in force: the open sessions on the host database end too,
        not only new ones (issue 23), with the FATAL a new one gets; a transaction in progress is rolled back by
        the server when its connection goes."""
        for session in list(self.sessions):
            # (a session still being set up gets its own refusal: writer_rule_refusal)
            if not session.closed and session.upstream is not None and self.on_host_database(session.params):
                session.end_now("57P03", "openwop-seat ends the sessions on the host database while the writer "
                                         f"rule is not in force: {why}", "writer rule not in force")

    async def writer_rule_refusal(self) -> str:
        """Why a new session on the host database is refused, or "": while the last check found the writer rule
        broken, each new session checks again (one check at a time, shared by the sessions that wait for it), so
        that a repair is seen at once."""
        if not self.writer_rule_verdict:
            return ""
        seen = self._checks_done
        async with self._check_lock:
            if self._checks_done == seen:  # no check finished while this session waited: run one
                await self.check_writer_rule()
        return self.writer_rule_verdict

    async def _check_writer_rule_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.config.host.check_interval)
            try:
                await self.check_writer_rule()
            except Exception:  # pragma: no cover - a bug must not stop the checks
                log.exception("writer rule check failed")

    def on_host_database(self, params: dict[str, str]) -> bool:
        ctx = self.read_context
        return ctx is not None and params.get("database", params.get("user")) == ctx.database

    def read_path_for(self, params: dict[str, str], major) -> ReadPath | None:
        """A read path for a session of this major on this database, or None when it is relayed as is."""
        ctx = self.read_context
        if major not in (1, 2) or not self.on_host_database(params):
            return None
        classifier = ctx.classifiers[major]
        if params.get("user") not in classifier.held_roles:  # ADR 0019: a role the net does not hold
            classifier = ctx.strict[major]
        return ReadPath(classifier, major, ctx.events, ctx.watch)

    def _accept(self, peer: _ClientPeer) -> None:
        self.stats.client_connections += 1
        session = Session(self, peer)
        self.sessions.add(session)
        if self.holding:  # accepted as PAUSE began
            session.hold(self._held_changed.set)
        task = asyncio.get_running_loop().create_task(session.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def session_ended(self, session: Session) -> None:
        """Called soon after a session closed (Session.close)."""
        self.sessions.discard(session)
        if session.major is not None:  # SHOW STATS: what the ended sessions did, by database (bounded labels)
            totals = self.closed_totals.setdefault(session.label_pair[0], [0, 0, 0, 0])
            relay = session.relay
            totals[0] += relay.transactions if relay is not None else 0
            totals[1] += relay.queries_sent if relay is not None else 0
            totals[2] += session.bytes_in
            totals[3] += session.bytes_out

    async def readiness(self) -> tuple[bool, str]:
        if not self._sockets or self._draining:
            return False, "not accepting connections"
        if self.paused:
            if self.holding:
                return False, "paused (PAUSE on the admin console): sessions held, not accepting new connections"
            return False, "paused (SIGUSR1): not accepting new connections"
        up = self.config.upstream
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(up.host, up.port),
                                               self.config.connect_timeout)
            writer.close()
        except (OSError, asyncio.TimeoutError) as e:
            return False, f"upstream {up} unreachable: {e}"
        if self.writer_rule_verdict:
            return False, f"writer rule not in force: {self.writer_rule_verdict}"
        ctx = self.read_context
        if ctx is not None and ctx.first_boot:
            # Ready, so that the host can reach its database through the seat and create its tables (first boot).
            return True, f"ready (first boot: {ctx.first_boot}; run openwop-seat migrate)"
        if ctx is not None:
            # The host database still holds this seat's schema for these artifacts (`verify`), checked on
            # a short connection at most every 3 seconds so that scrapes do not hammer the database.
            import asyncpg

            from proxy.db.layout import SchemaError
            from proxy.db.migrate import verify

            loop = asyncio.get_running_loop()
            key = (self.config.host.dsn, ctx.artifacts.digest)
            cached = getattr(self, "_ready_cache", None)
            if cached is not None and cached[0] == key and loop.time() - cached[1] < 3.0:
                why = cached[2]
            else:
                try:
                    await self.catalog.run(lambda conn: verify(conn, self.config, ctx.artifacts))
                    why = ""
                except SchemaError as e:
                    why = f"host database schema: {e}"
                except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
                    why = f"host database (host.dsn) unreachable: {e}"
                self._ready_cache = (key, loop.time(), why)
            if why:
                return False, why
        return True, "ready"

    # ------------------------------------------------------------------ stopping

    def install_signal_handlers(self) -> None:
        """Every signal an operator sends is handled (docs/operations.md#signals-and-shutdown); installed before
        start, so that none kills the process while it checks the database."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: self._spawn(self.drain()))
        loop.add_signal_handler(signal.SIGINT, self.stop_now, signal.SIGINT)
        loop.add_signal_handler(signal.SIGQUIT, self.stop_now, signal.SIGQUIT)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        loop.add_signal_handler(signal.SIGUSR1, lambda: self._spawn(self.pause()))
        loop.add_signal_handler(signal.SIGUSR2, lambda: self._spawn(self.resume()))

    def _on_sighup(self) -> None:
        if not self._started:
            log.warning("SIGHUP before the seat listens: ignored")
            return
        # The handler only starts the work: reading files and checking the database happen in a task.
        self._spawn(self.reload())

    # ------------------------------------------------------------------ reload

    async def reload(self) -> bool:
        """SIGHUP: re-read the config file and the artifacts; swap them in for new sessions if valid.

        Live sessions keep the config they started with. Nothing is swapped unless everything
        checks out: the file parses and validates, TLS files load, and the host database's
        schema matches the (re-read) artifacts. Returns whether the new configuration is in force.
        """
        async with self._reload_lock:
            old = self.config
            log.info("reloading", extra={"fields": {"config": old.source or "(defaults)"}})
            await self.check_writer_rule()  # SIGHUP checks the writer rule whatever becomes of the reload
            try:
                new = load_config(old.source).with_overrides(**dict(old.overrides))
                restart = [key for name, key in RESTART_KEYS.items()
                           if getattr(new, name, None) != getattr(old, name, None)]
                if restart:
                    log.warning("needs a restart: " + ", ".join(restart), extra={"fields": {
                        "running": ", ".join(str(getattr(old, n)) for n, k in RESTART_KEYS.items() if k in restart),
                        "configured": ", ".join(str(getattr(new, n)) for n, k in RESTART_KEYS.items()
                                                if k in restart)}})
                    new = replace(new, **{n: getattr(old, n) for n, k in RESTART_KEYS.items() if k in restart})
                client_ctx, upstream_ctx = client_ssl_context(new), upstream_ssl_context(new)
                read_context, claim_secret = None, None
                if new.translates:
                    from proxy.db.claims import load_claim_secret

                    claim_secret = load_claim_secret(new)
                    if claim_secret is None and (error := missing_claim_secret(new)) is not None:
                        raise error
                    read_context = await load_read_context(new)
                    if claim_secret is not None and not read_context.first_boot:
                        await check_claim_secret(new, claim_secret)
                admin_secrets = self.admin.check_auth(new) if self.admin is not None else None
                pool_secrets = self.pool.load_secrets(new)
            except Exception as e:  # whatever the reason, the running configuration stays
                self.last_reload_error = _reload_reason(e)
                log.error("reload rejected: %s", self.last_reload_error, extra={"fields": {"config": old.source}})
                return False
            self.last_reload_error = ""
            self.pool.secrets = pool_secrets  # for the next hand-overs; a pooled backend stays its user's
            self.pool.forget_queried()
            if self.admin is not None:
                self.admin.set_auth(new, admin_secrets)
            changed = changed_keys(old, new)
            old_digest = getattr(self.read_context.artifacts, "digest", None) if self.read_context else None
            new_digest = getattr(read_context.artifacts, "digest", None) if read_context else None
            if old_digest != new_digest:
                changed.append("artifacts")
            if claim_secret != self.claim_secret:
                changed.append("claim secret")
                self.claim_salt = None  # the next claim asks for a challenge again
                self.claim_owners.clear()
            if claim_secret is None and new.translates and self.claim_secret is not None:
                log.warning("no claim secret after reload: new sessions (major 1) are not claimed")
            self.config = new
            self.client_ssl_context, self.upstream_ssl_context = client_ctx, upstream_ctx
            was_first_boot = self.first_boot
            self.read_context, self.claim_secret = read_context, claim_secret
            if was_first_boot and read_context is not None and not read_context.first_boot:
                self._rules_in_force(read_context)
            if new.log_level != old.log_level:
                logging.getLogger("openwop_seat").setLevel(new.log_level.upper())
            log.info("reloaded", extra={"fields": {
                "changed": ",".join(changed) or "nothing", "sessions": len(self.sessions),
                "artifact_digest": new_digest or "-"}})
            return True

    async def drain(self, mode: str | None = None) -> None:
        """SIGTERM: stop accepting, wait for sessions to end (up to shutdown_timeout), then close.

        ``mode`` is proxy.shutdown_mode unless the admin console's SHUTDOWN WAIT_FOR_CLIENTS ("drain") or
        WAIT_FOR_SERVERS ("idle") says otherwise. Sessions held by PAUSE are released first, so that they can end.

        The connections the kernel already queued on the listen sockets are accepted and served before the sockets
        close (with SO_REUSEPORT, new ones go to the other seats on the port). A connection that has not sent its
        startup packet within DRAIN_GRACE_SECONDS is closed; with shutdown_mode "idle" a session is ended once it
        has been idle outside a transaction for DRAIN_GRACE_SECONDS."""
        if self._draining or self._stopped.is_set():
            return
        self._draining = True
        timeout = self.config.shutdown_timeout
        mode = mode or self.config.shutdown_mode
        if self.holding:
            self.holding = False
            self._held_changed.set()
            for session in list(self.sessions):
                session.release()
        log.info("draining", extra={"fields": {"sessions": len(self.sessions), "timeout_s": timeout,
                                               "shutdown_mode": mode}})
        self._stop_serving()
        await self._accept_queued()
        self._close_sockets()
        grace = min(DRAIN_GRACE_SECONDS, timeout)
        for session in list(self.sessions):
            session.drain(grace, idle=mode == "idle")
        waiting = [s.done for s in self.sessions]
        if waiting:
            _, pending = await asyncio.wait(waiting, timeout=timeout)
            if pending:
                log.warning("shutdown timeout reached", extra={"fields": {"closing_sessions": len(pending)}})
        self.stop_now()

    async def _accept_queued(self) -> None:
        """Accept what the kernel queued on the listen sockets: closing them would reset those connections."""
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            while True:
                try:
                    conn, _ = sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as e:
                    log.warning("accepting a queued connection during the drain failed: %s", e)
                    break
                conn.setblocking(False)
                try:
                    await loop.connect_accepted_socket(lambda: _ClientPeer(self), conn)
                except OSError:
                    conn.close()

    def stop_now(self, sig: signal.Signals | None = None) -> None:
        """SIGINT, SIGQUIT (and the end of a drain): close every session at once."""
        if sig is not None:
            log.info("stopping", extra={"fields": {"signal": sig.name, "sessions": len(self.sessions)}})
        self._close_sockets()
        for session in list(self.sessions):
            session.shut_down()
        self.pool.close_all()
        self._stopped.set()

    async def serve_forever(self) -> None:
        await self._stopped.wait()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1)
        await self.metrics.close()
        await self.catalog.close()
        if self.admin is not None:
            await self.admin.close()
        log.info("stopped")
