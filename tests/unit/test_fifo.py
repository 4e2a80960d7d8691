"""The owed-answer queues (proxy.fifo): a list while short, a deque once long, in order across the switch.

A client may pipeline up to the owed bound (16,384 answers at the default buffer_limit) before the seat stops
reading it; draining that many from a list with ``pop(0)`` moved every remaining item each time, most of a second
of the event loop. Here the queues of a read path and of a raw relay are filled past LONG and drained: they are
deques by then, and every answer is matched in order.
"""

from __future__ import annotations

import struct
from collections import deque

import pytest

from proxy import fifo
from proxy.config import HostConfig
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import EventColumns, ReadPath
from proxy.serve.relay import Relay
from proxy.stats import Stats

pytestmark = pytest.mark.usefixtures("each_framer")

DEEP = 5_000


def msg(t: bytes, body: bytes = b"") -> bytes:
    return t + struct.pack("!I", len(body) + 4) + body


LOGIN = msg(b"R", struct.pack("!I", 0)) + msg(b"K", struct.pack("!I", 4242) + b"key!") + msg(b"Z", b"I")
QUERY = msg(b"Q", b"SELECT 1\x00")
ANSWER = msg(b"T", b"\x00\x01c\x00" + bytes(18)) + msg(b"D", b"\x00\x01\x00\x00\x00\x011") \
    + msg(b"C", b"SELECT 1\x00") + msg(b"Z", b"I")


def test_a_short_queue_stays_a_list_and_a_long_one_becomes_a_deque_in_order():
    q = []
    for i in range(fifo.LONG):
        q.append(i)
        if len(q) > fifo.LONG:
            q = fifo.grown(q)
    assert q.__class__ is list
    assert fifo.popleft(q) == 0
    for i in range(fifo.LONG, 3 * fifo.LONG):
        q.append(i)
        if len(q) > fifo.LONG:
            q = fifo.grown(q)
    assert q.__class__ is deque
    assert fifo.grown(q) is q
    assert [fifo.popleft(q) for _ in range(len(q))] == list(range(1, 3 * fifo.LONG))
    with pytest.raises(IndexError):
        fifo.popleft(q)
    with pytest.raises(IndexError):
        fifo.popleft([])


@pytest.mark.parametrize("reader", [False, True], ids=["raw", "read-path"])
def test_a_deep_pipeline_is_queued_in_a_deque_and_every_answer_matched(reader):
    path = ReadPath(Classifier(HostConfig(), 2), 2, EventColumns(0x61626364, 4, payload_attnum=5)) if reader else None
    relay = Relay(Stats(), reader=path, count_answered=True)
    relay.from_server(LOGIN)
    relay.from_client(QUERY * DEEP)
    queue = path.quiet_sent if reader else relay._raw_sent
    assert queue.__class__ is deque and len(queue) == DEEP
    assert relay.owed == DEEP
    out = relay.from_server(ANSWER * DEEP)
    assert out == ANSWER * DEEP or (isinstance(out, tuple) and out[0] == ANSWER * DEEP)
    assert relay.owed == 0 and len(queue) == 0 and relay.ending is None
