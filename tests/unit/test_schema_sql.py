"""The seat's schema as SQL text, without a database: quoting, the builders, the generated objects, the
fixed lock key, DSN parsing (tests/integration/test_schema.py runs them in a real PostgreSQL)."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.artifacts.load import load_artifacts
from proxy.config import HostConfig
from proxy.db.connect import parse_keyword_dsn
from proxy.db.layout import LOCK_KEY, SchemaError
from proxy.db.reader_sql import era_sql, read_check_sql
from proxy.db.sql import quote_ident, quote_literal, quote_qualified, quote_relation, relation_name, text_array_literal
from proxy.db.writer_sql import artifact_objects_sql
from proxy.errors import ERRORS

ARTIFACTS = load_artifacts()
V1_TYPE = sorted(ARTIFACTS.v1_types)[0]


def test_quoting():
    assert quote_ident("events") == '"events"'
    assert quote_ident('We"ird') == '"We""ird"'
    assert quote_qualified("events") == '"events"'
    assert quote_qualified("Host.Events") == '"Host"."Events"'
    with pytest.raises(ValueError):
        quote_qualified("a.b.c")
    assert quote_literal("it's") == "'it''s'"
    assert quote_literal("a\\b") == "E'a\\\\b'"
    assert text_array_literal({"b", "a.c-d"}) == "'{\"a.c-d\",\"b\"}'::text[]"
    assert text_array_literal({'q"x'}) == "E'{\"q\\\\\"x\"}'::text[]"
    assert text_array_literal(set()) == "'{}'::text[]"


@pytest.mark.parametrize("name, table", [
    ("events", "events"), ("public.events", "events"), ('"public"."events"', "events"),
    ('"a.b"."x""y"', 'x"y'), ('"""q"', '"q'), ('"Host"."Events"', "Events"), ('"a"."b.c"', "b.c"),
])
def test_relation_name_is_the_tables_own_name_unquoted(name, table):
    assert relation_name(name) == table
    assert relation_name(quote_relation(name)) == table  # the form the generators pass


def test_relation_name_refuses_an_unbalanced_quote():
    with pytest.raises(ValueError):
        relation_name('events"')


def test_builders():
    default = era_sql(HostConfig(), "e.run_id")
    assert default.startswith("COALESCE((SELECT openwop_seat_era.era FROM openwop_seat.run_era openwop_seat_era ")
    assert "(e.run_id)::text" in default and default.endswith("2::smallint)")
    column = era_sql(HostConfig(runs_table="app.Runs", run_id_column="Id", era_column="Era"), "x.run_id")
    assert 'FROM "app"."Runs" openwop_seat_era' in column
    assert 'openwop_seat_era."Era"' in column and 'openwop_seat_era."Id"' in column
    assert "refuse_row('event_row_malformed'" in column
    assert read_check_sql(2, "E", "T", "R", "S") == "openwop_seat.read_v2(E, (T)::text, (R)::text, (S)::bigint)"
    assert read_check_sql(1, "E", "T", "R", "S") == "openwop_seat.read_v1(E, (T)::text, (R)::text, (S)::bigint)"
    with pytest.raises(ValueError):
        read_check_sql(3, "E", "T", "R", "S")


def test_generated_sql_comes_from_the_artifacts():
    fake = dataclasses.replace(ARTIFACTS, v1_types=frozenset({"only.this-one"}),
                               vendor_orgs=frozenset({"acme", "vendor"}),
                               reserved_orgs=frozenset({"vendor"}), payload_shapes={})
    sql = artifact_objects_sql(fake, HostConfig())
    assert "'{\"only.this-one\"}'::text[]" in sql
    assert "'{\"acme\"}'::text[]" in sql  # reserved orgs are not vendor prefixes
    assert V1_TYPE not in sql
    for e in ERRORS.values():
        assert f"'{e.code}' THEN '{e.sqlstate}'" in sql


def test_lock_key_is_fixed():
    import hashlib

    expected = int.from_bytes(hashlib.sha256(b"openwop_seat.migrate").digest()[:8], "big", signed=True)
    assert LOCK_KEY == expected and -2**63 <= LOCK_KEY < 2**63


def test_keyword_dsn_parsing():
    assert parse_keyword_dsn("host=h port=5 dbname='a b' password='it\\'s' user = u") == {
        "host": "h", "port": "5", "dbname": "a b", "password": "it's", "user": "u"}
    with pytest.raises(SchemaError):
        parse_keyword_dsn("host")
