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


def twin_parse(name: bytes = b"openwop_seat_1f") -> bytes:
    fast = Classifier(HostConfig(), 2, run_function=True, page_function=True, fast_page=True).classify(
        PAGE.decode()).fast
    return msg(b"P", name + b"\x00" + fast.encode() + b"\x00\x00\x00")


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


# ---------------------------------------------------------------- a client's named statements (asyncpg's)

def named_parse(name: bytes = b"s1", sql: bytes = PAGE) -> bytes:
    return msg(b"P", name + b"\x00" + sql + b"\x00\x00\x00")


def prepare(name: bytes = b"s1", sql: bytes = PAGE) -> bytes:
    """What asyncpg sends to prepare a statement: Parse, Describe of the statement, Sync."""
    return named_parse(name, sql) + msg(b"D", b"S" + name + b"\x00") + SYNC


def named_page(name: bytes = b"s1", run: bytes = b"run-1", after: bytes = b"0") -> bytes:
    """What asyncpg sends for a page of its prepared statement: Bind of the unnamed portal, Execute, Sync."""
    return bind(name, run, after) + EXECUTE + SYNC


def close(name: bytes) -> bytes:
    return msg(b"C", b"S" + name + b"\x00")


def named_fast(twin: bytes = b"openwop_seat_1f", run: bytes = b"run-1", parse: bool = False,
               closes: tuple[bytes, ...] = ()) -> bytes:
    return b"".join(close(c) for c in closes) + (twin_parse(twin) if parse else b"") + bind(twin, run) + EXECUTE \
        + SYNC


PREPARED_ANSWER = PARSE_DONE + msg(b"t", b"\x00\x02\x00\x00\x00\x19\x00\x00\x00\x14") + ROW_DESC + READY
NAMED_ROWS = BIND_DONE + ROW + DONE + READY  # no Describe: asyncpg knows the statement's columns
NAMED_EMPTY = BIND_DONE + EMPTY_DONE + READY
CLOSE_DONE = msg(b"3")


def prepared_named(r: Relay | None = None, name: bytes = b"s1", sql: bytes = PAGE) -> Relay:
    r = r or relay()
    out = r.from_client(prepare(name, sql))
    assert out.startswith(b"P") and out[5:5 + len(name) + 1] == name + b"\x00"  # under the client's name
    assert r.from_server(PREPARED_ANSWER) == (PREPARED_ANSWER, b"")
    return r


def test_a_named_page_goes_as_its_twin_once_its_statement_is_trusted():
    r = relay()
    r.from_client(prepare())
    assert r.reader.fast_twins is None  # not before the statement's group is answered without an error
    r.from_server(PREPARED_ANSWER)
    assert list(r.reader.fast_twins) == [b"s1"]
    assert r.from_client(named_page()) == named_fast(parse=True)
    assert r.from_server(PARSE_DONE + NAMED_ROWS) == (NAMED_ROWS, b"")
    assert r.from_client(named_page(run=b"run-2")) == named_fast(run=b"run-2")
    assert r.from_server(NAMED_ROWS) == (NAMED_ROWS, b"")
    assert r.stats.fast_pages == {"rows": 2} and r.reader.quiet_sent == []


def test_a_named_pages_miss_binds_the_clients_statement_again():
    r = prepared_named()
    r.from_client(named_page())
    assert r.from_server(PARSE_DONE + NAMED_EMPTY) == (b"", named_page())
    assert r.from_server(NAMED_EMPTY) == (NAMED_EMPTY, b"")
    assert r.reader.fast_twins[b"s1"][0] == fast_page.PREPARED


def test_a_closed_statements_twin_is_closed_ahead_of_the_next_fast_page_and_its_answer_kept_from_the_client():
    r = prepared_named()
    r.from_client(named_page())
    r.from_server(PARSE_DONE + NAMED_ROWS)
    assert r.from_client(close(b"s1") + SYNC) == close(b"s1") + SYNC  # the client's Close goes as it came
    assert r.from_server(CLOSE_DONE + READY) == (CLOSE_DONE + READY, b"")
    assert not r.reader.fast_twins and r.reader.twins_closing == [b"openwop_seat_1f"]
    assert r.from_client(named_page()) == named_page()  # no twin names s1 any more
    r.from_server(NAMED_ROWS)
    prepared_named(r, b"s2")
    assert r.from_client(named_page(b"s2")) == named_fast(b"openwop_seat_2f", parse=True, closes=(b"openwop_seat_1f",))
    assert r.reader.twins_closing == ()
    assert r.from_server(CLOSE_DONE + PARSE_DONE + NAMED_ROWS) == (NAMED_ROWS, b"")
    assert r.reader.fast_twins[b"s2"][0] == fast_page.PREPARED


def test_a_twin_never_prepared_on_the_server_is_not_closed():
    r = prepared_named()
    r.from_client(close(b"s1") + SYNC)
    r.from_server(CLOSE_DONE + READY)
    assert not r.reader.fast_twins and not r.reader.twins_closing


@pytest.mark.parametrize("sql", [b"SELECT 1", PAGE], ids=["another statement", "the same page"])
def test_a_statement_parsed_again_under_its_name_loses_its_twin(sql):
    r = prepared_named()
    r.from_client(named_page())
    r.from_server(PARSE_DONE + NAMED_ROWS)
    # PostgreSQL refuses a Parse under a name in use; the seat drops the twin either way
    r.from_client(close(b"s1") + named_parse(b"s1", sql) + SYNC)
    assert b"s1" not in (r.reader.fast_twins or {}) and r.reader.twins_closing == [b"openwop_seat_1f"]
    r.from_server(CLOSE_DONE + PARSE_DONE + READY)
    if sql == PAGE:  # a page again: a new twin, under a new name, once trusted
        assert r.from_client(named_page()) == named_fast(b"openwop_seat_2f", parse=True, closes=(b"openwop_seat_1f",))
    else:
        assert r.from_client(named_page()) == named_page()


def test_a_named_page_whose_group_fails_gets_no_twin():
    r = relay()
    r.from_client(prepare())
    exists = msg(b"E", b"SERROR\x00C42P05\x00Mprepared statement \"s1\" already exists\x00\x00")
    r.from_server(exists + READY)
    assert not r.reader.fast_twins
    assert r.from_client(named_page()) == named_page()


def test_a_named_page_closed_in_the_group_that_prepares_it_gets_no_twin():
    r = relay()
    r.from_client(named_parse() + close(b"s1") + SYNC)
    r.from_server(PARSE_DONE + CLOSE_DONE + READY)
    assert not r.reader.fast_twins and not r.reader.preparing


def test_deallocate_closes_the_twins_it_forgets():
    r = prepared_named()
    r.from_client(named_page())
    r.from_server(PARSE_DONE + NAMED_ROWS)
    r.from_client(msg(b"Q", b"DEALLOCATE s9\x00"))  # another name: the seat forgets all its own all the same
    r.from_server(msg(b"C", b"DEALLOCATE\x00") + READY)
    assert r.reader.fast_twins is None and r.reader.twins_closing == [b"openwop_seat_1f"]


def test_a_parse_through_the_fifo_drops_the_twin_of_its_name():
    r = prepared_named()
    r.from_client(named_page())
    r.from_server(PARSE_DONE + NAMED_ROWS)
    call = msg(b"F", struct.pack("!IhhhIh", 1, 0, 0, 0, 0, 0)[:14])  # a FunctionCall: the read path's FIFO from here
    r.from_client(call + close(b"s1") + named_parse(b"s1", b"SELECT 2") + SYNC)
    assert not r.reader.fast_twins and r.reader.twins_closing == [b"openwop_seat_1f"]


def test_asynchronous_messages_among_the_seats_own_answers_reach_the_client():
    r = prepared_named()
    r.from_client(named_page())
    r.from_server(PARSE_DONE + NAMED_ROWS)
    r.reader.twins_closing = [b"old1", b"old2"]
    assert r.from_client(named_page()) == named_fast(closes=(b"old1", b"old2"))
    answer = CLOSE_DONE + NOTICE + CLOSE_DONE + NAMED_ROWS
    for cut in range(1, len(answer)):
        if cut > 1:
            r.reader.twins_closing = [b"old1", b"old2"]
            r.from_client(named_page())
        first = r.from_server(answer[:cut])
        second = r.from_server(answer[cut:])
        assert (first[0] + second[0], first[1] + second[1]) == (NOTICE + NAMED_ROWS, b""), cut


def test_a_failed_close_ahead_of_a_fast_page_sends_the_page_statement():
    r = prepared_named()
    r.reader.twins_closing = [b"old1"]
    assert r.from_client(named_page()) == named_fast(parse=True, closes=(b"old1",))
    failed = msg(b"E", b"SERROR\x00CXX000\x00Mno\x00\x00")
    assert r.from_server(failed + READY) == (b"", named_page())
    assert r.from_server(NAMED_ROWS) == (NAMED_ROWS, b"")
    assert r.reader.fast_twins[b"s1"][0] == fast_page.BROKEN and r.stats.fast_pages == {"unprepared": 1}


def test_no_new_named_twin_while_too_many_wait_to_be_closed():
    from proxy.readpath.read_path import MAX_CLOSING
    r = relay()
    r.reader.twins_closing = [b"x%d" % n for n in range(MAX_CLOSING)]
    prepared_named(r)
    assert not r.reader.fast_twins


def test_a_notification_ahead_of_the_twins_parse_complete_reaches_the_client_and_the_parse_complete_does_not():
    """PostgreSQL may send a notification while it waits for the rest of a group (its Parse read, the group's next
    message not yet): it comes before the twin's ParseComplete, which is still the seat's own."""
    r = prepared()
    r.from_client(page())
    notification = msg(b"A", struct.pack("!i", 77) + b"chan\x00hi\x00")
    assert r.from_server(notification + PARSE_DONE + ROWS_ANSWER) == (notification + ROWS_ANSWER, b"")
    assert r.reader.fast_twins[b"openwop_seat_1"][0] == fast_page.PREPARED
