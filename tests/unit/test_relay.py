"""The session's sans-IO relay (proxy.serve.relay), driven as PostgreSQL and a client would drive it.

No sockets: the server's side is written by hand, message by message, as PostgreSQL sends it, and each
exchange is fed whole, in two pieces at every split, and byte by byte; the result must not depend on it.
"""

from __future__ import annotations

import struct
import time

import pytest

from proxy.config import HostConfig
from proxy.db.claims import claim_once_proof, claim_proof
from proxy.readpath.classify import Classifier
from proxy.readpath.read_path import EventColumns, ReadPath
from proxy.serve.relay import Claim, Identity, Relay
from proxy.stats import Stats
from proxy.wire.state import Phase

# each test runs once per framer implementation (ADR 0018; tests/unit/conftest.py)
pytestmark = pytest.mark.usefixtures("each_framer")

SECRET = "a-claim-secret-of-sixteen-bytes"
CHALLENGE = "salt123:challenge456"


def msg(t: bytes, body: bytes = b"") -> bytes:
    return t + struct.pack("!I", len(body) + 4) + body


def status(name: str, value: str) -> bytes:
    return msg(b"S", name.encode() + b"\x00" + value.encode() + b"\x00")


def error(code: str, text: str, severity: str = "ERROR") -> bytes:
    return msg(b"E", b"S" + severity.encode() + b"\x00C" + code.encode() + b"\x00M" + text.encode() + b"\x00\x00")


def row(*values: bytes) -> bytes:
    return msg(b"D", struct.pack("!h", len(values)) + b"".join(struct.pack("!i", len(v)) + v for v in values))


AUTH_OK = msg(b"R", struct.pack("!I", 0))
SASL_OFFER = msg(b"R", struct.pack("!I", 10) + b"SCRAM-SHA-256-PLUS\x00SCRAM-SHA-256\x00\x00")
SASL_PLAIN = msg(b"R", struct.pack("!I", 10) + b"SCRAM-SHA-256\x00\x00")
READY = msg(b"Z", b"I")
LOGIN = AUTH_OK + status("server_version", "15.8") + status("is_superuser", "off") + msg(
    b"K", struct.pack("!I", 4242) + b"key!") + READY
QUERY = msg(b"Q", b"SELECT 1\x00")
RESULT = msg(b"T", b"\x00\x01c\x00" + bytes(18)) + row(b"1") + msg(b"C", b"SELECT 1\x00") + READY
CHALLENGE_ANSWER = (msg(b"1") + msg(b"2") + row(CHALLENGE.encode(), b"4242") + msg(b"C", b"SELECT 1\x00") + READY)
# the same answer from another backend than the one the login's BackendKeyData named: a pooler in between
POOLED_ANSWER = CHALLENGE_ANSWER.replace(row(CHALLENGE.encode(), b"4242"), row(CHALLENGE.encode(), b"777"))
CLAIM_ANSWER = (msg(b"1") + msg(b"2") + row(b"t", b"f") + msg(b"C", b"SELECT 1\x00") + READY)


def pieces(data: bytes, how: str) -> list[bytes]:
    if how == "whole":
        return [data]
    if how == "bytes":
        return [data[i:i + 1] for i in range(len(data))]
    cut = int(how)
    return [data[:cut], data[cut:]]


def server(relay: Relay, data: bytes, how: str = "whole") -> tuple[bytes, bytes]:
    to_client, to_server = b"", b""
    for piece in pieces(data, how):
        a, b = relay.from_server(piece)
        to_client += a
        to_server += b
    return to_client, to_server


def client(relay: Relay, data: bytes, how: str = "whole") -> bytes:
    return b"".join(relay.from_client(piece) for piece in pieces(data, how))


def splits(data: bytes) -> list[str]:
    return ["whole", "bytes"] + [str(i) for i in range(1, len(data))]


def messages_of(data: bytes) -> list[tuple[bytes, bytes]]:
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("!I", data, pos + 1)
        out.append((data[pos:pos + 1], data[pos + 5:pos + 1 + length]))
        pos += 1 + length
    return out


# ---------------------------------------------------------------- a session without a claim


@pytest.mark.parametrize("how", splits(LOGIN))
def test_a_login_is_relayed_byte_for_byte_and_the_state_follows_it(how):
    relay = Relay(Stats())
    assert server(relay, LOGIN, how) == (LOGIN, b"")
    state = relay.state
    assert state.phase is Phase.READY and state.backend_pid == 4242 and state.server_params["server_version"] == "15.8"
    assert relay.readies == 1 and relay.server_at_boundary


def test_after_the_login_a_chunk_goes_on_as_the_very_same_object():
    relay = Relay(Stats())
    server(relay, LOGIN)
    assert relay.from_client(QUERY) is QUERY
    to_client, to_server = relay.from_server(RESULT)
    assert to_client is RESULT and to_server == b""


def test_statements_of_a_session_without_a_read_path_are_counted_and_timed():
    stats = Stats()
    relay = Relay(stats)
    server(relay, LOGIN)
    client(relay, QUERY + msg(b"P", b"\x00SELECT 1\x00\x00\x00") + msg(b"S"))
    assert (relay.raw_simple, relay.raw_extended) == (1, 1)
    server(relay, RESULT + msg(b"1") + READY)
    assert sum(stats.statement_seconds.counts) == 2


@pytest.mark.parametrize("client_tls, offer", [(False, SASL_PLAIN), (True, SASL_OFFER)])
def test_the_channel_binding_offer_is_removed_for_a_plaintext_client_only(client_tls, offer):
    relay = Relay(Stats(), client_tls=client_tls)
    assert server(relay, SASL_OFFER, "3") == (offer, b"")


def test_a_terminate_moves_the_session_to_closing():
    relay = Relay(Stats())
    server(relay, LOGIN)
    client(relay, msg(b"X"))
    assert relay.state.phase is Phase.CLOSING


# ---------------------------------------------------------------- the claim (ADR 0006)


def claimed(major: int = 2, limit: int = 1 << 20) -> Relay:
    return Relay(Stats(), claim=Claim(SECRET, major, limit))


def challenge_sent(to_server: bytes) -> None:
    assert [t for t, _ in messages_of(to_server)] == [b"P", b"B", b"E", b"S"]
    assert b"openwop_seat.claim_challenge()" in messages_of(to_server)[0][1]


@pytest.mark.parametrize("how", ["whole", "bytes", "3", "9"])
@pytest.mark.parametrize("major", [1, 2])
def test_the_claim_runs_before_the_client_may_speak(how, major):
    relay = claimed(major)
    # the client pipelines a query behind its startup packet: held, not sent
    assert client(relay, QUERY, how) == b""
    before, to_server = server(relay, LOGIN, how)
    assert LOGIN.startswith(before) and before != LOGIN  # the first ReadyForQuery is held (with its chunk)
    challenge_sent(to_server)
    assert relay.claiming and relay.awaiting_ready
    to_client, to_server = server(relay, CHALLENGE_ANSWER, how)
    assert to_client == b""
    (p, pb), (b, bb), _, _ = messages_of(to_server)
    assert b"openwop_seat.claim($1, $2)" in pb
    proof = claim_proof(SECRET, CHALLENGE, major).encode()
    assert struct.pack("!i", len(proof)) + proof + struct.pack("!i", 1) + str(major).encode() in bb
    assert SECRET.encode() not in to_server  # the proof, never the secret
    to_client, to_server = server(relay, CLAIM_ANSWER, how)
    assert before + to_client == LOGIN and to_server == QUERY  # the held ReadyForQuery, then what the client sent
    assert not relay.claiming and not relay.awaiting_ready and relay.privileged == ""
    assert relay.from_client(QUERY) is QUERY


# ---------------------------------------------------------------- the claim in one round trip (ADR 0013)


def once_answer(verdict: bytes, owns: bytes = b"f") -> bytes:
    return msg(b"1") + msg(b"2") + row(verdict, owns) + msg(b"C", b"SELECT 1\x00") + READY


def once_sent(to_server: bytes, major: int) -> list[bytes]:
    """The one-round-trip claim's messages; its five parameters (pid, time, nonce, major, proof), checked."""
    (p, pb), (b, bb), (e, _), (s, _) = messages_of(to_server)
    assert (p, b, e, s) == (b"P", b"B", b"E", b"S") and b"openwop_seat.claim_once($1, $2, $3, $4, $5)" in pb
    (count,) = struct.unpack_from("!h", bb, 4)
    values, at = [], 6
    for _ in range(count):
        (n,) = struct.unpack_from("!i", bb, at)
        values.append(bb[at + 4:at + 4 + n])
        at += 4 + n
    pid, at_us, nonce, m, proof = values
    assert pid == b"4242" and m == str(major).encode() and len(nonce) == 32
    assert abs(int(at_us) - time.time_ns() // 1000) < 10_000_000
    assert proof.decode() == claim_once_proof(SECRET, "salt123", 4242, int(at_us), nonce.decode(), major)
    assert SECRET.encode() not in to_server
    return values


@pytest.mark.parametrize("how", ["whole", "bytes", "9"])
@pytest.mark.parametrize("major", [0, 1, 2])
def test_with_the_salt_known_the_claim_takes_one_round_trip(how, major):
    relay = Relay(Stats(), claim=Claim(SECRET, major, 1 << 20, "salt123"))
    assert client(relay, QUERY, how) == b""
    before, to_server = server(relay, LOGIN, how)
    assert LOGIN.startswith(before) and before != LOGIN
    assert how != "whole" or before == b""  # a login in one chunk reaches the client in one write, after the claim
    once_sent(to_server, major)
    assert relay.claiming and relay.awaiting_ready
    to_client, to_server = server(relay, once_answer(b"ok"), how)
    assert before + to_client == LOGIN and to_server == QUERY
    assert not relay.claiming and not relay.awaiting_ready and relay.claim_path == "once"


@pytest.mark.parametrize("owns", [None, True, False])
def test_a_roles_ownership_of_the_schema_is_asked_only_when_not_known(owns):
    relay = Relay(Stats(), claim=Claim(SECRET, 2, 1 << 20, "salt123", owns))
    (_, pb), *_ = messages_of(server(relay, LOGIN)[1])
    assert (b"pg_has_role" in pb) is (owns is None)
    answer = once_answer(b"ok", b"t") if owns is None else (msg(b"1") + msg(b"2") + row(b"ok")
                                                             + msg(b"C", b"SELECT 1\x00") + READY)
    server(relay, answer)
    assert relay.owns_seen is (True if owns is None else None)
    assert relay.privileged == ("owns openwop_seat" if owns in (None, True) else "")


def test_two_claims_never_share_a_nonce():
    nonces = set()
    for _ in range(20):
        relay = Relay(Stats(), claim=Claim(SECRET, 2, 1 << 20, "salt123"))
        nonces.add(once_sent(server(relay, LOGIN)[1], 2)[2])
    assert len(nonces) == 20


@pytest.mark.parametrize("verdict", [b"clock", b"ledger", b"replay", b"wrong secret", b"pooler 777"])
def test_a_one_round_trip_claim_the_database_does_not_take_falls_back_to_the_challenge(verdict):
    relay = Relay(Stats(), claim=Claim(SECRET, 1 if verdict.startswith(b"pooler") else 2, 1 << 20, "salt123"))
    client(relay, QUERY)
    server(relay, LOGIN)
    to_client, to_server = server(relay, once_answer(verdict))
    assert to_client == b"" and relay.claiming and relay.ending is None
    challenge_sent(to_server)
    answer = POOLED_ANSWER if verdict.startswith(b"pooler") else CHALLENGE_ANSWER
    to_client, to_server = server(relay, answer)
    server(relay, CLAIM_ANSWER)
    assert not relay.awaiting_ready and relay.ending is None
    why = "refused" if verdict == b"wrong secret" else verdict.split()[0].decode()
    assert relay.claim_path == f"challenge after {why}"
    assert relay.salt_seen == "salt123"
    assert relay.pooler_seen is verdict.startswith(b"pooler")


def test_an_error_in_the_one_round_trip_claim_falls_back_to_the_challenge():
    relay = Relay(Stats(), claim=Claim(SECRET, 2, 1 << 20, "salt123"))
    server(relay, LOGIN)
    to_client, to_server = server(relay, msg(b"1") + error("42883", "function does not exist") + READY)
    challenge_sent(to_server)
    assert relay.claim_path == "challenge after error"


@pytest.mark.parametrize("major", [2, 1])
def test_a_pooler_behind_the_seat_ends_a_v2_or_translated_session_without_a_second_try(major):
    reader = ReadPath(Classifier(HostConfig(), 1), 1, EVENTS) if major == 1 else None
    relay = Relay(Stats(), claim=Claim(SECRET, major, 1 << 20, "salt123"), reader=reader)
    server(relay, LOGIN)
    to_client, to_server = server(relay, once_answer(b"pooler 777"))
    assert to_server == b"" and relay.ending is not None and relay.ending.kind == "pooler_behind"
    assert "777" in relay.ending.message and relay.pooler_seen


def test_without_the_salt_the_first_claim_asks_for_a_challenge_and_learns_it():
    relay = claimed()
    challenge_sent(server(relay, LOGIN)[1])
    server(relay, CHALLENGE_ANSWER)
    server(relay, CLAIM_ANSWER)
    assert relay.claim_path == "challenge" and relay.salt_seen == "salt123"


def test_password_messages_go_through_while_the_server_authenticates():
    relay = claimed()
    server(relay, SASL_OFFER)
    password = msg(b"p", b"SCRAM-SHA-256\x00" + struct.pack("!i", 3) + b"abc")
    assert client(relay, password + QUERY, "bytes") == password
    to_client, to_server = server(relay, LOGIN)
    challenge_sent(to_server)
    server(relay, CHALLENGE_ANSWER)
    assert server(relay, CLAIM_ANSWER) == (LOGIN, QUERY)  # the login's chunk, held with its ReadyForQuery


def test_a_superuser_or_the_schema_owner_is_reported_as_privileged():
    relay = claimed()
    server(relay, LOGIN.replace(status("is_superuser", "off"), status("is_superuser", "on")))
    server(relay, CHALLENGE_ANSWER)
    server(relay, CLAIM_ANSWER)
    assert relay.privileged == "superuser"
    relay = claimed()
    server(relay, LOGIN)
    server(relay, CHALLENGE_ANSWER)
    server(relay, CLAIM_ANSWER.replace(row(b"t", b"f"), row(b"t", b"t")))
    assert relay.privileged == "owns openwop_seat"


@pytest.mark.parametrize("answer, sqlstate", [
    (msg(b"1") + msg(b"2") + error("OW9XX", "wrong proof") + READY, "OW9XX"),
    (msg(b"1") + msg(b"2") + row(b"no-colon") + msg(b"C", b"SELECT 1\x00") + READY, "XX000"),
])
def test_a_failed_claim_ends_the_session_and_the_client_gets_nothing_of_it(answer, sqlstate):
    relay = claimed()
    client(relay, QUERY)
    server(relay, LOGIN)
    to_client, to_server = server(relay, answer)
    assert to_client == b"" and to_server == b""
    assert relay.ending.sqlstate == sqlstate and relay.ending.kind == "claim_failed"
    assert "could not record this session's major" in relay.ending.message


@pytest.mark.parametrize("translated, major", [(True, 2), (True, 1), (False, 2)])
def test_a_translated_or_v2_session_through_a_pooler_is_refused_before_anything_is_claimed(translated, major):
    reader = ReadPath(Classifier(HostConfig(), major), major, EVENTS) if translated else None
    relay = Relay(Stats(), reader=reader, claim=Claim(SECRET, major, 1 << 20))
    client(relay, QUERY)
    server(relay, LOGIN)
    to_client, to_server = server(relay, POOLED_ANSWER)
    assert (to_client, to_server) == (b"", b"")  # no proof sent: nothing is recorded on the pooler's backend
    assert relay.ending.kind == "pooler_behind" and relay.ending.sqlstate == "08004"
    assert "pid 777 is not the pid 4242" in relay.ending.message


def test_a_raw_session_through_a_pooler_is_claimed_as_major_1_and_relayed():
    relay = claimed(major=1)
    server(relay, LOGIN)
    _, to_server = server(relay, POOLED_ANSWER)
    assert b"openwop_seat.claim($1, $2)" in to_server and relay.ending is None


def test_a_client_that_says_too_much_before_its_session_is_ready_is_ended():
    relay = claimed(limit=100)
    assert client(relay, QUERY * 20) == b""
    assert relay.ending.sqlstate == "54000" and "proxy.claim_buffer_limit" in relay.ending.message


# ---------------------------------------------------------------- violations


def test_a_client_violation_forwards_what_came_before_and_ends_the_session():
    stats = Stats()
    relay = Relay(stats)
    server(relay, LOGIN)
    assert relay.from_client(QUERY + b"\x01\x00\x00\x00\x04") == QUERY
    assert relay.ending.kind == "client_violation" and "invalid frontend message type 1" in relay.ending.message
    assert stats.protocol_violations == 1
    assert relay.from_client(QUERY) == b""  # nothing after an ending


def test_a_server_violation_ends_the_session():
    relay = Relay(Stats())
    server(relay, LOGIN)
    to_client, _ = relay.from_server(RESULT + b"D\x00\x00\x00\x02")
    assert to_client == RESULT
    assert relay.ending.sqlstate == "08P01" and "upstream sent an invalid message" in relay.ending.message


def test_boundaries_are_tracked_on_both_sides():
    relay = Relay(Stats())
    server(relay, LOGIN[:3])
    assert not relay.server_at_boundary
    server(relay, LOGIN[3:])
    assert relay.server_at_boundary
    relay.from_client(QUERY[:4])
    assert not relay.client_at_boundary
    relay.from_client(QUERY[4:])
    assert relay.client_at_boundary


# ---------------------------------------------------------------- a translated session

EVENTS = EventColumns(0x61626364, 4, payload_attnum=6)
PAGE = b"SELECT * FROM events WHERE run_id = 'r1' ORDER BY sequence"


def translated() -> Relay:
    reader = ReadPath(Classifier(HostConfig(), 2), 2, EVENTS)
    relay = Relay(Stats(), reader=reader, claim=Claim(SECRET, 2, 1 << 20))
    server(relay, LOGIN)
    server(relay, CHALLENGE_ANSWER)
    server(relay, CLAIM_ANSWER)
    return relay


@pytest.mark.parametrize("how", ["whole", "bytes", "7"])
def test_a_read_of_the_events_table_is_sent_over_the_translated_relation(how):
    relay = translated()
    sent = client(relay, msg(b"Q", PAGE + b"\x00"), how)
    ((t, body),) = messages_of(sent)
    assert t == b"Q" and b"openwop_seat.events_m2 AS events" in body


def test_a_refused_statement_gets_its_error_swapped_for_the_seats():
    relay = translated()
    sent = client(relay, msg(b"Q", b"SELECT * FROM events TABLESAMPLE SYSTEM (1)\x00"))
    assert b"events_m2" not in sent
    to_client, _ = server(relay, error("42P01", "relation does not exist") + READY, "5")
    assert b"COW004" in to_client and b"statement_untranslatable" in to_client
    assert to_client.endswith(READY)


def test_a_translated_session_passes_a_result_of_another_table_unchanged():
    relay = translated()
    assert relay.from_client(QUERY) == QUERY
    to_client, _ = relay.from_server(RESULT)
    assert to_client == RESULT


def test_a_pooled_sessions_terminate_is_not_relayed_even_in_a_chunk_that_could_go_on_as_itself():
    """A pooled session's Terminate is held (its backend outlives the client, ADR 0016): a chunk holding a Query and
    the Terminate goes on without it, never as itself (the backend would end, and the pool lose it)."""
    reader = ReadPath(Classifier(HostConfig(), 2), 2, EVENTS)
    relay = Relay(Stats(), reader=reader, claim=Claim(SECRET, 2, 1 << 20), pooled=True)
    server(relay, LOGIN)
    server(relay, CHALLENGE_ANSWER)
    server(relay, CLAIM_ANSWER)
    sent = relay.from_client(QUERY + msg(b"X"))
    assert sent == QUERY
    assert relay.from_client(msg(b"X")) == b""


def test_a_translated_sessions_chunk_the_read_path_leaves_alone_goes_on_as_the_very_same_object():
    relay = translated()
    extended = (msg(b"P", b"\x00SELECT 1\x00\x00\x00") + msg(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x00")
                + msg(b"E", b"\x00\x00\x00\x00\x00") + msg(b"S"))
    assert relay.from_client(QUERY) is QUERY
    assert relay.from_client(extended) is extended
    # a message that began in an earlier chunk is re-encoded whole: the same bytes, not the chunk
    assert relay.from_client(QUERY[:3]) == b""
    assert relay.from_client(QUERY[3:] + extended) == QUERY + extended
    # a rewritten statement among them: the chunk is rebuilt around it, in order
    page = msg(b"Q", PAGE + b"\x00")
    sent = relay.from_client(QUERY + page + extended)
    assert [t for t, _ in messages_of(sent)] == [b"Q", b"Q", b"P", b"B", b"E", b"S"]
    assert sent.startswith(QUERY) and sent.endswith(extended) and b"openwop_seat.events_m2 AS events" in sent
    # a violation after them: what came before goes on, the bad bytes never
    bad = QUERY + b"\x01\x00\x00\x00\x04"
    assert relay.from_client(bad) == QUERY and relay.ending.kind == "client_violation"


# ---------------------------------------------------------------- the identity a major was chosen by

def rules(params: dict[str, str]) -> int | str:
    """[[proxy.clients]] as a function: the v1 host is known by its application_name."""
    return 1 if params.get("application_name") == "v1-host" else 2


def followed(reader: ReadPath | None = None, app: str = "") -> Relay:
    params = {"user": "host", "database": "app", **({"application_name": app} if app else {})}
    relay = Relay(Stats(), reader=reader, claim=Claim(SECRET, 2, 1 << 20),
                  identity=Identity(params, rules(params), rules))
    server(relay, LOGIN + status("application_name", app))
    server(relay, CHALLENGE_ANSWER)
    server(relay, CLAIM_ANSWER)
    assert relay.ending is None
    return relay


SET_DONE = msg(b"C", b"SET\x00") + READY


@pytest.mark.parametrize("translated", [False, True])
@pytest.mark.parametrize("how", ["whole", "bytes", "3"])
def test_a_set_of_an_identity_that_selects_another_major_ends_the_session_before_anything_after_it(translated, how):
    reader = ReadPath(Classifier(HostConfig(), 2), 2, EVENTS) if translated else None
    relay = followed(reader)
    client(relay, msg(b"Q", b"SET application_name = 'v1-host'; SELECT * FROM events\x00"))
    to_client, _ = server(relay, status("application_name", "v1-host") + SET_DONE + RESULT, how)
    assert to_client == b""  # not the report, not the SET's completion, no row of the SELECT after it
    assert relay.ending.kind == "identity_changed" and relay.ending.sqlstate == "0A000"
    assert "application_name is now 'v1-host', which selects major 1" in relay.ending.message
    assert relay.from_client(QUERY) == b""


@pytest.mark.parametrize("translated", [False, True])
def test_a_set_that_keeps_the_major_goes_through_untouched(translated):
    reader = ReadPath(Classifier(HostConfig(), 2), 2, EVENTS) if translated else None
    relay = followed(reader)
    stream = status("application_name", "reporting-job") + SET_DONE + RESULT
    assert server(relay, stream, "5") == (stream, b"")
    assert relay.ending is None and relay.state.server_params["application_name"] == "reporting-job"


def test_a_role_default_application_name_reported_at_login_is_checked_too():
    """ALTER ROLE ... SET application_name: the server reports a name the startup packet did not carry."""
    params = {"user": "host", "database": "app"}
    relay = Relay(Stats(), claim=Claim(SECRET, 2, 1 << 20), identity=Identity(params, 2, rules))
    to_client, to_server = server(relay, AUTH_OK + status("application_name", "v1-host") + READY)
    assert relay.ending.kind == "identity_changed" and to_server == b""
