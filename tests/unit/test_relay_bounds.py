"""The relay's bounds (issue 23, item 6): what it owes is counted, and a large chunk is framed in slices with the
same result as whole."""

from __future__ import annotations

import pytest
from test_relay import LOGIN, READY, RESULT, msg, row, server, status

from proxy.config import HostConfig
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import POISON_SQL, ReadPath
from proxy.serve.relay import QUIET_SLICE, SLICE, Relay
from proxy.stats import Stats

# each test runs once per framer implementation (ADR 0018; tests/unit/conftest.py)
pytestmark = pytest.mark.usefixtures("each_framer")


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


def analyse(r: Relay) -> bytes:
    """What the session does while the relay waits for an analysis: the worker's part, done here in line."""
    out = b""
    while r.analysis is not None:
        classifier = r.reader.classifier
        plan, generation = classifier.analyse(r.analysis)
        classifier.analysed(r.analysis, plan, generation)
        out += r.analysed()
    return out


def feed(r: Relay, data: bytes) -> bytes:
    out = r.from_client(data)
    return out + analyse(r)


def test_a_sliced_chunk_comes_out_as_it_went_in_with_messages_across_slices():
    r = relay(True)
    parse = msg(b"P", b"\0SELECT 'x' || type FROM events WHERE run_id = $1" + b" " * 70_000 + b"\0\0\0")
    data = (msg(b"S") * 7001 + parse + msg(b"B", b"\0\0\0\0\0\0\0") + msg(b"S")) * 3
    out = feed(r, data)
    assert r.ending is None and len(data) > 4 * SLICE
    small = relay(True)  # the same bytes in pieces smaller than a slice
    assert out == b"".join(feed(small, data[i:i + 1000]) for i in range(0, len(data), 1000))
    assert out.count(b"openwop_seat.events_m2") == 3
    answers = (READY * 7001 + msg(b"1") + msg(b"2") + READY) * 3
    assert r.from_server(answers) == (answers, b"")
    assert r.owed == 0


def test_a_long_statement_waits_for_its_analysis_with_what_follows_it():
    r = relay(True)
    long_query = msg(b"Q", b"SELECT type FROM events WHERE run_id <> '" + b"z" * 20_000 + b"'\0")
    before = msg(b"Q", b"SELECT 1\0")
    after = msg(b"Q", b"SELECT 2\0") + msg(b"X")
    out = r.from_client(before + long_query + after[:7])
    assert out == before and r.analysis is not None and r.deferred  # nothing after the long statement yet
    assert r.from_client(after[7:]) == b""  # what comes meanwhile waits too, in order
    c = r.reader.classifier
    misses = c.misses
    plan, generation = c.analyse(r.analysis)
    assert c.misses == misses  # analysed on a copy, off the loop: the cache is the loop's
    c.analysed(r.analysis, plan, generation)
    rest = r.analysed()
    assert rest.startswith(b"Q") and b"openwop_seat.events_m2" in rest and rest.endswith(after)
    assert r.analysis is None and not r.deferred and c.misses == misses + 1
    assert r.from_client(before) == before  # planned now: a repeat is not analysed again
    assert r.from_client(long_query).startswith(b"Q") and r.analysis is None


def test_a_plan_analysed_before_the_functions_changed_is_not_used():
    r = relay(True)
    long_query = msg(b"Q", b"SELECT my_fn(type) FROM events WHERE run_id <> '" + b"z" * 20_000 + b"'\0")
    r.from_client(long_query)
    c = r.reader.classifier
    plan, generation = c.analyse(r.analysis)
    assert plan.refused is None
    c.set_functions({"my_fn"})  # the catalog check found a risky function meanwhile
    c.analysed(r.analysis, plan, generation)
    assert r.analysed() == b"" and r.analysis is not None  # analysed again, with the new functions…
    out = analyse(r)
    # …and refused: idle outside a transaction block, an empty Query stands in for it (read_path.py)
    assert out == msg(b"Q", b"\0") and b"my_fn" not in out and POISON_SQL.encode() not in out


# ------------------------------------------------------------------ client_encoding reported by the server

@pytest.mark.parametrize("how", ["whole", "bytes", "7"])
@pytest.mark.parametrize("enc", ["SJIS", "BIG5", "GBK", "GB18030", "JOHAB", "UHC"])
def test_a_reported_client_only_encoding_ends_a_translated_session_before_anything_after_it(how, enc):
    r = relay(True)
    before = msg(b"C", b"SELECT 1\x00")
    to_client, _ = server(r, before + status("client_encoding", enc) + READY + RESULT, how)
    assert to_client == before  # what came before the report goes out; the report and what follows do not
    assert r.ending.sqlstate == "OW009" and r.ending.kind == "client_encoding_refused" and enc in r.ending.message


def test_a_reported_client_only_encoding_at_login_ends_the_session():
    r = Relay(Stats(), reader=ReadPath(Classifier(HostConfig(), 2), 2, None), count_answered=True)
    to_client, _ = r.from_server(LOGIN.replace(READY, status("client_encoding", "SJIS") + READY))
    assert r.ending.sqlstate == "OW009" and b"client_encoding" not in to_client


@pytest.mark.parametrize("enc", ["UTF8", "LATIN1", "EUC_JP", "SQL_ASCII"])
def test_a_reported_server_encoding_goes_through(enc):
    r = relay(True)
    stream = status("client_encoding", enc) + READY
    assert r.from_server(stream) == (stream, b"") and r.ending is None


def test_raw_sessions_are_not_checked():
    r = relay(False)
    stream = status("client_encoding", "SJIS") + READY
    assert r.from_server(stream) == (stream, b"") and r.ending is None


def page_answer(rows: int, width: int) -> bytes:
    """A page's answer as the server sends it after Parse/Bind/Describe/Execute/Sync of a quiet group."""
    return (msg(b"1") + msg(b"2") + msg(b"T", b"\x00\x01c\x00" + bytes(18))
            + b"".join(row(b"x" * width) for _ in range(rows)) + msg(b"C", b"SELECT %d\x00" % rows) + READY)


def test_a_quiet_servers_page_up_to_quiet_slice_goes_on_as_the_chunk_itself():
    """A quiet read path shows only a few kinds of message: a page's answer (about 40 KB for 100 rows) is framed whole
    and goes on as the very chunk received, not copied into slices and joined again."""
    r = relay(True)
    r.from_client(msg(b"P", b"\0SELECT 1\0\0\0") + msg(b"B", b"\0\0\0\0\0\0\0") + msg(b"D", b"P\0")
                  + msg(b"E", b"\0\0\0\0\0") + msg(b"S"))
    assert r.reader.quiet and r.reader.active == 0
    answer = page_answer(100, 400)
    assert SLICE < len(answer) <= QUIET_SLICE
    to_client, to_server = r.from_server(answer)
    assert to_client is answer and to_server == b""
    assert r.owed == 0 and r.ending is None


def test_a_quiet_chunk_over_quiet_slice_and_a_flood_of_answers_are_still_framed_in_slices():
    """Past QUIET_SLICE a quiet chunk is framed a slice at a time as before (the objects of a flood of small shown
    messages bounded), with the same bytes out as framed whole."""
    for answers, groups in ((page_answer(300, 400), 1), (READY * 40_000, 40_000)):
        assert len(answers) > QUIET_SLICE
        r, whole = relay(True), relay(True)
        for each in (r, whole):
            each.from_client((msg(b"P", b"\0SELECT 1\0\0\0") + msg(b"B", b"\0\0\0\0\0\0\0")
                              + msg(b"E", b"\0\0\0\0\0") + msg(b"S")) if groups == 1 else msg(b"S") * groups)
        out = r.from_server(answers)[0]
        pieces = b"".join(whole.from_server(answers[i:i + 1000])[0] for i in range(0, len(answers), 1000))
        assert out == pieces == answers and r.owed == whole.owed == 0
