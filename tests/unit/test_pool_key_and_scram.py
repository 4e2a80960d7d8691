"""Pooled server connections' pure parts (ADR 0016): the [pool] keys, the pool key, the SCRAM exchange at the seat
(against a client written here from RFC 5802, with PostgreSQL's verifier format), the secrets a pool takes, and the
hand-over's login bytes."""

from __future__ import annotations

import hmac
import struct

import pytest
import scram_client

from proxy.config import Config, ConfigError, parse_config
from proxy.serve.pool import _LOGIN_STATUS, LOGIN_STATUS_KEPT, Pool, login_status
from proxy.serve.scram import ScramServer, _decoded, _Hmac, _hmac_for, scram_keys, scram_secret
from proxy.wire.codec import ProtocolViolation


def test_pool_is_off_by_default():
    config = parse_config({})
    assert config.pool.enabled is False and config.pool.auth_file is None
    assert Config().pool.pool_size == 20


def test_pool_keys_are_checked_all_at_once(tmp_path):
    with pytest.raises(ConfigError) as e:
        parse_config({"pool": {"enabled": "yes", "pool_size": 0, "max_db_connections": -1,
                               "server_idle_timeout": "1", "server_lifetime": -2, "query_wait_timeout": True,
                               "server_check_delay": -0.5,
                               "auth_file": str(tmp_path / "missing.txt"), "reset_query": "x"}})
    text = str(e.value)
    for key in ("pool.enabled", "pool.pool_size", "pool.max_db_connections", "pool.server_idle_timeout",
                "pool.server_lifetime", "pool.query_wait_timeout", "pool.server_check_delay", "pool.auth_file",
                "unknown key pool.reset_query"):
        assert key in text, key
    assert text.startswith("9 errors")


@pytest.mark.parametrize("value", ["30", None, [1], float("nan")])
def test_server_check_delay_is_a_number_of_seconds(value):
    with pytest.raises(ConfigError, match="pool.server_check_delay"):
        parse_config({"pool": {"server_check_delay": value}})


def test_server_check_delay_defaults_to_pgbouncers_and_takes_zero():
    assert Config().pool.server_check_delay == 30.0
    assert parse_config({"pool": {"server_check_delay": 0}}).pool.server_check_delay == 0.0
    assert parse_config({"pool": {"server_check_delay": 2.5}}).pool.server_check_delay == 2.5


@pytest.mark.parametrize("value", ["0.005", None, -0.001, 10.5, float("nan")])
def test_server_reset_delay_is_a_number_of_seconds_up_to_ten(value):
    with pytest.raises(ConfigError, match="pool.server_reset_delay"):
        parse_config({"pool": {"server_reset_delay": value}})


def test_server_reset_delay_defaults_to_five_milliseconds_and_takes_zero_and_ten():
    assert Config().pool.server_reset_delay == 0.005
    assert parse_config({"pool": {"server_reset_delay": 0}}).pool.server_reset_delay == 0.0
    assert parse_config({"pool": {"server_reset_delay": 10}}).pool.server_reset_delay == 10.0


def test_enabled_needs_an_auth_file(tmp_path):
    with pytest.raises(ConfigError, match="pool.auth_file or pool.auth_query: one is required"):
        parse_config({"pool": {"enabled": True}})
    query = "SELECT rolpassword FROM pg_authid WHERE rolname = $1"
    assert parse_config({"pool": {"enabled": True, "auth_query": query + ";"}}).pool.auth_query == query
    users = tmp_path / "users.txt"
    users.write_text("")
    config = parse_config({"pool": {"enabled": True, "auth_file": str(users), "pool_size": 3}})
    assert config.pool.enabled and config.pool.auth_file == str(users) and config.pool.pool_size == 3


@pytest.mark.parametrize("query", ["SELECT passwd FROM pg_shadow", "SELECT 1; SELECT $1", "SELECT $1, $2", "", 7])
def test_auth_query_is_one_statement_with_the_user_as_1(query):
    with pytest.raises(ConfigError, match="pool.auth_query"):
        parse_config({"pool": {"auth_query": query}})


def test_a_pool_takes_only_scram_verifiers(tmp_path):
    users = tmp_path / "users.txt"
    users.write_text(f'"a" "{scram_secret("pw")}"\n"b" "md5{"0" * 32}"\n"c" "plain-text"\n')
    config = parse_config({"pool": {"enabled": True, "auth_file": str(users)}})
    assert set(Pool.load_secrets(config)) == {"a"}
    users.write_text('"a" "SCRAM-SHA-256$4096:bad"\n')
    with pytest.raises(ConfigError, match="malformed"):
        Pool.load_secrets(config)
    assert Pool.load_secrets(parse_config({})) == {}  # off: no file read


def test_the_pool_key_holds_user_database_major_and_every_other_parameter():
    base = {"user": "u", "database": "d", "application_name": "app", "options": "-c work_mem=4MB"}
    key = Pool.key_for(base, 2)
    assert key.user == "u" and key.database == "d" and key.major == 2
    assert key != Pool.key_for(base, 1)
    assert key != Pool.key_for({**base, "user": "v"}, 2)
    assert key != Pool.key_for({**base, "application_name": "other"}, 2)
    assert key != Pool.key_for({**base, "options": ""}, 2)
    assert key == Pool.key_for(dict(reversed(list(base.items()))), 2)  # the order of the packet does not matter


def _client(password: str, server: ScramServer, nonce: str = "rOprNGfwEbeRWgbNEkqO", tamper=None):
    """RFC 5802's client side: returns (the server's final message or None, the expected server signature)."""
    assert server.start()[5:9] == struct.pack("!I", 10)
    first, bare = scram_client.initial_response(nonce)
    server_first = server.client_first(first)[9:].decode()
    final, expected = scram_client.final_message(password, bare, server_first, nonce)
    if tamper is not None:
        final = tamper(final)
    return server.client_final(final.encode()), expected


def test_scram_at_the_seat_accepts_the_right_password_and_proves_itself():
    answer, expected = _client("pencil", ScramServer(scram_secret("pencil")))
    assert answer is not None and answer[5:9] == struct.pack("!I", 12)
    assert answer[9:].decode() == f"v={expected}"


@pytest.mark.parametrize("secret", [scram_secret("pencil"), None])
def test_scram_at_the_seat_refuses_a_wrong_password_and_an_unknown_user(secret):
    answer, _ = _client("not-pencil" if secret else "pencil", ScramServer(secret))
    assert answer is None


@pytest.mark.parametrize("tamper", [
    lambda f: f.replace(",p=", ",p=AAAA"),  # a proof of the wrong length
    lambda f: f.replace("r=", "r=x", 1),  # another nonce
    lambda f: f.replace("c=biws", "c=eSws"),  # another GS2 header (channel binding claimed)
    lambda f: f.rpartition(",p=")[0],  # no proof
    lambda f: f + "!",  # not base64
])
def test_scram_at_the_seat_refuses_a_tampered_final_message(tamper):
    answer, _ = _client("pencil", ScramServer(scram_secret("pencil")), tamper=tamper)
    assert answer is None


def test_scram_at_the_seat_refuses_another_mechanism_and_a_final_before_a_first():
    server = ScramServer(scram_secret("pencil"))
    with pytest.raises(ProtocolViolation):
        server.client_first(b"SCRAM-SHA-256-PLUS\x00" + struct.pack("!i", 4) + b"p=x,")
    with pytest.raises(ProtocolViolation):
        server.client_first(b"SCRAM-SHA-256\x00" + struct.pack("!i", 9) + b"p=tls,,x")  # channel binding asked
    assert ScramServer(scram_secret("pencil")).client_final(b"c=biws,r=abc,p=AAAA") is None


def _messages(data: bytes) -> list[tuple[bytes, bytes]]:
    out = []
    while data:
        (length,) = struct.unpack("!I", data[1:5])
        out.append((data[:1], data[5:1 + length]))
        data = data[1 + length:]
    return out


def test_a_hand_over_login_holds_authentication_ok_and_every_parameter_status():
    params = {"server_version": "16.1", "application_name": "pgbench", "TimeZone": "UTC"}
    assert _messages(login_status(params)) == [
        (b"R", struct.pack("!I", 0)), (b"S", b"server_version\x0016.1\x00"),
        (b"S", b"application_name\x00pgbench\x00"), (b"S", b"TimeZone\x00UTC\x00")]


def test_the_login_bytes_are_made_once_and_never_outlive_a_changed_parameter_status():
    params = {"application_name": "a", "TimeZone": "UTC"}
    first = login_status(params)
    assert login_status(dict(params)) is first  # the same values: the bytes made for them, not made again
    params["TimeZone"] = "Europe/Berlin"  # a ParameterStatus the reset or the last session reported
    changed = login_status(params)
    assert changed != first and (b"S", b"TimeZone\x00Europe/Berlin\x00") in _messages(changed)
    params["application_name"] = "b"
    assert (b"S", b"application_name\x00b\x00") in _messages(login_status(params))
    del params["application_name"]  # one fewer (the dict a session leaves behind is its own)
    assert _messages(login_status(params)) == [(b"R", struct.pack("!I", 0)), (b"S", b"TimeZone\x00Europe/Berlin\x00")]


def test_the_login_bytes_kept_are_bounded():
    for i in range(LOGIN_STATUS_KEPT * 3):
        login_status({"application_name": f"app-{i}"})
    assert len(_LOGIN_STATUS) <= LOGIN_STATUS_KEPT


def test_a_verifier_is_decoded_once_and_a_password_in_plain_text_is_never_kept():
    secret = scram_secret("pencil")
    assert scram_keys(secret) is scram_keys(secret)  # decoded once: a hand-over does not decode it again
    before = _decoded.cache_info().currsize
    assert scram_keys("pencil") is None and scram_keys("md5" + "0" * 32) is None
    assert _decoded.cache_info().currsize == before  # what is not a verifier is not remembered
    assert scram_keys("SCRAM-SHA-256$4096:bad") is None


@pytest.mark.parametrize("key_length", [0, 1, 32, 63, 64, 65, 200])
def test_the_exchange_s_hmac_is_hmac_sha256(key_length):
    key = bytes(range(256))[:key_length] if key_length <= 256 else b""
    for message in (b"", b"n=,r=abc,r=abcdef,s=c2FsdA==,i=4096,c=biws,r=abcdef", bytes(1000)):
        assert _Hmac(key).digest(message) == hmac.digest(key, message, "sha256")
    mac = _hmac_for(key)
    assert mac.digest(b"one") == hmac.digest(key, b"one", "sha256")
    assert mac.digest(b"two") == hmac.digest(key, b"two", "sha256")  # the states it keeps are not worn by a use
