"""A major-2 level that names its run by a parameter or a constant reads ``events_m2_run(<that>)`` (ADR 0015
decision 7): the generated text, and the shapes that keep the plain view."""
from __future__ import annotations

import pytest

from proxy.config import HostConfig
from proxy.readpath.classify import Classifier

RUN = "openwop_seat.events_m2_run"


def rewritten(sql: str, major: int = 2, run_function: bool = True) -> str:
    plan = Classifier(HostConfig(), major, run_function=run_function).classify(sql)
    assert plan.refused is None, plan
    return plan.text


@pytest.mark.parametrize("sql, call, alias", [
    ("SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence ASC LIMIT $3", "($1)", "events"),
    ("SELECT * FROM events WHERE $1 = run_id", "($1)", "events"),
    ("SELECT type FROM events e WHERE e.run_id = 'r1'", "('r1')", "e"),
    ("SELECT e.type FROM events e JOIN runs r USING (event_id) WHERE e.run_id = $1::text", "(CAST($1 AS text))", "e"),
    ("SELECT payload FROM public.events WHERE public.events.run_id = $1 AND type <> 'x'", "($1)", "events"),
    ("SELECT count(*) FROM (SELECT type FROM events WHERE run_id = $1) q", "($1)", "events"),
])
def test_a_level_that_names_its_run_reads_the_per_run_function(sql, call, alias):
    text = rewritten(sql)
    assert f"{RUN}{call} AS {alias}" in text, text
    assert "events_m2 " not in text and "events_m2)" not in text, text


@pytest.mark.parametrize("sql", [
    "SELECT * FROM events WHERE run_id = $1 OR sequence = 0",  # not a conjunct at the top
    "SELECT * FROM events WHERE run_id IN ($1, $2)",
    "SELECT * FROM events e JOIN runs r ON r.run_id = e.run_id WHERE r.run_id = $1",  # the other table's column
    "SELECT * FROM events WHERE run_id = node_id",  # not a parameter or a constant
    "SELECT * FROM events e, events f WHERE e.run_id = $1 AND f.run_id = $1",  # two references at the level
    "SELECT * FROM events AS e(a, b) WHERE e.run_id = $1",  # columns renamed
    "SELECT * FROM events e JOIN runs r USING (event_id) WHERE run_id = $1",  # unqualified, not alone
    "SELECT * FROM events WHERE run_id = NULL",
    "SELECT * FROM events WHERE run_id OPERATOR(pg_catalog.=) $1",
])
def test_other_shapes_keep_the_view(sql):
    text = rewritten(sql)
    assert RUN not in text and "openwop_seat.events_m2" in text, text


def test_only_major_2_with_the_function_installed():
    sql = "SELECT * FROM events WHERE run_id = $1"
    assert RUN not in rewritten(sql, run_function=False)
    assert RUN not in rewritten(sql, major=1)
    assert "openwop_seat.events_m1" in rewritten(sql, major=1)


def test_a_level_that_reads_no_translated_column_keeps_the_keys_view():
    text = rewritten("SELECT max(sequence) FROM events WHERE run_id = $1")
    assert RUN not in text and "openwop_seat.events_keys" in text, text


# --- a run's page: the store's arm and the live arm, each cut at the page's limit (ADR 0015, page plans) -----

PAGE_ARMS = ("openwop_seat.events_v2_filled AS {a} WHERE {w} ORDER BY {o} LIMIT {l})",
             "openwop_seat.events_m2_run_live({k}) AS {a} WHERE {w} ORDER BY {o} LIMIT {l})")


def paged(sql: str) -> str:
    plan = Classifier(HostConfig(), 2, run_function=True, page_function=True).classify(sql)
    assert plan.refused is None, plan
    return plan.text


@pytest.mark.parametrize("sql, a, w, o, lim, k", [
    ("SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence ASC LIMIT $3",
     "events", "run_id = $1 AND sequence > $2", "sequence ASC", "$3", "$1"),
    ("SELECT * FROM events e WHERE $2 < e.sequence AND e.run_id = 'r1' ORDER BY e.sequence LIMIT 100",
     "e", "$2 < e.sequence AND e.run_id = 'r1'", "e.sequence", "100", "'r1'"),
    ("SELECT event_id, e.type FROM events AS e WHERE e.run_id = $1::text AND sequence > 0 ORDER BY sequence LIMIT $2",
     "e", "e.run_id = CAST($1 AS text) AND sequence > 0", "sequence", "$2", "CAST($1 AS text)"),
])
def test_a_runs_page_reads_the_two_arms_each_with_the_pages_clauses(sql, a, w, o, lim, k):
    text = paged(sql)
    for arm in PAGE_ARMS:
        assert arm.format(a=a, w=w, o=o, l=lim, k=k) in text, text
    assert "UNION ALL" in text and "events_m2_run(" not in text, text
    # above the union, the level's ORDER BY and LIMIT; its WHERE only the search_path guard, asked once (each arm
    # has the page's WHERE already: the level's own copy would test every merged row again)
    assert text.endswith(f") AS {a} WHERE (SELECT openwop_seat.events_named('events')) ORDER BY {o} LIMIT {lim}"), \
        text


def test_a_page_of_the_qualified_table_has_no_where_above_its_union():
    text = paged("SELECT * FROM public.events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3")
    for arm in PAGE_ARMS:
        assert arm.format(a="events", w="run_id = $1 AND sequence > $2", o="sequence", l="$3", k="$1") in text, text
    assert text.endswith(") AS events ORDER BY sequence LIMIT $3") and "events_named" not in text, text


def test_a_guard_outside_a_page_stays_a_plain_call():
    text = paged("SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence DESC LIMIT $3")
    assert "AND openwop_seat.events_named('events')" in text and "(SELECT openwop_seat.events_named" not in text, text


@pytest.mark.parametrize("sql", [
    "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence DESC LIMIT $3",
    "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence NULLS FIRST LIMIT $3",
    "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3 OFFSET 1",
    "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence FETCH FIRST 3 ROWS WITH TIES",
    "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence",  # no limit
    "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 LIMIT $3",  # no order
    "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence, type LIMIT $3",
    "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 AND type <> 'x' ORDER BY sequence LIMIT $3",
    "SELECT * FROM events WHERE run_id = $1 AND sequence >= $2 ORDER BY sequence LIMIT $3",
    "SELECT * FROM events WHERE run_id = $1 AND sequence > node_id ORDER BY sequence LIMIT $3",
    "SELECT * FROM events WHERE run_id = $1 ORDER BY sequence LIMIT $3",
    "SELECT DISTINCT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3",
    "SELECT *, generate_series(1, 2) FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3",
    "SELECT count(*) FROM events WHERE run_id = $1 AND sequence > $2 LIMIT $3",
    "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT (SELECT 3)",
    "SELECT * FROM events e JOIN runs r USING (run_id) WHERE e.run_id = $1 AND sequence > $2 "
    "ORDER BY sequence LIMIT $3",
    "SELECT * FROM public.events WHERE public.events.run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3",
])
def test_other_levels_that_name_their_run_keep_the_per_run_function(sql):
    text = paged(sql)
    assert "events_m2_run_live" not in text and "events_v2_filled" not in text, text


def test_the_page_form_only_with_its_function_installed():
    sql = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence ASC LIMIT $3"
    assert "events_m2_run_live" not in rewritten(sql)  # run_function only: a database migrated before it
    assert "events_m2_run_live" not in Classifier(HostConfig(), 2, page_function=True).classify(sql).text
