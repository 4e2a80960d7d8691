"""The compiled quiet bookkeeping (proxy/readpath/_cquiet.c) against its definition, ReadPath.on_client called for
every message (ADR 0018, second addendum): the same random client streams, cut at random chunk boundaries, with
server answers between chunks, go through two relays, one per implementation. Both must send the same bytes, end
the same way, and leave the same read-path state: statements, portals, the unnamed statement, the quiet FIFOs, the
plan-once names, the statement metrics and the FIFO of owed answers."""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys

from framers import framer_class, quiet_core
from hypothesis import given, settings
from hypothesis import strategies as st

import proxy.serve.relay as relay_module
from proxy.config import HostConfig
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import EventColumns, ReadPath
from proxy.serve.relay import Relay
from proxy.stats import Stats

PAGE = b"SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT 100"
TYPES = b"SELECT type FROM events WHERE run_id = $1"  # another translated statement: another plan
REFUSED = b"SELECT * FROM events TABLESAMPLE SYSTEM (1)"
PARAMS = b"\x00\x02\x00\x00\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x010\x00\x00"  # 2 text values, no formats


def msg(t: bytes, body: bytes = b"") -> bytes:
    return t + struct.pack("!I", len(body) + 4) + body


LOGIN = msg(b"R", struct.pack("!I", 0)) + msg(b"K", struct.pack("!I", 4242) + b"key!") + msg(b"Z", b"I")
READY = msg(b"Z", b"I")
ANSWERS = (READY, msg(b"1") + msg(b"2") + msg(b"n") + msg(b"C", b"SELECT 0\x00") + READY, msg(b"Z", b"T"),
           msg(b"E", b"SERROR\x00C42P01\x00Mno\x00\x00") + READY, b"")

# Client messages: the kinds the compiled code handles, well formed and not, and those it leaves to on_client.
NAMES = (b"", b"s1", b"s2", b"\xff\xfe")
CLIENT = (
    *(msg(b"P", name + b"\x00" + sql + b"\x00\x00\x00") for name in NAMES[:3]
      for sql in (PAGE, TYPES, b"SELECT 1", REFUSED)),
    msg(b"P", b"\x00DISCARD ALL\x00\x00\x00"),
    *(msg(b"B", portal + b"\x00" + stmt + b"\x00" + PARAMS) for portal in (b"", b"p1") for stmt in NAMES),
    msg(b"B", b"\xff\x00s1\x00" + PARAMS), msg(b"B", b"p1"), msg(b"B", b"p1\x00s1"), msg(b"B"),
    msg(b"D", b"S\x00"), msg(b"D", b"Ss1\x00"), msg(b"D", b"P\x00"), msg(b"D", b"Pp1\x00"), msg(b"D"),
    msg(b"D", b"S"), msg(b"D", b"S\x00\x00"),
    msg(b"E", b"\x00\x00\x00\x00\x00"), msg(b"E", b"p1\x00\x00\x00\x00\x00"), msg(b"E", b"\xff\x00\x00\x00\x00\x00"),
    msg(b"E", b"p1"), msg(b"E"),
    msg(b"S"), msg(b"S"), msg(b"S"), msg(b"H"),
    msg(b"C", b"Ss1\x00"), msg(b"C", b"Pp1\x00"), msg(b"C", b"S\x00"),
    msg(b"Q", b"SELECT 1\x00"), msg(b"Q", PAGE.replace(b"$1", b"'r'").replace(b"$2", b"0") + b"\x00"),
)


@contextlib.contextmanager
def core(name: str):
    saved = relay_module.Framer, relay_module.QUIET_RUN, relay_module.JOIN_PARTS, relay_module.SERVER_QUIET_RUN
    relay_module.Framer = framer_class(name)
    relay_module.QUIET_RUN, relay_module.JOIN_PARTS, relay_module.SERVER_QUIET_RUN = quiet_core(name)
    try:
        yield
    finally:
        relay_module.Framer, relay_module.QUIET_RUN, relay_module.JOIN_PARTS, relay_module.SERVER_QUIET_RUN = saved


def state(r: Relay) -> dict:
    rp = r.reader

    def statement(s):
        return None if s is None else (s.plan.text, s.cls)

    return {
        "statements": {k: statement(v) for k, v in rp.statements.items()},
        "portals": {k: statement(v.statement) for k, v in rp.portals.items()},
        "unnamed": rp.unnamed, "quiet_group": list(rp.quiet_group), "quiet_sent": len(rp.quiet_sent),
        "quiet_sent_kind": type(rp.quiet_sent).__name__, "counts": dict(rp.statement_counts),
        "prepared": dict(rp.prepared), "preparing": [list(p) for p in rp.preparing],
        "pending": [(e.kind, e.name, e.watched, e.local) for e in rp.pending], "active": rp.active,
        "skipping": rp.skipping, "tx": rp.tx_status, "readies": rp.readies, "refusals": list(rp.refusals),
        "queries_sent": r.queries_sent, "bytes_in": r.bytes_in, "owed": r.owed,
        "ending": r.ending,
        # the repeated unnamed Parse (ReadPath._repeated_parse): what is kept, and the classifier's hits it counts
        "repeat": None if rp._repeat is None else (*rp._repeat[:4], statement(rp._repeat[4]), rp._repeat[5]),
        "hits": rp.classifier.hits, "misses": rp.classifier.misses,
    }


def run(name: str, chunks: list[bytes], answers: list[bytes]) -> list:
    with core(name):
        r = Relay(Stats(), reader=ReadPath(Classifier(HostConfig(), 2), 2, None), count_answered=True)
        r.from_server(LOGIN)
        steps = []
        for chunk, answer in zip(chunks, answers):
            sent = r.from_client(chunk)
            back = r.from_server(answer) if answer else None
            steps.append((sent, back, state(r)))
            if r.ending is not None:
                break
        return steps


def same(stream: bytes, cuts: list[int], answer_picks: list[int]) -> None:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(stream)}), len(stream)]
    chunks = [stream[a:b] for a, b in zip(bounds, bounds[1:])] or [b""]
    answers = [ANSWERS[answer_picks[i % len(answer_picks)] % len(ANSWERS)] for i in range(len(chunks))]
    python = run("python", chunks, answers)
    compiled = run("c", chunks, answers)
    assert compiled == python


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(CLIENT), max_size=40), st.lists(st.integers(min_value=0, max_value=4000), max_size=6),
       st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=6))
def test_random_streams_give_the_same_bytes_and_state(messages, cuts, answer_picks):
    same(b"".join(messages), cuts, answer_picks)


# What a hostile client could send instead: Binds, Describes, Executes, Syncs and Flushes with any body at all (names
# with and without their NULs, not UTF-8, empty), among the page's own messages.
ANY_BODY = st.builds(lambda t, body: msg(t, body), st.sampled_from((b"B", b"D", b"E", b"S", b"H")),
                     st.one_of(st.binary(max_size=24),
                               st.builds(lambda a, b, c: a + b"\x00" + b + b"\x00" + c,
                                         st.sampled_from((b"", b"p1", b"\xff")), st.sampled_from(NAMES),
                                         st.binary(max_size=8))))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(CLIENT), ANY_BODY), max_size=30),
       st.lists(st.integers(min_value=0, max_value=3000), max_size=5),
       st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=5))
def test_any_bodies_give_the_same_bytes_state_and_ending(messages, cuts, answer_picks):
    same(b"".join(messages), cuts, answer_picks)


def page() -> bytes:
    return (msg(b"P", b"\x00" + PAGE + b"\x00\x00\x00") + msg(b"B", b"\x00\x00" + PARAMS) + msg(b"D", b"P\x00")
            + msg(b"E", b"\x00\x00\x00\x00\x00") + msg(b"S"))


def test_pages_with_plan_once_give_the_same_bytes_and_state():
    """The host's page, again and again (plan once: the Bind and Describe name the prepared statement), whole and
    cut in every place of the second page, with a ReadyForQuery after each."""
    stream = page() * 3
    same(stream, [len(page()), 2 * len(page())], [0])
    for cut in range(len(page()), 2 * len(page())):
        same(stream, [cut], [4, 0])


class CountingReadPath(ReadPath):
    """A read path that records the type of each message on_client, and on_server_quiet, is called with."""

    __slots__ = ("calls", "server_calls")

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.calls, self.server_calls = [], []

    def on_client(self, t: int, body: bytes):
        self.calls.append(chr(t))
        return super().on_client(t, body)

    def on_server_quiet(self, t: int, body: bytes):
        self.server_calls.append(chr(t))
        return super().on_server_quiet(t, body)


def test_the_compiled_core_leaves_only_the_parse_to_on_client():
    """What the compiled code takes over is really taken: of a page's five messages only the Parse reaches
    on_client (the pure-Python core calls it for all five), and only until the Parse can be repeated (the first
    page's prepares the statement, the second's finds it; from the third on the compiled code repeats it)."""
    for name, calls in (("python", ["P", "B", "D", "E", "S"] * 4), ("c", ["P"] * 2)):
        with core(name):
            reader = CountingReadPath(Classifier(HostConfig(), 2), 2, None)
            r = Relay(Stats(), reader=reader, count_answered=True)
            r.from_server(LOGIN)
            for _ in range(4):
                out = r.from_client(page())
                assert out.startswith(b"P") and r.from_server(ANSWERS[1]) == (ANSWERS[1], b"")
            assert reader.calls == calls, name
            assert reader.statement_counts[("event_read", "extended")] == 4 and r.queries_sent == 4
            assert reader.prepared and reader.unnamed is not None  # plan once: the Bind named the statement


def test_a_portal_bound_again_to_a_statement_not_followed_is_forgotten_in_both():
    """Bind drops the portal's statement when the new one is passthrough: the Execute that follows counts as
    passthrough, not as the event read the portal held before (named and unnamed portals)."""
    for portal, stmt in ((b"", b""), (b"p1", b"s1")):
        bind = msg(b"B", portal + b"\x00" + stmt + b"\x00" + PARAMS)
        execute = msg(b"E", portal + b"\x00\x00\x00\x00\x00") + msg(b"S")
        stream = (msg(b"P", stmt + b"\x00" + PAGE + b"\x00\x00\x00") + bind + execute
                  + msg(b"P", stmt + b"\x00SELECT 1\x00\x00\x00") + bind + execute)
        python = run("python", [stream], [b""])
        assert python[-1][2]["counts"] == {("event_read", "extended"): 1, ("passthrough", "extended"): 1}
        assert run("c", [stream], [b""]) == python


def test_a_portal_bound_again_to_another_followed_statement_holds_the_new_one():
    """A page's repeated Bind keeps its portal, but a Bind of the same portal to another statement replaces it."""
    for portal in (b"", b"p1"):
        stream = (msg(b"P", b"s1\x00" + PAGE + b"\x00\x00\x00") + msg(b"P", b"s2\x00" + TYPES + b"\x00\x00\x00")
                  + msg(b"B", portal + b"\x00s1\x00" + PARAMS) + msg(b"B", portal + b"\x00s1\x00" + PARAMS)
                  + msg(b"B", portal + b"\x00s2\x00" + PARAMS) + msg(b"S"))
        python = run("python", [stream], [b""])
        state = python[-1][2]
        assert state["portals"][portal.decode()] == state["statements"]["s2"] != state["statements"]["s1"]
        assert run("c", [stream], [b""]) == python


def test_a_statement_parsed_again_with_another_text_holds_the_new_plan():
    """A page's repeated Parse keeps its statement, but a Parse of the same name with another text replaces it (both
    cores run the Parse in Python: this holds the definition itself)."""
    for name in (b"", b"s1"):
        def parse(sql: bytes) -> bytes:
            return msg(b"P", name + b"\x00" + sql + b"\x00\x00\x00") + msg(b"S")

        for core_name in ("python", "c"):
            again = run(core_name, [parse(PAGE) + parse(PAGE) + parse(TYPES)], [b""])[-1][2]["statements"]
            alone = run(core_name, [parse(TYPES)], [b""])[-1][2]["statements"]
            assert again == alone and again[name.decode()][1] == "event_read"


def test_a_malformed_bind_ends_the_session_in_both_with_the_same_words():
    """A statement name that is not UTF-8 while statements are followed: on_client's ProtocolViolation, from the
    compiled core too (it hands the message back untouched)."""
    stream = msg(b"P", b"s1\x00" + PAGE + b"\x00\x00\x00") + msg(b"B", b"\x00\xff\x00" + PARAMS) + msg(b"S")
    python = run("python", [stream], [b""])
    assert python[-1][2]["ending"] is not None and "08P01" == python[-1][2]["ending"].sqlstate
    assert run("c", [stream], [b""]) == python


def quiet_selected(value: str | None, built: bool = True) -> subprocess.CompletedProcess:
    """What a fresh process takes as the quiet read path with OPENWOP_SEAT_FRAMER at ``value``; ``built=False``
    imports it as if _cquiet.c had not been built."""
    env = {k: v for k, v in os.environ.items() if k != "OPENWOP_SEAT_FRAMER"}
    if value is not None:
        env["OPENWOP_SEAT_FRAMER"] = value
    hide = "" if built else "import sys; sys.modules['proxy.readpath._cquiet'] = None; "
    return subprocess.run([sys.executable, "-c", hide + "from proxy.readpath import read_path as r; "
                           "print(r.QUIET_RUN is not None, r.JOIN_PARTS is not None, r.SERVER_QUIET_RUN is not None, "
                           "r.QUIET_MISSING or '-')"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_quiet_read_path_follows_the_framers_choice():
    """Compiled by default and with OPENWOP_SEAT_FRAMER=c, pure Python with =python; not built, the seat runs the
    pure-Python one and says why, unless =c asked for the compiled core, which then refuses to start."""
    assert quiet_selected(None).stdout.split() == ["True", "True", "True", "-"]
    assert quiet_selected("c").stdout.split() == ["True", "True", "True", "-"]
    assert quiet_selected("python").stdout.split() == ["False", "False", "False", "-"]
    missing = quiet_selected(None, built=False)
    assert missing.stdout.startswith("False False False the compiled quiet read path (proxy/readpath/_cquiet.c) "
                                     "is not built")
    refused = quiet_selected("c", built=False)
    assert refused.returncode != 0 and "OPENWOP_SEAT_FRAMER=c, but the compiled quiet read path" in refused.stderr


# ---------------------------------------------------------------- the server's side (server_quiet_run)

EVENTS = EventColumns(0x61626364, 4, derived_oids=frozenset({0x00C0FFEE}), payload_attnum=5)


def field(name: bytes, table_oid: int, attnum: int) -> bytes:
    return name + b"\x00" + struct.pack("!IhIhih", table_oid, attnum, 25, -1, -1, 0)


def row_description(*fields: bytes) -> bytes:
    return msg(b"T", struct.pack("!h", len(fields)) + b"".join(fields))


# Server messages while the read path is quiet: what the compiled side takes (spans, RowDescriptions that name no
# watched relation, ReadyForQuery of one status byte) and what it must leave to the loop (an error, a FATAL, a
# ParameterStatus of the encoding or not, a RowDescription of the events table's type column, one that holds a
# watched OID's bytes by chance and leaks nothing, a ReadyForQuery whose body is not one byte).
SERVER = (
    msg(b"1"), msg(b"2"), msg(b"n"), msg(b"s"), msg(b"I"), msg(b"D", b"\x00\x01\x00\x00\x00\x01x"),
    msg(b"C", b"SELECT 1\x00"), msg(b"N", b"SNOTICE\x00Mhi\x00\x00"), msg(b"A", b"\x00\x00\x00\x01ch\x00\x00"),
    row_description(field(b"id", 0, 0)), row_description(field(b"sequence", 0x61626364, 2)),
    row_description(field(b"type", 0x61626364, 4)), row_description(field(b"t", 0x00C0FFEE, 1)),
    row_description(field(b"abcd", 0, 0)),  # the bytes of the events table's OID in a column name: no leak
    msg(b"Z", b"I"), msg(b"Z", b"I"), msg(b"Z", b"T"), msg(b"Z", b"E"), msg(b"Z"), msg(b"Z", b"II"),
    msg(b"E", b"SERROR\x00C42P01\x00Mno\x00\x00"), msg(b"E", b"SFATAL\x00VFATAL\x00C57P01\x00Mbye\x00\x00"),
    msg(b"S", b"application_name\x00app\x00"), msg(b"S", b"client_encoding\x00UTF8\x00"),
    msg(b"S", b"client_encoding\x00SJIS\x00"),
)


def server_state(r: Relay) -> dict:
    histogram = r.reader.statement_seconds
    return {**state(r), "relay_readies": r.readies, "transactions": r.transactions, "txn": r.state.txn_status,
            "phase": r.state.phase, "bytes_out": r.bytes_out, "server_errors": dict(r.reader.server_errors),
            "observed": sum(histogram.counts) if histogram is not None else None}


def run_server(name: str, steps: list[tuple[bytes, list[bytes]]], events: EventColumns | None) -> list:
    """Client chunks, each followed by server chunks, through a relay of core ``name`` whose read path counts into
    process-wide stats (as in the seat: the statement latency histogram is observed)."""
    with core(name):
        reader = ReadPath(Classifier(HostConfig(), 2), 2, events)
        r = Relay(Stats(), reader=reader, count_answered=True)
        reader.attach(r.stats)
        r.from_server(LOGIN)
        seen = []
        for chunk, answers in steps:
            sent = r.from_client(chunk) if chunk else None
            backs = [r.from_server(a) for a in answers]
            seen.append((sent, backs, server_state(r)))
            if r.ending is not None:
                break
        return seen


def server_same(steps: list[tuple[bytes, list[bytes]]], events: EventColumns | None = EVENTS) -> list:
    python = run_server("python", steps, events)
    assert run_server("c", steps, events) == python
    return python


def cut(stream: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(stream)}), len(stream)]
    return [stream[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from((b"", page(), msg(b"S"), msg(b"Q", b"SELECT 1\x00"))),
                          st.lists(st.sampled_from(SERVER), max_size=12),
                          st.lists(st.integers(min_value=0, max_value=400), max_size=3)), max_size=8),
       st.booleans())
def test_random_server_streams_give_the_same_bytes_and_state(steps, watched):
    """Any server messages, cut anywhere, between the host's pages, Syncs and simple queries (so that latencies are
    owed, and plan-once statements are being prepared when a ReadyForQuery comes): both cores send the same bytes,
    end the same way and leave the same state, with and without watched relations."""
    server_same([(chunk, cut(b"".join(answer), cuts)) for chunk, answer, cuts in steps], EVENTS if watched else None)


def test_a_page_answer_goes_through_the_compiled_side_to_the_same_state():
    """The host's page answered as PostgreSQL answers it, a hundred times: the same bytes and counts in both (the
    relay's and the read path's ReadyForQuery counts, a latency observed for every page)."""
    answer = (msg(b"1") + msg(b"2") + row_description(field(b"id", 0, 0), field(b"sequence", 0x61626364, 2))
              + msg(b"D", b"\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x011") * 5 + msg(b"C", b"SELECT 5\x00") + READY)
    final = server_same([(page(), [answer])] * 100)[-1][2]
    assert final["observed"] == 100 and final["relay_readies"] == final["readies"] + 1  # the login's is not counted


def test_a_leaking_row_description_ends_the_session_in_both_with_the_same_words():
    """A quiet result that names the events table's type column: the compiled side hands it to the loop, whose leak
    check ends the session (OW007) before anything of that chunk after it goes out."""
    answer = (msg(b"1") + msg(b"2") + row_description(field(b"type", 0x61626364, 4)) + msg(b"D", b"\x00\x00")
              + msg(b"C", b"SELECT 1\x00") + READY)
    final = server_same([(page(), [answer])])[-1][2]
    assert final["ending"] is not None and final["ending"].sqlstate == "OW007"


def test_a_transaction_that_ends_is_counted_by_both():
    stream = [(msg(b"Q", b"BEGIN\x00"), [msg(b"C", b"BEGIN\x00") + msg(b"Z", b"T")]),
              (msg(b"Q", b"COMMIT\x00"), [msg(b"C", b"COMMIT\x00") + READY])]
    final = server_same(stream)[-1][2]
    assert final["transactions"] == 1 and final["txn"] == b"I"


def test_the_compiled_side_leaves_only_what_it_must_to_on_server_quiet():
    """What the compiled side takes over is really taken: of a page's answer nothing reaches on_server_quiet from
    the second page on (the first prepares the plan-once statement, whose ReadyForQuery settles it in Python); an
    error does, and the compiled side takes the ReadyForQuery after it again. The pure-Python core calls it for
    every RowDescription and ReadyForQuery."""
    answer = msg(b"1") + msg(b"2") + row_description(field(b"id", 0, 0)) + msg(b"C", b"SELECT 0\x00") + READY
    error = msg(b"E", b"SERROR\x00C42P01\x00Mno\x00\x00") + READY
    for name, calls in (("python", ["T", "Z"] * 4 + ["E", "Z"]), ("c", ["Z", "E"])):
        with core(name):
            reader = CountingReadPath(Classifier(HostConfig(), 2), 2, EVENTS)
            r = Relay(Stats(), reader=reader, count_answered=True)
            r.from_server(LOGIN)
            for _ in range(4):
                r.from_client(page())
                assert r.from_server(answer) == (answer, b"")
            r.from_client(page())
            r.from_server(error)
            assert reader.server_calls == calls, name
