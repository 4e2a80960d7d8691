"""A translated session is parsed as PostgreSQL parses it: never in a client-only encoding (issue 23, item 3).

In SJIS, BIG5, GBK, GB18030, JOHAB (and UHC) a character may contain the byte of a backslash, so the seat (which
reads UTF-8) and PostgreSQL would end a string literal at different places. Such sessions are refused with
client_encoding_refused (OW009): at startup, by SET / SET NAMES / set_config, and when the server reports such
an encoding (a role's default, or a change the seat could not see). Raw sessions are relayed as they are.
"""

from __future__ import annotations

import uuid

import pytest
from rawpg import RawConn, error_fields, msg, query, startup

CLIENT_ONLY = ["SJIS", "BIG5", "GBK", "GB18030", "JOHAB", "UHC"]
# E'<0x95 0x5c>\' , type FROM events --': in SJIS the literal ends after the backslash that is the character's
# second byte, and `type FROM events` is SQL; in UTF-8 (as the seat reads it) it is all one literal.
ATTACK = b"SELECT E'\x95\\' , type FROM events --'"


@pytest.fixture(scope="module")
def enc_seat(start_seat):
    return start_seat(proxy={"clients": [{"application_name": "v1-host", "major": 1},
                                         {"application_name": "ops", "major": "raw"}]})


def app(major) -> str:
    return {1: "v1-host", 2: "v2-host", "raw": "ops"}[major]


def login(seat, major, **params) -> tuple[RawConn, list]:
    c = RawConn(seat.port)
    c.send(startup({"user": "postgres", "database": "postgres",
                                        "application_name": app(major), **params}))
    out = []
    while True:
        try:
            m = c.read_message()
        except EOFError:
            return c, out
        out.append(m)
        if m[0] in (b"Z",) or (m[0] == b"E" and error_fields(m[1]).get("S") == "FATAL"):
            return c, out


def errors(messages) -> list[dict]:
    return [error_fields(b) for t, b in messages if t == b"E"]


def show_encoding(c: RawConn) -> str:
    c.send(query("SHOW client_encoding"))
    out = c.read_until(b"Z")
    rows = [b for t, b in out if t == b"D"]
    return rows[0][6:].decode()


@pytest.mark.parametrize("major", [1, 2])
@pytest.mark.parametrize("enc", CLIENT_ONLY)
def test_startup_in_a_client_only_encoding_is_refused(enc_seat, major, enc):
    c, out = login(enc_seat, major, client_encoding=enc)
    (e,) = errors(out)
    assert e["S"] == "FATAL" and e["C"] == "OW009" and e["M"].startswith("client_encoding_refused:"), e
    assert enc in e["M"]
    assert not any(t == b"Z" for t, _ in out)
    c.close()


@pytest.mark.parametrize("major", [1, 2])
def test_startup_options_spelling_is_refused_too(enc_seat, major):
    c, out = login(enc_seat, major, options="-c client_encoding=sjis")
    (e,) = errors(out)
    assert e["C"] == "OW009", e
    c.close()


@pytest.mark.parametrize("major", [1, 2])
@pytest.mark.parametrize("enc", CLIENT_ONLY)
@pytest.mark.parametrize("how", ["SET client_encoding TO '{}'", "SET NAMES '{}'", "SET LOCAL client_encoding = {}",
                                 "SELECT set_config('client_encoding', '{}', false)"])
def test_set_to_a_client_only_encoding_is_refused(enc_seat, major, enc, how):
    c, out = login(enc_seat, major)
    assert not errors(out)
    c.send(query(how.format(enc)))
    out = c.read_until(b"Z")
    (e,) = errors(out)
    assert e["S"] == "ERROR" and e["C"] == "OW009" and e["M"].startswith("client_encoding_refused:"), e
    assert show_encoding(c) == "UTF8"  # not run: the session goes on in its encoding
    c.close()


@pytest.mark.parametrize("major", [1, 2])
def test_set_with_a_value_the_seat_cannot_see_is_refused(enc_seat, major):
    c, _ = login(enc_seat, major)
    c.send(msg(b"P", b"\0SELECT set_config('client_encoding', $1, false)\0\0\0")
           + msg(b"B", b"\0\0\0\0\0\x01\0\0\0\x04SJIS\0\0") + msg(b"E", b"\0\0\0\0\0") + msg(b"S"))
    out = c.read_until(b"Z")
    (e,) = errors(out)
    assert e["C"] == "OW009", e
    assert show_encoding(c) == "UTF8"
    c.close()


@pytest.mark.parametrize("major", [1, 2])
def test_the_attack_string_is_refused_in_one_query(enc_seat, major):
    c, _ = login(enc_seat, major)
    c.send(msg(b"Q", b"SET client_encoding TO 'SJIS'; " + ATTACK + b"\0"))
    out = c.read_until(b"Z")
    assert [e["C"] for e in errors(out)] == ["OW009"]
    assert not any(t == b"D" for t, _ in out)  # nothing of the events table
    assert show_encoding(c) == "UTF8"
    c.close()


@pytest.mark.parametrize("major", [1, 2])
def test_the_attack_string_is_refused_in_a_pipeline(enc_seat, major):
    c, _ = login(enc_seat, major)
    c.send(msg(b"P", b"\0SET client_encoding TO 'SJIS'\0\0\0") + msg(b"B", b"\0\0\0\0\0\0\0") + msg(b"E", b"\0\0\0\0\0")
           + msg(b"P", b"\0" + ATTACK + b"\0\0\0") + msg(b"B", b"\0\0\0\0\0\0\0") + msg(b"E", b"\0\0\0\0\0")
           + msg(b"S"))
    out = c.read_until(b"Z")
    assert [e["C"] for e in errors(out)] == ["OW009"]  # PostgreSQL skips the rest of the pipeline
    assert not any(t == b"D" for t, _ in out)
    assert show_encoding(c) == "UTF8"
    c.close()


@pytest.mark.parametrize("major", [1, 2])
def test_a_change_the_seat_cannot_see_ends_the_session_at_the_servers_report(enc_seat, major):
    c, _ = login(enc_seat, major)
    # the setting's name is not a constant: the seat passes it; PostgreSQL reports the new encoding
    c.send(query("SELECT set_config(name, 'SJIS', false) FROM pg_settings WHERE name = 'client_encoding'"))
    out = c.read_all_until_closed()
    fatal = [e for e in errors(out) if e.get("S") == "FATAL"]
    assert [e["C"] for e in fatal] == ["OW009"] and "SJIS" in fatal[0]["M"]
    # nothing after the server's report reaches the client: no ParameterStatus, no ReadyForQuery
    assert not any(t in (b"S", b"Z") for t, _ in out)
    c.close()


@pytest.mark.parametrize("major", [1, 2])
def test_a_roles_default_encoding_is_refused_at_login(enc_seat, pg, major):
    role = f"enc_{uuid.uuid4().hex[:8]}"
    pg.psql(f"CREATE ROLE {role} LOGIN; GRANT SELECT ON events TO {role}; "
            f"ALTER ROLE {role} SET client_encoding = 'BIG5'")
    try:
        c = RawConn(enc_seat.port)
        c.send(startup({"user": role, "database": "postgres", "application_name": app(major)}))
        out = c.read_all_until_closed()
        fatal = [e for e in errors(out) if e.get("S") == "FATAL"]
        assert [e["C"] for e in fatal] == ["OW009"] and "BIG5" in fatal[0]["M"], out
        assert not any(t == b"Z" for t, _ in out)
        c.close()
    finally:
        pg.psql(f"REVOKE ALL ON events FROM {role}; DROP ROLE {role}")


@pytest.mark.parametrize("enc", CLIENT_ONLY)
def test_raw_sessions_are_relayed_in_any_encoding(enc_seat, enc):
    c, out = login(enc_seat, "raw", client_encoding=enc)
    assert not errors(out) and out[-1][0] == b"Z"
    assert show_encoding(c) == enc
    c.send(query("SET client_encoding TO 'UTF8'"))
    assert not errors(c.read_until(b"Z"))
    c.send(query(f"SET client_encoding TO '{enc}'"))
    assert not errors(c.read_until(b"Z"))
    c.close()


@pytest.mark.parametrize("major", [1, 2])
@pytest.mark.parametrize("enc", ["UTF8", "LATIN1", "WIN1252", "EUC_JP"])
def test_server_encodings_are_fine(enc_seat, major, enc):
    c, out = login(enc_seat, major, client_encoding=enc)
    assert not errors(out) and out[-1][0] == b"Z"
    assert show_encoding(c) == enc
    c.send(query("SELECT count(*) FROM events"))
    assert not errors(c.read_until(b"Z"))
    c.send(query("SET client_encoding TO 'UTF8'; SELECT set_config('client_encoding', 'LATIN1', false)"))
    assert not errors(c.read_until(b"Z"))
    assert show_encoding(c) == "LATIN1"
    c.close()


@pytest.mark.parametrize("major", [1, 2])
def test_latin1_text_over_the_events_table_is_translated(enc_seat, major):
    c, _ = login(enc_seat, major, client_encoding="LATIN1")
    # 0xe9 is é in LATIN1 and not UTF-8: the seat analyses the statement with it kept as it came
    # (one run only: other tests leave era-2 rows whose type a major-2 read refuses)
    c.send(msg(b"Q", b"SELECT '\xe9t\xe9' AS word, count(type) FROM events WHERE run_id = 'enc-latin1'; "
                     b"SELECT '\xe9' || type FROM events LIMIT 0\0"))
    out = c.read_until(b"Z")
    assert not errors(out), errors(out)
    rows = [b for t, b in out if t == b"D"]
    assert rows[0][6:9] == b"\xe9t\xe9"
    c.send(msg(b"Q", b"SET client_encoding TO 'SJIS'; SELECT '\xe9', type FROM events\0"))
    out = c.read_until(b"Z")
    assert [e["C"] for e in errors(out)] == ["OW009"]
    c.close()
