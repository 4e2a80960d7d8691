"""client_encoding as the seat checks it (proxy/readpath/encoding.py): pure code."""

from __future__ import annotations

import pytest

from proxy.config import HostConfig
from proxy.readpath import encoding
from proxy.readpath.classify import PASS, REFUSE, Classifier

CLIENT_ONLY_SPELLINGS = ["SJIS", "sjis", "Shift_JIS", "MSKANJI", "WIN932", "SHIFT_JIS_2004", "BIG5", "WIN950", "GBK",
                         "CP936", "WIN936", "GB18030", "JOHAB", "UHC", "WIN949", "nonsense"]
SERVER_SPELLINGS = ["UTF8", "utf-8", "Unicode", "LATIN1", "ISO_8859_1", "WIN1252", "EUC_JP", "EUC_JIS_2004", "KOI8R",
                    "SQL_ASCII", "MULE_INTERNAL", "ISO_8859_5", "LATIN10", "WIN866"]


@pytest.mark.parametrize("name", CLIENT_ONLY_SPELLINGS)
def test_client_only_encodings_and_unknown_names_are_refused(name):
    assert encoding.refusal(name) is not None and "client_encoding" in encoding.refusal(name)


@pytest.mark.parametrize("name", SERVER_SPELLINGS)
def test_server_encodings_are_fine(name):
    assert encoding.refusal(name) is None


@pytest.mark.parametrize("sql", [
    "SET client_encoding TO 'SJIS'", "SET NAMES 'big5'", "set local CLIENT_ENCODING = gbk",
    "SET SESSION client_encoding = 'GB18030'", "SELECT set_config('client_encoding', 'JOHAB', false)",
    "SELECT pg_catalog.set_config('Client_Encoding', 'UHC', true)", "SELECT set_config('client_encoding', $1, false)",
    "SET client_encoding = 'UTF8'; SET client_encoding = 'WIN932'",
])
def test_statements_that_set_a_client_only_encoding_are_refused(sql):
    plan = Classifier(HostConfig(), 2).classify(sql)
    assert plan.refused is not None and plan.refused.kind == encoding.ERROR_CODE


@pytest.mark.parametrize("sql", [
    "SET client_encoding TO 'UTF8'", "SET NAMES 'LATIN1'", "SET client_encoding TO DEFAULT", "RESET client_encoding",
    "SELECT set_config('search_path', $1, false)", "SELECT names FROM t", "SELECT 'encoding'",
    "SET client_encoding TO", "SELECT set_config(name, 'SJIS', false) FROM pg_settings",  # not a constant name
])
def test_other_statements_pass(sql):
    plan = Classifier(HostConfig(), 2).classify(sql)
    assert plan.refused is None and plan.statements[0].action == PASS


def test_only_the_setting_statement_of_a_query_is_refused():
    plan = Classifier(HostConfig(), 1).classify("SELECT 1; SET client_encoding = 'SJIS'; SELECT 2")
    assert [p.action for p in plan.statements] == [PASS, REFUSE, PASS]


def test_the_attack_string_is_refused_with_the_setting_before_it():
    sql = b"SET client_encoding TO 'SJIS'; SELECT E'\x95\\' , type FROM events --'".decode("utf-8", "surrogateescape")
    plan = Classifier(HostConfig(), 2).classify(sql)
    assert plan.refused is not None and plan.refused.kind == encoding.ERROR_CODE


def test_text_that_is_not_utf8_is_analysed_with_its_bytes_kept():
    raw = b"SELECT '\xe9t\xe9', type FROM events WHERE x = '\xff'"
    plan = Classifier(HostConfig(), 2).classify(raw.decode("utf-8", "surrogateescape"))
    assert plan.changed and plan.refused is None
    sent = plan.text.encode("utf-8", "surrogateescape")
    assert b"'\xe9t\xe9'" in sent and b"'\xff'" in sent and b"openwop_seat.events_m2" in sent
