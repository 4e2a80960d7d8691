"""The one framer of typed messages, for both directions (sans-IO).

A stream of typed messages (1-byte type, 4-byte length, body) is fed in chunks as they arrive. Each
message gets the *verb* its type byte selects in the framer's current table:

* ``FORWARD``: its bytes go on untouched, as part of a span of the chunk (never copied one by one).
* ``COPY``: they go on untouched too, and a copy of the body is reported once complete, for bookkeeping.
* ``HOLD``: the message is taken out of the stream and reported whole, so the caller can rewrite it (or
  write it back with :func:`proxy.wire.messages.message`). A held message split across chunks is kept
  until it is complete.
* ``REFUSE``: the type is not allowed here (a frontend message type PostgreSQL does not know): a
  protocol violation at its first byte.

``feed(chunk)`` returns the items in stream order: ``(SPAN, bytes)``, ``(COPY, type, body)``,
``(HOLD, type, body)``. Writing every SPAN and a replacement (or the original) for every HOLD, in order,
gives the stream to send on; a chunk with nothing held comes back as one SPAN that is the chunk itself.
A message in progress keeps the verb its type had when it started, so the caller may switch tables
between chunks (PgBouncer's ``sbuf`` does the same with its per-packet send/skip/call decision).

A protocol violation (a refused type, a length below 4 or above the limit) does not raise: the items
before the bad message are returned as usual, and :attr:`Framer.violation` holds the
:class:`~proxy.wire.codec.ProtocolViolation`; the stream cannot be resynchronised, so the caller ends
the session. As PostgreSQL does, complete messages before a bad one are still processed.

Two implementations do exactly this (ADR 0018): :class:`PyFramer`, the pure-Python definition below, and
:class:`CFramer`, the same ``feed`` compiled from ``_cframer.c`` when ``make setup`` built it. :data:`Framer`
is the one the seat uses: the compiled one when it is built, else the pure-Python one (and
:data:`IMPLEMENTATION_NOTE` says why); the environment variable ``OPENWOP_SEAT_FRAMER`` (``c`` or ``python``)
chooses explicitly. Both run the same unit tests.
"""

from __future__ import annotations

import os
import struct

from proxy.wire.codec import MAX_MESSAGE_LENGTH, ProtocolViolation
from proxy.wire.types import DATA_ROW

FORWARD, COPY, HOLD, REFUSE = 0, 1, 2, 3
SPAN = 0  # an item of forwarded bytes (FORWARD and COPY messages alike)

_HEADER = struct.Struct("!BI")


def verbs(default: int = FORWARD, **by_verb: frozenset[int] | bytes) -> bytes:
    """A verb table: one verb per type byte, ``default`` for the types not named, e.g.
    ``verbs(REFUSE, forward=FRONTEND_TYPES, hold=b"PB")`` (later keywords win over earlier ones)."""
    table = bytearray([default]) * 256
    for name, types in by_verb.items():
        verb = {"forward": FORWARD, "copy": COPY, "hold": HOLD, "refuse": REFUSE}[name]
        for t in types:
            table[t] = verb
    # one object per distinct table, shared by every session that asks for it (a few tables in all)
    return _TABLES.setdefault(bytes(table), bytes(table))


_TABLES: dict[bytes, bytes] = {}


PASS_ALL = verbs()  # every message forwarded: the framer only keeps track of boundaries
HOLD_ALL = verbs(HOLD)  # every message held: whole messages, for an exchange the seat reads itself


class _Violations:
    """How a framer reports a violation: shared by both implementations, so that their text is one."""

    __slots__ = ()

    def _refuse(self, t: int, pos: int) -> None:
        self.violation = ProtocolViolation(f"invalid frontend message type {t}", valid_upto=pos)

    def _length_violation(self, t: int, length: int, pos: int) -> None:
        if length < 4:
            self.violation = ProtocolViolation(f"invalid message length {length}", valid_upto=pos)
        else:
            self.violation = ProtocolViolation(
                f"message of type {chr(t)!r} is too long ({length} bytes, limit {self.max_length + 4})",
                sqlstate="54000", valid_upto=pos)


class PyFramer(_Violations):
    """Frames one direction of a session; see the module docstring. ``table`` may be replaced at any time."""

    __slots__ = ("table", "max_length", "violation", "_hdr", "_need", "_type", "_verb", "_body")

    def __init__(self, table: bytes = PASS_ALL, max_length: int = MAX_MESSAGE_LENGTH):
        self.table = table
        self.max_length = max_length
        self.violation: ProtocolViolation | None = None
        self._hdr = b""  # the first bytes (fewer than 5) of a message whose header is split across chunks
        self._need = 0  # body bytes of the message in progress still to come
        self._type = 0
        self._verb = FORWARD  # the verb of the message in progress
        self._body: bytearray | None = None  # its body so far, when it is copied or held

    @property
    def at_boundary(self) -> bool:
        """True when the bytes fed so far end exactly at a message boundary."""
        return not self._need and not self._hdr

    def feed(self, data: bytes) -> list:
        out: list = []
        if self.violation is not None:
            return out
        n = len(data)
        pos = 0
        span = -1  # start of the current span of forwarded bytes in ``data``, or -1
        table = self.table
        limit = self.max_length + 4
        unpack = _HEADER.unpack_from
        while pos < n:
            if self._need:  # the body of the message in progress
                take = self._need if self._need < n - pos else n - pos
                if self._verb != HOLD and span < 0:
                    span = pos
                if self._body is not None:
                    self._body += data[pos:pos + take]
                pos += take
                self._need -= take
                if not self._need:
                    self._complete(out)
                continue
            if not self._hdr and n - pos >= 5:
                t, length = unpack(data, pos)
                end = pos + 1 + length
                if end <= n and 4 <= length <= limit:
                    # the common case: the whole message is in this chunk; slice, don't assemble
                    verb = table[t]
                    if verb == FORWARD:
                        if span < 0:
                            span = pos
                        pos = end
                        if t == DATA_ROW:
                            # a result's rows, relayed untouched: hop over the run of whole DataRows with
                            # nothing else to decide (most of a page's messages)
                            while pos + 5 <= n:
                                t, length = unpack(data, pos)
                                end = pos + 1 + length
                                if t != DATA_ROW or end > n or length < 4:
                                    break
                                pos = end
                        continue
                    if verb == COPY:
                        if span < 0:
                            span = pos
                        out.append((COPY, t, data[pos + 5:end]))
                        pos = end
                        continue
                    if verb == HOLD:
                        if span >= 0:
                            out.append((SPAN, data[span:pos]))
                            span = -1
                        out.append((HOLD, t, data[pos + 5:end]))
                        pos = end
                        continue
                    # REFUSE, or a length over the limit: the checks below report it
            # a header, whole or split, of a message that does not end in this chunk (or is bad)
            if not self._hdr:
                verb = table[data[pos]]
                if verb == REFUSE:
                    self._refuse(data[pos], pos)
                    break
                self._verb = verb
                if verb == HOLD and span >= 0:
                    out.append((SPAN, data[span:pos]))
                    span = -1
            if self._verb != HOLD and span < 0:
                span = pos
            take = 5 - len(self._hdr)
            if take > n - pos:
                take = n - pos
            self._hdr += data[pos:pos + take]
            pos += take
            if len(self._hdr) < 5:
                break
            t, length = _HEADER.unpack(self._hdr)
            self._hdr = b""
            if length < 4 or length - 4 > self.max_length:
                # the bad message's header is not forwarded: the span stops where it started
                start = pos - 5
                if span >= 0 and start > span:
                    out.append((SPAN, data[span:start]))
                span = -1
                self._length_violation(t, length, start if start > 0 else 0)
                break
            self._type = t
            self._need = length - 4
            self._body = bytearray() if self._verb != FORWARD else None
            if not self._need:
                self._complete(out)
        if span >= 0 and pos > span:
            out.append((SPAN, data if span == 0 and pos == n else data[span:pos]))
        return out

    def _complete(self, out: list) -> None:
        body = self._body
        if body is not None:
            self._body = None
            out.append((self._verb, self._type, bytes(body)))


IMPLEMENTATION_ENV = "OPENWOP_SEAT_FRAMER"  # "c" or "python"; unset: the compiled one when it is built

try:
    from proxy.wire._cframer import FramerCore as _FramerCore
except ImportError as e:  # not built (no compiler when the package was installed): the pure-Python framer
    _FramerCore = None
    _MISSING = f"the compiled framer (proxy/wire/_cframer.c) is not built: {e}"
else:
    _MISSING = ""

if _FramerCore is not None:
    class CFramer(_Violations, _FramerCore):
        """:class:`PyFramer`'s behaviour with ``feed`` compiled (``_cframer.c``); the violations are built here."""

        __slots__ = ()

        def __init__(self, table: bytes = PASS_ALL, max_length: int = MAX_MESSAGE_LENGTH):
            super().__init__(table, max_length)
else:
    CFramer = None


def _select() -> tuple[type, str, str]:
    """The framer the seat uses, its name ("c" or "python"), and why it is not the compiled one ('' when it is)."""
    choice = os.environ.get(IMPLEMENTATION_ENV, "").strip().lower()
    if choice == "python":
        return PyFramer, "python", f"chosen by {IMPLEMENTATION_ENV}=python"
    if choice not in ("", "c"):
        raise ValueError(f"{IMPLEMENTATION_ENV} is {choice!r}: it may be 'c' or 'python' (or unset)")
    if CFramer is None:
        if choice == "c":
            raise ImportError(f"{IMPLEMENTATION_ENV}=c, but {_MISSING}; run make setup (it needs a C compiler "
                              "and Python's headers), or unset it for the pure-Python framer")
        return PyFramer, "python", _MISSING
    return CFramer, "c", ""


# The framer the seat uses; IMPLEMENTATION names it, IMPLEMENTATION_NOTE says why it is the pure-Python one.
Framer, IMPLEMENTATION, IMPLEMENTATION_NOTE = _select()
