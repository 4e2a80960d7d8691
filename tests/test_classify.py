"""The SQL classifier on its own: a pure function from statement text and major to a plan (no database).

A statement passes untouched when no event type/payload value can reach the
reader through it; it is rewritten (translated) when it outputs event columns as
they are, so the seat can map them by era; and it is refused when it would let
the stored spelling of a type decide or shape the result (predicates, ordering,
grouping, expressions, copies) or reach the reader by a road the seat cannot see.
"""

from __future__ import annotations

import pytest
from pglast import ast, parse_sql

from proxy.classify import HIDDEN, PASS, REFUSE, TRANSLATE, Classifier
from proxy.config import HostConfig


def classify(sql: str, major: int = 2, host: HostConfig | None = None):
    return Classifier(host or HostConfig(), major).classify(sql)


def only(plan):
    assert len(plan.statements) == 1, plan.statements
    return plan.statements[0]


def top_targets(stmt) -> tuple:
    """The top-level output list of a statement: a SELECT's target list or a write's RETURNING list."""
    if isinstance(stmt, ast.SelectStmt):
        return tuple(stmt.targetList or ())
    returning = stmt.returningClause
    return tuple(returning.exprs or ()) if returning is not None else ()


def hidden_count(targets) -> int:
    return sum(1 for t in targets if isinstance(t, ast.ResTarget) and t.name == HIDDEN)


# ---------------------------------------------------------------- the host's own shapes

LOG_PAGE = "SELECT * FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3"
APPEND = """WITH next AS (SELECT COALESCE(MAX(sequence), 0) + 1 AS seq FROM events WHERE run_id = $1)
INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id)
SELECT $2, $1, next.seq, $3, $4, $5, $6, $7 FROM next RETURNING *"""
APPEND_COLUMNS = APPEND.replace("RETURNING *", "RETURNING event_id, run_id, sequence, type, node_id, payload, "
                                               "timestamp, causation_id")

TRANSLATED = [
    LOG_PAGE,
    APPEND,
    APPEND_COLUMNS,
    "SELECT e.type, e.sequence FROM events e WHERE e.run_id = $1 ORDER BY e.sequence",
    "SELECT type AS t, run_id FROM events WHERE run_id = ANY($1) ORDER BY run_id, sequence",
    "SELECT e.*, r.tenant_id FROM events e JOIN runs r ON r.run_id = e.run_id WHERE e.run_id = $1",
    "SELECT * FROM public.events WHERE run_id = $1",
    "SELECT * FROM events WHERE run_id = $1 ORDER BY sequence FOR UPDATE",
    "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) "
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING type, sequence",
    "UPDATE events SET node_id = $2 WHERE event_id = $1 RETURNING *",
    "DELETE FROM events WHERE run_id = $1 RETURNING event_id, type",
]

# Statements whose answers carry no event type/payload: untouched, the text sent as it came.
PASSED = [
    "SELECT COALESCE(MAX(sequence), 0) FROM events WHERE run_id = $1",
    "SELECT run_id, MAX(sequence) FROM events WHERE run_id = ANY($1) GROUP BY run_id",
    "DELETE FROM events WHERE run_id = $1",
    "SELECT count(*) FROM events WHERE run_id = $1",
    "SELECT event_id, sequence FROM events WHERE run_id = $1 ORDER BY sequence",
    "UPDATE events SET node_id = NULL WHERE run_id = $1",
    "INSERT INTO events (event_id, run_id, sequence, type, node_id, payload, timestamp, causation_id) "
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    "SELECT * FROM runs WHERE run_id = $1",
    "UPDATE runs SET status = $2 WHERE run_id = $1",
    "SELECT pg_advisory_xact_lock(hashtext($1), 1)",
    "SELECT 'events' AS word, 'SELECT type FROM events' AS sql",
    "SELECT * FROM events_archive WHERE type = 'run.started' ORDER BY type",
    "SELECT * FROM other.events WHERE type = 'x'",
    "COPY events FROM STDIN",
    "EXPLAIN SELECT * FROM events WHERE type = 'run.started'",
    "CREATE INDEX ON events (run_id, sequence)",
    "BEGIN",
    "",
]


@pytest.mark.parametrize("sql", TRANSLATED)
def test_host_reads_and_appends_are_translated(sql):
    plan = classify(sql)
    st = only(plan)
    assert st.action == TRANSLATE
    assert plan.translated and plan.changed and plan.refused is None
    assert plan.text == st.sql != sql


@pytest.mark.parametrize("sql", TRANSLATED)
@pytest.mark.parametrize("major", [1, 2])
def test_rewritten_text_parses_and_carries_the_hidden_column_once_at_the_top(sql, major):
    plan = classify(sql, major)
    stmts = parse_sql(plan.text)
    assert len(stmts) == 1
    stmt = stmts[0].stmt
    assert hidden_count(top_targets(stmt)) == 1
    # the client's own output list is kept, in its order, ahead of the hidden column
    original = top_targets(parse_sql(sql)[0].stmt)
    assert len(top_targets(stmt)) == len(original) + 1
    assert top_targets(stmt)[-1].name == HIDDEN
    assert plan.text.count(HIDDEN) == 1
    # rendering the rewritten statement again gives the same text
    from pglast.stream import RawStream
    assert RawStream()(stmt) == plan.text


@pytest.mark.parametrize("sql", PASSED)
def test_statements_without_event_columns_pass_verbatim(sql):
    plan = classify(sql)
    assert not plan.changed and plan.passthrough
    assert plan.text == sql
    assert plan.refused is None and not plan.translated
    assert all(st.action == PASS for st in plan.statements)


def test_host_shape_through_a_cte_carries_the_column_inside_the_cte():
    sql = "WITH x AS (SELECT * FROM events WHERE run_id = $1) SELECT * FROM x ORDER BY sequence"
    plan = classify(sql)
    assert only(plan).action == TRANSLATE
    stmt = parse_sql(plan.text)[0].stmt
    cte = stmt.withClause.ctes[0].ctequery
    assert hidden_count(cte.targetList) == 1
    assert hidden_count(stmt.targetList) == 0  # the outer `*` brings it along
    assert plan.text.count(HIDDEN) == 1


def test_cte_with_column_list_adds_a_reference_to_the_cte_column():
    sql = "WITH x AS (SELECT * FROM events WHERE run_id = $1) SELECT x.type AS t, x.sequence FROM x"
    plan = classify(sql)
    stmt = parse_sql(plan.text)[0].stmt
    assert hidden_count(stmt.withClause.ctes[0].ctequery.targetList) == 1
    assert hidden_count(stmt.targetList) == 1
    ref = stmt.targetList[-1].val
    assert isinstance(ref, ast.ColumnRef) and [f.sval for f in ref.fields] == ["x", HIDDEN]


# ---------------------------------------------------------------- refusals

REFUSED = [
    # (statement, a word the refusal's kind must contain)
    ("SELECT * FROM events WHERE type = 'run.started'", "predicate"),
    ("SELECT * FROM events WHERE run_id = $1 AND type IN ('a', 'b')", "predicate"),
    ("SELECT e.* FROM events e JOIN runs r ON r.run_id = e.run_id AND e.type = 'x'", "join condition"),
    ("SELECT * FROM events ORDER BY type", "ORDER BY"),
    ("SELECT sequence FROM events WHERE run_id = $1 ORDER BY type, sequence", "ORDER BY"),
    ("SELECT DISTINCT type FROM events", "DISTINCT"),
    ("SELECT type, count(*) FROM events GROUP BY type", "GROUP BY"),
    ("SELECT count(DISTINCT type) FROM events", "expression"),
    ("SELECT payload->>'x' FROM events WHERE run_id = $1", "expression"),
    ("SELECT upper(type) FROM events", "expression"),
    ("COPY events TO STDOUT", "COPY"),
    ("COPY (SELECT * FROM events) TO STDOUT", "COPY"),
    ("DECLARE c CURSOR FOR SELECT * FROM events", "cursor"),
    ("SELECT a.type, b.type FROM events a JOIN events b ON a.run_id = b.run_id AND b.sequence = a.sequence + 1",
     "join"),
    ("SELECT * FROM events a, events b", "join"),
    ("SELECT * FROM events WHERE run_id = $1 UNION SELECT * FROM events WHERE run_id = $2", "set operation"),
    ("SELECT type FROM events UNION ALL SELECT 'x'", "set operation"),
    ("SELECT row_to_json(e) FROM events e", "expression"),
    ("SELECT e FROM events e", "whole-row"),
    ("INSERT INTO other SELECT type FROM events", "another table"),
    ("CREATE VIEW v AS SELECT * FROM events", "view"),
    ("CREATE TABLE t AS SELECT type FROM events", "table created"),
    ("PREPARE p AS SELECT * FROM events", "PREPARE"),
    ("SELECT (SELECT type FROM events LIMIT 1)", "subquery"),
    ("SELECT * FROM runs WHERE run_id IN (SELECT run_id FROM events WHERE type = 'run.failed')", "predicate"),
    ("WITH RECURSIVE r AS (SELECT * FROM events UNION ALL SELECT * FROM r) SELECT * FROM r", "recursive"),
    ("INSERT INTO events SELECT * FROM events WHERE run_id = $1", "copy of event rows"),
    ("SELEC * FROM events", "unparsable"),
    ("SELECT * FROM events WHERE", "unparsable"),
]


@pytest.mark.parametrize("sql, word", REFUSED)
def test_refused_with_a_meaningful_kind(sql, word):
    plan = classify(sql)
    st = only(plan)
    assert st.action == REFUSE, st
    assert word.lower() in st.kind.lower(), st.kind
    assert st.detail
    assert plan.refused == st and plan.changed and not plan.translated


def test_refusal_in_a_multi_statement_string_names_the_first_refused_statement():
    plan = classify("SELECT 1; SELECT DISTINCT type FROM events; SELECT * FROM events ORDER BY type")
    assert [st.action for st in plan.statements] == [PASS, REFUSE, REFUSE]
    assert plan.refused is plan.statements[1]
    assert "DISTINCT" in plan.refused.kind


def test_unparsable_statement_not_mentioning_events_passes():
    # nothing to protect: the server answers with its own syntax error
    sql = "SELEC 1"
    assert classify(sql).text == sql and not classify(sql).changed


# ---------------------------------------------------------------- the cache, majors, multi-statement text


def test_cache_same_text_twice_is_one_miss_and_one_hit():
    c = Classifier(HostConfig(), 2)
    first = c.classify(LOG_PAGE)
    second = c.classify(LOG_PAGE)
    assert (c.misses, c.hits) == (1, 1)
    assert second is first
    c.classify(LOG_PAGE + " ")  # another text is another entry
    assert (c.misses, c.hits) == (2, 1)


def test_cache_is_bounded_and_evicts_the_least_recently_used():
    c = Classifier(HostConfig(), 2, cache_size=2)
    c.classify("SELECT 1")
    c.classify("SELECT 2")
    c.classify("SELECT 1")  # refresh
    c.classify("SELECT 3")  # evicts SELECT 2
    c.classify("SELECT 1")
    assert (c.misses, c.hits) == (3, 2)
    c.classify("SELECT 2")
    assert c.misses == 4


@pytest.mark.parametrize("sql", [LOG_PAGE, APPEND])
def test_plans_differ_by_major(sql):
    # Both results carry the payload: major 2 projects it (read_v2p; returned_v2p, its RETURNING form, for
    # the append), major 1 passes it unchanged (read_v1).
    v2, v1 = classify(sql, 2).text, classify(sql, 1).text
    assert f"openwop_seat.{'returned_v2p' if sql == APPEND else 'read_v2p'}(" in v2 and "read_v1" not in v2
    assert "openwop_seat.read_v1(" in v1 and "read_v2" not in v1
    assert "CAST(events.payload AS jsonb)" in v2 and "payload" not in v1.split("__openwop_era")[0].split("*,")[1]


def test_major_2_projects_only_when_the_payload_leaves_the_statement():
    assert "read_v2p(" not in classify("SELECT sequence, type FROM events WHERE run_id = $1", 2).text
    assert "read_v2(" in classify("SELECT sequence, type FROM events WHERE run_id = $1", 2).text
    assert "read_v2p(" in classify("SELECT e.payload FROM events e WHERE run_id = $1", 2).text
    assert "read_v2p(" in classify("SELECT e.* FROM events e", 2).text
    # the tenant is read in the statement itself, and only for run.started rows
    text = classify("SELECT payload FROM events", 2).text
    assert "CASE WHEN events.type OPERATOR(pg_catalog.=) 'run.started' THEN (SELECT" in text


def test_multi_statement_keeps_passthrough_statements_verbatim():
    first, last = "SELECT 1 /* keep   me */", "select   'events'  ,  E'a\\nb' "
    sql = f"{first};SELECT * FROM events WHERE run_id = $1;  {last}"
    plan = classify(sql)
    assert [st.action for st in plan.statements] == [PASS, TRANSLATE, PASS]
    assert plan.statements[0].sql == first
    assert plan.statements[2].sql.strip() == last.strip()
    assert plan.text.startswith(first + "; ")
    assert plan.text.rstrip().endswith(last.strip())
    assert plan.statements[1].sql in plan.text
    assert plan.translated and plan.changed
    assert len(parse_sql(plan.text)) == 3


@pytest.mark.parametrize("sql, passed", [
    # pglast reports statement locations in characters, not UTF-8 bytes: a non-ASCII character before
    # a statement shifts its slice.  Today the first cuts the closing quote off `'é'` (the server then
    # fails the whole string with a syntax error), and the second sends `SELECT 1` for `SELECT 12`.
    ("SELECT 'é' AS a; SELECT * FROM events WHERE run_id = $1; SELECT 12 AS b",
     ["SELECT 'é' AS a", "SELECT 12 AS b"]),
    ("SELECT * FROM events WHERE node_id = 'é'; SELECT 12; SELECT 3", ["SELECT 12", "SELECT 3"]),
    ("SELECT '✓ events'; SELECT * FROM events WHERE node_id = 'ü'; SELECT '→'",
     ["SELECT '✓ events'", "SELECT '→'"]),
])
def test_multi_statement_with_non_ascii_text_keeps_passthrough_statements_verbatim(sql, passed):
    plan = classify(sql)
    assert [st.action for st in plan.statements].count(TRANSLATE) == 1
    assert [st.sql.strip() for st in plan.statements if st.action == PASS] == passed
    assert len(parse_sql(plan.text)) == len(plan.statements)


def test_all_passthrough_multi_statement_is_the_original_text():
    sql = "SELECT max(sequence) FROM events WHERE run_id = $1;\n  SELECT 'events' -- done"
    plan = classify(sql)
    assert plan.text == sql and not plan.changed


# ---------------------------------------------------------------- host layout


@pytest.mark.parametrize("sql, action", [
    ("SELECT * FROM app.events WHERE run_id = $1", TRANSLATE),
    ("SELECT * FROM events WHERE run_id = $1", TRANSLATE),
    ("SELECT * FROM other.events WHERE run_id = $1", PASS),
    ("SELECT * FROM other.events WHERE type = 'x' ORDER BY type", PASS),
    ("SELECT * FROM app.events WHERE type = 'x'", REFUSE),
])
def test_schema_qualified_events_table(sql, action):
    plan = classify(sql, host=HostConfig(events_table="app.events"))
    assert only(plan).action == action


def test_default_layout_matches_public_and_unqualified_only():
    assert only(classify("SELECT * FROM public.events")).action == TRANSLATE
    assert only(classify("SELECT * FROM events")).action == TRANSLATE
    assert only(classify("SELECT * FROM app.events")).action == PASS


def test_configured_type_column_is_the_one_protected():
    host = HostConfig(type_column="kind")
    assert only(classify("SELECT * FROM events WHERE kind = 'x'", host=host)).action == REFUSE
    plan = classify("SELECT kind, sequence FROM events WHERE run_id = $1", host=host)
    assert only(plan).action == TRANSLATE
    assert "CAST(events.kind AS text)" in plan.text


# ---------------------------------------------------------------- found by these tests: the classifier must change
#
# Each statement below lets the stored (untranslated) spelling of an event type
# reach the reader, or decide which rows it gets or in which order, yet the
# classifier passes it or translates it as if harmless.  They must be refused.

LEAKS = [
    # an expression over a type column renamed in a derived table: passed untouched, stored types reach the reader
    "SELECT upper(s.t) FROM (SELECT type AS t FROM events WHERE run_id = $1) s",
    "SELECT s.t || '' FROM (SELECT type AS t, run_id FROM events) s",
    # the same through column aliases of the table or of a CTE
    "SELECT upper(e.d) FROM events e(a, b, c, d)",
    "WITH x(a, b, c, d) AS (SELECT * FROM events) SELECT d || '' FROM x",
    # a scalar subquery over a CTE of events: no hidden column, no table origin, the stored type goes out
    "WITH x AS (SELECT * FROM events WHERE run_id = $1) SELECT (SELECT type FROM x LIMIT 1)",
    # a set operation over CTE references (the set-operation check only looks for the events table itself)
    "WITH x AS (SELECT * FROM events) SELECT * FROM (SELECT * FROM x UNION ALL SELECT * FROM x) u",
    "WITH x AS (SELECT * FROM events) SELECT u.type FROM (SELECT type FROM x UNION SELECT type FROM x) u",
    # a predicate on type inside a sub-select over a CTE
    "WITH x AS (SELECT * FROM events) SELECT * FROM runs WHERE run_id IN (SELECT run_id FROM x WHERE type = 'a')",
    # a predicate on a renamed type column of a derived table: translated, filtered by the stored spelling
    "SELECT * FROM (SELECT type AS t, run_id FROM events) s WHERE s.t = 'run.started'",
    # ordering by type, by position or by output alias: translated, ordered by the stored spelling
    "SELECT type FROM events WHERE run_id = $1 ORDER BY 1",
    "SELECT type AS t FROM events WHERE run_id = $1 ORDER BY t",
    "SELECT * FROM (SELECT type AS t, sequence FROM events) s ORDER BY s.t",
    # writes to another table joined to events: FROM/USING is never looked at
    "UPDATE runs SET status = 'done' FROM events e WHERE e.run_id = runs.run_id AND e.type = 'run.completed'",
    "UPDATE runs SET status = status FROM events e WHERE e.run_id = runs.run_id RETURNING e.type || ''",
    "DELETE FROM runs USING events e WHERE e.run_id = runs.run_id RETURNING upper(e.type)",
    "UPDATE runs SET status = status FROM events e WHERE e.run_id = runs.run_id RETURNING e.type",
    # SELECT INTO creates a table from event columns (as CREATE TABLE AS, which is refused); the rewrite even
    # stores the hidden column in it, and later reads of the new table show it to the client
    "SELECT type INTO TEMP copied FROM events",
    "SELECT * INTO copied FROM events WHERE run_id = $1",
    # a client-supplied column named like the hidden one: the seat strips it and reads the era from it,
    # so `3` makes a major-2 reader get era-2 rows untranslated
    f"SELECT *, 3 AS {HIDDEN} FROM events WHERE run_id = $1",
    f"SELECT type, '3' AS {HIDDEN} FROM events",
    f"SELECT s.* FROM (SELECT *, 3 AS {HIDDEN} FROM events) s",
]


@pytest.mark.parametrize("sql", LEAKS)
def test_stored_spellings_never_reach_the_reader_by_a_side_road(sql):
    st = only(classify(sql))
    assert st.action == REFUSE, f"{st.action}: {sql}"
    assert st.kind and st.detail


# Harmless statements the classifier breaks: the result would read exactly under the reader rule,
# yet the statement is refused, or passed in a form that fails (the read path then sees a type
# column without its era column and fails the read as `event_row_malformed`).


def test_renamed_type_column_of_a_derived_table_is_translated():
    sql = ("SELECT s.t, s.sequence, s.run_id FROM (SELECT type AS t, sequence, run_id FROM events "
           "WHERE run_id = ANY($1)) s ORDER BY s.run_id, s.sequence")
    plan = classify(sql)
    assert only(plan).action == TRANSLATE  # today: passed untouched, and the seat fails the read
    stmt = parse_sql(plan.text)[0].stmt
    assert hidden_count(stmt.targetList) == 1


def test_cte_named_events_shadows_the_table():
    # `events` here is the CTE, not the events table: nothing to translate.  Today the rewrite
    # references "events"."run_id", which the CTE does not have, and the server fails the statement.
    sql = "WITH events AS (SELECT 1 AS type) SELECT type FROM events"
    assert only(classify(sql)).action == PASS


def test_distinct_on_non_event_columns_is_translated():
    # DISTINCT ON (run_id) picks rows by run and sequence only; the type column is output as it is
    sql = "SELECT DISTINCT ON (run_id) * FROM events WHERE run_id = ANY($1) ORDER BY run_id, sequence"
    assert only(classify(sql)).action == TRANSLATE


def test_exists_over_event_rows_passes():
    # EXISTS yields one boolean whatever the sub-select's output list is
    sql = "SELECT EXISTS (SELECT * FROM events WHERE run_id = $1)"
    assert only(classify(sql)).action == PASS


def test_lateral_function_over_payload_is_refused():
    assert only(classify("SELECT e.run_id, j.key FROM events e, jsonb_each(e.payload) j")).action == REFUSE


def test_tablesample_of_events_is_translated():
    plan = classify("SELECT * FROM events TABLESAMPLE SYSTEM (50) WHERE run_id = $1")
    assert only(plan).action == TRANSLATE and HIDDEN in plan.text
