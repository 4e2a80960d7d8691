"""The era-3 page (ADR 0024, proxy/readpath/fast_page.py) through a relay, sans-IO, byte for byte: which groups go as
their fast twin, what of the twin's answer reaches the client, when the page statement is sent again, and what the
client sent meanwhile."""

from __future__ import annotations

import struct

import pytest

from proxy.config import HostConfig
from proxy.readpath import fast_page
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import ReadPath
from proxy.serve.relay import Relay
from proxy.stats import Stats

PAGE = b"SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT 100"


def msg(t: bytes, body: bytes = b"") -> bytes:
    return t + struct.pack("!I", len(body) + 4) + body


def params(*values: bytes | None, formats: tuple[int, ...] = ()) -> bytes:
    out = struct.pack("!h", len(formats)) + b"".join(struct.pack("!h", f) for f in formats)
    out += struct.pack("!h", len(values))
    for v in values:
        out += struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v
    return out + b"\x00\x00"  # no result formats: text


LOGIN = msg(b"R", struct.pack("!I", 0)) + msg(b"K", struct.pack("!I", 4242) + b"key!") + msg(b"Z", b"I")
PARSE = msg(b"P", b"\x00" + PAGE + b"\x00\x00\x00")
EMPTY_PARSE = msg(b"P", b"\x00\x00\x00\x00")
DESCRIBE, EXECUTE, SYNC = msg(b"D", b"P\x00"), msg(b"E", b"\x00\x00\x00\x00\x00"), msg(b"S")
ROW_DESC = msg(b"T", b"\x00\x01sequence\x00" + struct.pack("!ihihih", 0, 0, 23, 4, -1, 0))
ROW = msg(b"D", struct.pack("!hi", 1, 1) + b"1")
DONE, EMPTY_DONE = msg(b"C", b"SELECT 1\x00"), msg(b"C", b"SELECT 0\x00")
READY, READY_IN_BLOCK = msg(b"Z", b"I"), msg(b"Z", b"T")
NOTICE = msg(b"N", b"SNOTICE\x00C00000\x00Mhello\x00\x00")
ERROR = msg(b"E", b"SERROR\x0057014\x00Mcanceling statement due to user request\x00\x00")
PARSE_DONE, BIND_DONE = msg(b"1"), msg(b"2")
ROWS_ANSWER = PARSE_DONE + BIND_DONE + ROW_DESC + ROW + DONE + READY
EMPTY_ANSWER = PARSE_DONE + BIND_DONE + ROW_DESC + EMPTY_DONE + READY


def page(run: bytes = b"run-1", after: bytes = b"0") -> bytes:
    return PARSE + msg(b"B", b"\x00\x00" + params(run, after)) + DESCRIBE + EXECUTE + SYNC


def bind(stmt: bytes, run: bytes = b"run-1", after: bytes = b"0") -> bytes:
    return msg(b"B", b"\x00" + stmt + b"\x00" + params(run, after))


def fallback(run: bytes = b"run-1", after: bytes = b"0") -> bytes:
    """What the read path sends for a page once its statement is prepared: the page statement."""
    return EMPTY_PARSE + bind(b"openwop_seat_1", run, after) + DESCRIBE + EXECUTE + SYNC


def twin_parse() -> bytes:
    fast = Classifier(HostConfig(), 2, run_function=True, page_function=True, fast_page=True).classify(
        PAGE.decode()).fast
    return msg(b"P", b"openwop_seat_1f\x00" + fast.encode() + b"\x00\x00\x00")


def fast(run: bytes = b"run-1", after: bytes = b"0", parse: bool = False) -> bytes:
    return (twin_parse() if parse else b"") + EMPTY_PARSE + bind(b"openwop_seat_1f", run, after) + DESCRIBE \
        + EXECUTE + SYNC


@pytest.fixture(autouse=True)
def no_hints():
    fast_page._missed.clear()
    yield
    fast_page._missed.clear()


def relay(fast_pages: bool = True) -> Relay:
    classifier = Classifier(HostConfig(), 2, run_function=True, page_function=True, fast_page=fast_pages)
    r = Relay(Stats(), reader=ReadPath(classifier, 2, None), count_answered=True)
    assert r.from_server(LOGIN)[0] == LOGIN
    return r


def prepared() -> Relay:
    """A relay whose page statement is prepared and trusted: the first page went whole."""
    r = relay()
    first = r.from_client(page())
    assert first[:1] == b"P" and b"openwop_seat_1\x00" in first  # prepared once, under the seat's name
    assert r.from_server(ROWS_ANSWER) == (ROWS_ANSWER, b"")
    assert list(r.reader.fast_twins) == [b"openwop_seat_1"]
    return r


def test_the_classifier_gives_a_page_its_fast_twin_and_nothing_else_one():
    c = Classifier(HostConfig(), 2, run_function=True, page_function=True, fast_page=True)
    plan = c.classify(PAGE.decode())
    assert plan.fast == ("SELECT * FROM openwop_seat.events_m2_run_era3($1) AS events WHERE (run_id = $1 AND "
                         "sequence > $2) AND (SELECT openwop_seat.events_named('events')) ORDER BY sequence LIMIT 100")
    assert plan.fast_key == 1
    assert c.classify("SELECT * FROM events WHERE sequence > $2 AND run_id = $1::text ORDER BY sequence "
                      "LIMIT $3").fast_key == 1
    assert c.classify("SELECT * FROM events WHERE run_id = 'r' AND sequence > $1 ORDER BY sequence LIMIT 5").fast_key \
        == 0
    for not_a_page in ("SELECT * FROM events WHERE run_id = $1",  # no ORDER BY, LIMIT: events_m2_run, no twin
                       "SELECT count(*) FROM (SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY "
                       "sequence LIMIT 5) p",  # a page inside another level
                       f"{PAGE.decode()}; SELECT 1",  # more than one statement
                       "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT 5 FOR SHARE"):
        assert c.classify(not_a_page).fast == "", not_a_page
    # a statement whose rewrite makes a statement of its own (a COPY of the table) has no page, and leaves none
    copy = Classifier(HostConfig(), 2, run_function=True, page_function=True, fast_page=True).classify(
        "COPY events (event_id, run_id, sequence, type, node_id, payload) TO stdout")  # pg_dump's, first
    assert copy.refused is None and copy.fast == ""
    assert c.classify(PAGE.decode().replace("100", "99")).fast_key == 1
    assert Classifier(HostConfig(), 2, run_function=True, page_function=True).classify(PAGE.decode()).fast == ""
    assert Classifier(HostConfig(), 1, run_function=True, page_function=True, fast_page=True).classify(
        PAGE.decode()).fast == ""


def test_a_page_goes_as_its_twin_and_its_rows_are_the_clients_past_the_twins_parse_complete():
    r = prepared()
    assert r.from_client(page()) == fast(parse=True)
    assert r.deferred and not r.server_at_boundary
    answer = PARSE_DONE + ROWS_ANSWER  # the twin's ParseComplete first
    assert r.from_server(answer) == (ROWS_ANSWER, b"")
    assert not r.deferred and r.server_at_boundary
    assert r.reader.fast_twins[b"openwop_seat_1"][0] == fast_page.PREPARED
    assert r.stats.fast_pages == {"rows": 1}
    # the next page names the prepared twin, without its Parse
    assert r.from_client(page(b"run-2")) == fast(b"run-2")
    assert r.from_server(ROWS_ANSWER) == (ROWS_ANSWER, b"")
    assert r.readies == 4 and r.reader.quiet_sent == []


def test_an_empty_answer_is_dropped_and_the_page_statement_sent_in_its_place():
    r = prepared()
    assert r.from_client(page()) == fast(parse=True)
    assert r.from_server(PARSE_DONE + EMPTY_ANSWER) == (b"", fallback())
    assert r.readies == 2  # the twin's ReadyForQuery is not the client's
    assert r.from_server(ROWS_ANSWER) == (ROWS_ANSWER, b"")
    assert r.readies == 3 and r.stats.fast_pages == {"empty": 1}
    # the run missed: its next pages go as the page statement; another run's as its twin
    assert r.from_client(page(b"run-1", b"7")) == fallback(b"run-1", b"7")
    assert r.from_server(EMPTY_ANSWER) == (EMPTY_ANSWER, b"")
    assert r.from_client(page(b"run-2")) == fast(b"run-2")


def test_a_miss_is_remembered_for_a_while_per_run_as_bound():
    r = prepared()
    r.from_client(page(b"r"))
    r.from_server(PARSE_DONE + EMPTY_ANSWER)
    r.from_server(EMPTY_ANSWER)
    (key,) = fast_page._missed
    assert key[1:] == (0, b"r")
    fast_page._missed[key] = 0.0  # its time is up
    assert r.from_client(page(b"r")) == fast(b"r")
    assert not fast_page._missed  # forgotten as it was read
    r.from_server(ROWS_ANSWER)
    assert r.stats.fast_pages == {"empty": 1, "rows": 1}


def test_an_error_is_the_clients_as_it_came():
    r = prepared()
    r.from_client(page())
    answer = PARSE_DONE + BIND_DONE + ROW_DESC + ERROR + READY
    assert r.from_server(PARSE_DONE + answer) == (answer, b"")
    assert r.stats.fast_pages == {"error": 1} and r.reader.fast_twins[b"openwop_seat_1"][0] == fast_page.PREPARED
    assert not fast_page._missed


def test_a_twin_whose_parse_fails_is_not_used_again_and_the_page_statement_goes():
    r = prepared()
    r.from_client(page())
    failed = msg(b"E", b"SERROR\x00C42883\x00Mfunction openwop_seat.events_m2_run_era3 does not exist\x00\x00")
    assert r.from_server(failed + READY) == (b"", fallback())
    assert r.from_server(ROWS_ANSWER) == (ROWS_ANSWER, b"")
    assert r.reader.fast_twins[b"openwop_seat_1"][0] == fast_page.BROKEN
    assert r.stats.fast_pages == {"unprepared": 1}
    assert r.from_client(page(b"run-2")) == fallback(b"run-2")


def test_asynchronous_messages_of_an_empty_answer_reach_the_client_the_rest_does_not():
    r = prepared()
    r.from_client(page())
    notification = msg(b"A", struct.pack("!i", 77) + b"chan\x00hi\x00")
    answer = PARSE_DONE + NOTICE + BIND_DONE + ROW_DESC + EMPTY_DONE + notification + READY
    assert r.from_server(answer) == (NOTICE + notification, fallback())


@pytest.mark.parametrize("kind", ["rows", "empty"])
def test_an_answer_in_pieces_settles_the_same(kind):
    answer = PARSE_DONE + (ROWS_ANSWER if kind == "rows" else EMPTY_ANSWER)
    for cut in range(1, len(answer)):
        fast_page._missed.clear()
        r = prepared()
        r.from_client(page())
        first = r.from_server(answer[:cut])
        second = r.from_server(answer[cut:])
        got = (first[0] + second[0], first[1] + second[1])
        assert got == ((ROWS_ANSWER, b"") if kind == "rows" else (b"", fallback())), cut


@pytest.mark.parametrize("kind", ["rows", "empty", "error"])
def test_what_the_client_sends_meanwhile_waits_and_goes_after_the_page(kind):
    r = prepared()
    r.from_client(page())
    later = msg(b"Q", b"SELECT 1\x00")
    assert r.from_client(later) == b"" and r.fast_held == len(later)
    answers = {"rows": ROWS_ANSWER, "empty": EMPTY_ANSWER,
               "error": PARSE_DONE + BIND_DONE + ROW_DESC + ERROR + READY}
    to_client, to_server = r.from_server(PARSE_DONE + answers[kind])
    assert to_server == (fallback() + later if kind == "empty" else later)
    assert r.fast_held == 0 and not r.deferred


def test_a_page_sent_while_the_last_one_is_owed_goes_as_it_is():
    r = prepared()
    assert r.from_client(page()) == fast(parse=True)
    second = page(b"run-2")
    assert r.from_client(second) == b""  # held, not sent, until the first is settled
    # settled as empty: its page statement goes, then the held page, as the page statement (something is owed)
    to_client, to_server = r.from_server(PARSE_DONE + EMPTY_ANSWER)
    assert to_server == fallback() + fallback(b"run-2")


@pytest.mark.parametrize("group", [
    page() + page(b"run-2"),  # two pages in one chunk
    PARSE + msg(b"B", b"p1\x00\x00" + params(b"run-1", b"0")) + msg(b"D", b"Pp1\x00")
    + msg(b"E", b"p1\x00\x00\x00\x00\x00") + SYNC,  # a named portal
    PARSE + msg(b"B", b"\x00\x00" + params(b"run-1", b"0")) + DESCRIBE + msg(b"E", b"\x00\x00\x00\x00\x05") + SYNC,
    PARSE + msg(b"B", b"\x00\x00" + params(b"run-1", b"0")) + DESCRIBE + EXECUTE + msg(b"H") + SYNC,  # a Flush
    PARSE + msg(b"B", b"\x00\x00" + params(b"run-1", b"0")) + DESCRIBE + EXECUTE,  # no Sync yet
    PARSE + msg(b"B", b"\x00\x00" + params()) + DESCRIBE + EXECUTE + SYNC,  # no run: the server's error to give
], ids=["two pages", "named portal", "some rows", "flush", "no sync", "no parameters"])
def test_a_group_that_is_not_one_page_alone_goes_as_it_is(group):
    r = prepared()
    out = r.from_client(group)
    assert b"openwop_seat_1f" not in out and not r.deferred


def test_no_fast_page_in_a_failed_transaction_or_without_the_twin_function():
    r = prepared()
    r.from_client(msg(b"Q", b"SELECT 1/0\x00"))
    r.from_server(ERROR + msg(b"Z", b"E"))
    assert b"openwop_seat_1f" not in r.from_client(page())
    plain = relay(fast_pages=False)
    plain.from_client(page())
    plain.from_server(ROWS_ANSWER)
    assert plain.reader.fast_twins is None and plain.from_client(page()) == fallback()


def test_a_page_in_a_transaction_block_goes_as_its_twin_and_again_in_the_block():
    r = prepared()
    r.from_client(msg(b"Q", b"BEGIN\x00"))
    r.from_server(msg(b"C", b"BEGIN\x00") + READY_IN_BLOCK)
    assert r.from_client(page()) == fast(parse=True)
    empty = PARSE_DONE + BIND_DONE + ROW_DESC + EMPTY_DONE + READY_IN_BLOCK
    assert r.from_server(PARSE_DONE + empty) == (b"", fallback())
    assert r.reader.tx_status == b"T"


def test_discard_forgets_the_twins_with_the_statements():
    r = prepared()
    r.from_client(msg(b"Q", b"DISCARD ALL\x00"))
    r.from_server(msg(b"C", b"DISCARD ALL\x00") + READY)
    assert r.reader.fast_twins is None
    out = r.from_client(page())
    assert b"openwop_seat_1f" not in out and b"P\x00" in out


def test_the_bind_keys_its_run_by_format_and_bytes():
    body = b"\x00stmt\x00" + params(b"a", b"bb", formats=(0, 1))
    assert fast_page._run_parameter(body, 6, 2) == (1, b"bb")
    assert fast_page._run_parameter(body, 6, 1) == (0, b"a")
    assert fast_page._run_parameter(body, 6, 3) is None
    assert fast_page._run_parameter(b"\x00stmt\x00" + params(None), 6, 1) == (0, None)
    assert fast_page._run_parameter(body, 6, 0) == ()


def test_a_session_reading_era2_runs_stops_looking_for_a_while_and_then_tries_again():
    r = prepared()
    for n in range(fast_page.COOL_AFTER):  # each run misses once
        run = b"era2-%d" % n
        assert r.from_client(page(run)) == fast(run, parse=n == 0)
        assert r.from_server((PARSE_DONE if n == 0 else b"") + EMPTY_ANSWER) == (b"", fallback(run))
        r.from_server(ROWS_ANSWER)
    for n in range(fast_page.COOL_GROUPS):  # then not even a new run is tried
        assert r.from_client(page(b"other-%d" % n)) == fallback(b"other-%d" % n)
        r.from_server(ROWS_ANSWER)
    assert r.from_client(page(b"era3")) == fast(b"era3")  # and then again
    assert r.from_server(ROWS_ANSWER) == (ROWS_ANSWER, b"")


def test_a_hit_starts_the_count_of_misses_again():
    r = prepared()
    for n in range(3 * fast_page.COOL_AFTER):
        run = b"run-%d" % n
        assert r.from_client(page(run)) == fast(run, parse=n == 0)
        if n % fast_page.COOL_AFTER == fast_page.COOL_AFTER - 1:
            r.from_server((PARSE_DONE if n == 0 else b"") + ROWS_ANSWER)
        else:
            r.from_server((PARSE_DONE if n == 0 else b"") + EMPTY_ANSWER)
            r.from_server(ROWS_ANSWER)


def test_a_malformed_message_in_an_unsettled_answer_ends_the_session_as_anywhere_else():
    r = prepared()
    r.from_client(page())
    to_client, to_server = r.from_server(PARSE_DONE + BIND_DONE + b"T\x00\x00\x00\x02")  # a length under 4
    assert to_server == b"" and r.ending is not None and r.ending.sqlstate == "08P01"
    assert ROW_DESC not in to_client  # nothing of the twin's answer past the fault was made up
