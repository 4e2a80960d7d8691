"""Byte-for-byte tests of the sans-IO wire code (no sockets, no server)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire import messages
from proxy.wire.codec import (
    FRONTEND_TYPES,
    MAX_MESSAGE_LENGTH,
    PROTOCOL_3_0,
    PROTOCOL_3_2,
    CancelRequest,
    GSSENCRequest,
    MessageWalker,
    ProtocolViolation,
    SSLRequest,
    StartupMessage,
    parse_initial_packet,
)
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
