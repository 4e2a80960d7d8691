"""Sans-IO tests of the read path (proxy.reader.ReadPath): its quiet mode and the FIFO that takes over.

No sockets and no server: client messages go through an EditFramer and server messages through a
StreamSplitter exactly as a translating session relays them (`Session._relay_client_read` and
`Session._relay_upstream_read`, mirrored by `Relay` below), and the bytes each direction forwards are
compared with what PostgreSQL's answers must become for the reader. The read path itself is built as
`SeatServer.read_path_for` builds it, with the pinned artifacts and a real classifier.

Server answers are written by hand with the layout PostgreSQL gives them: a translated statement's
result carries the hidden era column last (smallint from read_v2/read_v1, text from read_v2p).
"""

from __future__ import annotations

import struct

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.artifacts import load_artifacts
from proxy.classify import HIDDEN, Classifier
from proxy.config import HostConfig
from proxy.reader import POISON_SQL, EventColumns, Layout, ReadPath, ReadPathError, parse_row_description
from proxy.session import QUIET_BACKEND_SEEN, READ_BACKEND_SEEN, READ_FRONTEND
from proxy.wire.codec import FRONTEND_TYPES, HELD, RAW, EditFramer, StreamSplitter
from proxy.wire.messages import iter_messages, message

A = load_artifacts()
# The events table's OID: its four bytes are printable ("abcd"), so a column name can hold them too.
EVENTS_OID = 0x61626364
TYPE_ATTNUM, SEQ_ATTNUM, PAYLOAD_ATTNUM = 4, 3, 6
VIEW_OID = 0x00BEEF01  # a view over events.type, learned at start
EVENTS = EventColumns(EVENTS_OID, TYPE_ATTNUM, derived_oids=frozenset({VIEW_OID}), payload_attnum=PAYLOAD_ATTNUM)
OTHER_OID = 0x00010203  # some other table

TEXT, INT8, INT4, INT2, JSONB = 25, 20, 23, 21, 3802
# A v1 type the codemap renames, its v2 name, and a type it leaves alone.
RENAMED_V1 = sorted(A.renamed)[0].encode()
RENAMED_V2 = A.type_map_v1_to_v2[RENAMED_V1]
UNMAPPED = b"example.thing-happened"
assert RENAMED_V1 != RENAMED_V2 and UNMAPPED not in A.type_map_v1_to_v2

PASS_SQL = "SELECT 1"
READ_SQL = "SELECT type, sequence FROM events WHERE run_id = $1"  # read_v2: a smallint era last
READ_P_SQL = "SELECT type, payload FROM events WHERE run_id = $1"  # read_v2p: a text era last
REFUSED_SQL = "SELECT * FROM events ORDER BY type"


def new_read_path(major: int = 2) -> ReadPath:
    return ReadPath(Classifier(HostConfig(), major), major, EVENTS, A.type_map_v1_to_v2, A.type_map_v2_to_v1)


# ---------------------------------------------------------------- messages

def parse(name: str, sql: str) -> bytes:
    return message(b"P", name.encode() + b"\x00" + sql.encode() + b"\x00" + b"\x00\x00")


def bind(portal: str, stmt: str, params: tuple[bytes, ...] = (), result_formats: tuple[int, ...] = ()) -> bytes:
    body = portal.encode() + b"\x00" + stmt.encode() + b"\x00" + b"\x00\x00" + struct.pack("!H", len(params))
    for p in params:
        body += struct.pack("!i", len(p)) + p
    body += struct.pack("!H", len(result_formats)) + b"".join(struct.pack("!h", f) for f in result_formats)
    return message(b"B", body)


def describe(kind: bytes, name: str) -> bytes:
    return message(b"D", kind + name.encode() + b"\x00")


def execute(portal: str) -> bytes:
    return message(b"E", portal.encode() + b"\x00" + b"\x00\x00\x00\x00")


def sync() -> bytes:
    return message(b"S")


def query(sql: str) -> bytes:
    return message(b"Q", sql.encode() + b"\x00")


def function_call() -> bytes:
    return message(b"F", struct.pack("!I", 1598) + b"\x00\x00\x00\x00\x00\x00")


def field(name: bytes, table_oid: int = 0, attnum: int = 0, type_oid: int = TEXT, fmt: int = 0) -> bytes:
    # name, table OID, column attnum, type OID, type size, type modifier, format code
    return name + b"\x00" + struct.pack("!IhIhih", table_oid, attnum, type_oid, -1, -1, fmt)


def row_description(*fields: bytes) -> bytes:
    return message(b"T", struct.pack("!h", len(fields)) + b"".join(fields))


def data_row(*values: bytes | None) -> bytes:
    body = struct.pack("!h", len(values))
    for v in values:
        body += struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v
    return message(b"D", body)


def ready(status: bytes = b"I") -> bytes:
    return message(b"Z", status)


def complete(tag: str) -> bytes:
    return message(b"C", tag.encode() + b"\x00")


def error(sqlstate: str) -> bytes:
    return message(b"E", b"SERROR\x00VERROR\x00C" + sqlstate.encode() + b"\x00Mboom\x00\x00")


PARSE_OK, BIND_OK = message(b"1"), message(b"2")

# Answers to a passthrough `SELECT 1` group (Parse, Bind, Execute, Sync) and to a `SELECT 1` Query.
PASS_GROUP_ANSWER = PARSE_OK + BIND_OK + data_row(b"1") + complete("SELECT 1") + ready()
PASS_QUERY_ANSWER = row_description(field(b"?column?", type_oid=INT4)) + data_row(b"1") + complete("SELECT 1") + ready()

# The server's RowDescription of READ_SQL rewritten (type, sequence, hidden smallint era), and as the reader sees it.
READ_T = row_description(field(b"type", EVENTS_OID, TYPE_ATTNUM), field(b"sequence", EVENTS_OID, SEQ_ATTNUM, INT8),
                         field(HIDDEN.encode(), type_oid=INT2))
READ_T_OUT = row_description(field(b"type", EVENTS_OID, TYPE_ATTNUM), field(b"sequence", EVENTS_OID, SEQ_ATTNUM, INT8))


def read_answer(describe_portal: bool = True) -> tuple[bytes, bytes]:
    """The server's answer to Parse/Bind/(Describe)/Execute/Sync of READ_SQL for a major-2 reader (three
    rows: era 2 renamed, era 2 unmapped, era 3 renamed), and what the reader must receive."""
    rows_in = (data_row(RENAMED_V1, b"1", b"2") + data_row(UNMAPPED, b"2", b"2")
               + data_row(RENAMED_V1, b"3", b"3"))
    rows_out = (data_row(RENAMED_V2, b"1") + data_row(UNMAPPED, b"2") + data_row(RENAMED_V1, b"3"))
    tail_in, tail_out = complete("SELECT 3") + ready(), complete("SELECT 3") + ready()
    return (PARSE_OK + BIND_OK + READ_T + rows_in + tail_in,
            PARSE_OK + BIND_OK + (READ_T_OUT if describe_portal else b"") + rows_out + tail_out)


def read_group(stmt: str = "s1", portal: str = "p1", describe_portal: bool = True) -> bytes:
    return (parse(stmt, READ_SQL) + bind(portal, stmt, (b"run-1",))
            + (describe(b"P", portal) if describe_portal else b"") + execute(portal) + sync())


def pass_group() -> bytes:
    return parse("", PASS_SQL) + bind("", "") + execute("") + sync()


def rewritten_parse(name: str, sql: str, major: int = 2) -> bytes:
    return parse(name, Classifier(HostConfig(), major).classify(sql).text)


# ---------------------------------------------------------------- the relay, as a translating session does it

class Relay:
    """A translating session's two relay paths, without sockets (see proxy.session)."""

    def __init__(self, major: int = 2):
        self.reader = new_read_path(major)
        self.framer = EditFramer(READ_FRONTEND, FRONTEND_TYPES)
        self.splitter = StreamSplitter()
        self.quiet_seen: list[int] = []  # server message types shown to on_server_quiet
        self.fifo_seen: list[int] = []  # …and to on_server

    def client(self, data: bytes) -> bytes:
        """`Session._relay_client_read`: the bytes forwarded to the server for this chunk."""
        items, lo, hi = self.framer.feed(data)
        assert self.framer.violation is None
        parts: list | None = None
        last = lo
        for t, body, start, end in items:
            if t == 0x58:
                continue
            replacement = self.reader.on_client(t, body)
            if start < 0:
                parts = parts if parts is not None else []
                parts.append(message(bytes([t]), body) if replacement is None else replacement)
            elif replacement is not None:
                parts = parts if parts is not None else []
                parts.append(data[last:start])
                parts.append(replacement)
                last = end
        if parts is None:
            return data[lo:hi]
        parts.append(data[last:hi])
        return b"".join(parts)

    def server(self, data: bytes) -> bytes:
        """`Session._relay_upstream_read`: the bytes written to the client for this chunk."""
        reader = self.reader
        quiet = reader.quiet
        out = []
        for item in self.splitter.feed(data, reader.active > 0, QUIET_BACKEND_SEEN if quiet else READ_BACKEND_SEEN):
            if item[0] == RAW:
                out.append(item[1])
                continue
            t, body = item[1], item[2]
            if item[0] == HELD:
                self.fifo_seen.append(t)
                replacement = reader.on_server(t, body)
                out.append(message(bytes([t]), body) if replacement is None else replacement)
            elif quiet:
                self.quiet_seen.append(t)
                reader.on_server_quiet(t, body)
            else:
                self.fifo_seen.append(t)
                reader.on_server(t, body)
        return b"".join(out)


def chunkings(stream: bytes):
    """The stream whole, one message per chunk, and byte by byte."""
    yield [stream]
    yield [message(bytes([t]), body) for t, body in iter_messages(stream)]
    yield [stream[i:i + 1] for i in range(len(stream))]


CHUNKINGS = ["whole", "per-message", "bytes"]


def relay_server(relay: Relay, stream: bytes, how: str) -> bytes:
    chunks = list(chunkings(stream))[CHUNKINGS.index(how)]
    return b"".join(relay.server(c) for c in chunks)


def relay_client(relay: Relay, stream: bytes, how: str) -> bytes:
    chunks = list(chunkings(stream))[CHUNKINGS.index(how)]
    return b"".join(relay.client(c) for c in chunks)


def kinds(reader: ReadPath) -> list[str]:
    return [e.kind for e in reader.pending]


def assert_quiet(reader: ReadPath) -> None:
    assert reader.quiet and not reader.pending and reader.active == 0 and not reader.quiet_sent
    assert not reader.quiet_group


# ---------------------------------------------------------------- quiet bookkeeping

def test_passthrough_traffic_stays_quiet_and_is_relayed_unframed():
    relay = Relay()
    reader = relay.reader
    stream = pass_group() + pass_group() + query(PASS_SQL) + function_call()
    assert relay.client(stream) == stream
    assert reader.quiet and not reader.pending and len(reader.quiet_sent) == 4 and reader.quiet_group == []
    answers = PASS_GROUP_ANSWER * 2 + PASS_QUERY_ANSWER + message(b"V", struct.pack("!i", 1) + b"x") + ready()
    assert relay.server(answers) == answers
    assert_quiet(reader)
    assert relay.fifo_seen == []  # the FIFO never saw a thing
    assert set(relay.quiet_seen) <= {ord("T"), ord("Z")} and relay.quiet_seen.count(ord("Z")) == 4
    assert reader.statement_counts["passthrough", "extended"] == 2
    assert reader.statement_counts["passthrough", "simple"] == 1


def test_quiet_group_records_the_kinds_of_its_messages_until_sync():
    relay = Relay()
    reader = relay.reader
    relay.client(parse("a", PASS_SQL) + bind("", "a") + describe(b"S", "a") + describe(b"P", "")
                 + execute("") + message(b"C", b"Sa\x00"))
    assert reader.quiet and reader.quiet_group == ["P", "B", "DS", "DP", "E", "C"] and not reader.quiet_sent
    relay.client(sync())
    assert reader.quiet_group == [] and len(reader.quiet_sent) == 1 and reader.quiet


def test_quiet_error_and_ready_for_query_are_accounted():
    relay = Relay()
    reader = relay.reader
    relay.client(parse("", "SELECT nope") + bind("", "") + execute("") + sync())
    answer = error("42703") + ready()
    assert relay.server(answer) == answer
    assert reader.server_errors["42703"] == 1
    assert_quiet(reader)


# ---------------------------------------------------------------- (a) translated group behind quiet answers

@pytest.mark.parametrize("client_how", CHUNKINGS)
@pytest.mark.parametrize("how", CHUNKINGS)
def test_translated_group_after_pipelined_passthrough_groups(how, client_how):
    relay = Relay()
    reader = relay.reader
    stream = pass_group() + pass_group() + read_group()
    forwarded = relay_client(relay, stream, client_how)
    # only the translated Parse changed, in place
    assert forwarded == pass_group() * 2 + rewritten_parse("s1", READ_SQL) + read_group()[len(parse("s1", READ_SQL)):]
    # the two quiet Syncs became one Zq entry, ahead of the translated group's own entries
    assert kinds(reader) == ["Zq", "P", "B", "DP", "E", "S"] and len(reader.quiet_sent) == 2
    assert not reader.quiet and reader.active == 2  # the Describe and the Execute are watched
    answer_in, answer_out = read_answer()
    got = relay_server(relay, PASS_GROUP_ANSWER * 2 + answer_in, how)
    assert got == PASS_GROUP_ANSWER * 2 + answer_out  # the passthrough answers untouched
    assert reader.rows_translated == 2  # the era-2 rows (the era-3 one is not mapped for major 2)
    assert_quiet(reader)


@pytest.mark.parametrize("how", CHUNKINGS)
def test_translated_query_after_quiet_queries(how):
    relay = Relay()
    reader = relay.reader
    stream = query(PASS_SQL) + query("SELECT type, sequence FROM events")
    forwarded = relay.client(stream)
    assert forwarded == query(PASS_SQL) + query(Classifier(HostConfig(), 2).classify(
        "SELECT type, sequence FROM events").text)
    assert kinds(reader) == ["Zq", "Q"]
    answer_in = READ_T + data_row(RENAMED_V1, b"1", b"2") + complete("SELECT 1") + ready()
    answer_out = READ_T_OUT + data_row(RENAMED_V2, b"1") + complete("SELECT 1") + ready()
    assert relay_server(relay, PASS_QUERY_ANSWER + answer_in, how) == PASS_QUERY_ANSWER + answer_out
    assert_quiet(reader)


@pytest.mark.parametrize("how", CHUNKINGS)
def test_undescribed_translated_portal_gets_an_injected_describe_whose_answer_is_swallowed(how):
    relay = Relay()
    reader = relay.reader
    forwarded = relay.client(pass_group() + read_group(describe_portal=False))
    assert describe(b"P", "p1") + execute("p1") in forwarded  # the seat asks for the layout itself
    assert kinds(reader) == ["Zq", "P", "B", "DP", "E", "S"] and reader.pending[3].injected
    answer_in, answer_out = read_answer(describe_portal=False)
    assert relay_server(relay, PASS_GROUP_ANSWER + answer_in, how) == PASS_GROUP_ANSWER + answer_out
    assert_quiet(reader)


@pytest.mark.parametrize("how", CHUNKINGS)
def test_projected_payload_with_text_era_from_read_v2p(how):
    relay = Relay()
    reader = relay.reader
    relay.client(parse("", READ_P_SQL) + bind("", "", (b"run-1",)) + describe(b"P", "") + execute("") + sync())
    assert kinds(reader) == ["P", "B", "DP", "E", "S"]  # nothing was owed: no Zq
    projected = orjson.dumps({"nodeId": "n1"})
    meta = b"\x1e1\x1e" + RENAMED_V2 + b"\x1enodeId"
    fields = (field(b"type", EVENTS_OID, TYPE_ATTNUM), field(b"payload", EVENTS_OID, PAYLOAD_ATTNUM, JSONB))
    t_in = row_description(*fields, field(HIDDEN.encode(), type_oid=TEXT))
    t_out = row_description(*fields)
    answer_in = (PARSE_OK + BIND_OK + t_in
                 + data_row(RENAMED_V1, b'{"a": 1}', b"2")  # era 2, nothing projected: 1-byte era
                 + data_row(RENAMED_V1, b'{"node": "n1"}', b"2" + projected + meta)
                 + data_row(RENAMED_V1, b'{"a": 1}', b"3")
                 + complete("SELECT 3") + ready())
    answer_out = (PARSE_OK + BIND_OK + t_out
                  + data_row(RENAMED_V2, b'{"a": 1}')
                  + data_row(RENAMED_V2, projected)
                  + data_row(RENAMED_V1, b'{"a": 1}')
                  + complete("SELECT 3") + ready())
    assert relay_server(relay, answer_in, how) == answer_out
    assert reader.payload_counts["projected", RENAMED_V2.decode(), ""] == 1
    assert reader.payload_counts["boxed", RENAMED_V2.decode(), ""] == 1
    assert reader.payload_counts["missing", RENAMED_V2.decode(), "nodeId"] == 1
    assert_quiet(reader)


# ---------------------------------------------------------------- (b) a translated Parse in an open quiet group

@pytest.mark.parametrize("client_how", CHUNKINGS)
@pytest.mark.parametrize("how", CHUNKINGS)
def test_translated_parse_in_an_open_quiet_group(how, client_how):
    relay = Relay()
    reader = relay.reader
    head = parse("", PASS_SQL) + bind("", "") + execute("")
    assert relay_client(relay, head, client_how) == head
    assert reader.quiet and reader.quiet_group == ["P", "B", "E"]
    assert relay_client(relay, read_group(), client_how) == rewritten_parse("s1", READ_SQL) + read_group()[
        len(parse("s1", READ_SQL)):]
    # the open group's messages became FIFO entries, ahead of the translated ones; no quiet answer was owed
    assert kinds(reader) == ["P", "B", "E", "P", "B", "DP", "E", "S"]
    assert reader.quiet_group == [] and not reader.quiet_sent
    pass_rows = PARSE_OK + BIND_OK + data_row(RENAMED_V1) + complete("SELECT 1")  # not translated: passthrough
    answer_in, answer_out = read_answer()
    assert relay_server(relay, pass_rows + answer_in, how) == pass_rows + answer_out
    assert_quiet(reader)


def test_bind_of_a_translated_statement_prepared_earlier_leaves_quiet():
    relay = Relay()
    reader = relay.reader
    relay.client(parse("s1", READ_SQL) + sync())
    relay.server(PARSE_OK + ready())
    assert_quiet(reader)
    relay.client(pass_group() + bind("p1", "s1", (b"run-1",)) + execute("p1") + sync())
    assert kinds(reader) == ["Zq", "B", "DP", "E", "S"] and reader.pending[2].injected


def test_refused_statement_leaves_quiet_and_its_poison_error_is_replaced():
    relay = Relay()
    reader = relay.reader
    forwarded = relay.client(pass_group() + parse("", REFUSED_SQL) + bind("", "") + execute("") + sync())
    assert parse("", POISON_SQL)[5:-2] in forwarded and REFUSED_SQL.encode() not in forwarded
    assert kinds(reader) == ["Zq", "P", "B", "E", "S"]
    poison_error = error("42P01") + ready(b"I")
    got = relay.server(PASS_GROUP_ANSWER + poison_error)
    assert got.startswith(PASS_GROUP_ANSWER) and got.endswith(ready(b"I"))
    assert b"C42P01" not in got and b"OW004" in got
    assert reader.refusals and reader.server_errors["42P01"] == 0
    assert_quiet(reader)


# ---------------------------------------------------------------- (c) Query and FunctionCall in an open quiet group

@pytest.mark.parametrize("how", CHUNKINGS)
def test_query_while_a_quiet_group_is_open_goes_through_the_fifo(how):
    relay = Relay()
    reader = relay.reader
    stream = parse("", PASS_SQL) + bind("", "") + execute("") + query(PASS_SQL)
    assert relay.client(stream) == stream
    assert kinds(reader) == ["P", "B", "E", "Q"] and reader.active == 0 and not reader.quiet_sent
    answer = PARSE_OK + BIND_OK + data_row(b"1") + complete("SELECT 1") + PASS_QUERY_ANSWER
    assert relay_server(relay, answer, how) == answer
    assert relay.fifo_seen  # answered through the FIFO
    assert_quiet(reader)


@pytest.mark.parametrize("how", CHUNKINGS)
def test_function_call_while_a_quiet_group_is_open_goes_through_the_fifo(how):
    relay = Relay()
    reader = relay.reader
    stream = parse("", PASS_SQL) + bind("", "") + execute("") + function_call()
    assert relay.client(stream) == stream
    assert kinds(reader) == ["P", "B", "E", "F"]
    answer = PARSE_OK + BIND_OK + data_row(b"1") + complete("SELECT 1") + message(b"V", b"\xff\xff\xff\xff") + ready()
    assert relay_server(relay, answer, how) == answer
    assert_quiet(reader)


def test_query_and_function_call_outside_a_group_stay_quiet():
    relay = Relay()
    reader = relay.reader
    relay.client(pass_group() + query(PASS_SQL) + function_call())
    assert reader.quiet and len(reader.quiet_sent) == 3


def test_zq_head_passes_everything_until_the_quiet_answers_drain():
    reader = new_read_path()
    reader.on_client(ord("Q"), PASS_SQL.encode() + b"\x00")
    reader.on_client(ord("Q"), PASS_SQL.encode() + b"\x00")
    reader.on_client(ord("Q"), b"SELECT type, sequence FROM events\x00")
    assert kinds(reader) == ["Zq", "Q"] and len(reader.quiet_sent) == 2
    # A RowDescription that would be stripped under the Q entry passes untouched under Zq, rows too.
    for t, body in iter_messages(READ_T + data_row(RENAMED_V1, b"1", b"2") + error("22012")):
        assert reader.on_server(t, body) is None
    assert reader.server_errors["22012"] == 1
    assert reader.on_server(ord("Z"), b"I") is None
    assert kinds(reader) == ["Zq", "Q"] and len(reader.quiet_sent) == 1
    assert reader.on_server(ord("Z"), b"I") is None
    assert kinds(reader) == ["Q"] and not reader.quiet_sent  # popped when the last quiet answer drained
    assert reader.on_server(ord("T"), READ_T[5:]) == READ_T_OUT


# ---------------------------------------------------------------- (d) the leak check while quiet

def test_quiet_row_description_with_the_events_type_column_and_no_era_closes_the_session():
    relay = Relay()
    relay.client(query("SELECT * FROM some_view_the_seat_does_not_know"))
    leak = row_description(field(b"type", EVENTS_OID, TYPE_ATTNUM), field(b"x", OTHER_OID, 1, INT4))
    with pytest.raises(ReadPathError, match="type column without the seat's era column"):
        relay.server(leak)
    with pytest.raises(ReadPathError):
        new_read_path().on_server_quiet(ord("T"), leak[5:])


def test_quiet_row_description_from_a_view_over_events_type_closes_the_session():
    with pytest.raises(ReadPathError):
        new_read_path().on_server_quiet(ord("T"), row_description(field(b"t", VIEW_OID, 2))[5:])


def test_quiet_payload_without_projection_closes_a_major_2_session_only():
    leak = row_description(field(b"payload", EVENTS_OID, PAYLOAD_ATTNUM, JSONB))[5:]
    with pytest.raises(ReadPathError, match="payload column without the seat's projection"):
        new_read_path(2).on_server_quiet(ord("T"), leak)
    new_read_path(1).on_server_quiet(ord("T"), leak)


def test_quiet_row_description_without_the_oid_bytes_is_not_parsed():
    # A body that does not even parse (it claims two fields, holds a truncated one): the substring test
    # alone lets it through, so nothing parses it.
    body = row_description(field(b"x", OTHER_OID, 1, INT4))[5:]
    garbage = struct.pack("!h", 2) + body[2:-4]
    with pytest.raises(Exception):
        parse_row_description(garbage, EVENTS)
    assert struct.pack("!I", EVENTS_OID) not in garbage
    reader = new_read_path()
    reader.on_server_quiet(ord("T"), garbage)
    reader.on_server_quiet(ord("T"), body)
    assert reader.quiet


def test_quiet_row_description_holding_the_oid_bytes_in_a_name_is_parsed_and_passes():
    # "abcd" is the events table's OID: the substring test matches, the real parse finds no events column.
    body = row_description(field(b"xabcdx", OTHER_OID, 1, INT4), field(b"type", OTHER_OID, TYPE_ATTNUM))[5:]
    assert struct.pack("!I", EVENTS_OID) in body
    assert relay_quiet_ok(body)


def relay_quiet_ok(body: bytes) -> bool:
    relay = Relay()
    relay.client(query("SELECT xabcdx, type FROM other"))
    t = message(b"T", body)
    return relay.server(t) == t and relay.quiet_seen == [ord("T")]


def test_passthrough_row_description_under_the_fifo_is_leak_checked_too():
    relay = Relay()
    relay.client(parse("", PASS_SQL) + bind("", "") + execute("") + query(PASS_SQL))
    assert not relay.reader.quiet
    with pytest.raises(ReadPathError):
        relay.server(PARSE_OK + BIND_OK + row_description(field(b"type", EVENTS_OID, TYPE_ATTNUM)))


# ---------------------------------------------------------------- (e) back to quiet, and again out of it

def test_back_to_quiet_after_the_fifo_drains_then_quiet_again_then_fifo_again():
    relay = Relay()
    reader = relay.reader
    answer_in, answer_out = read_answer()
    for _ in range(3):
        relay.client(pass_group())
        assert reader.quiet
        relay.client(read_group())
        assert not reader.quiet and kinds(reader)[0] == "Zq"
        assert relay.server(PASS_GROUP_ANSWER) == PASS_GROUP_ANSWER
        assert kinds(reader) == ["P", "B", "DP", "E", "S"]  # the Zq entry popped with the last quiet answer
        assert relay.server(answer_in) == answer_out
        assert_quiet(reader)
        relay.client(pass_group())
        relay.server(PASS_GROUP_ANSWER)
        assert_quiet(reader)


def test_fifo_stays_while_a_later_group_is_still_owed():
    relay = Relay()
    reader = relay.reader
    relay.client(read_group() + pass_group())
    # once the FIFO holds entries, passthrough messages get entries too (no quiet bookkeeping)
    assert kinds(reader) == ["P", "B", "DP", "E", "S", "P", "B", "E", "S"] and not reader.quiet_sent
    answer_in, answer_out = read_answer()
    assert relay.server(answer_in) == answer_out
    assert not reader.quiet and kinds(reader) == ["P", "B", "E", "S"]
    assert relay.server(PASS_GROUP_ANSWER) == PASS_GROUP_ANSWER
    assert_quiet(reader)


# ---------------------------------------------------------------- _translate_row: the fast path equals the walk

_MAPPED_ERA = {2: (b"2", b"\x00\x02"), 1: (b"3", b"\x00\x03")}
_OTHER_ERA = {2: (b"3", b"\x00\x03"), 1: (b"2", b"\x00\x02")}
_NAMES = sorted({*A.type_map_v1_to_v2, *A.type_map_v2_to_v1})[:20] + [UNMAPPED, b""]


@st.composite
def rows(draw):
    """(major, layout, DataRow body) with the hidden era column last."""
    major = draw(st.sampled_from([1, 2]))
    n = draw(st.integers(min_value=0, max_value=7))  # visible columns
    roles = draw(st.lists(st.sampled_from(["other", "type", "payload"]), min_size=n, max_size=n))
    era_kind = draw(st.sampled_from(["text", "binary", "v2p-short", "v2p-long"] if major == 2
                                    else ["text", "binary"]))
    mapped = draw(st.booleans())
    era_text, era_bin = (_MAPPED_ERA if mapped else _OTHER_ERA)[major]
    values: list[bytes | None] = []
    for role in roles:
        if draw(st.integers(0, 5)) == 0:
            values.append(None)
        elif role == "type":
            values.append(draw(st.one_of(st.sampled_from(_NAMES), st.binary(max_size=12))))
        else:
            values.append(draw(st.binary(max_size=30)))
    if era_kind == "text":
        hidden = era_text
    elif era_kind == "binary":
        hidden = era_bin
    elif era_kind == "v2p-short":
        hidden = era_text
    else:
        payload = orjson.dumps(draw(st.dictionaries(st.text(max_size=5), st.one_of(
            st.none(), st.integers(-10**6, 10**6), st.text(max_size=8)), max_size=3)))
        meta = draw(st.sampled_from([b"", b"\x1e0\x1enode.started\x1e", b"\x1e2\x1enode.started\x1enodeId,x"]))
        hidden = era_text + (payload + meta if meta else payload)
    v2p = era_kind.startswith("v2p")
    types = tuple(i for i, r in enumerate(roles) if r == "type")
    payloads = tuple(i for i, r in enumerate(roles) if r == "payload") if v2p else ()
    layout = Layout(hidden=(n,), types=types, ncols=n + 1, era_binary=era_kind == "binary", payloads=payloads,
                    hidden_text=v2p, payload_binary=tuple(draw(st.booleans()) for _ in payloads))
    body = data_row(*values, hidden)[5:]
    return major, layout, body


@given(rows())
@settings(max_examples=500, deadline=None, derandomize=True)
def test_translate_row_fast_path_equals_the_walk(case):
    major, layout, body = case
    assert layout.hidden_last
    fast, walk = new_read_path(major), new_read_path(major)
    assert fast._translate_row(body, layout) == walk._translate_row_walk(body, layout)
    assert fast.rows_translated == walk.rows_translated


def test_translate_row_fast_path_maps_types_and_drops_the_era():
    reader = new_read_path(2)
    layout = Layout(hidden=(3,), types=(0, 2), ncols=4)
    body = data_row(RENAMED_V1, None, UNMAPPED, b"2")[5:]
    assert reader._translate_row(body, layout) == data_row(RENAMED_V2, None, UNMAPPED)
    binary = Layout(hidden=(2,), types=(1,), ncols=3, era_binary=True)
    assert reader._translate_row(data_row(b"x", RENAMED_V1, b"\x00\x02")[5:], binary) == data_row(b"x", RENAMED_V2)
    assert reader._translate_row(data_row(b"x", RENAMED_V1, b"\x00\x03")[5:], binary) == data_row(b"x", RENAMED_V1)
    major_1 = new_read_path(1)
    assert major_1._translate_row(data_row(RENAMED_V2, b"3")[5:], Layout((1,), (0,), 2)) == data_row(RENAMED_V1)
    assert reader.rows_translated == 2 and major_1.rows_translated == 1


def test_translate_row_counts_a_mapped_row_without_type_columns_on_both_paths():
    # `SELECT payload FROM events` for major 2: an era-2 row counts whether or not its payload was projected
    # (the fast path takes the row with a 1-byte era, the walk the one with a projection).
    reader = new_read_path(2)
    layout = Layout((1,), (), 2, payloads=(0,), hidden_text=True, payload_binary=(False,))
    assert reader._translate_row(data_row(b"{}", b"2")[5:], layout) == data_row(b"{}")
    projected = data_row(b"{}", b'2{"a":1}\x1e0\x1enode.started\x1e')[5:]
    assert reader._translate_row(projected, layout) == data_row(b'{"a":1}')
    assert reader._translate_row(data_row(b"{}", b"3")[5:], layout) == data_row(b"{}")
    assert reader.rows_translated == 2


def test_translate_row_null_era_fails_closed():
    with pytest.raises(ReadPathError, match="NULL"):
        new_read_path(2)._translate_row(data_row(RENAMED_V1, None)[5:], Layout((1,), (0,), 2))
