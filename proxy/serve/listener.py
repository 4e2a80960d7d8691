"""The listener: accepts clients, owns the sessions, the TLS contexts, metrics and signals."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import replace

from proxy.config import RESTART_KEYS, Config, changed_keys, load_config
from proxy.errors import describe
from proxy.readpath.read_path import ReadPath
from proxy.serve.context import (
    RELATION_CHECK_SECONDS,
    ReadContext,
    check_claim_secret,
    database_functions,
    load_read_context,
    relation_state,
)
from proxy.serve.metrics import MetricsHTTP, Stats
from proxy.serve.peer import client_ssl_context, upstream_ssl_context
from proxy.serve.session import Peer, Session

log = logging.getLogger("openwop_seat.server")


def _reload_reason(e: Exception) -> str:
    if (why := describe(e, database="the host database (host.dsn)")) is not None:
        return why
    log.exception("unexpected error during reload")
    return f"unexpected error: {type(e).__name__}: {e}"


class _ClientPeer(Peer):
    """A freshly accepted client socket: starts its session once connected."""

    def __init__(self, server: "SeatServer"):
        super().__init__()
        self.server = server

    def connection_made(self, transport):  # type: ignore[override]
        super().connection_made(transport)
        self.server._accept(self)


class SeatServer:
    def __init__(self, config: Config):
        self.config = config
        self.stats = Stats()
        self.sessions: set[Session] = set()
        self.client_ssl_context = client_ssl_context(config)
        self.upstream_ssl_context = upstream_ssl_context(config)
        self.metrics = MetricsHTTP(self)
        self._listener: asyncio.AbstractServer | None = None
        self._unix_listener: asyncio.AbstractServer | None = None
        self.unix_socket: str | None = None  # the path clients connect to, with [proxy] unix_socket_dir
        self.admin = None  # the admin console (serve/admin.py), with [admin]
        self._stopped = asyncio.Event()
        self._draining = False
        self._tasks: set[asyncio.Task] = set()
        self.read_context: ReadContext | None = None
        self.claim_secret: str | None = None  # None: sessions are not claimed, every writer is v1
        self._reload_lock = asyncio.Lock()
        # The writer rule as the last check found it (ADR 0006): "" in force, else why not.  While it is not,
        # new sessions on the host database are refused.
        self.writer_rule_broken = ""
        self._checks_done = 0
        self._check_lock = asyncio.Lock()

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.sockets[0].getsockname()[1]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.config.translates:
            self.read_context = await load_read_context(self.config)
            from proxy.db.claims import load_claim_secret

            self.claim_secret = load_claim_secret(self.config)
            if self.claim_secret is None:
                log.warning("no claim secret ([host] claim_secret_file or OPENWOP_SEAT_CLAIM_SECRET): "
                            "every session writes as a v1 writer: no era-3 stamps, and appends to runs "
                            "already stamped era 3 are refused")
            else:
                await check_claim_secret(self.config, self.claim_secret)
            self._spawn(self._watch_relations())
        if self.read_context is not None and self.config.host.check_interval > 0:
            self._spawn(self._check_writer_rule_periodically())
        listen = self.config.listen
        self._listener = await loop.create_server(lambda: _ClientPeer(self), listen.host, listen.port,
                                                  reuse_address=True, backlog=1024,
                                                  # workers > 1: every worker listens on the port (supervisor.py)
                                                  reuse_port=self.config.workers > 1)
        await self._start_unix()
        await self._start_admin()
        if self.config.metrics_listen is not None:
            m = self.config.metrics_listen
            await self.metrics.start(m.host, m.port)
        log.info("listening", extra={"fields": {
            "listen": str(listen), "upstream": str(self.config.upstream),
            "metrics": str(self.config.metrics_listen) if self.config.metrics_listen else "off",
            "unix_socket": self.unix_socket or "off",
            "admin": ", ".join(str(a) for a in (self.config.admin_listen, self.config.admin_unix_socket) if a) or "off",
            "client_tls": self.client_ssl_context is not None,
            "upstream_sslmode": self.config.tls.upstream_sslmode}})

    async def _start_unix(self) -> None:
        """[proxy] unix_socket_dir: accept clients on <dir>/.s.PGSQL.<port> too (`psql -h <dir> -p <port>`)."""
        if self.config.unix_socket_dir is None:
            return
        import os
        import socket

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
        self._unix_listener = await asyncio.get_running_loop().create_unix_server(
            lambda: _ClientPeer(self), path, backlog=1024)
        os.chmod(path, 0o777)  # as PostgreSQL's unix_socket_permissions: the database authenticates
        self.unix_socket = path

    async def _start_admin(self) -> None:
        """[admin]: the read-only admin console (serve/admin.py), when configured."""
        if self.config.admin_listen is None and self.config.admin_unix_socket is None:
            return
        from proxy.serve.admin import AdminConsole

        self.admin = AdminConsole(self)
        await self.admin.start(self.config.admin_listen, self.config.admin_unix_socket)

    def _close_unix(self) -> None:
        """Stop accepting on the Unix socket and remove its file (with the TCP listener: drain, stop)."""
        if self._unix_listener is not None:
            import os

            self._unix_listener.close()
            self._unix_listener = None
            try:
                os.unlink(self.unix_socket)
            except OSError:
                pass

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_relations(self) -> None:
        """Re-read, every RELATION_CHECK_SECONDS, the views over the events table (a view created after start
        is a leak the result check must know), the functions defined in the database (a translated session may
        not call them), and whether the translated relations still match the table (DDL on it after start):
        while they do not, translated statements are refused, never mis-translated."""
        from proxy.db.connect import connect

        while True:
            await asyncio.sleep(RELATION_CHECK_SECONDS)
            ctx = self.read_context
            if ctx is None:
                return
            ev = ctx.watch.events
            try:
                conn = await asyncio.wait_for(connect(self.config.host.dsn), self.config.connect_timeout)
                try:
                    derived, derived_payload, stale = await relation_state(
                        conn, self.config.host, ev.table_oid, ev.type_attnum, ev.payload_attnum or None)
                    functions = await database_functions(conn, self.config.host.events_table)
                finally:
                    await conn.close()
            except Exception as e:  # noqa: BLE001 - the database may be away for a while; keep what we had
                log.warning("relation check failed: %s", e)
                continue
            if stale != ctx.watch.stale:
                (log.error if stale else log.info)("translated relations %s", stale or "match the events table again")
            ctx.watch.stale = stale
            for classifier in ctx.classifiers.values():
                classifier.set_functions(functions)
            if derived != ev.derived_oids or derived_payload != ev.derived_payload_oids:
                ctx.watch.set(replace(ev, derived_oids=derived, derived_payload_oids=derived_payload))

    async def check_writer_rule(self) -> str:
        """Check that the writer rule is in force as migrate installed it (``verify``: layout, digest,
        triggers present and enabled, the fingerprint of the functions and triggers); "" or why not.

        A database that cannot be reached leaves the last verdict as it was (sessions fail on their own then).
        """
        import asyncpg

        from proxy.db.layout import SchemaError
        from proxy.db.migrate import verify

        ctx = self.read_context
        if ctx is None:
            return ""
        try:
            await asyncio.wait_for(verify(self.config.host.dsn, self.config, ctx.artifacts),
                                   self.config.connect_timeout)
            why = ""
        except SchemaError as e:
            why = str(e)
        except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            self.stats.writer_rule_checks["error"] += 1
            log.warning("writer rule check: host database (host.dsn) unreachable: %s", e)
            return self.writer_rule_broken
        self.stats.writer_rule_checks["broken" if why else "ok"] += 1
        self._checks_done += 1
        if why and why != self.writer_rule_broken:
            log.error("the writer rule is not in force: new sessions on the host database are refused",
                      extra={"fields": {"why": why}})
        elif not why and self.writer_rule_broken:
            log.warning("the writer rule is in force again: new sessions on the host database are accepted")
        self.writer_rule_broken = why
        return why

    async def writer_rule_refusal(self) -> str:
        """Why a new session on the host database is refused, or "": while the last check found the writer rule
        broken, each new session checks again (one check at a time, shared by the sessions that wait for it), so
        that a repair is seen at once."""
        if not self.writer_rule_broken:
            return ""
        seen = self._checks_done
        async with self._check_lock:
            if self._checks_done == seen:  # no check finished while this session waited: run one
                await self.check_writer_rule()
        return self.writer_rule_broken

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
        return ReadPath(ctx.classifiers[major], major, ctx.events, ctx.watch)

    def _accept(self, peer: _ClientPeer) -> None:
        self.stats.client_connections += 1
        session = Session(self, peer)
        self.sessions.add(session)
        session.done.add_done_callback(lambda _: self.sessions.discard(session))
        task = asyncio.get_running_loop().create_task(session.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def readiness(self) -> tuple[bool, str]:
        if self._listener is None or self._draining:
            return False, "not accepting connections"
        up = self.config.upstream
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(up.host, up.port),
                                               self.config.connect_timeout)
            writer.close()
        except (OSError, asyncio.TimeoutError) as e:
            return False, f"upstream {up} unreachable: {e}"
        if self.writer_rule_broken:
            return False, f"writer rule not in force: {self.writer_rule_broken}"
        ctx = self.read_context
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
                    await asyncio.wait_for(verify(self.config.host.dsn, self.config, ctx.artifacts),
                                           self.config.connect_timeout)
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
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(self.drain()))
        loop.add_signal_handler(signal.SIGINT, self.stop_now)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_sighup(self) -> None:
        # The handler only starts the work: reading files and checking the database happen in a task.
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

                    read_context = await load_read_context(new)
                    claim_secret = load_claim_secret(new)
                    if claim_secret is not None:
                        await check_claim_secret(new, claim_secret)
            except Exception as e:  # whatever the reason, the running configuration stays
                log.error("reload rejected: %s", _reload_reason(e), extra={"fields": {"config": old.source}})
                return False
            changed = changed_keys(old, new)
            old_digest = getattr(self.read_context.artifacts, "digest", None) if self.read_context else None
            new_digest = getattr(read_context.artifacts, "digest", None) if read_context else None
            if old_digest != new_digest:
                changed.append("artifacts")
            if claim_secret != self.claim_secret:
                changed.append("claim secret")
            if claim_secret is None and new.translates and self.claim_secret is not None:
                log.warning("no claim secret after reload: new sessions write as v1 writers")
            self.config = new
            self.client_ssl_context, self.upstream_ssl_context = client_ctx, upstream_ctx
            self.read_context, self.claim_secret = read_context, claim_secret
            if new.log_level != old.log_level:
                logging.getLogger("openwop_seat").setLevel(new.log_level.upper())
            log.info("reloaded", extra={"fields": {
                "changed": ",".join(changed) or "nothing", "sessions": len(self.sessions),
                "artifact_digest": new_digest or "-"}})
            return True

    async def drain(self) -> None:
        """SIGTERM: stop accepting, wait for sessions to end (up to shutdown_timeout), then close."""
        if self._draining:
            return
        self._draining = True
        timeout = self.config.shutdown_timeout
        log.info("draining", extra={"fields": {"sessions": len(self.sessions), "timeout_s": timeout}})
        if self._listener is not None:
            self._listener.close()
        self._close_unix()
        for session in list(self.sessions):
            if session.major is None:  # connected but never sent a startup packet: nothing to wait for
                session.close("seat draining")
        waiting = [s.done for s in self.sessions]
        if waiting:
            _, pending = await asyncio.wait(waiting, timeout=timeout)
            if pending:
                log.warning("shutdown timeout reached", extra={"fields": {"closing_sessions": len(pending)}})
        self.stop_now()

    def stop_now(self) -> None:
        """SIGINT (and the end of a drain): close every session at once."""
        if self._listener is not None:
            self._listener.close()
        self._close_unix()
        for session in list(self.sessions):
            session.shut_down()
        self._stopped.set()

    async def serve_forever(self) -> None:
        await self._stopped.wait()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1)
        await self.metrics.close()
        if self.admin is not None:
            await self.admin.close()
        log.info("stopped")
