"""Sans-IO framing of the PostgreSQL v3 wire protocol.

Nothing here touches a socket. The session feeds received chunks in and gets
back the few messages it asked to see; every other message is only walked
(type byte + length) so the chunk can be forwarded as it arrived, without
copying or re-encoding. A chunk is walked *before* it is forwarded, so a
protocol violation stops the stream exactly at the first bad message.
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
_HEADER = struct.Struct("!BI")


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


# --------------------------------------------------------------------------
# Typed messages after startup


class MessageWalker:
    """Walks a stream of typed messages (1-byte type, 4-byte length, body).

    ``feed(chunk)`` returns the complete messages whose type is in ``capture``
    as ``(type, body)`` pairs, in stream order, each with the offset in the
    chunk just past it; all other messages are skipped without copying.
    ``allowed`` (a set of type bytes) rejects any other type; ``None`` allows all.
    """

    __slots__ = ("capture", "allowed", "max_length", "_hdr", "_need", "_type", "_body", "messages")

    def __init__(self, capture: frozenset[int] = frozenset(), allowed: frozenset[int] | None = None,
                 max_length: int = MAX_MESSAGE_LENGTH):
        self.capture = capture
        self.allowed = allowed
        self.max_length = max_length
        self._hdr = b""  # a header split across chunks (fewer than 5 bytes)
        self._need = 0  # body bytes of the current message still to come
        self._type = 0
        self._body: bytearray | None = None  # a captured body still being assembled
        self.messages = 0  # complete messages walked so far

    @property
    def at_boundary(self) -> bool:
        """True when the bytes fed so far end exactly at a message boundary."""
        return not self._need and not self._hdr

    @property
    def current_type(self) -> int:
        """Type byte of the message in progress (valid when not at a boundary)."""
        return self._type

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, bytes, int]]:
        out: list[tuple[int, bytes, int]] = []
        n = len(data)
        pos = 0
        need = self._need
        if need:
            take = need if need < n else n
            if self._body is not None:
                self._body += data[:take]
            need -= take
            pos = take
            if not need:
                self.messages += 1
                if self._body is not None:
                    out.append((self._type, bytes(self._body), pos))
                    self._body = None
        elif self._hdr:
            # Complete the split header from the start of this chunk.
            missing = 5 - len(self._hdr)
            if n < missing:
                self._hdr += bytes(data)
                return out
            head = self._hdr + bytes(data[:missing])
            self._hdr = b""
            t, length = _HEADER.unpack(head)
            self._check(t, length, 0)
            self._type = t
            body_len = length - 4
            pos = missing
            take = body_len if body_len < n - pos else n - pos
            if t in self.capture:
                self._body = bytearray(data[pos:pos + take])
            pos += take
            need = body_len - take
            if not need:
                self.messages += 1
                if self._body is not None:
                    out.append((t, bytes(self._body), pos))
                    self._body = None
        capture = self.capture
        unpack = _HEADER.unpack_from
        while not need and pos < n:
            if n - pos < 5:
                self._hdr = bytes(data[pos:])
                break
            t, length = unpack(data, pos)
            self._check(t, length, pos)
            end = pos + 1 + length
            if end <= n:
                self.messages += 1
                if t in capture:
                    out.append((t, bytes(data[pos + 5:end]), end))
                pos = end
            else:
                self._type = t
                if t in capture:
                    self._body = bytearray(data[pos + 5:])
                need = end - n
                pos = n
        self._need = need
        return out

    def _check(self, t: int, length: int, pos: int) -> None:
        if self.allowed is not None and t not in self.allowed:
            raise ProtocolViolation(f"invalid frontend message type {t}", valid_upto=pos)
        if length < 4:
            raise ProtocolViolation(f"invalid message length {length}", valid_upto=pos)
        if length - 4 > self.max_length:
            raise ProtocolViolation(
                f"message of type {chr(t)!r} is too long ({length} bytes, limit {self.max_length + 4})",
                sqlstate="54000", valid_upto=pos)


class EditFramer:
    """Frames a frontend stream so that the caller can replace whole messages before forwarding a chunk.

    ``feed(chunk)`` validates every message as :class:`MessageWalker` does and returns
    ``(items, lo, hi)``. ``items`` are ``(type, body, start, end)`` for each complete message whose
    type is in ``capture``, in stream order, with its offsets in the chunk. A captured message that
    does not fit in one chunk is held back whole until it is complete (so it can still be replaced),
    and comes with ``start == end == -1``: its bytes are not in the chunk's forwardable span.
    ``chunk[lo:hi]`` is what may be forwarded: before ``lo`` lies the tail of a held message that
    completed here, from ``hi`` on the start of one that did not. Everything else is forwarded as it
    arrives, never copied.

    A protocol violation does not raise: the messages before it are returned as usual, ``hi`` stops
    at the bad message, and ``violation`` holds the :class:`ProtocolViolation` (as PostgreSQL does,
    the complete messages before a bad one are still processed).
    """

    __slots__ = ("capture", "allowed", "max_length", "_hdr", "_need", "_type", "_held", "violation")

    def __init__(self, capture: frozenset[int], allowed: frozenset[int] | None = None,
                 max_length: int = MAX_MESSAGE_LENGTH):
        self.capture = capture
        self.allowed = allowed
        self.max_length = max_length
        self._hdr = b""  # the first bytes (fewer than 5) of a message whose header is split across chunks
        self._need = 0  # body bytes of the message in progress still to come
        self._type = 0
        self._held: bytearray | None = None  # the body so far of a held message in progress
        self.violation: ProtocolViolation | None = None

    @property
    def at_boundary(self) -> bool:
        return not self._need and not self._hdr

    def feed(self, data: bytes) -> tuple[list[tuple[int, bytes, int, int]], int, int]:
        items: list[tuple[int, bytes, int, int]] = []
        n = len(data)
        pos = lo = 0
        if self._hdr:  # complete a split header
            take = min(5 - len(self._hdr), n)
            self._hdr += data[:take]
            pos = take
            if len(self._hdr) < 5:
                return items, (n if self._held is not None else 0), n
            t, length = _HEADER.unpack(self._hdr)
            self._hdr = b""
            self._type = t
            if self._invalid(t, length, 0):
                return items, 0, 0
            self._need = length - 4
            if not self._need and self._complete(items):
                lo = pos
        if self._need:  # the body of the message in progress
            take = min(self._need, n - pos)
            if self._held is not None:
                self._held += data[pos:pos + take]
            pos += take
            self._need -= take
            if self._need:
                return items, (n if self._held is not None else 0), n
            if self._complete(items):
                lo = pos
        hi = n
        capture = self.capture
        unpack = _HEADER.unpack_from
        while pos < n:
            if n - pos < 5:
                t = data[pos]
                if self.allowed is not None and t not in self.allowed:
                    self.violation = ProtocolViolation(f"invalid frontend message type {t}", valid_upto=pos)
                    return items, lo, pos
                self._hdr = data[pos:]
                self._type = t
                if t in capture:
                    self._held = bytearray()
                    hi = pos
                break
            t, length = unpack(data, pos)
            if self._invalid(t, length, pos):
                return items, lo, pos
            end = pos + 1 + length
            if end <= n:
                if t in capture:
                    items.append((t, data[pos + 5:end], pos, end))
                pos = end
            else:
                self._type = t
                self._need = end - n
                if t in capture:
                    self._held = bytearray(data[pos + 5:])
                    hi = pos
                break
        return items, lo, hi

    def _complete(self, items: list) -> bool:
        """The message in progress is complete: report it if it was held (then True)."""
        if self._held is None:
            return False
        items.append((self._type, bytes(self._held), -1, -1))
        self._held = None
        return True

    def _invalid(self, t: int, length: int, pos: int) -> bool:
        if self.allowed is not None and t not in self.allowed:
            self.violation = ProtocolViolation(f"invalid frontend message type {t}", valid_upto=pos)
        elif length < 4:
            self.violation = ProtocolViolation(f"invalid message length {length}", valid_upto=pos)
        elif length - 4 > self.max_length:
            self.violation = ProtocolViolation(
                f"message of type {chr(t)!r} is too long ({length} bytes, limit {self.max_length + 4})",
                sqlstate="54000", valid_upto=pos)
        else:
            return False
        self._held = None
        return True


RAW, HELD, SEEN = 0, 1, 2


class StreamSplitter:
    """Frames a backend message stream whose messages may need rewriting.

    ``feed(chunk, hold, capture)``: when ``hold`` is true, every message that starts in this chunk is
    *held*: returned whole, as ``(HELD, type, body)``, for the caller to rewrite. Any other message
    goes out untouched as part of a ``(RAW, bytes)`` span (adjacent spans are merged, so a chunk with
    nothing held comes back as itself), and if its type is in ``capture`` a copy of its body is
    reported as ``(SEEN, type, body)`` once complete, for bookkeeping. A message in progress keeps
    the decision made when it started. Items come in stream order.
    """

    __slots__ = ("_hdr", "_need", "_type", "_body", "_held", "_seen")

    def __init__(self) -> None:
        self._hdr = b""
        self._need = 0
        self._type = 0
        self._body: bytearray | None = None  # body being assembled (held or seen)
        self._held = False  # the message in progress is held
        self._seen = False  # …or only seen

    @property
    def at_boundary(self) -> bool:
        return not self._need and not self._hdr

    def feed(self, data: bytes, hold: bool, capture: frozenset[int], rows=None,
             hold_types: frozenset[int] = frozenset()) -> list:
        """``rows``: with ``hold``, a function that rewrites a DataRow body into its message bytes; the
        DataRows that lead the chunk (before any other held message, which may change the result they
        belong to) go through it here and come back as ``(RAW, bytes)``. ``hold_types``: messages of
        these types are held even when ``hold`` is false."""
        out: list = []
        n = len(data)
        pos = 0
        raw_from = None  # start of the current raw span in ``data``
        unpack = _HEADER.unpack_from
        while pos < n:
            if self._need:
                take = min(self._need, n - pos)
                if not self._held and raw_from is None:
                    raw_from = pos
                if self._body is not None:
                    self._body += data[pos:pos + take]
                pos += take
                self._need -= take
                if not self._need:
                    if self._held and self._type != 0x44:
                        rows = None  # a held message other than a DataRow may end the result
                    raw_from = self._finish(out, raw_from)
                continue
            if not self._hdr:
                # a message starts here
                if n - pos >= 5:
                    t, length = unpack(data, pos)
                    end = pos + 1 + length
                    if end <= n and 4 <= length:
                        # the common case: the whole message is in this chunk; slice, don't assemble
                        if hold or t in hold_types:
                            if raw_from is not None:
                                out.append((RAW, data[raw_from:pos]))
                                raw_from = None
                            if t == 0x44 and rows is not None:
                                out.append((RAW, rows(data[pos + 5:end])))
                            else:
                                rows = None
                                out.append((HELD, t, data[pos + 5:end]))
                        else:
                            if raw_from is None:
                                raw_from = pos
                            if t in capture:
                                out.append((SEEN, t, data[pos + 5:end]))
                            elif t == 0x44:
                                # a result's rows, relayed untouched: hop over the run of whole DataRows with
                                # nothing else to decide (most of a page's messages; sans-IO, a 100-row page in
                                # 8 KB chunks: 26.6 -> 18.8 us)
                                pos = end
                                while pos + 5 <= n:
                                    t, length = unpack(data, pos)
                                    end = pos + 1 + length
                                    if t != 0x44 or end > n or length < 4:
                                        break
                                    pos = end
                                continue
                        pos = end
                        continue
                self._held = hold or data[pos] in hold_types
                self._seen = not self._held and data[pos] in capture
                rows = None
                if self._held and raw_from is not None:
                    out.append((RAW, data[raw_from:pos]))
                    raw_from = None
            take = min(5 - len(self._hdr), n - pos)
            if not self._held and raw_from is None:
                raw_from = pos
            self._hdr += data[pos:pos + take]
            pos += take
            if len(self._hdr) < 5:
                break
            t, length = _HEADER.unpack(self._hdr)
            if length < 4 or length - 4 > MAX_MESSAGE_LENGTH:
                if raw_from is not None and pos > raw_from:
                    out.append((RAW, data[raw_from:pos]))
                raise ProtocolViolation(f"invalid backend message length {length}")
            self._type = t
            self._need = length - 4
            self._body = bytearray() if (self._held or self._seen) else None
            self._hdr = b""
            if not self._need:
                raw_from = self._finish(out, raw_from)
        if raw_from is not None and pos > raw_from:
            out.append((RAW, data[raw_from:pos]))
        return out

    def _finish(self, out: list, raw_from: int | None) -> int | None:
        body = self._body
        self._body = None
        if self._held:
            out.append((HELD, self._type, bytes(body)))
            self._held = False
            return None
        if body is not None:
            # bookkeeping only: the raw span goes on (its bytes are written after, in one piece)
            out.append((SEEN, self._type, bytes(body)))
        return raw_from
