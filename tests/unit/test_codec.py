"""Byte-for-byte tests of the sans-IO wire code (no sockets, no server)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire import messages
from proxy.wire.codec import (FRONTEND_TYPES, MAX_MESSAGE_LENGTH, PROTOCOL_3_0, PROTOCOL_3_2, HELD, RAW, SEEN,
                              CancelRequest, EditFramer, GSSENCRequest, MessageWalker, ProtocolViolation, SSLRequest,
                              StartupMessage, StreamSplitter, parse_initial_packet)
from proxy.wire.state import BACKEND_CAPTURE, Phase, SessionState


def msg(t: bytes, body: bytes = b"") -> bytes:
    """Independent of the code under test: type, big-endian length including itself, body."""
    return t + struct.pack("!I", len(body) + 4) + body


# ---------------------------------------------------------------- initial packets


def test_ssl_request_bytes():
    raw = bytes.fromhex("0000000804d2162f")
    packet, used = parse_initial_packet(raw + b"extra")
    assert isinstance(packet, SSLRequest) and used == 8 and packet.raw == raw
    assert messages.ssl_request() == raw


def test_gssenc_request_bytes():
    packet, used = parse_initial_packet(bytes.fromhex("0000000804d21630"))
    assert isinstance(packet, GSSENCRequest) and used == 8


def test_cancel_request_3_0_and_3_2_keys():
    raw = bytes.fromhex("00000010 04d2162e 00003039 deadbeef".replace(" ", ""))
    packet, used = parse_initial_packet(raw)
    assert isinstance(packet, CancelRequest)
    assert (packet.pid, packet.key, packet.raw, used) == (12345, bytes.fromhex("deadbeef"), raw, 16)
    assert messages.cancel_request(12345, bytes.fromhex("deadbeef")) == raw
    long_key = bytes(range(32))
    raw32 = messages.cancel_request(7, long_key)
    packet, used = parse_initial_packet(raw32)
    assert packet.key == long_key and used == 44


def test_startup_message_3_0_params_and_raw():
    body = struct.pack("!I", PROTOCOL_3_0) + b"user\x00alice\x00database\x00app\x00client_encoding\x00UTF8\x00\x00"
    raw = struct.pack("!I", len(body) + 4) + body
    packet, used = parse_initial_packet(raw)
    assert isinstance(packet, StartupMessage)
    assert used == len(raw) and packet.raw == raw
    assert packet.params == {"user": "alice", "database": "app", "client_encoding": "UTF8"}
    assert packet.version_text == "3.0"
    assert messages.startup_message(packet.params) == raw


def test_startup_message_3_2_is_kept_verbatim():
    raw = messages.startup_message({"user": "u", "_pq_.x": "1"}, version=PROTOCOL_3_2)
    packet, _ = parse_initial_packet(raw)
    assert packet.version == PROTOCOL_3_2 and packet.version_text == "3.2" and packet.raw == raw


def test_startup_needs_more_bytes():
    raw = messages.startup_message({"user": "u"})
    for cut in range(len(raw)):
        assert parse_initial_packet(raw[:cut]) is None


@pytest.mark.parametrize("raw, text", [
    (b"GET / HTTP/1.1\r\n", "invalid length of startup packet"),
    (struct.pack("!II", 4, 0), "invalid length of startup packet"),
    (struct.pack("!II", 1 << 30, PROTOCOL_3_0), "invalid length of startup packet"),
    (struct.pack("!II", 12, 80877103) + b"xxxx", "invalid length of encryption request"),
    (struct.pack("!II", 8, 80877102), "invalid length of cancel request"),
    (struct.pack("!II", 9, 2 << 16) + b"\x00", "unsupported frontend protocol 2.0"),
    (struct.pack("!II", 13, PROTOCOL_3_0) + b"user\x00", "invalid startup packet layout"),
    (struct.pack("!II", 14, PROTOCOL_3_0) + b"user\x00\x00", "odd number"),
    (struct.pack("!II", 9, PROTOCOL_3_0) + b"\x00", "no PostgreSQL user name"),
])
def test_bad_initial_packets(raw, text):
    with pytest.raises(ProtocolViolation) as e:
        parse_initial_packet(raw)
    assert text in e.value.message


# ---------------------------------------------------------------- typed messages


def test_walker_captures_only_requested_types_with_end_offsets():
    stream = msg(b"T", b"rowdesc") + msg(b"D", b"row1") + msg(b"C", b"SELECT 1\x00") + msg(b"Z", b"I")
    w = MessageWalker(capture=frozenset(b"CZ"))
    out = w.feed(stream)
    assert out == [(ord("C"), b"SELECT 1\x00", len(stream) - 6), (ord("Z"), b"I", len(stream))]
    assert w.at_boundary and w.messages == 4


@given(st.lists(st.tuples(st.sampled_from(sorted(FRONTEND_TYPES)), st.binary(max_size=300)), max_size=20),
       st.lists(st.integers(min_value=0, max_value=4000), max_size=30))
@settings(max_examples=300, deadline=None)
def test_walker_is_independent_of_chunking(msgs, cuts):
    stream = b"".join(msg(bytes([t]), body) for t, body in msgs)
    cuts = sorted({c for c in cuts if c < len(stream)})
    chunks = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
    w = MessageWalker(capture=frozenset(b"QPB"), allowed=FRONTEND_TYPES)
    got = []
    for i, chunk in enumerate(chunks):
        got += [(t, body) for t, body, _ in w.feed(chunk)]
        # Boundaries are known exactly after every chunk.
        done = sum(len(c) for c in chunks[: i + 1])
        assert w.at_boundary == (done in _boundaries(msgs))
    assert got == [(t, body) for t, body in msgs if t in b"QPB"]
    assert w.messages == len(msgs)


def _boundaries(msgs):
    pos, out = 0, {0}
    for _, body in msgs:
        pos += 5 + len(body)
        out.add(pos)
    return out


def test_walker_large_messages_split_across_many_chunks():
    # a 1 MiB bind parameter, and a Parse of 165 KB, fed 64 KiB at a time
    bind = msg(b"B", b"\x00\x00\x00\x00\x00\x01" + struct.pack("!i", 1 << 20) + b"x" * (1 << 20) + b"\x00\x00")
    parse = msg(b"P", b"\x00" + b"SELECT 1 " * (165_000 // 9) + b"\x00\x00\x00")
    stream = parse + bind + msg(b"S")
    w = MessageWalker(capture=frozenset(b"P"), allowed=FRONTEND_TYPES)
    got = []
    for i in range(0, len(stream), 65536):
        got += w.feed(stream[i:i + 65536])
    assert [(t, len(b)) for t, b, _ in got] == [(ord("P"), len(parse) - 5)]
    assert w.messages == 3 and w.at_boundary


def test_walker_bind_with_25000_parameters():
    params = b"".join(struct.pack("!i", 5) + b"hello" for _ in range(25_000))
    body = b"\x00\x00" + struct.pack("!H", 0) + struct.pack("!H", 25_000) + params + struct.pack("!H", 0)
    w = MessageWalker(capture=frozenset(b"B"), allowed=FRONTEND_TYPES)
    out = w.feed(msg(b"B", body))
    assert out[0][1] == body


def test_walker_rejects_unknown_frontend_type_at_its_offset():
    good = msg(b"Q", b"SELECT 1\x00")
    w = MessageWalker(allowed=FRONTEND_TYPES)
    with pytest.raises(ProtocolViolation) as e:
        w.feed(good + msg(b"\x01", b"zz"))
    assert e.value.valid_upto == len(good) and e.value.sqlstate == "08P01"
    assert "invalid frontend message type 1" in e.value.message


def test_walker_rejects_length_over_1_gib_before_reading_the_body():
    w = MessageWalker(allowed=FRONTEND_TYPES)
    with pytest.raises(ProtocolViolation) as e:
        w.feed(b"Q" + struct.pack("!I", MAX_MESSAGE_LENGTH + 5))
    assert e.value.sqlstate == "54000" and "too long" in e.value.message


def test_walker_rejects_length_below_4():
    with pytest.raises(ProtocolViolation):
        MessageWalker().feed(b"Q\x00\x00\x00\x03")


def test_walker_header_split_then_violation_points_at_chunk_start():
    w = MessageWalker(allowed=FRONTEND_TYPES)
    assert w.feed(b"\x02\x00") == [] and not w.at_boundary
    with pytest.raises(ProtocolViolation) as e:
        w.feed(b"\x00\x00\x05")
    assert e.value.valid_upto == 0


def test_walker_truncated_message_is_not_at_boundary():
    w = MessageWalker(allowed=FRONTEND_TYPES)
    w.feed(msg(b"Q", b"SELECT 1\x00")[:7])
    assert not w.at_boundary and w.current_type == ord("Q")


# ---------------------------------------------------------------- message bodies


def test_error_response_layout():
    raw = messages.error_response("08006", "upstream gone", severity="FATAL", detail="d")
    body = b"SFATAL\x00VFATAL\x00C08006\x00Mupstream gone\x00Dd\x00\x00"
    assert raw == msg(b"E", body)
    assert messages.parse_error_fields(body) == {"S": "FATAL", "V": "FATAL", "C": "08006",
                                                 "M": "upstream gone", "D": "d"}


def test_channel_binding_offer_is_removed_for_plaintext_clients():
    offer = struct.pack("!I", 10) + b"SCRAM-SHA-256-PLUS\x00SCRAM-SHA-256\x00\x00"
    assert messages.without_channel_binding(offer) == struct.pack("!I", 10) + b"SCRAM-SHA-256\x00\x00"
    assert messages.without_channel_binding(struct.pack("!I", 10) + b"SCRAM-SHA-256\x00\x00") is None
    assert messages.without_channel_binding(struct.pack("!I", 5) + b"salt") is None  # md5 request
    stream = msg(b"R", offer) + msg(b"S", b"a\x00b\x00")
    assert list(messages.iter_messages(stream)) == [(ord("R"), offer), (ord("S"), b"a\x00b\x00")]


def test_simple_messages():
    assert messages.ready_for_query(b"T") == b"Z\x00\x00\x00\x05T"
    assert messages.terminate() == b"X\x00\x00\x00\x04"
    assert messages.query("SELECT 1") == b"Q\x00\x00\x00\x0dSELECT 1\x00"


# ---------------------------------------------------------------- session state


def test_session_state_follows_a_login_and_a_transaction():
    s = SessionState()
    w = MessageWalker(capture=BACKEND_CAPTURE)
    login = (msg(b"R", struct.pack("!I", 0)) + msg(b"S", b"server_version\x0015.18\x00")
             + msg(b"K", struct.pack("!i", 4242) + b"\x01\x02\x03\x04") + msg(b"Z", b"I"))
    for t, body, _ in w.feed(login):
        s.on_backend(t, body)
    assert s.auth_ok and s.phase is Phase.READY and s.backend_pid == 4242
    assert s.backend_key == b"\x01\x02\x03\x04" and s.server_params["server_version"] == "15.18"
    for t, body, _ in w.feed(msg(b"C", b"BEGIN\x00") + msg(b"Z", b"T")):
        s.on_backend(t, body)
    assert s.in_transaction
    for t, body, _ in w.feed(msg(b"E", b"SERROR\x00VERROR\x00C22012\x00Mdivision by zero\x00\x00") + msg(b"Z", b"E")):
        s.on_backend(t, body)
    assert s.txn_status == b"E" and s.phase is Phase.READY


def test_session_state_fatal_and_negotiate_protocol_version():
    s = SessionState()
    s.on_backend(ord("v"), struct.pack("!II", 3 << 16, 0))
    assert s.negotiated_minor == 0
    s.on_backend(ord("E"), b"SFATAL\x00VFATAL\x00C57P01\x00Mterminating\x00\x00")
    assert s.phase is Phase.CLOSING and s.last_fatal["C"] == "57P01"
    s2 = SessionState()
    s2.on_frontend(ord("X"), b"")
    assert s2.phase is Phase.CLOSING


# ---------------------------------------------------------------- EditFramer (client stream of a translating session)

# The client messages a translating session captures (proxy.serve.session.READ_FRONTEND).
EDIT_CAPTURE = frozenset(b"QPBDECSFX")


def _frame(framer: EditFramer, chunks) -> tuple[list[tuple[int, bytes]], bytes]:
    """Feed ``chunks`` and rebuild what the session forwards, as `Session._relay_client_read` does with
    no replacement: per chunk, the held messages completed in it (re-encoded) first, then ``chunk[lo:hi]``.
    Checks each item's offsets on the way."""
    captured: list[tuple[int, bytes]] = []
    forwarded = bytearray()
    for chunk in chunks:
        items, lo, hi = framer.feed(chunk)
        assert 0 <= lo <= hi <= len(chunk)
        held_done = [it for it in items if it[2] < 0]
        # at most one held message completes per chunk, and it is the first item (it precedes the span)
        assert len(held_done) <= 1 and items[:len(held_done)] == held_done
        for t, body, start, end in items:
            captured.append((t, bytes(body)))
            if start < 0:
                assert end == -1
                forwarded += msg(bytes([t]), body)
            else:
                assert lo <= start < end <= hi and chunk[start:end] == msg(bytes([t]), body)
        forwarded += chunk[lo:hi]
    return captured, bytes(forwarded)


def _layout(msgs) -> list[tuple[int, int, int]]:
    """(type, start, end) of each message of the stream made of ``msgs``."""
    out, pos = [], 0
    for t, body in msgs:
        out.append((t, pos, pos + 5 + len(body)))
        pos += 5 + len(body)
    return out


def _forwardable(msgs, consumed: int, capture) -> int:
    """How much of the stream must have been forwarded once ``consumed`` bytes were fed: all of it but a
    captured message still in progress (held whole), never anything not yet received."""
    for t, start, end in _layout(msgs):
        if start < consumed < end:
            return start if t in capture else consumed
    return consumed


def _check_edit_framer(msgs, chunks, capture=EDIT_CAPTURE) -> None:
    stream = b"".join(msg(bytes([t]), body) for t, body in msgs)
    assert b"".join(chunks) == stream
    framer = EditFramer(capture, FRONTEND_TYPES)
    captured, forwarded = [], b""
    consumed = 0
    boundaries = {end for _, _, end in _layout(msgs)} | {0}
    for chunk in chunks:
        got, out = _frame(framer, [chunk])
        captured += got
        forwarded += out
        consumed += len(chunk)
        # forwarded as it arrives, except a captured message in progress
        assert forwarded == stream[:_forwardable(msgs, consumed, capture)]
        assert framer.at_boundary == (consumed in boundaries)
        assert framer.violation is None
    assert captured == [(t, body) for t, body in msgs if t in capture]
    assert forwarded == stream


# A pipelined extended-protocol exchange of a translating session, with an empty-bodied Sync, a
# non-captured Flush and CopyData, and a Query: every split point of it is tried.
PIPELINE = [
    (ord("P"), b"s1\x00SELECT type FROM events WHERE run_id = $1\x00\x00\x00"),
    (ord("B"), b"\x00s1\x00\x00\x00\x00\x01\x00\x00\x00\x03r-1\x00\x00"),
    (ord("H"), b""),
    (ord("D"), b"P\x00"),
    (ord("E"), b"\x00\x00\x00\x00\x00"),
    (ord("d"), b"copy-bytes"),
    (ord("S"), b""),
    (ord("Q"), b"SELECT 1\x00"),
]
PIPELINE_STREAM = b"".join(msg(bytes([t]), body) for t, body in PIPELINE)


def test_edit_framer_whole_stream_in_one_chunk_is_forwarded_as_is():
    framer = EditFramer(EDIT_CAPTURE, FRONTEND_TYPES)
    items, lo, hi = framer.feed(PIPELINE_STREAM)
    assert (lo, hi) == (0, len(PIPELINE_STREAM)) and framer.at_boundary and framer.violation is None
    assert [(t, body) for t, body, _, _ in items] == [(t, b) for t, b in PIPELINE if t in EDIT_CAPTURE]
    ends = [end for _, _, end in _layout(PIPELINE)]
    assert [end for *_, end in items] == [e for (t, _), e in zip(PIPELINE, ends) if t in EDIT_CAPTURE]


def test_edit_framer_every_two_piece_split():
    n = len(PIPELINE_STREAM)
    for a in range(n + 1):
        _check_edit_framer(PIPELINE, [PIPELINE_STREAM[:a], PIPELINE_STREAM[a:]])


def test_edit_framer_every_three_piece_split():
    n = len(PIPELINE_STREAM)
    for a in range(n + 1):
        for b in range(a, n + 1):
            _check_edit_framer(PIPELINE, [PIPELINE_STREAM[:a], PIPELINE_STREAM[a:b], PIPELINE_STREAM[b:]])


def test_edit_framer_byte_by_byte():
    _check_edit_framer(PIPELINE, [PIPELINE_STREAM[i:i + 1] for i in range(len(PIPELINE_STREAM))])


def test_edit_framer_holds_a_captured_message_split_in_its_header():
    parse = msg(b"P", b"\x00SELECT 1\x00\x00\x00")
    sync = msg(b"S")
    framer = EditFramer(EDIT_CAPTURE, FRONTEND_TYPES)
    assert framer.feed(sync + parse[:2]) == ([(ord("S"), b"", 0, 5)], 0, 5)  # the Parse's start is held back
    assert not framer.at_boundary
    assert framer.feed(parse[2:4]) == ([], 4 - 2, 4 - 2)  # nothing to forward yet
    items, lo, hi = framer.feed(parse[4:] + sync)
    assert items == [(ord("P"), parse[5:], -1, -1), (ord("S"), b"", len(parse) - 4, len(parse) - 4 + 5)]
    assert (lo, hi) == (len(parse) - 4, len(parse) - 4 + 5) and framer.at_boundary


def test_edit_framer_forwards_a_non_captured_message_as_it_arrives():
    copy = msg(b"d", b"x" * 100)
    framer = EditFramer(EDIT_CAPTURE, FRONTEND_TYPES)
    for piece in (copy[:3], copy[3:50], copy[50:]):
        assert framer.feed(piece) == ([], 0, len(piece))
    assert framer.at_boundary


def test_edit_framer_only_captured_types_are_items():
    framer = EditFramer(frozenset(b"Q"), FRONTEND_TYPES)
    stream = msg(b"P", b"\x00x\x00\x00\x00") + msg(b"Q", b"SELECT 1\x00") + msg(b"S")
    items, lo, hi = framer.feed(stream)
    assert items == [(ord("Q"), b"SELECT 1\x00", 10, 24)] and (lo, hi) == (0, len(stream))


@given(st.lists(st.tuples(st.sampled_from(sorted(FRONTEND_TYPES)), st.binary(max_size=40)), max_size=12),
       st.lists(st.integers(min_value=0, max_value=600), max_size=12))
@settings(max_examples=400, deadline=None)
def test_edit_framer_is_independent_of_chunking(msgs, cuts):
    stream = b"".join(msg(bytes([t]), body) for t, body in msgs)
    cuts = sorted({c for c in cuts if c < len(stream)})
    chunks = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
    _check_edit_framer(msgs, chunks)


def _violating(bad: bytes, expect_text: str, sqlstate: str = "08P01", capture_bad: bool = False) -> None:
    """``bad`` (a message header, maybe with a body) after a few good messages, fed in every 2- and
    3-piece split: the good messages are captured and forwarded, the bad one never is."""
    good = PIPELINE[:4]
    prefix = b"".join(msg(bytes([t]), body) for t, body in good)
    stream = prefix + bad
    bad_at = len(prefix)
    n = len(stream)
    splits = [(a,) for a in range(n + 1)] + [(a, b) for a in range(0, n + 1, 3) for b in range(a, n + 1)]
    for cut in splits:
        bounds = [0, *cut, n]
        chunks = [stream[x:y] for x, y in zip(bounds, bounds[1:])]
        framer = EditFramer(EDIT_CAPTURE, FRONTEND_TYPES)
        captured, forwarded = [], bytearray()
        start = 0
        for chunk in chunks:
            got, out = _frame(framer, [chunk])
            captured += got
            forwarded += out
            if framer.violation is not None:
                break
            start += len(chunk)
        v = framer.violation
        assert v is not None, cut
        assert expect_text in v.message and v.sqlstate == sqlstate
        # valid_upto is the bad message's offset in the chunk that revealed the violation (0 when its
        # header began in an earlier chunk)
        assert v.valid_upto == max(0, bad_at - start), (cut, v.valid_upto)
        assert captured == [(t, body) for t, body in good if t in EDIT_CAPTURE]
        # All the good messages went out; of the bad one at most the first bytes of a split header of a
        # non-captured type (as MessageWalker forwards them), never a byte of it when captured.
        assert bytes(forwarded[:bad_at]) == prefix
        extra = bytes(forwarded[bad_at:])
        assert bad.startswith(extra) and len(extra) < 5
        if capture_bad or bad[0] not in FRONTEND_TYPES:
            assert extra == b"", cut


def test_edit_framer_violation_bad_type():
    _violating(msg(b"\x01", b"zz"), "invalid frontend message type 1")


def test_edit_framer_violation_length_below_4():
    _violating(b"d\x00\x00\x00\x03", "invalid message length 3")
    _violating(b"Q\x00\x00\x00\x00", "invalid message length 0", capture_bad=True)


def test_edit_framer_violation_too_long():
    _violating(b"B" + struct.pack("!I", MAX_MESSAGE_LENGTH + 5), "too long", sqlstate="54000", capture_bad=True)
    _violating(b"d" + struct.pack("!I", MAX_MESSAGE_LENGTH + 5), "too long", sqlstate="54000")


def test_edit_framer_violation_max_length_is_configurable():
    framer = EditFramer(EDIT_CAPTURE, FRONTEND_TYPES, max_length=10)
    ok = msg(b"Q", b"x" * 10)
    items, lo, hi = framer.feed(ok + msg(b"Q", b"x" * 11))
    assert items == [(ord("Q"), b"x" * 10, 0, 15)] and (lo, hi) == (0, 15)
    assert framer.violation.sqlstate == "54000" and framer.violation.valid_upto == 15


def test_edit_framer_violation_after_a_held_message_completes():
    parse = msg(b"P", b"\x00SELECT 1\x00\x00\x00")
    framer = EditFramer(EDIT_CAPTURE, FRONTEND_TYPES)
    assert framer.feed(parse[:8]) == ([], 0, 0)  # held from its first byte
    rest = parse[8:] + msg(b"S") + b"\x07\x00\x00\x00\x04"
    items, lo, hi = framer.feed(rest)
    assert items == [(ord("P"), parse[5:], -1, -1), (ord("S"), b"", len(parse) - 8, len(parse) - 8 + 5)]
    assert (lo, hi) == (len(parse) - 8, len(parse) - 8 + 5)
    assert framer.violation.valid_upto == hi and "type 7" in framer.violation.message


def test_edit_framer_bad_type_in_a_split_header_is_caught_at_its_first_byte():
    framer = EditFramer(EDIT_CAPTURE, FRONTEND_TYPES)
    sync = msg(b"S")
    items, lo, hi = framer.feed(sync + b"\x02\x00")
    assert items == [(ord("S"), b"", 0, 5)] and (lo, hi) == (0, 5)
    assert framer.violation.valid_upto == 5


def test_edit_framer_at_boundary():
    framer = EditFramer(EDIT_CAPTURE, FRONTEND_TYPES)
    assert framer.at_boundary
    q = msg(b"Q", b"SELECT 1\x00")
    framer.feed(q[:1])
    assert not framer.at_boundary  # inside the header
    framer.feed(q[1:7])
    assert not framer.at_boundary  # inside the body
    framer.feed(q[7:])
    assert framer.at_boundary
    framer.feed(msg(b"S")[:5])
    assert framer.at_boundary  # an empty body completes with its header


# ---------------------------------------------------------------- StreamSplitter (server stream, translating session)

BACKEND = [
    (ord("1"), b""),
    (ord("2"), b""),
    (ord("T"), b"\x00\x01type\x00" + bytes(18)),
    (ord("D"), b"\x00\x02\x00\x00\x00\x03abc\xff\xff\xff\xff"),
    (ord("N"), b"SNOTICE\x00Mhi\x00\x00"),
    (ord("D"), b"\x00\x01\x00\x00\x00\x01x"),
    (ord("C"), b"SELECT 2\x00"),
    (ord("Z"), b"I"),
]
BACKEND_STREAM = b"".join(msg(bytes([t]), body) for t, body in BACKEND)
SPLIT_CAPTURE = frozenset(b"CZT")


def _split(chunks, holds, capture=SPLIT_CAPTURE):
    """Feed ``chunks`` with the hold decision of each; returns the bytes the session writes (RAW spans as they
    are, HELD messages re-encoded unchanged), the held and the seen (type, body) pairs."""
    sp = StreamSplitter()
    out, held, seen = bytearray(), [], []
    for chunk, hold in zip(chunks, holds):
        items = sp.feed(chunk, hold, capture)
        kinds = [it[0] for it in items if it[0] != SEEN]
        # adjacent raw spans are merged: two RAW items are always separated by a HELD one
        assert all(not (a == RAW and b == RAW) for a, b in zip(kinds, kinds[1:]))
        for item in items:
            if item[0] == RAW:
                assert item[1]  # no empty spans
                out += item[1]
            elif item[0] == HELD:
                held.append((item[1], bytes(item[2])))
                out += msg(bytes([item[1]]), item[2])
            else:
                assert item[0] == SEEN
                seen.append((item[1], bytes(item[2])))
    return bytes(out), held, seen, sp


def _expected_split(msgs, chunks, holds, capture=SPLIT_CAPTURE):
    """Held: the messages whose first byte arrived in a chunk fed with hold; seen: the others in ``capture``."""
    starts, pos = [], 0
    for chunk, hold in zip(chunks, holds):
        starts += [hold] * len(chunk)
        pos += len(chunk)
    held, seen = [], []
    for (t, body), (_, start, _) in zip(msgs, _layout(msgs)):
        if starts[start]:
            held.append((t, body))
        elif t in capture:
            seen.append((t, body))
    return held, seen


def _check_split(msgs, chunks, holds):
    stream = b"".join(msg(bytes([t]), body) for t, body in msgs)
    out, held, seen, sp = _split(chunks, holds)
    assert out == stream
    assert (held, seen) == _expected_split(msgs, chunks, holds)
    assert sp.at_boundary


def test_splitter_a_chunk_with_nothing_held_comes_back_as_itself():
    sp = StreamSplitter()
    items = sp.feed(BACKEND_STREAM, False, SPLIT_CAPTURE)
    assert [it for it in items if it[0] == RAW] == [(RAW, BACKEND_STREAM)]
    assert [(it[1], it[2]) for it in items if it[0] == SEEN] == [(t, b) for t, b in BACKEND if t in SPLIT_CAPTURE]


def test_splitter_hold_returns_every_message_whole():
    sp = StreamSplitter()
    items = sp.feed(BACKEND_STREAM, True, SPLIT_CAPTURE)
    assert items == [(HELD, t, b) for t, b in BACKEND]


def test_splitter_every_two_piece_split_and_hold_decision():
    n = len(BACKEND_STREAM)
    for a in range(n + 1):
        chunks = [BACKEND_STREAM[:a], BACKEND_STREAM[a:]]
        for holds in ((False, False), (True, True), (False, True), (True, False)):
            _check_split(BACKEND, chunks, holds)


def test_splitter_every_three_piece_split_and_hold_decision():
    n = len(BACKEND_STREAM)
    hold_sets = [(x, y, z) for x in (False, True) for y in (False, True) for z in (False, True)]
    for a in range(1, n):
        for b in range(a + 1, n):
            chunks = [BACKEND_STREAM[:a], BACKEND_STREAM[a:b], BACKEND_STREAM[b:]]
            for holds in hold_sets:
                _check_split(BACKEND, chunks, holds)


def test_splitter_message_in_progress_keeps_its_decision():
    row = msg(b"D", b"\x00\x01\x00\x00\x00\x05hello")
    z = msg(b"Z", b"I")
    sp = StreamSplitter()
    assert sp.feed(row[:7], True, SPLIT_CAPTURE) == []  # held: nothing goes out yet
    # the row stays held although this chunk is not; the ReadyForQuery after it goes out raw and is seen
    assert sp.feed(row[7:] + z, False, SPLIT_CAPTURE) == [(HELD, ord("D"), row[5:]), (SEEN, ord("Z"), b"I"),
                                                          (RAW, z)]
    sp = StreamSplitter()
    assert sp.feed(row[:3], False, SPLIT_CAPTURE) == [(RAW, row[:3])]
    # raw from its first byte: the rest of the row goes out raw, the ReadyForQuery is held
    assert sp.feed(row[3:] + z, True, SPLIT_CAPTURE) == [(RAW, row[3:]), (HELD, ord("Z"), b"I")]


@given(st.lists(st.tuples(st.sampled_from(sorted(b"123CDEINTZnst")), st.binary(max_size=40)), max_size=12),
       st.lists(st.tuples(st.integers(min_value=0, max_value=600), st.booleans()), max_size=12),
       st.booleans())
@settings(max_examples=400, deadline=None)
def test_splitter_is_independent_of_chunking_and_hold_decisions(msgs, cuts, first_hold):
    stream = b"".join(msg(bytes([t]), body) for t, body in msgs)
    decisions = dict(cuts)
    cuts = sorted({c for c in decisions if 0 < c < len(stream)})
    chunks = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
    holds = [first_hold] + [decisions[c] for c in cuts]
    _check_split(msgs, chunks, holds)


@pytest.mark.parametrize("header", [b"D\x00\x00\x00\x03", b"D\x00\x00\x00\x00",
                                    b"D" + struct.pack("!I", MAX_MESSAGE_LENGTH + 5)])
@pytest.mark.parametrize("hold", [False, True])
def test_splitter_bad_length_raises(header, hold):
    for cut in range(len(header) + 1):
        sp = StreamSplitter()
        with pytest.raises(ProtocolViolation) as e:
            sp.feed(msg(b"Z", b"I") + header[:cut], hold, SPLIT_CAPTURE)
            sp.feed(header[cut:] + b"more", hold, SPLIT_CAPTURE)
        assert "invalid backend message length" in e.value.message


def test_splitter_rewrites_leading_datarows_through_rows_and_stops_at_the_first_other_message():
    """`rows` applies only to the DataRows that lead a held chunk: the first other message may end the result
    they belong to, so later DataRows come back held, for the caller to route after that message."""
    rows = [msg(b"D", b"\x00\x01\x00\x00\x00\x01" + bytes([48 + i])) for i in range(3)]
    stream = rows[0] + rows[1] + msg(b"C", b"SELECT 2\x00") + rows[2]
    seen = []

    def rewrite(body: bytes) -> bytes:
        seen.append(body)
        return b"<" + body + b">"

    out = StreamSplitter().feed(stream, True, frozenset(), rewrite)
    assert seen == [rows[0][5:], rows[1][5:]]
    assert out == [(RAW, b"<" + rows[0][5:] + b">"), (RAW, b"<" + rows[1][5:] + b">"),
                   (HELD, ord("C"), b"SELECT 2\x00"), (HELD, ord("D"), rows[2][5:])]
    # A DataRow split across chunks comes back held when complete; the DataRows after it still lead.
    s = StreamSplitter()
    assert s.feed(rows[0][:4], True, frozenset(), rewrite) == []
    assert s.feed(rows[0][4:] + rows[1], True, frozenset(), rewrite) == [
        (HELD, ord("D"), rows[0][5:]), (RAW, b"<" + rows[1][5:] + b">")]
    # Any other message split across chunks ends the lead: the DataRows after it are held.
    done = msg(b"C", b"SELECT 2\x00")
    s = StreamSplitter()
    assert s.feed(done[:3], True, frozenset(), rewrite) == []
    assert s.feed(done[3:] + rows[2], True, frozenset(), rewrite) == [
        (HELD, ord("C"), b"SELECT 2\x00"), (HELD, ord("D"), rows[2][5:])]
    # Without hold nothing is rewritten.
    assert StreamSplitter().feed(stream, False, frozenset(), rewrite) == [(RAW, stream)]
