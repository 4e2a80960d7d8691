"""proxy.wire.startup: startup parameters read as PostgreSQL reads them, and the seat's allowlist (ADR 0006)."""

from __future__ import annotations

import pytest

from proxy.wire.startup import ALLOWED_SETTINGS, StartupRefused, option_settings, parse_startup, split_options


@pytest.mark.parametrize("options, words", [
    ("", []),
    ("   ", []),
    ("-c a=b", ["-c", "a=b"]),
    ("  -c\ta=b \n --x=y ", ["-c", "a=b", "--x=y"]),
    (r"-c search_path=a\ b", ["-c", "search_path=a b"]),
    (r"-c openwop\_seat.major=2", ["-c", "openwop_seat.major=2"]),  # the backslash escapes the next character
    (r"a\\b", [r"a\b"]),
    ("a\\", ["a"]),  # a trailing backslash escapes nothing
])
def test_split_options_is_pg_split_opts(options, words):
    assert split_options(options) == words


@pytest.mark.parametrize("options, settings", [
    ("-c search_path=x", [("search_path", "x")]),
    ("-csearch_path=x", [("search_path", "x")]),
    ("--search-path=x", [("search_path", "x")]),  # '-' in the name reads as '_'
    ("-c statement-timeout=5", [("statement_timeout", "5")]),
    ("-c a=b=c", [("a", "b=c")]),
    ("-c a=", [("a", "")]),
    ("-c x=1 --y=2", [("x", "1"), ("y", "2")]),
])
def test_option_settings_reads_c_and_double_dash(options, settings):
    assert option_settings(options) == settings


@pytest.mark.parametrize("options, sqlstate, fragment", [
    ("-c", "42601", "-c requires an argument"),
    ("-c name", "42601", "-c name requires a value"),
    ("--name", "42601", "--name requires a value"),
    ("-d 5", "42501", "the switch -d is not allowed"),  # debug level: not through the seat
    ("-e", "42501", "the switch -e is not allowed"),
    ("-ec a=b", "42501", "the switch -e is not allowed"),
    ("-x", "42601", "invalid switch -x"),
    ("dbname", "42601", "invalid command-line argument 'dbname'"),
    ("-c a=b --", "42601", "invalid command-line argument '--'"),
])
def test_option_settings_refuses_what_postgresql_would_not_read_or_the_seat_does_not_allow(options, sqlstate,
                                                                                        fragment):
    with pytest.raises(StartupRefused) as info:
        option_settings(options)
    assert info.value.sqlstate == sqlstate
    assert fragment in str(info.value)


@pytest.mark.parametrize("params", [
    {"user": "u", "openwop_seat.major": "2"},
    {"user": "u", "OpenWOP_Seat.Major": "2"},
    {"user": "u", "options": "-c openwop_seat.major=2"},
    {"user": "u", "options": r"-c openwop\_seat.major=2"},
    {"user": "u", "options": r"-copenwop_seat.major=2"},
    {"user": "u", "options": "--openwop-seat.major=2"},
    {"user": "u", "options": "--OPENWOP_SEAT.major=2"},
    {"user": "u", "options": "-c search_path=x -c openwop_seat.major=2"},
    {"user": "u", "options": "-c search_path=x", "openwop_seat.rewrite_run": "r"},
])
def test_openwop_seat_settings_are_refused_however_spelled(params):
    with pytest.raises(StartupRefused) as info:
        parse_startup(params)
    assert info.value.sqlstate == "42501"
    assert "openwop_seat.* settings belong to the seat" in str(info.value)


@pytest.mark.parametrize("name", ["log_parameter_max_length_on_error", "client_min_messages", "debug_print_plan",
                                  "log_statement", "session_replication_role", "work_mem", "row_security"])
def test_settings_outside_the_allowlist_are_refused_as_parameter_and_as_option(name):
    for params in ({"user": "u", name: "1"}, {"user": "u", "options": f"-c {name}=1"},
                   {"user": "u", "options": f"--{name.replace('_', '-')}=1"}):
        with pytest.raises(StartupRefused) as info:
            parse_startup(params)
        assert info.value.sqlstate == "42501"
        assert "may not be given at startup through openwop-seat" in str(info.value)


def test_allowed_settings_pass_in_postgresql_order():
    params = {"user": "u", "database": "d", "application_name": "a", "options": "-c search_path=s --TimeZone=UTC",
              "client_encoding": "UTF8", "DateStyle": "ISO", "_pq_.something": "x"}
    s = parse_startup(params)
    assert (s.user, s.database) == ("u", "d")
    assert s.settings == [("search_path", "s"), ("TimeZone", "UTC"), ("application_name", "a"),
                          ("client_encoding", "UTF8"), ("DateStyle", "ISO")]
    assert {"application_name", "search_path", "timezone", "datestyle", "client_encoding"} <= ALLOWED_SETTINGS


@pytest.mark.parametrize("params, database", [
    ({"user": "alice"}, "alice"),
    ({"user": "alice", "database": ""}, "alice"),  # empty: the database named like the user, as PostgreSQL does
    ({"user": "alice", "database": "db"}, "db"),
    ({"user": "alice", "database": "d" * 70}, "d" * 63),  # NAMEDATALEN - 1
])
def test_the_database_is_the_one_postgresql_connects_to(params, database):
    assert parse_startup(params).database == database


@pytest.mark.parametrize("params, sqlstate", [({"database": "d"}, "28000"), ({"user": ""}, "28000"),
                                              ({"user": "u", "replication": "database"}, "08P01")])
def test_no_user_and_replication_are_refused(params, sqlstate):
    with pytest.raises(StartupRefused) as info:
        parse_startup(params)
    assert info.value.sqlstate == sqlstate
