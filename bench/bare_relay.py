"""The floor of `make bench` (issue 27): a bare uvloop relay, bytes both ways, no framing.

``python -m bench.bare_relay --listen PORT --upstream HOST:PORT`` accepts TCP clients on 127.0.0.1:PORT and,
for each, opens one connection upstream and forwards every chunk each side sends to the other as it arrived: one
``transport.write`` per received chunk, nothing parsed, nothing counted, no timer. It is the least a Python relay
on uvloop can do per chunk, so the seat's CPU above it (same machine, same workload, its own process measured
from /proc like the seat's) is what the seat's own work costs: the framing, the session state, the read path,
the metrics.

It still does what a relay must to be correct: flow control (a side whose writes back up stops the other side
being read, as the seat's ``Peer.on_pause``), half-close and close in both directions, and bytes a client sends
before the upstream connection is open are kept and sent first. SIGINT and SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys


class Side(asyncio.Protocol):
    """One socket of a relayed pair; ``other`` is the side its bytes go to."""

    __slots__ = ("transport", "other", "pending", "eof")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.other: Side | None = None
        self.pending: list[bytes] | None = []  # what arrived before the other side was connected
        self.eof = False

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is None or other.transport is None:
            self.pending.append(data)
        else:
            other.transport.write(data)

    def eof_received(self):
        self.eof = True
        other = self.other
        if other is not None and other.transport is not None and other.transport.can_write_eof():
            other.transport.write_eof()
        return True  # keep our write side open until the other side closes it

    def connection_lost(self, exc) -> None:
        other = self.other
        if other is not None and other.transport is not None:
            other.transport.close()

    def pause_writing(self) -> None:  # our peer reads too slowly: stop reading what we would send it
        other = self.other
        if other is not None and other.transport is not None:
            other.transport.pause_reading()

    def resume_writing(self) -> None:
        other = self.other
        if other is not None and other.transport is not None:
            other.transport.resume_reading()

    def link(self, other: "Side") -> None:
        """Both sides connected: each sends the other what it kept, and from now on forwards each chunk."""
        self.other, other.other = other, self
        for side in (self, other):
            kept, side.pending = side.pending, None
            if kept:
                side.other.transport.write(b"".join(kept))
            if side.eof:
                side.eof_received()


async def serve(listen_port: int, upstream_host: str, upstream_port: int, listen_host: str = "127.0.0.1") -> None:
    loop = asyncio.get_running_loop()

    def accepted() -> Side:
        client = Side()

        async def connect() -> None:
            try:
                _, up = await loop.create_connection(Side, upstream_host, upstream_port)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            if client.transport is None or client.transport.is_closing():
                up.transport.close()
                return
            client.link(up)

        loop.create_task(connect())
        return client

    server = await loop.create_server(accepted, listen_host, listen_port, reuse_address=True)
    stop = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    async with server:
        await stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bare_relay",
                                     description="A bare uvloop TCP relay, no framing: make bench's floor.")
    parser.add_argument("--listen", type=int, required=True, help="port to listen on, on 127.0.0.1")
    parser.add_argument("--upstream", required=True, help="HOST:PORT to relay each connection to")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    import uvloop  # the seat's event loop (a declared dependency)

    uvloop.run(serve(args.listen, host or "127.0.0.1", int(port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
