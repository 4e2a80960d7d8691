"""The compiled framer against the pure-Python one (ADR 0018), byte for byte: random message streams, split at random
chunk boundaries, with the verb table switched between chunks, malformed lengths and refused types included. Both
must return the same items (kinds, types and bytes), keep the same boundary, and report the same violation."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys

from framers import framer_class
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire import framer as framer_module
from proxy.wire.codec import FRONTEND_TYPES
from proxy.wire.framer import COPY, FORWARD, HOLD, HOLD_ALL, PASS_ALL, REFUSE, verbs

TABLES = (
    PASS_ALL,
    HOLD_ALL,
    verbs(REFUSE, forward=FRONTEND_TYPES),
    verbs(REFUSE, forward=FRONTEND_TYPES, hold=b"QPBDECSF", copy=b"X"),
    verbs(FORWARD, copy=b"CZT", hold=b"E"),
    verbs(FORWARD, copy=b"RKSZEvT", hold=b"ES"),
    verbs(REFUSE, forward=FRONTEND_TYPES, copy=b"QPB", hold=b"dS"),
)
TYPES = b"DDDDTCZEPBSQdXNK\x01\x02"  # DataRow most often (the hop over a run of rows), and two refused types


def message(t: int, body: bytes, bad_length: int | None = None) -> bytes:
    length = len(body) + 4 if bad_length is None else bad_length
    return bytes([t]) + struct.pack("!I", length) + body


def outcome(cls, chunks, tables, max_length):
    f = cls(tables[0], max_length=max_length)
    steps = []
    for chunk, table in zip(chunks, tables):
        f.table = table
        items = [tuple(bytes(x) if isinstance(x, (bytes, bytearray)) else x for x in item) for item in f.feed(chunk)]
        steps.append((items, f.at_boundary))
    v = f.violation
    return steps, None if v is None else (type(v), v.message, v.sqlstate, v.valid_upto)


def same(stream: bytes, cuts, table_picks, max_length: int = framer_module.MAX_MESSAGE_LENGTH) -> None:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(stream)}), len(stream)]
    chunks = [stream[a:b] for a, b in zip(bounds, bounds[1:])] or [b""]
    tables = [TABLES[table_picks[i % len(table_picks)] % len(TABLES)] for i in range(len(chunks))]
    py = outcome(framer_class("python"), chunks, tables, max_length)
    c = outcome(framer_class("c"), chunks, tables, max_length)
    assert c == py


messages = st.lists(
    st.tuples(st.sampled_from(TYPES), st.binary(max_size=60),
              st.one_of(st.none(), st.none(), st.none(), st.integers(min_value=0, max_value=3),
                        st.integers(min_value=70, max_value=2**32 - 1))),
    max_size=20)


@given(messages, st.lists(st.integers(min_value=0, max_value=1500), max_size=15),
       st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=8),
       st.sampled_from([framer_module.MAX_MESSAGE_LENGTH, 40, 0]))
@settings(max_examples=1500, deadline=None)
def test_the_compiled_framer_returns_what_the_python_one_returns(msgs, cuts, table_picks, max_length):
    stream = b"".join(message(t, body, bad) for t, body, bad in msgs)
    same(stream, cuts, table_picks, max_length)


def test_seeded_streams_in_every_chunking():
    """A fixed set of random streams (rows, held and copied kinds, a bad message now and then), each cut at random
    points several times and also byte by byte."""
    rnd = random.Random(20261205)
    for _ in range(300):
        parts = []
        for _ in range(rnd.randint(0, 30)):
            t = rnd.choice(TYPES)
            body = rnd.randbytes(rnd.choice((0, 1, 4, 17, 200, 3000)))
            bad = None
            if rnd.random() < 0.03:
                bad = rnd.choice((0, 3, 2**31, 2**32 - 1))
            parts.append(message(t, body, bad))
        stream = b"".join(parts)
        picks = [rnd.randrange(len(TABLES)) for _ in range(6)]
        for _ in range(4):
            cuts = [rnd.randrange(len(stream) + 1) for _ in range(rnd.randint(0, 12))]
            same(stream, cuts, picks)
        if len(stream) < 400:
            same(stream, range(len(stream)), picks)


def test_a_chunk_with_nothing_held_is_the_same_object_in_both():
    stream = message(ord("D"), b"\x00\x01\x00\x00\x00\x01x") * 50 + message(ord("C"), b"SELECT 50\x00")
    for name in ("python", "c"):
        (item,) = framer_class(name)(PASS_ALL).feed(stream)
        assert item[1] is stream


def test_the_compiled_framer_takes_only_verb_tables():
    f = framer_class("c")(PASS_ALL)
    for bad in (b"\x00" * 255, bytearray(256), b"\x04" * 256):
        try:
            f.table = bad
        except (TypeError, ValueError):
            pass
        else:
            raise AssertionError(f"table {bad[:4]!r}… accepted")
    assert f.table is PASS_ALL
    f.table = HOLD_ALL
    assert f.feed(message(ord("Z"), b"I")) == [(HOLD, ord("Z"), b"I")]
    f.table = verbs(copy=b"Z")
    assert f.feed(message(ord("Z"), b"I")) == [(COPY, ord("Z"), b"I"), (0, message(ord("Z"), b"I"))]


def selected(value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != framer_module.IMPLEMENTATION_ENV}
    if value is not None:
        env[framer_module.IMPLEMENTATION_ENV] = value
    return subprocess.run([sys.executable, "-c", "from proxy.wire import framer as f; "
                           "print(f.IMPLEMENTATION, f.Framer.__name__, f.IMPLEMENTATION_NOTE)"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_seat_uses_the_compiled_framer_unless_told_otherwise():
    """make setup builds the compiled framer, and the seat takes it by default; OPENWOP_SEAT_FRAMER=python picks the
    pure-Python one and says so; another value is refused."""
    assert selected(None).stdout.split() == ["c", "CFramer"]
    assert selected("c").stdout.split() == ["c", "CFramer"]
    assert selected("python").stdout.strip() == "python PyFramer chosen by OPENWOP_SEAT_FRAMER=python"
    bad = selected("rust")
    assert bad.returncode != 0 and "OPENWOP_SEAT_FRAMER is 'rust': it may be 'c' or 'python'" in bad.stderr
