"""Sans-IO codec of the PostgreSQL v3 wire protocol: the untyped packets that open a connection, the limits,
and the protocol violation every wire reader raises or reports. The typed messages after startup are framed
by :mod:`proxy.wire.framer`.

Nothing here touches a socket.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from proxy.errors import SeatException

# Request codes of the untyped packets that open a connection.
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
CANCEL_REQUEST_CODE = 80877102
PROTOCOL_3_0 = 3 << 16
PROTOCOL_3_2 = (3 << 16) | 2

# PostgreSQL refuses startup packets longer than this (MAX_STARTUP_PACKET_LENGTH).
MAX_STARTUP_PACKET = 10000
# The largest message body PostgreSQL accepts (PQ_LARGE_MESSAGE_LIMIT is 1 GiB - 1).
MAX_MESSAGE_LENGTH = (1 << 30) - 1
# Protocol 3.2 allows cancel keys of up to 256 bytes.
MAX_CANCEL_KEY = 256

# Every message type a frontend may send once the startup packet is done:
# Bind, Close, CopyData, CopyDone, CopyFail, Describe, Execute, Flush,
# FunctionCall, Parse, password/SASL, Query, Sync, Terminate.
FRONTEND_TYPES = frozenset(b"BCdcfDEHFPpQSX")

_U32 = struct.Struct("!I")
_I32 = struct.Struct("!i")


class ProtocolViolation(SeatException):
    """The peer broke the protocol; the stream cannot be resynchronised.

    ``valid_upto`` is the offset, in the chunk that was being fed, of the first
    byte that does not belong to a complete or in-progress valid message; the
    bytes before it may still be forwarded.
    """

    def __init__(self, message: str, sqlstate: str = "08P01", valid_upto: int = 0):
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.valid_upto = valid_upto


# --------------------------------------------------------------------------
# The untyped packets at the start of a connection


@dataclass(frozen=True)
class SSLRequest:
    raw: bytes


@dataclass(frozen=True)
class GSSENCRequest:
    raw: bytes


@dataclass(frozen=True)
class CancelRequest:
    raw: bytes
    pid: int
    key: bytes


@dataclass(frozen=True)
class StartupMessage:
    raw: bytes
    version: int
    params: dict[str, str] = field(default_factory=dict)

    @property
    def version_text(self) -> str:
        return f"{self.version >> 16}.{self.version & 0xFFFF}"


InitialPacket = SSLRequest | GSSENCRequest | CancelRequest | StartupMessage


def parse_initial_packet(buf: bytes | bytearray) -> tuple[InitialPacket, int] | None:
    """Parse the first untyped packet in ``buf``.

    Returns ``(packet, consumed)``, or ``None`` when more bytes are needed.
    Raises ProtocolViolation for anything PostgreSQL itself would refuse.
    """
    if len(buf) < 4:
        return None
    (length,) = _U32.unpack_from(buf, 0)
    if length < 8 or length > MAX_STARTUP_PACKET:
        raise ProtocolViolation(f"invalid length of startup packet ({length})")
    if len(buf) < 8:
        return None
    (code,) = _U32.unpack_from(buf, 4)
    if code == CANCEL_REQUEST_CODE:
        if length < 16 or length > 12 + MAX_CANCEL_KEY:
            raise ProtocolViolation(f"invalid length of cancel request ({length})")
    elif code in (SSL_REQUEST_CODE, GSSENC_REQUEST_CODE) and length != 8:
        raise ProtocolViolation(f"invalid length of encryption request ({length})")
    if len(buf) < length:
        return None
    raw = bytes(buf[:length])
    if code == SSL_REQUEST_CODE:
        return SSLRequest(raw), length
    if code == GSSENC_REQUEST_CODE:
        return GSSENCRequest(raw), length
    if code == CANCEL_REQUEST_CODE:
        (pid,) = _I32.unpack_from(raw, 8)
        return CancelRequest(raw, pid, raw[12:]), length
    if code >> 16 != 3:
        raise ProtocolViolation(
            f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: "
            "server supports 3.0 to 3.2",
            sqlstate="0A000",
        )
    return StartupMessage(raw, code, _parse_startup_params(raw)), length


def _parse_startup_params(raw: bytes) -> dict[str, str]:
    body = raw[8:]
    if not body.endswith(b"\x00"):
        raise ProtocolViolation("invalid startup packet layout: expected terminator as last byte")
    # "name\0value\0" pairs, then one more "\0" that ends the list.
    parts = body[:-1].split(b"\x00")
    if parts[-1] != b"":
        raise ProtocolViolation("invalid startup packet layout: expected terminator as last byte")
    parts.pop()
    if len(parts) % 2:
        raise ProtocolViolation("invalid startup packet layout: odd number of name/value strings")
    params: dict[str, str] = {}
    for i in range(0, len(parts), 2):
        try:
            name, value = parts[i].decode(), parts[i + 1].decode()
        except UnicodeDecodeError:
            raise ProtocolViolation("invalid startup packet: parameter is not valid UTF-8") from None
        if not name:
            raise ProtocolViolation("invalid startup packet layout: empty parameter name")
        params[name] = value
    if "user" not in params:
        raise ProtocolViolation("no PostgreSQL user name specified in startup packet", sqlstate="28000")
    return params
