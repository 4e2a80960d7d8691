"""The era-3 page (ADR 0024), sans-IO: a run's page read first as an era-3 run's rows as stored, the seat's page
statement its fallback.

An era-3 run's page through the seat's page statement pays PostgreSQL for both arms of the page's union, the v2
store's (empty: the store holds no era-3 run) and the live translation's (which joins each row to the run's era and
payloads-clean mark to leave it as stored), and for the union itself: about 40 µs of its CPU a page more than the
run's rows as stored (ADR 0021's second addendum, ADR 0024). Its fast twin, ``events_m2_run_era3(run)`` under the
page's own clauses (``Classifier._fast_text``), returns the run's rows as stored where the run is era 3, in the
statement's own snapshot, and no row for any other run. So:

- a group that is one page and nothing else (``[empty unnamed Parse] Bind Describe-portal? Execute Sync``, the
  unnamed portal, every row: what node-postgres, libpq and ``pgbench -M extended`` send for a page, the read path's
  plan-once statement in the Bind) is sent with the twin's name in its Bind instead (and the twin's Parse before
  it, the first time in a session);
- the answer is read up to its first DataRow, and relayed as it came from there: a row means the run is era 3, so
  those are the page's rows;
- an answer with no row (``CommandComplete`` before any ``DataRow``) is dropped, all of it but notices,
  notifications and parameter changes, and the group goes again as the read path made it: the page statement's
  answer is the client's, in a new statement (in the same transaction, if the client's is a block: a page is a
  read, and what the fast statement read is not sent);
- an error is the client's, relayed as it came (both statements carry the same gates and guard);
- meanwhile what the client sends waits in the relay, so the page's own statement goes before it.

Where the run's page missed, the run is left to the page statement for ``MISS_SECONDS`` (process-wide, by the twin's
text and the run's parameter as bound): an era-2 run (filled or not), or an era-3 run's page past its end, would
otherwise pay both statements at every page. A run's hint is never trusted for a row: each fast answer is checked in
the database.
"""

from __future__ import annotations

import struct
import time

from proxy.wire import messages

# What the group must hold, byte for byte, besides its Bind (the unnamed portal throughout, every row).
EMPTY_PARSE = messages.message(b"P", b"\x00\x00\x00\x00")  # the read path's empty unnamed Parse
DESCRIBE_PORTAL = messages.message(b"D", b"P\x00")
EXECUTE_ALL = messages.message(b"E", b"\x00\x00\x00\x00\x00")
SYNC = messages.message(b"S", b"")
PARSE_COMPLETE = messages.message(b"1", b"")

# A twin's state in the read path's ReadPath.fast_twins: [state, name, Parse message, run parameter, fast text]
NOT_PREPARED, PREPARED, BROKEN = 0, 1, -1

MISS_SECONDS = 60.0
# A session whose pages went as the page statement COOL_AFTER times in a row (it reads era-2 runs) sends its next
# COOL_GROUPS groups as they are, without the twin's matching and hint lookup (ADR 0024: a µs of Python a page).
COOL_AFTER, COOL_GROUPS = 8, 256
MAX_HINTS = 65536  # runs remembered as missed, per process (then forgotten all at once)
_missed: dict[tuple, float] = {}

# The answer's messages that do not settle a fast page: carried over on a miss (an asynchronous message) or
# dropped with it (the page's own).
_ASYNC = frozenset(b"NSA")
_OWN = frozenset(b"12Tn")


def match(out: bytes, twins: dict) -> tuple[int, int, list, tuple] | None:
    """Is ``out`` (the bytes the read path sends for a client's chunk) one page group whose Bind names a plan-once
    statement with a fast twin? (the Bind's start, its end, the twin, the run's hint key), or None."""
    if not out.endswith(SYNC) or len(out) < 32:
        return None
    pos = len(EMPTY_PARSE) if out.startswith(EMPTY_PARSE) else 0
    if out[pos:pos + 1] != b"B":
        return None
    (length,) = struct.unpack_from("!i", out, pos + 1)
    start, end = pos, pos + 1 + length
    rest = out[end:]
    if rest != DESCRIBE_PORTAL + EXECUTE_ALL + SYNC and rest != EXECUTE_ALL + SYNC:
        return None
    body = out[start + 5:end]
    if body[:1] != b"\x00":  # a named portal: a Bind sent again would find it
        return None
    name_end = body.index(b"\x00", 1)
    twin = twins.get(body[1:name_end])
    if twin is None or twin[0] == BROKEN:
        return None
    key = _run_parameter(body, name_end + 1, twin[3])
    if key is None:
        return None
    return start, end, twin, (twin[4],) + key


def _run_parameter(body: bytes, pos: int, number: int) -> tuple | None:
    """(format code, value as bound) of parameter ``number`` (1-based; 0: the text names the run, ``()``), or None
    for a Bind that does not hold it."""
    if number == 0:
        return ()
    (nformats,) = struct.unpack_from("!h", body, pos)
    formats = struct.unpack_from(f"!{nformats}h", body, pos + 2) if nformats > 0 else ()
    pos += 2 + 2 * nformats
    (nparams,) = struct.unpack_from("!h", body, pos)
    if number > nparams:
        return None
    pos += 2
    for i in range(1, number + 1):
        (size,) = struct.unpack_from("!i", body, pos)
        pos += 4
        if i == number:
            fmt = formats[0] if nformats == 1 else formats[i - 1] if nformats > 1 else 0
            return fmt, None if size < 0 else body[pos:pos + size]
        pos += max(size, 0)
    return None


def missed(key: tuple, now: float | None = None) -> bool:
    """Did this run's fast page miss less than MISS_SECONDS ago?"""
    until = _missed.get(key)
    if until is None:
        return False
    if (time.monotonic() if now is None else now) < until:
        return True
    del _missed[key]
    return False


def remember_miss(key: tuple) -> None:
    if len(_missed) >= MAX_HINTS:
        _missed.clear()
    _missed[key] = time.monotonic() + MISS_SECONDS


def forget_miss(key: tuple) -> None:
    _missed.pop(key, None)


class Pending:
    """One fast page sent, its answer not settled: the group to send again on a miss, the run's hint key, the
    twin, whether its Parse went first, the twins closed before it, the server's bytes read so far and the
    client's held."""

    __slots__ = ("client", "client_bytes", "closes", "fallback", "injected", "key", "server", "twin")

    def __init__(self, fallback: bytes, key: tuple, twin: list, closes: list[bytes] | tuple = ()):
        self.fallback = fallback
        self.key = key
        self.twin = twin
        self.injected = twin[0] == NOT_PREPARED
        self.closes = closes
        self.server = bytearray()
        self.client: list[bytes] = []
        self.client_bytes = 0

    @property
    def lead(self) -> int:
        """The answers the seat's own messages ahead of the page get: a CloseComplete each, the twin's
        ParseComplete."""
        return len(self.closes) + self.injected

    def group(self, start: int, end: int) -> bytes:
        """The fast group: the twins no statement names closed, the twin's Parse (the first time), then the page
        group with the twin named in its Bind."""
        out = self.fallback
        body = out[start + 5:end]
        name_end = body.index(b"\x00", 1)
        bind = messages.message(b"B", b"\x00" + self.twin[1] + body[name_end:])
        lead = b"".join(messages.message(b"C", b"S" + name + b"\x00") for name in self.closes) if self.closes else b""
        return lead + (self.twin[2] if self.injected else b"") + out[:start] + bind + out[end:]

    def hold(self, data: bytes) -> None:
        self.client.append(data)
        self.client_bytes += len(data)


def scan(buf: bytes | bytearray, lead: int) -> tuple:
    """Read a fast page's answer so far; ``lead``: the answers of the seat's own messages that come first
    (``Pending.lead``). ``("more",)``: not settled yet. ``("rows", kept, start, left)``: a DataRow came (or an error,
    ``("error", kept, start, left)``): the answer is the client's from byte ``start`` on (past the seat's own
    answers), after ``kept`` (the asynchronous messages among them); ``left``: the seat's own answers that did not
    come (0 but for an answer that is not a page's). ``("empty", kept, rest)``: no row, the answer's ReadyForQuery
    seen: only ``kept`` (its asynchronous messages) is the client's, and ``rest`` follows it. ``("unprepared", kept,
    rest)``: a message of the seat's failed (the twin's Parse), the same."""
    pos, size = 0, len(buf)
    start = 0
    settled = None  # b"C" once CommandComplete came with no row, b"P" once the seat's own message failed
    kept: list[bytes] = []
    before = 0  # how many of kept came before start
    while size - pos >= 5:
        t = buf[pos]
        (length,) = struct.unpack_from("!i", buf, pos + 1)
        end = pos + 1 + length
        if length < 4 or end > size:
            if length < 4:  # malformed: the relay's own framing reports it
                return ("error", b"".join(kept[:before]), pos if lead else start, lead)
            return ("more",)
        if t in _ASYNC:
            kept.append(bytes(buf[pos:end]))
            if lead:
                before += 1
        elif lead:
            if t == 0x45:  # 'E': the seat's Close or the twin's Parse failed; the server skips up to the Sync
                settled = b"P"
                lead = 0
            elif t == 0x31 or t == 0x33:  # ParseComplete, CloseComplete: not the client's
                lead -= 1
                if not lead:
                    start = end
            else:  # not an answer to the seat's messages: the client's from here, as it came
                return ("error", b"".join(kept[:before]), pos, lead)
        elif t == 0x5A:  # 'Z'
            if settled is None:  # a ReadyForQuery before the page's end: not a page's answer
                return ("error", b"".join(kept[:before]), start, lead)
            return ("empty" if settled == b"C" else "unprepared", b"".join(kept), bytes(buf[end:]))
        elif settled is not None:
            pass  # after the twin's failed Parse or the page's empty end: dropped up to the ReadyForQuery
        elif t == 0x44:  # 'D'
            return ("rows", b"".join(kept[:before]), start, lead)
        elif t == 0x43:  # 'C' before any row
            settled = b"C"
        elif t not in _OWN:  # an error, or anything a page's answer does not hold: the client's, as it came
            return ("error", b"".join(kept[:before]), start, lead)
        pos = end
    return ("more",)
