"""A deliberately dumb blocking PostgreSQL client for byte-level tests.

Built from struct only (not from the code under test), so it can send exactly
the malformed or unusual bytes a test needs and read back every message.
"""

from __future__ import annotations

import socket
import struct
import time


def msg(t: bytes, body: bytes = b"") -> bytes:
    return t + struct.pack("!I", len(body) + 4) + body


def startup(params: dict[str, str], version: int = 3 << 16) -> bytes:
    body = struct.pack("!I", version) + b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items())
    body += b"\0"
    return struct.pack("!I", len(body) + 4) + body


def query(sql: str) -> bytes:
    return msg(b"Q", sql.encode() + b"\0")


def error_fields(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode()
    return fields


class RawConn:
    def __init__(self, port: int, timeout: float = 10):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def read_bytes(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError("connection closed")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_message(self) -> tuple[bytes, bytes]:
        head = self.read_bytes(5)
        (length,) = struct.unpack("!I", head[1:])
        return head[:1], self.read_bytes(length - 4)

    def read_until(self, t: bytes) -> list[tuple[bytes, bytes]]:
        out = []
        while True:
            m = self.read_message()
            out.append(m)
            if m[0] == t:
                return out

    def login(self, user: str = "postgres", database: str = "postgres", **params: str) -> list:
        self.send(startup({"user": user, "database": database, **params}))
        return self.read_until(b"Z")

    def read_all_until_closed(self, timeout: float = 10) -> list[tuple[bytes, bytes]]:
        """Every complete message until the peer closes; fails if it does not close in time."""
        out = []
        deadline = time.monotonic() + timeout
        self.sock.settimeout(timeout)
        while time.monotonic() < deadline:
            try:
                out.append(self.read_message())
            except EOFError:
                return out
            except ConnectionResetError:
                return out
        raise TimeoutError("peer did not close the connection")

    def close(self) -> None:
        self.sock.close()
