"""A repeated unnamed Parse (ReadPath._repeated_parse): a page's Parse, sent again at every page, is done as the last
one was without classifying its text again, and nothing a client or the seat can do makes its outcome differ from
the whole way's. The oracle is the read path with the shortcut taken out."""

from __future__ import annotations

import random
import struct

import pytest

from proxy.config import HostConfig
from proxy.readpath import read_path
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import REPEAT_MAX_BYTES, EventColumns, ReadPath
from proxy.serve.relay import Relay
from proxy.stats import Stats
from proxy.wire import messages

pytestmark = pytest.mark.usefixtures("each_framer")

EVENTS = EventColumns(0x61626364, 4, payload_attnum=6)
PAGE = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
OTHER_PAGE = "SELECT * FROM events WHERE run_id = $1 ORDER BY sequence"
RUNS = "SELECT * FROM runs WHERE run_id = $1"
REFUSED = "SELECT * FROM events TABLESAMPLE SYSTEM (1)"


class Whole(ReadPath):
    """The read path with the shortcut taken out: every Parse goes the whole way (nothing is ever kept to repeat,
    for the Python shortcut or the compiled one to find)."""

    __slots__ = ()
    _repeat = property(lambda self: None, lambda self, value: None)


def parse(sql: str, name: str = "", types: tuple[int, ...] = ()) -> bytes:
    return (name.encode() + b"\x00" + sql.encode() + b"\x00" + struct.pack("!h", len(types))
            + b"".join(struct.pack("!I", t) for t in types))


BIND = b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x02r1\x00\x00"


def page(rp: ReadPath, sql: str = PAGE, types: tuple[int, ...] = ()) -> list:
    """One page's Parse/Bind/Describe/Execute/Sync and its answer: what each client message became."""
    out = [rp.on_client(ord("P"), parse(sql, types=types)), rp.on_client(ord("B"), BIND),
           rp.on_client(ord("D"), b"P\x00"), rp.on_client(ord("E"), b"\x00\x00\x00\x00\x00"),
           rp.on_client(ord("S"), b"")]
    answer(rp)
    return out


def answer(rp: ReadPath, error: bool = False) -> None:
    on = rp.on_server_quiet if rp.quiet else rp.on_server
    if error:
        on(ord("E"), b"SERROR\x00C42P01\x00Mboom\x00\x00")
    while not rp.quiet or rp.quiet_sent:
        (rp.on_server_quiet if rp.quiet else rp.on_server)(ord("Z"), b"I")


def state(rp: ReadPath) -> tuple:
    return (rp.unnamed, dict(rp.prepared), [p[:2] for p in rp.preparing],
            {k: (v.cls, v.plan.text) for k, v in rp.statements.items()},
            {k: (p.statement.cls if p.statement else None) for k, p in rp.portals.items()}, list(rp.quiet_group),
            len(rp.quiet_sent), len(rp.pending), dict(rp.statement_counts), rp.classifier.hits, rp.classifier.misses,
            list(rp.classifier._cache))


def pair() -> tuple[ReadPath, ReadPath]:
    return (ReadPath(Classifier(HostConfig(), 2), 2, EVENTS), Whole(Classifier(HostConfig(), 2), 2, EVENTS))


def test_a_pages_repeated_parse_is_not_classified_again_and_sends_the_same(monkeypatch):
    rp, whole = pair()
    for _ in range(3):
        assert page(rp) == page(whole)
    assert rp._repeat is not None and state(rp) == state(whole)
    calls = []
    monkeypatch.setattr(rp.classifier, "classify", lambda sql: calls.append(sql))
    assert page(rp) == page(whole)
    assert calls == [] and state(rp) == state(whole)
    assert rp.on_client(ord("P"), parse(PAGE)) == b"P\x00\x00\x00\x08\x00\x00\x00\x00"  # the empty unnamed Parse


def test_a_statement_passed_as_it_is_repeats_as_it_is(monkeypatch):
    rp, whole = pair()
    for _ in range(2):
        assert page(rp, RUNS) == page(whole, RUNS) == [None] * 5
    assert rp._repeat is not None and rp._repeat[4] is None
    monkeypatch.setattr(rp.classifier, "classify", lambda sql: pytest.fail("classified again"))
    assert page(rp, RUNS) == [None] * 5 and rp.unnamed is None


@pytest.mark.parametrize("change", ["reload", "stale", "discard", "deallocate", "close", "types", "named", "other"])
def test_whatever_changed_since_the_parse_takes_it_the_whole_way(change):
    rp, whole = pair()
    for _ in range(2):
        page(rp)
        page(whole)
    assert rp._repeat is not None
    misses = rp.classifier.misses
    for r in (rp, whole):
        if change == "reload":  # the functions the classifier refuses changed: its plans are dropped
            r.classifier.set_functions(frozenset({"my_reader"}))
        elif change == "stale":  # the translated relations no longer match the events table
            r.watch.stale = "a column was added"
        elif change in ("discard", "deallocate"):
            r.on_client(ord("Q"), (b"DISCARD ALL" if change == "discard" else b"DEALLOCATE ALL") + b"\x00")
            answer(r)
        elif change == "close":
            r.on_client(ord("C"), b"S\x00")
        elif change == "named":  # the page's text as a named statement: the unnamed one is untouched
            r.on_client(ord("P"), parse(PAGE, name="mine"))
            r.on_client(ord("S"), b"")
            answer(r)
    types = (25, 23, 23) if change == "types" else ()
    sql = OTHER_PAGE if change == "other" else PAGE
    got, want = page(rp, sql, types), page(whole, sql, types)
    assert got == want and state(rp) == state(whole)
    if change == "stale":  # refused, as the whole way refuses it (answered by the seat: the Bind, Describe and
        assert got[1:4] == [b"", b"", b""] and rp._repeat is None  # Execute dropped), never the prepared statement
    if change in ("discard", "deallocate", "types", "other"):
        assert want[0] is not None and want[0][5:].startswith(b"openwop_seat_")  # prepared again, under a new name
    if change == "reload":  # classified again (the same text: the statement prepared before still serves)
        assert rp.classifier.misses == misses + 1 and got[0] == b"P\x00\x00\x00\x08\x00\x00\x00\x00"
    # and the next page repeats again (or stays refused) exactly as the whole way
    assert page(rp, sql, types) == page(whole, sql, types) and state(rp) == state(whole)


def test_a_repeated_text_that_discards_always_forgets_the_prepared_statements():
    """A passed statement that drops server-side statements (DISCARD, DEALLOCATE) is never repeated: each time it
    must forget the seat's prepared statements, whether or not there were any the first time."""
    rp, whole = pair()
    for r in (rp, whole):
        page(r, "DISCARD ALL")  # nothing prepared yet: nothing to forget
        page(r)  # prepared (its first Parse is sent named: nothing to repeat)
        assert r.prepared
        page(r, "DISCARD ALL")
        assert not r.prepared
    assert state(rp) == state(whole)
    assert page(rp) == page(whole) and state(rp) == state(whole)


def test_a_long_text_is_not_kept_to_repeat():
    rp = ReadPath(Classifier(HostConfig(), 2), 2, EVENTS)
    long = PAGE + " -- " + "x" * REPEAT_MAX_BYTES
    for _ in range(3):
        page(rp, long)
    assert rp.prepared and rp._repeat is None


def test_a_refused_parse_is_never_repeated():
    rp, whole = pair()
    for _ in range(3):
        assert page(rp, REFUSED) == page(whole, REFUSED)
        assert rp._repeat is None and state(rp) == state(whole)


def test_an_error_in_the_first_pages_group_is_never_trusted_nor_repeated():
    rp, whole = pair()
    for r in (rp, whole):
        for m, b in ((ord("P"), parse(PAGE)), (ord("B"), BIND), (ord("E"), b"\x00\x00\x00\x00\x00"),
                     (ord("S"), b"")):
            r.on_client(m, b)
        answer(r, error=True)
    assert not rp.prepared and rp._repeat is None
    assert page(rp) == page(whole) and state(rp) == state(whole)


# The operations of the randomized comparison: each applied to both read paths, which must send and hold the same.
OPERATIONS = {
    "page": lambda r: page(r),
    "other page": lambda r: page(r, OTHER_PAGE),
    "runs": lambda r: page(r, RUNS),
    "typed page": lambda r: page(r, types=(25, 23, 23)),
    "refused": lambda r: page(r, REFUSED),
    "query": lambda r: (r.on_client(ord("Q"), b"SELECT 1\x00"), answer(r)),
    "discard": lambda r: (r.on_client(ord("Q"), b"DISCARD ALL\x00"), answer(r)),
    "close unnamed": lambda r: r.on_client(ord("C"), b"S\x00"),
    "named page": lambda r: (r.on_client(ord("P"), parse(PAGE, name="n1")), r.on_client(ord("S"), b""), answer(r)),
    "failed page": lambda r: ([r.on_client(m, b) for m, b in ((ord("P"), parse(PAGE)), (ord("B"), BIND),
                                                              (ord("E"), b"\x00\x00\x00\x00\x00"), (ord("S"), b""))],
                              answer(r, error=True)),
    "reload": lambda r: r.classifier.set_functions(frozenset({f"f{r.classifier.generation}"})),
    "stale": lambda r: setattr(r.watch, "stale", "" if r.watch.stale else "stale"),
}


@pytest.mark.parametrize("seed", range(40))
def test_random_sequences_send_and_hold_exactly_what_the_whole_way_does(seed):
    rng = random.Random(seed)
    rp, whole = pair()
    names = list(OPERATIONS)
    done = []
    for _ in range(60):
        name = rng.choice(names[:4] * 4 + names)  # pages mostly, so that there is something to repeat
        done.append(name)
        assert OPERATIONS[name](rp) == OPERATIONS[name](whole), done
        assert state(rp) == state(whole), done


def test_the_shortcut_is_taken_in_the_random_sequences():
    """The comparison above would hold trivially if nothing were ever repeated."""
    taken = 0
    real = ReadPath._repeated_parse

    def counting(self, body):
        nonlocal taken
        hit = real(self, body)
        taken += hit
        return hit

    rp = ReadPath(Classifier(HostConfig(), 2), 2, EVENTS)
    read_path.ReadPath._repeated_parse = counting
    try:
        for _ in range(5):
            page(rp)
    finally:
        read_path.ReadPath._repeated_parse = real
    assert taken == 3  # the first page prepares, the second finds it (and keeps it to repeat), then three repeats


LOGIN = (messages.message(b"R", struct.pack("!I", 0)) + messages.message(b"S", b"client_encoding\x00UTF8\x00")
         + messages.message(b"K", struct.pack("!I", 7) + b"key!") + messages.message(b"Z", b"I"))
REPLY = b"".join(messages.message(t, b) for t, b in ((b"1", b""), (b"2", b""), (b"C", b"SELECT 0\x00"), (b"Z", b"I")))


def chunk(sql: str = PAGE, types: tuple[int, ...] = ()) -> bytes:
    return b"".join(messages.message(t, b) for t, b in ((b"P", parse(sql, types=types)), (b"B", BIND),
                                                         (b"D", b"P\x00"), (b"E", b"\x00\x00\x00\x00\x00"),
                                                         (b"S", b"")))


@pytest.mark.parametrize("change", [None, "reload", "stale", "discard", "close", "types", "runs", "same length"])
def test_through_the_relay_the_bytes_are_the_whole_ways(change):
    """Through the relay, whose quiet bookkeeping is compiled or Python as the framer chosen (the compiled one
    repeats the Parse itself): the same bytes to the server page after page, with the shortcut and without it,
    and after whatever must take the Parse the whole way."""
    relays = []
    for reader in pair():
        relay = Relay(Stats(), reader=reader, count_answered=True)
        relay.from_server(LOGIN)
        relays.append(relay)

    def pages(n: int, data: bytes) -> None:
        for _ in range(n):
            sent = [r.from_client(data) for r in relays]
            assert sent[0] == sent[1]
            back = [r.from_server(REPLY if r.reader.quiet else REPLY) for r in relays]
            assert back[0] == back[1]
            assert state(relays[0].reader) == state(relays[1].reader)

    pages(4, chunk())
    assert relays[0].reader._repeat is not None
    for r in relays:
        if change == "reload":
            r.reader.classifier.set_functions(frozenset({"my_reader"}))
        elif change == "stale":
            r.reader.watch.stale = "a column was added"
        elif change == "discard":
            r.from_client(messages.message(b"Q", b"DISCARD ALL\x00"))
            r.from_server(messages.message(b"C", b"DISCARD ALL\x00") + messages.message(b"Z", b"I"))
        elif change == "close":
            r.from_client(messages.message(b"C", b"S\x00") + messages.message(b"S", b""))
            r.from_server(messages.message(b"3", b"") + messages.message(b"Z", b"I"))
    data = (chunk(RUNS) if change == "runs" else chunk(types=(25, 23, 23)) if change == "types"
            else chunk(PAGE.replace("LIMIT $3", "LIMIT 99")) if change == "same length" else chunk())
    if change != "stale":
        pages(3, data)
    else:  # refused by the seat: the same refusal from both, never the prepared statement
        sent = [r.from_client(data) for r in relays]
        assert sent[0] == sent[1] and b"openwop_seat_" not in sent[0]
        assert state(relays[0].reader) == state(relays[1].reader)
