"""Sans-IO tests of the read path (proxy.readpath.read_path.ReadPath): statement rewriting, plan once per session,
refusals.

No sockets and no server: client messages are handed to the read path as the session hands them, one by
one, and the server's answers the read path is shown are written by hand as PostgreSQL sends them.
"""

from __future__ import annotations

import struct

import pytest

from proxy.config import HostConfig
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import MAX_PREPARED, POISON_SQL, EventColumns, ReadPath, ReadPathError
from proxy.wire.codec import ProtocolViolation
from proxy.wire.framer import HOLD_ALL, Framer

# each test runs once per framer implementation (ADR 0018; tests/unit/conftest.py)
pytestmark = pytest.mark.usefixtures("each_framer")

EVENTS_OID = 0x61626364
TYPE_ATTNUM, PAYLOAD_ATTNUM = 4, 6
VIEW_OID = 0x00BEEF01  # a view over events.type, learned at start
EVENTS = EventColumns(EVENTS_OID, TYPE_ATTNUM, derived_oids=frozenset({VIEW_OID}), payload_attnum=PAYLOAD_ATTNUM)
OTHER_OID = 0x00010203

PAGE = "SELECT * FROM events WHERE run_id = $1 ORDER BY sequence LIMIT 100"
REFUSED = "SELECT * FROM events TABLESAMPLE SYSTEM (1)"


def new_read_path(major: int = 2) -> ReadPath:
    return ReadPath(Classifier(HostConfig(), major), major, EVENTS)


def parse(name: str, sql: str, types: tuple[int, ...] = ()) -> bytes:
    return (name.encode() + b"\x00" + sql.encode() + b"\x00" + struct.pack("!h", len(types))
            + b"".join(struct.pack("!I", t) for t in types))


def bind(portal: str = "", stmt: str = "", params: tuple[bytes, ...] = (b"r1",)) -> bytes:
    body = portal.encode() + b"\x00" + stmt.encode() + b"\x00" + struct.pack("!h", 0) + struct.pack("!h", len(params))
    for p in params:
        body += struct.pack("!i", len(p)) + p
    return body + struct.pack("!h", 0)


def iter_messages(data: bytes) -> list[tuple[int, bytes]]:
    """The (type, body) of each whole message in ``data``."""
    return [(t, body) for _, t, body in Framer(HOLD_ALL).feed(data)]


def decoded(msg: bytes | None) -> tuple[int, bytes] | None:
    if msg is None:
        return None
    ((t, body),) = list(iter_messages(msg))
    return t, body


def error(code: str = "42P01", text: str = "boom") -> bytes:
    return b"S" + b"ERROR\x00" + b"C" + code.encode() + b"\x00" + b"M" + text.encode() + b"\x00\x00"


def row_description(*fields: tuple[int, int]) -> bytes:
    body = struct.pack("!h", len(fields))
    for i, (oid, attnum) in enumerate(fields):
        body += f"c{i}".encode() + b"\x00" + struct.pack("!IhIhih", oid, attnum, 25, -1, -1, 0)
    return body


def extended(rp: ReadPath, sql: str, name: str = "", types: tuple[int, ...] = ()) -> list:
    """Parse/Bind/Describe/Execute/Sync of one statement: what each message became (None: sent as is)."""
    out = [rp.on_client(ord("P"), parse(name, sql, types)), rp.on_client(ord("B"), bind(stmt=name)),
           rp.on_client(ord("D"), b"S" + name.encode() + b"\x00"), rp.on_client(ord("E"), b"\x00\x00\x00\x00\x00"),
           rp.on_client(ord("S"), b"")]
    return [decoded(m) for m in out]


def ready(rp: ReadPath) -> None:
    rp.on_server_quiet(ord("Z"), b"I")


# ---------------------------------------------------------------- rewriting


def test_a_named_translated_parse_is_sent_with_the_rewritten_text_and_the_path_stays_quiet():
    rp = new_read_path()
    p, b, d, e, s = extended(rp, PAGE, name="page")
    assert p[0] == ord("P") and b"openwop_seat.events_m2 AS events" in p[1] and p[1].startswith(b"page\x00")
    assert b is d is e is s is None  # the rest goes as the client sent it
    assert rp.quiet and not rp.prepared and not rp.preparing


def test_a_statement_that_reads_no_event_rows_is_sent_as_is():
    rp = new_read_path()
    assert extended(rp, "SELECT * FROM runs WHERE run_id = $1") == [None] * 5
    assert rp.on_client(ord("Q"), b"DELETE FROM runs WHERE run_id = '1'\x00") is None


def test_a_simple_query_is_rewritten_in_place():
    rp = new_read_path(1)
    t, body = decoded(rp.on_client(ord("Q"), PAGE.encode() + b"\x00"))
    assert t == ord("Q") and b"openwop_seat.events_m1" in body and rp.quiet


# ---------------------------------------------------------------- plan once per session


def test_an_unnamed_translated_parse_is_prepared_once_and_reused():
    rp = new_read_path()
    p, b, d, _, _ = extended(rp, PAGE)
    assert p[1].startswith(b"openwop_seat_1\x00") and b"events_m2" in p[1]
    assert b[1].startswith(b"\x00openwop_seat_1\x00")  # the Bind names the prepared statement
    assert d == (ord("D"), b"Sopenwop_seat_1\x00")
    assert not rp.prepared  # not trusted before its group's ReadyForQuery
    ready(rp)
    assert list(rp.prepared.values()) == ["openwop_seat_1"]
    p, b, d, _, _ = extended(rp, PAGE)
    assert p == (ord("P"), b"\x00\x00\x00\x00")  # an empty unnamed statement: the client still gets ParseComplete
    assert b[1].startswith(b"\x00openwop_seat_1\x00") and d == (ord("D"), b"Sopenwop_seat_1\x00")


def test_an_error_in_the_group_means_the_name_is_never_trusted():
    rp = new_read_path()
    extended(rp, PAGE)
    rp.on_server_quiet(ord("E"), error())
    ready(rp)
    assert not rp.prepared
    p = extended(rp, PAGE)[0]
    assert p[1].startswith(b"openwop_seat_2\x00")  # a new name, never the one the server may not hold


def test_an_error_in_an_earlier_group_does_not_taint_a_later_one():
    rp = new_read_path()
    extended(rp, "SELECT 1")  # group 1
    extended(rp, PAGE)  # group 2
    rp.on_server_quiet(ord("E"), error())  # group 1 failed
    ready(rp)
    assert not rp.prepared
    ready(rp)  # group 2 ends without an error
    assert list(rp.prepared.values()) == ["openwop_seat_1"]


def test_parameter_types_are_part_of_the_key():
    rp = new_read_path()
    extended(rp, PAGE)
    ready(rp)
    p = extended(rp, PAGE, types=(25,))[0]
    assert p[1].startswith(b"openwop_seat_2\x00")


@pytest.mark.parametrize("forget", [b"DISCARD ALL\x00", b"DEALLOCATE ALL\x00"])
def test_discard_and_deallocate_forget_the_prepared_statements(forget):
    rp = new_read_path()
    extended(rp, PAGE)
    ready(rp)
    assert rp.prepared
    rp.on_client(ord("Q"), forget)
    assert not rp.prepared and rp.unnamed is None


def test_a_query_or_a_close_of_the_unnamed_statement_ends_the_substitution():
    rp = new_read_path()
    extended(rp, PAGE)
    ready(rp)
    rp.on_client(ord("Q"), b"SELECT 1\x00")
    assert rp.on_client(ord("B"), bind()) is None
    rp.on_client(ord("P"), parse("", PAGE))
    rp.on_client(ord("C"), b"S\x00")
    assert rp.on_client(ord("B"), bind()) is None
    assert rp.on_client(ord("D"), b"S\x00") is None


def test_an_unnamed_parse_while_a_refusal_is_in_flight_ends_the_substitution():
    """The FIFO is in use (a refused statement's answer is owed): a translated unnamed Parse then goes unnamed,
    and a later Bind of the unnamed statement must not be sent to the prepared one."""
    rp = new_read_path()
    extended(rp, PAGE)
    ready(rp)
    rp.on_client(ord("P"), parse("", REFUSED))  # the FIFO takes over
    rp.on_client(ord("S"), b"")
    p = decoded(rp.on_client(ord("P"), parse("", PAGE)))
    assert p[1].startswith(b"\x00SELECT") and rp.unnamed is None
    rp.on_server(ord("E"), error())
    rp.on_server(ord("Z"), b"I")
    rp.on_server(ord("1"), b"")
    assert rp.on_client(ord("B"), bind()) is None


def test_a_later_unnamed_parse_of_another_statement_ends_the_substitution():
    rp = new_read_path()
    extended(rp, PAGE)
    assert extended(rp, "SELECT * FROM runs") == [None] * 5


def test_the_session_keeps_at_most_max_prepared_statements():
    rp = new_read_path()
    for i in range(MAX_PREPARED + 3):
        extended(rp, f"SELECT * FROM events WHERE run_id = '{i}'")
        ready(rp)
    assert len(rp.prepared) == MAX_PREPARED
    p, b, _, _, _ = extended(rp, "SELECT * FROM events WHERE run_id = 'one more'")
    assert p[1].startswith(b"\x00SELECT") and b is None  # sent unnamed, as the client asked


# ---------------------------------------------------------------- refusals


def in_a_block(rp):
    """The server said the session is in a transaction block (a refusal must fail it: the poison)."""
    assert rp.on_server_quiet(ord("Z"), b"T") is None
    return rp


def test_a_refused_parse_is_poisoned_and_its_error_swapped():
    rp = in_a_block(new_read_path())
    p = decoded(rp.on_client(ord("P"), parse("", REFUSED)))
    assert p == (ord("P"), b"\x00" + POISON_SQL.encode() + b"\x00\x00\x00")
    rp.on_client(ord("B"), bind())
    rp.on_client(ord("E"), b"\x00\x00\x00\x00\x00")
    rp.on_client(ord("S"), b"")
    assert not rp.quiet and rp.inspecting
    swapped = rp.on_server(ord("E"), error("42P01", "relation does not exist"))
    ((t, body),) = list(iter_messages(swapped))
    assert t == ord("E") and b"COW004" in body and b"statement_untranslatable" in body
    assert rp.on_server(ord("Z"), b"E") is None
    assert rp.quiet and rp.refusals == ["TABLESAMPLE on the events table"]


def test_a_refused_unnamed_parse_outside_a_block_is_answered_without_a_server_error():
    """Idle outside a transaction block with nothing owed: an empty unnamed Parse stands in (no ERROR in
    PostgreSQL's log), what the client sends until its Sync is dropped, and the ParseComplete becomes the
    refusal."""
    rp = new_read_path()
    assert decoded(rp.on_client(ord("P"), parse("", REFUSED))) == (ord("P"), b"\x00\x00\x00\x00")
    assert rp.on_client(ord("B"), bind()) == b"" and rp.on_client(ord("D"), b"P\x00") == b""
    assert rp.on_client(ord("E"), b"\x00\x00\x00\x00\x00") == b""
    assert rp.on_client(ord("H"), b"") is None  # a Flush goes on: the stand-in's answer must not wait
    assert rp.on_client(ord("S"), b"") is None  # the Sync goes on
    swapped = rp.on_server(ord("1"), b"")  # the stand-in's ParseComplete
    ((t, body),) = list(iter_messages(swapped))
    assert t == ord("E") and b"COW004" in body and b"statement_untranslatable" in body
    assert rp.on_server(ord("Z"), b"I") is None
    assert rp.quiet and rp.refusals == ["TABLESAMPLE on the events table"]
    assert rp.on_client(ord("B"), bind()) is None  # no longer skipping


def test_a_refused_named_parse_is_still_poisoned():
    rp = new_read_path()
    p = decoded(rp.on_client(ord("P"), parse("s1", REFUSED)))
    assert p == (ord("P"), b"s1\x00" + POISON_SQL.encode() + b"\x00\x00\x00")


def test_a_refused_query_outside_a_block_is_answered_without_a_server_error():
    rp = new_read_path()
    t, body = decoded(rp.on_client(ord("Q"), f"{REFUSED}; SELECT 2\x00".encode()))
    assert (t, body) == (ord("Q"), b"\x00")  # an empty Query: EmptyQueryResponse, no error on the server
    ((t, body),) = list(iter_messages(rp.on_server(ord("I"), b"")))
    assert t == ord("E") and b"COW004" in body
    assert rp.on_server(ord("Z"), b"I") is None and rp.quiet


def test_a_refused_statement_in_a_query_string_is_the_poisoned_one():
    rp = new_read_path()
    t, body = decoded(rp.on_client(ord("Q"), f"SELECT 1; {REFUSED}; SELECT 2\x00".encode()))
    assert body == f"SELECT 1; {POISON_SQL}; SELECT 2\x00".encode()
    assert rp.on_server(ord("T"), row_description((0, 0))) is None
    assert rp.on_server(ord("C"), b"SELECT 1\x00") is None
    assert b"COW004" in rp.on_server(ord("E"), error())


def test_a_function_call_is_refused_by_a_poisoned_query():
    rp = in_a_block(new_read_path())
    t, body = decoded(rp.on_client(ord("F"), struct.pack("!Ihhh", 1234, 0, 0, 0)))
    assert t == ord("Q") and body == POISON_SQL.encode() + b"\x00"
    assert b"function call" in rp.on_server(ord("E"), error())
    rp.on_server(ord("Z"), b"I")
    assert rp.quiet


@pytest.mark.parametrize("t, body", [
    (ord("P"), b"no terminator"),
    (ord("P"), b"name\x00sql without terminator"),
    (ord("B"), b"\x00"),  # no statement name
])
def test_a_malformed_message_the_read_path_reads_is_a_protocol_violation(t, body):
    rp = new_read_path()
    with pytest.raises(ProtocolViolation) as e:
        rp.on_client(t, body)
    assert e.value.sqlstate == "08P01"


@pytest.mark.parametrize("t, body", [
    (ord("D"), b""),
    (ord("E"), b"portal without terminator"),
    (ord("B"), b"\x00\x00\x00"),  # no parameter format count: the seat does not read that far
    (ord("Q"), b"\xff\xfe"),  # no terminator
])
def test_a_malformed_message_the_read_path_does_not_read_goes_on_for_postgresql_to_refuse(t, body):
    assert new_read_path().on_client(t, body) is None


# ---------------------------------------------------------------- the leak check


@pytest.mark.parametrize("fields, major, leaks", [
    (((EVENTS_OID, 1), (EVENTS_OID, 3)), 2, False),  # event_id, sequence: untranslated columns, fine
    (((EVENTS_OID, TYPE_ATTNUM),), 2, True),
    (((EVENTS_OID, TYPE_ATTNUM),), 1, True),
    (((EVENTS_OID, PAYLOAD_ATTNUM),), 2, True),
    (((EVENTS_OID, PAYLOAD_ATTNUM),), 1, False),  # a v1 reader reads payloads as stored
    (((VIEW_OID, 2),), 2, True),
    (((OTHER_OID, TYPE_ATTNUM),), 2, False),
    (((0, 0),), 2, False),
])
def test_a_result_with_stored_event_columns_ends_the_session(fields, major, leaks):
    rp = new_read_path(major)
    if leaks:
        with pytest.raises(ReadPathError):
            rp.on_server_quiet(ord("T"), row_description(*fields))
    else:
        rp.on_server_quiet(ord("T"), row_description(*fields))
