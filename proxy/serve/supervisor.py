"""`[proxy] workers = N` (N > 1): N seat processes share the listen port under one supervisor.

Each worker is an ordinary `openwop-seat serve` process (same configuration, same code path)
started with two hidden options, `--worker ID --worker-fd FD`. It binds the listen address with
SO_REUSEPORT, so the kernel spreads new connections over the workers by a hash of the client's
address and port. The seat keeps no per-session state outside its worker, and a CancelRequest is
forwarded as is to the upstream (which owns the backend key), so a cancel may land on any worker;
a pooled session's cancel key is the seat's (ADR 0016), so a worker that does not hold the session
asks the others through the supervisor, and the one that holds it sends the cancel.

The supervisor owns no client connection. It
- reserves the listen port (a bound, never listening SO_REUSEPORT socket: port 0 resolves once,
  and the port stays ours while a worker restarts);
- starts the workers and waits for each to report, over its end of a socket pair, that it is
  listening and where its private metrics listener is (127.0.0.1, an ephemeral port);
- restarts a worker that exits while the seat is not stopping (backoff when it keeps crashing);
  when the supervisor itself dies, the workers see the socket pair close and drain;
- forwards every signal an operator sends to every worker: SIGTERM (drain), SIGINT and SIGQUIT (close
  now), SIGHUP (reload), SIGUSR1 (pause: stop accepting) and SIGUSR2 (resume); a worker it starts while
  paused is paused too. It exits once every worker has: 0 when each exited 0 (it never exits first);
- serves `[metrics] listen` itself: /metrics is the sum over the workers of each series (info
  series are not summed, nor the gauges of MAX_OVER_WORKERS, a setting or a flag: their maximum;
  counters of exited workers are kept as of their last scrape), plus its own openwop_seat_workers*
  series; /healthz and /readyz are answered from the workers' answers;
- runs the admin console (`[admin]`, ADR 0014): each command goes to every worker over its socket
  pair (one JSON line each way), and the answers are merged (serve/admin.py);
- routes a worker's cancel request for a pooled session it does not hold to the other workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import Config, HostPort
from proxy.errors import ListenError
from proxy.logs import set_process_fields
from proxy.serve.metrics import PROMETHEUS_TEXT, serve_http

log = logging.getLogger("openwop_seat.supervisor")

SCRAPE_TIMEOUT = 5.0
LINK_LIMIT = 64 << 20  # the longest answer line a worker sends over its link (SHOW CLIENTS of many sessions)
# Per-worker gauges whose sum means nothing (a setting, a flag): the supervisor exports their maximum.
MAX_OVER_WORKERS = frozenset({"openwop_seat_buffer_limit_bytes", "openwop_seat_paused",
                              "openwop_seat_writer_rule_broken", "openwop_seat_first_boot",
                              "openwop_seat_parse_cache_capacity_bytes",
                              # read by every worker from the one database (and the cutover_* gauges likewise)
                              "openwop_seat_runs_stamped_created", "openwop_seat_appends_translated"})
RESTART_MIN_DELAY = 0.1
RESTART_MAX_DELAY = 10.0
STABLE_AFTER = 10.0  # a worker that ran this long resets the restart backoff


# ------------------------------------------------------------------ the worker's side


def install_worker_log_fields(worker: int) -> None:
    """Adds the worker id and pid to every log line of a worker process (after the line's own fields)."""
    set_process_fields({"worker": worker, "pid": os.getpid()})


def attach_worker(server, fd: int) -> asyncio.Task:
    """In a worker, once listening: tell the supervisor; answer its admin commands; ask the other workers through it
    (cancel requests for their pooled sessions); drain if it goes away."""
    sock = socket.socket(fileno=fd)
    sock.sendall(orjson.dumps({"pid": os.getpid(), "metrics_port": server.metrics.port}) + b"\n")
    sock.setblocking(False)
    return asyncio.get_running_loop().create_task(_worker_link(server, sock))  # kept referenced by the caller


async def _worker_link(server, sock: socket.socket) -> None:
    from proxy.serve.admin import ProcessCommands

    commands = ProcessCommands(server)

    async def answer(command: str, arg: str) -> object:
        if command == PEER_CANCEL:
            pid, key = _cancel_arg(arg)
            return await server.cancel_for_peer(pid, key)
        return await commands.run(command, arg)

    reader, writer = await asyncio.open_connection(sock=sock)
    link = Link(reader, writer, answer)
    server.peers = PeerLink(link)
    server.peers_linked.set()
    try:
        await link.closed
    finally:
        server.peers = None
    log.warning("supervisor gone: draining")
    await server.drain()


PEER_CANCEL = "peer_cancel"  # a worker's ask of the others (never an admin console command): "<pid>:<key hex>"
PEER_CANCEL_SECONDS = 2.0  # a cancel not claimed by another worker in this time goes on as it came


def _cancel_arg(arg: str) -> tuple[int, bytes]:
    pid, key = arg.split(":", 1)
    return int(pid), bytes.fromhex(key)


class Link:
    """One end of a socket pair between the supervisor and a worker. Each side asks (a JSON line with a number, a
    command and an argument) and answers the other's asks (the number and a result or an error), so either end may
    ask at any time; ``handler(command, arg)`` answers the other end's asks."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler):
        self.writer = writer
        self._handler = handler
        self._next = 0
        self._waiting: dict[int, asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self.closed = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        from proxy.serve.admin import AdminError

        try:
            while line := await reader.readline():
                message = orjson.loads(line)
                if "command" in message:
                    task = asyncio.get_running_loop().create_task(self._answer(message))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    continue
                future = self._waiting.pop(message["n"], None)
                if future is None or future.done():
                    continue
                if "error" in message:
                    future.set_exception(AdminError(*message["error"]))
                else:
                    future.set_result(message["result"])
        except (OSError, ValueError):
            pass
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(AdminError("08006", "the other end of the link exited before it answered"))
            self._waiting.clear()

    async def _answer(self, ask: dict) -> None:
        from proxy.serve.admin import AdminError

        try:
            reply = {"n": ask["n"], "result": await self._handler(ask["command"], ask.get("arg", ""))}
        except AdminError as e:
            reply = {"n": ask["n"], "error": [e.sqlstate, e.message]}
        except Exception as e:  # a bug must fail this command only
            log.exception("command over the worker link failed")
            reply = {"n": ask["n"], "error": ["XX000", f"internal error answering {ask['command']}: "
                                                       f"{type(e).__name__}"]}
        if not self.writer.is_closing():
            self.writer.write(orjson.dumps(reply) + b"\n")

    async def ask(self, command: str, arg: str = "") -> object:
        self._next += 1
        future = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = future
        self.writer.write(orjson.dumps({"n": self._next, "command": command, "arg": arg}) + b"\n")
        return await future

    def close(self) -> None:
        self.closed.cancel()
        self.writer.close()


class PeerLink:
    """A worker's asks of the other workers, through the supervisor (``server.peers``)."""

    def __init__(self, link: Link):
        self._link = link

    async def cancel(self, pid: int, key: bytes) -> bool:
        """Whether another worker holds the pooled session the seat-issued (pid, key) names, and sent its cancel."""
        try:
            return bool(await asyncio.wait_for(self._link.ask(PEER_CANCEL, f"{pid}:{key.hex()}"),
                                               PEER_CANCEL_SECONDS))
        except Exception as e:  # the supervisor gone or slow: the cancel goes on as it came
            log.warning("cancel request not routed to the other workers: %s", e or type(e).__name__)
            return False


# ------------------------------------------------------------------ the supervisor


@dataclass
class Worker:
    id: int
    proc: asyncio.subprocess.Process
    sock: socket.socket
    started: float = field(default_factory=time.monotonic)
    metrics_port: int | None = None
    counters: dict = field(default_factory=dict)  # counter samples as of the last scrape
    link: Link | None = None  # the admin commands' channel (and the worker's asks), once the worker listens
    signals: set = field(default_factory=set)  # the signals sent to it

    def close_link(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None
        else:
            self.sock.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


class Supervisor:
    def __init__(self, config: Config, worker_args: list[str]):
        self.config = config
        self.worker_args = worker_args  # serve options passed on to every worker (--config, --upstream)
        self.count = config.workers
        self.workers: dict[int, Worker] = {}
        self.restarts = 0
        self.starts: dict[int, int] = {}  # worker slot -> processes started in it so far (numbers its session ids)
        self.retired: dict = {}  # counter samples of exited workers
        self.stopping = False
        self.listen: HostPort = config.listen
        self._reserved: socket.socket | None = None
        self._http: asyncio.AbstractServer | None = None
        self._all_exited = asyncio.Event()
        self._watchers: set[asyncio.Task] = set()
        self.failed = False
        self._stop_signal: signal.Signals = signal.SIGTERM
        self.paused = False  # SIGUSR1 until SIGUSR2: forwarded, and sent to every worker started meanwhile
        self.holding = False  # the console's PAUSE until RESUME: asked of every worker started meanwhile
        self.admin = None  # the admin console ([admin]), run here for every worker

    # ---------------------------------------------------------------- lifecycle

    def _reserve_port(self) -> None:
        host, port = self.config.listen.host, self.config.listen.port
        family, type_, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE)[0]
        if port and not self.config.so_reuseport:
            # A plain bind first: never join the SO_REUSEPORT group of another seat on this port, unless
            # proxy.so_reuseport says so (a rolling restart: docs/operations.md#rolling-restart).
            with socket.socket(family, type_, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(addr)
        sock = socket.socket(family, type_, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)  # never listen(): the kernel hands connections to listening sockets only
        self._reserved = sock
        self.listen = HostPort(host, sock.getsockname()[1])

    async def _spawn(self, wid: int) -> tuple[Worker, bool]:
        """Start worker `wid`; return it and whether it reported listening (False: it exited first)."""
        parent, child = socket.socketpair()
        fd = child.fileno()
        start = self.starts.get(wid, 0)
        self.starts[wid] = start + 1
        cmd = [sys.executable, "-m", "proxy", "serve", *self.worker_args, "--listen", str(self.listen),
               "--metrics-listen", "127.0.0.1:0", "--worker", str(wid), "--worker-fd", str(fd),
               "--worker-start", str(start)]
        try:
            proc = await asyncio.create_subprocess_exec(*cmd, pass_fds=(fd,), stdin=asyncio.subprocess.DEVNULL)
        finally:
            child.close()
        worker = Worker(wid, proc, parent)
        self.workers[wid] = worker
        parent.setblocking(False)
        loop = asyncio.get_running_loop()
        hello = loop.create_task(_read_line(loop, parent))
        exited = loop.create_task(proc.wait())
        await asyncio.wait({hello, exited}, return_when=asyncio.FIRST_COMPLETED)
        line = hello.result() if hello.done() and hello.exception() is None else b""
        if not line:
            hello.cancel()
            await exited
            return worker, False
        worker.metrics_port = orjson.loads(line)["metrics_port"]
        reader, writer = await asyncio.open_connection(sock=parent, limit=LINK_LIMIT)
        worker.link = Link(reader, writer, lambda command, arg: self._from_worker(wid, command, arg))
        log.info("worker started", extra={"fields": {"worker": wid, "pid": proc.pid}})
        if self.paused:
            _signal(worker, signal.SIGUSR1)
        if self.holding:  # started while the console's PAUSE holds the others
            task = loop.create_task(worker.link.ask("pause"))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return worker, True

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            loop.add_signal_handler(sig, self._stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._reload)
        loop.add_signal_handler(signal.SIGUSR1, self._pause, True)
        loop.add_signal_handler(signal.SIGUSR2, self._pause, False)
        try:
            self._reserve_port()
        except OSError as e:
            print(f"openwop-seat serve: {ListenError('proxy.listen', self.config.listen, e).describe()}",
                  file=sys.stderr)
            return 1
        if self.config.metrics_listen is not None:
            m = self.config.metrics_listen
            try:
                self._http = await asyncio.start_server(self._handle, m.host, m.port, reuse_address=True)
            except OSError as e:
                print(f"openwop-seat serve: {ListenError('metrics.listen', m, e).describe()}", file=sys.stderr)
                await self._close()
                return 1
        if self.config.admin_listen is not None or self.config.admin_unix_socket is not None:
            from proxy.config import ConfigError
            from proxy.serve.admin import AdminConsole

            self.admin = AdminConsole(self.config, self.ask_workers, self._admin_action)
            try:
                await self.admin.start()
            except (ListenError, ConfigError) as e:
                print(f"openwop-seat serve: {e.describe()}", file=sys.stderr)
                await self._close()
                return 2 if isinstance(e, ConfigError) else 1
        if self.stopping:  # signalled before any worker started
            await self._close()
            return 0
        results = await asyncio.gather(*(self._spawn(i) for i in range(1, self.count + 1)))
        failed = [w for w, ok in results if not ok]
        if failed and self.stopping and all(_stopped_as_asked(w) for w in failed):
            failed = []  # stopped by a signal while starting: not a failure
        if failed:  # a worker that cannot start (config, schema, database): the seat cannot start
            self.stopping = True
            for w in self.workers.values():
                _signal(w, signal.SIGINT)
            await asyncio.gather(*(w.proc.wait() for w in self.workers.values()))
            await self._close()
            code = failed[0].proc.returncode
            return code if code and code > 0 else 1
        for w in self.workers.values():
            self._watch(w)
            if self.stopping and self._stop_signal not in w.signals:  # signalled while the workers were starting
                _signal(w, self._stop_signal)  # once: a worker that has stopped restores the default action
        if self.stopping:
            self._check_all_exited()
        log.info("listening", extra={"fields": {
            "listen": str(self.listen), "workers": self.count,
            "pids": ",".join(str(w.pid) for w in self.workers.values()),
            "metrics": str(HostPort(self.config.metrics_listen.host, self._http.sockets[0].getsockname()[1]))
            if self._http is not None else "off"}})
        await self._all_exited.wait()
        await self._close()
        log.info("stopped")
        return 1 if self.failed else 0

    async def _close(self) -> None:
        if self._http is not None:
            self._http.close()
            await self._http.wait_closed()
        if self.admin is not None:
            await self.admin.close()
        if self._reserved is not None:
            self._reserved.close()
        for w in self.workers.values():
            w.close_link()

    def _watch(self, worker: Worker) -> None:
        task = asyncio.get_running_loop().create_task(self._supervise(worker))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _supervise(self, worker: Worker) -> None:
        delay = RESTART_MIN_DELAY / 2  # doubled before use while a worker keeps dying young
        while True:
            code = await worker.proc.wait()
            worker.close_link()
            for key, value in worker.counters.items():
                self.retired[key] = self.retired.get(key, 0.0) + value
            worker.counters = {}
            if self.stopping:
                if not _stopped_as_asked(worker):
                    self.failed = True
                    log.warning("worker exited", extra={"fields": {"worker": worker.id, "pid": worker.pid,
                                                                   "code": code}})
                self._check_all_exited()
                return
            ran = time.monotonic() - worker.started
            delay = RESTART_MIN_DELAY if ran >= STABLE_AFTER else min(delay * 2, RESTART_MAX_DELAY)
            log.warning("worker exited: restarting", extra={"fields": {
                "worker": worker.id, "pid": worker.pid, "code": code, "restart_in_s": delay}})
            await asyncio.sleep(delay)
            while True:
                if self.stopping:
                    self._check_all_exited()
                    return
                self.restarts += 1
                worker, ok = await self._spawn(worker.id)
                if ok:
                    break
                delay = min(delay * 2, RESTART_MAX_DELAY)
                log.warning("worker failed to start: retrying", extra={"fields": {
                    "worker": worker.id, "code": worker.proc.returncode, "restart_in_s": delay}})
                await asyncio.sleep(delay)
            if self.stopping:  # it started while the seat began stopping: stop it too, then wait for it
                _signal(worker, self._stop_signal)

    def _check_all_exited(self) -> None:
        if not any(w.alive for w in self.workers.values()):
            self._all_exited.set()

    def _stop(self, sig: signal.Signals) -> None:
        if self.stopping and sig == signal.SIGTERM:
            return  # already stopping; a later SIGINT or SIGQUIT still closes at once
        self.stopping = True
        self._stop_signal = sig
        log.info("draining" if sig == signal.SIGTERM else "stopping", extra={"fields": {
            "signal": sig.name, "workers": sum(w.alive for w in self.workers.values())}})
        for w in self.workers.values():
            _signal(w, sig)
        if self._watchers:
            self._check_all_exited()

    def _pause(self, on: bool) -> None:
        """SIGUSR1 (pause) and SIGUSR2 (resume), forwarded; remembered for workers started later."""
        if self.stopping:
            return
        self.paused = on
        sig = signal.SIGUSR1 if on else signal.SIGUSR2
        log.info(f"{sig.name} received: {'pausing' if on else 'resuming'} the workers",
                 extra={"fields": {"workers": sum(w.alive for w in self.workers.values())}})
        for w in self.workers.values():
            _signal(w, sig)

    def _reload(self) -> None:
        log.info("SIGHUP received: forwarding to the workers ([proxy] workers itself is read at start only)")
        self._reload_admin()
        for w in self.workers.values():
            _signal(w, signal.SIGHUP)

    def _reload_admin(self) -> str:
        """The console's admin users and secrets, re-read with the configuration (SIGHUP, RELOAD); "" or why not."""
        if self.admin is None:
            return ""
        from proxy.config import load_config

        try:
            new = load_config(self.config.source).with_overrides(**dict(self.config.overrides))
            secrets_ = self.admin.check_auth(new)
        except Exception as e:  # noqa: BLE001 - reported; the running admin users stay
            why = e.describe() if hasattr(e, "describe") else f"{type(e).__name__}: {e}"
            log.error("reload rejected: %s", why)
            return why
        self.admin.set_auth(new, secrets_)
        return ""

    # ---------------------------------------------------------------- the admin console

    async def _from_worker(self, wid: int, command: str, arg: str) -> object:
        """A worker's ask: a cancel request it received for a pooled session it does not hold, asked of the others;
        True when one of them held the session and sent the cancel."""
        from proxy.serve.admin import AdminError

        if command != PEER_CANCEL:
            raise AdminError("42601", f"unknown worker ask {command}")
        others = [w for w in self.workers.values() if w.id != wid and w.alive and w.link is not None]
        answers = await asyncio.gather(*(w.link.ask(PEER_CANCEL, arg) for w in others), return_exceptions=True)
        return any(a is True for a in answers)

    async def ask_workers(self, command: str, arg: str = "") -> list[tuple[int, object]]:
        """An admin command for every worker that listens; their answers, by worker id."""
        from proxy.serve.admin import AdminError

        if command == "pause":
            self.holding = True
        elif command == "resume":
            self.holding = False
        workers = sorted((w for w in self.workers.values() if w.alive and w.link is not None), key=lambda w: w.id)
        if not workers:
            raise AdminError("57P03", "no worker is running")
        answers = await asyncio.gather(*(w.link.ask(command, arg) for w in workers), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        out = list(zip((w.id for w in workers), answers))
        if command == "reload":
            why = self._reload_admin()
            if why:
                out.append((0, {"ok": False, "error": f"supervisor: {why}"}))
        return out

    def _admin_action(self, mode: str) -> None:
        """SHUTDOWN: "now" as SIGINT; a drain in shutdown mode "drain" or "idle" asked of every worker."""
        if mode == "now":
            self._stop(signal.SIGINT)
            return
        if self.stopping:
            return
        self.stopping = True
        log.info("draining", extra={"fields": {"shutdown_mode": mode,
                                               "workers": sum(w.alive for w in self.workers.values())}})
        loop = asyncio.get_running_loop()
        for w in self.workers.values():
            if w.alive and w.link is not None:
                task = loop.create_task(w.link.ask("shutdown", mode))
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
        if self._watchers:
            self._check_all_exited()

    # ---------------------------------------------------------------- metrics and health

    def _live(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.alive and w.metrics_port is not None]

    async def _ask_all(self, path: str) -> list[tuple[Worker, int, str]]:
        live = self._live()
        answers = await asyncio.gather(*(_http_get(w.metrics_port, path) for w in live), return_exceptions=True)
        return [(w, *a) for w, a in zip(live, answers) if not isinstance(a, BaseException)]

    async def metrics_text(self) -> bytes:
        families: dict[str, list] = {}  # name -> [type, documentation, {(sample, labels): value}]
        for worker, status, text in await self._ask_all("/metrics"):
            if status != 200:
                continue
            counters = {}
            for fam in text_string_to_metric_families(text):
                entry = families.setdefault(fam.name, [fam.type, fam.documentation, {}])
                for s in fam.samples:
                    key = (s.name, tuple(sorted(s.labels.items())))
                    if fam.name.endswith("_info"):
                        entry[2][key] = s.value
                    elif fam.name in MAX_OVER_WORKERS or fam.name.startswith("openwop_seat_cutover_"):
                        entry[2][key] = max(entry[2].get(key, s.value), s.value)
                    else:
                        entry[2][key] = entry[2].get(key, 0.0) + s.value
                    if fam.type == "counter" and fam.name not in MAX_OVER_WORKERS:  # a database's: not a worker's
                        counters[(fam.name, fam.documentation, key)] = s.value
            worker.counters = counters
        for (name, doc, key), value in self.retired.items():
            entry = families.setdefault(name, ["counter", doc, {}])
            entry[2][key] = entry[2].get(key, 0.0) + value
        out = []
        for name, (type_, doc, samples) in families.items():
            m = Metric(name, doc, type_)
            for (sample, labels), value in samples.items():
                m.add_sample(sample, dict(labels), value)
            out.append(m)
        for name, doc, type_, value in (
                ("openwop_seat_workers", "Worker processes configured ([proxy] workers)", "gauge", self.count),
                ("openwop_seat_workers_up", "Worker processes running and listening", "gauge", len(self._live())),
                ("openwop_seat_worker_restarts", "Workers the supervisor restarted", "counter", self.restarts)):
            m = Metric(name, doc, type_)
            m.add_sample(name + ("_total" if type_ == "counter" else ""), {}, value)
            out.append(m)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Fixed(out))
        return generate_latest(registry)

    async def healthz(self) -> tuple[bool, str]:
        ok = sum(1 for _, status, _ in await self._ask_all("/healthz") if status == 200)
        if ok == 0:
            return False, "no worker answering"
        return True, "ok" if ok == self.count else f"ok: {ok} of {self.count} workers answering"

    async def readyz(self) -> tuple[bool, str]:
        if self.stopping:
            return False, "not accepting connections"
        answers = await self._ask_all("/readyz")
        ready = sum(1 for _, status, _ in answers if status == 200)
        if ready == 0:
            reasons = [body.strip() for _, status, body in answers if status != 200]
            return False, reasons[0] if reasons else "no worker answering"
        return True, "ready" if ready == self.count else f"ready: {ready} of {self.count} workers"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_http(reader, writer, self._route)

    async def _route(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            return "200 OK", PROMETHEUS_TEXT, await self.metrics_text()
        if path in ("/healthz", "/readyz"):
            ok, why = await (self.healthz() if path == "/healthz" else self.readyz())
            return ("200 OK" if ok else "503 Service Unavailable"), "text/plain", (why + "\n").encode()
        return "404 Not Found", "text/plain", b"not found\n"


class _Fixed:
    def __init__(self, metrics: list[Metric]):
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


def _stopped_as_asked(worker: Worker) -> bool:
    """Exited 0, or ended by a stop signal the supervisor sent it (before its handlers were installed, or after it
    restored the default action on stopping)."""
    code = worker.proc.returncode
    return code == 0 or (code is not None and code < 0 and -code in worker.signals)


def _signal(worker: Worker, sig: int) -> None:
    worker.signals.add(sig)
    if worker.alive:
        try:
            worker.proc.send_signal(sig)
        except ProcessLookupError:
            pass


async def _read_line(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    """The worker's one hello line, or b"" if it closed its end first."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = await loop.sock_recv(sock, 4096)
        if not chunk:
            return b""
        data += chunk
    return data


async def _http_get(port: int, path: str) -> tuple[int, str]:
    async def get() -> tuple[int, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            raw = await reader.read()
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body.decode()

    return await asyncio.wait_for(get(), SCRAPE_TIMEOUT)


def run_supervisor(config: Config, worker_args: list[str]) -> int:
    """`serve` with [proxy] workers > 1: run the supervisor until its workers have stopped."""
    return asyncio.run(Supervisor(config, worker_args).run())
