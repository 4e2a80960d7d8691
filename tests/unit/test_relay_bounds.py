"""The relay's bounds (issue 23, item 6): what it owes is counted, and a large chunk is framed in slices with the
same result as whole."""

from __future__ import annotations

from test_relay import LOGIN, READY, msg

from proxy.config import HostConfig
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import ReadPath
from proxy.serve.relay import SLICE, Relay
from proxy.stats import Stats


def relay(reader: bool) -> Relay:
    r = Relay(Stats(), reader=ReadPath(Classifier(HostConfig(), 2), 2, None) if reader else None,
              count_answered=True)
    r.from_server(LOGIN)
    return r


def test_owed_counts_the_answers_the_server_owes():
    for reader in (False, True):
        r = relay(reader)
        assert r.owed == 0
        syncs = msg(b"S") * 100_000  # several slices
        assert len(syncs) > 10 * SLICE
        assert r.from_client(syncs) == syncs
        assert r.owed == 100_000
        assert r.from_server(READY * 60_000) == (READY * 60_000, b"")
        assert r.owed == 40_000


def test_a_sliced_chunk_comes_out_as_it_went_in_with_messages_across_slices():
    r = relay(True)
    parse = msg(b"P", b"\0SELECT 'x' || type FROM events WHERE run_id = $1" + b" " * 70_000 + b"\0\0\0")
    data = (msg(b"S") * 7001 + parse + msg(b"B", b"\0\0\0\0\0\0\0") + msg(b"S")) * 3
    out = r.from_client(data)
    assert r.ending is None and len(data) > 4 * SLICE
    small = relay(True)  # the same bytes in pieces smaller than a slice
    assert out == b"".join(small.from_client(data[i:i + 1000]) for i in range(0, len(data), 1000))
    assert out.count(b"openwop_seat.events_m2") == 3
    answers = (READY * 7001 + msg(b"1") + msg(b"2") + READY) * 3
    assert r.from_server(answers) == (answers, b"")
    assert r.owed == 0
