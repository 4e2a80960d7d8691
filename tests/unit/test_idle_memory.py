"""What an idle session holds (issue 27: at most 4 KiB of the seat's RSS per idle client connection).

The seat keeps one Session, two Peers, one Relay, one SessionState and (translated) one ReadPath per connection, idle
ones included: they have slots, make no container before it is needed, keep nothing of the claim once it is done,
and share what every session of a server has alike (the server's login parameters). ``make bench``'s idle_memory
measures the whole; this file holds the sans-IO objects to it, without sockets.
"""

from __future__ import annotations

import gc
import struct
import tracemalloc
from collections import deque

import pytest

from proxy.config import HostConfig
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import EventColumns, ReadPath
from proxy.serve.peer import Peer
from proxy.serve.relay import Claim, Relay
from proxy.serve.session import Session
from proxy.stats import Stats
from proxy.wire.state import SessionState

# each test runs once per framer implementation (ADR 0018; tests/unit/conftest.py)
pytestmark = pytest.mark.usefixtures("each_framer")

SECRET = "a-claim-secret-of-sixteen-bytes"


def msg(t: bytes, body: bytes = b"") -> bytes:
    return t + struct.pack("!I", len(body) + 4) + body


def status(name: str, value: str) -> bytes:
    return msg(b"S", name.encode() + b"\x00" + value.encode() + b"\x00")


def row(*values: bytes) -> bytes:
    return msg(b"D", struct.pack("!h", len(values)) + b"".join(struct.pack("!i", len(v)) + v for v in values))


READY = msg(b"Z", b"I")
PARAMETERS = [("application_name", ""), ("client_encoding", "UTF8"), ("DateStyle", "ISO, MDY"),
              ("integer_datetimes", "on"), ("IntervalStyle", "postgres"), ("is_superuser", "off"),
              ("server_encoding", "UTF8"), ("server_version", "15.8"), ("session_authorization", "app"),
              ("standard_conforming_strings", "on"), ("TimeZone", "UTC")]
LOGIN = (msg(b"R", struct.pack("!I", 0)) + b"".join(status(n, v) for n, v in PARAMETERS)
         + msg(b"K", struct.pack("!I", 4242) + b"key!") + READY)
CLAIM_ANSWER = msg(b"1") + msg(b"2") + row(b"ok", b"f") + msg(b"C", b"SELECT 1\x00") + READY
SIMPLE = msg(b"Q", b"SELECT 1\x00")
EXTENDED = (msg(b"P", b"\x00SELECT abalance FROM pgbench_accounts WHERE aid = $1\x00\x00\x00")
            + msg(b"B", b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x0512345\x00\x00") + msg(b"D", b"P\x00")
            + msg(b"E", b"\x00\x00\x00\x00\x00") + msg(b"S"))
RESULT = msg(b"T", b"\x00\x01c\x00" + bytes(18)) + row(b"1") + msg(b"C", b"SELECT 1\x00") + READY
EXTENDED_RESULT = msg(b"1") + msg(b"2") + RESULT

CLASSIFIER = Classifier(HostConfig(), 2)
STATS = Stats()


def idle_session(reader: bool = True) -> Relay:
    """A claimed major-2 session after its login and one simple and one extended statement, idle."""
    read_path = ReadPath(CLASSIFIER, 2, EventColumns(0x61626364, 4, payload_attnum=5)) if reader else None
    relay = Relay(STATS, reader=read_path, claim=Claim(SECRET, 2, 1 << 20, "salt123"), count_answered=True)
    relay.from_server(LOGIN)
    relay.from_server(CLAIM_ANSWER)
    for chunk, answer in ((SIMPLE, RESULT), (EXTENDED, EXTENDED_RESULT)):
        relay.from_client(chunk)
        relay.from_server(answer)
    assert not relay.awaiting_ready and relay.ending is None and relay.owed == 0
    return relay


@pytest.mark.parametrize("cls", [Session, Peer, Relay, ReadPath, SessionState])
def test_the_per_connection_classes_have_slots(cls):
    assert cls.__dictoffset__ == 0, f"{cls.__name__} instances have a __dict__"


@pytest.mark.parametrize("reader", [True, False])
def test_an_idle_session_keeps_no_deque_no_buffer_and_nothing_of_its_claim(reader):
    relay = idle_session(reader)
    held = [relay, relay.state] + ([relay.reader] if reader else [])
    for obj in held:
        for name in type(obj).__slots__:
            value = getattr(obj, name, None)
            assert not isinstance(value, deque), f"{type(obj).__name__}.{name} is a deque"
            assert not isinstance(value, bytearray) or not value, f"{type(obj).__name__}.{name} holds bytes"
    assert relay._held_ready == b"" and relay._claim is None and not relay._backlog and not relay._pre_ready


def test_sessions_share_the_servers_login_parameters_until_one_changes():
    a, b = idle_session(), idle_session()
    assert a.state.server_params is b.state.server_params and dict(PARAMETERS) == a.state.server_params
    a.from_server(status("application_name", "other"))
    assert a.state.server_params["application_name"] == "other"
    assert b.state.server_params["application_name"] == ""  # copied before the change, the other's untouched


def test_an_idle_sessions_relay_and_read_path_hold_under_2_kb():
    """Python memory (tracemalloc) per idle claimed session, relay and read path: 4,046 bytes before the issue-27 cut
    (a deque of 760 bytes each for two FIFOs, a dict per object, the claim's held chunk kept), about 1,700 after."""
    warm = [idle_session() for _ in range(10)]  # the shared caches filled before the count
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [idle_session() for _ in range(200)]
        gc.collect()
        per_session = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    del warm, kept
    assert per_session < 2048, f"{per_session:.0f} bytes per idle session"
