"""Byte-for-byte tests of the one framer (proxy.wire.framer): every verb, every split, every violation.

The expected results are computed here from the message list alone (type, big-endian length, body),
independently of the code under test.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire.codec import FRONTEND_TYPES, MAX_MESSAGE_LENGTH
from proxy.wire.framer import COPY, FORWARD, HOLD, HOLD_ALL, PASS_ALL, REFUSE, SPAN, Framer, verbs

# each test runs once per framer implementation (ADR 0018; tests/unit/conftest.py)
pytestmark = pytest.mark.usefixtures("each_framer")


def msg(t: bytes, body: bytes = b"") -> bytes:
    return t + struct.pack("!I", len(body) + 4) + body


def stream_of(msgs) -> bytes:
    return b"".join(msg(bytes([t]), body) for t, body in msgs)


def layout(msgs) -> list[tuple[int, int, int]]:
    """(type, start, end) of each message of the stream made of ``msgs``."""
    out, pos = [], 0
    for t, body in msgs:
        out.append((t, pos, pos + 5 + len(body)))
        pos += 5 + len(body)
    return out


FRONTEND = verbs(REFUSE, forward=FRONTEND_TYPES)
# A translating session's client side: the messages the read path rewrites are held, Terminate copied.
CLIENT = verbs(REFUSE, forward=FRONTEND_TYPES, hold=b"QPBDECSF", copy=b"X")
# A server stream: quiet (a few kinds copied for bookkeeping) or with every message held.
QUIET = verbs(FORWARD, copy=b"CZT", hold=b"E")

# A pipelined extended-protocol exchange, with an empty-bodied Sync, a Flush and CopyData, and a Query.
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
BACKEND = [
    (ord("1"), b""),
    (ord("2"), b""),
    (ord("T"), b"\x00\x01type\x00" + bytes(18)),
    (ord("D"), b"\x00\x02\x00\x00\x00\x03abc\xff\xff\xff\xff"),
    (ord("N"), b"SNOTICE\x00Mhi\x00\x00"),
    (ord("D"), b"\x00\x01\x00\x00\x00\x01x"),
    (ord("D"), b"\x00\x01\x00\x00\x00\x01y"),
    (ord("C"), b"SELECT 2\x00"),
    (ord("Z"), b"I"),
]


def run(framer: Framer, chunks, tables=None):
    """Feed ``chunks`` (each with its table, when given); what the caller writes (spans as they are, held
    messages re-encoded unchanged), the held and copied (type, body) pairs, and the bytes written after
    each chunk."""
    out, held, copied, after = bytearray(), [], [], []
    for i, chunk in enumerate(chunks):
        if tables is not None:
            framer.table = tables[i]
        items = framer.feed(chunk)
        kinds = [it[0] for it in items if it[0] != COPY]
        # adjacent spans are merged: two spans are always separated by a held message
        assert all(not (a == SPAN and b == SPAN) for a, b in zip(kinds, kinds[1:]))
        for item in items:
            if item[0] == SPAN and len(item) == 2:
                assert item[1]  # no empty spans
                out += item[1]
            elif item[0] == HOLD:
                held.append((item[1], bytes(item[2])))
                out += msg(bytes([item[1]]), item[2])
            else:
                assert item[0] == COPY
                copied.append((item[1], bytes(item[2])))
        after.append(bytes(out))
    return bytes(out), held, copied, after


def expected(msgs, chunks, tables):
    """Held: the messages whose verb was HOLD in the table of the chunk their first byte arrived in; copied:
    likewise for COPY; written after each chunk: everything received except a held message in progress."""
    table_at = []
    for chunk, table in zip(chunks, tables):
        table_at += [table] * len(chunk)
    held, copied = [], []
    for t, start, end in layout(msgs):
        verb = table_at[start][t]
        body = stream_of(msgs)[start + 5:end]
        if verb == HOLD:
            held.append((t, body))
        elif verb == COPY:
            copied.append((t, body))
    after, consumed = [], 0
    for chunk in chunks:
        consumed += len(chunk)
        upto = consumed
        for t, start, end in layout(msgs):
            if start < consumed < end and table_at[start][t] == HOLD:
                upto = start
        after.append(stream_of(msgs)[:upto])
    return held, copied, after


def check(msgs, chunks, tables):
    stream = stream_of(msgs)
    assert b"".join(chunks) == stream
    framer = Framer()
    out, held, copied, after = run(framer, chunks, tables)
    assert out == stream
    assert (held, copied, after) == expected(msgs, chunks, tables)
    assert framer.violation is None and framer.at_boundary


# ---------------------------------------------------------------- verbs and splits


def test_a_chunk_with_nothing_held_comes_back_as_itself():
    stream = stream_of(BACKEND)
    items = Framer(QUIET.replace(b"\x02", b"\x00")).feed(stream)
    assert items[-1][0] == SPAN and items[-1][1] is stream
    assert [it[1:] for it in items[:-1]] == [(t, b) for t, b in BACKEND if t in b"CZT"]


def test_hold_all_returns_every_message_whole():
    assert Framer(HOLD_ALL).feed(stream_of(BACKEND)) == [(HOLD, t, b) for t, b in BACKEND]


def test_only_the_types_with_a_verb_are_items():
    stream = msg(b"P", b"\x00x\x00\x00\x00") + msg(b"Q", b"SELECT 1\x00") + msg(b"S")
    items = Framer(verbs(REFUSE, forward=FRONTEND_TYPES, hold=b"Q")).feed(stream)
    assert items == [(SPAN, stream[:10]), (HOLD, ord("Q"), b"SELECT 1\x00"), (SPAN, stream[24:])]


@pytest.mark.parametrize("msgs, table", [(PIPELINE, CLIENT), (PIPELINE, FRONTEND), (BACKEND, QUIET),
                                         (BACKEND, HOLD_ALL), (BACKEND, PASS_ALL)])
def test_every_two_and_three_piece_split(msgs, table):
    stream = stream_of(msgs)
    n = len(stream)
    for a in range(n + 1):
        check(msgs, [stream[:a], stream[a:]], [table, table])
    for a in range(0, n + 1, 2):
        for b in range(a, n + 1):
            check(msgs, [stream[:a], stream[a:b], stream[b:]], [table] * 3)


def test_byte_by_byte():
    for msgs, table in ((PIPELINE, CLIENT), (BACKEND, QUIET)):
        stream = stream_of(msgs)
        check(msgs, [stream[i:i + 1] for i in range(len(stream))], [table] * len(stream))


def test_every_split_with_the_table_switched_between_the_pieces():
    stream = stream_of(BACKEND)
    n = len(stream)
    for a in range(1, n):
        for first, second in ((QUIET, HOLD_ALL), (HOLD_ALL, QUIET), (PASS_ALL, HOLD_ALL)):
            check(BACKEND, [stream[:a], stream[a:]], [first, second])


def test_a_message_in_progress_keeps_its_verb():
    row = msg(b"D", b"\x00\x01\x00\x00\x00\x05hello")
    z = msg(b"Z", b"I")
    f = Framer(HOLD_ALL)
    assert f.feed(row[:7]) == []  # held: nothing goes out yet
    f.table = QUIET
    # the row stays held although the table changed; the ReadyForQuery after it is forwarded and copied
    assert f.feed(row[7:] + z) == [(HOLD, ord("D"), row[5:]), (COPY, ord("Z"), b"I"), (SPAN, z)]
    f = Framer(QUIET)
    assert f.feed(row[:3]) == [(SPAN, row[:3])]
    f.table = HOLD_ALL
    # forwarded from its first byte: the rest of the row goes on, the ReadyForQuery is held
    assert f.feed(row[3:] + z) == [(SPAN, row[3:]), (HOLD, ord("Z"), b"I")]


def test_a_held_message_split_in_its_header_is_held_back_from_its_first_byte():
    parse = msg(b"P", b"\x00SELECT 1\x00\x00\x00")
    d = msg(b"d", b"xy")
    f = Framer(CLIENT)
    assert f.feed(d + parse[:2]) == [(SPAN, d)]
    assert not f.at_boundary
    assert f.feed(parse[2:4]) == []
    assert f.feed(parse[4:] + d) == [(HOLD, ord("P"), parse[5:]), (SPAN, d)]
    assert f.at_boundary


def test_a_forwarded_message_goes_on_as_it_arrives():
    copy = msg(b"d", b"x" * 100)
    f = Framer(CLIENT)
    for piece in (copy[:3], copy[3:50], copy[50:]):
        assert f.feed(piece) == [(SPAN, piece)]
    assert f.at_boundary


def test_large_messages_split_across_many_chunks():
    # a 1 MiB bind parameter, and a Parse of 165 KB, fed 64 KiB at a time
    bind = msg(b"B", b"\x00\x00\x00\x00\x00\x01" + struct.pack("!i", 1 << 20) + b"x" * (1 << 20) + b"\x00\x00")
    parse = msg(b"P", b"\x00" + b"SELECT 1 " * (165_000 // 9) + b"\x00\x00\x00")
    stream = parse + bind + msg(b"S")
    f = Framer(verbs(REFUSE, forward=FRONTEND_TYPES, copy=b"P"))
    got, out = [], bytearray()
    for i in range(0, len(stream), 65536):
        for item in f.feed(stream[i:i + 65536]):
            if item[0] == SPAN:
                out += item[1]
            else:
                got.append((item[1], len(item[2])))
    assert got == [(ord("P"), len(parse) - 5)] and bytes(out) == stream and f.at_boundary


def test_a_bind_with_25000_parameters_is_held_whole():
    params = b"".join(struct.pack("!i", 5) + b"hello" for _ in range(25_000))
    body = b"\x00\x00" + struct.pack("!H", 0) + struct.pack("!H", 25_000) + params + struct.pack("!H", 0)
    assert Framer(CLIENT).feed(msg(b"B", body)) == [(HOLD, ord("B"), body)]


def test_at_boundary():
    f = Framer(CLIENT)
    assert f.at_boundary
    q = msg(b"Q", b"SELECT 1\x00")
    f.feed(q[:1])
    assert not f.at_boundary  # inside the header
    f.feed(q[1:7])
    assert not f.at_boundary  # inside the body
    f.feed(q[7:])
    assert f.at_boundary
    f.feed(msg(b"S"))
    assert f.at_boundary  # an empty body completes with its header


@given(st.lists(st.tuples(st.sampled_from(sorted(FRONTEND_TYPES)), st.binary(max_size=40)), max_size=12),
       st.lists(st.tuples(st.integers(min_value=0, max_value=600), st.sampled_from([0, 1, 2])), max_size=12),
       st.sampled_from([0, 1, 2]))
@settings(max_examples=400, deadline=None)
def test_any_chunking_and_any_table_switches(msgs, cuts, first):
    stream = stream_of(msgs)
    decisions = dict(cuts)
    cuts = sorted({c for c in decisions if 0 < c < len(stream)})
    chunks = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])] if stream else [b""]
    choice = (CLIENT, FRONTEND, verbs(REFUSE, forward=FRONTEND_TYPES, copy=b"QPB", hold=b"dS"))
    tables = [choice[first]] + [choice[decisions[c]] for c in cuts]
    check(msgs, chunks, tables)


# ---------------------------------------------------------------- violations


def violating(bad: bytes, expect_text: str, sqlstate: str = "08P01", table: bytes = CLIENT) -> None:
    """``bad`` (a message header, maybe with a body) after a few good messages, fed in every 2- and 3-piece
    split: the good messages are framed and forwarded, the bad one never is (but for the first bytes of a
    split header of a forwarded type, which are on their way before its length can be read)."""
    good = PIPELINE[:4]
    prefix = stream_of(good)
    stream = prefix + bad
    bad_at = len(prefix)
    n = len(stream)
    splits = [(a,) for a in range(n + 1)] + [(a, b) for a in range(0, n + 1, 3) for b in range(a, n + 1)]
    for cut in splits:
        bounds = [0, *cut, n]
        chunks = [stream[x:y] for x, y in zip(bounds, bounds[1:])]
        f = Framer(table)
        out, held, start = bytearray(), [], 0
        for chunk in chunks:
            for item in f.feed(chunk):
                if item[0] == SPAN:
                    out += item[1]
                elif item[0] == HOLD:
                    held.append((item[1], item[2]))
                    out += msg(bytes([item[1]]), item[2])
            if f.violation is not None:
                break
            start += len(chunk)
        v = f.violation
        assert v is not None, cut
        assert expect_text in v.message and v.sqlstate == sqlstate
        # valid_upto: the bad message's offset in the chunk that revealed it (0 when its header began earlier)
        assert v.valid_upto == max(0, bad_at - start), (cut, v.valid_upto)
        assert held == [(t, body) for t, body in good if table[t] == HOLD]
        assert bytes(out[:bad_at]) == prefix
        extra = bytes(out[bad_at:])
        assert bad.startswith(extra) and len(extra) < 5
        if table[bad[0]] != FORWARD:
            assert extra == b"", cut
        assert f.feed(b"Q\x00\x00\x00\x04") == []  # nothing after a violation


def test_violation_bad_type():
    violating(msg(b"\x01", b"zz"), "invalid frontend message type 1")


def test_violation_length_below_4():
    violating(b"d\x00\x00\x00\x03", "invalid message length 3")
    violating(b"Q\x00\x00\x00\x00", "invalid message length 0")
    violating(b"D\x00\x00\x00\x02", "invalid message length 2", table=HOLD_ALL)


def test_violation_too_long():
    violating(b"B" + struct.pack("!I", MAX_MESSAGE_LENGTH + 5), "too long", sqlstate="54000")
    violating(b"d" + struct.pack("!I", MAX_MESSAGE_LENGTH + 5), "too long", sqlstate="54000")
    violating(b"D" + struct.pack("!I", MAX_MESSAGE_LENGTH + 5), "too long", sqlstate="54000", table=PASS_ALL)


def test_the_length_limit_is_configurable():
    f = Framer(CLIENT, max_length=10)
    ok = msg(b"Q", b"x" * 10)
    assert f.feed(ok + msg(b"Q", b"x" * 11)) == [(HOLD, ord("Q"), b"x" * 10)]
    assert f.violation.sqlstate == "54000" and f.violation.valid_upto == 15


def test_violation_after_a_held_message_completes():
    parse = msg(b"P", b"\x00SELECT 1\x00\x00\x00")
    f = Framer(CLIENT)
    assert f.feed(parse[:8]) == []  # held from its first byte
    rest = parse[8:] + msg(b"d") + b"\x07\x00\x00\x00\x04"
    assert f.feed(rest) == [(HOLD, ord("P"), parse[5:]), (SPAN, msg(b"d"))]
    assert f.violation.valid_upto == len(parse) - 8 + 5 and "type 7" in f.violation.message


def test_a_bad_type_in_a_split_header_is_caught_at_its_first_byte():
    f = Framer(CLIENT)
    d = msg(b"d")
    assert f.feed(d + b"\x02\x00") == [(SPAN, d)]
    assert f.violation.valid_upto == 5
