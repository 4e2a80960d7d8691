"""The seat's sockets: one Peer per connection, the upstream connection with TLS as configured, and the TLS
contexts both sides use."""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Callable

from proxy.config import Config
from proxy.errors import SeatException
from proxy.wire import messages

if TYPE_CHECKING:
    from proxy.serve.context import SeatView


def client_ssl_context(config: Config) -> ssl.SSLContext | None:
    """The context for clients' SSLRequest, or None to answer 'N'."""
    if not config.tls.cert_file:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(config.tls.cert_file, config.tls.key_file)
    return ctx


def upstream_ssl_context(config: Config) -> ssl.SSLContext | None:
    mode = config.tls.upstream_sslmode
    if mode == "disable":
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.tls.upstream_ca_file and mode in ("require", "verify-full"):
        # As in libpq, `require` with a CA file verifies the chain (verify-ca); verify-full adds the host name.
        ctx.load_verify_locations(config.tls.upstream_ca_file)
        ctx.check_hostname = mode == "verify-full"
        ctx.verify_mode = ssl.CERT_REQUIRED
    else:  # prefer, or require without a CA: encrypted, not authenticated
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class UpstreamUnavailable(SeatException):
    """The upstream could not be reached or refused the encryption the config demands."""


class Peer(asyncio.Protocol):
    """One socket of a session. Buffers bytes until the session sets a sink.

    The callbacks (``sink``, ``on_lost``, ``on_eof``, ``on_pause``) are plain functions, each called with the peer's
    ``owner`` first: a method of the owner's class (``Session._from_client``), set with the owner, so that a
    connection holds no bound method object per callback (make bench's idle_memory: 64 bytes each)."""

    # slots: two a connection, idle ones included (make bench's idle_memory)
    __slots__ = ("_waiter", "buffer", "eof", "lost", "on_eof", "on_lost", "on_pause", "owner", "sink", "transport")

    def __init__(self, on_lost: Callable[[object, "Peer", Exception | None], None] | None = None,
                 owner: object = None):
        self.owner = owner  # what the callbacks are called with first (a Session, a pool's ServerConn)
        self.transport: asyncio.Transport | None = None
        # what arrived before a sink was set: a bytearray once something did (an idle session's peers keep none)
        self.buffer: bytes | bytearray = b""
        self.sink: Callable[[object, bytes], None] | None = None
        self.eof = False
        self.lost = False
        self._waiter: asyncio.Future | None = None
        self.on_lost = on_lost
        self.on_eof: Callable[[object], None] | None = None
        self.on_pause: Callable[[object, bool], None] | None = None  # called with True on pause, False on resume

    # asyncio callbacks
    def connection_made(self, transport):  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink(self.owner, data)
        else:
            if self.buffer:
                self.buffer += data
            else:
                self.buffer = bytearray(data)
            self._wake()

    def eof_received(self):
        self.eof = True
        self._wake()
        if self.on_eof is not None:
            self.on_eof(self.owner)
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.eof = True
        self._wake()
        if self.on_lost is not None:
            self.on_lost(self.owner, self, exc)

    def pause_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(self.owner, True)

    def resume_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(self.owner, False)

    # handshake helpers
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_data(self) -> None:
        """Wait until more bytes arrive or the peer closes."""
        if self.eof:
            raise ConnectionResetError("peer closed the connection")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def read_exact(self, n: int) -> bytes:
        if n <= 0:
            return b""
        while len(self.buffer) < n:
            if self.eof:
                raise ConnectionResetError("peer closed the connection")
            await self.wait_data()
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def open_upstream(server: SeatView, loop: asyncio.AbstractEventLoop,
                        on_lost: Callable[[object, Peer, Exception | None], None] | None = None,
                        owner: object = None) -> Peer:
    """Connect to the upstream and negotiate TLS as `[tls] upstream_sslmode` says."""
    config = server.config
    up = config.upstream
    mode = config.tls.upstream_sslmode

    async def connect() -> Peer:
        _, peer = await loop.create_connection(lambda: Peer(on_lost, owner), up.host, up.port)
        if mode == "disable":
            return peer
        peer.write(messages.ssl_request())
        answer = await peer.read_exact(1)
        if answer == b"S":
            ctx = server.upstream_ssl_context
            assert ctx is not None
            hostname = up.host if mode == "verify-full" else None
            peer.transport = await loop.start_tls(peer.transport, peer, ctx, server_hostname=hostname)
            return peer
        if answer == b"N" and mode == "prefer":
            return peer
        peer.abort()
        if answer == b"N":
            raise UpstreamUnavailable(f"upstream {up} does not support TLS, but tls.upstream_sslmode is {mode}")
        raise UpstreamUnavailable(f"upstream {up} answered the SSL request with {answer!r}")

    try:
        return await asyncio.wait_for(connect(), config.connect_timeout)
    except asyncio.TimeoutError:
        raise UpstreamUnavailable(f"timeout connecting to upstream {up} after {config.connect_timeout:g} s") from None
    except ssl.SSLError as e:
        raise UpstreamUnavailable(f"TLS handshake with upstream {up} failed: {e.reason or e}") from None
    except (OSError, ConnectionError) as e:
        reason = e.strerror or str(e) or type(e).__name__
        raise UpstreamUnavailable(f"could not connect to upstream {up}: {reason}") from None
