"""Byte-for-byte tests of the sans-IO wire code (no sockets, no server): the packets that open a connection,
message bodies, the session state. The framer of typed messages has its own tests (test_framer.py)."""

from __future__ import annotations

import struct

import pytest

from proxy.wire import messages
from proxy.wire.codec import (
    PROTOCOL_3_0,
    PROTOCOL_3_2,
    CancelRequest,
    GSSENCRequest,
    ProtocolViolation,
    SSLRequest,
    StartupMessage,
    parse_initial_packet,
)
from proxy.wire.framer import COPY, Framer, verbs
from proxy.wire.state import BACKEND_CAPTURE, Phase, SessionState

# each test runs once per framer implementation (ADR 0018; tests/unit/conftest.py)
pytestmark = pytest.mark.usefixtures("each_framer")


def msg(t: bytes, body: bytes = b"") -> bytes:
    """Independent of the code under test: type, big-endian length including itself, body."""
    return t + struct.pack("!I", len(body) + 4) + body


def copies(framer: Framer, data: bytes) -> list:
    return [item for item in framer.feed(data) if item[0] == COPY]


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


def test_simple_messages():
    assert messages.ready_for_query(b"T") == b"Z\x00\x00\x00\x05T"
    assert messages.terminate() == b"X\x00\x00\x00\x04"
    assert messages.query("SELECT 1") == b"Q\x00\x00\x00\x0dSELECT 1\x00"


# ---------------------------------------------------------------- session state


def test_session_state_follows_a_login_and_a_transaction():
    s = SessionState()
    w = Framer(verbs(copy=BACKEND_CAPTURE))
    login = (msg(b"R", struct.pack("!I", 0)) + msg(b"S", b"server_version\x0015.18\x00")
             + msg(b"K", struct.pack("!i", 4242) + b"\x01\x02\x03\x04") + msg(b"Z", b"I"))
    for _, t, body in copies(w, login):
        s.on_backend(t, body)
    assert s.auth_ok and s.phase is Phase.READY and s.backend_pid == 4242
    assert s.backend_key == b"\x01\x02\x03\x04" and s.server_params["server_version"] == "15.18"
    for _, t, body in copies(w, msg(b"C", b"BEGIN\x00") + msg(b"Z", b"T")):
        s.on_backend(t, body)
    assert s.in_transaction
    failed = msg(b"E", b"SERROR\x00VERROR\x00C22012\x00Mdivision by zero\x00\x00") + msg(b"Z", b"E")
    for _, t, body in copies(w, failed):
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
